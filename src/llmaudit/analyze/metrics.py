"""Scoring membership inference attacks: ROC metrics, bootstrap CIs, and pooled vs calibrated evaluation.

Pure functions (arrays in, numbers out; no I/O). Conventions, all from docs/science.md section 4:
- A score is "higher = more likely a member"; a label is True/1 for members.
- TPR at FPR alpha is the LARGEST TPR on the empirical ROC curve whose FPR is <= alpha.
- It is only *reliable* when there are at least 10 / alpha negatives (about 10 false positives are
  needed at the threshold). Unreliable values are kept but flagged (`reliable: False`); a report must
  not present them as solid numbers.
- Over M target models x N samples three evaluations are reported side by side (docs/science.md
  "Calibrating attacks evaluated over many samples and models"):
    pooled_naive      concatenate all M*N scores and use one global threshold (what most papers do;
                      every sample then gets a different FPR and the TPR at low FPR is overstated);
    pooled_calibrated per-sample standardized scores z (out-distribution ~ N(0, 1)) with the threshold
                      Phi^-1(1 - alpha), or a Student-t predictive quantile when few reference models
                      (n_ref < `T_CUTOFF`) estimated each sample's out-distribution;
    per_sample_tpr    each sample's own ROC over the M models (its in-models vs its out-models), TPR at
                      FPR alpha, averaged over samples; reliable only when every sample has >= 10 / alpha
                      out-models (docs/science.md: "M >= 10 / alpha target models if scores are not pooled").
Confidence intervals are percentile bootstraps over SAMPLES: in pooled evaluations a resampled sample
brings all of its M scores (its rows are correlated across models), so rows are never resampled alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from llmaudit.analyze.bootstrap import FPR_TOL, Resampling, bootstrap_stats, fpr_key, resample_counts
from llmaudit.common.stats import percentile_interval

DEFAULT_FPRS: tuple[float, ...] = (0.2, 0.15, 0.1, 0.05, 0.03, 0.01, 0.001)

# Below this many reference models the calibrated threshold uses the Student-t predictive quantile
# t_{n-1}(1 - alpha) * sqrt(1 + 1/n) instead of Phi^-1(1 - alpha): with a mean and spread estimated
# from n Gaussian out-scores, (x - mean) / sd of a fresh out-score follows exactly
# sqrt(1 + 1/n) * t_{n-1}. At n = 30 the two thresholds for alpha = 1% are 2.33 and 2.50, about 7% apart.
T_CUTOFF = 30

_FPR_TOL = FPR_TOL  # k / n_neg compared with alpha in floating point

_CURVE_GRID = np.logspace(-4, 0, 61)


def is_reliable(n_negatives: int | float, alpha: float) -> bool:
    """TPR at FPR alpha is estimable only with at least 10 / alpha negatives."""
    return bool(n_negatives * alpha >= 10 - 1e-9)


def _prepare(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel().astype(bool)
    if scores.shape != labels.shape:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} differ in length.")
    if not np.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf; drop those entries first (pooled_* functions do).")
    n_pos = int(labels.sum())
    if n_pos == 0 or n_pos == labels.size:
        raise ValueError(
            f"need both members and non-members to score an attack (got {n_pos} members of {labels.size})."
        )
    return scores, labels


def tpr_at_fpr(scores, labels, alpha: float) -> tuple[float, float]:
    """(TPR, threshold): the largest TPR on the empirical ROC with FPR <= alpha; members are scores >= threshold.

    scores, labels: [n]. The threshold is +inf when no positive threshold keeps FPR <= alpha."""
    scores, labels = _prepare(scores, labels)
    fpr, tpr, thr = roc_curve(labels, scores, drop_intermediate=False)
    idx = int(np.searchsorted(fpr, alpha + _FPR_TOL, side="right")) - 1  # fpr is non-decreasing
    return float(tpr[idx]), float(thr[idx])


def roc_metrics(scores, labels, fprs: Sequence[float] = DEFAULT_FPRS) -> dict:
    """AUROC, average precision and TPR at each FPR level, with reliability flags.

    scores, labels: [n] (higher score = member; label True = member). Returns a JSON-ready dict:
    {"auroc", "average_precision", "n_positives", "n_negatives",
     "tpr_at_fpr": {"0.01": {"tpr", "threshold", "reliable", "min_negatives"}, ...}}."""
    scores, labels = _prepare(scores, labels)
    n_neg = int((~labels).sum())
    fpr, tpr, thr = roc_curve(labels, scores, drop_intermediate=False)
    at = {}
    for alpha in fprs:
        idx = int(np.searchsorted(fpr, alpha + _FPR_TOL, side="right")) - 1
        at[fpr_key(alpha)] = {
            "tpr": float(tpr[idx]),
            "threshold": float(thr[idx]),
            "reliable": is_reliable(n_neg, alpha),
            "min_negatives": int(np.ceil(10 / alpha - 1e-9)),
        }
    return {
        "auroc": float(roc_auc_score(labels, scores)),
        "average_precision": float(average_precision_score(labels, scores)),
        "n_positives": int(labels.sum()),
        "n_negatives": n_neg,
        "tpr_at_fpr": at,
    }


def roc_curve_loglog(scores, labels, grid: np.ndarray = _CURVE_GRID) -> dict:
    """A compact ROC for log-log plots: TPR (largest with FPR <= f) at each f of a log-spaced grid.

    Grid points below 1 / n_negatives are left out: no FPR between 0 and 1 / n_negatives is observable."""
    scores, labels = _prepare(scores, labels)
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    grid = np.asarray(grid, dtype=np.float64)
    grid = grid[grid * (~labels).sum() >= 1 - 1e-9]
    idx = np.searchsorted(fpr, grid + _FPR_TOL, side="right") - 1
    return {"fpr": [float(g) for g in grid], "tpr": [float(t) for t in tpr[idx]]}


def _percentile(values: np.ndarray, confidence: float) -> dict:
    """`percentile_interval` of the finite resampled statistics as {"low", "high"} (nan, nan when none)."""
    low, high = percentile_interval(values, confidence)
    return {"low": low, "high": high}


def _resampling_units(
    labels: np.ndarray, groups, stratified: bool, n_rows: int
) -> tuple[np.ndarray, int, np.ndarray | None]:
    """(unit of each row [n], number of units, stratum of each unit or None) of `bootstrap_ci`: a row is its
    own unit without groups; with `stratified`, a unit's stratum is its label (a group must be one class)."""
    if groups is None:
        unit_of_row = np.arange(n_rows)
    else:
        _, unit_of_row = np.unique(np.asarray(groups).ravel(), return_inverse=True)
        if unit_of_row.size != n_rows:
            raise ValueError("groups must have one entry per score.")
    n_units = int(unit_of_row.max()) + 1
    if stratified:
        if groups is not None:
            unit_label = np.zeros(n_units)
            np.add.at(unit_label, unit_of_row, labels.astype(float))
            unit_size = np.bincount(unit_of_row, minlength=n_units)
            if not np.all((unit_label == 0) | (unit_label == unit_size)):
                raise ValueError("stratified=True needs every group to be all members or all non-members.")
            strata = unit_label > 0
        else:
            strata = labels
    else:
        strata = None
    return unit_of_row, n_units, strata


