"""The report's verdict sections (docs/science.md section 12): the verdict (headline, recommendation, one table of
every quantizer), the comparison with full precision per attack, and the rule with what it controls.
"""

from __future__ import annotations

from llmaudit.report.answer import recommendation_of
from llmaudit.report.cells import Cell, Section, Table, code, lit
from llmaudit.report.models import GridRow, ReportJson
from llmaudit.report.release import decision_of
from llmaudit.report.summary import leakage_statement, summary_rows

SUMMARY_HEADER = [
    "quantizer",
    "verdict",
    "vs full precision",
    "leakage: strongest attack, TPR at 1% FPR (cross-fitted)",
    "diagnostic: in-sample max (selection-biased)",
    "diagnostic: loss gap non-members - members (nats)",
    "Δ val loss",
    "KL vs ref",
]


def summary_table(report: ReportJson) -> Table:
    """Every quantizer on one table: verdict, leakage against full precision, the strongest attack, utility.

    Args:
        report: the typed report.

    Returns:
        The table, the reference row highlighted and the recommended (or first-ranked) row marked.
    """
    rows, marked = [], None
    first = " (recommended)" if report.recommendation.cleared_for_release else " (ranks first, not cleared)"
    for i, s in enumerate(summary_rows(report)):
        if s.recommended:
            marked = i
        label = s.quantizer + (" (ref)" if s.is_reference else "") + (first if s.recommended else "")
        rows.append(
            [
                Cell(label, code=True),
                Cell(s.verdict, s.deciding, status=s.verdict),
                Cell(s.vs_full_precision, s.vs_detail),
                Cell(s.strongest, s.strongest_interval),
                Cell(s.in_sample_max),
                Cell(s.loss_gap),
                Cell(s.loss_change),
                Cell(s.kl),
            ]
        )
    return Table(SUMMARY_HEADER, rows, highlight_first=report.grid[0].is_reference, marked_row=marked)


def verdict_section(report: ReportJson) -> Section:
    """The recommendation paragraph, the summary table and what its numbers are.

    Args:
        report: the typed report.

    Returns:
        The section's view model.
    """
    paras = []
    explanation = recommendation_of(report).explanation
    if explanation:
        paras.append(lit(explanation))
    paras.append(lit(leakage_statement(report)))
    return Section("Verdict", paras, [summary_table(report)], anchor="verdict")


def _difference_cell(row: GridRow, attack: str, metric: str) -> Cell:
    d = decision_of(row)
    if d is None or d.comparison is None:
        return Cell("n/a")
    e = next((x.estimate for x in d.comparison.per_attack if x.attack == attack and x.metric == metric), None)
    if e is None or e.value is None:
        return Cell("n/a")
    span = "" if e.low is None or e.high is None else f"[{e.low:+.3f}, {e.high:+.3f}]"
    return Cell(f"{e.value:+.3f}", span)


def _levels(decisions: list) -> str:
    """The per-attack differences' interval level(s) as recorded ("90%")."""
    shown = {
        f"{100 * x.estimate.confidence:.0f}%"
        for d in decisions
        if d is not None and d.comparison is not None
        for x in d.comparison.per_attack
        if x.estimate.confidence is not None
    }
    return "/".join(sorted(shown))


def comparison_section(report: ReportJson) -> Section | None:
    """Per quantizer, the comparison with full precision and, per attack, the paired differences of the TPR at 1% FPR
    and of the AUROC (quantizer minus reference, intervals over the same resampled samples at the level recorded).

    Args:
        report: the typed report.

    Returns:
        The section's view model, or None when no quantizer carries a comparison.
    """
    rows = [r for r in report.grid if not r.is_reference and decision_of(r) is not None]
    decisions = [decision_of(r) for r in rows]
    if not rows or all(d is None or d.comparison is None for d in decisions):
        return None
    bullets = [
        f"{code(r.quantizer)}: **{d.comparison.direction}**: {lit(d.comparison.sentence)}"
        for r, d in zip(rows, decisions)
        if d is not None and d.comparison is not None
    ]
    attacks = list(dict.fromkeys(x.attack for d in decisions if d and d.comparison for x in d.comparison.per_attack))
    tables = [
        Table(
            [f"Δ {label} vs {report.reference_quantizer}"] + [r.quantizer for r in rows],
            [[Cell(a, code=True)] + [_difference_cell(r, a, metric) for r in rows] for a in attacks],
        )
        for metric, label in (("tpr", "TPR at 1% FPR"), ("auroc", "AUROC"))
    ]
    paras = [
        "Does quantizing leak more, the same or less than shipping full precision? The answer per quantizer compares "
        "the two cross-fitted strongest attacks on the same runs and samples (paired bootstrap): MORE or LESS when the "
        "interval of the difference excludes 0, the SAME when it lies within the equivalence margin, else the data "
        "cannot tell. Below, as diagnostics, per attack the paired differences (quantizer minus reference) with "
        f"{_levels(decisions) or 'their'} intervals."
    ]
    return Section("Compared with full precision", paras, tables, bullets=bullets, anchor="comparison")


def rule_bullets(report: ReportJson) -> list[str]:
    """The release rule's statements as recorded with the decision (what each verdict controls).

    Args:
        report: the typed report.

    Returns:
        One bullet per statement; none when the report records no rule.
    """
    rule = report.decision_rule
    return [lit(s) for s in rule.statements] if rule is not None else []
