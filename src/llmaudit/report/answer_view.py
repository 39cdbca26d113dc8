"""The answer section's views (`llmaudit.report.answer`): its paragraphs and bullets in report.md, the banner at
the top of report.html, and the screen the terminal shows: the full-precision baseline first, one line per
candidate quantizer (verdict, the deciding criterion with its number and limit, leakage, MORE / SAME / LESS than
full precision, the utility kept), then what may be released, as the last lines. Lines are wrapped between their
parts, never inside an interval.
"""

from __future__ import annotations

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
from llmaudit.report.cells import Section, code, lit, to_html
from llmaudit.report.models import ReportJson
from llmaudit.report.summary import leakage_statement

STATUS_STYLE = {"PASS": "bold green", "FAIL": "bold red", "INCONCLUSIVE": "bold yellow", "NOT MEASURED": "bold"}

STATUS_WIDTH = len("NOT MEASURED")


def answer_section(report: ReportJson) -> Section:
    """The answer in the user's words: the full-precision baseline, one line per candidate, what may be released.

    Args:
        report: the typed report.

    Returns:
        The section's view model (report.html shows it as the banner, `answer_banner`).
    """
    bullets = [f"{code(a.quantizer)} **{a.status}**: {lit('; '.join(a.segments()))}" for a in candidate_lines(report)]
    bullets += [f"{code(q)} **{NOT_AUDITED}**: {lit(why)}" for q, why in left_out(report)]
    return Section(
        "Answer",
        [lit(baseline_sentence(report))],
        bullets=bullets,
        anchor="answer",
        closing=[f"**{lit(conclusion(report))}**"],
    )


def answer_banner(report: ReportJson, answer: Section) -> str:
    """The answer as the banner at the top of report.html.

    Args:
        report: the typed report.
        answer: the answer's view model (`answer_section`).

    Returns:
        The banner's HTML: green when a quantization is cleared, amber when none is, red when none keeps enough
        utility.
    """
    body = "".join(f"<p>{to_html(p)}</p>" for p in answer.paras)
    if answer.bullets:
        body += "<ul>" + "".join(f"<li>{to_html(b)}</li>" for b in answer.bullets) + "</ul>"
    body += "".join(f'<p class="conclusion">{to_html(p)}</p>' for p in answer.closing)
    return f'<div class="banner {cleared_kind(report)}" role="status" id="answer">{body}</div>'


def answer_lines(report: ReportJson, width: int) -> list[tuple[str, str | None, int]]:
    """The verdict lines of the answer screen: its title, the baseline, one line per quantizer.

    Args:
        report: the typed report.
        width: the screen's width in columns; a part longer than a line is wrapped between words.

    Returns:
        (line, its verdict word or None, the column where that word starts), each line at most `width` columns.
    """
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


def answer_screen(report: ReportJson, width: int) -> list[Text]:
    """The answer on the terminal: the verdict lines, what the numbers are, then what may be released and why.

    Args:
        report: the typed report.
        width: the screen's width in columns.

    Returns:
        The screen's lines, styled (verdict words coloured, the conclusion green when a quantization is cleared).
    """
    out = []
    for i, (line, status, start) in enumerate(answer_lines(report, width)):
        text = Text(line, style="bold" if i == 0 else "")
        if status is not None:
            text.stylize(STATUS_STYLE.get(status, ""), start, start + len(status))
        out.append(text)
    out += [Text(line, style="dim") for line in wrap_segments("", [leakage_statement(report)], width, 0)]
    out.append(Text(""))
    style = "bold green" if cleared_kind(report) == "cleared" else "bold yellow"
    out += [Text(line, style=style) for line in wrap_segments("", [conclusion(report)], width, 0)]
    explanation = recommendation_of(report).explanation
    if explanation:
        out += [Text(line) for line in wrap_segments("", [explanation], width, 0)]
    return out
