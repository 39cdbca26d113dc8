"""report.md from the view model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmaudit.report.cells import Section, Table, md_escape, to_markdown
from llmaudit.report.models import ReportJson, as_report
from llmaudit.report.plots import FIGURES
from llmaudit.report.view import shown_sections


def _md_table(t: Table) -> list[str]:
    lines = ["| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
    lines += ["| " + " | ".join(c.md() for c in row) + " |" for row in t.rows]
    return lines


def section_markdown(report: ReportJson, s: Section) -> list[str]:
    """One section of report.md from its view model.

    Args:
        report: the typed report (the paths of its figures).
        s: the section's view model.

    Returns:
        Its lines: the title, paragraphs, tables, bullets, closing paragraphs and figures, each block followed by
        an empty line.
    """
    lines = [f"## {s.title}", ""]
    for p in s.paras:
        lines += [to_markdown(p), ""]
    for t in s.tables:
        lines += _md_table(t) + [""]
    for b in s.bullets:
        lines.append(f"- {to_markdown(b)}")
    if s.bullets:
        lines.append("")
    for p in s.closing:
        lines += [to_markdown(p), ""]
    for name in s.figures:
        lines += [f"![{FIGURES[name][1]}]({report.plots[name]})", ""]
    return lines


def render_markdown(report: dict[str, Any] | ReportJson, *, only: Iterable[str] | None = None) -> str:
    """The report as Markdown: every registered section this report shows, in order.

    Args:
        report: the report, typed or as read from report.json.
        only: the section keys to keep (e.g. ("summary", "checklist") for a console summary); default all.

    Returns:
        report.md's text.
    """
    report = as_report(report)
    keep = set(only) if only is not None else None
    lines = [f"# llmaudit report: {md_escape(str(report.provenance.experiment_name))}", ""]
    for section, shown in shown_sections(report):
        if keep is not None and section.key not in keep:
            continue
        lines += (section.markdown or section_markdown)(report, shown)
    return "\n".join(lines).rstrip() + "\n"
