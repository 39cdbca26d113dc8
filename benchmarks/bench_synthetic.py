"""Benchmark of the synthetic validation (llmaudit.synthetic).

1. The batched trainer (all runs as one set of tensors) against the straightforward per-run loop
   (nn.Linear + torch.optim.Adam per run) on the SAME runs, in the same process; prints both times,
   the ratio and the largest parameter difference.
2. Optionally the wall time of the full experiment with its per-stage breakdown (train, r_Q +
   variants, MIS discriminators, stability) and the load average: `--full` runs it (9 data sets x
   300 runs, r_Q and baseline MIS; `stability_mis_resamples=0` unless `--default-protocol`, which
   runs exactly `llmaudit validate synthetic` with the defaults, MIS stability retrains included),
   `--results results.json` reads the times recorded by an earlier run. Target: under 300 s.

    python benchmarks/bench_synthetic.py [--runs 50] [--batch-size 1] [--full [--default-protocol] | --results PATH] [key=value ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

import torch

from llmaudit.validate.synthetic.classifier import init_linear, train_batched
from llmaudit.validate.synthetic.config import load_config
from llmaudit.validate.synthetic.data import derive_seed, make_dataset
from llmaudit.validate.synthetic.outputs import validate_synthetic_command


def _reference_impls():
    """tests/validate/reference_impls.py (the per-run loop `train_per_run`), loaded by its path."""
    path = Path(__file__).resolve().parents[1] / "tests" / "validate" / "reference_impls.py"
    spec = importlib.util.spec_from_file_location("synthetic_reference_impls", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_trainer(n_runs: int, batch_size: int, overrides: list[str]) -> dict:
    cfg = load_config(
        None, [f"n_runs={max(n_runs, 5)}", f"batch_size={batch_size}", "stability_k_runs=[5]", *overrides]
    )
    data = make_dataset(cfg, 0, cfg.k_modes[0], cfg.sigmas[0], n_runs=n_runs)
    w0, b0 = init_linear([derive_seed(cfg.seed, 0, "init", r) for r in range(n_runs)], cfg.dim)
    args = (data["x_train"], data["y_train"], w0, b0, data["order"])
    t = time.perf_counter()
    wb, bb = train_batched(*args, lr=cfg.lr, batch_size=cfg.batch_size)
    t_batched = time.perf_counter() - t
    t = time.perf_counter()
    wr, br = _reference_impls().train_per_run(*args, lr=cfg.lr, batch_size=cfg.batch_size)
    t_loop = time.perf_counter() - t
    diff = max((wb - wr).abs().max().item(), (bb - br).abs().max().item())
    return {
        "n_runs": n_runs,
        "batch_size": cfg.batch_size,
        "epochs": cfg.epochs,
        "steps_per_run": cfg.epochs * cfg.n_train // cfg.batch_size,
        "batched_s": t_batched,
        "per_run_loop_s": t_loop,
        "ratio": t_loop / t_batched,
        "max_abs_param_diff": diff,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50, help="runs trained by both trainers (default 50)")
    ap.add_argument("--batch-size", type=int, default=1)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--full", action="store_true", help="also run the full experiment and time it")
    group.add_argument("--results", type=Path, help="results.json of an earlier full run: print its wall time")
    ap.add_argument(
        "--default-protocol",
        action="store_true",
        help="with --full: keep the default stability_mis_resamples (MIS stability retrains)",
    )
    ap.add_argument("--out", type=Path, default=Path("synthetic-validation-bench"))
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the synthetic config")
    a = ap.parse_args()

    r = bench_trainer(a.runs, a.batch_size, a.overrides)
    print(
        f"trainer: {r['n_runs']} runs x {r['steps_per_run']} Adam steps (batch {r['batch_size']}, {r['epochs']} epochs), "
        f"{r['torch_threads']} torch threads"
    )
    print(f"  per-run loop : {r['per_run_loop_s']:8.2f} s")
    print(f"  batched      : {r['batched_s']:8.2f} s")
    print(f"  ratio        : {r['ratio']:8.1f} x   (max |param diff| = {r['max_abs_param_diff']:.1e})")
    if a.full:
        load0 = os.getloadavg()
        extra = [] if a.default_protocol else ["stability_mis_resamples=0"]
        res = validate_synthetic_command(None, [*extra, *a.overrides], a.out)
        wall = res["wall_time_s"]
        print(
            f"load average (1/5/15 min) before: {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, "
            f"after: " + "/".join(f"{x:.2f}" for x in os.getloadavg())
        )
    elif a.results:
        res = json.loads(a.results.read_text())
        wall = res["wall_time_s"]
    else:
        return
    cfg = res["config"]
    parts = {k: sum(d["timing_s"][k] for d in res["datasets"]) for k in ("train", "r_q", "mis", "stability")}
    print(
        f"full experiment: {len(res['datasets'])} data sets x {cfg['n_runs']} runs, batch {cfg['batch_size']}: "
        f"wall {wall:.0f} s ({wall / 60:.1f} min; target 300 s); "
        + ", ".join(f"{k} {v:.0f} s" for k, v in parts.items())
    )
    s = res["summary"]["published"]
    print(
        f"mean Spearman(r_Q, MIS) = {s['mean_spearman']:+.2f} (bootstrap std {s['boot_std_of_mean']:.2f}), "
        f"stability_mis_resamples={cfg['stability_mis_resamples']}"
    )


if __name__ == "__main__":
    main()
