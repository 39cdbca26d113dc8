"""The attack-free indicator r_Q (docs/science.md section 2) and its aggregation over training runs.

Pure functions: per-sample losses in, numbers out. The published estimator is `r_q` (Algorithm 2 of
the indicator paper, docs/science.md section 2 step 4). Variants that docs/science.md section 5 asks us to
investigate live in separate, clearly named functions (`r_q_reciprocal`, ...) and are never swapped in
silently. Notation follows docs/science.md:

    L[k, j]   loss of quantized checkpoint k on validation sample j          losses: [K, n]
    m[k]      mean_j L[k, j]; points sorted so that m[1] <= m[2] <= ...
    delta_k   m[k] - m[1]
    sigma2_k  Var_j(L[k, j] - L[1, j])                                        (ddof, default 1)
    r_Q       1/2 * [max_{k>=2} sigma2_k / delta_k^2]^{-1}  =  1/2 * min_{k>=2} delta_k^2 / sigma2_k

Conventions (all explicit, see `r_q_details`):
- Rows whose per-sample losses are identical (within `atol`, default exact equality) are the same
  quantized point and are merged BEFORE sorting (docs/science.md section 2, "Edge cases").
- Two distinct points with equal mean loss: delta = 0, the ratio sigma2/delta^2 is +inf, r_Q = 0.0.
- Every distinct point a pure constant shift of the lowest one (sigma2 = 0, delta > 0): r_Q = +inf.
- Fewer than 2 distinct points: r_Q undefined, returned as nan with a status saying so.
- Non-finite losses: ValueError (a diverged quantized model cannot be scored).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from llmaudit.common.stats import bootstrap_mean_interval, finite_mean, spearman_rho
from llmaudit.store.losstable import REFERENCE_RUN, LossTableError, loss_matrix

STATUS_OK = "ok"

STATUS_ZERO = "zero: two distinct quantized points have equal mean loss (delta = 0)"

STATUS_INFINITE = "infinite: every distinct point differs from the lowest-loss point by a constant shift (sigma2 = 0)"

STATUS_UNDEFINED = "undefined: fewer than 2 distinct quantized points"

ESTIMATOR = "Algorithm 2 (docs/science.md section 2, step 4)"


@dataclass(frozen=True)
class RQResult:
    """Everything `r_q_details` computed, for diagnostics and reports.

    Indices: `groups`, `order` and `argmax_k` refer to rows of the ORIGINAL `losses` array; the
    per-point arrays (`means`, `delta`, `sigma2`, `profile`) are in sorted order (position 0 = the
    lowest-loss point, docs/science.md's k = 1)."""

    r_q: float
    """The indicator (Algorithm 2); nan when undefined, 0.0 or +inf in the edge cases of `status`."""
    status: str
    """"ok", or a sentence naming the edge case (STATUS_ZERO, STATUS_INFINITE, STATUS_UNDEFINED)."""
    n_checkpoints: int
    """K, the number of input rows."""
    n_points: int
    """Number of distinct quantized points after merging identical rows."""
    groups: tuple[tuple[int, ...], ...]
    """Merged groups of original row indices, in sorted order; group[0] is each point's representative."""
    order: tuple[int, ...]
    """Representative original row of each distinct point, sorted by mean loss (ascending)."""
    means: tuple[float, ...]
    """m[k] per sorted point."""
    delta: tuple[float, ...]
    """m[k] - m[1] per sorted point (0 for the first)."""
    sigma2: tuple[float, ...]
    """Var_j(L[k] - L[1]) per sorted point (0 for the first)."""
    profile: tuple[float, ...]
    """delta_k^2 / sigma2_k per sorted point; nan for k = 1; +inf where sigma2 = 0 < delta; 0 where
    delta = 0."""
    argmax_k: int | None
    """Original row index of the point attaining max_k sigma2_k / delta_k^2 (the binding point); None
    when r_Q is undefined or infinite (no point binds). Ties go to the lower-loss point."""
    ddof: int
    atol: float

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["groups"] = [list(g) for g in self.groups]
        for key in ("order", "means", "delta", "sigma2", "profile"):
            out[key] = list(out[key])
        return out


def _check_losses(losses: Any) -> np.ndarray:
    arr = np.asarray(losses, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"losses must be a 2-D array [K checkpoints, n samples]; got shape {arr.shape}.")
    if arr.shape[0] < 1:
        raise ValueError("losses has no checkpoint rows (K = 0).")
    if arr.shape[1] < 2:
        raise ValueError(
            f"losses needs at least 2 samples per checkpoint to estimate a variance; got shape {arr.shape}."
        )
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        rows = np.flatnonzero(bad).tolist()
        raise ValueError(
            f"non-finite loss(es) in checkpoint row(s) {rows}: a diverged quantized model cannot be "
            "scored. Drop that quantizer/checkpoint or check the checkpoint."
        )
    return arr


def merge_identical_points(losses: Any, *, atol: float = 0.0) -> list[list[int]]:
    """Group rows of `losses` [K, n] that are the same quantized point.

    Two rows are the same point when max_j |L[a, j] - L[b, j]| <= atol (atol = 0: exact equality).
    Greedy in row order: a row joins the first group whose representative (its first row) is within
    `atol`, so groups do not chain. Returns groups of original row indices, in order of first row."""
    arr = _check_losses(losses)
    if atol < 0:
        raise ValueError(f"atol must be >= 0; got {atol}.")
    groups: list[list[int]] = []
    for i in range(arr.shape[0]):
        for group in groups:
            if np.max(np.abs(arr[i] - arr[group[0]])) <= atol:
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def _rq_result(
    arr: np.ndarray,
    groups: list[list[int]],
    order: np.ndarray,
    means: np.ndarray,
    r: float,
    status: str,
    delta: tuple[float, ...],
    sigma2: tuple[float, ...],
    profile: tuple[float, ...],
    argmax_k: int | None,
    ddof: int,
    atol: float,
) -> RQResult:
    """The `RQResult` of `r_q_details` from its sorted points (groups, order, means) and the computed
    per-point tuples, converted to plain Python numbers."""
    return RQResult(
        r_q=r,
        status=status,
        n_checkpoints=arr.shape[0],
        n_points=len(order),
        groups=tuple(tuple(g) for g in groups),
        order=tuple(int(i) for i in order),
        means=tuple(float(m) for m in means),
        delta=delta,
        sigma2=sigma2,
        profile=profile,
        argmax_k=argmax_k,
        ddof=ddof,
        atol=float(atol),
    )


def r_q_details(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> RQResult:
    """Algorithm 2 of the indicator paper (docs/science.md section 2, steps 2-4) with full diagnostics.

    losses: [K, n] per-sample validation losses of the K quantized checkpoints of ONE training run
    (rows in any order). ddof: variance convention for sigma2 (1 = unbiased). atol: merge tolerance
    for identical quantized points (0 = exact equality)."""
    arr = _check_losses(losses)
    groups = merge_identical_points(arr, atol=atol)
    reps = np.array([g[0] for g in groups])
    means_unsorted = arr[reps].mean(axis=1)
    sort = np.argsort(means_unsorted, kind="stable")
    groups = [groups[i] for i in sort]
    order = reps[sort]
    points = arr[order]
    means = points.mean(axis=1)
    n_points = len(order)

    if n_points < 2 or arr.shape[1] - ddof <= 0:
        status = STATUS_UNDEFINED if n_points < 2 else f"undefined: n - ddof <= 0 (n = {arr.shape[1]})"
        zeros = (0.0,) * n_points
        return _rq_result(
            arr, groups, order, means, math.nan, status, zeros, zeros, (math.nan,) * n_points, None, ddof, atol
        )

    delta = means - means[0]
    sigma2 = np.var(points - points[0], axis=1, ddof=ddof)
    # ratio = sigma2 / delta^2 with the limits written out: delta = 0 -> +inf (r_Q = 0),
    # sigma2 = 0 < delta -> 0.
    d2 = delta[1:] ** 2
    s2 = sigma2[1:]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(d2 > 0, s2 / np.where(d2 > 0, d2, 1.0), np.inf)
        profile = np.where(s2 > 0, d2 / np.where(s2 > 0, s2, 1.0), np.where(d2 > 0, np.inf, 0.0))
    worst = float(np.max(ratio))
    if math.isinf(worst):
        r, status = 0.0, STATUS_ZERO
    elif worst == 0.0:
        r, status = math.inf, STATUS_INFINITE
    else:
        r, status = 0.5 / worst, STATUS_OK
    argmax_k = None if status == STATUS_INFINITE else int(order[1 + int(np.argmax(ratio))])
    return _rq_result(
        arr,
        groups,
        order,
        means,
        float(r),
        status,
        tuple(float(d) for d in delta),
        tuple(float(s) for s in sigma2),
        (math.nan, *(float(p) for p in profile)),
        argmax_k,
        ddof,
        atol,
    )


def r_q(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> float:
    """The indicator r_Q of one training run: Algorithm 2, docs/science.md section 2 step 4.

    losses: [K checkpoints, n samples] per-sample validation losses of the quantized checkpoints
    (rows unsorted). Returns r_Q = 1/2 * [max_{k>=2} sigma2_k / (m[k] - m[1])^2]^{-1}, with
    identical rows merged first; 0.0 if two distinct points share a mean; +inf if every sigma2 is 0;
    nan if fewer than 2 distinct points (see `r_q_details` for the status). Raises ValueError on
    non-finite losses or a wrong shape."""
    return r_q_details(losses, ddof=ddof, atol=atol).r_q


def r_q_min_ratio(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> float:
    """The theorem's form, docs/science.md section 2: r_Q = 1/2 * min_{k>1} delta_k^2 / sigma_k^2.

    Mathematically the same number as `r_q` (1/max(x) = min(1/x) for x >= 0, with 1/0 = inf and
    1/inf = 0); computed independently here, from the per-point profile, so tests can check that the
    two written forms agree. losses: [K, n]. nan when undefined."""
    res = r_q_details(losses, ddof=ddof, atol=atol)
    if res.n_points < 2 or math.isnan(res.r_q):
        return math.nan
    return 0.5 * float(np.min(np.asarray(res.profile[1:])))


def r_q_as_printed(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> float:
    """Algorithm 2 exactly as printed: r = 1/2 [max_k sigma2_k ((m[2]-m[1]) / (m[k]-m[1]))^2]^{-1},
    returning r * (m[2] - m[1])^2.

    Equal to `r_q` whenever m[2] > m[1]; the printed normalisation is 0/0 when the two lowest points
    share a mean, so this form returns nan there while `r_q` returns the limit 0.0. Kept only to
    verify the equivalence. losses: [K, n]."""
    res = r_q_details(losses, ddof=ddof, atol=atol)
    if res.n_points < 2:
        return math.nan
    delta = np.asarray(res.delta)
    sigma2 = np.asarray(res.sigma2)
    gap2 = delta[1] ** 2
    if gap2 == 0.0:
        return math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        inner = sigma2[1:] * (delta[1] / delta[1:]) ** 2
    worst = float(np.max(inner))
    r = math.inf if worst == 0.0 else 0.5 / worst
    return r * gap2


def r_q_reciprocal(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> float:
    """VARIANT (not the published estimator): max_{k>=2} sigma_k^2 / delta_k^2 = 1 / (2 r_Q).

    docs/science.md section 5 reports that this reciprocal tracks the baseline MIS at about +0.80 Spearman
    where the published r_Q gave about -0.80, "which is what a missing inversion would produce". It is
    a strictly decreasing function of r_Q, so its rankings are exactly r_Q's reversed: it tests the
    sign convention, nothing more. losses: [K, n]; nan when undefined, +inf when r_Q = 0, 0 when r_Q = inf."""
    value = r_q(losses, ddof=ddof, atol=atol)
    if math.isnan(value):
        return math.nan
    if value == 0.0:
        return math.inf
    return 0.5 / value


VARIANTS: dict[str, Callable[..., float]] = {
    "reciprocal": r_q_reciprocal,
}
"""Named variants `indicator_from_table` can add beside the published estimator. `r_q_min_ratio` and
`r_q_as_printed` are not listed: they are the same number as `r_q` (checked by the tests)."""


def aggregate_r_q(
    values: Sequence[float] | np.ndarray,
    *,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Summarise r_Q over independent training runs (docs/science.md section 2 step 5).

    values: [R] one r_Q per run; nan = undefined run, +inf = infinite r_Q.
    Conventions: undefined runs are counted (n_undefined) and excluded from every statistic. `mean`,
    `std` (ddof=1) and the bootstrap percentile CI of the mean are over the FINITE runs (a single
    infinite run would make the mean +inf and the CI meaningless); infinite runs are counted in
    n_infinite and enter `median`, which is over all defined runs (inf sorts on top), so a quantizer
    with many infinite runs still shows as secure there. `mean_over` states this in the output."""
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

    mean_by_quantizer: {name: aggregated r_Q}. +inf ranks first. A nan value (every run undefined)
    gets rank nan and is left out of the others' ranking. Ranks are floats because ties average."""
    names = list(mean_by_quantizer)
    vals = np.array([mean_by_quantizer[q] for q in names], dtype=np.float64)
    ranks = dict.fromkeys(names, math.nan)
    ok = ~np.isnan(vals)
    if ok.any():
        r = stats.rankdata(-vals[ok], method="average")
        for q, rank in zip((n for n, keep in zip(names, ok) if keep), r):
            ranks[q] = float(rank)
    return ranks


def ranking_stability(
    per_run: Mapping[str, Sequence[float] | np.ndarray],
    subset_sizes: Sequence[int],
    *,
    n_resamples: int = 50,
    seed: int = 0,
) -> dict[str, Any]:
    """How fast the quantizer ranking stabilises with the number of runs (docs/science.md sections 2, 5).

    per_run: {quantizer: [R] r_Q per run}; run i of every quantizer is the same training run, so runs
    are subsampled jointly (without replacement). For each size k_runs, `n_resamples` random subsets
    are drawn; the quantizers' means over the subset (finite runs, as in `aggregate_r_q`) are compared
    with the means over all R runs by Spearman's rho (scipy.stats.spearmanr, ties averaged). A subset
    where rho is undefined (constant means, fewer than 2 quantizers with a mean) is counted in n_nan."""
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
        rhos = []
        for _ in range(n_resamples):
            cols = rng.choice(n_runs, size=k, replace=False)
            sub = np.array([finite_mean(row) for row in mat[:, cols]])
            rhos.append(spearman_rho(sub, full, min_n=2))
        rho = np.asarray(rhos)
        good = rho[~np.isnan(rho)]
        by_size.append(
            {
                "k_runs": k,
                "n_resamples": n_resamples,
                "n_nan": int(np.isnan(rho).sum()),
                "mean_rho": float(good.mean()) if good.size else math.nan,
                "std_rho": float(good.std(ddof=1)) if good.size >= 2 else math.nan,
                "q05_rho": float(np.quantile(good, 0.05)) if good.size else math.nan,
                "q95_rho": float(np.quantile(good, 0.95)) if good.size else math.nan,
            }
        )
    return {
        "n_runs": n_runs,
        "full_mean": {q: float(v) for q, v in zip(names, full)},
        "full_ranking": rank_quantizers(dict(zip(names, full))),
        "by_size": by_size,
        "seed": seed,
    }


DEFAULT_SUBSET_SIZES = (1, 2, 5, 10, 15, 25, 50, 100, 150, 300)


def indicator_from_table(
    df: pd.DataFrame,
    *,
    split: str = "val",
    ddof: int = 1,
    atol: float = 0.0,
    variants: Sequence[str] = ("reciprocal",),
    subset_sizes: Sequence[int] | None = None,
    n_boot: int = 2000,
    confidence: float = 0.95,
    n_resamples: int = 50,
    seed: int = 0,
) -> dict[str, Any]:
    """r_Q for every (run, quantizer) of a validated loss table, aggregated per quantizer.

    df: a loss table (`llmaudit.losstable`). Rows of run == REFERENCE_RUN (the base model) are
    skipped. For each (run, quantizer), `loss_matrix` gives losses [K checkpoints, n samples] on
    `split`, fed to `r_q_details`. A (run, quantizer) pair with no rows on `split` is reported with
    r_q = nan and a "missing: ..." status, and counts as undefined in the aggregate. Non-finite losses
    raise ValueError naming the run and quantizer. Returns a JSON-ready dict with `protocol`,
    `per_run`, `per_quantizer` (aggregate, rank, variant aggregates) and `stability`."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; available: {sorted(VARIANTS)}.")
    table = df[(df["run"] != REFERENCE_RUN) & (df["split"] == split)]
    if table.empty:
        raise LossTableError(
            f"no rows with split={split!r} outside the reference run {REFERENCE_RUN}; nothing to score."
        )
    runs = sorted(int(r) for r in table["run"].unique())
    quantizers = sorted(str(q) for q in table["quantizer"].unique())

    per_run, values, variant_values = _score_blocks(table, runs, quantizers, split, ddof, atol, variants)
    per_quantizer = _aggregate_per_quantizer(values, variant_values, n_boot=n_boot, confidence=confidence, seed=seed)
    if subset_sizes is None:
        subset_sizes = sorted({k for k in DEFAULT_SUBSET_SIZES if k < len(runs)} | {len(runs)})
    stability = ranking_stability(values, subset_sizes, n_resamples=n_resamples, seed=seed)

    return {
        "protocol": _indicator_protocol(split, ddof, atol, variants, n_boot, confidence, n_resamples, seed),
        "runs": runs,
        "quantizers": quantizers,
        "per_run": per_run,
        "per_quantizer": per_quantizer,
        "stability": stability,
    }


def _run_entry(
    block: pd.DataFrame, run: int, quantizer: str, split: str, ddof: int, atol: float, variants: Sequence[str]
) -> dict[str, Any]:
    """The `per_run` entry of one (run, quantizer) block of `indicator_from_table`: `r_q_details` of its
    losses [K, n] with row indices translated into checkpoint steps, plus each variant's value."""
    checkpoints, sample_ids, losses = loss_matrix(block, run=run, quantizer=quantizer, split=split)
    try:
        res = r_q_details(losses, ddof=ddof, atol=atol)
    except ValueError as exc:
        raise LossTableError(f"run={run}, quantizer={quantizer!r}: {exc}") from exc
    entry = {"run": run, "quantizer": quantizer, "n_samples": len(sample_ids), **res.to_dict()}
    # Translate row indices into the table's checkpoint steps, which is what a reader needs.
    entry["checkpoints"] = [int(c) for c in checkpoints]
    entry["groups_checkpoints"] = [[int(checkpoints[j]) for j in g] for g in res.groups]
    entry["argmax_checkpoint"] = None if res.argmax_k is None else int(checkpoints[res.argmax_k])
    for v in variants:
        entry[f"variant_{v}"] = VARIANTS[v](losses, ddof=ddof, atol=atol)
    return entry


def _score_blocks(
    table: pd.DataFrame,
    runs: list[int],
    quantizers: list[str],
    split: str,
    ddof: int,
    atol: float,
    variants: Sequence[str],
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """r_Q of every (run, quantizer) of `table`: (per_run entries, {quantizer: [R] r_Q},
    {variant: {quantizer: [R] values}}); a pair without rows is a "missing: ..." entry, nan in the arrays."""
    per_run: list[dict[str, Any]] = []
    values: dict[str, np.ndarray] = {q: np.full(len(runs), math.nan) for q in quantizers}
    variant_values = {v: {q: np.full(len(runs), math.nan) for q in quantizers} for v in variants}
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
                        "status": f"missing: no rows for this run and quantizer on split {split!r}",
                    }
                )
                continue
            entry = _run_entry(blocks[run, q], run, q, split, ddof, atol, variants)
            values[q][i] = entry["r_q"]
            for v in variants:
                variant_values[v][q][i] = entry[f"variant_{v}"]
            per_run.append(entry)
    return per_run, values, variant_values


def _aggregate_per_quantizer(
    values: Mapping[str, np.ndarray],
    variant_values: Mapping[str, Mapping[str, np.ndarray]],
    *,
    n_boot: int,
    confidence: float,
    seed: int,
) -> dict[str, dict[str, Any]]:
    """`aggregate_r_q` of r_Q and of each variant per quantizer, then each quantizer's rank by mean r_Q."""
    per_quantizer: dict[str, dict[str, Any]] = {}
    for q in values:
        per_quantizer[q] = {"r_q": aggregate_r_q(values[q], n_boot=n_boot, confidence=confidence, seed=seed)}
        for v in variant_values:
            per_quantizer[q][f"variant_{v}"] = aggregate_r_q(
                variant_values[v][q], n_boot=n_boot, confidence=confidence, seed=seed
            )
    ranks = rank_quantizers({q: per_quantizer[q]["r_q"]["mean"] for q in values})
    for q in values:
        per_quantizer[q]["rank"] = ranks[q]
    return per_quantizer


def _indicator_protocol(
    split: str,
    ddof: int,
    atol: float,
    variants: Sequence[str],
    n_boot: int,
    confidence: float,
    n_resamples: int,
    seed: int,
) -> dict[str, Any]:
    """The `protocol` block of `indicator_from_table`: the estimator, its conventions and the parameters used."""
    return {
        "estimator": ESTIMATOR,
        "formula": "r_Q = 1/2 * [max_{k>=2} Var_j(L[k]-L[1]) / (m[k]-m[1])^2]^{-1}",
        "split": split,
        "ddof": ddof,
        "merge_rule": ("rows with max_j |L[a,j]-L[b,j]| <= atol are one quantized point (greedy, row order)"),
        "merge_atol": atol,
        "sort": "ascending mean loss; stable for ties",
        "edge_cases": {
            "equal_means": "r_Q = 0.0",
            "all_sigma2_zero": "r_Q = +inf",
            "fewer_than_2_points": "r_Q = nan (undefined), counted in n_undefined",
        },
        "aggregation": "mean/std/bootstrap percentile CI over finite runs; median over defined runs",
        "rank_by": "r_q mean (rank 1 = highest r_Q = most secure; ties averaged)",
        "reference_run_skipped": REFERENCE_RUN,
        "variants": list(variants),
        "n_boot": n_boot,
        "confidence": confidence,
        "n_resamples": n_resamples,
        "seed": seed,
    }
