"""The answer on one terminal screen (rich): every quantizer's verdict, leakage against full precision, the honest
strongest-attack TPR with its interval and the utility it keeps, then the recommendation as the last lines. No
Markdown: data is printed as text (rich markup off), sensible in 80 and 120 columns, plain text when the output
is not a terminal.
"""

from __future__ import annotations

import io
import sys
from typing import Any, TextIO

from rich import box
from rich.table import Table
from rich.text import Text

from llmaudit.common.safe_text import safe_console
from llmaudit.report.models import ReportJson, as_report
from llmaudit.report.summary import headline, leakage_statement, summary_rows

STATUS_STYLE = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow", "NOT MEASURED": "bold"}


def gate_decision(report: dict[str, Any] | ReportJson, release: str | None) -> tuple[bool, str]:
    """(cleared, why) for the quantizer a release ships (`release`, default the recommended one): cleared only
    when its overall verdict is PASS. Raises KeyError-free: an unknown name is reported as not cleared."""
    report = as_report(report)
    q = release or report.recommendation.quantizer
    if q is None:
        return False, "no quantizer is recommended (none keeps enough utility), so nothing is cleared for release"
    per_q = report.checklist.per_quantizer
    if q not in per_q:
        return False, f"{q} is not in the report ({', '.join(per_q)})"
    overall = per_q[q].overall
    return overall == "PASS", f"{q}: overall {overall}" + ("" if overall == "PASS" else ", NOT cleared for release")


def _table(report: ReportJson, width: int) -> Table:
    narrow = width < 100
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    t.add_column("quantizer", no_wrap=True)
    t.add_column("verdict", no_wrap=True)
    t.add_column("vs full\nprecision" if narrow else "vs full precision")
    t.add_column("strongest attack\nTPR@1% FPR" if narrow else "strongest attack, TPR@1% FPR")
    t.add_column("Δ val loss")
    t.add_column("KL")
    for s in summary_rows(report):
        name = Text(s.quantizer + (" (ref)" if s.is_reference else ""))
        if s.recommended:
            name.append(" *", style="bold green")
        vs = Text(s.vs_full_precision) + (Text("\n" + s.vs_detail, style="dim") if s.vs_detail else Text(""))
        strongest = Text(s.strongest) + (
            Text("\n" + s.strongest_interval, style="dim") if s.strongest_interval else Text("")
        )
        t.add_row(
            name, Text(s.verdict, style=STATUS_STYLE.get(s.verdict, "")), vs, strongest, Text(s.loss_change), Text(s.kl)
        )
    return t


def print_summary(report: dict[str, Any] | ReportJson, *, file: TextIO | None = None, width: int | None = None) -> None:
    """Print the answer screen to `file` (default stdout): the table, what it reads, then the recommendation."""
    report = as_report(report)
    console = safe_console(file or sys.stdout, width=width)  # data printed as text, its control characters escaped
    w = console.width
    console.print(Text(f"llmaudit verdict: {report.provenance.experiment_name}", style="bold"))
    console.print(_table(report, w))
    console.print(Text("* recommended. " + leakage_statement(report), style="dim"))
    console.print("")
    rec = report.recommendation
    console.print(Text(headline(report), style="bold green" if rec.cleared_for_release else "bold yellow"))
    if rec.explanation:
        console.print(Text(rec.explanation))


def summary_text(report: dict[str, Any] | ReportJson, width: int = 80) -> str:
    """The answer screen as plain text at `width` columns (what a log that is not a terminal receives)."""
    buf = io.StringIO()
    print_summary(report, file=buf, width=width)
    return buf.getvalue()
