"""Benchmark of the analysis (what `llmaudit attack` computes: `run_attacks`, with the release decision under
`--decision`) on synthetic loss tables, before and after issue 33's array arithmetic.

For each size (runs x records per quantizer x quantizers; every attack the table allows: base rows, the base
under every quantizer, validation texts, top-1 flags, vocabulary statistics, zlib lengths), in one process and
on the same table: the seconds of `run_attacks` with `--resamples`, on the landed path
(`landed()`: the text and token attacks one text at a time, the bootstrap over distinct-score groups, the
calibrated threshold's quantile per entry) and the current one; their
ratio; and the largest difference between the two results' numbers (the same seed gives the same intervals).
Times are CPU seconds of this process (other processes on a shared machine do not count), split into the
resampled intervals (`bootstrap_ci`, `_calibrated_ci`; per_sample's weighted means are counted as fixed) and the
rest ("fixed": scores, point estimates, calibration).
Then, per path, the growth exponent of each part in the scores per quantizer (least squares of log seconds on
log runs x records), and the extrapolated time of the paper's grid on this machine: 20 runs x 20,000 records x
12 quantizers, every attack, 1,000 resamples, as quantizers x [fixed(n) + 1000 x per-resample(n)], each part
scaled from the largest size measured by its exponent, at least 1 (one process).

    python benchmarks/bench_analysis.py [--runs 8] [--records 250 500 1000] [--quantizers 2] [--resamples 100] \\
        [--attacks ...] [--decision] [--no-landed] [--json PATH]
    python benchmarks/bench_analysis.py --quick      # the test suite's size (seconds)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import time
import warnings
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
from scipy import stats

from llmaudit.analyze import metrics
from llmaudit.analyze.attacks.catalog import ez_mia_attacks, single_model, wbc_attacks
from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.ez_mia import ez_mia_score_per_sample
from llmaudit.analyze.attacks.registry import registered_attacks
from llmaudit.analyze.attacks.text import min_k_plus_plus_score_per_sample, min_k_score_per_sample
from llmaudit.analyze.attacks.wbc import wbc_score_per_sample
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.analyze.decision import DecisionSettings

PAPER = {"runs": 20, "records": 20_000, "quantizers": 12, "resamples": 1000}


synthetic_table = synthetic_loss_table  # the table `llmaudit plan` times too (llmaudit.analyze.cost)


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
    bootstrap over distinct-score groups (all still in the library: `*_per_sample`, `bootstrap_ci(resampling=
    Resampling(engine="groups"))`), the calibrated threshold's quantile per entry (`landed_calibrated_threshold`)."""
    with (
        mock.patch.object(wbc_attacks, "wbc_score", wbc_score_per_sample),
        mock.patch.object(ez_mia_attacks, "ez_mia_score", ez_mia_score_per_sample),
        mock.patch.object(single_model, "min_k_score", min_k_score_per_sample),
        mock.patch.object(single_model, "min_k_plus_plus_score", min_k_plus_plus_score_per_sample),
        mock.patch.object(
            metrics,
            "bootstrap_ci",
            functools.partial(metrics.bootstrap_ci, resampling=metrics.Resampling(engine="groups")),
        ),
        mock.patch.object(metrics, "calibrated_threshold", landed_calibrated_threshold),
    ):
        yield


class ResamplingClock:
    """CPU seconds spent in the resampled intervals (`bootstrap_ci` and `_calibrated_ci`, outermost calls only),
    while installed (`install`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._depth = 0

    def wrap(self, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self._depth += 1
            start = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.process_time() - start

        return timed

    @contextlib.contextmanager
    def install(self):
        with (
            mock.patch.object(metrics, "bootstrap_ci", self.wrap(metrics.bootstrap_ci)),
            mock.patch.object(metrics, "_calibrated_ci", self.wrap(metrics._calibrated_ci)),
        ):
            yield self


def analyse(df: pd.DataFrame, n_boot: int, decision: bool = False, attacks=registered_attacks()) -> tuple[dict, dict]:
    """CPU seconds of `run_attacks` on `attacks` (with the release decision, as `llmaudit attack` runs it, when
    `decision`): {"total_s", "resampling_s", "fixed_s", "per_resample_s"}, and its result. CPU time of this
    process, so that other processes on the machine do not count."""
    clock = ResamplingClock()
    start = time.process_time()
    with warnings.catch_warnings(), clock.install():
        warnings.simplefilter("ignore")  # the synthetic table's own oddities (e.g. LiRA's normality check)
        settings = DecisionSettings(seed=0) if decision else None
        out = run_attacks(df, n_boot=n_boot, seed=0, decision=settings, attacks=attacks)
    total = time.process_time() - start
    per = clock.seconds / n_boot if n_boot else 0.0
    return {
        "total_s": total,
        "resampling_s": clock.seconds,
        "fixed_s": total - clock.seconds,
        "per_resample_s": per,
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
    """Growth exponents of the fixed and per-resample seconds in runs x records, and the paper grid's seconds."""
    n = [r["runs"] * r["records"] for r in rows]
    fixed = [r[path]["fixed_s"] / r["quantizers"] for r in rows]
    per = [r[path]["per_resample_s"] / r["quantizers"] for r in rows]
    k_fixed, k_per = exponent(n, fixed), exponent(n, per)
    scale = PAPER["runs"] * PAPER["records"] / n[-1]
    # below 1 the sizes measured are still dominated by per-call overheads: the work itself grows at least linearly
    grow = lambda k: scale ** (max(k, 1.0) if math.isfinite(k) else 1.0)  # noqa: E731
    paper_s = PAPER["quantizers"] * (fixed[-1] * grow(k_fixed) + PAPER["resamples"] * per[-1] * grow(k_per))
    return {"exponent_fixed": k_fixed, "exponent_per_resample": k_per, "paper_grid_s": paper_s}


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
    rows = []
    for records in a.records:
        r = measure(a, records)
        rows.append(r)
        line = f"{r['runs']} runs x {r['records']} records x {r['quantizers']} quantizers, {r['resamples']} resamples:"
        for path in ("landed", "current"):
            if path in r:
                p = r[path]
                line += (
                    f"  {path} {p['total_s']:.2f} s ({p['fixed_s']:.2f} + {1e3 * p['per_resample_s']:.1f} ms/resample)"
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
                f"{PAPER['resamples']} resamples) extrapolated: {e['paper_grid_s'] / 60:.0f} min in one process"
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
