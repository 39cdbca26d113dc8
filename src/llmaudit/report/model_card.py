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

from llmaudit.analyze.attacks.registry import registered_attacks
from llmaudit.common.errors import UserError
from llmaudit.common.formatting import fmt_ci, fmt_num, fmt_pct, fmt_pct_ci
from llmaudit.report.cells import md_code, md_escape
from llmaudit.report.models import (
    Adapter,
    AttackEntry,
    AttackVerdict,
    Criterion,
    DataSource,
    GridRow,
    Membership,
    ModelSource,
    Provenance,
    Recommendation,
    ReportJson,
    Thresholds,
    as_report,
)
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


def released_quantizer(report: dict[str, Any] | ReportJson, quantizer: str | None) -> str:
    """The quantizer the card is about: `quantizer` if the report holds it, else the recommended one, else (no
    quantizer within the utility budget) the full-precision reference, the model a team would ship unquantized."""
    report = as_report(report)
    names = list(report.quantizers)
    if quantizer is not None:
        if quantizer not in names:
            raise UnknownQuantizerError(
                f"--release {quantizer!r}: the report has no such quantizer; choose one of {', '.join(names)}"
            )
        return quantizer
    return report.recommendation.quantizer or report.reference_quantizer or names[0]


def _base_model(prov: Provenance) -> str:
    source = prov.model_source or ModelSource()
    model = str(prov.model)
    kind = source.kind
    if kind == "gguf":
        where = "a file inside an installed Python package" if model.startswith("package:") else "a GGUF file"
        text = (
            f"{_c(model)}: {where}, GGUF type {_e(source.gguf_file_type or 'unknown')}, "
            "dequantized to full precision before fine-tuning"
        )
        return text + (f" (sha256 {_c(source.sha256)})" if source.sha256 else "")
    if kind == "hub" or (kind is None and "/" in model and not model.startswith(("/", ".", "builtin:"))):
        return f"{_c(model)} (Hugging Face Hub)"
    if model.startswith("builtin:") or kind == "builtin":
        return f"{_c(model)} (a tiny model built in code by llmaudit, for demonstration)"
    return f"{_c(model)} (local weights)"


def _held_out(report: ReportJson) -> int | None:
    """Held-out records (no run trained on them): the validation split the indicator scored."""
    indicator = report.result.get("indicator")
    per_run = indicator.get("per_run") if isinstance(indicator, dict) else None
    return per_run[0].get("n_samples") if per_run else None


def _strongest_line(r: GridRow) -> str:
    s = r.strongest_vs_loss.tpr_at_1pct_calibrated if r.strongest_vs_loss else None
    best = r.best_attack
    if s is not None:
        return (
            f"  - {_c(r.quantizer)}: {_c(s.attack)} {fmt_num(s.value)}{fmt_ci(best and best.ci)}, "
            f"LOSS {fmt_num(s.loss)}, margin {fmt_num(s.gain)}"
        )
    if best is not None:
        return f"  - {_c(r.quantizer)}: {_c(best.name)} {fmt_num(best.value)}{fmt_ci(best.ci)}"
    return f"  - {_c(r.quantizer)}: no attack reached an estimate"


def _audited_section(report: ReportJson) -> list[str]:
    prov = report.provenance
    mem, data = prov.membership or Membership(), prov.data or DataSource()
    adapter = prov.adapter or Adapter()
    n_train = sorted(set(mem.n_train or []))
    members = "-".join(str(n) for n in (n_train[:1] + n_train[-1:] if len(n_train) > 1 else n_train)) or "n/a"
    attacks = sorted({a for r in report.grid for a in r.attacks})
    lines = [
        "### What was audited",
        "",
        f"- Base model: {_base_model(prov)}; LoRA adapter rank {_e(adapter.r)}.",
        f"- Fine-tuning data: a pool of {_e(mem.pool_size)} records ({_e(data.source)}, tasks "
        f"{_e(', '.join(data.tasks or []))}; fingerprint {_c(data.fingerprint)}).",
        f"- Membership design: {_e(mem.runs)} independent fine-tuning runs, each on {members} records "
        f"drawn at random from the pool (the rest of the pool are its non-members); {_e(_held_out(report))} "
        "held-out records that no run trained on.",
        f"- Quantizers audited ({len(report.grid)}): "
        + ", ".join(_c(r.quantizer) + (" (full-precision reference)" if r.is_reference else "") for r in report.grid)
        + ".",
        f"- Attacks run ({len(attacks)}): {', '.join(_c(a) for a in attacks)}.",
        "- Strongest attack per quantizer (calibrated TPR at 1% FPR, and its margin over the LOSS attack):",
    ]
    return lines + [_strongest_line(r) for r in report.grid]


