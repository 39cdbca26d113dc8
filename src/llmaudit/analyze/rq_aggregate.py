"""The published indicator r_Q over training runs (docs/science.md section 2 step 5): its per-quantizer
aggregate, the quantizer ranking, the ranking's stability with the number of runs, and all of it from a
loss table (`indicator_from_table`). The estimator of one run is `llmaudit.analyze.rq`; the stable public
import path of both is `llmaudit.indicator`.

Conventions of the aggregate (see `aggregate_r_q`): undefined runs (nan) are counted and excluded;
mean, std and the bootstrap interval are over the finite runs; the median is over all defined runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from llmaudit.analyze.rq import ESTIMATOR, VARIANTS, r_q_details
from llmaudit.common.stats import bootstrap_mean_interval, finite_mean, spearman_rho
from llmaudit.store.losstable import REFERENCE_RUN, LossTableError, loss_matrix


def aggregate_r_q(
    values: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Summarise r_Q over independent training runs (docs/science.md section 2 step 5).

    Undefined runs are counted (n_undefined) and excluded from every statistic. `mean`, `std` (ddof=1) and the
    bootstrap percentile CI of the mean are over the FINITE runs (a single infinite run would make the mean +inf and
    the CI meaningless); infinite runs are counted in n_infinite and enter `median`, which is over all defined runs
    (inf sorts on top), so a quantizer with many infinite runs still shows as secure there.

    Args:
        values (Sequence[float] | np.ndarray): [R] one r_Q per run; NaN = undefined run, +inf = infinite r_Q.
        n_boot (int): bootstrap resamples of the mean.
        confidence (float): the interval's confidence, in (0, 1).
        seed (int): the resampling seed.
    Returns:
        dict[str, Any]: the counts, mean, std, median, ci_low, ci_high and `mean_over` (these conventions).
    Raises:
        ValueError: when confidence is outside (0, 1).
    """
    arr = np.asarray(values, dtype=np.float64).ravel()
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}.")
    defined = arr[~np.isnan(arr)]
    finite = arr[np.isfinite(arr)]
    out: dict[str, Any] = {
        "n_runs": int(arr.size),
        "n_defined": int(defined.size),
        "n_undefined": int(arr.size - defined.size),
        "n_finite": int(finite.size),
        "n_zero": int(np.sum(defined == 0.0)),
        "n_infinite": int(np.sum(np.isinf(defined))),
        "mean": float(finite.mean()) if finite.size else math.nan,
        "std": float(finite.std(ddof=1)) if finite.size >= 2 else math.nan,
        "median": float(np.median(defined)) if defined.size else math.nan,
        "ci_low": math.nan,
        "ci_high": math.nan,
        "confidence": confidence,
        "n_boot": n_boot,
        "mean_over": (
            "finite runs only (n_finite); undefined runs (nan) and infinite runs are excluded from "
            "mean/std/CI and counted; median is over all defined runs including +inf"
        ),
    }
    out["ci_low"], out["ci_high"] = bootstrap_mean_interval(finite, n_boot=n_boot, confidence=confidence, seed=seed)
    return out


def rank_quantizers(mean_by_quantizer: Mapping[str, float]) -> dict[str, float]:
    """Rank quantizers by r_Q: rank 1 = most secure = highest r_Q; ties share the average rank.

    Args:
        mean_by_quantizer (Mapping[str, float]): {name: aggregated r_Q}; +inf ranks first.
    Returns:
        dict[str, float]: {name: rank}, floats because ties average; NaN for a NaN value (every run undefined),
        which is left out of the others' ranking.
    """
    names = list(mean_by_quantizer)
    vals = np.array([mean_by_quantizer[q] for q in names], dtype=np.float64)
    ranks = dict.fromkeys(names, math.nan)
    ok = ~np.isnan(vals)
    if ok.any():
        r = stats.rankdata(-vals[ok], method="average")
        for q, rank in zip((n for n, keep in zip(names, ok) if keep), r):
            ranks[q] = float(rank)
    return ranks


