"""A report section added in this one module (docs/architecture.md, "Adding a report section"): how many
quantizers the release checklist gives each overall status. Its data goes into report.json under its key, typed
by its model; report.md and report.html show it between the verdict and the summary; the terminal prints one line
after the answer. Importing the module registers the section."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from rich.text import Text

from llmaudit.report.cells import Cell, Section, Table
from llmaudit.report.models import ReportJson
from llmaudit.report.section_registry import SectionSpec, register, section_data

KEY = "status-counts"


class StatusCounts(BaseModel):
    """The section's data in report.json: quantizers per overall checklist status."""

    counts: dict[str, int]
    quantizers: int


def build(result: Any, report: dict[str, Any]) -> StatusCounts:
    """The counts from the checklist the report has just built.

    Args:
        result: the analysis result (not read: the checklist holds the statuses).
        report: the report built so far.

    Returns:
        The section's data.
    """
    per_quantizer = report["checklist"]["per_quantizer"]
    counts: dict[str, int] = {}
    for entry in per_quantizer.values():
        counts[entry["overall"]] = counts.get(entry["overall"], 0) + 1
    return StatusCounts(counts=counts, quantizers=len(per_quantizer))


def _data(report: ReportJson) -> StatusCounts | None:
    data = section_data(report, KEY)
    return data if isinstance(data, StatusCounts) else None


def view(report: ReportJson) -> Section | None:
    """The counts as one table (report.md and report.html).

    Args:
        report: the typed report.

    Returns:
        The section's view model, or None when the report carries no counts.
    """
    data = _data(report)
    if data is None:
        return None
    rows = [[Cell(status, status=status), Cell(str(n))] for status, n in sorted(data.counts.items())]
    return Section("Status counts", [f"{data.quantizers} quantizers on the checklist."], [Table(["status", "n"], rows)])


def terminal(report: ReportJson, width: int) -> list[Text]:
    """One line on the terminal screen.

    Args:
        report: the typed report.
        width: the screen's width in columns (the line is short).

    Returns:
        The line, or none when the report carries no counts.
    """
    data = _data(report)
    if data is None:
        return []
    return [Text("status counts: " + ", ".join(f"{s} {n}" for s, n in sorted(data.counts.items())))]


SECTION = register(SectionSpec(KEY, 25, view, model=StatusCounts, build=build, terminal=terminal))
