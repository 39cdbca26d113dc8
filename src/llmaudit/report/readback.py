"""report.json read back from a store: how every command reads it (`read_report`). Strict JSON, the typed schema
(`report.models.ReportJson`), and `report_problems`: a grid row without its checklist, a criterion missing or
listed twice, a release rule without its numbers, a decision that is not one, a name that is not one. Each is
refused in one line naming the file and the field (ReportFileError, exit code 2), before a renderer or the release
gate reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from llmaudit.common.errors import UserError
from llmaudit.common.io import read_json
from llmaudit.common.names import is_safe_name
from llmaudit.common.safe_text import escape_controls
from llmaudit.common.schema import describe_errors
from llmaudit.report.models import ReportJson


class ReportFileError(UserError):
    """A report.json read back does not fit its schema or contradicts itself: the message names the file and the
    field, and says to write it again."""


REWRITE = "write it again with `llmaudit report RUN_DIR`"
CRITERIA_REQUIRED = ("attack_tpr",)
"""The criteria every quantizer's checklist holds in any report.json version (the others at most once each)."""


def _checklist_problems(report: ReportJson) -> list[str]:
    problems = []
    for q, checklist in report.checklist.per_quantizer.items():
        ids = [c.id for c in checklist.criteria]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            problems.append(f"checklist.per_quantizer.{q}.criteria lists {twice[0]} {ids.count(twice[0])} times")
        problems += [f"checklist.per_quantizer.{q}.criteria lacks {cid}" for cid in CRITERIA_REQUIRED if cid not in ids]
    return problems


def _names_problems(report: ReportJson) -> list[str]:
    rows = [r.quantizer for r in report.grid]
    problems = [
        f"quantizer name {q!r} is not a name (letters, digits and . _ + -)" for q in rows if not is_safe_name(q)
    ]
    if len(set(rows)) != len(rows):
        problems.append(f"grid lists a quantizer twice ({rows})")
    if rows != list(report.quantizers):
        problems.append(f"quantizers {list(report.quantizers)[:8]} are not the grid's rows {rows[:8]}")
    checked = list(report.checklist.per_quantizer)
    problems += [f"grid row {q} has no checklist.per_quantizer.{q}" for q in rows if q not in checked]
    problems += [f"checklist.per_quantizer.{q} has no grid row" for q in checked if q not in rows]
    named = {
        "recommendation.quantizer": report.recommendation.quantizer,
        "reference_quantizer": report.reference_quantizer,
        "recommendation.runner_up.quantizer": report.recommendation.runner_up
        and report.recommendation.runner_up.quantizer,
    }
    problems += [f"{key} = {q!r} is not a grid row" for key, q in named.items() if q is not None and q not in rows]
    return problems


def report_problems(report: ReportJson) -> list[str]:
    """What makes a parsed report.json contradict itself, in words naming the field: every grid row with its
    checklist and the other way round, names that are names, the quantizers the recommendation and the reference
    name among the rows, each criterion at most once (the attack criterion always). The release rule and each row's
    decision are typed when the report is parsed (`ReportJson`). Empty when it is consistent.

    Args:
        report: the parsed report (`as_report`).

    Returns:
        The problems, in the order they were found.
    """
    return _names_problems(report) + _checklist_problems(report)


def read_report(path: str | Path) -> ReportJson:
    """report.json read back, parsed and checked: valid JSON without NaN or Infinity (report.json is strict JSON), its
    schema (`ReportJson`), and consistent with itself (`report_problems`).

    Args:
        path: the report.json file.

    Returns:
        The typed report.

    Raises:
        ReportFileError: naming the file and the first field at fault, with the fix (write it again).
    """
    data = read_json(path, what="report", fix=REWRITE)
    try:
        json.dumps(data, allow_nan=False)
    except ValueError:
        raise ReportFileError(f"{path} holds NaN or Infinity, which report.json never does; {REWRITE}") from None
    try:
        typed = ReportJson.model_validate(data)
    except ValidationError as exc:
        raise ReportFileError(f"{path}: {describe_errors(exc)}; {REWRITE}") from None
    problems = report_problems(typed)
    if problems:
        raise ReportFileError(f"{path}: {escape_controls(problems[0])}; {REWRITE}")
    return typed
