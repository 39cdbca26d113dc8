"""The privacy section of a released model's Hugging Face model card, written only from report.json.

`render_model_card(report, quantizer=...)` says what was audited (the base model and its provenance, the
fine-tuning data and membership design, the quantizers and attacks), the released quantizer's verdict on every
criterion with its numbers and 95% intervals, the utility it keeps, the limits of the audit and where the full
report is. It never shows training text: not even a report built with --include-samples puts sample text here.
Every number is formatted as in report.md (llmaudit.common.formatting).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmaudit.analyze.attacks.definitions import DEFAULT_ATTACKS
from llmaudit.common.errors import UserError
from llmaudit.common.formatting import fmt_ci, fmt_num, fmt_pct, fmt_pct_ci
from llmaudit.report.cells import md_code, md_escape
from llmaudit.report.policy import CHECKLIST_FPR, DISABLED, NOT_MEASURED, PASS
from llmaudit.report.recommend import explain_recommendation, recommend
from llmaudit.report.release import decision_of

CARD_FPRS = ("0.01", "0.05")


class UnknownQuantizerError(UserError):
    """The quantizer asked for is not in the report."""


class MalformedReportError(UserError):
    """report.json lacks a key the card reads, or holds a value of the wrong kind (an edited or foreign file)."""


def _c(value: Any) -> str:
    return md_code(str(value))


def _e(value: Any) -> str:
    return md_escape(str(value))


def _cmp(value: Any) -> str:
    """A criterion's comparison: one of the policy's operators as written, anything else escaped as data."""
    return value if value in ("<=", ">=", "<", ">") else _e(value)


def released_quantizer(report: dict[str, Any], quantizer: str | None) -> str:
    """The quantizer the card is about: `quantizer` if the report holds it, else the recommended one, else (no
    quantizer within the utility budget) the full-precision reference, the model a team would ship unquantized."""
    names = list(report["quantizers"])
    if quantizer is not None:
        if quantizer not in names:
            raise UnknownQuantizerError(
                f"--release {quantizer!r}: the report has no such quantizer; choose one of {', '.join(names)}"
            )
        return quantizer
    return (report.get("recommendation") or {}).get("quantizer") or report.get("reference_quantizer") or names[0]


def _base_model(prov: dict[str, Any]) -> str:
    source = prov.get("model_source") or {}
    model = str(prov.get("model"))
    kind = source.get("kind")
    if kind == "gguf":
        where = "a file inside an installed Python package" if model.startswith("package:") else "a GGUF file"
        text = (
            f"{_c(model)}: {where}, GGUF type {_e(source.get('gguf_file_type') or 'unknown')}, "
            "dequantized to full precision before fine-tuning"
        )
        return text + (f" (sha256 {_c(source['sha256'])})" if source.get("sha256") else "")
    if kind == "hub" or (kind is None and "/" in model and not model.startswith(("/", ".", "builtin:"))):
        return f"{_c(model)} (Hugging Face Hub)"
    if model.startswith("builtin:") or kind == "builtin":
        return f"{_c(model)} (a tiny model built in code by llmaudit, for demonstration)"
    return f"{_c(model)} (local weights)"


def _held_out(report: dict[str, Any]) -> int | None:
    """Held-out records (no run trained on them): the validation split the indicator scored."""
    per_run = ((report.get("result") or {}).get("indicator") or {}).get("per_run") or []
    return per_run[0].get("n_samples") if per_run else None


def _audited_section(report: dict[str, Any]) -> list[str]:
    prov = report["provenance"]
    mem, data, adapter = prov.get("membership") or {}, prov.get("data") or {}, prov.get("adapter") or {}
    n_train = sorted(set(mem.get("n_train") or []))
    members = "-".join(str(n) for n in (n_train[:1] + n_train[-1:] if len(n_train) > 1 else n_train)) or "n/a"
    attacks = sorted({a for r in report["grid"] for a in r["attacks"]})
    lines = [
        "### What was audited",
        "",
        f"- Base model: {_base_model(prov)}; LoRA adapter rank {_e(adapter.get('r'))}.",
        f"- Fine-tuning data: a pool of {_e(mem.get('pool_size'))} records ({_e(data.get('source'))}, tasks "
        f"{_e(', '.join(data.get('tasks') or []))}; fingerprint {_c(data.get('fingerprint'))}).",
        f"- Membership design: {_e(mem.get('runs'))} independent fine-tuning runs, each on {members} records "
        f"drawn at random from the pool (the rest of the pool are its non-members); {_e(_held_out(report))} "
        "held-out records that no run trained on.",
        f"- Quantizers audited ({len(report['grid'])}): "
        + ", ".join(
            _c(r["quantizer"]) + (" (full-precision reference)" if r["is_reference"] else "") for r in report["grid"]
        )
        + ".",
        f"- Attacks run ({len(attacks)}): {', '.join(_c(a) for a in attacks)}.",
        "- Strongest attack per quantizer (calibrated TPR at 1% FPR, and its margin over the LOSS attack):",
    ]
    for r in report["grid"]:
        s = (r.get("strongest_vs_loss") or {}).get("tpr_at_1pct_calibrated")
        best = r.get("best_attack") or {}
        if s:
            lines.append(
                f"  - {_c(r['quantizer'])}: {_c(s['attack'])} {fmt_num(s['value'])}{fmt_ci(best.get('ci'))}, "
                f"LOSS {fmt_num(s['loss'])}, margin {fmt_num(s['gain'])}"
            )
        elif best:
            lines.append(f"  - {_c(r['quantizer'])}: {_c(best['name'])} {fmt_num(best['value'])}{fmt_ci(best['ci'])}")
        else:
            lines.append(f"  - {_c(r['quantizer'])}: no attack reached an estimate")
    return lines


def _tpr_at(att: dict[str, Any], key: str) -> tuple[Any, Any]:
    t = (att.get("low_fpr") or {}).get("pooled_calibrated", {}).get(key) or {}
    return t.get("tpr"), t.get("ci")


def _utility_rows(row: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    u = row["utility"]
    rows = [
        (
            "validation loss vs full precision",
            f"{fmt_pct(u['relative_change'])}{fmt_pct_ci(u['relative_change_ci'])}",
            "",
            "",
        )
    ]
    d = u.get("divergence") or {}
    if d.get("measured"):
        for key, label in (
            ("kl_mean", "KL from full precision (nats/token)"),
            ("same_top", "same top token as full precision"),
        ):
            stat = d.get(key) or {}
            rows.append((label, f"{fmt_num(stat.get('mean'))}{fmt_ci(stat.get('ci'))}", "", ""))
    for name, m in sorted((u.get("task_metrics") or {}).items()):
        drop = m.get("drop") or {}
        rows.append(
            (
                f"task {name} (drop below full precision {fmt_num(drop.get('value'))}{fmt_ci(drop.get('ci'))})",
                f"{fmt_num(m.get('value'))}{fmt_ci(m.get('ci'))}",
                "",
                "",
            )
        )
    return rows


def _verdict_table(report: dict[str, Any], q: str) -> list[str]:
    row = next(r for r in report["grid"] if r["quantizer"] == q)
    crit = {c["id"]: c for c in report["checklist"]["per_quantizer"][q]["criteria"]}
    best = row.get("best_attack") or {}
    att = row["attacks"].get(best.get("name")) or {}
    by_auroc = row.get("best_attack_by_auroc") or {}
    a = crit["attack_tpr"]
    table: list[tuple[str, str, str, str]] = [
        (
            f"TPR at 1% FPR, strongest attack chosen by cross-fitting ({_c(a.get('attack') or 'n/a')})"
            if a.get("mode")
            else f"calibrated TPR at 1% FPR, strongest attack {_c(a.get('attack') or 'n/a')}",
            f"{fmt_num(a['value'])}{fmt_ci(a['ci'])}",
            f"{_cmp(a['comparison'])} {a['threshold']:g}",
            _e(a["status"]),
        ),
        *_decision_rows(row, a),
        (
            f"calibrated TPR at 5% FPR, {_c(best.get('name') or 'n/a')}",
            f"{fmt_num(_tpr_at(att, '0.05')[0])}{fmt_ci(_tpr_at(att, '0.05')[1])}",
            "",
            "",
        ),
        (
            f"AUROC, strongest attack {_c(by_auroc.get('name') or 'n/a')}",
            f"{fmt_num(by_auroc.get('value'))}{fmt_ci(by_auroc.get('ci'))}",
            "",
            "",
        ),
    ]
    for cid, label in (("r_q", "r_Q (attack-free indicator)"), ("indicator", "attack-free indicator")):
        c = crit[cid]
        limit = (
            ""
            if c.get("threshold") is None or c["status"] == DISABLED
            else f"{_cmp(c['comparison'])} {c['threshold']:g}"
        )
        table.append((label, f"{fmt_num(c['value'])}{fmt_ci(c['ci'])}", limit, _e(c["status"])))
    u = crit["utility"]
    util_value = (
        f"{fmt_pct(u['value'])}{fmt_pct_ci(u['ci'])}"
        if u.get("metric", "loss") == "loss"
        else f"{fmt_num(u['value'])}{fmt_ci(u['ci'])}"
    )
    limit = f"{_cmp(u['comparison'])} {fmt_pct(u['threshold']) if u.get('metric', 'loss') == 'loss' else fmt_num(u['threshold'])}"
    table.append((f"utility criterion: {_e(u['description'])}", util_value, limit, _e(u["status"])))
    table += _utility_rows(row)
    lines = ["| measure | estimate [95% interval] | limit | verdict |", "|---|---|---|---|"]
    lines += [f"| {m} | {v} | {lim} | {s} |" for m, v, lim, s in table]
    return lines


def _decision_rows(row: dict[str, Any], a: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The comparison with full precision and the in-sample maximum (selection-biased), where the release rule
    recorded them."""
    if not a.get("mode"):
        return []
    rows = []
    d = decision_of(row)
    if d is not None and d.comparison is not None and not row.get("is_reference"):
        e = d.comparison.difference
        span = "" if e.low is None or e.high is None else f" [{e.low:+.3f}, {e.high:+.3f}]"
        value = "n/a" if e.value is None else f"{e.value:+.3f}{span}"
        rows.append(
            (
                f"leakage against full precision {_c(d.comparison.reference)} (strongest-attack TPR difference)",
                value,
                f"+-{d.comparison.margin:g} = the same",
                d.comparison.direction,
            )
        )
    if d is not None and d.loss_gap is not None and d.loss_gap.value is not None:
        g = d.loss_gap
        span = "" if g.low is None or g.high is None else f" [{fmt_num(g.low, 4)}, {fmt_num(g.high, 4)}]"
        rows.append(
            (
                "loss of non-members minus members, nats per token (the difference behind the TPR)",
                f"{fmt_num(g.value, 4)}{span}",
                "",
                "",
            )
        )
    top = a.get("in_sample_max") or {}
    if top.get("attack"):
        rows.append(
            (
                f"highest attack on the data it was chosen on ({_c(top['attack'])}; selection-biased upward)",
                fmt_num(top.get("value")),
                "",
                "",
            )
        )
    return rows


