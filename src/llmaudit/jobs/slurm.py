"""What SLURM says about the jobs `llmaudit submit` sent for a run directory.

Every submission is recorded in RUN_DIR/jobs/slurm.jsonl (one line per `llmaudit submit`: per stage its
job id, its tasks and the shard each task does, its dependency and its log folder). The states of those
tasks come from the scheduler: `squeue` for live jobs (and why a pending job waits), `sacct` for finished
ones (squeue forgets a job MinJobAge after it ends, 5 minutes by default; sacct keeps it). With that,
`llmaudit status` explains a chain that cannot go on (a task failed, so the jobs that wait for it with
`afterok` never start: SLURM shows them PENDING with reason DependencyNeverSatisfied), and `llmaudit
submit` refuses to start a second chain while the first is alive and cancels the jobs that can never run.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmaudit.common.errors import UserError

RECORD = Path("jobs") / "slurm.jsonl"
"""Where the submissions of a run directory are recorded, relative to it."""

NEVER_STARTS = "DependencyNeverSatisfied"
"""squeue's reason for a pending job whose dependency can no longer be satisfied."""

FINAL_STATES = frozenset(
    [
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
    ]
)
"""States of a task that will not run again (a requeued task is REQUEUED, then PENDING)."""

FAILED_STATES = FINAL_STATES - {"COMPLETED"}

UNKNOWN = "UNKNOWN"
"""A task SLURM no longer knows (accounting off and the controller forgot it)."""


class SlurmError(UserError):
    """The scheduler refused a request, or earlier jobs of a run directory are still alive."""


def record_path(root: str | Path) -> Path:
    """The record of a run directory's SLURM submissions (`jobs/slurm.jsonl`).

    Args:
        root: the run directory.

    Returns:
        The record's path (it may not exist yet).
    """
    return Path(root) / RECORD


def record_submission(root: str | Path, stages: list[dict[str, Any]]) -> None:
    """Append one submission (its stages, in order) to the run directory's record.

    Args:
        root: the run directory.
        stages: each submitted stage: its name, job id, whether it is an array, its tasks, shards and log directory.
    """
    path = record_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "stages": stages}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line, sort_keys=True) + "\n")


def read_submissions(root: str | Path) -> list[dict[str, Any]]:
    """Every recorded submission of a run directory, oldest first (a torn last line is skipped).

    Args:
        root: the run directory.

    Returns:
        The submissions ({"utc", "stages"}); empty when none was recorded.
    """
    path = record_path(root)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def task_ids(stage: dict[str, Any]) -> list[str]:
    """The SLURM ids of a recorded stage's tasks.

    Args:
        stage: one recorded stage.

    Returns:
        `12_0`, `12_1`, ... for an array job, [`13`] for a single job.
    """
    if stage["array"]:
        return [f"{stage['job_id']}_{i}" for i in range(stage["tasks"])]
    return [str(stage["job_id"])]


def task_log(stage: dict[str, Any], task: str) -> Path:
    """The stderr log submitit writes for a task (task 0 of the job step).

    Args:
        stage: the recorded stage (its log directory).
        task: the task's SLURM id.

    Returns:
        The log's path.
    """
    return Path(stage["log_dir"]) / f"{task}_0_log.err"


@dataclass(frozen=True)
class TaskState:
    state: str
    """PENDING, RUNNING, COMPLETED, FAILED, ... as SLURM spells it; UNKNOWN when it no longer knows."""
    reason: str = ""
    """Why a pending task waits (squeue's reason), e.g. Dependency, Resources, DependencyNeverSatisfied."""

    @property
    def never_starts(self) -> bool:
        """Pending on a dependency that can never be satisfied.

        Returns:
            True when the task waits with squeue's reason DependencyNeverSatisfied.
        """
        return self.state == "PENDING" and self.reason == NEVER_STARTS

    @property
    def alive(self) -> bool:
        """Running, or pending with a chance to run.

        Returns:
            False for a final state, an unknown one, or a task that can never start.
        """
        return self.state not in FINAL_STATES and self.state != UNKNOWN and not self.never_starts


def _expand(job_id: str) -> list[str]:
    """`12_[0-2,5%2]` -> 12_0, 12_1, 12_2, 12_5 (how SLURM prints array tasks not yet started)."""
    match = re.fullmatch(r"(\d+)_\[([\d,\-]+)(?:%\d+)?\]", job_id)
    if not match:
        return [job_id]
    out = []
    for part in match.group(2).split(","):
        low, _, high = part.partition("-")
        out += [f"{match.group(1)}_{i}" for i in range(int(low), int(high or low) + 1)]
    return out


