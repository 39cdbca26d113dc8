"""LiRA (Carlini et al. 2022): Gaussian fits of a sample's scores under reference models, offline and online."""

from __future__ import annotations

import warnings

import numpy as np
from scipy import stats

from llmaudit.common.stats import ROUNDING_ULPS, rounding_tolerance

STATISTICS = ("logit", "neg_loss")

VARIANCES = ("per_sample", "global")


class LiraWarning(UserWarning):
    """Some samples could not be scored by LiRA (too few reference models): their score is NaN."""


def confidence_logit(loss) -> np.ndarray:
    """LiRA statistic logit(exp(-L)) = -L - log(1 - exp(-L)), computed stably; L is clipped at 1e-12."""
    loss = np.maximum(np.asarray(loss, dtype=np.float64), 1e-12)
    return -loss - np.log(-np.expm1(-loss))


def lira_statistic(loss, statistic: str = "logit") -> np.ndarray:
    """The per-(model, sample) statistic LiRA models as Gaussian: "logit" (default) or "neg_loss" (-L)."""
    if statistic == "logit":
        return confidence_logit(loss)
    if statistic == "neg_loss":
        return -np.asarray(loss, dtype=np.float64)
    raise ValueError(f"statistic must be one of {STATISTICS}; got {statistic!r}.")


def fpc(n_train: float, n_pool: float) -> float:
    """Finite population correction 1 - n_train / n_pool for reference models trained on overlapping
    subsets (without replacement) of a pool of n_pool samples, n_train samples each."""
    if not 0 < n_train < n_pool:
        raise ValueError(
            f"the finite population correction needs 0 < n_train < n_pool; got n_train={n_train}, "
            f"n_pool={n_pool} (with n_train == n_pool every model saw the whole pool and the spread of "
            "out-scores is undefined)."
        )
    return 1.0 - n_train / n_pool


def parse_fpc(value: str | float | None, *, n_train: float | None = None, n_pool: float | None = None) -> float | None:
    """The finite population correction a setting asks for: "auto" = `fpc(n_train, n_pool)` (None when
    the sizes are not given yet: the setting is only validated), "off" or None = no correction, else a
    number in (0, 1]. Recipes, the command line and `run_attacks` all read it here."""
    if value is None or value == "off":
        return None
    if value == "auto":
        return None if n_train is None or n_pool is None else fpc(n_train, n_pool)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"fpc must be 'auto', 'off', or a number in (0, 1]; got {value!r}.") from None
    if not 0 < number <= 1:
        raise ValueError(f"fpc must lie in (0, 1]; got {number}.")
    return number


def _check_lira(scores, keep, target) -> tuple[np.ndarray, np.ndarray, int]:
    scores = np.asarray(scores, dtype=np.float64)
    keep = np.asarray(keep).astype(bool)
    if scores.ndim != 2 or scores.shape != keep.shape:
        raise ValueError(f"scores and keep must both be [M models, N samples]; got {scores.shape} and {keep.shape}.")
    target = int(target)
    if not -scores.shape[0] <= target < scores.shape[0]:
        raise IndexError(f"target {target} is not a model index (M = {scores.shape[0]}).")
    return scores, keep, target % scores.shape[0]


def _squared_deviations(scores, mask):
    """(n, mean, sum of squared deviations) of scores[mask] per column, deviations within rounding counted as 0."""
    n = mask.sum(0)
    mu = np.where(mask, scores, 0.0).sum(0) / np.maximum(n, 1)
    dev = np.where(mask, scores - mu, 0.0)
    dev = np.where(np.abs(dev) <= rounding_tolerance(scores, mask), 0.0, dev)
    return n, mu, (dev**2).sum(0)


def _gaussian_fit(scores, mask, variance: str, fpc_value, min_refs: int):
    """Mean and sd of scores[mask] per column; per-sample or pooled (global) variance; var / fpc. Deviations within
    rounding of the values are 0 (`rounding_tolerance`): references equal but for rounding have zero spread."""
    if variance not in VARIANCES:
        raise ValueError(f"variance must be one of {VARIANCES}; got {variance!r}.")
    n, mu, sq = _squared_deviations(scores, mask)
    if variance == "per_sample":
        with np.errstate(invalid="ignore", divide="ignore"):
            var = np.where(n >= 2, sq / np.maximum(n - 1, 1), np.nan)
    else:  # one variance for all samples: pooled within-sample deviations
        dof = np.maximum(n - 1, 0)
        var = np.full(n.shape, sq[n >= 2].sum() / dof.sum() if dof.sum() > 0 else np.nan)
    if fpc_value is not None:
        if not 0 < fpc_value <= 1:
            raise ValueError(f"fpc must lie in (0, 1]; got {fpc_value}.")
        var = var / fpc_value
    sd = np.sqrt(var)
    ok = (n >= min_refs) & np.isfinite(sd) & (sd > 0)
    return np.where(ok, mu, np.nan), np.where(ok, sd, np.nan), n


