"""The verdict table of report.md / report.html (one row per quantizer: verdict, leakage against full precision,
the headline leakage with its interval, the diagnostics beside it, the utility kept) and the paragraph that says
what those numbers are. Plain strings; the answer's sentences are `llmaudit.report.answer`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmaudit.common.formatting import fmt_num, fmt_pct, fmt_pct_ci
from llmaudit.report.answer import criterion_words, deciding_criterion, recommendation_of
from llmaudit.report.models import Criterion, GridRow, ReportJson
from llmaudit.report.release import chosen_attack, decision_of, headline_of


@dataclass(frozen=True)
class SummaryRow:
    """One quantizer on the answer screen (every field already formatted)."""

    quantizer: str
    is_reference: bool
    recommended: bool
    verdict: str
    deciding: str
    """The criterion that decided the verdict, with its number and limit ("" when every criterion PASSes)."""
    vs_full_precision: str
    vs_detail: str
    strongest: str
    strongest_interval: str
    in_sample_max: str
    loss_gap: str
    loss_change: str
    kl: str


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f"[{fmt_num(low)}, {fmt_num(high)}]"


def _vs(row: GridRow) -> tuple[str, str]:
    if row.is_reference:
        return "reference", ""
    d = decision_of(row)
    if d is None or d.comparison is None:
        return "n/a", ""
    e = d.comparison.difference
    if e.value is None:
        return d.comparison.direction, ""
    span = "" if e.low is None or e.high is None else f" [{e.low:+.3f}, {e.high:+.3f}]"
    return d.comparison.direction, f"{e.value:+.3f}{span}"


def _strongest(row: GridRow) -> tuple[str, str]:
    """(the headline leakage with the attack chosen most often, its interval)."""
    head = headline_of(row)
    d = decision_of(row)
    attack = chosen_attack(d) if d is not None else (row.best_attack.name if row.best_attack else None)
    value = fmt_num(head.value if head is not None else None)
    return (f"{attack} {value}" if attack else value), "" if head is None else _interval(head.low, head.high)


def _in_sample_max(attack_crit: Criterion) -> str:
    """The in-sample maximum over attacks (a diagnostic, selection-biased upward)."""
    top = attack_crit.in_sample_max
    return f"{fmt_num(top.value)} ({top.attack})" if top is not None and top.attack else "n/a"


def _gap(row: GridRow) -> str:
    """The member / non-member loss gap behind the TPR, nats per token with its interval."""
    d = decision_of(row)
    e = None if d is None else d.loss_gap
    if e is None or e.value is None:
        return "n/a"
    return f"{fmt_num(e.value, 4)} {_interval(e.low, e.high)}".strip()


def _deciding(report: ReportJson, q: str) -> str:
    c = deciding_criterion(report, q)
    return "" if c is None else criterion_words(c, report.row(q))


def summary_rows(report: ReportJson) -> list[SummaryRow]:
    """One SummaryRow per quantizer, in the report's grid order (full precision first).

    Args:
        report: the typed report.

    Returns:
        The rows.
    """
    rec = recommendation_of(report).quantizer
    rows = []
    for r in report.grid:
        q = r.quantizer
        checklist = report.checklist.per_quantizer[q]
        vs, detail = _vs(r)
        strongest, interval = _strongest(r)
        biased = _in_sample_max(checklist.criterion("attack_tpr"))
        u = r.utility
        kl = u.divergence.kl_mean.mean if u.divergence.kl_mean is not None else None
        rows.append(
            SummaryRow(
                quantizer=q,
                is_reference=r.is_reference,
                recommended=q == rec,
                verdict=checklist.overall,
                deciding=_deciding(report, q),
                vs_full_precision=vs,
                vs_detail=detail,
                strongest=strongest,
                strongest_interval=interval,
                in_sample_max=biased,
                loss_gap=_gap(r),
                loss_change=f"{fmt_pct(u.relative_change)}{fmt_pct_ci(u.relative_change_ci)}",
                kl="n/a" if kl is None else fmt_num(kl, 4),
            )
        )
    return rows


def _levels(values: list[float | None]) -> str:
    """The intervals' confidence as recorded ("90%"; "90%/95%" where they differ; "" where none is)."""
    shown = sorted({f"{100 * v:.0f}%" for v in values if v is not None})
    return "/".join(shown)


def leakage_statement(report: ReportJson) -> str:
    """What the numbers of the answer are, in one paragraph (its levels read from the numbers): the headline
    leakage, the comparison with full precision, the utility, and which numbers are diagnostics.

    Args:
        report: the typed report.

    Returns:
        The paragraph.
    """
    rule = report.decision_rule
    if rule is None or not rule.model_dump(exclude_unset=True):
        return (
            "Leakage: the highest calibrated TPR at 1% FPR over the attacks (no release rule recorded: the rule of "
            "the llmaudit version that wrote this report)."
        )
    decisions = [d for d in (decision_of(r) for r in report.grid) if d is not None]
    head = _levels([d.strongest.tpr.confidence for d in decisions if d.strongest is not None])
    diff = _levels([d.comparison.difference.confidence for d in decisions if d.comparison is not None])
    util = _levels([report.criteria(q)["utility"].confidence for q in report.checklist.per_quantizer])
    mode = (
        "per-sample calibrated scores pooled over the runs as targets"
        if rule.mode == "calibrated"
        else "each run's own held-out non-members with an empirical threshold (run-to-run variation of training not covered)"
    )
    return (
        f"Leakage (the headline, one number per quantizer everywhere): the strongest attack's TPR at {rule.fpr:.0%} "
        f"FPR, chosen on other folds and measured on each (cross-fitted), on {mode}, {head or 'its'} interval; "
        f"limit {rule.limit:g}. Against full precision: the paired difference of that TPR ({diff or 'its'} interval), "
        f"SAME when every attack's difference is within +-{rule.margin:g}. Val loss: change of validation loss "
        f"against full precision ({util or 'its'} interval). Per-attack TPRs, the in-sample maximum and AUROCs are "
        "diagnostics."
    )
