"""Reading a store's loss tables, a baseline checkout against this one, one after the other on the same machine.

    python benchmarks/bench_read_tables.py SCORES --baseline ../llmaudit-landed/src [--repeats 3] [--full]

SCORES is an audited store's scores directory (e.g. `llmaudit audit`'s `demo-cpu/scores`); it is only read. For each
code (the baseline's `src` directory, then this checkout's), in a fresh process with that code first on the import
path: the light table the analysis reads (`read_store_table` over every unit file, in the analysis' order) and, with
`--full`, every file's whole frame (`read_loss_table`), timed as the best of `--repeats` reads (process CPU
seconds, then wall seconds). Printed: both codes' seconds and their ratio; then the frames of both codes compared
with pandas' assert_frame_equal, the per-row token arrays value by value and dtype by dtype (exit 1 where they
differ). Timings move with the machine's load: read the ratios, and run it on a quiet machine for absolute seconds.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
CURRENT_SRC = HERE.parent / "src"


def store_units(scores: Path) -> list:
    """The unit files below a scores directory, as `llmaudit.analyze.store_table.UnitFile`s in the analysis' order
    (run, step, quantizer): `scores/base/Q.parquet` is the reference run, `scores/run-R/step-S/Q.parquet` the others."""
    from llmaudit.analyze.store_table import UnitFile
    from llmaudit.store.losstable import REFERENCE_RUN

    units = []
    for path in scores.rglob("*.parquet"):
        if path.parent.name == "base":
            units.append(UnitFile(REFERENCE_RUN, 0, path.stem, path))
        else:
            units.append(UnitFile(int(path.parent.parent.name[4:]), int(path.parent.name[5:]), path.stem, path))
    return sorted(units, key=lambda u: (u.run, u.step, u.quantizer))


def measure(scores: Path, repeats: int, full: bool, out: Path) -> None:
    """In this process (the code on the import path): time the reads and pickle {name: (cpu, wall, frame)} to `out`."""
    from llmaudit.analyze.store_table import read_store_table
    from llmaudit.store.losstable import read_loss_table

    units = store_units(scores)
    reads = {"read_store_table (light)": lambda: read_store_table(scores, units).light}
    if full:
        reads["read_loss_table (full)"] = lambda: read_loss_table(scores, files=[u.path for u in units])
    results = {}
    for name, read in reads.items():
        best_cpu = best_wall = float("inf")
        for _ in range(repeats):
            cpu, wall = time.process_time(), time.perf_counter()
            frame = read()
            best_cpu = min(best_cpu, time.process_time() - cpu)
            best_wall = min(best_wall, time.perf_counter() - wall)
        results[name] = (best_cpu, best_wall, frame)
    out.write_bytes(pickle.dumps(results))


def run_code(src: Path, args: argparse.Namespace, out: Path) -> dict:
    """Run `measure` in a fresh process with `src` first on the import path; its results."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = [sys.executable, str(Path(__file__).resolve()), str(args.scores), "--measure", str(out)]
    command += ["--repeats", str(args.repeats)] + (["--full"] if args.full else [])
    subprocess.run(command, env=env, check=True)
    return pickle.loads(out.read_bytes())


def same_frames(base: pd.DataFrame, current: pd.DataFrame) -> list[str]:
    """Where two loss-table frames differ (empty when every value, dtype and per-row array is the same)."""
    try:
        pd.testing.assert_frame_equal(base, current, check_exact=True)
    except AssertionError as exc:
        return [str(exc).splitlines()[0]]
    problems = []
    for col in base.columns:
        if base[col].dtype != object:
            continue
        for i, (a, b) in enumerate(zip(base[col], current[col])):
            arrays = isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            if (isinstance(a, np.ndarray) or isinstance(b, np.ndarray)) and not (
                arrays and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
            ):
                problems.append(f"{col} row {i}: {a!r} != {b!r}")
                break
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scores", type=Path)
    parser.add_argument("--baseline", type=Path, help="the baseline checkout's src directory")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--full", action="store_true", help="also read every file's whole frame")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.scores, args.repeats, args.full, args.measure)
        return 0
    if args.baseline is None:
        parser.error("--baseline is required")
    with tempfile.TemporaryDirectory() as tmp:
        base = run_code(args.baseline.resolve(), args, Path(tmp) / "base.pkl")
        current = run_code(CURRENT_SRC, args, Path(tmp) / "current.pkl")
    failed = False
    for name, (base_cpu, base_wall, base_frame) in base.items():
        cpu, wall, frame = current[name]
        print(
            f"{name}: baseline {base_cpu:.2f} CPU-s ({base_wall:.2f} s wall), current {cpu:.2f} CPU-s "
            f"({wall:.2f} s wall), current/baseline CPU {cpu / base_cpu:.3f}"
        )
        problems = same_frames(base_frame, frame)
        print(f"  frames equal ({len(frame)} rows): {not problems}" + "".join(f"\n  {p}" for p in problems[:5]))
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