def _beyond_damage(report: dict[str, Any], name: str) -> str:
    """The validation's answer to whether the indicator tracks the attacks beyond quantization damage."""
    entries = (report.get("indicators") or {}).get("indicators") or []
    answer = next((e.get("beyond_damage") for e in entries if e.get("name") == name), None)
    if answer == "no":
        return " Its agreement with the attacks is not shown to go beyond what quantization damage explains."
    if answer == "yes":
        return " It tracks the attacks beyond what quantization damage explains."
    return ""


def _limits_section(report: dict[str, Any], q: str) -> list[str]:
    row = next(r for r in report["grid"] if r["quantizer"] == q)
    crit = {c["id"]: c for c in report["checklist"]["per_quantizer"][q]["criteria"]}
    th = report["checklist"]["thresholds"]
    need = int(round(10 / CHECKLIST_FPR))
    lines = ["### Limits of this audit", ""]
    for name, att in sorted(row["attacks"].items()):
        lines.append(_attack_limit_line(name, att, crit["attack_tpr"], need))
    by_reason: dict[str, list[str]] = {}
    for name, why in sorted((row.get("skipped_attacks") or {}).items()):
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        lines.append(f"- {', '.join(_c(n) for n in names)} {'was' if len(names) == 1 else 'were'} not run: {_e(why)}.")
    left_out = [a for a in DEFAULT_ATTACKS if a not in row["attacks"] and a not in (row.get("skipped_attacks") or {})]
    if left_out:
        lines.append(
            f"- Not run, left out of this audit's attack list (`attack.attacks`): {', '.join(_c(a) for a in left_out)}; "
            "the verdict says nothing about them."
        )
    if crit["attack_tpr"].get("mode") == "empirical":
        lines.append(
            f"- Runs: {_e(row.get('n_models'))} target model(s), judged on held-out non-members with an empirical "
            "threshold; with fewer than 2 runs the run-to-run variation of fine-tuning is not covered: another "
            "fine-tuning run of the same recipe may leak more or less."
        )
    else:
        lines.append(
            f"- Runs: {_e(row.get('n_models'))} target models; a criterion over runs needs at least "
            f"{_e(th.get('min_runs'))} of them."
        )
    lines.append(
        "- A PASS bounds the success of these attacks on this data and this fine-tuning recipe; it is not a proof "
        "that no attack can infer membership."
    )
    for cid in ("r_q", "indicator"):
        c = crit[cid]
        if c["status"] != PASS:
            lines.append(f"- {_e(c['description'])}: {_e(c['status'])} ({_e(c['reason'])}).")
    indicator = row.get("indicator") or {}
    if indicator:
        lines.append(
            f"- The attack-free indicator {_c(indicator.get('name'))} has validation status "
            f"{_e(indicator.get('status'))} (r_Q: {_e(row.get('r_q_status'))}); an indicator is context beside the "
            "attacks, never a verdict on its own." + _beyond_damage(report, str(indicator.get("name")))
        )
    source = report["provenance"].get("model_source") or {}
    if source.get("gguf_file_type"):
        lines.append(
            f"- The base weights came from a GGUF {_e(source['gguf_file_type'])} file: the full-precision reference "
            "already sits on that quantization grid, so a quantizer aligned with it can round the fine-tuning back "
            "toward the base and look more private than it would on an unquantized base."
        )
    blind = report.get("blind_baseline") or {}
    if blind.get("warning"):
        lines.append(f"- Blind baseline: {_e(blind['warning'])}.")
    if report.get("not_scored"):
        lines.append(f"- Not completely scored, left out: {_e(', '.join(sorted(report['not_scored'])))}.")
    return lines


