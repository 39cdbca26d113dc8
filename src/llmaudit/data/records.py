"""One record: the SMolInstruct fields, validation, stable sample ids and content fingerprints, and
reading/writing record files (JSONL, parquet).

Besides SMolInstruct's fields a record may carry how the model sees it (`llmaudit import` of a user's own
fine-tune, `llmaudit.data.formats`):

    format            "chat" (default): input and output through the model's chat template;
                      "raw": input (prompt) and output (completion) concatenated as plain text;
                      "text": one plain text (input, normally "", then output), every token after the first scored
    prompt_messages   for "chat" only: a JSON string of the chat messages before the final assistant turn
                      (system prompt, earlier turns); the prompt is rendered from them instead of from input
    response_role     for "chat" only: the role of the final (scored) turn when it is not "assistant", e.g.
                      "gpt" in ShareGPT rows, which TRL passes to the chat template unchanged

Records without these fields are exactly what they were: same fields, same fingerprint, same sample id.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from llmaudit.common.bounded import JsonLineError, parse_json, read_jsonl, read_parquet_bounded
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

OPTIONAL_FIELDS = ("format", "prompt_messages", "response_role")
"""Kept by `validate_record` only when a record has them (see the module docstring)."""

RECORD_FORMATS = ("chat", "raw", "text")


class DataError(UserError):
    """Data could not be found or does not have SMolInstruct's format. The message names the fix."""


def validate_record(rec: Any, where: str) -> dict:
    """Check one record; fill optional SMolInstruct fields; give it a stable sample id."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    fmt = rec.get("format")
    if fmt is not None and fmt not in RECORD_FORMATS:
        raise DataError(f"{where}: field 'format' = {fmt!r} is not one of {list(RECORD_FORMATS)}.")
    fmt = fmt or "chat"
    messages = _prompt_messages(rec.get("prompt_messages"), fmt, where)
    # A plain text has no prompt, and a chat prompt may come from its messages alone.
    may_be_empty = {"input"} if fmt == "text" or messages is not None else set()

    def bad(f: str) -> bool:
        value = rec.get(f)
        if f in may_be_empty:
            return value is not None and not isinstance(value, str)
        return not isinstance(value, str) or not value

    missing = [f for f in REQUIRED_FIELDS if bad(f)]
    if missing:
        raise DataError(
            f"{where}: malformed record, field(s) {missing} missing or not a non-empty string. "
            f"Each record needs at least {list(REQUIRED_FIELDS)} (SMolInstruct's fields: {list(RECORD_FIELDS)})."
        )
    out = {f: rec.get(f) for f in RECORD_FIELDS}
    for f in RECORD_FIELDS:
        if out[f] is None:
            out[f] = "" if f != "split" else "train"
    out["raw_input"] = out["raw_input"] or out["input"]
    out["raw_output"] = out["raw_output"] or rec["output"]
    out["target"] = out["target"] or out["raw_output"]
    if rec.get("format") is not None:
        out["format"] = fmt
    if messages is not None:
        out["prompt_messages"] = rec["prompt_messages"]
    role = rec.get("response_role")
    if role is not None:
        if fmt != "chat" or not isinstance(role, str) or not role:
            raise DataError(f"{where}: field 'response_role' must be a non-empty string, and only with format 'chat'.")
        out["response_role"] = role
    out["sample_id"] = str(rec.get("sample_id") or f"{out['task']}/{out['split']}/{record_fingerprint(out)[:16]}")
    return out


def _prompt_messages(value: Any, fmt: str, where: str) -> list[dict] | None:
    """The parsed `prompt_messages` field (None when absent): a JSON list of {role, content} strings."""
    if value is None:
        return None
    if fmt != "chat":
        raise DataError(f"{where}: field 'prompt_messages' only goes with format 'chat', not {fmt!r}.")
    try:
        messages = parse_json(value, f"{where}: field 'prompt_messages'") if isinstance(value, str) else None
    except json.JSONDecodeError:
        messages = None
    ok = (
        isinstance(messages, list)
        and messages
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    )
    if not ok:
        raise DataError(
            f"{where}: field 'prompt_messages' must be a JSON string of a non-empty list of "
            '{"role": ..., "content": ...} messages (strings).'
        )
    return messages


def prompt_messages(rec: dict) -> list[dict] | None:
    """The chat messages before the final assistant turn of a record that has them, else None."""
    value = rec.get("prompt_messages")
    return parse_json(value, "a record's prompt_messages") if value else None


def response_role(rec: dict) -> str:
    """The role of a chat record's final (scored) turn: "assistant" unless the record says otherwise."""
    return rec.get("response_role") or "assistant"


def record_format(rec: dict) -> str:
    """How the model sees the record: "chat" (default), "raw" or "text"."""
    return rec.get("format") or "chat"


def record_text(rec: dict) -> str:
    """The record's text as one string (prompt, then response): GPTQ calibration, blind baselines.

    chat: the prompt (every prompt message's content, or input) and the output on separate lines;
    raw: prompt + completion as the model saw them; text: the text."""
    fmt = record_format(rec)
    if fmt in ("raw", "text"):
        return (rec.get("input") or "") + (rec.get("output") or "")
    messages = prompt_messages(rec)
    prompt = [m["content"] for m in messages] if messages else [rec.get("input")]
    return "\n".join(part for part in (*prompt, rec.get("output")) if part)


def record_fingerprint(rec: dict) -> str:
    """Content hash of the fields that define what a model sees (sha256 hex). A record in another format
    than plain chat, or with prompt messages, also hashes those (a plain chat record's hash is unchanged)."""
    fields = [rec.get("task"), rec.get("input"), rec.get("output")]
    if record_format(rec) != "chat" or rec.get("prompt_messages"):
        fields += [record_format(rec), rec.get("prompt_messages") or ""]
    if rec.get("response_role"):
        fields.append({"response_role": rec["response_role"]})
    blob = json.dumps(fields, ensure_ascii=False)
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
        rows = read_parquet_bounded(path, what="data file").to_pylist()
        return [validate_record(r, f"{path}: row {i}") for i, r in enumerate(rows)]
    try:
        return [validate_record(rec, where) for where, rec in read_jsonl(path, what="data file")]
    except JsonLineError as exc:
        raise DataError(f"{exc.where}: malformed JSON ({exc.reason}); each line must be one record.") from None


def records_to_jsonl(records: list[dict]) -> str:
    buf = io.StringIO()
    for rec in records:
        buf.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return buf.getvalue()
