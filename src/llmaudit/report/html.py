"""report.html from the view model: one self-contained file (inline CSS, figures as data: URIs, no
scripts, no external resources).
"""

from __future__ import annotations

import base64
import html
from typing import Any

from llmaudit.report.cells import Section, Table, to_html
from llmaudit.report.models import ReportJson, as_report
from llmaudit.report.plots import FIGURES, WIDE_FIGURES
from llmaudit.report.view import shown_sections

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;color:#1d1d1f;background:#fafafa;font-size:14px;line-height:1.45}
main{max-width:1200px;margin:0 auto;padding:18px 28px 60px}
h1{font-size:22px;margin:6px 0 2px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
nav{font-size:12px;color:#555;margin-bottom:6px} nav a{color:#2358a6;margin-right:10px;text-decoration:none}
.summary{background:#fff;border:1px solid #d8d8d8;border-left:5px solid #2358a6;border-radius:4px;padding:8px 16px;margin:10px 0}
table{border-collapse:collapse;margin:8px 0 14px;background:#fff;font-size:12.5px;max-width:100%}
th,td{border:1px solid #dcdcdc;padding:4px 7px;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f0f2f5;font-weight:600} tr:nth-child(even) td{background:#fbfbfd}
tr.ref td{background:#eef3fb !important}
tr.rec td{background:#e3f5e6 !important;border-top:2px solid #11602a;border-bottom:2px solid #11602a;font-weight:600}
.banner{border-radius:6px;padding:4px 18px;margin:12px 0;font-size:14.5px}
.banner p:first-child,.banner p.conclusion{font-size:16px;font-weight:700} .banner li{margin:4px 0}
details>summary{cursor:pointer;list-style:none} details>summary h2{display:inline-block}
details>summary::before{content:"+ ";color:#2358a6;font-weight:700} details[open]>summary::before{content:"- "}
.banner.cleared{background:#d9f2dd;color:#11602a;border:1px solid #11602a}
.banner.notcleared{background:#fdf0c8;color:#7a5300;border:1px solid #7a5300}
.banner.none{background:#fbd9d7;color:#9b1c14;border:1px solid #9b1c14}
td.ref,th.ref{background:#eef3fb !important;border-left:2px solid #2358a6;border-right:2px solid #2358a6}
.scroll{overflow-x:auto}
.ci{color:#666;font-size:11px}
code{font-family:SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;background:#f1f1f4;padding:0 3px;border-radius:3px}
.badge{display:inline-block;padding:1px 7px;border-radius:10px;font-weight:700;font-size:11.5px;white-space:nowrap}
.pass{background:#d9f2dd;color:#11602a}.fail{background:#fbd9d7;color:#9b1c14}
.inconclusive{background:#fdf0c8;color:#7a5300}.notmeasured{background:#e4e4e8;color:#3d3d45}.disabled{background:#f3f3f3;color:#888}
.unrel{color:#b25b00;font-weight:700}
.figs{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:14px}
figure{margin:0;background:#fff;border:1px solid #ddd;border-radius:4px;padding:8px}
figure.wide{grid-column:1/-1}
figure img{max-width:100%;height:auto;display:block;margin:0 auto} figcaption{font-size:12px;color:#555;text-align:center}
ul{margin:4px 0 10px;padding-left:22px} li{margin:2px 0}
footer{color:#777;font-size:11.5px;margin-top:30px}
"""


def _row_class(t: Table, i: int) -> str:
    classes = (["rec"] if t.marked_row == i else []) + (["ref"] if i == 0 and t.highlight_first else [])
    return f' class="{" ".join(classes)}"' if classes else ""


def _html_table(t: Table) -> str:
    if t.transpose_html:
        # quantizers as columns, the reference (first row) as the first, highlighted column
        cols = t.rows
        head = (
            "<tr><th>"
            + html.escape(t.header[0])
            + "</th>"
            + "".join(
                f'<th class="{"ref" if (i == 0 and t.highlight_first) else ""}">{c[0].html()}</th>'
                for i, c in enumerate(cols)
            )
            + "</tr>"
        )
        body = "".join(
            "<tr><th>"
            + html.escape(t.header[j])
            + "</th>"
            + "".join(
                f'<td class="{"ref" if (i == 0 and t.highlight_first) else ""}">{c[j].html()}</td>'
                for i, c in enumerate(cols)
            )
            + "</tr>"
            for j in range(1, len(t.header))
        )
    else:
        head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in t.header) + "</tr>"
        body = "".join(
            f"<tr{_row_class(t, i)}>" + "".join(f"<td>{c.html()}</td>" for c in row) + "</tr>"
            for i, row in enumerate(t.rows)
        )
    return f'<div class="scroll"><table><thead>{head}</thead><tbody>{body}</tbody></table></div>'


def _section_html(s: Section, figures: dict[str, bytes]) -> list[str]:
    """One section: its paragraphs, tables, bullets, closing paragraphs and figures; a folded one (a diagnostic)
    inside <details>, closed until the reader opens it."""
    cls = ' class="summary"' if s.anchor == "verdict" else ""
    title = html.escape(s.title)
    parts = [f'<section id="{s.anchor}"{cls}>']
    parts.append(f"<details><summary><h2>{title}</h2></summary>" if s.folded else f"<h2>{title}</h2>")
    parts += [f"<p>{to_html(p)}</p>" for p in s.paras]
    parts += [_html_table(t) for t in s.tables]
    if s.bullets:
        parts.append("<ul>" + "".join(f"<li>{to_html(b)}</li>" for b in s.bullets) + "</ul>")
    parts += [f"<p>{to_html(p)}</p>" for p in s.closing]
    if s.figures:
        parts.append('<div class="figs">')
        for name in (n for n in s.figures if n in figures):  # a figure report.json names but not drawn: left out
            b64 = base64.b64encode(figures[name]).decode("ascii")
            wide = ' class="wide"' if name in WIDE_FIGURES else ""
            parts.append(
                f'<figure{wide}><img alt="{html.escape(FIGURES[name][1])}" src="data:image/png;base64,{b64}">'
                f"<figcaption>{html.escape(FIGURES[name][1])}</figcaption></figure>"
            )
        parts.append("</div>")
    parts.append("</details></section>" if s.folded else "</section>")
    return parts


def render_html(report: dict[str, Any] | ReportJson, figures: dict[str, bytes]) -> str:
    """The report as one self-contained HTML file: inline CSS, figures as data: URIs, no scripts, no external
    resources; every registered section this report shows, in order (the shipped answer as the banner at the top,
    the diagnostics folded under their titles).

    Args:
        report: the report, typed or as read from report.json.
        figures: the PNG bytes of each drawn figure by name; a figure not drawn is left out.

    Returns:
        report.html's text.
    """
    report = as_report(report)
    shown = shown_sections(report)
    name = html.escape(str(report.provenance.experiment_name))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>llmaudit report: {name}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>llmaudit report: {name}</h1>",
        "<nav>" + "".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for c, s in shown if c.nav) + "</nav>",
    ]
    for section, s in shown:
        parts += [section.html(report, s)] if section.html is not None else _section_html(s, figures)
    parts.append(
        f"<footer>Generated {html.escape(str(report.generated_utc))} by llmaudit {html.escape(str(report.llmaudit_version))}; "
        f"report schema v{report.report_schema_version}. Self-contained: no scripts, no external resources.</footer>"
    )
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"