def _drop_first(mask: np.ndarray, order: np.ndarray, columns: np.ndarray) -> None:
    """In place: in each column where `columns` is True, the first True of `mask` in row order `order` -> False."""
    cols = np.flatnonzero(columns)
    if order.size == 0 or cols.size == 0:  # one model: no other model holds a reference to drop
        return
    sub = mask[np.ix_(order, cols)]
    has = sub.any(axis=0)
    mask[order[sub.argmax(axis=0)[has]], cols[has]] = False


def balanced_references(keep, target: int) -> tuple[np.ndarray, np.ndarray]:
    """([M, N] OUT references, [M, N] IN references) of `target`: the OTHER models where each sample was out (in),
    with as many for a sample the target trained on as for one it did not. Without the balance a member of the
    target would have one OUT reference more than a non-member (and one IN reference fewer), so the calibration
    of a member's score (its Student-t threshold, the noise of a mean over references) would differ from a
    non-member's by construction: a null score (no membership effect) would then give members and non-members
    different hit rates at the threshold whenever it is not exactly Gaussian. With the balance, a member's and a
    non-member's calibrated scores of the same sample are identically distributed under the null, whatever the
    score's distribution. The reference dropped is the first other model after the target (cyclically) that
    holds one; docs/science.md section 4."""
    keep = np.asarray(keep).astype(bool)
    M = keep.shape[0]
    out_refs, in_refs = ~keep, keep.copy()
    out_refs[target] = False
    in_refs[target] = False
    order = (target + 1 + np.arange(M - 1)) % M
    _drop_first(out_refs, order, keep[target])  # a member would have one OUT reference more
    _drop_first(in_refs, order, ~keep[target])  # a non-member would have one IN reference more
    return out_refs, in_refs


def out_reference_counts(keep) -> np.ndarray:
    """[M, N]: for target m and sample j, the number of OUT references calibration uses (`balanced_references`):
    the models other than the target where j was out, one fewer than all models where it was out, whatever
    the target's own membership (0 where j was out nowhere)."""
    keep = np.asarray(keep).astype(bool)
    return np.broadcast_to(np.maximum((~keep).sum(0) - 1, 0)[None, :], keep.shape).copy()


def in_reference_counts(keep) -> np.ndarray:
    """[M, N]: the number of IN references of target m for sample j (`balanced_references`): one fewer than all
    models that trained on j."""
    keep = np.asarray(keep).astype(bool)
    return np.broadcast_to(np.maximum(keep.sum(0) - 1, 0)[None, :], keep.shape).copy()


ZERO_SPREAD_RULES = ("nan", "pooled")
"""What `lira_offline` does with a sample whose OUT references all score the same (zero spread): NaN, or
standardize it with the pooled within-sample sd of every sample (fixed-variance LiRA for that sample)."""


def _zero_spread_pooled(scores, refs, mu, sd, n, fpc_value, min_out: int):
    """mu, sd with every zero-spread sample (n >= min_out, sd == 0) given the pooled within-sample sd, and
    the samples still without a usable sd (the pooled sd is zero too: every sample tied) given sd = inf where
    the target equals its references (z = 0, no evidence either way)."""
    _, raw_mu, sq = _squared_deviations(scores, refs)
    dof = np.maximum(n - 1, 0)
    pooled = sq.sum() / dof.sum() if dof.sum() > 0 else 0.0
    if fpc_value is not None:
        pooled = pooled / fpc_value
    tied = (n >= min_out) & ~np.isfinite(sd) & (sq == 0)
    mu = np.where(tied, raw_mu, mu)
    if pooled > 0:
        return mu, np.where(tied, np.sqrt(pooled), sd)
    return mu, np.where(tied, np.inf, sd)