def _tpr_at(att: AttackEntry | None, key: str) -> tuple[Any, Any]:
    t = None if att is None else att.tpr_at("pooled_calibrated", key)
    return (None, None) if t is None else (t.tpr, t.ci)


def _utility_rows(row: GridRow) -> list[tuple[str, str, str, str]]:
    u = row.utility
    rows = [
        (
            "validation loss vs full precision",
            f"{fmt_pct(u.relative_change)}{fmt_pct_ci(u.relative_change_ci)}",
            "",
            "",
        )
    ]
    d = u.divergence
    if d.measured:
        for stat, label in (
            (d.kl_mean, "KL from full precision (nats/token)"),
            (d.same_top, "same top token as full precision"),
        ):
            rows.append((label, f"{fmt_num(stat and stat.mean)}{fmt_ci(stat and stat.ci)}", "", ""))
    for name, m in sorted(u.task_metrics.items()):
        rows.append(
            (
                f"task {name} (drop below full precision {fmt_num(m.drop.value)}{fmt_ci(m.drop.ci)})",
                f"{fmt_num(m.value)}{fmt_ci(m.ci)}",
                "",
                "",
            )
        )
    return rows


def _attack_rows(row: GridRow, a: Criterion) -> list[tuple[str, str, str, str]]:
    """The attack criterion, the comparison with full precision, the 5% FPR and AUROC of the strongest attack."""
    best, by_auroc = row.best_attack, row.best_attack_by_auroc
    att = row.attacks.get(best.name) if best else None
    tpr5, ci5 = _tpr_at(att, "0.05")
    return [
        (
            f"TPR at 1% FPR, strongest attack chosen by cross-fitting ({_c(a.attack or 'n/a')})"
            if a.mode
            else f"calibrated TPR at 1% FPR, strongest attack {_c(a.attack or 'n/a')}",
            f"{fmt_num(a.value)}{fmt_ci(a.ci)}",
            f"{_cmp(a.comparison)} {a.threshold:g}",
            _e(a.status),
        ),
        *_decision_rows(row, a),
        (f"calibrated TPR at 5% FPR, {_c((best and best.name) or 'n/a')}", f"{fmt_num(tpr5)}{fmt_ci(ci5)}", "", ""),
        (
            f"AUROC, strongest attack {_c((by_auroc and by_auroc.name) or 'n/a')}",
            f"{fmt_num(by_auroc and by_auroc.value)}{fmt_ci(by_auroc and by_auroc.ci)}",
            "",
            "",
        ),
    ]


def _verdict_table(report: ReportJson, q: str) -> list[str]:
    row = report.row(q)
    crit = report.criteria(q)
    table = _attack_rows(row, crit["attack_tpr"])
    for cid, label in (("r_q", "r_Q (attack-free indicator)"), ("indicator", "attack-free indicator")):
        c = crit[cid]
        limit = "" if c.threshold is None or c.status == DISABLED else f"{_cmp(c.comparison)} {c.threshold:g}"
        table.append((label, f"{fmt_num(c.value)}{fmt_ci(c.ci)}", limit, _e(c.status)))
    u = crit["utility"]
    loss = (u.metric or "loss") == "loss"
    util_value = f"{fmt_pct(u.value)}{fmt_pct_ci(u.ci)}" if loss else f"{fmt_num(u.value)}{fmt_ci(u.ci)}"
    limit = f"{_cmp(u.comparison)} {fmt_pct(u.threshold) if loss else fmt_num(u.threshold)}"
    table.append((f"utility criterion: {_e(u.description)}", util_value, limit, _e(u.status)))
    table += _utility_rows(row)
    lines = ["| measure | estimate [95% interval] | limit | verdict |", "|---|---|---|---|"]
    lines += [f"| {m} | {v} | {lim} | {s} |" for m, v, lim, s in table]
    return lines


