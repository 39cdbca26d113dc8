"""The JSON schema of report.json, and its validation."""

from __future__ import annotations

import json
from typing import Any

from llmaudit.analyze.decision.models import QuantizerDecision
from llmaudit.report.build import REPORT_SCHEMA_VERSION
from llmaudit.report.policy import FAIL, INCONCLUSIVE, NOT_MEASURED, PASS, STATUSES
from llmaudit.report.utility import DIVERGENCE_KEYS


class ReportSchemaError(ValueError):
    """The built report does not match REPORT_SCHEMA: a bug in the report (or the result object)."""


_NUM = {"type": ["number", "null"]}

_INT = {"type": ["integer", "null"]}

_STR = {"type": ["string", "null"]}

_CI = {"oneOf": [{"type": "null"}, {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}]}

_STATUS = {"enum": list(STATUSES)}

_OBJ = {"type": "object"}

REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "llmaudit/report_schema/v4",
    "title": "llmaudit report",
    "type": "object",
    "required": [
        "report_schema_version",
        "llmaudit_version",
        "include_samples",
        "provenance",
        "reference_quantizer",
        "quantizers",
        "grid",
        "checklist",
        "recommendation",
        "vulnerable_samples",
        "plots",
        "result",
    ],
    "properties": {
        "report_schema_version": {"const": REPORT_SCHEMA_VERSION},
        "llmaudit_version": {"type": "string"},
        "generated_utc": {"type": "string"},
        "include_samples": {"type": "boolean"},
        "non_finite_policy": {"type": "string"},
        "provenance": {
            "type": "object",
            "required": [
                "model",
                "adapter",
                "data",
                "membership",
                "seeds",
                "library_versions",
                "llmaudit_version",
                "attack_definitions",
                "identity_hash",
            ],
            "properties": {
                "model": {"type": "string"},
                "adapter": _OBJ,
                "data": {
                    "type": "object",
                    "required": ["fingerprint"],
                    "properties": {"fingerprint": {"type": "string"}},
                },
                "membership": {"type": "object", "required": ["runs", "pool_size", "n_train"]},
                "seeds": _OBJ,
                "library_versions": {"type": "object", "additionalProperties": _STR},
                "llmaudit_version": {"type": "string"},
                "attack_definitions": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
                "identity_hash": {"type": "string"},
            },
        },
        "reference_quantizer": {"type": "string"},
        "quantizers": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "grid": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/grid_row"}},
        "checklist": {
            "type": "object",
            "required": ["thresholds", "rules", "per_quantizer"],
            "properties": {
                "thresholds": {
                    "type": "object",
                    "required": ["max_tpr_at_1pct_fpr", "min_r_q", "max_utility_loss", "min_runs"],
                    "properties": {
                        "max_tpr_at_1pct_fpr": {"type": "number"},
                        "min_r_q": {"type": "number"},
                        "max_utility_loss": {"type": "number"},
                        "min_runs": {"type": "integer"},
                    },
                },
                "rules": {"type": "array", "items": {"type": "string"}},
                "per_quantizer": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["overall", "criteria"],
                        "properties": {
                            "overall": {"enum": [PASS, FAIL, INCONCLUSIVE, NOT_MEASURED]},
                            "criteria": {"type": "array", "minItems": 3, "items": {"$ref": "#/$defs/criterion"}},
                        },
                    },
                },
            },
        },
        "recommendation": {
            "type": "object",
            "required": ["quantizer", "rule", "overall", "cleared_for_release", "reason"],
            "properties": {
                "quantizer": _STR,
                "rule": {"type": "string"},
                "overall": {"enum": [PASS, FAIL, INCONCLUSIVE, NOT_MEASURED, None]},
                "cleared_for_release": {"type": "boolean"},
                "reason": {"type": "string"},
                "explanation": {"type": "string"},
                "ranking": {"type": "array", "items": {"type": "string"}},
                "runner_up": {
                    "oneOf": [
                        {"type": "null"},
                        {
                            "type": "object",
                            "required": ["quantizer", "lost_on"],
                            "properties": {"quantizer": {"type": "string"}, "lost_on": {"type": "string"}},
                        },
                    ]
                },
            },
        },
        "r_q_vs_best_attack": _OBJ,
        "spearman_r_q_vs_attacks": {"type": ["object", "null"]},
        "indicator_stability": {"type": ["object", "null"]},
        "memorization": {"type": ["object", "null"]},
        "vulnerable_samples": {
            "type": "object",
            "required": ["quantizer", "attack", "available", "include_samples", "samples"],
            "properties": {
                "available": {"type": "boolean"},
                "include_samples": {"type": "boolean"},
                "samples": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["rank", "sample_id", "score"],
                        "properties": {
                            "rank": {"type": "integer"},
                            "sample_id": {"type": "string"},
                            "score": _NUM,
                            "text": _STR,
                        },
                        "additionalProperties": False,
                    },
                },
            },
        },
        "plots": {"type": "object", "additionalProperties": {"type": "string"}},
        "result": {"type": "object", "required": ["experiment", "quantizers", "utility", "indicator", "attacks"]},
    },
    # privacy of the report itself: without include_samples, no sample may carry text
    "if": {"properties": {"include_samples": {"const": False}}},
    "then": {
        "properties": {"vulnerable_samples": {"properties": {"samples": {"items": {"not": {"required": ["text"]}}}}}}
    },
    "$defs": {
        "interval_value": {"type": "object", "required": ["mean", "ci"], "properties": {"mean": _NUM, "ci": _CI}},
        "tpr": {
            "type": "object",
            "required": ["tpr", "ci", "reliable"],
            "properties": {
                "tpr": _NUM,
                "ci": _CI,
                "reliable": {"type": "boolean"},
                "min_negatives": _INT,
                "n_negatives": _INT,
            },
        },
        "attack": {
            "type": "object",
            "required": ["auroc", "auroc_ci", "low_fpr", "n_models"],
            "properties": {
                "definition": _STR,
                "auroc": _NUM,
                "auroc_ci": _CI,
                "auroc_calibrated": _NUM,
                "average_precision": _NUM,
                "n_positives": _INT,
                "n_negatives": _INT,
                "n_models": _INT,
                "n_nan_scores": _INT,
                "low_fpr": {
                    "type": "object",
                    "additionalProperties": {"type": "object", "additionalProperties": {"$ref": "#/$defs/tpr"}},
                },
            },
        },
        "best": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["name", "metric", "value", "ci"],
                    "properties": {"name": {"type": "string"}, "value": {"type": "number"}, "ci": _CI},
                },
            ]
        },
        "estimate": {
            "type": "object",
            "required": ["ci"],
            "properties": {"mean": _NUM, "value": _NUM, "ci": _CI, "token_se": _NUM},
        },
        "grid_row": {
            "type": "object",
            "required": [
                "quantizer",
                "is_reference",
                "bits",
                "effective_bits",
                "model_size_bytes",
                "utility",
                "r_q",
                "attacks",
                "best_attack",
                "best_attack_by_auroc",
                "skipped_attacks",
            ],
            "properties": {
                "quantizer": {"type": "string"},
                "is_reference": {"type": "boolean"},
                "family": _STR,
                "calibration": _STR,
                "bits": _NUM,
                "effective_bits": _NUM,
                "model_size_bytes": _NUM,
                "size_vs_reference": _NUM,
                "utility": {
                    "type": "object",
                    "required": [
                        "val_loss",
                        "val_loss_ci",
                        "relative_change",
                        "relative_change_ci",
                        "n_runs",
                        "task_metrics",
                    ],
                    "properties": {
                        "val_loss": _NUM,
                        "val_loss_ci": _CI,
                        "relative_change": _NUM,
                        "relative_change_ci": _CI,
                        "n_runs": _INT,
                        "task_metrics": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "object",
                                "required": ["value", "ci"],
                                "properties": {"value": _NUM, "ci": _CI, "drop": {"$ref": "#/$defs/estimate"}},
                            },
                        },
                        "divergence": {
                            "type": "object",
                            "required": ["measured"],
                            "properties": {
                                "measured": {"type": "boolean"},
                                "reason": _STR,
                                "n_runs": _INT,
                                **{k: {"$ref": "#/$defs/estimate"} for k in DIVERGENCE_KEYS},
                            },
                        },
                    },
                },
                "r_q": {
                    "type": "object",
                    "required": ["mean", "ci", "rank", "n_runs", "n_finite", "n_undefined"],
                    "properties": {
                        "mean": _NUM,
                        "ci": _CI,
                        "std": _NUM,
                        "median": _NUM,
                        "rank": _NUM,
                        "n_runs": _INT,
                        "n_finite": _INT,
                        "n_undefined": _INT,
                        "n_infinite": _INT,
                    },
                },
                "n_models": _INT,
                "decision": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/QuantizerDecision"}]},
                "attacks": {"type": "object", "additionalProperties": {"$ref": "#/$defs/attack"}},
                "skipped_attacks": {"type": "object", "additionalProperties": {"type": "string"}},
                "best_attack": {"$ref": "#/$defs/best"},
                "best_attack_by_auroc": {"$ref": "#/$defs/best"},
                "strongest_vs_loss": {
                    "type": ["object", "null"],
                    "additionalProperties": {
                        "type": "object",
                        "required": ["attack", "value", "loss", "gain"],
                        "properties": {
                            "attack": {"type": "string"},
                            "value": _NUM,
                            "loss": _NUM,
                            "gain": _NUM,
                            "reliable": {"type": "boolean"},
                        },
                    },
                },
            },
        },
        "criterion": {
            "type": "object",
            "required": ["id", "description", "threshold", "comparison", "status", "reason", "value", "ci"],
            "properties": {
                "id": {"enum": ["attack_tpr", "r_q", "indicator", "utility"]},
                "description": {"type": "string"},
                "threshold": _NUM,
                "metric": _STR,
                "comparison": {"enum": ["<=", ">="]},
                "status": _STATUS,
                "reason": {"type": "string"},
                "value": _NUM,
                "ci": _CI,
                "per_attack": {
                    "type": "object",
                    "additionalProperties": {
                        "oneOf": [
                            {  # judged by the release rule (a simultaneous upper bound per attack)
                                "type": "object",
                                "required": ["value", "upper_bound", "judged", "reason"],
                                "properties": {"value": _NUM, "upper_bound": _NUM, "judged": {"type": "boolean"}},
                            },
                            {  # a result without the release rule's decision: each attack judged on its own
                                "type": "object",
                                "required": ["status", "value", "ci", "reliable"],
                                "properties": {
                                    "status": _STATUS,
                                    "value": _NUM,
                                    "ci": _CI,
                                    "reliable": {"type": "boolean"},
                                },
                            },
                        ]
                    },
                },
            },
        },
    },
}


def _with_decision_models(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema with the release decision's typed models (generated from them, never written by hand)."""
    generated = QuantizerDecision.model_json_schema(ref_template="#/$defs/{model}")
    defs = dict(generated.pop("$defs", {}))
    defs["QuantizerDecision"] = generated
    schema["$defs"] |= defs
    return schema


REPORT_SCHEMA = _with_decision_models(REPORT_SCHEMA)


def validate_report(report: dict[str, Any]) -> None:
    """Raise ReportSchemaError listing every place where `report` does not match REPORT_SCHEMA, or where it
    is not strict JSON (a NaN or inf anywhere)."""
    import jsonschema

    try:
        json.dumps(report, allow_nan=False)
    except ValueError as exc:
        raise ReportSchemaError(f"report is not strict JSON: {exc}") from exc
    validator = jsonschema.Draft202012Validator(REPORT_SCHEMA)
    errors = sorted(validator.iter_errors(report), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  at {'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:300]}" for e in errors[:10]]
        raise ReportSchemaError(
            f"report does not match report schema v{REPORT_SCHEMA_VERSION} ({len(errors)} error(s)):\n"
            + "\n".join(lines)
        )