def bootstrap_ci(
    scores,
    labels,
    *,
    fprs: Sequence[float] = DEFAULT_FPRS,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    groups=None,
    resampling: Resampling = Resampling(),
) -> dict:
    """Percentile bootstrap CIs of AUROC, average precision and TPR at each FPR.

    scores, labels: [n]. groups: optional [n] resampling unit of each row (e.g. the sample index when
    scores pool several models): a drawn unit brings all its rows. resampling: whether the numbers of members
    and non-members stay fixed in every resample (`Resampling`).
    Resamples that lose one class give NaN and are ignored.
    Returns
    {"auroc": {"low", "high"}, "average_precision": {...}, "tpr_at_fpr": {key: {...}}, "n_boot", ...}."""
    scores, labels = _prepare(scores, labels)
    stratified = resampling.stratified
    if stratified is None:
        stratified = groups is None
    unit_of_row, n_units, strata = _resampling_units(labels, groups, stratified, scores.size)
    parts = bootstrap_stats(scores, labels, unit_of_row, n_units, strata, fprs, n_boot, seed)
    joined = {
        "auroc": np.concatenate([p["auroc"] for p in parts]),
        "average_precision": np.concatenate([p["average_precision"] for p in parts]),
    }
    out = {name: _percentile(vals, confidence) for name, vals in joined.items()}
    out["tpr_at_fpr"] = {
        fpr_key(a): _percentile(np.concatenate([p["tpr_at_fpr"][fpr_key(a)] for p in parts]), confidence) for a in fprs
    }
    out.update(
        n_boot=int(n_boot),
        confidence=float(confidence),
        seed=int(seed),
        method="percentile bootstrap",
        resampling="groups (samples)"
        if groups is not None
        else ("rows, stratified by label" if stratified else "rows"),
    )
    return out


