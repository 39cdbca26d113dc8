"""The model card's lines on extraction, release sets and the one-run privacy-loss bound of the released
quantization (one line each), from report.json's typed sections (`llmaudit.report.models_risks`)."""

from __future__ import annotations

from llmaudit.analyze.decision.models import Estimate
from llmaudit.common.formatting import fmt_num
from llmaudit.report.cells import md_code, md_escape
from llmaudit.report.models import ReportJson
from llmaudit.report.models_risks import ReleaseSetNotMeasured

NO_BOUND = {
    "fixed_fraction": "each run trained on a fixed-size random subset of the records, and the bound needs every "
    "record included independently with probability 1/2",
    "import": "the fine-tunes were imported: their training sets were not drawn record by record at random",
}


def _est(e: Estimate | None) -> str:
    if e is None or e.value is None:
        return "n/a"
    return f"{fmt_num(e.value)} [{fmt_num(e.low)}, {fmt_num(e.high)}]"


def extraction_line(report: ReportJson, q: str) -> str | None:
    """The card's line on extraction: greedy members and non-members, (n, p), and the comparison with full precision.

    Args:
        report (ReportJson): the typed report.
        q (str): the quantizer released.

    Returns:
        str | None: the Markdown line; None where extraction was not measured for `q`.
    """
    ex = report.extraction
    block = ex.risk.per_quantizer.get(q) if ex is not None else None
    if block is None:
        return None
    parts = []
    for r in block.rates:
        label = "greedy decoding" if r.measure == "greedy" else f"one of {ex.risk.n} samples (p >= {ex.risk.p:g})"
        parts.append(f"{label}: members {_est(r.members)}, non-members {_est(r.nonmembers)}")
    changes = [f"{c.measure} {c.direction}" for c in block.comparison]
    versus = (
        f"; memorized part against {md_code(ex.risk.reference)}: {md_escape(', '.join(changes))}" if changes else ""
    )
    return (
        f"- Training responses reproduced exactly by {md_code(q)} (share of records, 95% intervals): "
        f"{md_escape('; '.join(parts))}{versus}."
    )


def epsilon_line(report: ReportJson, q: str) -> str | None:
    """The card's line on the privacy-loss lower bound (epsilon >= x ...), or why the audit could not compute one.

    Args:
        report (ReportJson): the typed report.
        q (str): the quantizer released.

    Returns:
        str | None: the Markdown line; None where the report has no epsilon block, or no measured bound for `q`.
    """
    eps = report.epsilon
    if eps is None:
        return None
    if not eps.qualifies:
        why = NO_BOUND.get(eps.design, "the runs' training sets were not drawn at random record by record")
        return f"- Provable privacy-loss lower bound (one run): not computed: {md_escape(why)}."
    b = eps.per_quantizer.get(q)
    if b is None or b.status != "MEASURED" or b.epsilon_lb is None:
        return None
    attack = f" (attack {md_code(b.attack)})" if b.attack else ""
    return (
        f"- Provable privacy-loss lower bound (one run) for {md_code(q)}: epsilon >= {fmt_num(b.epsilon_lb)} at "
        f"significance {b.significance:g}, delta {b.delta:g}{attack}; a lower bound, the true epsilon may be larger."
    )


def release_set_lines(report: ReportJson, q: str) -> list[str]:
    """One line per release set that holds the released quantization: its verdict and the comparison with its best
    single file.

    Args:
        report (ReportJson): the typed report.
        q (str): the quantizer released.

    Returns:
        list[str]: the Markdown lines (empty without such a set).
    """
    out = []
    for s in report.release_sets:
        if q not in s.files:
            continue
        if isinstance(s, ReleaseSetNotMeasured):
            out.append(f"- Published together ({md_code(s.name)}): not measured.")
            continue
        out.append(
            f"- Published together ({md_code(s.name)}): verdict **{md_escape(s.decision.status)}**; "
            f"{md_escape(s.sentence)}."
        )
    return out


def risk_lines(report: ReportJson, q: str) -> list[str]:
    """The card's lines on extraction, release sets and the privacy-loss bound.

    Args:
        report (ReportJson): the typed report.
        q (str): the quantizer released.

    Returns:
        list[str]: the Markdown lines (empty when none applies).
    """
    lines = [extraction_line(report, q), *release_set_lines(report, q), epsilon_line(report, q)]
    return [line for line in lines if line]
