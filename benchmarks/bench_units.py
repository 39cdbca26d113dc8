"""Scoring units of a real store, a baseline checkout against this one, one after the other on the same machine.

    python benchmarks/bench_units.py STORE --baseline ../llmaudit-landed/src [--run 0] [--quantizers bf16 bnb-int8 ...]
        [--out DIR] [--threads 1] [--json out.json]

STORE is a fine-tuned run store (e.g. `llmaudit finetune smollm2-135m-verdict --out STORE`, or any audited store:
its scores are not read). For each code (the baseline's `src` directory, then this checkout's), in a fresh
process with that code first on the import path: the store is copied without its scores, and the units of one run
(its first and its final checkpoint) under the chosen quantizers are scored as `llmaudit score` scores them (the
same functions: checkpoint groups, claims, quantization, the engine, the utility columns, the loss tables and the
work log), with the threads a scoring process of `llmaudit audit` gets (`--threads`, default 1: two processes on
two cores). Printed per unit: the seconds of both codes from their work logs and their ratio; then whether every
value of every loss table is the same in both (a code that claims to change no number is checked to the last bit)
and the peak resident memory of each process (VmHWM). Timings move with the machine's load: read the ratios, and
run it on a quiet machine for absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CURRENT_SRC = HERE.parent / "src"


def score_units(store: Path, run: int, quantizers: list[str]) -> dict[str, Any]:
    """In this process (the code on the import path): score run `run`'s first and final checkpoints under
    `quantizers` in `store`. Returns {"seconds": wall of the scoring, "vmhwm_mib": this process's peak}."""
    from tqdm.auto import tqdm

    from llmaudit.common.memory import peak_rss_mib
    from llmaudit.common.runtime import SHORT_DTYPE_NAMES, env_threads, pick_device, set_threads
    from llmaudit.planning.targets import resolve_target
    from llmaudit.score import stage
    from llmaudit.store.units import plan_units

    set_threads(env_threads())
    cfg, store_obj = resolve_target(str(store), [], None)
    device = pick_device(cfg.score.device)
    choice = store_obj.scoring_choice(cfg.score.dtype, device)
    score_cfg = cfg.score.with_reference(SHORT_DTYPE_NAMES[choice.dtype])
    unknown = sorted(set(quantizers) - set(score_cfg.quantizers))
    if unknown:
        raise SystemExit(f"bench_units: {unknown} are not quantizers of {store} ({score_cfg.quantizers})")
    cfg = cfg.model_copy(update={"score": score_cfg.model_copy(update={"quantizers": list(quantizers)})})
    chosen = stage.check_quantizers(cfg, device)
    units = [u for u in plan_units(cfg, store_obj) if u.run == run]
    steps = sorted({u.step for u in units})
    todo = [u for u in units if u.step in (steps[0], steps[-1])]
    inputs = stage.load_inputs(cfg, store_obj, device, chosen, choice.dtype)
    t0 = time.perf_counter()
    bar = tqdm(total=len(todo), disable=True)
    frozen = getattr(__import__("llmaudit.common.memory", fromlist=["x"]), "frozen_survivors", None)
    if frozen is None:
        stage._score_todo(inputs, todo, bar, set())
    else:
        with frozen():
            stage._score_todo(inputs, todo, bar, set())
    return {"seconds": time.perf_counter() - t0, "units": len(todo), "vmhwm_mib": peak_rss_mib()}


def copy_store(source: Path, target: Path) -> None:
    """The store without its scores, locks and reports (what `llmaudit score` starts from)."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("scores", "locks", "report"))


def run_code(label: str, src: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One code's units in a fresh process; its work log records and the child's own result."""
    target = args.out / label
    copy_store(args.store, target)
    env = dict(os.environ, PYTHONPATH=str(src), LLMAUDIT_THREADS=str(args.threads), HF_HUB_OFFLINE="1")
    result_path = args.out / f"{label}.json"
    command = [sys.executable, str(Path(__file__).resolve()), str(target), "--child", str(result_path)]
    command += ["--run", str(args.run), "--quantizers", *args.quantizers]
    t0 = time.perf_counter()
    subprocess.run(command, env=env, check=True)
    result = json.loads(result_path.read_text())
    result["process_seconds"] = time.perf_counter() - t0
    log = target / "scores" / "worklog.jsonl"
    result["units_log"] = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    print(f"[bench_units] {label}: {result['units']} units in {result['seconds']:.1f} s", file=sys.stderr, flush=True)
    return result


def same_tables(a: Path, b: Path) -> tuple[int, list[str]]:
    """(tables compared, the names of those whose values differ): every column, token lists included."""
    import pandas as pd

    differ, n = [], 0
    for path in sorted((a / "scores").rglob("*.parquet")):
        other = b / path.relative_to(a)
        n += 1
        left, right = pd.read_parquet(path), pd.read_parquet(other) if other.exists() else None
        if right is None or list(left.columns) != list(right.columns) or len(left) != len(right):
            differ.append(str(path.relative_to(a)))
            continue
        for column in left.columns:
            if not all(_equal(x, y) for x, y in zip(left[column], right[column], strict=True)):
                differ.append(f"{path.relative_to(a)}:{column}")
    return n, differ


def _equal(x: Any, y: Any) -> bool:
    import numpy as np

    if x is None or y is None:
        return x is None and y is None
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
    if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
        return True
    return x == y


def report(results: dict[str, dict], tables: tuple[int, list[str]]) -> None:
    base, cur = results["baseline"], results["current"]
    key = lambda r: (r["run"], r["step"], r["quantizer"])  # noqa: E731
    b_units = {key(r): r for r in base["units_log"]}
    print(f"{'unit':34s} {'baseline s':>11s} {'current s':>10s} {'baseline/current':>17s}")
    totals = [0.0, 0.0]
    for r in cur["units_log"]:
        b = b_units.get(key(r))
        if b is None:
            continue
        totals[0] += b["seconds"]
        totals[1] += r["seconds"]
        name = f"run {r['run']} step {r['step']} {r['quantizer']} ({r['samples']} samples)"
        print(f"{name:34s} {b['seconds']:11.1f} {r['seconds']:10.1f} {b['seconds'] / r['seconds']:16.2f}x")
    print(f"{'all units':34s} {totals[0]:11.1f} {totals[1]:10.1f} {totals[0] / totals[1]:16.2f}x")
    print(
        f"peak memory (VmHWM) of the scoring process: baseline {base['vmhwm_mib']:.0f} MiB, current {cur['vmhwm_mib']:.0f} MiB"
    )
    n, differ = tables
    print(f"loss tables compared: {n}; values that differ: {len(differ)}" + (f" ({differ[:6]})" if differ else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--baseline", type=Path, help="the baseline checkout's src directory")
    ap.add_argument("--run", type=int, default=0)
    ap.add_argument("--quantizers", nargs="+", default=["bf16", "bnb-int8", "gptq-4", "gptq-8", "hqq-4", "bnb-nf4"])
    ap.add_argument("--out", type=Path, default=Path("bench-units-out"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        args.child.write_text(json.dumps(score_units(args.store, args.run, args.quantizers)))
        return 0
    if args.baseline is None:
        ap.error("--baseline SRC is required (the baseline checkout's src directory)")
    args.out.mkdir(parents=True, exist_ok=True)
    results = {
        label: run_code(label, src, args) for label, src in (("baseline", args.baseline), ("current", CURRENT_SRC))
    }
    tables = same_tables(args.out / "baseline", args.out / "current")
    report(results, tables)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "tables_differ": tables[1]}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
