"""The JSON Schema of report.json, generated from its typed models (`llmaudit.report.models.ReportJson`), and its
validation. Nothing here is written by hand but what JSON Schema says beyond the models: the version this llmaudit
writes, the release decision's own models and the rule that a report without --include-samples carries no text."""

from __future__ import annotations

import json
from typing import Any

from llmaudit.analyze.decision.models import QuantizerDecision
from llmaudit.report.build import REPORT_SCHEMA_VERSION
from llmaudit.report.models import ReportJson
from llmaudit.report.section_registry import add_section_schemas, data_sections


class ReportSchemaError(ValueError):
    """The built report does not match REPORT_SCHEMA: a bug in the report (or the result object)."""


def report_schema() -> dict[str, Any]:
    """report.json's JSON Schema (draft 2020-12) from ReportJson, for the version this llmaudit writes."""
    schema = ReportJson.model_json_schema(ref_template="#/$defs/{model}")
    decision = QuantizerDecision.model_json_schema(ref_template="#/$defs/{model}")
    decision_defs = decision.pop("$defs", {}) | {"QuantizerDecision": decision}
    own = schema.get("$defs", {})
    clash = {k for k in set(own) & set(decision_defs) if own[k] != decision_defs[k]}
    if clash:  # two different models of one name: one would silently replace the other's definition
        raise RuntimeError(f"report and decision models share the names {sorted(clash)}")
    defs = schema.get("$defs", {}) | decision_defs
    schema["$defs"] = defs
    defs["GridRow"]["properties"]["decision"] = {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/QuantizerDecision"}]}
    schema["properties"]["report_schema_version"] = {"const": REPORT_SCHEMA_VERSION}
    # privacy of the report itself: without include_samples, no sample may carry text
    schema["if"] = {"properties": {"include_samples": {"const": False}}}
    schema["then"] = {
        "properties": {"vulnerable_samples": {"properties": {"samples": {"items": {"not": {"required": ["text"]}}}}}}
    }
    add_section_schemas(schema)  # the registered sections' own data (section_registry)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"llmaudit/report_schema/v{REPORT_SCHEMA_VERSION}",
    } | schema


REPORT_SCHEMA: dict[str, Any] = report_schema()


def validate_report(report: dict[str, Any]) -> None:
    """Raise ReportSchemaError listing every place where `report` does not match REPORT_SCHEMA, or where it
    is not strict JSON (a NaN or inf anywhere)."""
    import jsonschema

    try:
        json.dumps(report, allow_nan=False)
    except ValueError as exc:
        raise ReportSchemaError(f"report is not strict JSON: {exc}") from exc
    schema = report_schema() if data_sections() else REPORT_SCHEMA  # with the sections registered by now
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(report), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  at {'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:300]}" for e in errors[:10]]
        raise ReportSchemaError(
            f"report does not match report schema v{REPORT_SCHEMA_VERSION} ({len(errors)} error(s)):\n"
            + "\n".join(lines)
        )
