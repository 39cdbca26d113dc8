"""Child processes that end with their parent: `llmaudit audit`'s fine-tuning and scoring processes
(`jobs.local`) are stopped by the kernel when the command that started them dies, however it dies (a SIGKILL
included), so no orphan keeps training or scoring a store that its user believes stopped. Their finished
checkpoints and units are kept, and the same command resumes the rest."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "LLMAUDIT_PARENT_PID"
"""Set by the parent in a child's environment: the parent's process id."""

PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal the kernel sends this process when its parent thread ends."""


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """`env` with this process named as the parent of the child that receives it.

    Args:
        env: the child's environment.

    Returns:
        A copy with PARENT_ENV set to this process's id.
    """
    return {**env, PARENT_ENV: str(os.getpid())}


def end_with_parent() -> bool:
    """In a child started with `child_environment`: have the kernel send this process SIGTERM when its parent ends
    (Linux's PR_SET_PDEATHSIG), and end now if the parent has already gone (it died before the request took hold).

    Returns:
        True when the request was made; False outside such a child or off Linux (nothing changes).
    """
    parent = os.environ.pop(PARENT_ENV, "")  # the child's own children are not tied to its parent
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        return False
    if os.getppid() != int(parent):
        os.kill(os.getpid(), signal.SIGTERM)
    return True
