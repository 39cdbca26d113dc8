"""The building blocks of the report's view model, shared by every section and by the Markdown and HTML
renderers: marked data (shown verbatim by every renderer), cells, tables and sections.
"""

from __future__ import annotations

import html
import re
from typing import Any

from llmaudit.common.formatting import fmt_ci, fmt_num
from llmaudit.report.policy import DISABLED, FAIL, INCONCLUSIVE, NOT_MEASURED, PASS

LIT = ("\x02", "\x03")
"""Markers around text that came from data (names, paths, reasons): every renderer shows it verbatim."""
CODE = ("\x04", "\x05")
"""Markers around data shown in code style."""
_MARKERS = re.compile("[\x00-\x08\x0b-\x1f\x7f]")
_SEGMENTS = re.compile("(\x02[^\x03]*\x03|\x04[^\x05]*\x05)")
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#!|<>~&])")


def _clean(value: Any) -> str:
    return _MARKERS.sub(" ", str(value)).replace("\n", " ").replace("\r", " ")


def _unmark(value: Any) -> str:
    """Cell content (always data): markers dropped, control characters blanked."""
    return _clean(re.sub("[\x02-\x05]", "", str(value)))


def lit(value: Any) -> str:
    """Mark data (a name, a path, a reason) inside prose: shown verbatim, never read as Markdown or HTML.

    Args:
        value: the data.

    Returns:
        The marked text, control characters blanked.
    """
    return f"{LIT[0]}{_clean(value)}{LIT[1]}"


def code(value: Any) -> str:
    """Mark data shown in code style, verbatim.

    Args:
        value: the data.

    Returns:
        The marked text, control characters blanked.
    """
    return f"{CODE[0]}{_clean(value)}{CODE[1]}"


def md_escape(text: str) -> str:
    """Text that CommonMark renders exactly as written (no emphasis, links, HTML or table breaks), on one line.

    The one escaping of data in report.md and model_card.md.

    Args:
        text: the text.

    Returns:
        The escaped text; line breaks and control characters become spaces.
    """
    return _MD_SPECIAL.sub(r"\\\1", _clean(text))


def md_code(text: str) -> str:
    """A Markdown code span holding `text` verbatim, on one line (a line break inside a span could end the paragraph).

    Args:
        text: the text.

    Returns:
        The span, fenced with more backticks than the text contains, its pipes escaped for a table.
    """
    text = _clean(text)
    longest = max((len(m) for m in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}".replace("|", "\\|")


def to_markdown(text: str) -> str:
    """View text (Markdown-lite written by llmaudit, with marked data) as Markdown.

    Args:
        text: the view text.

    Returns:
        Markdown, its marked data escaped (`md_escape`) or in code spans (`md_code`).
    """
    out = []
    for part in _SEGMENTS.split(text):
        if part.startswith(LIT[0]):
            out.append(md_escape(part[1:-1]))
        elif part.startswith(CODE[0]):
            out.append(md_code(part[1:-1]))
        else:
            out.append(part)
    return "".join(out)


def to_html(text: str) -> str:
    """View text as HTML: llmaudit's own `code` and **bold** become tags (bold may span marked data).

    Args:
        text: the view text.

    Returns:
        HTML; marked data is only escaped, never read as markup.
    """
    data: list[str] = []
    own = []
    for part in _SEGMENTS.split(text):
        if part.startswith(LIT[0]):
            data.append(html.escape(part[1:-1]))
        elif part.startswith(CODE[0]):
            data.append(f"<code>{html.escape(part[1:-1])}</code>")
        else:
            own.append(html.escape(part))
            continue
        own.append(f"\x06{len(data) - 1}\x07")
    joined = re.sub(r"`([^`\x06\x07]+)`", r"<code>\1</code>", "".join(own))
    joined = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", joined)
    return re.sub("\x06(\\d+)\x07", lambda m: data[int(m.group(1))], joined)


class Cell:
    """A table cell shared by the Markdown and HTML renderers: main text, an optional interval shown in
    brackets (Markdown) or on a second line (HTML), a status badge, code style, an unreliable mark."""

    def __init__(
        self, text: str = "", sub: str = "", *, status: str | None = None, code: bool = False, unreliable: bool = False
    ):
        self.text, self.sub, self.status, self.code, self.unreliable = text, sub, status, code, unreliable

    def md(self) -> str:
        """The cell in a Markdown table.

        Returns:
            Its text (bold with a status, a code span in code style), the unreliable mark and the interval.
        """
        if self.code:
            text = md_code(_unmark(self.text))
        else:
            text = md_escape(_unmark(self.text))
            text = f"**{text}**" if self.status else text
        mark = " †" if self.unreliable else ""
        sub = f" {md_escape(_unmark(self.sub))}" if self.sub else ""
        return text + mark + sub

    def html(self) -> str:
        """The cell in an HTML table.

        Returns:
            Its text (a badge with a status), the unreliable mark, and the interval on a second line.
        """
        text = _whole_intervals(html.escape(_unmark(self.text)))
        if self.code:
            text = f"<code>{text}</code>"
        if self.status:
            text = f'<span class="badge {_status_class(self.status)}">{text}</span>'
        if self.unreliable:
            text += ' <span class="unrel" title="estimate flagged unreliable">†</span>'
        if self.sub:
            text += f'<br><span class="ci">{_whole_intervals(html.escape(_unmark(self.sub)))}</span>'
        return text


def _whole_intervals(text: str) -> str:
    """HTML text whose intervals "[low, high]" never break across lines (their spaces non-breaking)."""
    return re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", "&nbsp;"), text)


def _status_class(status: str) -> str:
    return {
        PASS: "pass",
        FAIL: "fail",
        INCONCLUSIVE: "inconclusive",
        NOT_MEASURED: "notmeasured",
        DISABLED: "disabled",
    }.get(status, "")


def value_cell(value: Any, ci: Any = None, digits: int = 3, *, unreliable: bool = False) -> Cell:
    """A number with its interval (brackets in Markdown, a second line in HTML).

    Args:
        value: the number, or None.
        ci: its interval [low, high], or None.
        digits: significant digits.
        unreliable: mark the estimate as unreliable.

    Returns:
        The cell.
    """
    return Cell(fmt_num(value, digits), fmt_ci(ci, digits).strip(), unreliable=unreliable)


class Table:
    """A table of cells; `highlight_first` marks the reference row, `marked_row` the recommended one."""

    def __init__(
        self,
        header: list[str],
        rows: list[list[Cell]],
        *,
        transpose_html: bool = False,
        highlight_first: bool = False,
        marked_row: int | None = None,
    ):
        self.header, self.rows, self.transpose_html = header, rows, transpose_html
        self.highlight_first, self.marked_row = highlight_first, marked_row


class Section:
    """A titled block: paragraphs (Markdown-lite: `code` and **bold**), tables, figures, a bullet list, closing
    paragraphs after the bullets; `folded`: shown collapsed in HTML (a diagnostic the reader opens)."""

    def __init__(
        self,
        title: str,
        paras: list[str] | None = None,
        tables: list[Table] | None = None,
        bullets: list[str] | None = None,
        figures: list[str] | None = None,
        anchor: str = "",
        *,
        closing: list[str] | None = None,
        folded: bool = False,
    ):
        self.title, self.paras, self.tables, self.bullets, self.figures = (
            title,
            paras or [],
            tables or [],
            bullets or [],
            figures or [],
        )
        self.closing, self.folded = closing or [], folded
        self.anchor = anchor or re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
