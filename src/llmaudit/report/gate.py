"""The release gate and what release pipelines read from it (docs/reading-a-report.md, "Gating a release").

`gate_decision` says whether the quantizer to ship is cleared, with its answer line (verdict, the deciding
criterion with its number and limit, leakage, the comparison with full precision, the utility kept). With `--gate`,
`write_gate_outputs` writes, beside report.json, the conventions of the tools release engineers already gate on:

    gate.json          every quantizer's verdict, versioned (GATE_SCHEMA_VERSION) and validated against
                       gate.schema.json, generated from the models below
    gate-junit.xml     JUnit XML: one testcase per quantizer, a failure (message: the deciding criterion) for each
                       one not PASS; the exit code judges only the quantizer released
    $GITHUB_STEP_SUMMARY   the same answer as Markdown, appended when the variable is set (GitHub Actions)

Exit codes (the command's): 0 cleared, GATE_EXIT_CODE not cleared, 2 bad input (an unknown --release).
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict

from llmaudit.analyze.decision.models import Estimate
from llmaudit.common.errors import GATE_EXIT_CODE, did_you_mean
from llmaudit.common.io import atomic_write_text
from llmaudit.report.answer import (
    AnswerLine,
    answer_line,
    baseline_sentence,
    conclusion,
    criterion_words,
    deciding_criterion,
    left_out,
    recommendation_of,
)
from llmaudit.report.cells import md_escape
from llmaudit.report.model_card import UnknownQuantizerError
from llmaudit.report.models import ReportJson, as_report
from llmaudit.report.release import decision_of

GATE_SCHEMA_VERSION = 1

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE", "NOT MEASURED"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GateEstimate(_Model):
    """A number with its interval and the interval's confidence, as report.json records them."""

    value: float | None
    low: float | None = None
    high: float | None = None
    confidence: float | None = None


class GateCriterion(_Model):
    """The criterion that decided a verdict: its estimate, the limit, and the sentence every output prints."""

    id: Literal["attack_tpr", "r_q", "indicator", "utility"]
    status: str
    estimate: GateEstimate
    limit: float | None
    comparison: str
    text: str


class GateComparison(_Model):
    reference: str
    direction: str
    difference: GateEstimate


class GateQuantizer(_Model):
    """One quantizer: its verdict, what decided it, its leakage (the headline) and how it compares."""

    name: str
    is_reference: bool
    released: bool
    verdict: Verdict
    deciding: GateCriterion | None
    leakage: GateEstimate | None
    comparison: GateComparison | None
    line: str
    """The quantizer's line of the answer, as the terminal and `--gate` print it."""
    segments: list[str]
    """The line's parts after the verdict (deciding criterion, leakage, comparison, utility)."""


class GateSummary(_Model):
    """gate.json: the release gate's answer and every quantizer's verdict."""

    schema_id: Literal["llmaudit/gate_schema/v1"] = "llmaudit/gate_schema/v1"
    schema_version: Literal[1] = GATE_SCHEMA_VERSION
    tool: Literal["llmaudit"] = "llmaudit"
    llmaudit_version: str | None
    experiment: str | None
    release: str | None
    cleared: bool
    exit_code: int
    reason: str
    baseline: str
    conclusion: str
    limit: float | None
    fpr: float | None
    reference: str | None
    quantizers: list[GateQuantizer]
    left_out: dict[str, str]
    """Quantizers the recipe asked for only where they can run that could not run here: {name: why}."""


def gate_schema() -> dict[str, Any]:
    """gate.json's JSON Schema (draft 2020-12), generated from GateSummary.

    Returns:
        dict[str, Any]: the schema.
    """
    schema = GateSummary.model_json_schema(ref_template="#/$defs/{model}")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "llmaudit/gate_schema/v1"} | schema


