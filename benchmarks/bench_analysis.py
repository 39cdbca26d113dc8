"""Benchmark of the analysis (what `llmaudit attack` computes: `run_attacks`, with the release decision under
`--decision`) on synthetic loss tables, before and after issue 33's array arithmetic.

For each size (runs x records per quantizer x quantizers; every attack the table allows: base rows, the base
under every quantizer, validation texts, top-1 flags, vocabulary statistics, zlib lengths), in one process and
on the same table: the seconds of `run_attacks` with `--resamples` (and with `--decision`, the release decision's
own resamples), on the landed path (`landed()`: the text and token attacks one text at a time, the bootstrap over
distinct-score groups, the calibrated threshold's quantile per entry, the decision's running weights over every
row of every resample, benchmarks/landed_decision.py) and the current one; their ratio; and the largest
difference between the two results' numbers (the same seed gives the same intervals; average precision to
rounding). Times are CPU seconds of this process with one BLAS/OpenMP thread, as a report worker
runs on a machine it fills (other processes on a shared machine do not count; idle pool threads spinning between
calls would), split into
the resampled intervals (`bootstrap_ci`, `_calibrated_ci`; per_sample's weighted means are counted as fixed), the
decision's resampled counts and AUROCs, and the rest ("fixed": scores, point estimates, calibration).
Then, per path, the growth exponent of each part in the scores per quantizer (least squares of log seconds on
log runs x records), and the extrapolated time of the paper's grid on this machine: 20 runs x 20,000 records x
12 quantizers, every attack, 1,000 resamples (and 1,000 decision resamples with `--decision`), as quantizers x
[fixed(n) + 1000 x per-resample(n) + 1000 x per-decision-resample(n)], each part scaled from the largest size
measured by its exponent, at least 1 (one process; the report runs `report.processes` quantizers at a time).

    python benchmarks/bench_analysis.py [--runs 8] [--records 250 500 1000] [--quantizers 2] [--resamples 100] \\
        [--attacks ...] [--decision] [--no-landed] [--json PATH]
    python benchmarks/bench_analysis.py --quick      # the test suite's size (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.util
import json
import math
import sys
import time
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
from scipy import stats
from threadpoolctl import threadpool_limits

from llmaudit.analyze import metrics, roc_kernel
from llmaudit.analyze.attacks.catalog import ez_mia_attacks, single_model, wbc_attacks
from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.registry import registered_attacks
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.analyze.decision import DecisionSettings
from llmaudit.common.runtime import available_cores

PAPER = {"runs": 20, "records": 20_000, "quantizers": 12, "resamples": 1000}


synthetic_table = synthetic_loss_table  # the table `llmaudit plan` times too (llmaudit.analyze.cost)


def _load(name: str, path: Path):
    """A module loaded by its path (this file also runs outside benchmarks/: the tests), registered under `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass of the module looks its module up while it is built
    spec.loader.exec_module(module)
    return module


LANDED_DECISION = _load("landed_decision", Path(__file__).with_name("landed_decision.py"))
REFERENCE = _load("reference_impls", Path(__file__).resolve().parents[1] / "tests" / "analyze" / "reference_impls.py")
"""tests/analyze/reference_impls.py: the text attacks one text at a time, the bootstrap over distinct-score groups."""
decide = importlib.import_module("llmaudit.analyze.decision.decide")  # the module (the package exports its function)


def landed_calibrated_threshold(alpha: float, n_ref=None, t_cutoff: float = metrics.T_CUTOFF):
    """`calibrated_threshold` as it landed: the Student-t quantile computed for every entry of n_ref."""
    normal = float(stats.norm.ppf(1 - alpha))
    if n_ref is None:
        return normal
    n = np.asarray(n_ref, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        student = stats.t.ppf(1 - alpha, df=np.where(n >= 2, n - 1, np.nan)) * np.sqrt(1 + 1 / n)
    thr = np.where(n >= t_cutoff, normal, student)
    return float(thr) if thr.ndim == 0 else thr


@contextlib.contextmanager
def landed():
    """The analysis as it landed before issue 33: WBC, EZ-MIA, min-k% and Min-K%++ one text at a time, the
    bootstrap over distinct-score groups (tests/analyze/reference_impls.py: `*_per_sample`,
    `group_bootstrap_stats`), the calibrated threshold's quantile per entry (`landed_calibrated_threshold`),
    the decision's counts and AUROCs over every row of every resample (benchmarks/landed_decision.py)."""
    with (
        mock.patch.object(wbc_attacks, "wbc_score", REFERENCE.wbc_score_per_sample),
        mock.patch.object(ez_mia_attacks, "ez_mia_score", REFERENCE.ez_mia_score_per_sample),
        mock.patch.object(single_model, "min_k_score", REFERENCE.min_k_score_per_sample),
        mock.patch.object(single_model, "min_k_plus_plus_score", REFERENCE.min_k_plus_plus_score_per_sample),
        mock.patch.object(metrics, "bootstrap_stats", REFERENCE.group_bootstrap_stats),
        mock.patch.object(metrics, "calibrated_threshold", landed_calibrated_threshold),
        mock.patch.object(decide, "calibrated_counts", LANDED_DECISION.landed_calibrated_counts),
        mock.patch.object(decide, "weighted_auroc", LANDED_DECISION.landed_weighted_auroc),
    ):
        yield


class ResamplingClock:
    """CPU seconds spent in the resampled intervals (`bootstrap_ci` and `_calibrated_ci`) and in the decision's
    resampled counts and AUROCs (`decide.calibrated_counts`, `empirical_counts`, `weighted_auroc`), outermost calls
    only, while installed (`install`)."""

    def __init__(self) -> None:
        self.seconds = {"intervals": 0.0, "decision": 0.0}
        self._depth = 0

    def wrap(self, fn, bucket: str):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._depth += 1
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds[bucket] += time.process_time() - start

        return timed

    @contextlib.contextmanager
    def install(self):
        patches = [(metrics, "bootstrap_ci", "intervals"), (metrics, "_calibrated_ci", "intervals")]
        patches += [(decide, name, "decision") for name in ("calibrated_counts", "empirical_counts", "weighted_auroc")]
        with contextlib.ExitStack() as stack:
            for module, name, bucket in patches:
                stack.enter_context(mock.patch.object(module, name, self.wrap(getattr(module, name), bucket)))
            yield self


def analyse(df: pd.DataFrame, n_boot: int, decision: bool = False, attacks=registered_attacks()) -> tuple[dict, dict]:
    """CPU seconds of `run_attacks` on `attacks` (with the release decision, as `llmaudit attack` runs it, when
    `decision`): {"total_s", "resampling_s", "decision_s", "fixed_s", "per_resample_s", "per_decision_resample_s"},
    and its result. CPU time of this process, so that other processes on the machine do not count."""
    clock = ResamplingClock()
    start = time.process_time()
    settings = DecisionSettings(seed=0) if decision else None
    with warnings.catch_warnings(), clock.install(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore")  # the synthetic table's own oddities (e.g. LiRA's normality check)
        out = run_attacks(df, AttackRunSettings(n_boot=n_boot, seed=0, attacks=attacks), decision=settings)
    total = time.process_time() - start
    boot, dec = clock.seconds["intervals"], clock.seconds["decision"]
    return {
        "total_s": total,
        "resampling_s": boot,
        "decision_s": dec,
        "fixed_s": total - boot - dec,
        "per_resample_s": boot / n_boot if n_boot else 0.0,
        "per_decision_resample_s": dec / settings.resamples if settings else 0.0,
    }, out


def max_difference(a, b) -> float:
    """Largest |difference| between the numbers of two results of the same shape (inf if the shapes differ)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return math.inf
        return max((max_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return math.inf
        return max((max_difference(x, y) for x, y in zip(a, b)), default=0.0)
    if isinstance(a, bool | str | None) or isinstance(b, bool | str | None):
        return 0.0 if a == b else math.inf
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isnan(a) and math.isnan(b):
            return 0.0
        return abs(float(a) - float(b))
    return 0.0 if a == b else math.inf


def measure(a: argparse.Namespace, records: int) -> dict:
    """One size: each path's CPU seconds, split into the resampled intervals and the rest; the results' largest
    difference."""
    runs, quantizers, resamples, decision = a.runs, a.quantizers, a.resamples, a.decision
    with_landed, attacks = not a.no_landed, tuple(a.attacks)
    df = synthetic_table(runs, records, quantizers)
    row = {"runs": runs, "records": records, "quantizers": quantizers, "resamples": resamples, "table_rows": len(df)}
    results = {}
    for path in ("landed", "current") if with_landed else ("current",):
        with landed() if path == "landed" else contextlib.nullcontext():
            row[path], results[path] = analyse(df, resamples, decision, attacks)
    if with_landed:
        row["ratio"] = row["landed"]["total_s"] / row["current"]["total_s"]
        row["max_abs_difference"] = max_difference(results["landed"]["quantizers"], results["current"]["quantizers"])
    return row


def exponent(sizes: list[float], seconds: list[float]) -> float:
    """Least-squares slope of log seconds on log size (1: linear)."""
    x, y = np.log(np.asarray(sizes, float)), np.log(np.maximum(np.asarray(seconds, float), 1e-6))
    return float(np.polyfit(x, y, 1)[0]) if len(set(sizes)) > 1 else float("nan")


def extrapolate(rows: list[dict], path: str) -> dict:
    """Growth exponents of the fixed, per-resample and per-decision-resample seconds in runs x records, and the
    paper grid's seconds in one process."""
    n = [r["runs"] * r["records"] for r in rows]
    parts = {
        key: [r[path][key] / r["quantizers"] for r in rows]
        for key in ("fixed_s", "per_resample_s", "per_decision_resample_s")
    }
    k = {key: exponent(n, v) for key, v in parts.items()}
    scale = PAPER["runs"] * PAPER["records"] / n[-1]
    # below 1 the sizes measured are still dominated by per-call overheads: the work itself grows at least linearly
    grow = lambda e: scale ** (max(e, 1.0) if math.isfinite(e) else 1.0)  # noqa: E731
    per_quantizer = {key: v[-1] * grow(k[key]) for key, v in parts.items()}
    one = per_quantizer["fixed_s"] + PAPER["resamples"] * (
        per_quantizer["per_resample_s"] + per_quantizer["per_decision_resample_s"]
    )
    paper_s = PAPER["quantizers"] * one
    cores = available_cores()
    return {
        "paper_grid_on_cores_s": -(-PAPER["quantizers"] // cores) * one,
        "cores": cores,
        "exponent_fixed": k["fixed_s"],
        "exponent_per_resample": k["per_resample_s"],
        "exponent_per_decision_resample": k["per_decision_resample_s"],
        "paper_grid_s": paper_s,
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--records", type=int, nargs="+", default=[250, 500, 1000], help="pool records per size")
    ap.add_argument("--quantizers", type=int, default=2)
    ap.add_argument("--resamples", type=int, default=100)
    ap.add_argument("--no-landed", action="store_true", help="time the current path only")
    ap.add_argument(
        "--decision",
        action="store_true",
        help="also run the release decision (its own decision_resamples), as `llmaudit attack` does",
    )
    ap.add_argument("--attacks", nargs="+", default=list(registered_attacks()), help="default: every attack")
    ap.add_argument("--quick", action="store_true", help="6 runs x 40 / 80 records, 10 resamples, 4 attacks")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if a.quick:
        a.runs, a.records, a.resamples, a.attacks = 6, [40, 80], 10, ["loss", "wbc", "wbc_skip_long", "ref"]
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    roc_kernel.warm_up()  # the compiled bootstrap pass: compiled before anything is timed
    rows = []
    for records in a.records:
        r = measure(a, records)
        rows.append(r)
        line = f"{r['runs']} runs x {r['records']} records x {r['quantizers']} quantizers, {r['resamples']} resamples:"
        for path in ("landed", "current"):
            if path in r:
                p = r[path]
                line += (
                    f"  {path} {p['total_s']:.2f} s ({p['fixed_s']:.2f} + {1e3 * p['per_resample_s']:.1f} ms/resample"
                    f" + {1e3 * p['per_decision_resample_s']:.1f} ms/decision resample)"
                )
        if "ratio" in r:
            line += f"  ratio {r['ratio']:.2f}x  max |diff| {r['max_abs_difference']:.1e}"
        print(line, flush=True)
    out = {"rows": rows, "paper_grid": PAPER, "decision": a.decision, "attacks": list(a.attacks)}
    for path in ("landed", "current"):
        if path in rows[0]:
            e = out[f"{path}_extrapolation"] = extrapolate(rows, path)
            print(
                f"{path}: growth exponent {e['exponent_fixed']:.2f} (fixed) / {e['exponent_per_resample']:.2f} "
                f"(per resample); paper grid ({PAPER['runs']} x {PAPER['records']} x {PAPER['quantizers']}, "
                f"{PAPER['resamples']} resamples) extrapolated: {e['paper_grid_s'] / 60:.0f} min in one process, "
                f"{e['paper_grid_on_cores_s'] / 60:.0f} min on this machine's {e['cores']} cores (report.processes)"
            )
    if "landed_extrapolation" in out:
        ratio = out["landed_extrapolation"]["paper_grid_s"] / out["current_extrapolation"]["paper_grid_s"]
        out["paper_grid_ratio"] = ratio
        print(f"paper grid ratio (landed / current): {ratio:.2f}x")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