def _attack_limit_line(name: str, att: dict[str, Any], attack_crit: dict[str, Any], need: int) -> str:
    """One attack in the limits: the scores behind its TPR and how the release rule judged it."""
    verdict = attack_crit["per_attack"].get(name) or {}
    n_cal = ((att.get("low_fpr") or {}).get("pooled_calibrated", {}).get("0.01") or {}).get("n_negatives")
    negatives = f"{_e(att.get('n_negatives'))} non-member" + (
        "" if n_cal is None else f" ({_e(n_cal)} of them with a calibrated score)"
    )
    head = (
        f"- {_c(name)}: {negatives} and {_e(att.get('n_positives'))} member scores (pooled over "
        f"{_e(att.get('n_models'))} target models; a TPR at 1% FPR needs >= {need} non-member scores); "
    )
    if "judged" in verdict:  # the release rule
        if verdict["judged"]:
            return (
                head
                + f"TPR {fmt_num(verdict.get('value'))}, simultaneous upper bound {fmt_num(verdict.get('upper_bound'))}."
            )
        return head + f"not judged: {_e(verdict.get('reason'))}."
    status = verdict.get("status", NOT_MEASURED)
    return head + _e(status) + (f": {_e(verdict.get('reason'))}" if status not in (PASS, None) else "") + "."