def _decision_rows(row: GridRow, a: Criterion) -> list[tuple[str, str, str, str]]:
    """The comparison with full precision and the in-sample maximum (selection-biased), where the release rule
    recorded them."""
    if not a.mode:
        return []
    rows = []
    d = decision_of(row)
    if d is not None and d.comparison is not None and not row.is_reference:
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
    top = a.in_sample_max
    if top is not None and top.attack:
        rows.append(
            (
                f"highest attack on the data it was chosen on ({_c(top.attack)}; selection-biased upward)",
                fmt_num(top.value),
                "",
                "",
            )
        )
    return rows


def _beyond_damage(report: ReportJson, name: str) -> str:
    """The validation's answer to whether the indicator tracks the attacks beyond quantization damage."""
    entries = report.indicators.indicators if report.indicators else []
    answer = next((e.beyond_damage for e in entries if e.name == name), None)
    if answer == "no":
        return " Its agreement with the attacks is not shown to go beyond what quantization damage explains."
    if answer == "yes":
        return " It tracks the attacks beyond what quantization damage explains."
    return ""


def _attack_limits(row: GridRow, attack_crit: Criterion, th: Thresholds) -> list[str]:
    """Per attack the scores behind its TPR, the attacks not run and why, and the runs behind the verdict."""
    need = int(round(10 / CHECKLIST_FPR))
    lines = [_attack_limit_line(name, att, attack_crit, need) for name, att in sorted(row.attacks.items())]
    by_reason: dict[str, list[str]] = {}
    for name, why in sorted(row.skipped_attacks.items()):
        by_reason.setdefault(why, []).append(name)
    for why, names in by_reason.items():
        lines.append(f"- {', '.join(_c(n) for n in names)} {'was' if len(names) == 1 else 'were'} not run: {_e(why)}.")
    left_out = [a for a in registered_attacks() if a not in row.attacks and a not in row.skipped_attacks]
    if left_out:
        lines.append(
            f"- Not run, left out of this audit's attack list (`attack.attacks`): {', '.join(_c(a) for a in left_out)}; "
            "the verdict says nothing about them."
        )
    if attack_crit.mode == "empirical":
        lines.append(
            f"- Runs: {_e(row.n_models)} target model(s), judged on held-out non-members with an empirical "
            "threshold; with fewer than 2 runs the run-to-run variation of fine-tuning is not covered: another "
            "fine-tuning run of the same recipe may leak more or less."
        )
    else:
        lines.append(
            f"- Runs: {_e(row.n_models)} target models; a criterion over runs needs at least {_e(th.min_runs)} of them."
        )
    return lines


def _context_limits(report: ReportJson, row: GridRow) -> list[str]:
    """The indicator's status, a GGUF base, the blind baseline's warning and what was not scored."""
    lines = []
    indicator = row.indicator
    if indicator is not None:
        lines.append(
            f"- The attack-free indicator {_c(indicator.name)} has validation status "
            f"{_e(indicator.status)} (r_Q: {_e(row.r_q_status)}); an indicator is context beside the "
            "attacks, never a verdict on its own." + _beyond_damage(report, str(indicator.name))
        )
    source = report.provenance.model_source
    if source is not None and source.gguf_file_type:
        lines.append(
            f"- The base weights came from a GGUF {_e(source.gguf_file_type)} file: the full-precision reference "
            "already sits on that quantization grid, so a quantizer aligned with it can round the fine-tuning back "
            "toward the base and look more private than it would on an unquantized base."
        )
    if report.blind_baseline is not None and report.blind_baseline.warning:
        lines.append(f"- Blind baseline: {_e(report.blind_baseline.warning)}.")
    if report.not_scored:
        lines.append(f"- Not completely scored, left out: {_e(', '.join(sorted(report.not_scored)))}.")
    return lines


