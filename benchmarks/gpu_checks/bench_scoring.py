"""Check b of benchmarks/gpu_check.py: benchmarks/bench_scoring.py at Qwen2.5's vocabulary and Qwen2.5-0.5B's body
on a GPU (a toy size on CPU): the engine's speed-up over the naive loop, its share of the bf16 matmul peak,
peak memory per method and the losses against the naive loop."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from .common import ROOT, Result, _one_line

BENCH_GOALS = {"ratio": 10.0, "of_peak": 0.40}
BENCH_DLOSS_TOL = {"bfloat16": 0.05, "float32": 1e-5}


def check_bench_scoring(args: argparse.Namespace, result: Result) -> None:
    out = Path(args.work) / "bench_scoring.json"
    out.unlink(missing_ok=True)
    if args.device == "cuda":  # Qwen2.5-0.5B's body (kv heads aside) and vocabulary
        size = ["--vocab", "151936", "--hidden", "896", "--intermediate", "4864", "--layers", "24", "--heads", "14"]
        size += ["--samples", "256", "--repeats", "3"]
    else:  # toy
        size = ["--vocab", "2048", "--hidden", "64", "--layers", "2", "--heads", "4", "--samples", "12"]
        size += ["--min-len", "16", "--max-len", "96", "--repeats", "1", "--peak-n", "512", "--threads", "1"]
        size += ["--memory", "in-process"]  # three fewer processes: a rough figure, this is not a CPU benchmark
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_scoring.py"), "--device", args.device, *size]
    cmd += ["--no-scaling", "--json", str(out)]
    result.detail(command=" ".join(cmd[1:]))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    print(done.stdout + done.stderr)
    if done.returncode or not out.exists():
        result.set(status="fail", error=f"bench_scoring exit {done.returncode}: {_one_line(done.stderr[-800:], 800)}")
        return
    bench = json.loads(out.read_text())
    methods = bench["methods"]
    result.detail(bench=bench, table=[line for line in done.stdout.splitlines() if line.strip()][-12:])
    tol = BENCH_DLOSS_TOL.get(bench["dtype"], 1e-5)
    parts = []
    for name, r in methods.items():
        mib = r["peak_bytes"] / 2**20
        if name == "naive":
            parts.append(f"naive {r['tokens_per_s']:.0f} tok/s, peak {mib:.0f} MiB")
        else:
            parts.append(
                f"{name.removeprefix('engine ')}: {r['ratio']:.1f}x, {r['of_peak']:.0%} of peak, {mib:.0f} MiB, max|dloss| {r['max_dloss']:.1e}"
            )
    figure = f"vocab {bench['model']['vocab']}, {bench['dtype']}: " + "; ".join(parts)
    off = methods["engine vocab_stats=off"]
    problems = [
        f"{n}: max |dloss| {r['max_dloss']:.2e} > {tol}" for n, r in methods.items() if (r["max_dloss"] or 0) > tol
    ]
    if args.device == "cuda":
        if off["ratio"] < BENCH_GOALS["ratio"]:
            problems.append(f"ratio {off['ratio']:.1f} < {BENCH_GOALS['ratio']:.0f}")
        if off["of_peak"] < BENCH_GOALS["of_peak"]:
            problems.append(f"{off['of_peak']:.0%} of the bf16 matmul peak < {BENCH_GOALS['of_peak']:.0%}")
    else:
        figure += " (goals >= 10x / >= 40% are GPU goals: not applicable to this CPU toy size)"
    result.set(status="fail" if problems else "pass", figure=figure, error="; ".join(problems) or None)
