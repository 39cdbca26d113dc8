"""The link policy of a run store: below its root there is no symbolic link, no special file and no file with a
second (hard) link; a store that holds one is refused, naming it.

A received run directory can hold a link to anywhere: a work log that points at someone's file would be
appended to, a report directory that points elsewhere written into, a data file read from outside and shown in
the report, a lock file truncated. Resolving links and checking where they land would still let a store alias
its own files and would have to be repeated at every read and write; refusing them is simpler to state and to
check. So `check_store_tree` walks the directory once when a `RunStore` is opened (every read and write of a
store goes through a RunStore's paths): symbolic links (to files or directories), FIFOs, sockets and device
files (a read of a FIFO blocks forever), and regular files with more than one hard link (a second name of a
file that may live outside: the lock files and the work log are written in place) are refused. Whatever
llmaudit creates afterwards is a plain file or directory of its own.

The root itself may be reached through a link (a run directory on a scratch disk, linked from home): that is
the path the user typed. Checkpoints an imported store references (`llmaudit import`) live outside the store by
design and are read as the user's own files; only what is inside the root is checked. One folder is left to its
owner: `jobs/`, where submitit (`llmaudit submit`) keeps its logs and links its own files; the folder itself is
checked, and llmaudit never reads what is in it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from llmaudit.common.errors import UserError

OWNED_BY_OTHERS = ("jobs",)
"""Top-level folders whose contents another program writes (submitit's job folder): checked, not entered."""

LINK_FIX = (
    "llmaudit never follows a link inside a run directory (it could read or write files outside it); replace it by "
    "what it points to (a copy made with `cp -rL` or `rsync -L` has no links) or remove it"
)
SPECIAL_FIX = "llmaudit reads only regular files and directories in a run directory (a FIFO blocks a read); remove it"
HARD_LINK_FIX = (
    "llmaudit writes some files in place (locks, the work log), which would change the other name too; replace it "
    "by a copy of its own (`cp` without -l, or `rsync` without -H)"
)


class StoreLinkError(UserError):
    """A run store holds a symbolic link, a special file or a hard-linked file; the message names it and the fix."""


def _why_unsafe(info: os.stat_result) -> str | None:
    """What is wrong with an entry (and the fix, after '; '), or None for a plain directory or file."""
    mode = info.st_mode
    if stat.S_ISLNK(mode):
        return f"is a symbolic link: {LINK_FIX}"
    if stat.S_ISDIR(mode):
        return None
    if not stat.S_ISREG(mode):
        return f"is not a regular file (a FIFO, socket or device): {SPECIAL_FIX}"
    if info.st_nlink > 1:
        return f"has {info.st_nlink} hard links (a second name of a file that may live outside it): {HARD_LINK_FIX}"
    return None


def unsafe_entry(root: Path) -> tuple[Path, str] | None:
    """The first entry below `root` that breaks the link policy, and why; None when there is none (or no root).
    Entries that vanish during the walk (another process's temporary files) are skipped."""
    if not root.is_dir():
        return None
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for entry in sorted(entries, key=lambda e: e.name):
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            why = _why_unsafe(info)
            if why:
                return Path(entry.path), why
            if stat.S_ISDIR(info.st_mode) and not (directory == root and entry.name in OWNED_BY_OTHERS):
                stack.append(Path(entry.path))
    return None


def check_store_tree(root: Path) -> None:
    """Refuse a run directory that holds anything `unsafe_entry` finds (StoreLinkError naming it and the fix)."""
    found = unsafe_entry(root)
    if found is not None:
        path, why = found
        raise StoreLinkError(f"{path}, inside the run directory {root}, {why}.")
