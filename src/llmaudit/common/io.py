"""Atomic writes. Every file llmaudit produces goes through here, so an interrupted job never leaves a
half-written file that looks complete: content is written to a temporary sibling, flushed, then renamed. A write
that fails (a full disk) names the file it was writing (`WriteError`) and leaves what was there before.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock

from llmaudit.common.bounded import MAX_JSON_BYTES, InputLimitError, check_file, parse_json
from llmaudit.common.errors import UserError


class WriteError(UserError):
    """A file could not be written (a full disk, a quota, a permission); the message names the file and the fix.
    What was there before stays: a write replaces a file only once its new content is complete."""


DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded", "StorageFull", "QuotaExceeded")
"""How a full disk reads in errors that are not an OSError (safetensors' and torch's own writers)."""


def write_error(path: str | os.PathLike, exc: BaseException) -> WriteError | None:
    """The WriteError naming `path` for a failure to write it (an OSError, or another writer's full-disk error);
    None for anything else (a bug, an interrupt: those keep their own type)."""
    if isinstance(exc, WriteError):
        return exc
    text = " ".join(str(exc).split())
    disk_full = (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or any(
        t in text for t in DISK_FULL_TEXT
    )
    if not disk_full and not isinstance(exc, OSError):
        return None
    reason = (
        (getattr(exc, "strerror", None) or text or type(exc).__name__) if not disk_full else "No space left on device"
    )
    if disk_full:
        fix = "free space on that disk (or write elsewhere: --out / output_dir) and run the command again"
    elif getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable (or write elsewhere: --out / output_dir) and run the command again"
    else:
        fix = "check that disk and run the command again"
    return WriteError(f"cannot write {path}: {reason}; {fix} (the files already written are kept).")


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn a failure to write `path` inside the block into a WriteError naming it (`write_error`)."""
    try:
        yield
    except Exception as exc:
        error = write_error(path, exc)
        if error is None or error is exc:
            raise
        raise error from None


def current_umask() -> int:
    """This process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically: a temporary sibling, flushed and fsynced, then renamed over `path`.
    A failure (a full disk) leaves `path` as it was, removes the temporary file and names `path` (WriteError)."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o666 & ~current_umask())  # mkstemp's 0600 would hide the file from the user's group
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _write_new_file(target: Path, data: bytes, *, shown: Path) -> None:
    """Write a file that does not exist yet (mode 0666 less the umask), flushed to disk; a failure names `shown`,
    the path the file is written for."""
    with writing(shown):
        target.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())


def directory_lock(path: str | os.PathLike) -> FileLock:
    """The lock every writer of the set of files in directory `path` holds (`replace_directory`, and a writer that
    adds a file to the set): a file `.NAME.lock` beside the directory, so that two processes writing one set (two
    `llmaudit report` on one store) take turns and each leaves a whole set."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path.parent / f".{path.name}.lock"))


def replace_directory(path: str | os.PathLike, files: dict[str, bytes]) -> Path:
    """Make `files` ({relative path: bytes}) the whole content of directory `path`, as one set: written into a
    temporary sibling, then swapped in by renaming, under the set's lock (`directory_lock`). A kill at any moment
    leaves the old set, the new set, or no directory (the next write removes the leftovers), never new files beside
    old ones; a second writer waits for the first, so it never takes a live writer's files for leftovers."""
    path = Path(path)
    with writing(path), directory_lock(path):
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # a write killed earlier (the lock is ours)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        old = tmp.with_name(tmp.name.removesuffix(".tmp") + ".old.tmp")
        try:
            for name, data in files.items():
                _write_new_file(tmp / name, data, shown=path / name)
            os.chmod(tmp, 0o777 & ~current_umask())
            if path.exists():
                os.replace(path, old)
            os.replace(tmp, path)
        except BaseException:
            if old.exists() and not path.exists():  # the swap failed halfway: the previous set goes back
                os.replace(old, path)
            raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
    return path


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays, paths, sets: everything a result object may hold.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (Path, os.PathLike)):
        return str(obj)
    if isinstance(obj, set):
        return sorted(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=_json_default, allow_nan=True) + "\n"


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, to_json(obj))


def file_digest(path: str | os.PathLike, *, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes (checkpoint weights and configurations, data files)."""
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            h.update(block)
    return h.hexdigest()


class JsonFileError(UserError):
    """A JSON file llmaudit reads is missing or not valid JSON; the message names the file."""


def read_json(path: str | os.PathLike, *, what: str = "JSON file", fix: str = "", limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in `path`; JsonFileError naming the file (and `fix`) when it is missing or corrupt, and
    InputLimitError when it is not a regular file, over `limit` bytes or nested too deep (`common.bounded`).

    Non-standard NaN/Infinity literals are accepted: llmaudit writes them in results (never in report.json)."""
    path = Path(path)
    hint = f" {fix}" if fix else ""
    try:
        check_file(path, limit=limit, what=what)
        with open(path, encoding="utf-8") as handle:
            return parse_json(handle.read(), f"{what} {path}")
    except FileNotFoundError:
        raise JsonFileError(f"{what} {path} does not exist.{hint}") from None
    except InputLimitError as exc:
        raise InputLimitError(f"{exc}{hint}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise JsonFileError(f"{what} {path} is not valid JSON ({exc}).{hint}") from None
    except OSError as exc:
        raise JsonFileError(f"cannot read {what} {path} ({exc.strerror or exc}).{hint}") from None


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory that replaces `path` only if the block finishes without error.

    Used for checkpoints: a directory either holds a complete checkpoint or does not exist."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        with writing(path):
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        error = write_error(path, exc) if isinstance(exc, Exception) else None
        if error is None or error is exc:
            raise
        raise error from None


def to_strict_json(obj: Any) -> Any:
    """A copy of `obj` that strict JSON parsers read: non-finite floats become None, numpy scalars and
    arrays become Python numbers and lists, tuples become lists."""
    if isinstance(obj, dict):
        return {str(k): to_strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_strict_json(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return to_strict_json(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj
