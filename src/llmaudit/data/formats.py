"""A user's own training or held-out file (JSONL, JSON or parquet) as llmaudit records.

Each row is mapped by the fields it has, the common supervised fine-tuning formats:

    input, output (, task)          SMolInstruct's fields: chat, as llmaudit's own data
    text                            a plain text: format "text" (every token after the first scored)
    prompt, completion (strings)    TRL's prompt-completion format: format "raw" (completion scored)
    prompt, completion (messages)   TRL's conversational prompt-completion: format "chat"
    messages                        TRL's conversational format: format "chat", the final assistant turn
                                    scored, the messages before it kept as `prompt_messages`
    conversations (from, value)     ShareGPT's format, converted as TRL's SFTTrainer converts it
                                    (`trl.data_utils.maybe_convert_to_chatml`): "from" -> "role", "value" ->
                                    "content" in every message list of the row, "conversations" -> "messages";
                                    the role names are kept ("human", "gpt": the model saw them), and a final
                                    turn of another role than "assistant" keeps its role (`response_role`)

`record_format` other than "auto" forces how rows are rendered: "chat" puts prompt/completion (or
input/output) strings through the model's chat template, "raw" concatenates them as plain text, "text"
treats prompt + completion (or input + output) as one text. Sample ids come from the content
(`validate_record`), so the same text in a training and a held-out file gets the same id; a malformed row
fails with the file and line (row) and what each format needs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmaudit.common.bounded import (
    MAX_JSON_BYTES,
    MAX_ROWS,
    JsonLineError,
    check_file,
    parse_json,
    read_jsonl,
    read_parquet_bounded,
)
from llmaudit.data.records import DataError, validate_record

INPUT_FORMATS = ("auto", "chat", "raw", "text")

IMPORT_SPLIT = "import"
"""The `split` field of imported records (SMolInstruct's split does not apply); part of their ids."""

ACCEPTED = (
    "each row needs one of: 'messages' (a list of {role, content} ending with the assistant's turn), "
    "'conversations' (a list of {from, value}, ShareGPT's), 'prompt' + 'completion' (strings, or lists of "
    "messages), 'text', or 'input' + 'output'"
)

PROMPT_ROLES = ("system", "user", "human", "tool")
"""Roles that never hold the scored response: a conversation that ends with one has no answer to score."""

TRL_MESSAGE_KEYS = ("prompt", "completion", "chosen", "rejected", "messages", "conversations")
"""The fields whose message lists TRL's `maybe_convert_to_chatml` converts from ShareGPT's from/value."""


def is_sharegpt(row: dict) -> bool:
    """Whether TRL would see the row as ShareGPT's from/value format (trl.data_utils.is_conversational_from_value:
    'conversations' is a list whose first message has both 'from' and 'value')."""
    messages = row.get("conversations")
    return (
        isinstance(messages, list)
        and bool(messages)
        and isinstance(messages[0], dict)
        and {"from", "value"} <= set(messages[0])
    )


def sharegpt_to_chatml(row: dict) -> dict:
    """A ShareGPT row as TRL's SFTTrainer converts it before training (trl.data_utils.maybe_convert_to_chatml):
    in the message lists of TRL_MESSAGE_KEYS each message's "from" becomes "role" and "value" becomes "content"
    (values unchanged), then "conversations" becomes "messages". The row itself is not modified."""
    out = dict(row)
    for key in TRL_MESSAGE_KEYS:
        if isinstance(out.get(key), list):
            converted = []
            for message in out[key]:
                if isinstance(message, dict):
                    message = dict(message)
                    if "from" in message:
                        message["role"] = message.pop("from")
                    if "value" in message:
                        message["content"] = message.pop("value")
                converted.append(message)
            out[key] = converted
    if "conversations" in out:
        out["messages"] = out.pop("conversations")
    return out


def read_rows(path: str | Path) -> list[tuple[str, Any]]:
    """(where, row) of every row of a JSONL, JSON (a list of objects) or parquet file, where = 'FILE:LINE'
    (JSONL) or 'FILE: row N' (1-based)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist (or is not a file).")
    if path.suffix == ".parquet":
        import pyarrow as pa

        try:
            rows = read_parquet_bounded(path, what="data file").to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path} is not a readable parquet file ({exc}).") from None
        return [(f"{path}: row {i}", row) for i, row in enumerate(rows, 1)]
    with open(path, "rb") as handle:
        head = handle.read(4096).lstrip()
    if head.startswith(b"["):  # one JSON list, parsed whole: the JSON file bounds apply
        check_file(path, limit=MAX_JSON_BYTES, what="data file")
        try:
            rows = parse_json(path.read_text(encoding="utf-8"), f"data file {path}")
        except UnicodeDecodeError:
            raise DataError(f"{path} is not UTF-8 text: pass a JSONL, JSON or parquet file.") from None
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}).") from None
        if len(rows) > MAX_ROWS:
            raise DataError(f"data file {path} holds {len(rows):,} rows, more than the {MAX_ROWS:,} llmaudit reads.")
        return [(f"{path}: row {i}", row) for i, row in enumerate(rows, 1)]
    try:
        return list(read_jsonl(path, what="data file"))
    except JsonLineError as exc:
        raise DataError(f"{exc.where}: malformed JSON ({exc.reason}); each line must be one record.") from None


def read_user_records(path: str | Path, *, record_format: str = "auto") -> tuple[list[dict], int]:
    """The records of a user's file, in file order, each id once, and how many duplicate rows (same
    content, hence same sample id) were dropped."""
    if record_format not in INPUT_FORMATS:
        raise DataError(f"format {record_format!r} is not one of {list(INPUT_FORMATS)}.")
    records: dict[str, dict] = {}
    duplicates = 0
    for where, row in read_rows(path):
        rec = row_to_record(row, where, record_format=record_format)
        seen = records.get(rec["sample_id"])
        if seen is not None:
            if _content(seen) != _content(rec):
                raise DataError(
                    f"{where}: sample id {rec['sample_id']!r} is used by two different records; ids must be unique."
                )
            duplicates += 1
            continue
        records[rec["sample_id"]] = rec
    if not records:
        raise DataError(f"data file {path} holds no records.")
    return list(records.values()), duplicates


def _content(rec: dict) -> tuple:
    return tuple(rec.get(k) for k in ("task", "input", "output", "format", "prompt_messages", "response_role"))


def row_to_record(row: Any, where: str, *, record_format: str = "auto") -> dict:
    """One row of a user's file as a validated llmaudit record (see the module docstring)."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(row).__name__}; {ACCEPTED}.")
    if "conversations" in row:
        if not is_sharegpt(row):
            raise DataError(
                f"{where}: 'conversations' must be a list of {{from, value}} messages (ShareGPT's format, which TRL "
                "converts to 'messages'); for {role, content} messages name the field 'messages'."
            )
        row = sharegpt_to_chatml(row)
    task = row.get("task") if isinstance(row.get("task"), str) and row.get("task") else None
    sample_id = row.get("sample_id") if isinstance(row.get("sample_id"), str) and row.get("sample_id") else None
    if "messages" in row:
        rec = _from_messages(row["messages"], where, record_format)
        task = task or "messages"
    elif "prompt" in row and "completion" in row:
        rec = _from_prompt_completion(row["prompt"], row["completion"], where, record_format)
        task = task or "prompt-completion"
    elif "text" in row:
        if record_format not in ("auto", "text"):
            raise DataError(
                f"{where}: a 'text' record has no prompt and response to render as {record_format!r}; "
                "use --format auto (or text)."
            )
        if not isinstance(row["text"], str) or not row["text"]:
            raise DataError(f"{where}: field 'text' must be a non-empty string.")
        rec = {"input": "", "output": row["text"], "format": "text"}
        task = task or "text"
    elif "input" in row and "output" in row:
        if record_format in ("auto", "chat"):
            # SMolInstruct's fields, exactly as llmaudit's own data (a missing task is filled in); auto
            # keeps a record's own format fields (an llmaudit data file read back), chat drops them.
            drop = ("format", "prompt_messages") if record_format == "chat" else ()
            base = {k: v for k, v in row.items() if k not in drop}
            base["task"] = task or "input-output"
            return validate_record(base, where)
        rec = _from_strings(row["input"], row["output"], where, record_format)
        task = task or "input-output"
    else:
        raise DataError(f"{where}: unrecognised record with fields {sorted(row)[:8]}; {ACCEPTED}.")
    rec.update(task=task, split=IMPORT_SPLIT)
    if sample_id:
        rec["sample_id"] = sample_id
    return validate_record(rec, where)


