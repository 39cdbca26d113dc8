"""`llmaudit status`: what is done, running and missing in a run directory, per stage."""

from __future__ import annotations

from typing import Any

from llmaudit.score.units import plan_units
from llmaudit.store.markers import marker_state, run_marker_path, unit_marker_path
from llmaudit.store.run_store import RunStore


def stage_status(store: RunStore) -> dict[str, Any]:
    """What is done, running and missing in a run directory, per stage (the data of `llmaudit status`)."""

    cfg = store.config()
    runs: dict[str, Any] = {
        "total": cfg.train.runs,
        "done": [],
        "running": [],
        "missing": [],
        "stale": [],
        "checkpoints": {},
    }
    for run in range(cfg.train.runs):
        steps = store.checkpoints(run)
        runs["checkpoints"][run] = steps
        if store.run_done(run):
            runs["done"].append(run)
            continue
        state = marker_state(run_marker_path(store, run))
        runs["running" if state == "running" else "missing"].append(run)
        if state == "stale":
            runs["stale"].append(run)

    units = plan_units(cfg, store)
    by_quantizer: dict[str, dict[str, int]] = {q: {"done": 0, "running": 0, "missing": 0} for q in cfg.score.quantizers}
    scores: dict[str, Any] = {
        "total": len(units),
        "done": 0,
        "running": [],
        "missing": [],
        "stale": [],
        "by_quantizer": by_quantizer,
    }
    for unit in units:
        key = {"run": unit.run, "step": unit.step, "quantizer": unit.quantizer}
        if store.unit_path(unit.run, unit.step, unit.quantizer).exists():
            scores["done"] += 1
            by_quantizer.setdefault(unit.quantizer, {"done": 0, "running": 0, "missing": 0})["done"] += 1
            continue
        state = marker_state(unit_marker_path(store, unit.run, unit.step, unit.quantizer))
        bucket = "running" if state == "running" else "missing"
        scores[bucket].append(key)
        by_quantizer.setdefault(unit.quantizer, {"done": 0, "running": 0, "missing": 0})[bucket] += 1
        if state == "stale":
            scores["stale"].append(key)
    # Units of unfinished runs cannot be listed yet: their checkpoints do not exist.
    scores["waiting_for_runs"] = [r for r in range(cfg.train.runs) if not store.run_done(r)]

    report = {
        "results": sorted(p.name for p in store.results_dir.glob("*") if p.is_file())
        if store.results_dir.is_dir()
        else [],
        "report": (store.report_dir / "report.json").exists(),
    }
    complete = (
        not runs["missing"]
        and not runs["running"]
        and not scores["missing"]
        and not scores["running"]
        and report["report"]
    )
    return {
        "run_dir": str(store.root),
        "name": cfg.name,
        "finetune": runs,
        "score": scores,
        "report": report,
        "complete": complete,
    }


def format_status(status: dict[str, Any], *, max_listed: int = 12) -> str:
    def listed(items: list) -> str:
        text = ", ".join(str(i) for i in items[:max_listed])
        return text + (f", ... ({len(items) - max_listed} more)" if len(items) > max_listed else "")

    def unit_name(u: dict) -> str:
        return f"{'base' if u['run'] < 0 else 'run ' + str(u['run'])}/step {u['step']}/{u['quantizer']}"

    ft, sc, rp = status["finetune"], status["score"], status["report"]
    lines = [f"{status['name']}: {status['run_dir']}"]
    lines.append(
        f"finetune  {len(ft['done'])}/{ft['total']} runs done, {len(ft['running'])} running, {len(ft['missing'])} missing"
    )
    for run in ft["running"]:
        lines.append(f"  running: run {run}, {len(ft['checkpoints'][run])} checkpoint(s) so far")
    for run in ft["missing"]:
        steps = ft["checkpoints"][run]
        resume = f"resumes from step {steps[-1]}" if steps else "not started"
        stale = " (its job died)" if run in ft["stale"] else ""
        lines.append(f"  missing: run {run}, {len(steps)} checkpoint(s), {resume}{stale}")
    lines.append(
        f"score     {sc['done']}/{sc['total']} units done, {len(sc['running'])} running, {len(sc['missing'])} missing"
        + (f" (+ the units of {len(sc['waiting_for_runs'])} unfinished run(s))" if sc["waiting_for_runs"] else "")
    )
    for q, counts in sc["by_quantizer"].items():
        lines.append(f"  {q:>14}: {counts['done']} done, {counts['running']} running, {counts['missing']} missing")
    if sc["running"]:
        lines.append(f"  running: {listed([unit_name(u) for u in sc['running']])}")
    if sc["missing"]:
        lines.append(f"  missing: {listed([unit_name(u) for u in sc['missing']])}")
    lines.append(f"report    results: {listed(rp['results']) or 'none'}; report: {'yes' if rp['report'] else 'no'}")
    lines.append(
        "complete"
        if status["complete"]
        else "incomplete: `llmaudit submit all RUN_DIR` (or the stage commands) resumes it"
    )
    return "\n".join(lines)
