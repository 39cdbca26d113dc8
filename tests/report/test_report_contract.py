"""report.json's typed contract (llmaudit.report.models): a fresh report.json validates against the JSON Schema
generated from the models and is written from them key for key; a report.json written by an earlier llmaudit
still renders."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from llmaudit.report.answer import conclusion, recommendation_of
from llmaudit.report.gate import gate_decision
from llmaudit.report.html import render_html
from llmaudit.report.markdown import render_markdown
from llmaudit.report.model_card import render_model_card
from llmaudit.report.models import ReportJson, as_report, dump_report
from llmaudit.report.plots import render_all
from llmaudit.report.schema import REPORT_SCHEMA, validate_report
from llmaudit.report.terminal import summary_text

UNTYPED_V4 = Path(__file__).parent / "fixtures" / "report_schema_v4_untyped_writer.json.gz"  # v4, written from dicts


@pytest.fixture(scope="module")
def fresh(audited_tiny_store):
    """report.json of the session's tiny audited store (read only: never changed here)."""
    text = (audited_tiny_store / "report" / "report.json").read_text()
    return text, json.loads(text)


@pytest.fixture(scope="module")
def untyped_v4():
    """A schema-v4 report.json written from dicts, by a writer that had no typed report model: the whole file as
    that writer produced it for a tiny demo store (nothing dropped)."""
    return json.loads(gzip.decompress(UNTYPED_V4.read_bytes()))


def test_the_generated_schema_is_valid_and_versioned():
    jsonschema.Draft202012Validator.check_schema(REPORT_SCHEMA)
    assert REPORT_SCHEMA["properties"]["report_schema_version"] == {"const": 4}
    assert "QuantizerDecision" in REPORT_SCHEMA["$defs"] and "GridRow" in REPORT_SCHEMA["$defs"]
    grid_row = REPORT_SCHEMA["$defs"]["GridRow"]
    assert {"quantizer", "utility", "r_q", "attacks", "best_attack", "decision"} <= set(grid_row["required"])


def test_a_fresh_report_validates_against_the_generated_schema(fresh):
    text, report = fresh
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(report)
    validate_report(report)
    # written from the models: the same keys, values and order as the file
    assert json.dumps(dump_report(report), indent=2, allow_nan=False) + "\n" == text


def test_a_renamed_key_fails_when_written_not_silently_none(fresh):
    _, report = fresh
    bad = json.loads(json.dumps(report))
    row = bad["grid"][0]
    row["r_q_mean"] = row.pop("r_q")
    with pytest.raises(ValidationError, match="GridRow lacks r_q"):
        dump_report(bad)
    bad = json.loads(json.dumps(report))
    att = next(iter(bad["grid"][0]["attacks"].values()))
    att["auc"] = att.pop("auroc")
    with pytest.raises(ValidationError, match="AttackEntry lacks auroc"):
        dump_report(bad)


def test_a_v4_report_written_from_dicts_renders_in_every_output(untyped_v4):
    report = as_report(untyped_v4)
    assert report.report_schema_version == 4 and report.grid[0].is_reference
    # read and written again: nothing lost, nothing added
    assert report.model_dump(mode="json", exclude_unset=True) == untyped_v4
    verdict = conclusion(report).split(" (")[0]  # the conclusion up to the parenthesis Markdown escapes
    assert verdict.startswith(("Release", "Nothing"))
    md = render_markdown(untyped_v4)
    assert "## Answer" in md and "## Verdict" in md and verdict in md
    figures = render_all(untyped_v4)
    assert figures
    page = render_html(untyped_v4, figures)
    assert page.startswith("<!DOCTYPE html>") and "banner" in page
    screen = summary_text(untyped_v4, width=120)
    assert "llmaudit verdict" in screen and verdict in " ".join(screen.split())
    card = render_model_card(untyped_v4)
    assert "## Privacy: membership-inference audit" in card
    # written when full precision could be recommended: ranked again, the reference is never the candidate
    assert untyped_v4["recommendation"]["quantizer"] == report.reference_quantizer
    again = recommendation_of(report).quantizer
    assert again != report.reference_quantizer
    assert gate_decision(untyped_v4, None)[1].startswith(again or "no quantization to ship")


def test_a_v4_report_without_the_optional_blocks_still_renders(untyped_v4):
    """A report.json older still: no release decision, no explanation, no divergence, no indicators."""
    old = json.loads(json.dumps(untyped_v4))
    for key in ("decision_rule", "indicator_agreement", "indicators", "utility", "blind_baseline"):
        old.pop(key)
    old["recommendation"].pop("explanation")
    for row in old["grid"]:
        for key in ("decision", "strongest_vs_loss", "r_q_status", "indicator", "calibration"):
            row.pop(key)
        row["utility"].pop("divergence")
    report = ReportJson.model_validate(old)
    assert report.grid[0].decision is None and report.decision_rule is None
    md = render_markdown(report)
    assert "## Verdict" in md and conclusion(report).split(" (")[0] in md
    assert "## Privacy" in render_model_card(old)
