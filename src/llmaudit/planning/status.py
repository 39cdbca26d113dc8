"""`llmaudit status`: what is done, running and missing in a run directory, per stage."""

from __future__ import annotations

from typing import Any

from llmaudit.jobs.slurm import jobs_status
from llmaudit.store.integrity import StoreVerdict, verify_store
from llmaudit.store.markers import marker_state, run_marker_path, unit_marker_path
from llmaudit.store.run_store import RunStore
from llmaudit.store.units import with_store_reference


def _run_status(store: RunStore, cfg, broken: dict[int, str]) -> dict[str, Any]:
    runs: dict[str, Any] = {
        "total": cfg.train.runs,
        "done": [],
        "running": [],
        "missing": [],
        "stale": [],
        "broken": {},
        "checkpoints": {},
    }
    for run in range(cfg.train.runs):
        runs["checkpoints"][run] = store.checkpoints(run)
        if run in broken:
            runs["broken"][run] = broken[run]
            runs["missing"].append(run)
        elif store.run_done(run):
            runs["done"].append(run)
        else:
            state = marker_state(run_marker_path(store, run))
            runs["running" if state == "running" else "missing"].append(run)
            if state == "stale":
                runs["stale"].append(run)
    return runs


def _unit_status(store: RunStore, cfg, verdict: StoreVerdict) -> dict[str, Any]:
    def counts() -> dict[str, int]:
        return {"done": 0, "running": 0, "missing": 0, "invalid": 0}

    by_quantizer = {q: counts() for q in with_store_reference(cfg, store).score.quantizers}
    scores: dict[str, Any] = {
        "total": len(verdict.units),
        "done": 0,
        "running": [],
        "missing": [],
        "invalid": [],
        "stale": [],
        "by_quantizer": by_quantizer,
    }
    for unit, state in verdict.units.items():
        key = {"run": unit.run, "step": unit.step, "quantizer": unit.quantizer}
        bucket = "done" if state == "done" else ("invalid" if state.startswith("invalid") else "missing")
        if bucket == "missing":
            marker = marker_state(unit_marker_path(store, unit.run, unit.step, unit.quantizer))
            bucket = "running" if marker == "running" else "missing"
            if marker == "stale":
                scores["stale"].append(key)
        if bucket == "done":
            scores["done"] += 1
        else:
            scores[bucket].append(key | ({"why": state.removeprefix("invalid: ")} if bucket == "invalid" else {}))
        by_quantizer.setdefault(unit.quantizer, counts())[bucket] += 1
    # Units of unfinished runs cannot be listed yet: their checkpoints do not exist.
    scores["waiting_for_runs"] = [r for r in range(cfg.train.runs) if not store.run_done(r)]
    return scores


def _report_status(store: RunStore) -> dict[str, Any]:
    """Whether report.json exists and is newer than every loss table (else it does not show them all)."""
    path = store.report_dir / "report.json"
    units = list(store.scores_dir.rglob("*.parquet")) if store.scores_dir.is_dir() else []
    newest = max((u.stat().st_mtime for u in units), default=0.0)
    return {
        "results": sorted(p.name for p in store.results_dir.glob("*") if p.is_file())
        if store.results_dir.is_dir()
        else [],
        "report": path.exists(),
        "up_to_date": path.exists() and path.stat().st_mtime >= newest,
    }


def report_is_current(store: RunStore) -> bool:
    """Whether report.json exists and shows every loss table (is newer than all of them).

    Args:
        store: the run store.

    Returns:
        True when report.json is up to date.
    """
    return bool(_report_status(store)["up_to_date"])


def stage_status(store: RunStore) -> dict[str, Any]:
    """What is done, running, missing and broken in a run directory, per stage (`llmaudit status`).

    Units are judged by `verify_store`'s shallow check (a unit whose file fails it counts as invalid, not done);
    when `llmaudit submit` sent the stages to SLURM, the scheduler's word on those jobs is added
    (`jobs.slurm.jobs_status`).

    Args:
        store: the run store.

    Returns:
        {"run_dir", "name", "problems", "notes", "finetune", "score", "report", "complete", "jobs"}.

    Raises:
        StoreError: the directory is not a run store, or its manifest is refused.
    """
    cfg = store.config()
    verdict = verify_store(store, cfg)
    broken: dict[int, str] = {}
    for problem in verdict.problems:
        if problem.run is not None:
            broken.setdefault(problem.run, problem.line())
    runs = _run_status(store, cfg, broken)
    scores = _unit_status(store, cfg, verdict)
    report = _report_status(store)
    complete = not (runs["missing"] or runs["running"] or scores["missing"] or scores["running"] or scores["invalid"])
    complete = complete and not verdict.problems and report["up_to_date"]
    return {
        "run_dir": str(store.root),
        "name": cfg.name,
        "problems": [p.line() for p in verdict.problems],
        "notes": list(verdict.notes),
        "finetune": runs,
        "score": scores,
        "report": report,
        "complete": complete,
        "jobs": jobs_status(store.root),
    }