def _subset_rho(mat: np.ndarray, full: np.ndarray, k: int, rng: np.random.Generator) -> float:
    """Spearman's rho between the quantizers' finite means over k random runs (columns of mat [Q, R],
    drawn without replacement) and their means over all runs `full` [Q]; nan when undefined."""
    cols = rng.choice(mat.shape[1], size=k, replace=False)
    sub = np.array([finite_mean(row) for row in mat[:, cols]])
    return spearman_rho(sub, full, min_n=2)


def _rho_summary(rho: np.ndarray) -> dict[str, Any]:
    """Count of undefined rhos and the mean, std, 5% and 95% quantiles of the defined ones."""
    good = rho[~np.isnan(rho)]
    return {
        "n_nan": int(np.isnan(rho).sum()),
        "mean_rho": float(good.mean()) if good.size else math.nan,
        "std_rho": float(good.std(ddof=1)) if good.size >= 2 else math.nan,
        "q05_rho": float(np.quantile(good, 0.05)) if good.size else math.nan,
        "q95_rho": float(np.quantile(good, 0.95)) if good.size else math.nan,
    }


def ranking_stability(
    per_run: Mapping[str, Sequence[float] | np.ndarray],
    subset_sizes: Sequence[int],
    *,
    n_resamples: int = 50,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure how fast the quantizer ranking stabilises with the number of runs (docs/science.md sections 2, 5).

    Run i of every quantizer is the same training run, so runs are subsampled jointly (without replacement). For
    each size, the quantizers' means over a random subset (finite runs, as in `aggregate_r_q`) are compared with the
    means over all R runs by Spearman's rho (ties averaged); a subset where rho is undefined (constant means, fewer
    than 2 quantizers with a mean) is counted in n_nan.

    Args:
        per_run (Mapping[str, Sequence[float] | np.ndarray]): {quantizer: [R] r_Q per run}.
        subset_sizes (Sequence[int]): the run counts k_runs, each in 1..R.
        n_resamples (int): random subsets per size.
        seed (int): the subsampling seed.
    Returns:
        dict[str, Any]: n_runs, full_mean, full_ranking, by_size (rho summary per size) and seed.
    Raises:
        ValueError: when the quantizers have different numbers of runs or a size is outside 1..R.
    """
    names = list(per_run)
    rows = [np.asarray(per_run[q], dtype=np.float64).ravel() for q in names]
    lengths = {q: row.size for q, row in zip(names, rows)}
    if not rows or len(set(lengths.values())) != 1:
        raise ValueError(f"per_run: every quantizer needs the same number of runs R; got {lengths}.")
    mat = np.vstack(rows)
    n_runs = mat.shape[1]
    full = np.array([finite_mean(row) for row in mat])
    rng = np.random.default_rng(seed)
    by_size = []
    for k in subset_sizes:
        k = int(k)
        if not 1 <= k <= n_runs:
            raise ValueError(f"subset size {k} outside 1..{n_runs} (the number of runs).")
        rho = np.asarray([_subset_rho(mat, full, k, rng) for _ in range(n_resamples)])
        by_size.append({"k_runs": k, "n_resamples": n_resamples, **_rho_summary(rho)})
    return {
        "n_runs": n_runs,
        "full_mean": {q: float(v) for q, v in zip(names, full)},
        "full_ranking": rank_quantizers(dict(zip(names, full))),
        "by_size": by_size,
        "seed": seed,
    }


DEFAULT_SUBSET_SIZES = (1, 2, 5, 10, 15, 25, 50, 100, 150, 300)


@dataclass(frozen=True)
class RQSettings:
    """How `indicator_from_table` scores a loss table and aggregates r_Q over runs."""

    split: str = "val"
    """The loss table's split whose rows are the held-out losses."""
    ddof: int = 1
    """Variance convention of sigma2 (`r_q_details`)."""
    atol: float = 0.0
    """Merge tolerance for identical quantized points (`r_q_details`)."""
    variants: Sequence[str] = ("reciprocal",)
    """Names of `VARIANTS` computed beside the published estimator."""
    subset_sizes: Sequence[int] | None = None
    """Run counts of `ranking_stability`; None = `DEFAULT_SUBSET_SIZES` below the number of runs, and all runs."""
    n_boot: int = 2000
    confidence: float = 0.95
    n_resamples: int = 50
    """Random subsets per size of `ranking_stability`."""
    seed: int = 0


