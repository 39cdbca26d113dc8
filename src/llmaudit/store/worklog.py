"""The work log: one JSON line per unit of work done in a store (what, who, when, how long).

Append-only and written under a lock, so concurrent jobs never interleave lines. It is the store's
record of the compute spent on it: `llmaudit status` counts it, and it shows whether any unit was ever
done twice (it must not be: see `llmaudit.store.locks`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
from pathlib import Path
from typing import Any

from filelock import FileLock

from llmaudit.common.bounded import MAX_JSONL_BYTES, InputLimitError, check_file, parse_json
from llmaudit.common.io import writing


def append_work(path: Path, record: dict[str, Any]) -> None:
    """Append one record (plus host, pid and a UTC timestamp) to the log at `path`."""
    line = json.dumps(
        {
            **record,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        },
        sort_keys=True,
    )
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        # unbuffered: nothing is left in a buffer to be written again when the file is closed after a failure
        with FileLock(str(path.with_suffix(".lock")), timeout=120.0), open(path, "ab", buffering=0) as handle:
            size = handle.seek(0, os.SEEK_END)
            try:
                data = memoryview((line + "\n").encode("utf-8"))
                while data:  # a raw write may be partial (a disk filling up); the next one then raises
                    data = data[handle.write(data) :]
                os.fsync(handle.fileno())
            except OSError:  # a full disk: cut the torn line off, so the log holds exactly what it held
                with contextlib.suppress(OSError):
                    os.truncate(path, size)
                raise


def read_work(path: Path) -> list[dict[str, Any]]:
    """Every record of the log (a torn last line from a crash, or any line that is not a JSON object within
    the bounds of `common.bounded`, is skipped)."""
    if not path.exists():
        return []
    check_file(path, limit=MAX_JSONL_BYTES, what="work log")
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = parse_json(line, str(path))
        except (json.JSONDecodeError, InputLimitError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out
