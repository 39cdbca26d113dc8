"""The attacks of a report spread over worker processes (`report.processes`) against one process: wall time, and
the same numbers.

    python benchmarks/bench_report_processes.py [--runs 8] [--records 1000] [--quantizers 4] [--processes N]

Builds a synthetic loss table (`llmaudit.analyze.cost.synthetic_loss_table`: every attack's columns), runs
`run_attacks` with every attack, its bootstraps and the release decision in one process, then in N (default: this
machine's cores), and prints both wall times, the ratio and whether the two results are equal. Wall time, not CPU
time: the point is the time the user waits; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np

from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.analyze.decision import DecisionSettings
from llmaudit.common.runtime import available_cores


def timed(df, processes: int, n_boot: int) -> tuple[float, dict]:
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the synthetic table's own oddities (e.g. LiRA's normality check)
        out = run_attacks(
            df, AttackRunSettings(n_boot=n_boot, seed=0), decision=DecisionSettings(seed=0), processes=processes
        )
    return time.perf_counter() - start, out


def _canonical(result: dict) -> str:
    return json.dumps(result, sort_keys=True, default=lambda v: v.tolist() if isinstance(v, np.ndarray) else str(v))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--quantizers", type=int, default=4)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--processes", type=int, default=available_cores())
    a = ap.parse_args(argv)
    df = synthetic_loss_table(a.runs, a.records, a.quantizers, seed=0)
    print(f"{a.runs} runs x {a.records} records x {a.quantizers} quantizers, {a.n_boot} resamples, every attack")
    one_s, one = timed(df, 1, a.n_boot)
    many_s, many = timed(df, a.processes, a.n_boot)
    print(f"1 process: {one_s:.1f} s; {a.processes} processes: {many_s:.1f} s; ratio {one_s / many_s:.2f}x")
    print(f"same numbers: {_canonical(one) == _canonical(many)}")


if __name__ == "__main__":
    main()
