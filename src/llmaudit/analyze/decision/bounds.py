"""Confidence bounds of resampled proportions (docs/science.md section 12).

A TPR pooled over samples scored by several target models is a proportion whose rows are not independent (a
sample brings all its models), so its variance is taken from the bootstrap over samples, and the bound is the
Wilson score bound at the effective sample size that variance implies (Korn and Graubard 1998):
n_eff = p (1 - p) / se^2, capped at the number of rows. Wilson's bound stays inside [0, 1] and keeps the skew of
a small proportion (the upper tail of 4 hits in 400 is longer than the lower one), where a normal bound would
not; an estimate of 0 or 1, or a bootstrap without spread, uses the rows themselves (n_eff = n).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def z_value(one_sided_alpha: float) -> float:
    """Compute the standard normal quantile Phi^-1(1 - alpha) of a one-sided bound at level alpha.

    Args:
        one_sided_alpha (float): the level, in (0, 1).
    Returns:
        float: the quantile z.
    Raises:
        ValueError: when alpha is outside (0, 1).
    """
    if not 0 < one_sided_alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1); got {one_sided_alpha}.")
    return float(stats.norm.ppf(1 - one_sided_alpha))


def wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """Compute the Wilson score bounds of a proportion.

    Args:
        p (float): the proportion, clipped to [0, 1].
        n (float): the rows it was observed on (may be an effective, non-integer size).
        z (float): the normal quantile of each bound.
    Returns:
        tuple[float, float]: (lower, upper) in [0, 1]; NaN for n <= 0 or p not finite.
    """
    if not n > 0 or not math.isfinite(p):
        return math.nan, math.nan
    p = min(max(p, 0.0), 1.0)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_se(resampled) -> float:
    """Compute the standard deviation (ddof 1) of the finite resampled values.

    Args:
        resampled (np.ndarray): [B] resampled values; non-finite ones are left out.
    Returns:
        float: the standard error, NaN with fewer than 2 finite values.
    """
    v = np.asarray(resampled, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.std(ddof=1)) if v.size >= 2 else math.nan


def effective_n(p: float, se: float, n_rows: float) -> float:
    """Compute the effective sample size n_eff = p (1 - p) / se^2, capped at n_rows.

    Args:
        p (float): the proportion.
        se (float): its bootstrap standard error.
        n_rows (float): the number of rows.
    Returns:
        float: n_eff; n_rows where p is 0 or 1 or se is 0 or unknown.
    """
    if not (0 < p < 1) or not math.isfinite(se) or se <= 0:
        return float(n_rows)
    return float(min(n_rows, p * (1 - p) / (se * se)))


def proportion_bounds(p: float, resampled, n_rows: float, z: float) -> tuple[float, float]:
    """Bound a resampled proportion: Wilson at the bootstrap's effective sample size.

    Args:
        p (float): the observed proportion.
        resampled (np.ndarray): [B] its resampled values.
        n_rows (float): the number of rows it was observed on.
        z (float): the normal quantile of each bound.
    Returns:
        tuple[float, float]: (lower, upper); NaN when p is not finite or n_rows <= 0.
    """
    if not math.isfinite(p) or not n_rows > 0:
        return math.nan, math.nan
    return wilson(p, effective_n(p, bootstrap_se(resampled), n_rows), z)


def percentile_interval(resampled, low_q: float, high_q: float) -> tuple[float, float]:
    """Compute quantiles of the finite resampled values.

    Args:
        resampled (np.ndarray): [B] resampled values; non-finite ones are left out.
        low_q (float): the lower quantile, in [0, 1].
        high_q (float): the upper quantile, in [0, 1].
    Returns:
        tuple[float, float]: (low, high); NaN where no value is finite.
    """
    v = np.asarray(resampled, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(v, [low_q, high_q])
    return float(lo), float(hi)


def samples_factor(spread: float, distance: float) -> float | None:
    """Compute by how much the number of samples must grow for a bound to move to a given distance.

    Standard errors shrink as 1 / sqrt(n), so the factor is (spread / distance)^2, at least 1.

    Args:
        spread (float): the bound's distance from its estimate now.
        distance (float): the distance it should have.
    Returns:
        float | None: the factor; None where the distance is not positive (more samples cannot move the bound past
        a limit the estimate has not passed) or the spread is not finite.
    """
    if not (distance > 0) or not math.isfinite(spread):
        return None
    return max(1.0, (spread / distance) ** 2)
