"""File locks that let several processes (local jobs, SLURM array tasks) share one run store.

A unit of work (a fine-tuning run, a scoring unit) is claimed with `claim(path)`: a non-blocking
`filelock.FileLock` (fcntl/flock on Unix, which NFS and Lustre clients implement through their lock
managers). The operating system releases the lock when its process dies, so a crashed holder never
blocks a unit for good. Whoever holds the claim re-checks that the unit is still missing before working
on it ("check, lock, check"), so two processes never do the same unit twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout


@contextlib.contextmanager
def claim(path: Path, *, timeout: float = 0.0) -> Iterator[bool]:
    """Try to hold the lock at `path` for the block; yields True if this process holds it, False if
    another live process does (then the caller skips the unit). timeout: seconds to wait for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path), timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()
