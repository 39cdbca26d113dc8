"""The answer on one screen: per quantizer the verdict, leakage against full precision, the honest strongest-attack
TPR with its interval and the utility it keeps, and the headline of the recommendation. Plain strings, shared by
the report's first section (Markdown / HTML) and the terminal summary, so that all three say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmaudit.common.formatting import fmt_num, fmt_pct, fmt_pct_ci
from llmaudit.report.models import Criterion, GridRow, ReportJson
from llmaudit.report.release import decision_of


@dataclass(frozen=True)
class SummaryRow:
    """One quantizer on the answer screen (every field already formatted)."""

    quantizer: str
    is_reference: bool
    recommended: bool
    verdict: str
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


def _strongest(attack_crit: Criterion) -> tuple[str, str, str]:
    """(strongest attack and its honest TPR, its interval, the in-sample maximum labelled selection-biased)."""
    name, value = attack_crit.attack, attack_crit.value
    ci = attack_crit.ci or [None, None]
    shown = f"{name} {fmt_num(value)}" if name else fmt_num(value)
    top = attack_crit.in_sample_max
    biased = f"{fmt_num(top.value)} ({top.attack})" if top is not None and top.attack else "n/a"
    return shown, _interval(ci[0], ci[1]), biased


def _gap(row: GridRow) -> str:
    """The member / non-member loss gap behind the TPR, nats per token with its interval."""
    d = decision_of(row)
    e = None if d is None else d.loss_gap
    if e is None or e.value is None:
        return "n/a"
    return f"{fmt_num(e.value, 4)} {_interval(e.low, e.high)}".strip()


def summary_rows(report: ReportJson) -> list[SummaryRow]:
    """One SummaryRow per quantizer, in the report's grid order (full precision first)."""
    rec = report.recommendation.quantizer
    rows = []
    for r in report.grid:
        q = r.quantizer
        checklist = report.checklist.per_quantizer[q]
        vs, detail = _vs(r)
        strongest, interval, biased = _strongest(checklist.criterion("attack_tpr"))
        u = r.utility
        kl = u.divergence.kl_mean.mean if u.divergence.kl_mean is not None else None
        rows.append(
            SummaryRow(
                quantizer=q,
                is_reference=r.is_reference,
                recommended=q == rec,
                verdict=checklist.overall,
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


def headline(report: ReportJson) -> str:
    """The verdict in one line: what may be released."""
    rec = report.recommendation
    q = rec.quantizer
    if q is None:
        return "Nothing can be released: no quantizer keeps enough utility."
    if rec.cleared_for_release:
        return f"Release {q}: cleared for release."
    return f"Nothing is cleared for release; the best candidate is {q} ({rec.overall})."


def leakage_statement(report: ReportJson) -> str:
    """What the attack criterion read, in one sentence (mode, limit, FPR), for the line under the summary table."""
    rule = report.decision_rule
    if rule is None or not rule.model_dump(exclude_unset=True):
        return "Attack criterion: the rule of the llmaudit version that wrote this report (no release rule recorded)."
    mode = (
        "per-sample calibrated scores pooled over the runs as targets"
        if rule.mode == "calibrated"
        else "each run's own held-out non-members with an empirical threshold (run-to-run variation of training not covered)"
    )
    return (
        f"Strongest attack: TPR at {rule.fpr:.0%} FPR, chosen on other folds and measured on each (cross-fitting), "
        f"{100 * (1 - 2 * rule.alpha):.0f}% interval, on {mode}; limit {rule.limit:g}. In-sample maximum: "
        f"the highest attack on the data it was chosen on (selection-biased upward). Loss gap: mean loss of "
        f"non-members minus members in nats per token, the difference behind the TPR. Against full precision: paired "
        f"difference of the strongest attacks, SAME within +-{rule.margin:g}."
    )