def _pool_inputs(scores, members) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64)
    members = np.asarray(members).astype(bool)
    if scores.ndim != 2 or scores.shape != members.shape:
        raise ValueError(f"expected scores and members of the same shape [M, N]; got {scores.shape}, {members.shape}.")
    return scores, members


def per_sample_fpr(scores, members, threshold) -> np.ndarray:
    """[N] share of each sample's non-member entries (over the M models) with score >= threshold.

    scores, members: [M, N]; threshold: scalar or broadcastable to [M, N]. NaN where a sample has no
    finite non-member entry. Shows how one global threshold treats samples unequally."""
    scores, members = _pool_inputs(scores, members)
    out = ~members & np.isfinite(scores)
    with np.errstate(invalid="ignore"):
        hits = (out & (scores >= threshold)).sum(0)
    n_out = out.sum(0)
    return np.where(n_out > 0, hits / np.maximum(n_out, 1), np.nan)


def _spread(values: np.ndarray) -> dict:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {"p10": float("nan"), "median": float("nan"), "p90": float("nan")}
    p10, med, p90 = np.quantile(values, [0.1, 0.5, 0.9])
    return {"p10": float(p10), "median": float(med), "p90": float(p90)}


def pooled_naive(
    scores,
    members,
    fprs: Sequence[float] = DEFAULT_FPRS,
    *,
    n_boot: int = 0,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """Concatenate the scores of M target models x N samples and apply ONE global threshold.

    scores, members: [M, N]. Non-finite scores are dropped (counted in "n_dropped"). Returns roc_metrics
    of the pooled rows plus, for each FPR level, the spread (p10/median/p90) over samples of the per-sample
    FPR at the global threshold (wide = miscalibrated), and bootstrap CIs over samples if n_boot > 0."""
    scores, members = _pool_inputs(scores, members)
    finite = np.isfinite(scores)
    sample_index = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    result = roc_metrics(scores[finite], members[finite], fprs)
    for entry in result["tpr_at_fpr"].values():
        entry["per_sample_fpr"] = _spread(per_sample_fpr(scores, members, entry["threshold"]))
    result.update(
        evaluation="pooled_naive",
        n_models=int(scores.shape[0]),
        n_samples=int(scores.shape[1]),
        n_dropped=int((~finite).sum()),
    )
    if n_boot > 0:
        result["ci"] = bootstrap_ci(
            scores[finite],
            members[finite],
            fprs=fprs,
            n_boot=n_boot,
            confidence=confidence,
            seed=seed,
            groups=sample_index[finite],
        )
    return result


def calibrated_threshold(alpha: float, n_ref=None, t_cutoff: float = T_CUTOFF):
    """Threshold on per-sample standardized scores giving FPR alpha per sample.

    Phi^-1(1 - alpha) when n_ref is None or n_ref >= t_cutoff; otherwise the Student-t predictive quantile
    t_{n_ref - 1}(1 - alpha) * sqrt(1 + 1/n_ref) (exact for Gaussian out-scores whose mean and sd were
    estimated from n_ref reference models). n_ref: scalar or array (e.g. [M, N]); n_ref < 2 gives NaN."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1); got {alpha}.")
    normal = float(stats.norm.ppf(1 - alpha))
    if n_ref is None:
        return normal
    n = np.asarray(n_ref, dtype=np.float64)
    values, where = np.unique(n, return_inverse=True)  # a few reference counts: each quantile computed once
    with np.errstate(invalid="ignore", divide="ignore"):
        student = stats.t.ppf(1 - alpha, df=np.where(values >= 2, values - 1, np.nan)) * np.sqrt(1 + 1 / values)
    thr = np.where(values >= t_cutoff, normal, student)[where].reshape(n.shape)
    return float(thr) if thr.ndim == 0 else thr


def _ci_block(ci: dict, n_boot: int, confidence: float, seed: int) -> dict:
    """The "ci" entry of `pooled_calibrated` and `per_sample_tpr`: per-level intervals and how they were drawn."""
    return {
        "tpr_at_fpr": ci,
        "n_boot": int(n_boot),
        "confidence": float(confidence),
        "seed": int(seed),
        "method": "percentile bootstrap",
        "resampling": "samples",
    }


def _calibrated_level(
    z: np.ndarray, members: np.ndarray, finite: np.ndarray, n_ref, alpha: float, t_cutoff: float
) -> tuple[np.ndarray, dict]:
    """One FPR level of `pooled_calibrated`: (per-sample counts [4, N]: in above, in, out above, out; the level's
    entry: pooled TPR and realised FPR at the calibrated threshold, the threshold, its kind, reliability)."""
    thr = calibrated_threshold(alpha, n_ref, t_cutoff)
    with np.errstate(invalid="ignore"):
        above = finite & (z >= thr)
    sums = np.stack(
        [
            (members & above).sum(0),
            (members & finite).sum(0),
            (~members & above).sum(0),
            (~members & finite).sum(0),
        ]
    ).astype(np.float64)  # [4, N] per-sample counts: in above, in, out above, out
    n_in, n_out = sums[1].sum(), sums[3].sum()
    thr_arr = np.asarray(thr)
    entry = {
        "tpr": float(sums[0].sum() / n_in) if n_in else float("nan"),
        "realised_fpr": float(sums[2].sum() / n_out) if n_out else float("nan"),
        "threshold": float(thr_arr) if thr_arr.ndim == 0 else _spread(thr_arr[finite]),
        "threshold_kind": "normal"
        if n_ref is None or np.all(n_ref[finite] >= t_cutoff)
        else f"student-t where n_ref < {t_cutoff:g}",
        "reliable": is_reliable(n_out, alpha),
        "min_negatives": int(np.ceil(10 / alpha - 1e-9)),
        "n_negatives": int(n_out),  # non-member scores with a finite calibrated score: what `reliable` counts
    }
    return sums, entry


def _calibrated_ci(
    z: np.ndarray,
    members: np.ndarray,
    finite: np.ndarray,
    per_alpha_sums: dict[str, np.ndarray],
    with_roc: bool,
    *,
    n_boot: int,
    seed: int,
    confidence: float,
) -> dict:
    """The "ci" entry of `pooled_calibrated`: samples resampled with all their models (one generator, `seed`)
    for the TPR and realised FPR of each level; with `with_roc`, also `bootstrap_ci` of the pooled z's AUROC
    and average precision (groups = samples, its own generator from the same seed)."""
    rng = np.random.default_rng(seed)
    ci = {}
    counts = resample_counts(rng, z.shape[1], n_boot)  # [B, N]: samples resampled with all models
    keys = list(per_alpha_sums)
    stacked = np.concatenate([per_alpha_sums[k] for k in keys]) if keys else np.zeros((0, z.shape[1]))
    every = (counts @ stacked.T).reshape(n_boot, len(keys), 4)  # every level at once; integer sums, exact
    for i, key in enumerate(keys):
        boot = every[:, i]  # [B, 4]
        with np.errstate(invalid="ignore", divide="ignore"):
            ci[key] = {
                "tpr": _percentile(boot[:, 0] / boot[:, 1], confidence),
                "realised_fpr": _percentile(boot[:, 2] / boot[:, 3], confidence),
            }
    out = _ci_block(ci, n_boot, confidence, seed)
    if with_roc:
        sample_index = np.broadcast_to(np.arange(z.shape[1]), z.shape)
        roc_ci = bootstrap_ci(
            z[finite],
            members[finite],
            fprs=(),
            n_boot=n_boot,
            confidence=confidence,
            seed=seed,
            groups=sample_index[finite],
        )
        out["roc"] = {"auroc": roc_ci["auroc"], "average_precision": roc_ci["average_precision"]}
    return out


def pooled_calibrated(
    z,
    members,
    alphas: Sequence[float] = DEFAULT_FPRS,
    n_ref=None,
    *,
    t_cutoff: float = T_CUTOFF,
    n_boot: int = 0,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """TPR and realised FPR of per-sample calibrated scores at the calibrated threshold for each alpha.

    z: [M, N] per-sample standardized scores (each sample's out-distribution ~ N(0, 1), e.g. from
    `attacks.lira_offline`); members: [M, N]; n_ref: None, scalar, [N] or [M, N] number of reference
    models behind each standardization (selects the Student-t threshold below t_cutoff). Non-finite z
    are dropped. The realised FPR should be close to alpha: a gap means the Gaussian calibration is off.
    Also returns the ROC metrics of the pooled z (one threshold is now fair to every sample)."""
    z, members = _pool_inputs(z, members)
    finite = np.isfinite(z)
    if n_ref is not None:
        n_ref = np.broadcast_to(np.asarray(n_ref, dtype=np.float64), z.shape)
    at: dict = {}
    per_alpha_sums = {}
    for alpha in alphas:
        per_alpha_sums[fpr_key(alpha)], at[fpr_key(alpha)] = _calibrated_level(
            z, members, finite, n_ref, alpha, t_cutoff
        )
    result = {
        "evaluation": "pooled_calibrated",
        "n_models": int(z.shape[0]),
        "n_samples": int(z.shape[1]),
        "n_dropped": int((~finite).sum()),
        "tpr_at_fpr": at,
        "per_sample_fpr": {
            fpr_key(a): _spread(np.where(s[3] > 0, s[2] / np.maximum(s[3], 1), np.nan))
            for a, s in zip(alphas, per_alpha_sums.values())
        },
    }
    if finite.any() and 0 < members[finite].sum() < finite.sum():
        roc = roc_metrics(z[finite], members[finite], alphas)
        result["roc"] = {"auroc": roc["auroc"], "average_precision": roc["average_precision"]}
    if n_boot > 0:
        result["ci"] = _calibrated_ci(
            z, members, finite, per_alpha_sums, "roc" in result, n_boot=n_boot, seed=seed, confidence=confidence
        )
    return result


def _per_sample_level(
    scores: np.ndarray,
    is_in: np.ndarray,
    is_out: np.ndarray,
    out_sorted: np.ndarray,
    used: np.ndarray,
    alpha: float,
) -> tuple[np.ndarray, dict]:
    """One FPR level of `per_sample_tpr`: (TPR_j [N], nan for unused samples; the level's entry: mean TPR and
    realised FPR over the used samples, reliability). is_in, is_out [M, N]: finite in- / out-entries;
    out_sorted [M, N]: each sample's out-scores descending, -inf padded; used [N]: samples with both."""
    n_in = is_in.sum(0)
    n_out = is_out.sum(0)
    cols = np.arange(scores.shape[1])
    k = np.floor(alpha * n_out + 1e-9).astype(int)
    thr = np.where(k < n_out, out_sorted[np.minimum(k, scores.shape[0] - 1), cols], -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpr_j = np.where(used, (is_in & (scores > thr)).sum(0) / np.maximum(n_in, 1), np.nan)
        fpr_j = np.where(used, (is_out & (scores > thr)).sum(0) / np.maximum(n_out, 1), np.nan)
    entry = {
        "tpr": float(np.nanmean(tpr_j)) if used.any() else float("nan"),
        "realised_fpr": float(np.nanmean(fpr_j)) if used.any() else float("nan"),
        "reliable": bool(used.any() and is_reliable(int(n_out[used].min()), alpha)),
        "min_negatives": int(np.ceil(10 / alpha - 1e-9)),
    }
    return tpr_j, entry


def per_sample_tpr(
    scores,
    members,
    alphas: Sequence[float] = DEFAULT_FPRS,
    *,
    n_boot: int = 0,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict:
    """Average over samples of each sample's own TPR at FPR alpha (no pooling across samples).

    scores, members: [M, N]. For sample j the M models split into its in-models (positives) and
    out-models (negatives); with n_out out-models the threshold is the (k+1)-th largest out-score,
    k = floor(alpha * n_out), so the sample's empirical FPR is <= alpha, and TPR_j is the share of its
    in-scores above it. Samples lacking an in- or an out-model are skipped ("n_samples_used"). The value
    is reliable only when every used sample has n_out >= 10 / alpha; with alpha * n_out < 1 the sample's
    threshold sits above all its out-scores (FPR 0) and TPR_j is a conservative lower bound."""
    scores, members = _pool_inputs(scores, members)
    finite = np.isfinite(scores)
    is_in = members & finite
    is_out = ~members & finite
    n_in = is_in.sum(0)
    n_out = is_out.sum(0)
    used = (n_in > 0) & (n_out > 0)
    out_sorted = -np.sort(-np.where(is_out, scores, -np.inf), axis=0)  # descending, -inf padding at the end
    at = {}
    per_alpha = {}
    for alpha in alphas:
        per_alpha[fpr_key(alpha)], at[fpr_key(alpha)] = _per_sample_level(
            scores, is_in, is_out, out_sorted, used, alpha
        )
    result = {
        "evaluation": "per_sample",
        "n_models": int(scores.shape[0]),
        "n_samples": int(scores.shape[1]),
        "n_samples_used": int(used.sum()),
        "n_out_models": _spread(n_out[used].astype(float)) | {"min": int(n_out[used].min()) if used.any() else 0},
        "tpr_at_fpr": at,
    }
    if n_boot > 0 and used.any():
        rng = np.random.default_rng(seed)
        counts = resample_counts(rng, int(used.sum()), n_boot)
        ci = {}
        for key, tpr_j in per_alpha.items():
            with np.errstate(invalid="ignore", divide="ignore"):
                ci[key] = {"tpr": _percentile(counts @ tpr_j[used] / counts.sum(1), confidence)}
        result["ci"] = _ci_block(ci, n_boot, confidence, seed)
    return result
