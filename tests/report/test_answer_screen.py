"""The answer on one screen: the terminal summary (no Markdown escapes, the recommendation last, 80 and 120
columns), report.html's verdict banner and marked recommended row (no literal Markdown), and the release gate."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from llmaudit.report.html import render_html
from llmaudit.report.gate import gate_decision
from llmaudit.report.terminal import summary_text
from tests.report.test_model_card import audited

__all__ = ["audited"]

MARKDOWN_ESCAPES = re.compile(r"\\[\\`*_{}\[\]()#!|<>~&]|\*\*|\| *--- *\|")


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_summary_is_plain_text_with_the_recommendation_last(audited, width):
    report = audited["report"]
    text = summary_text(report, width=width)
    lines = text.rstrip("\n").splitlines()
    assert not MARKDOWN_ESCAPES.search(text), MARKDOWN_ESCAPES.search(text)
    assert max(len(line) for line in lines) <= width
    for q in report["quantizers"]:
        assert any(line.lstrip().startswith(q) for line in lines), q  # one row per quantizer
    rec = report["recommendation"]
    tail = " ".join(lines[-15:])
    assert ("Release " if rec["cleared_for_release"] else "Nothing is cleared for release") in tail
    first_words = " ".join(rec["explanation"].split()[:6])
    assert first_words in " ".join(tail.split())  # the paragraph itself, wrapped, ends the screen
    assert "(recommended)" not in text and "*" in text  # the recommended row carries the mark, once explained


def test_html_opens_with_a_verdict_banner_and_marks_the_recommended_row(audited, tmp_path):
    report = copy.deepcopy(audited["report"])
    html_text = Path(audited["root"] / "report" / "report.html").read_text(encoding="utf-8")
    assert "**" not in html_text and "\\_" not in html_text
    banner = re.search(r'<div class="banner (\w+)" role="status">([^<]*)</div>', html_text)
    assert banner is not None and html_text.index(banner.group(0)) < html_text.index("<section")
    rec = report["recommendation"]
    assert banner.group(1) == ("cleared" if rec["cleared_for_release"] else "notcleared")
    marked = re.findall(r'<tr class="rec[^"]*"><td><code>([^<]*)</code>', html_text)
    assert len(marked) == 1 and marked[0].split()[0] == rec["quantizer"] and marked[0].endswith("(recommended)")
    # a cleared recommendation turns the banner green
    report["recommendation"] |= {"cleared_for_release": True}
    report["plots"] = {}
    assert '<div class="banner cleared" role="status">Release ' in render_html(report, {})


def test_the_gate_clears_only_a_quantizer_whose_verdict_is_pass(audited):
    report = copy.deepcopy(audited["report"])
    q = report["quantizers"][0]
    report["checklist"]["per_quantizer"][q]["overall"] = "PASS"
    assert gate_decision(report, q) == (True, f"{q}: overall PASS")
    report["checklist"]["per_quantizer"][q]["overall"] = "INCONCLUSIVE"
    cleared, why = gate_decision(report, q)
    assert not cleared and "NOT cleared" in why
    assert gate_decision(report, "nope")[0] is False
    report["recommendation"]["quantizer"] = None
    assert gate_decision(report, None)[0] is False