def _from_strings(prompt: Any, completion: Any, where: str, record_format: str) -> dict:
    if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
        raise DataError(f"{where}: prompt/input and completion/output must be strings (the completion non-empty).")
    if record_format == "text":
        return {"input": "", "output": prompt + completion, "format": "text"}
    if record_format == "chat":
        if not prompt:
            raise DataError(f"{where}: an empty prompt cannot be put through a chat template; use --format raw.")
        return {"input": prompt, "output": completion}
    if not prompt:
        return {"input": "", "output": completion, "format": "text"}
    return {"input": prompt, "output": completion, "format": "raw"}


def _from_prompt_completion(prompt: Any, completion: Any, where: str, record_format: str) -> dict:
    if isinstance(prompt, str) and isinstance(completion, str):
        return _from_strings(prompt, completion, where, "raw" if record_format == "auto" else record_format)
    if isinstance(prompt, list) and isinstance(completion, list):
        return _from_messages(prompt + completion, where, record_format)
    raise DataError(
        f"{where}: 'prompt' and 'completion' must both be strings or both be lists of messages "
        f"(got {type(prompt).__name__} and {type(completion).__name__})."
    )


def _from_messages(messages: Any, where: str, record_format: str) -> dict:
    if record_format in ("raw", "text"):
        raise DataError(
            f"{where}: a conversational record (messages) is rendered through the chat template; "
            f"--format {record_format} needs prompt/completion strings. Use --format auto (or chat)."
        )
    if not isinstance(messages, list) or len(messages) < 2:
        raise DataError(f"{where}: 'messages' must be a list of at least two {{role, content}} messages.")
    clean = [_message(m, where, i) for i, m in enumerate(messages)]
    role = clean[-1]["role"]
    if role in PROMPT_ROLES:
        raise DataError(
            f"{where}: the last message has role {role!r}; the final turn must be the model's answer "
            "(the assistant's: the response that is scored)."
        )
    if not clean[-1]["content"]:
        raise DataError(f"{where}: the final {role} message is empty.")
    prompt = clean[:-1]
    return {
        "input": prompt[-1]["content"],
        "output": clean[-1]["content"],
        "format": "chat",
        "prompt_messages": json.dumps(prompt, ensure_ascii=False),
        **({"response_role": role} if role != "assistant" else {}),
    }


def _message(message: Any, where: str, index: int) -> dict[str, str]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise DataError(f"{where}: message {index} must be an object with a 'role' and a 'content'.")
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise DataError(f"{where}: message {index} holds non-text content parts; only text can be audited.")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise DataError(f"{where}: message {index}'s content must be a string.")
    return {"role": message["role"], "content": content}
