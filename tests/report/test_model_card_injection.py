"""model_card.md shows every string of report.json as text: a value with line breaks, HTML, a heading, a link,
an image or a table break renders as the characters it holds (CommonMark), with the escaping report.md uses; in
the YAML metadata it stays one value (the Hub's parser reads the same keys)."""

from __future__ import annotations

import copy
from collections import Counter

from huggingface_hub import ModelCard
from markdown_it import MarkdownIt

from llmaudit.report.model_card import MalformedReportError, render_model_card
from tests.report.test_model_card import audited  # noqa: F401 (the fixture)

HOSTILE = (
    "\n\n<img src=x onerror=alert(1)>\n# planted heading\n\n[click](http://evil.example) ![i](http://evil.example/i.png)"
    "\n| a | b |\n|---|---|\n<script>alert(2)</script>\r\n---\n* item\x00\x1b[31m`tick` **bold**"
)
PARSER = MarkdownIt("commonmark").enable("table")


def _string_paths(obj, path=()):
    """The path of every string leaf of report.json (dict keys are not leaves)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _string_paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _string_paths(v, (*path, i))
    elif isinstance(obj, str):
        yield path


def _set(obj, path, value):
    for part in path[:-1]:
        obj = obj[part]
    obj[path[-1]] = obj[path[-1]] + value


def _shape(card: str) -> tuple[list[str], Counter]:
    """The block structure of a card's body (after its YAML metadata) and the kinds of inline nodes in it (text and
    code spans aside)."""
    tokens = PARSER.parse(card.split("\n---\n", 1)[1])
    inline = Counter(
        child.type for t in tokens if t.type == "inline" for child in t.children or [] if child.type != "text"
    )
    inline.pop("code_inline", None)
    inline.pop("softbreak", None)
    return [t.type for t in tokens if t.type != "inline"], inline


def test_every_string_of_report_json_renders_as_text_in_the_card(audited):  # noqa: F811
    report = audited["report"]
    clean = render_model_card(report)
    blocks, inline = _shape(clean)
    keys = set(ModelCard(clean).data.to_dict())
    assert "table_open" in blocks and inline["strong_open"] >= 1
    paths = list(_string_paths(report))
    assert len(paths) > 100
    failures, refused = [], 0
    for path in paths:
        hostile = copy.deepcopy(report)
        _set(hostile, path, HOSTILE)
        try:
            card = render_model_card(hostile)
        except MalformedReportError as exc:  # an id or a name the card looks up: refused in one line
            assert "\n" not in str(exc) and "report.json" in str(exc)
            refused += 1
            continue
        got_blocks, got_inline = _shape(card)
        html = PARSER.render(card)
        if got_blocks != blocks or got_inline != inline or any(t in html for t in ("<img", "<script", "<a ", "\x1b")):
            failures.append((path, "structure changed"))
        elif set(ModelCard(card).data.to_dict()) != keys:
            failures.append((path, "metadata changed"))
    assert refused < len(paths) // 5  # most strings are shown, not looked up
    assert failures == [], "\n".join(f"{p}: {why}" for p, why in failures)
