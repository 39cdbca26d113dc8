"""report.md from the view model."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmaudit.report.cells import Table, md_escape, to_markdown
from llmaudit.report.models import ReportJson, as_report
from llmaudit.report.plots import FIGURES
from llmaudit.report.view import sections


def _md_table(t: Table) -> list[str]:
    lines = ["| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
    lines += ["| " + " | ".join(c.md() for c in row) + " |" for row in t.rows]
    return lines


def render_markdown(report: dict[str, Any] | ReportJson, *, only: Iterable[str] | None = None) -> str:
    """The report as Markdown; `only`: section anchors to keep (e.g. ("summary", "checklist") for a console summary)."""
    report = as_report(report)
    keep = set(only) if only is not None else None
    lines = [f"# llmaudit report: {md_escape(str(report.provenance.experiment_name))}", ""]
    for s in sections(report):
        if keep is not None and s.anchor not in keep:
            continue
        lines += [f"## {s.title}", ""]
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
    return "\n".join(lines).rstrip() + "\n"
