"""The model card of a released quantization, written only from report.json, to paste on the Hugging Face Hub
unchanged (docs/reading-a-report.md, "The model card").

`render_model_card(report, quantizer=...)` writes a complete card: YAML metadata in the Hub's format (tags, the
base model where it is a Hub id, and a `model-index` with the released quantization's leakage and utility, built
with `huggingface_hub.ModelCardData`), then the privacy section: the answer for the released quantization (its
verdict, the criterion that decided it, its leakage against full precision), what was audited (base model,
fine-tuning data, the true membership design, quantizations, attacks, every quantization's headline leakage),
its verdict on every criterion, each interval with the level report.json records, at most MAX_LIMITS limits, and
where the full report is. For the public: no local path (a local model or data file is named by its file name),
no configuration key or document of llmaudit's, no auditor's advice, and never any training text.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

from huggingface_hub import EvalResult, ModelCardData

from llmaudit.analyze.attacks.registry import registered_attacks
from llmaudit.common.errors import UserError, did_you_mean
from llmaudit.common.formatting import fmt_ci, fmt_num, fmt_pct, fmt_pct_ci
from llmaudit.report.answer import (
    answer_line,
    baseline_sentence,
    design_sentence,
    headline_text,
    interval_text,
    left_out,
    level,
    proportion_bounds,
    recommendation_of,
)
from llmaudit.report.cells import md_code, md_escape
from llmaudit.report.model_card_risks import risk_lines
from llmaudit.report.models import Criterion, DataSource, GridRow, ModelSource, Provenance, ReportJson, as_report
from llmaudit.report.policy import DISABLED, PASS
from llmaudit.report.release import chosen_attack, decision_of, headline_of

MAX_LIMITS = 5


class UnknownQuantizerError(UserError):
    """The quantizer asked for is not in the report."""


class MalformedReportError(UserError):
    """report.json lacks a key the card reads, or holds a value of the wrong kind (an edited or foreign file)."""


def _c(value: Any) -> str:
    return md_code(public(value))


def _e(value: Any) -> str:
    return md_escape(public(value))


def public(value: Any) -> str:
    """A value as the public card may show it: an absolute path (a local model, data file or cache) becomes its file
    name.

    Args:
        value (Any): a value from the report.

    Returns:
        str: the file name of an absolute path; anything else as it is.
    """
    text = str(value)
    if text.startswith(("/", "~")) or (len(text) > 2 and text[1] == ":" and text[2] in "\\/"):
        return PurePath(text.replace("\\", "/")).name or "a local path"
    return text


_DOC_REFERENCE = re.compile(r"\s*\((?:see )?docs/[^)]*\)|(?:[;,]\s*)?(?:see )?docs/[\w./#-]+(?: section \d+)?")
_CONFIG_KEY = re.compile(r"`?\b(?:score|report|data|attack|train|model|lora)\.[a-z_]+(?:\.[a-z_]+)*(?:=[^\s;,)`]+)?`?")
_ABSOLUTE = re.compile(r"(?<![\w.])(?:/[\w.@+-]+){2,}/?")


def scrub(text: str) -> str:
    """A sentence from report.json (a criterion's reason) as the public card may say it.

    Args:
        text (str): the sentence.

    Returns:
        str: the sentence with no reference to llmaudit's documents, no configuration key (`score.matched_base=true`
            becomes "a setting of the audit") and no absolute path (its file name instead).
    """
    text = _DOC_REFERENCE.sub("", text)
    text = _CONFIG_KEY.sub("a setting of the audit", text)
    return _ABSOLUTE.sub(lambda m: PurePath(m.group(0)).name, text)


def released_quantizer(report: dict[str, Any] | ReportJson, quantizer: str | None) -> str:
    """The quantizer the card is about.

    Args:
        report (dict[str, Any] | ReportJson): report.json's content, or the typed report.
        quantizer (str | None): the quantizer asked for, None for the recommended one.

    Returns:
        str: `quantizer` if the report holds it, else the recommended one, else (no quantization within the utility
            budget) the full-precision reference, the model a team would ship unquantized.

    Raises:
        UnknownQuantizerError: `quantizer` is not in the report; the message names the closest name.
    """
    report = as_report(report)
    names = list(report.quantizers)
    if quantizer is not None:
        if quantizer not in names:
            raise UnknownQuantizerError(
                f"--release {quantizer!r}: the report has no such quantizer{did_you_mean(quantizer, names)}; "
                f"choose one of {', '.join(names)}"
            )
        return quantizer
    return recommendation_of(report).quantizer or report.reference_quantizer or names[0]


def _hub_id(prov: Provenance) -> str | None:
    """The base model's Hub id where it is one (what the Hub's `base_model` links), else None."""
    source, model = prov.model_source or ModelSource(), str(prov.model)
    if source.kind == "hub" or (source.kind is None and "/" in model and not model.startswith(("/", ".", "~"))):
        return None if ":" in model else model
    return None


def _base_model(prov: Provenance) -> str:
    source = prov.model_source or ModelSource()
    model = str(prov.model)
    if source.kind == "gguf":
        where = "a file inside an installed Python package" if model.startswith("package:") else "a GGUF file"
        text = (
            f"{_c(model)}: {where}, GGUF type {_e(source.gguf_file_type or 'unknown')}, "
            "dequantized to full precision before fine-tuning"
        )
        return text + (f" (sha256 {_c(source.sha256)})" if source.sha256 else "")
    if _hub_id(prov):
        return f"{_c(model)} (Hugging Face Hub)"
    if model.startswith("builtin:") or source.kind == "builtin":
        return f"{_c(model)} (a tiny model built in code by llmaudit, for demonstration)"
    return f"{_c(model)} (local weights)"


def _meta(value: Any) -> str:
    """A string of report.json as a YAML metadata value: its public form on one line of letters, digits, spaces
    and `_-.,:;()+%/=` (anything else, markup or control characters, a space), at most 120 characters: a value is
    data, never YAML structure nor markup where a renderer shows the metadata."""
    text = re.sub(r"[^\w \-.,:;()+%/=]", " ", public(value), flags=re.ASCII)
    return " ".join(text.split())[:120] or "n/a"


def _metadata(report: ReportJson, q: str) -> str:
    """The card's YAML metadata in the Hub's format: tags, the base model, a model-index of the released
    quantization's leakage (the headline) and utility, and full precision's leakage beside it."""
    prov = report.provenance
    data = prov.data or DataSource()
    results = []
    rows = [report.row(q)] + [r for r in report.grid if r.is_reference and r.quantizer != q]
    for row in rows:
        head = headline_of(row)
        if head is None or head.value is None:
            continue
        low, high = proportion_bounds(head)
        bounds = low is not None and high is not None and head.confidence
        conf = f", {level(head.confidence)} interval {fmt_num(low)} to {fmt_num(high)}" if bounds else ""
        who = f"{row.quantizer}, full precision" if row.is_reference else row.quantizer
        results.append(_eval(_meta(f"TPR at 1% FPR, strongest attack cross-fitted ({who}{conf})"), head.value, data))
    u = report.criteria(q)["utility"]
    if u.value is not None and not report.row(q).is_reference:
        loss = (u.metric or "loss") == "loss"
        what = "validation loss change vs full precision" if loss else f"utility {u.metric}"
        metric = "val_loss_change" if loss else _meta(u.metric).replace(" ", "_")
        results.append(_eval(_meta(f"{what} ({q})"), u.value, data, metric))
    card = ModelCardData(
        base_model=_hub_id(prov),
        tags=["llmaudit", "privacy", "membership-inference", "quantization"],
        model_name=_meta(prov.experiment_name or "llmaudit audit"),
        eval_results=results or None,
    )
    return card.to_yaml()


def _eval(name: str, value: float, data: DataSource, metric: str = "tpr_at_1pct_fpr") -> EvalResult:
    return EvalResult(
        task_type="membership-inference",
        task_name="Membership inference audit (llmaudit)",
        dataset_type=_meta(data.source or "custom"),
        dataset_name=_meta(f"fine-tuning data ({public(data.source or 'custom')})"),
        metric_type=metric,
        metric_name=name,
        metric_value=float(value),
    )


def _audited_section(report: ReportJson) -> list[str]:
    prov = report.provenance
    data = prov.data or DataSource()
    attacks = sorted({a for r in report.grid for a in r.attacks})
    fpr = report.decision_rule.fpr if report.decision_rule and report.decision_rule.fpr else 0.01
    lines = [
        "### What was audited",
        "",
        f"- Base model: {_base_model(prov)}; LoRA adapter rank {_e(prov.adapter and prov.adapter.r)}.",
        f"- Fine-tuning data: {_e(prov.membership and prov.membership.pool_size)} records audited ({_e(data.source)}, "
        f"tasks {_e(', '.join(data.tasks or []))}; fingerprint {_c(data.fingerprint)}).",
        f"- Membership design: {_e(design_sentence(report))}",
        f"- Attacks run ({len(attacks)}): {', '.join(_c(a) for a in attacks)}.",
        f"- Leakage of every quantization audited (the strongest attack's TPR at {100 * fpr:g}% FPR, chosen on "
        "other folds and measured on each, with its interval):",
    ]
    for r in report.grid:
        head = headline_of(r)
        conf = f" ({level(head.confidence)} interval)" if head and head.confidence else ""
        who = " (full precision, the reference)" if r.is_reference else ""
        verdict = report.checklist.per_quantizer[r.quantizer].overall
        lines.append(f"  - {_c(r.quantizer)}{who}: {_e(headline_text(head))}{conf}, verdict {_e(verdict)}")
    for q, why in left_out(report):
        lines.append(f"  - {_c(q)}: not audited ({_e(scrub(why))})")
    return lines


def _row(measure: str, value: str, conf: float | None, limit: str = "", status: str = "") -> str:
    return f"| {measure} | {value} | {level(conf) or 'n/a'} | {limit} | {status} |"


def _attack_rows(row: GridRow, a: Criterion) -> list[str]:
    """The leakage (the headline), the comparison with full precision and two diagnostics beside them."""
    d = decision_of(row)
    head = headline_of(row)
    chosen = chosen_attack(d) if d is not None else None
    value = "n/a" if head is None or head.value is None else headline_text(head).removeprefix("TPR ")
    measure = "leakage: strongest attack's TPR at 1% FPR, cross-fitted" + (
        f" (chosen most: {_c(chosen)})" if chosen else ""
    )
    lines = [_row(measure, value, head and head.confidence, f"{a.comparison} {a.threshold:g}", _e(a.status))]
    if d is not None and d.comparison is not None and not row.is_reference:
        e = d.comparison.difference
        diff = "n/a" if e.value is None else f"{e.value:+.3f}{interval_text(e.low, e.high, signed=True)}"
        measure = f"leakage against full precision {_c(d.comparison.reference)}: paired difference of that TPR"
        lines.append(
            _row(measure, diff, e.confidence, f"within ±{d.comparison.margin:g}: the same", _e(d.comparison.direction))
        )
    if d is not None and d.loss_gap is not None and d.loss_gap.value is not None:
        g = d.loss_gap
        gap = f"{fmt_num(g.value, 4)}" + (
            "" if g.low is None or g.high is None else f" [{fmt_num(g.low, 4)}, {fmt_num(g.high, 4)}]"
        )
        lines.append(_row("diagnostic: loss of non-members minus members (nats per token)", gap, g.confidence))
    top = d.in_sample_max if d is not None else None
    if top is not None and top.low is None and d is not None:  # the attack's own interval where the max has none
        top = next((j.tpr for j in d.attacks if j.attack == d.in_sample_max_attack), top)
    if top is not None and top.value is not None and d.in_sample_max_attack:
        measure = f"diagnostic: highest attack on the data it was chosen on ({_c(d.in_sample_max_attack)}; biased up)"
        bound = f" (upper bound {fmt_num(top.high)})" if top.low is None and top.high is not None else ""
        value = f"{fmt_num(top.value)}{interval_text(top.low, top.high)}{bound}"
        lines.append(_row(measure, value, top.confidence))
    return lines


def _utility_rows(row: GridRow, u: Criterion) -> list[str]:
    loss = (u.metric or "loss") == "loss"
    value = f"{fmt_pct(u.value)}{fmt_pct_ci(u.ci)}" if loss else f"{fmt_num(u.value)}{fmt_ci(u.ci)}"
    limit = f"{u.comparison} {fmt_pct(u.threshold) if loss else fmt_num(u.threshold)}"
    lines = [_row(f"utility: {_e(u.description)}", value, u.confidence, limit, _e(u.status))]
    d = row.utility.divergence
    if d.measured:
        for stat, label in (
            (d.kl_mean, "diagnostic: KL from full precision (nats/token)"),
            (d.same_top, "diagnostic: same top token as full precision"),
        ):
            lines.append(
                _row(label, f"{fmt_num(stat and stat.mean)}{fmt_ci(stat and stat.ci)}", row.utility.confidence)
            )
    for name, m in sorted(row.utility.task_metrics.items()):
        lines.append(_row(f"diagnostic: task {_e(name)}", f"{fmt_num(m.value)}{fmt_ci(m.ci)}", row.utility.confidence))
    return lines


def _verdict_table(report: ReportJson, q: str) -> list[str]:
    row, crit = report.row(q), report.criteria(q)
    lines = ["| measure | estimate [interval] | interval level | limit | verdict |", "|---|---|---|---|---|"]
    lines += _attack_rows(row, crit["attack_tpr"])
    for cid, label in (("r_q", "r_Q (attack-free indicator)"), ("indicator", "attack-free indicator")):
        c = crit[cid]
        limit = "" if c.threshold is None or c.status == DISABLED else f"{c.comparison} {c.threshold:g}"
        lines.append(_row(label, f"{fmt_num(c.value)}{fmt_ci(c.ci)}", c.confidence, limit, _e(c.status)))
    return lines + _utility_rows(row, crit["utility"])


def _limits(report: ReportJson, q: str) -> list[str]:
    """At most MAX_LIMITS bullets: what PASS bounds, the scores and runs behind the verdict, the indicators,
    and the base model or data where they qualify the numbers."""
    row, a = report.row(q), report.criteria(q)["attack_tpr"]
    run = sorted(row.attacks)
    not_run = sorted(set(row.skipped_attacks) | {x for x in registered_attacks() if x not in row.attacks})
    lines = [
        f"- The verdict bounds the {len(run)} attacks run on this data and this fine-tuning recipe, not every "
        "possible attack" + (f"; not run here: {', '.join(_c(n) for n in not_run)}." if not_run else ".")
    ]
    n_neg = max((x.n_negatives or 0 for x in row.attacks.values()), default=0)
    n_pos = max((x.n_positives or 0 for x in row.attacks.values()), default=0)
    runs = f"{_e(row.n_models)} fine-tuned model(s)"
    cover = (
        "another fine-tuning run of the same recipe may leak more or less (run-to-run variation is not covered)"
        if a.mode == "empirical"
        else "run-to-run variation of fine-tuning is covered by the runs"
    )
    lines.append(
        f"- Scores behind each TPR: up to {n_neg} non-member and {n_pos} member scores pooled over {runs}; "
        f"a TPR at 1% FPR needs at least 1000 non-member scores; {cover}."
    )
    ind = row.indicator
    if ind is not None:
        lines.append(
            f"- The attack-free indicator {_c(ind.name)} (validation status {_e(ind.status)}; r_Q: "
            f"{_e(row.r_q_status)}) is context beside the attacks, never a verdict on its own."
        )
    source = report.provenance.model_source
    if source is not None and source.gguf_file_type:
        lines.append(
            f"- The base weights came from a GGUF {_e(source.gguf_file_type)} file: full precision already sits on "
            "that grid, so a quantizer aligned with it can look more private than on an unquantized base."
        )
    blind = report.blind_baseline
    if blind is not None and blind.warning:
        lines.append(f"- Blind baseline (a text-only classifier, no model): {_e(scrub(blind.warning))}.")
    return lines[:MAX_LIMITS]


def render_model_card(report: dict[str, Any] | ReportJson, *, quantizer: str | None = None) -> str:
    """The model card (YAML metadata and privacy section, Markdown) for the quantizer released.

    Every string from the report goes through the escaping report.md uses (`md_escape`, `md_code`).

    Args:
        report (dict[str, Any] | ReportJson): report.json's content, or the typed report.
        quantizer (str | None): the quantizer released, None for the recommended one.

    Returns:
        str: the card's Markdown.

    Raises:
        UnknownQuantizerError: `quantizer` is not in the report.
        MalformedReportError: the report lacks what the card reads (an edited or foreign report.json).
    """
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


def _answer(report: ReportJson, q: str) -> list[str]:
    line = answer_line(report, q)
    cleared = "cleared for release" if line.status == PASS else "NOT cleared for release"
    rec = recommendation_of(report).quantizer
    other = f" The audit recommended {_c(rec)}." if rec not in (None, q) else ""
    return [
        f"Released quantization: {_c(q)}. Audit verdict: **{_e(line.status)}** ({cleared}): "
        f"{_e(scrub('; '.join(line.segments())))}.{other}",
        "",
        _e(scrub(baseline_sentence(report))),
    ]


def _render(report: ReportJson, q: str) -> str:
    prov = report.provenance
    lines = [
        "---",
        _metadata(report, q).rstrip(),
        "---",
        "",
        "## Privacy: membership-inference audit",
        "",
        *_answer(report, q),
        "",
        *_audited_section(report),
        "",
        f"### Verdict for {_c(q)}",
        "",
        *_verdict_table(report, q),
        "",
        *([f"### Extraction and published files: {_c(q)}", "", *risks, ""] if (risks := risk_lines(report, q)) else []),
        "### Limits of this audit",
        "",
        *_limits(report, q),
        "",
        "### Full report",
        "",
        f"Generated by llmaudit {_e(report.llmaudit_version)} from report.json (experiment "
        f"{_c(prov.experiment_name)}, identity {_c(prov.identity_hash)}). The full report (report.md, report.html, "
        "report.json) has every quantization, attack and interval; no training text is shown here.",
    ]
    return "\n".join(lines) + "\n"