def render_model_card(report: dict[str, Any], *, quantizer: str | None = None) -> str:
    """The model card's privacy section (Markdown) for the quantizer released (default: the recommended one).
    Every string from the report goes through the escaping report.md uses (`md_escape`, `md_code`).

    Raises UnknownQuantizerError when `quantizer` is not in the report, MalformedReportError when the report
    lacks what the card reads (an edited or foreign report.json)."""
    try:
        return _render(report, released_quantizer(report, quantizer))
    except UserError:
        raise
    except (KeyError, IndexError, StopIteration, TypeError, AttributeError, ValueError) as exc:
        raise MalformedReportError(
            f"report.json lacks or mistypes what the model card reads ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}); write it again with `llmaudit report RUN_DIR`"
        ) from None


def _render(report: dict[str, Any], q: str) -> str:
    rec = report.get("recommendation") or {}
    if "explanation" not in rec:  # a report.json from before the explanation: rank again, from its own rows
        rec = recommend(report["grid"], report["checklist"])
        rec["explanation"] = explain_recommendation(rec, report["checklist"], report["grid"], report["provenance"])
    overall = report["checklist"]["per_quantizer"][q]["overall"]
    prov = report["provenance"]
    lines = [
        "## Privacy: membership-inference audit",
        "",
        f"Released quantization: {_c(q)}. Audit verdict: **{_e(overall)}** "
        + ("(cleared for release: every criterion PASS)." if overall == PASS else "(NOT cleared for release).")
        + (f" The audit recommended {_c(rec['quantizer'])}." if rec.get("quantizer") not in (None, q) else "")
        + (" The audit recommended no quantizer." if rec.get("quantizer") is None else ""),
        "",
        _e(rec["explanation"]),
        "",
        *_audited_section(report),
        "",
        f"### Verdict for {_c(q)}",
        "",
        *_verdict_table(report, q),
        "",
        *_limits_section(report, q),
        "",
        "### Full report",
        "",
        f"Generated by llmaudit {_e(report.get('llmaudit_version'))} from report.json (experiment "
        f"{_c(prov.get('experiment_name'))}, identity {_c(prov.get('identity_hash'))}). The full report, "
        f"report.md / report.html / report.json in {_c(Path(str(prov.get('run_dir'))).name + '/report')}, has every "
        "quantizer, attack and interval; no training text is shown here.",
    ]
    return "\n".join(lines) + "\n"
