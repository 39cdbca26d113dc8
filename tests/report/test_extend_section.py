"""A report section added in one new module (tests/report/extension_section.py) through the section registry
alone: its data is in report.json, typed and in the generated schema; report.md, report.html and the terminal show
it at the place it declares."""

from __future__ import annotations

import importlib
import json
import shutil
import sys

import jsonschema
import pytest

from llmaudit.report.models import as_report
from llmaudit.report.schema import ReportSchemaError, report_schema, validate_report
from llmaudit.report.section_registry import SectionSpec, register, section_data, unregister
from tests.conftest import run_cli

MODULE = "tests.report.extension_section"


@pytest.fixture
def extension():
    """The extension module imported (its section registered), removed again after the test."""
    module = importlib.import_module(MODULE)
    yield module
    unregister(module.KEY)
    sys.modules.pop(MODULE, None)


@pytest.fixture
def reported(extension, audited_tiny_store, tmp_path):
    """A copy of the tiny audited store reported with the extension registered: (module, store, stdout)."""
    store = tmp_path / "store"
    shutil.copytree(audited_tiny_store, store)
    shutil.rmtree(store / "report")
    code, out, err = run_cli(["report", str(store)])
    assert code == 0, err
    return extension, store, out


def test_the_section_data_is_in_report_json_typed_and_in_the_schema(reported):
    ext, store, _ = reported
    report = json.loads((store / "report" / "report.json").read_text())
    overall = [q["overall"] for q in report["checklist"]["per_quantizer"].values()]
    expected = {s: overall.count(s) for s in set(overall)}
    assert report[ext.KEY] == {"counts": expected, "quantizers": len(overall)}
    typed = section_data(as_report(report), ext.KEY)
    assert isinstance(typed, ext.StatusCounts) and typed.counts == expected
    schema = report_schema()
    assert schema["properties"][ext.KEY]["anyOf"][1] == {"$ref": "#/$defs/StatusCounts"}
    jsonschema.Draft202012Validator(schema).validate(report)
    report[ext.KEY]["counts"] = {"FAIL": "many"}  # the schema reads the section's model
    with pytest.raises(ReportSchemaError, match=ext.KEY):
        validate_report(report)


def test_the_section_shows_at_its_place_in_markdown_html_and_terminal(reported):
    ext, store, out = reported
    report = json.loads((store / "report" / "report.json").read_text())
    counts = report[ext.KEY]["counts"]
    md = (store / "report" / "report.md").read_text()
    titles = [line for line in md.splitlines() if line.startswith("## ")]
    i = titles.index("## Status counts")
    assert titles[i - 1] == "## Verdict" and titles[i + 1] == "## Summary"  # order 25: after 20, before 30
    assert f"{len(report['checklist']['per_quantizer'])} quantizers on the checklist." in md
    html = (store / "report" / "report.html").read_text()
    ids = [html.index(f'<section id="{k}"') for k in ("verdict", ext.KEY, "summary")]
    assert ids == sorted(ids) and f'<a href="#{ext.KEY}">Status counts</a>' in html
    line = "status counts: " + ", ".join(f"{s} {n}" for s, n in sorted(counts.items()))
    lines = out.splitlines()
    assert line in lines and lines.index(line) > lines.index(
        f"llmaudit verdict: {report['provenance']['experiment_name']}"
    )


def test_a_section_without_its_data_is_left_out_and_keys_are_checked(extension, audited_tiny_store):
    report = as_report(json.loads((audited_tiny_store / "report" / "report.json").read_text()))
    assert extension.KEY not in (report.model_extra or {})  # reported before the section existed
    assert extension.view(report) is None and extension.terminal(report, 80) == []
    with pytest.raises(ValueError, match="already registered"):
        register(extension.SECTION)
    with pytest.raises(ValueError, match="report.json already has"):
        register(SectionSpec("recommendation", 5, extension.view, model=extension.StatusCounts, build=extension.build))
    with pytest.raises(ValueError, match="go together"):
        SectionSpec("x", 5, extension.view, model=extension.StatusCounts)
