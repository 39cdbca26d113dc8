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
    """Compute the LiRA statistic logit(exp(-L)) = -L - log(1 - exp(-L)) stably.

    Args:
        loss (np.ndarray): mean token losses L in nats, any shape; clipped at 1e-12.
    Returns:
        np.ndarray: the statistic, same shape.
    """
    loss = np.maximum(np.asarray(loss, dtype=np.float64), 1e-12)
    return -loss - np.log(-np.expm1(-loss))


def lira_statistic(loss, statistic: str = "logit") -> np.ndarray:
    """Compute the per-(model, sample) statistic LiRA models as Gaussian.

    Args:
        loss (np.ndarray): mean token losses L in nats, any shape.
        statistic (str): "logit" (`confidence_logit`) or "neg_loss" (-L).
    Returns:
        np.ndarray: the statistic, same shape.
    Raises:
        ValueError: on an unknown statistic.
    """
    if statistic == "logit":
        return confidence_logit(loss)
    if statistic == "neg_loss":
        return -np.asarray(loss, dtype=np.float64)
    raise ValueError(f"statistic must be one of {STATISTICS}; got {statistic!r}.")


def fpc(n_train: float, n_pool: float) -> float:
    """Compute the finite population correction 1 - n_train / n_pool.

    It applies to reference models trained on overlapping subsets (without replacement) of one pool.

    Args:
        n_train (float): samples each model trains on.
        n_pool (float): samples in the pool.
    Returns:
        float: the correction, in (0, 1).
    Raises:
        ValueError: unless 0 < n_train < n_pool.
    """
    if not 0 < n_train < n_pool:
        raise ValueError(
            f"the finite population correction needs 0 < n_train < n_pool; got n_train={n_train}, "
            f"n_pool={n_pool} (with n_train == n_pool every model saw the whole pool and the spread of "
            "out-scores is undefined)."
        )
    return 1.0 - n_train / n_pool


def parse_fpc(value: str | float | None, *, n_train: float | None = None, n_pool: float | None = None) -> float | None:
    """Read the finite population correction a setting asks for (recipes, command line, `run_attacks`).

    Args:
        value (str | float | None): "auto" = `fpc(n_train, n_pool)`, "off" or None = no correction, else a number in
            (0, 1].
        n_train (float | None): samples each model trains on; with n_pool None, "auto" is only validated.
        n_pool (float | None): samples in the pool.
    Returns:
        float | None: the correction, None for none (or "auto" without the sizes).
    Raises:
        ValueError: when value is neither "auto", "off" nor a number in (0, 1].
    """
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
    """Choose the OUT and IN references of a target, as many for its members as for its non-members.

    The references are the OTHER models where each sample was out (in). Without the balance a member of the target
    would have one OUT reference more than a non-member (and one IN reference fewer), so a null score would give
    members and non-members different hit rates whenever it is not exactly Gaussian; with it, a member's and a
    non-member's calibrated scores of the same sample are identically distributed under the null. The reference
    dropped is the first other model after the target (cyclically) that holds one; docs/science.md section 4.

    Args:
        keep (np.ndarray): [M, N] bool, True where model m trained on sample j.
        target (int): the index of the target model.
    Returns:
        tuple[np.ndarray, np.ndarray]: ([M, N] OUT references, [M, N] IN references), bool masks.
    """
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
    """Count the OUT references calibration uses (`balanced_references`) per target and sample.

    Args:
        keep (np.ndarray): [M, N] bool, True where model m trained on sample j.
    Returns:
        np.ndarray: [M, N] counts: one fewer than all models where j was out, whatever the target's own
        membership (0 where j was out nowhere).
    """
    keep = np.asarray(keep).astype(bool)
    return np.broadcast_to(np.maximum((~keep).sum(0) - 1, 0)[None, :], keep.shape).copy()