def _limits_section(report: ReportJson, q: str) -> list[str]:
    row = report.row(q)
    crit = report.criteria(q)
    lines = ["### Limits of this audit", ""]
    lines += _attack_limits(row, crit["attack_tpr"], report.checklist.thresholds)
    lines.append(
        "- A PASS bounds the success of these attacks on this data and this fine-tuning recipe; it is not a proof "
        "that no attack can infer membership."
    )
    for cid in ("r_q", "indicator"):
        c = crit[cid]
        if c.status != PASS:
            lines.append(f"- {_e(c.description)}: {_e(c.status)} ({_e(c.reason)}).")
    return lines + _context_limits(report, row)


def _attack_limit_line(name: str, att: AttackEntry, attack_crit: Criterion, need: int) -> str:
    """One attack in the limits: the scores behind its TPR and how the release rule judged it."""
    verdict = attack_crit.per_attack.get(name) or AttackVerdict()
    t = att.tpr_at("pooled_calibrated", "0.01")
    n_cal = None if t is None else t.n_negatives
    negatives = f"{_e(att.n_negatives)} non-member" + (
        "" if n_cal is None else f" ({_e(n_cal)} of them with a calibrated score)"
    )
    head = (
        f"- {_c(name)}: {negatives} and {_e(att.n_positives)} member scores (pooled over "
        f"{_e(att.n_models)} target models; a TPR at 1% FPR needs >= {need} non-member scores); "
    )
    if "judged" in verdict.model_fields_set:  # the release rule
        if verdict.judged:
            return head + f"TPR {fmt_num(verdict.value)}, simultaneous upper bound {fmt_num(verdict.upper_bound)}."
        return head + f"not judged: {_e(verdict.reason)}."
    status = verdict.status or NOT_MEASURED
    return head + _e(status) + (f": {_e(verdict.reason)}" if status not in (PASS, None) else "") + "."


def render_model_card(report: dict[str, Any] | ReportJson, *, quantizer: str | None = None) -> str:
    """The model card's privacy section (Markdown) for the quantizer released (default: the recommended one).
    Every string from the report goes through the escaping report.md uses (`md_escape`, `md_code`).

    Raises UnknownQuantizerError when `quantizer` is not in the report, MalformedReportError when the report
    lacks what the card reads (an edited or foreign report.json)."""
    try:
        typed = as_report(report)
        return _render(typed, released_quantizer(typed, quantizer))
    except UserError:
        raise
    except (KeyError, IndexError, StopIteration, TypeError, AttributeError, ValueError) as exc:
        raise MalformedReportError(
            f"report.json lacks or mistypes what the model card reads ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}); write it again with `llmaudit report RUN_DIR`"
        ) from None


def _recommendation(report: ReportJson) -> Recommendation:
    """The report's recommendation; for a report.json from before the explanation, ranked again from its own rows."""
    if report.recommendation.explanation is not None:
        return report.recommendation
    built = report.model_dump(mode="json", exclude_unset=True)
    rec = recommend(built["grid"], built["checklist"])
    rec["explanation"] = explain_recommendation(rec, built["checklist"], built["grid"], built["provenance"])
    return Recommendation.model_validate(rec)


def _render(report: ReportJson, q: str) -> str:
    rec = _recommendation(report)
    overall = report.checklist.per_quantizer[q].overall
    prov = report.provenance
    lines = [
        "## Privacy: membership-inference audit",
        "",
        f"Released quantization: {_c(q)}. Audit verdict: **{_e(overall)}** "
        + ("(cleared for release: every criterion PASS)." if overall == PASS else "(NOT cleared for release).")
        + (f" The audit recommended {_c(rec.quantizer)}." if rec.quantizer not in (None, q) else "")
        + (" The audit recommended no quantizer." if rec.quantizer is None else ""),
        "",
        _e(rec.explanation),
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
        f"Generated by llmaudit {_e(report.llmaudit_version)} from report.json (experiment "
        f"{_c(prov.experiment_name)}, identity {_c(prov.identity_hash)}). The full report, "
        f"report.md / report.html / report.json in {_c(Path(str(prov.run_dir)).name + '/report')}, has every "
        "quantizer, attack and interval; no training text is shown here.",
    ]
    return "\n".join(lines) + "\n"
