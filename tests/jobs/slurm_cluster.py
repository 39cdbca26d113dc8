"""Helpers of the `slurm` tests: whether the single-node test cluster of `.ci/slurm-up` answers here, and
ways to watch and interrupt its jobs (their processes run on this host)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmaudit.jobs.slurm import jobs_status, read_submissions

PARTITION = "audit"
"""The second partition of the test cluster (`debug` is the default one)."""


def _answer(command: list[str]) -> subprocess.CompletedProcess | str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{' '.join(command)}` did not answer ({exc})"


def cluster_unreachable() -> str | None:
    """None when the test cluster answers here, else why not (the skip reason). The tests need: the SLURM
    commands, a usable node that is this host (they watch and signal job processes), the second partition,
    and accounting (sacct)."""
    hint = "`.ci/slurm-up` starts a single-node cluster (Debian, as root)"
    for tool in ("sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo"):
        if shutil.which(tool) is None:
            return f"no SLURM cluster here ({tool} not found); {hint}"
    nodes = _answer(["sinfo", "-h", "-N", "-o", "%N %T %P"])
    if isinstance(nodes, str) or nodes.returncode:
        return f"no SLURM controller answers ({nodes if isinstance(nodes, str) else nodes.stderr.strip()}); {hint}"
    rows = [line.split() for line in nodes.stdout.splitlines() if line.strip()]
    host = socket.gethostname().split(".")[0]
    if not rows or {row[0] for row in rows} != {host}:
        return f"the SLURM cluster here is not a single node on this host ({host}); {hint}"
    if not any(row[1].rstrip("*~#$@") in ("idle", "mixed", "allocated", "completing") for row in rows):
        return f"the SLURM node is not usable (sinfo: {nodes.stdout.strip()}); {hint}"
    if PARTITION not in {row[2].rstrip("*") for row in rows}:
        return f"the SLURM cluster has no partition {PARTITION!r}; {hint}"
    acct = _answer(["sacct", "-n", "-X", "-j", "1"])
    if isinstance(acct, str) or acct.returncode:
        return f"sacct does not answer ({acct if isinstance(acct, str) else acct.stderr.strip()}); {hint}"
    return None


# ------------------------------------------------------------------------------------------ job states


def all_job_ids(run_dir: Path) -> list[str]:
    return sorted({str(s["job_id"]) for sub in read_submissions(run_dir) for s in sub["stages"]})


def wait_for_chain(run_dir: Path, timeout: float = 900.0) -> dict:
    """Wait until no job of the latest submission can still run (all ended, or waiting for good); returns
    the jobs' status (`llmaudit.jobs.slurm.jobs_status`)."""
    deadline = time.time() + timeout
    while True:
        jobs = jobs_status(run_dir)
        assert jobs is not None and jobs["reachable"], jobs
        alive = [t for stage in jobs["stages"] for t in stage["alive"]]
        if not alive:
            return jobs
        if time.time() > deadline:
            queue = subprocess.run(["squeue"], capture_output=True, text=True).stdout
            pytest.fail(f"jobs {alive} still alive after {timeout:.0f}s:\n{queue}")
        time.sleep(2)


def stage_states(jobs: dict) -> dict[str, dict[str, int]]:
    return {stage["stage"]: stage["states"] for stage in jobs["stages"]}


def accounting(job_ids: list[str], *, duplicates: bool = False) -> list[dict[str, str]]:
    """sacct's rows of these jobs' tasks (every attempt of a requeued one with duplicates=True)."""
    fields = ["JobID", "State", "Start", "End"]
    command = ["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", ",".join(fields)]
    out = subprocess.run(command + (["-D"] if duplicates else []), capture_output=True, text=True, check=True)
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.stdout.splitlines() if line.strip()]


def show_job(job_id: str) -> dict[str, str]:
    """`scontrol show job -o JOB` as key=value pairs: what the scheduler holds, not what a script asked."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    first = out.stdout.splitlines()[0]
    return dict(token.split("=", 1) for token in first.split() if "=" in token)


def cancel_all(run_dirs: list[Path]) -> None:
    ids = [i for run_dir in run_dirs for i in all_job_ids(run_dir)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


# ------------------------------------------------------------------------------------------ a task at work


@dataclass
class Held:
    """A score task's process stopped (SIGSTOP) while it holds a unit."""

    pid: int
    job_id: str  # the job its RUNNING marker names: ARRAY_TASK for an array task
    unit: Path  # the loss table it was writing (not on disk yet)

    def resume(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)


def _stop_if_holding(marker: Path, scores_dir: Path, done_at_least: int) -> Held | None:
    try:
        info = json.loads(marker.read_text())
        os.kill(int(info["pid"]), signal.SIGSTOP)
    except (OSError, ValueError, KeyError):
        return None
    held = Held(
        int(info["pid"]), str(info["job_id"]), marker.with_name(marker.name[: -len(".RUNNING.json")] + ".parquet")
    )
    if marker.exists() and not held.unit.exists() and len(list(scores_dir.rglob("*.parquet"))) >= done_at_least:
        return held
    held.resume()
    return None


def freeze_task_holding_a_unit(run_dir: Path, *, done_at_least: int = 0, timeout: float = 600.0) -> Held:
    """Stop a score task's process right while it holds a unit: its RUNNING marker exists and its loss table
    does not (checked after the stop, so the task cannot move on meanwhile), with at least `done_at_least`
    loss tables already written. Fails at once if the jobs end first. The caller must `resume()` it."""
    scores_dir = run_dir / "scores"
    deadline, next_check = time.time() + timeout, time.time() + 2
    while time.time() < deadline:
        for marker in scores_dir.rglob("*.RUNNING.json") if scores_dir.is_dir() else []:
            held = _stop_if_holding(marker, scores_dir, done_at_least)
            if held:
                return held
        if time.time() > next_check:
            jobs = jobs_status(run_dir)
            if not any(stage["alive"] for stage in jobs["stages"]):
                pytest.fail(f"the jobs ended before a score task was seen holding a unit: {jobs['stages']}")
            next_check = time.time() + 2
        time.sleep(0.005)
    pytest.fail(f"no score task was seen holding a unit in {scores_dir} within {timeout:.0f}s")


def wait_for_pending_signal(pid: int, signum: int, timeout: float = 30.0) -> None:
    """Wait until `signum` is pending for the (stopped) process `pid`: delivered, not yet handled."""
    bit = 1 << (signum - 1)
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        pending = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("ShdPnd:", "SigPnd:"))]
        if any(p & bit for p in pending):
            return
        time.sleep(0.01)
    pytest.fail(f"signal {signum} never reached process {pid}")
