"""RUNNING markers beside the unit a job is working on: host, pid and a heartbeat (the file's mtime).

A live marker tells `llmaudit status` that a unit is being worked on; a marker left behind by a killed
job is recognised as stale (dead pid on this host, or no heartbeat for STALE_AFTER_S).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Literal, TypeVar

from llmaudit.common.io import JsonFileError, atomic_write_json, read_json
from llmaudit.common.schema import parse_or_refuse
from llmaudit.store.records import Marker
from llmaudit.store.run_store import RunStore, StoreError

T = TypeVar("T")


HEARTBEAT_S = 30.0
"""How often a live job refreshes its RUNNING marker's mtime."""

STALE_AFTER_S = 300.0
"""A marker from another host whose heartbeat is older than this belongs to a dead job."""


def run_marker_path(store: RunStore, run: int) -> Path:
    return store.run_dir(run) / "RUNNING.json"


def unit_marker_path(store: RunStore, run: int, step: int, quantizer: str) -> Path:
    path = store.unit_path(run, step, quantizer)
    return path.with_name(f"{path.stem}.RUNNING.json")


def _job_id() -> str | None:
    """The job this process runs in: ARRAY_TASK for a SLURM array task (its SLURM_JOB_ID alone can be the
    array's id, and `scancel` of that stops every task), else the SLURM or local submitit job id."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID")


@contextlib.contextmanager
def running_marker(path: Path, *, heartbeat_s: float = HEARTBEAT_S) -> Iterator[Path]:
    """Hold a RUNNING marker at `path` for the duration of the block; a daemon thread refreshes its mtime.

    Removed when the block ends, normally or by an exception; a killed process leaves it behind, which
    `marker_state` recognises (dead pid on this host, or no heartbeat for STALE_AFTER_S)."""
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "job_id": _job_id(),
    }
    atomic_write_json(path, info)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(heartbeat_s):
            with contextlib.suppress(OSError):
                os.utime(path)

    thread = threading.Thread(target=beat, name=f"heartbeat {path.name}", daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join()
        path.unlink(missing_ok=True)


def each_marked(items: Iterable[T], marker_path: Callable[[T], Path]) -> Iterator[T]:
    """Yield each item while its RUNNING marker exists: `for run in each_marked(todo, path_of): ...`.

    The marker of an item is removed when the loop moves to the next item, ends, breaks or raises
    (the generator is closed then), so the work loop itself needs no changes."""
    for item in items:
        with running_marker(marker_path(item)):
            yield item


def clear_stale_markers(paths: Iterable[Path]) -> int:
    """Remove the stale markers among `paths`, the markers of items that are already done: a job killed
    after writing an item but before leaving its marker behind. Markers of live jobs stay. Returns how
    many were removed."""
    removed = 0
    for path in paths:
        if marker_state(path) == "stale":
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def marker_state(path: Path, *, now: float | None = None) -> Literal["running", "stale"] | None:
    """running = a live job holds the marker; stale = its job died (the unit is missing); None = no marker.
    A marker that is not one (`store.records.Marker`: a host and a pid from 1 to 2^31 - 1) is refused, naming the
    file and the field (StoreError)."""
    fix = "delete it (a job of llmaudit never writes it so; a live job writes its marker again)"
    try:
        age = (now or time.time()) - path.stat().st_mtime
        info = read_json(path, what="RUNNING marker", fix=fix)
    except FileNotFoundError:
        return None
    except JsonFileError as exc:
        if not path.exists():  # its job finished between the two reads
            return None
        raise StoreError(str(exc)) from None
    marker = parse_or_refuse(Marker, info, where=str(path), fix=fix, error=StoreError)
    if age > STALE_AFTER_S:
        return "stale"
    if marker.host == socket.gethostname() and not _pid_alive(marker.pid):
        return "stale"
    return "running"