def _format_jobs(jobs: dict[str, Any] | None, run_dir: str) -> list[str]:
    """The SLURM jobs of the latest submission: each stage's task states, failed tasks with their error and
    log, jobs that can never start, and the command that repairs a broken chain."""
    if jobs is None:
        return []
    lines = [
        f"jobs      SLURM, submitted {jobs['submitted']} ({jobs['submissions']} submission(s) in jobs/slurm.jsonl)"
    ]
    if not jobs["reachable"]:
        return lines + ["  no SLURM scheduler answers here (squeue, sacct): the jobs' states are unknown"]
    for stage in jobs["stages"]:
        kind = "array" if stage["array"] else "job"
        states = ", ".join(f"{n} {state}" for state, n in stage["states"].items())
        lines.append(f"  {stage['stage']:<9} {kind} {stage['job_id']}, {stage['tasks']} task(s): {states}")
        by_error: dict[str, list[dict]] = {}  # tasks that failed the same way are listed once
        for task in stage["failed"]:
            by_error.setdefault(task["error"] or "no error in its log", []).append(task)
        for error, tasks in by_error.items():
            names = ", ".join(f"{t['task']} ({t['state']})" for t in tasks)
            more = f" (and {len(tasks) - 1} more)" if len(tasks) > 1 else ""
            lines.append(f"    failed: {names}: {error}; log: {tasks[0]['log']}{more}")
        if stage["never_start"]:
            lines.append(
                f"    never starts: {', '.join(stage['never_start'])} waits (afterok) for a job that did not succeed"
            )
    if jobs["broken"]:
        lines.append(
            f"  fix: remove the cause named above (a key=value override fixes a setting), then `llmaudit submit all {run_dir}` "
            "with your cluster.* settings again (a store never supplies them): it cancels the jobs that can never start "
            "and submits only what is missing"
        )
    return lines


def _unit_name(u: dict) -> str:
    return f"{'base' if u['run'] < 0 else 'run ' + str(u['run'])}/step {u['step']}/{u['quantizer']}"


def format_status(status: dict[str, Any], *, max_listed: int = 12) -> str:
    """The status as `llmaudit status` prints it: one block per stage, each problem with its fix.

    Args:
        status: `stage_status`'s result.
        max_listed: at most this many units or runs listed per line (then a count of the rest).

    Returns:
        The text, lines joined by newlines.
    """

    def listed(items: list) -> str:
        text = ", ".join(str(i) for i in items[:max_listed])
        return text + (f", ... ({len(items) - max_listed} more)" if len(items) > max_listed else "")

    ft, sc, rp = status["finetune"], status["score"], status["report"]
    lines = [f"{status['name']}: {status['run_dir']}"]
    lines.append(
        f"finetune  {len(ft['done'])}/{ft['total']} runs done, {len(ft['running'])} running, {len(ft['missing'])} missing"
    )
    for run in ft["running"]:
        lines.append(f"  running: run {run}, {len(ft['checkpoints'][run])} checkpoint(s) so far")
    for problem in status.get("problems") or []:
        lines.append(f"  problem: {problem}")
    for note in status.get("notes") or []:
        lines.append(f"  note: {note}")
    for run in ft["missing"]:
        if run in ft.get("broken", {}):
            continue
        steps = ft["checkpoints"][run]
        resume = f"resumes from step {steps[-1]}" if steps else "not started"
        stale = " (its job died)" if run in ft["stale"] else ""
        lines.append(f"  missing: run {run}, {len(steps)} checkpoint(s), {resume}{stale}")
    lines.append(
        f"score     {sc['done']}/{sc['total']} units done, {len(sc['running'])} running, {len(sc['missing'])} missing, "
        f"{len(sc['invalid'])} invalid"
        + (f" (+ the units of {len(sc['waiting_for_runs'])} unfinished run(s))" if sc["waiting_for_runs"] else "")
    )
    for q, counts in sc["by_quantizer"].items():
        lines.append(
            f"  {q:>14}: {counts['done']} done, {counts['running']} running, {counts['missing']} missing, {counts['invalid']} invalid"
        )
    if sc["running"]:
        lines.append(f"  running: {listed([_unit_name(u) for u in sc['running']])}")
    if sc["missing"]:
        lines.append(f"  missing: {listed([_unit_name(u) for u in sc['missing']])}")
    for u in sc["invalid"][:max_listed]:
        lines.append(f"  invalid: {_unit_name(u)}: {u['why']} (`llmaudit score` moves it aside and scores it again)")
    state = "no" if not rp["report"] else ("yes" if rp["up_to_date"] else "yes, but older than some loss tables")
    lines.append(f"report    results: {listed(rp['results']) or 'none'}; report: {state}")
    lines += _format_jobs(status.get("jobs"), status["run_dir"])
    lines.append(
        "complete"
        if status["complete"]
        else "incomplete: `llmaudit submit all RUN_DIR` (or the stage commands) resumes it"
    )
    return "\n".join(lines)
