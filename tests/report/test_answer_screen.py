"""The answer on one screen: the full-precision baseline first, one line per candidate with its deciding
criterion, what may be released last; plain text at a fixed 120 columns when not a terminal, no interval split
across lines; report.html's banner says the same; the release gate clears only a PASS and says why."""

from __future__ import annotations

import copy
import io
import re
from pathlib import Path

import pytest

from llmaudit.report.answer import baseline_sentence, candidate_lines, conclusion, wrap_segments
from llmaudit.report.gate import gate_decision
from llmaudit.report.html import render_html
from llmaudit.report.model_card import UnknownQuantizerError
from llmaudit.report.models import as_report
from llmaudit.report.terminal import FIXED_WIDTH, print_summary, summary_text
from tests.report.test_model_card import audited

__all__ = ["audited"]

MARKDOWN_ESCAPES = re.compile(r"\\[\\`*_{}\[\]()#!|<>~&]|\*\*|\| *--- *\|")


def _intervals_whole(text: str) -> bool:
    """Every "[" of the text closes on its own line."""
    return all(line.count("[") == line.count("]") for line in text.splitlines())


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_answer_is_plain_text_baseline_first_release_last(audited, width):
    report = as_report(audited["report"])
    text = summary_text(report, width=width)
    lines = text.rstrip("\n").splitlines()
    assert not MARKDOWN_ESCAPES.search(text), MARKDOWN_ESCAPES.search(text)
    assert max(len(line) for line in lines) <= width and _intervals_whole(text)
    assert lines[0] == f"llmaudit verdict: {report.provenance.experiment_name}"
    first_words = " ".join(baseline_sentence(report).split()[:6])
    assert " ".join(lines[1].split()).startswith(first_words)  # the fine-tune itself first
    for line in candidate_lines(report):  # then one line per candidate, its verdict beside its name
        assert any(re.match(rf"\s+{re.escape(line.quantizer)}\s+{line.status}\s", x) for x in lines), line.quantizer
    reference = report.reference_quantizer
    assert not any(re.match(rf"\s+{reference}\s+(PASS|FAIL|INCONCLUSIVE)", x) for x in lines)  # not a candidate
    tail = " ".join(" ".join(lines[-12:]).split())
    assert conclusion(report) in tail and "the best candidate is fp32" not in tail
    assert " ".join(report.recommendation.explanation.split()[-6:]) in tail  # the reasons end the screen


def test_not_a_terminal_gives_fixed_120_columns_and_whole_intervals(audited):
    buf = io.StringIO()  # not a TTY: a log, a pipe, CI
    print_summary(audited["report"], file=buf)
    lines = buf.getvalue().splitlines()
    assert FIXED_WIDTH == 120 and max(len(x) for x in lines) <= 120
    assert max(len(x) for x in lines) > 80  # the width is 120, not rich's default 80
    assert _intervals_whole(buf.getvalue())


def test_wrapping_breaks_between_parts_never_inside_an_interval():
    parts = ["leakage TPR 0.140 [0.074, 0.248] > 0.05", "SAME as fp32 +0.010 [-0.020, +0.030]", "val loss +1.2%"]
    lines = wrap_segments("  hqq-4  FAIL  ", parts, 60, 15)
    assert lines == [
        "  hqq-4  FAIL  leakage TPR 0.140 [0.074, 0.248] > 0.05;",
        "               SAME as fp32 +0.010 [-0.020, +0.030];",
        "               val loss +1.2%",
    ]
    long = ["a reason " * 8 + "with [0.001, 0.002] inside"]
    wrapped = wrap_segments("", long, 30, 2)
    assert all(len(x) <= 30 for x in wrapped[:-1]) and _intervals_whole("\n".join(wrapped))
    assert " ".join(" ".join(wrapped).split()) == " ".join(long[0].split())


def test_every_fail_line_names_its_criterion_number_and_limit(audited):
    report = as_report(audited["report"])
    for line in candidate_lines(report):
        if line.status != "FAIL":
            continue
        deciding = line.deciding or line.leakage
        assert re.search(r"(leakage TPR|validation loss|r_Q|indicator) [-+\d.e%]+ \[[^\]]+\] (>|<) [-+\d.%]+", deciding)


def test_html_opens_with_the_answer_banner(audited):
    report = copy.deepcopy(audited["report"])
    html_text = Path(audited["root"] / "report" / "report.html").read_text(encoding="utf-8")
    assert "**" not in html_text and "\\_" not in html_text
    banner = re.search(r'<div class="banner (\w+)" role="status" id="answer">(.*?)</div>', html_text, re.S)
    assert banner is not None and html_text.index(banner.group(0)) < html_text.index("<section")
    typed = as_report(report)
    assert banner.group(1) == ("cleared" if typed.recommendation.cleared_for_release else "notcleared")
    assert "Your fine-tune" in banner.group(2) or "full precision" in banner.group(2)
    for line in candidate_lines(typed):
        assert f"<code>{line.quantizer}</code> <b>{line.status}</b>" in banner.group(2)
    marked = re.findall(r'<tr class="rec[^"]*"><td><code>([^<]*)</code>', html_text)
    rec = typed.recommendation.quantizer
    first = "(recommended)" if typed.recommendation.cleared_for_release else "(ranks first, not cleared)"
    assert marked == ([f"{rec} {first}"] if rec else [])  # never "recommended" for what is not cleared
    # a cleared recommendation turns the banner green and says to release it
    q = candidate_lines(typed)[0].quantizer
    report["recommendation"] |= {"quantizer": q, "cleared_for_release": True, "explanation": "planted"}
    report["plots"] = {}
    page = render_html(report, {})
    assert '<div class="banner cleared" role="status" id="answer">' in page and f"Release {q}: cleared" in page


def test_the_gate_clears_only_a_pass_and_says_why(audited):
    report = copy.deepcopy(audited["report"])
    q = candidate_lines(as_report(report))[0].quantizer
    for c in report["checklist"]["per_quantizer"][q]["criteria"]:
        c["status"] = "PASS" if c["status"] != "DISABLED" else c["status"]
    report["checklist"]["per_quantizer"][q]["overall"] = "PASS"
    cleared, why = gate_decision(report, q)
    assert cleared and why.startswith(f"{q}  PASS  leakage ")
    report["checklist"]["per_quantizer"][q]["overall"] = "INCONCLUSIVE"
    assert gate_decision(report, q)[0] is False
    with pytest.raises(UnknownQuantizerError, match=rf"did you mean '{re.escape(q)}'"):
        gate_decision(report, q.replace("-", ""))  # hqq4 for hqq-4
    report["recommendation"]["quantizer"] = None
    report["recommendation"]["explanation"] = "planted"
    cleared, why = gate_decision(report, None)
    assert not cleared and why.startswith("no quantization to ship")
