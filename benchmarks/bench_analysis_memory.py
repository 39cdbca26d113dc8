"""Benchmark of the analysis' memory: the loss tables read whole (the landed path) against the light table with each
quantizer's rows read by its attacks (`llmaudit.analyze.store_table`, what `llmaudit report` reads a store with).

A synthetic loss table (`llmaudit.analyze.cost.synthetic_loss_table`: every attack's columns, base rows, validation
texts) is written as a store's scoring units (one parquet file per run and quantizer, the base model's units apart).
Each path then runs in a fresh interpreter, one after the other: read the units, attack every quantizer
(`run_attacks`, every attack the table allows, `--resamples` bootstrap resamples, one process) and measure
memorization (`memorization_from_table`), and reports its peak resident memory (VmHWM), the memory of the
imports alone, its seconds, and a digest of its results. The ratio printed is the whole table's peak over the
light table's, above what the imports hold; the two digests must be equal (the same numbers).

    python benchmarks/bench_analysis_memory.py [--runs 6] [--records 4000] [--quantizers 6] [--resamples 20]
    python benchmarks/bench_analysis_memory.py --quick     # seconds
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.matrices import base_quantizer
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.analyze.memorization import memorization_from_table
from llmaudit.analyze.store_table import Unit, read_store_table
from llmaudit.store.losstable import REFERENCE_RUN, read_loss_table, write_loss_table


def write_units(root: Path, runs: int, records: int, quantizers: int) -> list[Unit]:
    """The synthetic table written as one file per (run, quantizer) (one checkpoint each); the units, sorted."""
    table = synthetic_loss_table(runs, records, quantizers, seed=5)
    units = []
    for (run, step, q), rows in table.groupby(["run", "checkpoint", "quantizer"], sort=True):
        name = "base" if run == REFERENCE_RUN else f"run-{int(run):03d}"
        path = write_loss_table(rows.reset_index(drop=True), root / name / f"{q}.parquet")
        units.append(Unit(int(run), int(step), str(q), path))
    return units


def _peak_mib() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB; no /proc: may count the parent's


def child(mode: str, units_file: Path, resamples: int) -> dict:
    """One path in this process: the peak memory of its imports, then of the analysis; seconds; results' digest."""
    imports = _peak_mib()
    units = [Unit(run, step, q, Path(p)) for run, step, q, p in json.loads(units_file.read_text())]
    start = time.perf_counter()
    if mode == "whole":
        table, rows_of = read_loss_table(units_file.parent, files=[u.path for u in units]), None
    else:
        store_table = read_store_table(units_file.parent, units)
        table, rows_of = store_table.light, store_table.rows_of
    attacks = run_attacks(table, AttackRunSettings(n_boot=resamples, seed=1), rows_of=rows_of)
    base_q = base_quantizer(table, "fp32")  # memorization's reference: the base model's unit under it alone
    memorization = memorization_from_table(table[(table["run"] != REFERENCE_RUN) | (table["quantizer"] == base_q)])
    seconds = time.perf_counter() - start
    text = json.dumps([attacks, memorization], sort_keys=True, default=_plain)
    return {
        "mode": mode,
        "imports_mib": imports,
        "peak_mib": _peak_mib(),
        "seconds": seconds,
        "digest": hashlib.sha256(text.encode()).hexdigest()[:16],
    }


def _plain(value):
    return value.tolist() if isinstance(value, np.ndarray) else str(value)


def run_path(mode: str, units_file: Path, resamples: int) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(units_file), "--resamples", str(resamples)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--quantizers", type=int, default=6)
    parser.add_argument("--resamples", type=int, default=20)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "UNITS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]), args.resamples)))
        return
    if args.quick:
        args.runs, args.records, args.quantizers, args.resamples = 3, 60, 3, 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        units = write_units(root, args.runs, args.records, args.quantizers)
        size = sum(u.path.stat().st_size for u in units) / 2**20
        units_file = root / "units.json"
        units_file.write_text(json.dumps([[u.run, u.step, u.quantizer, str(u.path)] for u in units]))
        print(
            f"{args.runs} runs x {args.records} pool records x {args.quantizers} quantizers: "
            f"{len(units)} unit files, {size:.1f} MiB of parquet"
        )
        results = [run_path(mode, units_file, args.resamples) for mode in ("whole", "light")]
    for r in results:
        print(
            f"  {r['mode']:>5}: peak {r['peak_mib']:8.1f} MiB (imports {r['imports_mib']:6.1f}), "
            f"{r['seconds']:6.1f} s, results {r['digest']}"
        )
    whole, light = results
    ratio = (whole["peak_mib"] - whole["imports_mib"]) / max(light["peak_mib"] - light["imports_mib"], 1e-9)
    print(
        f"whole / light peak above the imports: {ratio:.2f}x; time light / whole: "
        f"{light['seconds'] / whole['seconds']:.2f}x; same results: {whole['digest'] == light['digest']}"
    )
    if whole["digest"] != light["digest"]:
        raise SystemExit("the two paths gave different results")


if __name__ == "__main__":
    main()
