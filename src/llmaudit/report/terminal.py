"""The answer on one terminal screen (rich, markup off): the full-precision baseline first, then one line per
candidate quantizer (verdict, the deciding criterion with its number and limit, leakage, MORE / SAME / LESS than
full precision, the utility kept), then what may be released, as the last lines (`llmaudit.report.answer`).
When the output is not a terminal (a log, a pipe, CI) the screen is FIXED_WIDTH columns wide; lines are wrapped
between their parts, never inside an interval.
"""

from __future__ import annotations

import io
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.text import Text

from llmaudit.report.answer import (
    NOT_AUDITED,
    baseline_sentence,
    candidate_lines,
    cleared_kind,
    conclusion,
    left_out,
    recommendation_of,
    wrap_segments,
)
from llmaudit.report.models import ReportJson, as_report
from llmaudit.report.summary import leakage_statement

STATUS_STYLE = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow", "NOT MEASURED": "bold"}

FIXED_WIDTH = 120
"""Columns of the answer when the output is not a terminal."""

STATUS_WIDTH = len("NOT MEASURED")


def answer_lines(report: ReportJson, width: int) -> list[tuple[str, str | None, int]]:
    """The answer screen as (line, its verdict word or None, where that word starts), every line at most `width`
    columns (a part longer than a line wrapped between words)."""
    out: list[tuple[str, str | None, int]] = [(f"llmaudit verdict: {report.provenance.experiment_name}", None, 0)]
    out += [(line, None, 0) for line in wrap_segments("", [baseline_sentence(report)], width, 2)]
    rows = [(a.quantizer, a.status, a.segments()) for a in candidate_lines(report)]
    rows += [(q, NOT_AUDITED, [why]) for q, why in left_out(report)]
    name_width = min(max((len(q) for q, _, _ in rows), default=0), 24)
    for q, status, segments in rows:
        start = len(f"  {q:<{name_width}}  ")
        head = f"  {q:<{name_width}}  {status:<{STATUS_WIDTH}}  "
        indent = len(head) if width - len(head) >= 40 else 6
        wrapped = wrap_segments(head, segments, width, indent)
        out.append((wrapped[0], status, start))
        out += [(line, None, 0) for line in wrapped[1:]]
    return out


def print_summary(report: dict[str, Any] | ReportJson, *, file: TextIO | None = None, width: int | None = None) -> None:
    """Print the answer screen to `file` (default stdout): the baseline, one line per candidate, what the numbers
    are, then what may be released and why."""
    report = as_report(report)
    stream = file or sys.stdout
    if width is None and not (hasattr(stream, "isatty") and stream.isatty()):
        width = FIXED_WIDTH
    console = Console(file=stream, width=width, highlight=False, markup=False, emoji=False, soft_wrap=True)
    w = console.width
    for i, (line, status, start) in enumerate(answer_lines(report, w)):
        text = Text(line, style="bold" if i == 0 else "")
        if status is not None:
            text.stylize(STATUS_STYLE.get(status, ""), start, start + len(status))
        console.print(text)
    for line in wrap_segments("", [leakage_statement(report)], w, 0):
        console.print(Text(line, style="dim"))
    console.print("")
    style = "bold green" if cleared_kind(report) == "cleared" else "bold yellow"
    for line in wrap_segments("", [conclusion(report)], w, 0):
        console.print(Text(line, style=style))
    explanation = recommendation_of(report).explanation
    if explanation:
        for line in wrap_segments("", [explanation], w, 0):
            console.print(Text(line))


def summary_text(report: dict[str, Any] | ReportJson, width: int = FIXED_WIDTH) -> str:
    """The answer screen as plain text at `width` columns (what a log that is not a terminal receives)."""
    buf = io.StringIO()
    print_summary(report, file=buf, width=width)
    return buf.getvalue()