def released(report: ReportJson, release: str | None) -> str | None:
    """The quantizer the gate judges: `release`, or the recommended one.

    Args:
        report (ReportJson): the report.
        release (str | None): the quantizer named by --release, None for the recommended one.

    Returns:
        str | None: the quantizer's name; None when `release` is None and no quantizer is recommended.

    Raises:
        UnknownQuantizerError: `release` is not in the report (bad input, exit 2); the message names the closest name.
    """
    if release is not None:
        if release not in report.quantizers:
            raise UnknownQuantizerError(
                f"--release {release!r}: the report has no such quantizer{did_you_mean(release, report.quantizers)}; "
                f"choose one of {', '.join(report.quantizers)}"
            )
        return release
    return recommendation_of(report).quantizer


def gate_decision(report: dict[str, Any] | ReportJson, release: str | None) -> tuple[bool, str]:
    """Whether the quantizer a release ships is cleared: only when its overall verdict is PASS.

    Args:
        report (dict[str, Any] | ReportJson): report.json's content, or the typed report.
        release (str | None): the quantizer shipped, None for the recommended one.

    Returns:
        tuple[bool, str]: (cleared, the reason line).

    Raises:
        UnknownQuantizerError: `release` is not in the report.
    """
    report = as_report(report)
    q = released(report, release)
    if q is None:
        return False, f"no quantization to ship: {conclusion(report)} {baseline_sentence(report)}"
    line = answer_line(report, q)
    return line.status == "PASS", line.text()


def _estimate(e: Estimate | None) -> GateEstimate | None:
    return None if e is None else GateEstimate(value=e.value, low=e.low, high=e.high, confidence=e.confidence)


def _quantizer(report: ReportJson, q: str, release: str | None) -> GateQuantizer:
    line: AnswerLine = answer_line(report, q)
    row = report.row(q)
    c = deciding_criterion(report, q)
    deciding = None
    if c is not None:
        low, high = c.ci if c.ci else (None, None)
        deciding = GateCriterion(
            id=c.id,
            status=c.status,
            estimate=GateEstimate(value=c.value, low=low, high=high, confidence=c.confidence),
            limit=c.threshold,
            comparison=c.comparison,
            text=criterion_words(c, row),
        )
    d = decision_of(row)
    comparison = None
    if d is not None and d.comparison is not None and not row.is_reference:
        cmp = d.comparison
        comparison = GateComparison(
            reference=cmp.reference, direction=cmp.direction, difference=_estimate(cmp.difference)
        )
    return GateQuantizer(
        name=q,
        is_reference=row.is_reference,
        released=q == release,
        verdict=line.status,
        deciding=deciding,
        leakage=_estimate(line.headline),
        comparison=comparison,
        line=line.text(),
        segments=line.segments(),
    )


def gate_summary(report: dict[str, Any] | ReportJson, release: str | None) -> GateSummary:
    """gate.json's content: the gate's answer for the quantizer released and every quantizer's verdict.

    Args:
        report (dict[str, Any] | ReportJson): report.json's content, or the typed report.
        release (str | None): the quantizer shipped, None for the recommended one.

    Returns:
        GateSummary: the content.

    Raises:
        UnknownQuantizerError: `release` is not in the report.
    """
    report = as_report(report)
    q = released(report, release)
    cleared, reason = gate_decision(report, release)
    rule = report.decision_rule
    return GateSummary(
        llmaudit_version=report.llmaudit_version,
        experiment=report.provenance.experiment_name,
        release=q,
        cleared=cleared,
        exit_code=0 if cleared else GATE_EXIT_CODE,
        reason=reason,
        baseline=baseline_sentence(report),
        conclusion=conclusion(report),
        limit=report.checklist.thresholds.max_tpr_at_1pct_fpr,
        fpr=None if rule is None else rule.fpr,
        reference=report.reference_quantizer,
        quantizers=[_quantizer(report, r.quantizer, q) for r in report.grid],
        left_out=dict(left_out(report)),
    )