def _run(command: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def query_states(job_ids: list[str]) -> dict[str, TaskState] | None:
    """The state of every task of some jobs, as the scheduler reports it now.

    sacct gives every task's last state; squeue overrides it for live tasks and adds the reason a pending one waits.

    Args:
        job_ids: job or array ids.

    Returns:
        {task id (as `task_ids` spells it): its state}; None when no scheduler answers here.
    """
    if not job_ids:
        return {}
    ids = ",".join(sorted(set(job_ids)))
    states: dict[str, TaskState] = {}
    acct = _run(["sacct", "-X", "-n", "-P", "-j", ids, "-o", "JobID,State"])
    acct_ok = acct is not None and acct.returncode == 0  # fails where accounting storage is disabled
    for line in acct.stdout.splitlines() if acct_ok else []:
        job, _, state = line.partition("|")
        for task in _expand(job.strip()):
            states[task] = TaskState(state.split()[0] if state.split() else UNKNOWN)
    queue = _run(["squeue", "-h", "-r", "-j", ids, "-o", "%i|%T|%r"])
    # squeue exits 1 with "Invalid job id" when it has forgotten every one of them: an answer too
    queue_ok = queue is not None and (queue.returncode == 0 or "Invalid job id" in queue.stderr)
    if not (acct_ok or queue_ok):
        return None
    for line in queue.stdout.splitlines() if queue_ok else []:
        job, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        for task in _expand(job.strip()):
            states[task] = TaskState(state.strip(), "" if reason.strip() == "None" else reason.strip())
    return states


def cancel(job_ids: list[str]) -> None:
    """scancel these jobs (an array id cancels every task).

    Args:
        job_ids: job or task ids.

    Raises:
        SlurmError: scancel failed or is not available (the fix named).
    """
    done = _run(["scancel", *sorted(set(job_ids))])
    if done is None or done.returncode != 0:
        why = done.stderr.strip() if done is not None else "scancel is not available here"
        raise SlurmError(
            f"scancel {' '.join(sorted(set(job_ids)))} failed ({why}); cancel them by hand, then submit again."
        )


_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception)): (.+)$")


def error_line(log: Path) -> str | None:
    """The last exception a task's log ends with.

    Args:
        log: the task's stderr log.

    Returns:
        The exception as `QuantizationError: hqq-4: ...`; None when the log holds none or cannot be read.
    """
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        match = _ERROR_LINE.match(line.strip())
        if match:
            return f"{match.group(1)}: {match.group(2)}"
    return None


def stage_jobs(stage: dict[str, Any], states: dict[str, TaskState]) -> dict[str, Any]:
    """One recorded stage with its tasks' states.

    Args:
        stage: the recorded stage.
        states: every task's state (`query_states`).

    Returns:
        {"stage", "job_id", "array", "tasks", "states" (count per state), "failed" (task, shard, state, log,
        error), "never_start", "alive"}.
    """
    counts: dict[str, int] = {}
    failed, waiting = [], []
    for i, task in enumerate(task_ids(stage)):
        state = states.get(task, TaskState(UNKNOWN))
        label = f"{state.state} ({state.reason})" if state.reason and state.state == "PENDING" else state.state
        counts[label] = counts.get(label, 0) + 1
        if state.state in FAILED_STATES:
            log = task_log(stage, task)
            failed.append(
                {
                    "task": task,
                    "shard": stage["shards"][i],
                    "state": state.state,
                    "log": str(log),
                    "error": error_line(log),
                }
            )
        if state.never_starts:
            waiting.append(task)
    return {
        "stage": stage["stage"],
        "job_id": str(stage["job_id"]),
        "array": stage["array"],
        "tasks": stage["tasks"],
        "states": counts,
        "failed": failed,
        "never_start": waiting,
        "alive": [t for t in task_ids(stage) if states.get(t, TaskState(UNKNOWN)).alive],
    }


def jobs_status(root: str | Path) -> dict[str, Any] | None:
    """The latest submission of a run directory as SLURM sees it now.

    Args:
        root: the run directory.

    Returns:
        None when it has no submission; else {"submitted", "submissions", "reachable" (False when no scheduler
        answers here), "stages" (`stage_jobs` each), "broken" (a task failed or a job can never start: `llmaudit
        submit all RUN_DIR` has to repair the chain)}.
    """
    submissions = read_submissions(root)
    if not submissions:
        return None
    latest = submissions[-1]
    states = query_states([str(s["job_id"]) for s in latest["stages"]])
    if states is None:
        return {"submitted": latest["utc"], "submissions": len(submissions), "reachable": False, "stages": []}
    stages = [stage_jobs(s, states) for s in latest["stages"]]
    broken = any(s["failed"] or s["never_start"] for s in stages)
    return {
        "submitted": latest["utc"],
        "submissions": len(submissions),
        "reachable": True,
        "stages": stages,
        "broken": broken,
    }


def earlier_jobs(root: str | Path) -> tuple[list[str], list[str]]:
    """The tasks of every earlier submission of a run directory that are alive or can never start.

    Args:
        root: the run directory.

    Returns:
        (live tasks, tasks that wait for a failed job and can never start).
    """
    stages = [stage for submission in read_submissions(root) for stage in submission["stages"]]
    if not stages:
        return [], []
    states = query_states([str(s["job_id"]) for s in stages]) or {}
    tasks = [t for s in stages for t in task_ids(s)]
    live = [t for t in tasks if t in states and states[t].alive]
    never = [t for t in tasks if t in states and states[t].never_starts]
    return live, never
