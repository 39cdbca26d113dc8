"""Evaluating an attack over M target models x N samples: pooled naive, pooled calibrated and per-sample.

Pure functions (arrays in, numbers out; no I/O); the conventions of `llmaudit.analyze.metrics`. Three evaluations
are reported side by side (docs/science.md "Calibrating attacks evaluated over many samples and models"):
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

from llmaudit.analyze.bootstrap import fpr_key, resample_counts
from llmaudit.analyze.metrics import DEFAULT_FPRS, _percentile, bootstrap_ci, is_reliable, roc_metrics

# Below this many reference models the calibrated threshold uses the Student-t predictive quantile
# t_{n-1}(1 - alpha) * sqrt(1 + 1/n) instead of Phi^-1(1 - alpha): with a mean and spread estimated
# from n Gaussian out-scores, (x - mean) / sd of a fresh out-score follows exactly
# sqrt(1 + 1/n) * t_{n-1}. At n = 30 the two thresholds for alpha = 1% are 2.33 and 2.50, about 7% apart.
T_CUTOFF = 30


def _pool_inputs(scores, members) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64)
    members = np.asarray(members).astype(bool)
    if scores.ndim != 2 or scores.shape != members.shape:
        raise ValueError(f"expected scores and members of the same shape [M, N]; got {scores.shape}, {members.shape}.")
    return scores, members


def per_sample_fpr(scores, members, threshold) -> np.ndarray:
    """Compute each sample's share of non-member entries (over the M models) with score >= threshold.

    It shows how one global threshold treats samples unequally.

    Args:
        scores (np.ndarray): [M, N] scores of M target models on N samples, higher = member.
        members (np.ndarray): [M, N] membership.
        threshold (float | np.ndarray): scalar or broadcastable to [M, N].
    Returns:
        np.ndarray: [N] shares, NaN where a sample has no finite non-member entry.
    """
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
    """Concatenate the scores of M target models x N samples and apply one global threshold.

    Args:
        scores (np.ndarray): [M, N] scores of M target models on N samples, higher = member.
        members (np.ndarray): [M, N] membership.
        fprs (Sequence[float]): the FPR levels.
        n_boot (int): bootstrap resamples of samples (0: no intervals).
        seed (int): the resampling seed.
        confidence (float): the intervals' confidence.
    Returns:
        dict: `roc_metrics` of the pooled finite rows (non-finite ones counted in "n_dropped"), for each level the
        spread (p10/median/p90) over samples of the per-sample FPR at the global threshold (wide =
        miscalibrated), and bootstrap CIs over samples when n_boot > 0.
    """
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
    """Compute the threshold on per-sample standardized scores giving FPR alpha per sample.

    Phi^-1(1 - alpha) when n_ref is None or n_ref >= t_cutoff; otherwise the Student-t predictive quantile
    t_{n_ref - 1}(1 - alpha) * sqrt(1 + 1/n_ref), exact for Gaussian out-scores whose mean and sd were estimated
    from n_ref reference models.

    Args:
        alpha (float): the FPR, in (0, 1).
        n_ref (float | np.ndarray | None): reference models per score, scalar or array (e.g. [M, N]).
        t_cutoff (float): from this many references on, the normal threshold.
    Returns:
        float | np.ndarray: the threshold, shaped as n_ref; NaN where n_ref < 2.
    Raises:
        ValueError: when alpha is outside (0, 1).
    """
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
    """Measure TPR and realised FPR of per-sample calibrated scores at the calibrated threshold.

    Args:
        z (np.ndarray): [M, N] per-sample standardized scores (each sample's out-distribution ~ N(0, 1), e.g. from
            `attacks.lira_offline`); non-finite ones are dropped.
        members (np.ndarray): [M, N] membership.
        alphas (Sequence[float]): the FPR levels.
        n_ref (np.ndarray | None): scalar, [N] or [M, N] reference models behind each score (the Student-t
            threshold below t_cutoff).
        t_cutoff (float): from this many references on, the normal threshold.
        n_boot (int): bootstrap resamples of samples (0: no intervals).
        seed (int): the resampling seed.
        confidence (float): the intervals' confidence.
    Returns:
        dict: per level the TPR, the realised FPR (close to alpha unless the calibration is off) and the threshold;
        the ROC metrics of the pooled z; intervals when n_boot > 0.
    """
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
    """Average over samples each sample's own TPR at FPR alpha (no pooling across samples).

    For sample j the M models split into in-models and out-models; the threshold is the (k+1)-th largest
    out-score, k = floor(alpha * n_out), so its empirical FPR is <= alpha. Reliable only when every used sample
    has n_out >= 10 / alpha; with alpha * n_out < 1, TPR_j is a conservative lower bound.

    Args:
        scores (np.ndarray): [M, N] scores of M target models on N samples, higher = member.
        members (np.ndarray): [M, N] membership.
        alphas (Sequence[float]): the FPR levels.
        n_boot (int): bootstrap resamples of samples (0: no intervals).
        seed (int): the resampling seed.
        confidence (float): the intervals' confidence.
    Returns:
        dict: per level the mean TPR and realised FPR over the used samples (those with an in- and an out-model,
        "n_samples_used"), reliability, the spread of n_out, and intervals when n_boot > 0.
    """
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
