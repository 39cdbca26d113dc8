"""The JSON Schema of report.json, generated from its typed models (`llmaudit.report.models.ReportJson`, with the
release decision's own models), and its validation. Nothing here is written by hand: the version this llmaudit
writes and the rule that a report without --include-samples carries no text are declared on `ReportJson`."""

from __future__ import annotations

import json
from typing import Any

from llmaudit.report.models import REPORT_SCHEMA_VERSION, ReportJson
from llmaudit.report.section_registry import add_section_schemas, data_sections


class ReportSchemaError(ValueError):
    """The built report does not match REPORT_SCHEMA: a bug in the report (or the result object)."""


def report_schema() -> dict[str, Any]:
    """report.json's JSON Schema (the draft `jsonschema.Draft202012Validator` checks), generated from ReportJson,
    for the version this llmaudit writes.

    Returns:
        The schema.
    """
    schema = ReportJson.model_json_schema(ref_template="#/$defs/{model}")
    add_section_schemas(schema)  # the registered sections' own data (section_registry)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"llmaudit/report_schema/v{REPORT_SCHEMA_VERSION}",
    } | schema


REPORT_SCHEMA: dict[str, Any] = report_schema()


def validate_report(report: dict[str, Any]) -> None:
    """Check a built report against REPORT_SCHEMA and strict JSON.

    Args:
        report: the built report.

    Raises:
        ReportSchemaError: listing every place where `report` does not match, or where it is not strict JSON (a NaN
            or inf anywhere).
    """
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