def lira_offline(
    scores,
    keep,
    target,
    fpc=None,
    *,
    variance: str = "per_sample",
    min_out: int | None = None,
    zero_spread: str = "nan",
) -> np.ndarray:
    """Offline LiRA: [N] target scores standardized by each sample's OUT distribution.

    scores: [M, N] LiRA statistic (higher = member, e.g. `confidence_logit(loss)`); keep: [M, N] booleans,
    True where model m trained on sample j; target: index of the attacked model. For each sample j,
    mu_out and sigma_out come only from models i != target with keep[i, j] False; sigma^2 is divided by
    `fpc` when given (finite population correction, `fpc(n_train, n_pool)`); as many references for a member of
    the target as for a non-member (`balanced_references`). variance="global" uses one
    pooled within-sample variance for all samples (steadier with few references). Returns
    (t_target - mu_out) / sigma_out: ~N(0, 1) for non-members, higher = member. Samples with fewer than
    `min_out` out references (default 2 per-sample, 1 global) get NaN, and so do samples whose references
    all score the same (zero spread) unless zero_spread="pooled": then such a sample is standardized by the
    pooled within-sample sd of all samples, and where that is zero too (every sample tied) it scores 0 if
    the target equals its references and NaN otherwise. A LiraWarning reports how many are NaN."""
    scores, keep, target = _check_lira(scores, keep, target)
    refs, _ = balanced_references(keep, target)
    refs &= np.isfinite(scores)
    if min_out is None:
        min_out = 2 if variance == "per_sample" else 1
    if zero_spread not in ZERO_SPREAD_RULES:
        raise ValueError(f"zero_spread must be one of {ZERO_SPREAD_RULES}; got {zero_spread!r}.")
    mu, sd, n = _gaussian_fit(scores, refs, variance, fpc, min_out)
    if zero_spread == "pooled":
        mu, sd = _zero_spread_pooled(scores, refs, mu, sd, n, fpc, min_out)
    with np.errstate(invalid="ignore"):
        z = (scores[target] - mu) / sd
    if zero_spread == "pooled":  # sd = inf (everything tied): 0 where the target ties too, else no evidence
        tol = np.maximum(rounding_tolerance(scores, refs), ROUNDING_ULPS * np.finfo(np.float64).eps * np.abs(mu))
        ties = np.abs(scores[target] - mu) <= tol
        z = np.where(np.isinf(sd), np.where(ties, 0.0, np.nan), z)
    n_nan = int(np.isnan(z).sum())
    if n_nan:
        warnings.warn(
            f"offline LiRA: {n_nan} of {z.size} samples have fewer than {min_out} out-references (or zero "
            "spread) and score NaN.",
            LiraWarning,
            stacklevel=2,
        )
    return z


def lira_online(
    scores, keep, target, fpc=None, *, variance: str = "per_sample", min_in: int = 2, min_out: int = 2
) -> np.ndarray:
    """Online LiRA: [N] log-likelihood ratio log N(t; mu_in, sd_in) - log N(t; mu_out, sd_out).

    Same inputs as `lira_offline`; the IN Gaussian comes from the other models that trained on the
    sample. Samples with fewer than min_in in- or min_out out-references score NaN (LiraWarning)."""
    scores, keep, target = _check_lira(scores, keep, target)
    out_refs, in_refs = balanced_references(keep, target)
    finite = np.isfinite(scores)
    mu_in, sd_in, _ = _gaussian_fit(scores, in_refs & finite, variance, fpc, min_in)
    mu_out, sd_out, _ = _gaussian_fit(scores, out_refs & finite, variance, fpc, min_out)
    t = scores[target]
    llr = stats.norm.logpdf(t, mu_in, sd_in) - stats.norm.logpdf(t, mu_out, sd_out)
    n_nan = int(np.isnan(llr).sum())
    if n_nan:
        warnings.warn(
            f"online LiRA: {n_nan} of {llr.size} samples lack {min_in} in- or {min_out} out-references and score NaN.",
            LiraWarning,
            stacklevel=2,
        )
    return llr


def normality_check(out_scores, keep=None, *, level: float = 0.05, min_n: int = 5) -> dict:
    """Shapiro-Wilk per sample on its out-scores: the share of samples rejected at `level`.

    out_scores: [M, N]; keep: optional [M, N], then only entries with keep False are tested. Samples with
    fewer than min_n finite entries are skipped. Under exact normality the share is about `level`; a
    much larger share means the Gaussian calibration of LiRA is off for this statistic."""
    scores = np.asarray(out_scores, dtype=np.float64)
    mask = np.isfinite(scores) if keep is None else (~np.asarray(keep, bool) & np.isfinite(scores))
    p_values = []
    for j in range(scores.shape[1]):
        col = scores[mask[:, j], j]
        if col.size >= max(min_n, 3) and np.ptp(col) > 0:
            p_values.append(stats.shapiro(col).pvalue)
    p_values = np.asarray(p_values)
    return {
        "test": "shapiro-wilk",
        "level": float(level),
        "n_samples_tested": int(p_values.size),
        "share_rejected": float((p_values < level).mean()) if p_values.size else float("nan"),
        "expected_share_if_gaussian": float(level),
    }


def leave_one_out(fn, scores, keep, fpc_value, **kw) -> np.ndarray:
    """[M, N] of `fn` (lira_offline or lira_online) with each run in turn the target and the others its
    references; LiRA's warnings about thin references are left to the evaluation's `skipped` reasons."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiraWarning)
        return np.stack([fn(scores, keep, m, fpc_value, **kw) for m in range(scores.shape[0])])
