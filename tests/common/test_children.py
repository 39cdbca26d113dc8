"""Child processes end with their parent (`common.children`), however the parent ends."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from llmaudit.common.children import PARENT_ENV, child_environment, end_with_parent

CHILD = textwrap.dedent(
    """
    import sys, time
    from llmaudit.common.children import end_with_parent
    print("tied" if end_with_parent() else "untied", flush=True)
    time.sleep(60)
    """
)

PARENT = textwrap.dedent(
    """
    import subprocess, sys, os
    from llmaudit.common.children import child_environment
    env = child_environment(dict(os.environ)) if sys.argv[1] == "tie" else dict(os.environ)
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], env=env, stdout=subprocess.PIPE, text=True)
    print(child.pid, child.stdout.readline().strip(), flush=True)
    child.wait()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _killed_parent_leaves(tie: str) -> tuple[str, bool]:
    """Start a parent that starts a child, SIGKILL the parent: (the child's own report, whether it still lives 5 s
    later)."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, tie, CHILD], stdout=subprocess.PIPE, text=True)
    pid, state = parent.stdout.readline().split()
    parent.kill()
    parent.wait()
    deadline = time.time() + 5
    while time.time() < deadline and _alive(int(pid)):
        time.sleep(0.1)
    alive = _alive(int(pid))
    if alive:
        os.kill(int(pid), signal.SIGKILL)
    return state, alive


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_tied_child_ends_when_its_parent_is_killed_and_an_untied_one_lives_on():
    assert _killed_parent_leaves("tie") == ("tied", False)
    assert _killed_parent_leaves("free") == ("untied", True)  # the control: without the tie it would be an orphan


def test_outside_a_tied_child_nothing_changes(monkeypatch):
    monkeypatch.delenv(PARENT_ENV, raising=False)
    assert end_with_parent() is False
    monkeypatch.setenv(PARENT_ENV, "not-a-pid")
    assert end_with_parent() is False
    assert PARENT_ENV not in os.environ  # read once, and never passed on to the child's own children


def test_the_child_environment_names_this_process():
    env = child_environment({"A": "1"})
    assert env == {"A": "1", PARENT_ENV: str(os.getpid())}