def in_reference_counts(keep) -> np.ndarray:
    """Count the IN references of each target and sample (`balanced_references`).

    Args:
        keep (np.ndarray): [M, N] bool, True where model m trained on sample j.
    Returns:
        np.ndarray: [M, N] counts: one fewer than all models that trained on j (at least 0).
    """
    keep = np.asarray(keep).astype(bool)
    return np.broadcast_to(np.maximum(keep.sum(0) - 1, 0)[None, :], keep.shape).copy()


ZERO_SPREAD_RULES = ("nan", "pooled")
"""What `lira_offline` does with a sample whose OUT references all score the same (zero spread): NaN, or
standardize it with the pooled within-sample sd of every sample (fixed-variance LiRA for that sample); where that
sd is zero too (every sample tied) the sample scores 0 if the target equals its references, else NaN."""


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
    """Score offline LiRA: the target's statistic standardized by each sample's OUT distribution.

    Args:
        scores (np.ndarray): [M, N] LiRA statistic, higher = member (e.g. `confidence_logit(loss)`).
        keep (np.ndarray): [M, N] bool, True where model m trained on sample j.
        target (int): the attacked model; its references per sample: `balanced_references`.
        fpc (float | None): finite population correction (`fpc(n_train, n_pool)`), sigma^2 is divided by it.
        variance (str): "per_sample", or "global" (one pooled within-sample variance, steadier with few references).
        min_out (int | None): fewer out-references score NaN (default 2 per-sample, 1 global).
        zero_spread (str): a sample whose references all tie: "nan" or "pooled" (`ZERO_SPREAD_RULES`).
    Returns:
        np.ndarray: [N] (t_target - mu_out) / sigma_out, ~N(0, 1) for non-members; NaN counted in a LiraWarning.
    Raises:
        ValueError: on shapes or settings out of range (IndexError: a target that is no model index).
    """
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
    """Score online LiRA: log N(t; mu_in, sd_in) - log N(t; mu_out, sd_out) per sample.

    Args:
        scores (np.ndarray): [M, N] LiRA statistic, higher = member.
        keep (np.ndarray): [M, N] bool, True where model m trained on sample j.
        target (int): the attacked model; IN and OUT references: `balanced_references`.
        fpc (float | None): finite population correction, sigma^2 is divided by it.
        variance (str): "per_sample" or "global", as in `lira_offline`.
        min_in (int): fewer in-references score NaN.
        min_out (int): fewer out-references score NaN.
    Returns:
        np.ndarray: [N] log-likelihood ratios, higher = member; NaN counted in a LiraWarning.
    Raises:
        ValueError: on shapes or settings out of range (IndexError: a target that is no model index).
    """
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
    """Test each sample's out-scores for normality (Shapiro-Wilk) and report the share rejected.

    Under exact normality the share is about `level`; a much larger share means LiRA's Gaussian calibration is off
    for this statistic.

    Args:
        out_scores (np.ndarray): [M, N] scores.
        keep (np.ndarray | None): [M, N] bool; when given only entries with keep False are tested.
        level (float): the test's level.
        min_n (int): samples with fewer finite entries (or fewer than 3, or no spread) are skipped.
    Returns:
        dict: test, level, n_samples_tested, share_rejected (NaN when none tested), expected_share_if_gaussian.
    """
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
    """Run a LiRA score with each model in turn the target and the others its references.

    LiRA's warnings about thin references are silenced: the evaluation reports them as `skipped` reasons.

    Args:
        fn (Callable): `lira_offline` or `lira_online`.
        scores (np.ndarray): [M, N] LiRA statistic.
        keep (np.ndarray): [M, N] bool, True where model m trained on sample j.
        fpc_value (float | None): finite population correction.
        **kw: further keyword arguments of `fn` (variance, min_out, ...).
    Returns:
        np.ndarray: [M, N] scores.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiraWarning)
        return np.stack([fn(scores, keep, m, fpc_value, **kw) for m in range(scores.shape[0])])
