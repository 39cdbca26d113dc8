"""Text from data made safe for a terminal: every control character is shown escaped, never emitted.

A file name, a recorded name, a report's text or an error message can hold bytes that a terminal obeys instead of
showing: OSC sequences (a window title, an OSC 8 hyperlink), CSI sequences (cursor moves, erase line), a carriage
return that paints a line over the previous one, bidirectional overrides that reorder what is shown. Each such
character is written as its escape (``\\x1b``, ``\\r``, ``\\u202e``), so that the reader sees what the data holds.

The output boundary applies it, so that new code is covered by default:
- `escape_controls`: one string (the command line's error printer, `llmaudit status`);
- `SafeConsole` / `safe_console`: a rich console whose every rendered segment is escaped, its own styles kept (the
  console the commands print the verdict with);
- `SafeStream`: the stream the command line installs as stdout for a command, which escapes every control character
  written to it except line breaks and the colour sequences (SGR) a console styles its output with.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, TextIO

from rich.console import Console
from rich.segment import Segment

_CONTROLS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
CONTROL = re.compile(f"[\n\t{_CONTROLS}]")
"""Every character a terminal may act on instead of showing: C0 and C1 controls, DEL, the Unicode line and
paragraph separators and the bidirectional marks and overrides."""
CONTROL_KEEP_LINES = re.compile(f"[\t{_CONTROLS}]")
"""The same, line breaks aside (multi-line output: a status listing, a table)."""
SGR = re.compile(r"\x1b\[[0-9;]*m")
"""Select Graphic Rendition (colours, bold): the only escape sequence `SafeStream` lets through."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def escape_controls(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with every control character written as its escape (``\\x1b``, ``\\r``, ``\\u202e``).

    Args:
        text: the value to show (converted with ``str``).
        keep_newlines: keep ``\\n`` (multi-line output); otherwise it is escaped too.

    Returns:
        The text, safe to write to a terminal: it holds no control character (but ``\\n`` when kept).
    """
    pattern = CONTROL_KEEP_LINES if keep_newlines else CONTROL
    return pattern.sub(_escape, str(text))


def has_controls(text: str) -> bool:
    """Whether `text` holds a character `escape_controls` would escape (line breaks included)."""
    return CONTROL.search(text) is not None


class SafeConsole(Console):
    """A rich console that escapes the control characters of every segment it renders (its own styles, which rich
    emits apart from the text, are kept): tables and text built from data print what the data holds."""

    def render(self, renderable: Any, options: Any = None) -> Iterable[Segment]:  # type: ignore[override]
        for segment in super().render(renderable, options):
            if segment.control or not CONTROL_KEEP_LINES.search(segment.text):
                yield segment
            else:
                yield Segment(escape_controls(segment.text, keep_newlines=True), segment.style, segment.control)


def safe_console(file: TextIO | None = None, *, width: int | None = None) -> SafeConsole:
    """The console the commands print with: data as text (no markup, no emoji, no highlighting), controls escaped.

    Args:
        file: where to print (default: the current stdout when printing).
        width: columns (default: the terminal's, or 80).

    Returns:
        A `SafeConsole`.
    """
    return SafeConsole(file=file, width=width, highlight=False, markup=False, emoji=False, soft_wrap=False)


class SafeStream:
    """A text stream that writes to `raw` with every control character escaped but line breaks and SGR colour
    sequences: what the command line installs as stdout while a command runs (`install`)."""

    def __init__(self, raw: TextIO):
        self.raw = raw

    def write(self, text: str) -> int:
        """Write `text` escaped; returns len(text), as a text stream does."""
        if isinstance(text, str) and CONTROL_KEEP_LINES.search(text):
            parts = SGR.split(text)
            styles = SGR.findall(text)
            shown = [escape_controls(p, keep_newlines=True) for p in parts]
            self.raw.write("".join(s + (styles[i] if i < len(styles) else "") for i, s in enumerate(shown)))
        else:
            self.raw.write(text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, errors, ...: the raw stream's
        if name == "buffer":  # bytes written to the buffer would pass unescaped: text only
            raise AttributeError(name)
        return getattr(self.raw, name)


def install(stream: TextIO) -> TextIO:
    """`stream` wrapped in a `SafeStream` (itself when it already is one)."""
    return stream if isinstance(stream, SafeStream) else SafeStream(stream)  # type: ignore[return-value]
