"""Where a scoring unit's seconds go: the phases of `llmaudit score`, timed around the functions the stage calls.

    python benchmarks/profile_units.py STORE [--checkpoints 3] [--run 0] [--json out.json]

STORE is a fine-tuned run store (e.g. the demo's: `llmaudit finetune demo-cpu --out STORE`; its scores are not
read). The store is copied without its scores to a temporary directory, and run `--run`'s first `--checkpoints` - 1
checkpoints and its final one are scored under every quantizer of the store's recipe, in this process, as
`llmaudit score` scores them (the same functions, wrapped with timers: nothing else changes). Printed per phase:
the seconds in all and per unit, and their share of the units' wall time. The phases nest (the engine's passes
run inside the validation pass with the KL hook and the pool pass), so the shares do not add up to 100%. Run it
with another checkout's code first on the import path (PYTHONPATH=OTHER/src) to profile that code on the same
units.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PHASES = [  # (module, attribute, phase): the functions the score stage calls, wrapped in turn
    ("llmaudit.score.stage", "load_checkpoint", "checkpoint: load the base, merge the adapter"),
    ("llmaudit.score.unit_scoring", "_quantized", "quantize: copy the checkpoint, apply the rule, cast"),
    ("llmaudit.score.unit_scoring", "_engine", "engine: forward passes and head (every pass)"),
    ("llmaudit.score.utility.UnitUtility", "_with_divergence", "validation pass with the KL hook (final units)"),
    ("llmaudit.score.utility.UnitUtility", "_generate", "generation: 16 greedy answers (final units)"),
    ("llmaudit.score.unit_scoring", "weights_digest", "weights digest (point id)"),
    ("llmaudit.score.stage", "write_loss_table", "loss table: validate, parquet, fsync, rename"),
    ("llmaudit.score.stage", "append_work", "work log line (lock, fsync)"),
    ("llmaudit.score.stage", "_memory_fields", "memory: garbage collection, malloc_trim, VmHWM"),
    ("llmaudit.score.stage", "running_marker", "RUNNING marker (written; its heartbeat thread started)"),
    ("llmaudit.score.stage", "claim", "unit and group locks (acquire)"),
    ("llmaudit.score.stage", "_score_claimed_unit", "UNIT (all of it)"),
]


def _resolve(dotted: str) -> Any:
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def wrap_phases(seconds: collections.Counter, calls: collections.Counter) -> None:
    """Replace every function of PHASES by a timed wrapper (context managers: the time to enter them)."""
    for owner, name, phase in PHASES:
        target = _resolve(owner)
        original = getattr(target, name)
        if isinstance(original, type) or name in ("running_marker", "claim"):
            timed = _timed_enter(original, phase, seconds, calls)
        else:
            timed = _timed_call(original, phase, seconds, calls)
        setattr(target, name, timed)


def _timed_call(fn, phase: str, seconds: collections.Counter, calls: collections.Counter):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[phase] += time.perf_counter() - t0
            calls[phase] += 1

    return timed


def _timed_enter(cm, phase: str, seconds: collections.Counter, calls: collections.Counter):
    @contextlib.contextmanager
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        with cm(*args, **kwargs) as value:
            seconds[phase] += time.perf_counter() - t0
            calls[phase] += 1
            yield value

    return timed


def profile(store: Path, run: int, checkpoints: int) -> dict[str, Any]:
    import torch  # noqa: F401  (imported before the timers)
    from tqdm.auto import tqdm

    from llmaudit.common.runtime import SHORT_DTYPE_NAMES, env_threads, pick_device, set_threads
    from llmaudit.planning.targets import resolve_target
    from llmaudit.score import stage
    from llmaudit.store.units import plan_units

    set_threads(env_threads())
    seconds, calls = collections.Counter(), collections.Counter()
    with tempfile.TemporaryDirectory(prefix="llmaudit-profile-") as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(store, copy, ignore=shutil.ignore_patterns("scores", "locks", "report"))
        cfg, store_obj = resolve_target(str(copy), [], None)
        device = pick_device(cfg.score.device)
        choice = store_obj.scoring_choice(cfg.score.dtype, device)
        cfg = cfg.model_copy(update={"score": cfg.score.with_reference(SHORT_DTYPE_NAMES[choice.dtype])})
        units = [u for u in plan_units(cfg, store_obj) if u.run == run]
        steps = sorted({u.step for u in units})
        todo = [u for u in units if u.step in set(steps[: checkpoints - 1] + steps[-1:])]
        inputs = stage.load_inputs(cfg, store_obj, device, stage.check_quantizers(cfg, device), choice.dtype)
        wrap_phases(seconds, calls)
        frozen = getattr(_resolve("llmaudit.common.memory"), "frozen_survivors", contextlib.nullcontext)
        t0 = time.perf_counter()
        with frozen():
            stage._score_todo(inputs, todo, tqdm(total=len(todo), disable=True), set())
        wall = time.perf_counter() - t0
    return {"units": len(todo), "final_units": sum(u.final for u in todo), "wall_s": wall, "phases": {
        p: {"seconds": seconds[p], "calls": calls[p]} for _, _, p in PHASES}}  # fmt: skip


def print_profile(result: dict[str, Any]) -> None:
    n, wall = result["units"], result["wall_s"]
    print(f"{n} units ({result['final_units']} final), {wall:.1f} s, {1e3 * wall / n:.0f} ms per unit")
    for phase, row in sorted(result["phases"].items(), key=lambda kv: -kv[1]["seconds"]):
        s = row["seconds"]
        print(f"  {phase:58s} {s:8.2f} s  {row['calls']:4d} calls  {1e3 * s / n:7.1f} ms/unit  {100 * s / wall:5.1f}%")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--run", type=int, default=0)
    ap.add_argument("--checkpoints", type=int, default=3, help="the run's first N-1 checkpoints and its final one")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    result = profile(args.store, args.run, args.checkpoints)
    print_profile(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