def junit_xml(summary: GateSummary) -> str:
    """The gate's answer as JUnit XML.

    Args:
        summary (GateSummary): gate.json's content.

    Returns:
        str: one testcase per quantizer, a failure for each one not PASS (its message: the deciding criterion), the
            released quantizer and the gate's answer as the suite's properties.
    """
    failures = sum(1 for q in summary.quantizers if q.verdict != "PASS")
    attrs = {"name": f"llmaudit release gate: {summary.experiment}", "tests": str(len(summary.quantizers))}
    attrs |= {"failures": str(failures), "errors": "0", "skipped": "0"}
    suites = ET.Element("testsuites", attrs)
    suite = ET.SubElement(suites, "testsuite", attrs)
    props = ET.SubElement(suite, "properties")
    for name, value in (("release", summary.release or ""), ("cleared", str(summary.cleared).lower())):
        ET.SubElement(props, "property", {"name": name, "value": value})
    ET.SubElement(props, "property", {"name": "reason", "value": summary.reason})
    for q in summary.quantizers:
        name = (
            q.name + (" (full-precision reference)" if q.is_reference else "") + (" (released)" if q.released else "")
        )
        case = ET.SubElement(suite, "testcase", {"classname": f"llmaudit.{summary.experiment}", "name": name})
        if q.verdict != "PASS":
            message = f"{q.verdict}: {q.deciding.text if q.deciding else q.line}"
            failure = ET.SubElement(case, "failure", {"message": message, "type": q.verdict})
            failure.text = q.line
        ET.SubElement(case, "system-out").text = q.line
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def step_summary(summary: GateSummary) -> str:
    """The gate's answer as GitHub-flavoured Markdown (a job's step summary).

    Args:
        summary (GateSummary): gate.json's content.

    Returns:
        str: the answer, then one table row per quantizer.
    """
    head = "cleared" if summary.cleared else "BLOCKED"
    lines = [
        f"### llmaudit release gate: {md_escape(str(summary.experiment))}",
        "",
        f"**{head}**: {md_escape(summary.reason)}",
        "",
        md_escape(summary.baseline),
        "",
        "| quantizer | verdict | deciding criterion | leakage and comparison |",
        "|---|---|---|---|",
    ]
    for q in summary.quantizers:
        name = q.name + (" (reference)" if q.is_reference else "") + (" (released)" if q.released else "")
        deciding = q.deciding.text if q.deciding else "every criterion PASS"
        rest = "; ".join(s for s in q.segments if s != deciding)
        lines.append(f"| {md_escape(name)} | {q.verdict} | {md_escape(deciding)} | {md_escape(rest)} |")
    lines += [f"| {md_escape(q)} | NOT AUDITED | {md_escape(why)} | |" for q, why in summary.left_out.items()]
    return "\n".join(lines + ["", md_escape(summary.conclusion), ""])


def write_gate_outputs(report: dict[str, Any] | ReportJson, release: str | None, out_dir: Path) -> dict[str, Path]:
    """Write gate.json (validated against its schema), gate.schema.json and gate-junit.xml in `out_dir`.

    The step summary is appended to $GITHUB_STEP_SUMMARY when it is set.

    Args:
        report (dict[str, Any] | ReportJson): report.json's content, or the typed report.
        release (str | None): the quantizer shipped, None for the recommended one.
        out_dir (Path): where the files go.

    Returns:
        dict[str, Path]: {kind: path} of every file written (and the step summary's).

    Raises:
        UnknownQuantizerError: `release` is not in the report.
    """
    summary = gate_summary(report, release)
    content = summary.model_dump(mode="json")
    schema = gate_schema()
    jsonschema.validate(content, schema)
    paths = {
        "json": atomic_write_text(out_dir / "gate.json", json.dumps(content, indent=2, allow_nan=False) + "\n"),
        "schema": atomic_write_text(out_dir / "gate.schema.json", json.dumps(schema, indent=2) + "\n"),
        "junit": atomic_write_text(out_dir / "gate-junit.xml", junit_xml(summary)),
    }
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(step_summary(summary))
        paths["step_summary"] = Path(target)
    return {k: Path(p) for k, p in paths.items()}
