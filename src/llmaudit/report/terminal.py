"""The report on one terminal screen (rich, markup off): the lines of every registered section that has a terminal
view (`llmaudit.report.section_registry`), in the report's order; the shipped answer section
(`llmaudit.report.answer_view`) is the baseline, one line per candidate quantizer and what may be released.
When the output is not a terminal (a log, a pipe, CI) the screen is FIXED_WIDTH columns wide.
"""

from __future__ import annotations

import io
import sys
from typing import Any, TextIO

from llmaudit.common.safe_text import safe_console
from llmaudit.report.models import ReportJson, as_report
from llmaudit.report.view import ordered_sections

FIXED_WIDTH = 120
"""Columns of the answer when the output is not a terminal."""


def print_summary(report: dict[str, Any] | ReportJson, *, file: TextIO | None = None, width: int | None = None) -> None:
    """Print the report's terminal screen: each registered section's terminal lines, in order.

    Args:
        report: the report, typed or as read from report.json.
        file: where to print (default stdout).
        width: the screen's width in columns (default: the terminal's, or FIXED_WIDTH when `file` is not one).
    """
    report = as_report(report)
    stream = file or sys.stdout
    if width is None and not (hasattr(stream, "isatty") and stream.isatty()):
        width = FIXED_WIDTH
    console = safe_console(stream, width=width)  # data printed as text, its control characters escaped
    console.soft_wrap = True  # the lines are wrapped between their parts already
    for section in ordered_sections():
        if section.terminal is not None:
            for text in section.terminal(report, console.width):
                console.print(text)


def summary_text(report: dict[str, Any] | ReportJson, width: int = FIXED_WIDTH) -> str:
    """The terminal screen as plain text (what a log that is not a terminal receives).

    Args:
        report: the report, typed or as read from report.json.
        width: the screen's width in columns.

    Returns:
        The screen's text, one line per printed line.
    """
    buf = io.StringIO()
    print_summary(report, file=buf, width=width)
    return buf.getvalue()