def indicator_from_table(df: pd.DataFrame, settings: RQSettings | None = None, **options: Any) -> dict[str, Any]:
    """Compute r_Q for every (run, quantizer) of a validated loss table, aggregated per quantizer.

    Rows of run == REFERENCE_RUN (the base model) are skipped. For each (run, quantizer), `loss_matrix` gives losses
    [K checkpoints, n samples] on the split, fed to `r_q_details`; a pair with no rows on the split is reported with
    r_q = NaN and a "missing: ..." status, and counts as undefined in the aggregate.

    Args:
        df (pd.DataFrame): a loss table (`llmaudit.losstable`).
        settings (RQSettings | None): the settings (default: `RQSettings()`).
        **options (Any): keyword overrides of its fields (`indicator_from_table(df, split="pool", n_boot=200)`).
    Returns:
        dict[str, Any]: `protocol`, `runs`, `quantizers`, `per_run`, `per_quantizer` (aggregate, rank, variant
        aggregates) and `stability`.
    Raises:
        ValueError: for an unknown variant.
        LossTableError: without rows on the split, or on non-finite losses (naming the run and quantizer).
    """
    s = replace(settings or RQSettings(), **options)
    unknown = [v for v in s.variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; available: {sorted(VARIANTS)}.")
    table = df[(df["run"] != REFERENCE_RUN) & (df["split"] == s.split)]
    if table.empty:
        raise LossTableError(
            f"no rows with split={s.split!r} outside the reference run {REFERENCE_RUN}; nothing to score."
        )
    runs = sorted(int(r) for r in table["run"].unique())
    quantizers = sorted(str(q) for q in table["quantizer"].unique())

    per_run, values, variant_values = _score_blocks(table, runs, quantizers, s)
    per_quantizer = _aggregate_per_quantizer(values, variant_values, s)
    subset_sizes = s.subset_sizes
    if subset_sizes is None:
        subset_sizes = sorted({k for k in DEFAULT_SUBSET_SIZES if k < len(runs)} | {len(runs)})
    stability = ranking_stability(values, subset_sizes, n_resamples=s.n_resamples, seed=s.seed)

    return {
        "protocol": _indicator_protocol(s),
        "runs": runs,
        "quantizers": quantizers,
        "per_run": per_run,
        "per_quantizer": per_quantizer,
        "stability": stability,
    }


def _run_entry(block: pd.DataFrame, run: int, quantizer: str, s: RQSettings) -> dict[str, Any]:
    """The `per_run` entry of one (run, quantizer) block of `indicator_from_table`: `r_q_details` of its
    losses [K, n] with row indices translated into checkpoint steps, plus each variant's value."""
    checkpoints, sample_ids, losses = loss_matrix(block, run=run, quantizer=quantizer, split=s.split)
    try:
        res = r_q_details(losses, ddof=s.ddof, atol=s.atol)
    except ValueError as exc:
        raise LossTableError(f"run={run}, quantizer={quantizer!r}: {exc}") from exc
    entry = {"run": run, "quantizer": quantizer, "n_samples": len(sample_ids), **res.to_dict()}
    # Translate row indices into the table's checkpoint steps, which is what a reader needs.
    entry["checkpoints"] = [int(c) for c in checkpoints]
    entry["groups_checkpoints"] = [[int(checkpoints[j]) for j in g] for g in res.groups]
    entry["argmax_checkpoint"] = None if res.argmax_k is None else int(checkpoints[res.argmax_k])
    for v in s.variants:
        entry[f"variant_{v}"] = VARIANTS[v](losses, ddof=s.ddof, atol=s.atol)
    return entry


def _score_blocks(
    table: pd.DataFrame, runs: list[int], quantizers: list[str], s: RQSettings
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """r_Q of every (run, quantizer) of `table`: (per_run entries, {quantizer: [R] r_Q},
    {variant: {quantizer: [R] values}}); a pair without rows is a "missing: ..." entry, nan in the arrays."""
    per_run: list[dict[str, Any]] = []
    values: dict[str, np.ndarray] = {q: np.full(len(runs), math.nan) for q in quantizers}
    variant_values = {v: {q: np.full(len(runs), math.nan) for q in quantizers} for v in s.variants}
    # One pass over the table; loss_matrix then only filters each small (run, quantizer) block.
    blocks = {(int(r), str(q)): g for (r, q), g in table.groupby(["run", "quantizer"], sort=False)}
    for i, run in enumerate(runs):
        for q in quantizers:
            if (run, q) not in blocks:
                per_run.append(
                    {
                        "run": run,
                        "quantizer": q,
                        "r_q": math.nan,
                        "status": f"missing: no rows for this run and quantizer on split {s.split!r}",
                    }
                )
                continue
            entry = _run_entry(blocks[run, q], run, q, s)
            values[q][i] = entry["r_q"]
            for v in s.variants:
                variant_values[v][q][i] = entry[f"variant_{v}"]
            per_run.append(entry)
    return per_run, values, variant_values


def _aggregate_per_quantizer(
    values: Mapping[str, np.ndarray], variant_values: Mapping[str, Mapping[str, np.ndarray]], s: RQSettings
) -> dict[str, dict[str, Any]]:
    """`aggregate_r_q` of r_Q and of each variant per quantizer, then each quantizer's rank by mean r_Q."""
    boot = {"n_boot": s.n_boot, "confidence": s.confidence, "seed": s.seed}
    per_quantizer: dict[str, dict[str, Any]] = {}
    for q in values:
        per_quantizer[q] = {"r_q": aggregate_r_q(values[q], **boot)}
        for v in variant_values:
            per_quantizer[q][f"variant_{v}"] = aggregate_r_q(variant_values[v][q], **boot)
    ranks = rank_quantizers({q: per_quantizer[q]["r_q"]["mean"] for q in values})
    for q in values:
        per_quantizer[q]["rank"] = ranks[q]
    return per_quantizer


def _indicator_protocol(s: RQSettings) -> dict[str, Any]:
    """The `protocol` block of `indicator_from_table`: the estimator, its conventions and the parameters used."""
    return {
        "estimator": ESTIMATOR,
        "formula": "r_Q = 1/2 * [max_{k>=2} Var_j(L[k]-L[1]) / (m[k]-m[1])^2]^{-1}",
        "split": s.split,
        "ddof": s.ddof,
        "merge_rule": ("rows with max_j |L[a,j]-L[b,j]| <= atol are one quantized point (greedy, row order)"),
        "merge_atol": s.atol,
        "sort": "ascending mean loss; stable for ties",
        "edge_cases": {
            "equal_means": "r_Q = 0.0",
            "all_sigma2_zero": "r_Q = +inf",
            "fewer_than_2_points": "r_Q = nan (undefined), counted in n_undefined",
        },
        "aggregation": "mean/std/bootstrap percentile CI over finite runs; median over defined runs",
        "rank_by": "r_q mean (rank 1 = highest r_Q = most secure; ties averaged)",
        "reference_run_skipped": REFERENCE_RUN,
        "variants": list(s.variants),
        "n_boot": s.n_boot,
        "confidence": s.confidence,
        "n_resamples": s.n_resamples,
        "seed": s.seed,
    }
