"""One record: the SMolInstruct fields, validation, stable sample ids and content fingerprints, and
reading/writing record files (JSONL, parquet).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmaudit.common.errors import UserError

RECORD_FIELDS = (
    "input",
    "output",
    "raw_input",
    "raw_output",
    "split",
    "task",
    "input_core_tag_left",
    "input_core_tag_right",
    "output_core_tag_left",
    "output_core_tag_right",
    "target",
)

REQUIRED_FIELDS = ("input", "output", "task")


class DataError(UserError):
    """Data could not be found or does not have SMolInstruct's format. The message names the fix."""


def validate_record(rec: Any, where: str) -> dict:
    """Check one record; fill optional SMolInstruct fields; give it a stable sample id."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    missing = [f for f in REQUIRED_FIELDS if not isinstance(rec.get(f), str) or not rec.get(f)]
    if missing:
        raise DataError(
            f"{where}: malformed record, field(s) {missing} missing or not a non-empty string. "
            f"Each record needs at least {list(REQUIRED_FIELDS)} (SMolInstruct's fields: {list(RECORD_FIELDS)})."
        )
    out = {f: rec.get(f) for f in RECORD_FIELDS}
    for f in RECORD_FIELDS:
        if out[f] is None:
            out[f] = "" if f != "split" else "train"
    out["raw_input"] = out["raw_input"] or rec["input"]
    out["raw_output"] = out["raw_output"] or rec["output"]
    out["target"] = out["target"] or out["raw_output"]
    out["sample_id"] = str(rec.get("sample_id") or f"{out['task']}/{out['split']}/{record_fingerprint(out)[:16]}")
    return out


def record_text(rec: dict) -> str:
    """The record's text as one string (prompt, then response): GPTQ calibration, blind baselines."""
    return "\n".join(part for part in (rec.get("input"), rec.get("output")) if part)


def record_fingerprint(rec: dict) -> str:
    """Content hash of the fields that define what a model sees (sha256 hex)."""
    blob = json.dumps([rec.get("task"), rec.get("input"), rec.get("output")], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def dataset_fingerprint(records: Iterable[dict]) -> str:
    h = hashlib.sha256()
    for rec in records:
        h.update(rec["sample_id"].encode())
        h.update(record_fingerprint(rec).encode())
    return h.hexdigest()[:32]


def read_record_file(path: Path) -> list[dict]:
    if not path.exists():
        raise DataError(f"data file {path} does not exist.")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        return [validate_record(r, f"{path}: row {i}") for i, r in enumerate(rows)]
    out = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: malformed JSON ({exc.msg}); each line must be one record.") from None
            out.append(validate_record(rec, f"{path}:{lineno}"))
    return out


def records_to_jsonl(records: list[dict]) -> str:
    buf = io.StringIO()
    for rec in records:
        buf.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return buf.getvalue()
