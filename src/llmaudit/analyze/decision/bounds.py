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
    """The standard normal quantile Phi^-1(1 - alpha) of a one-sided bound at level alpha."""
    if not 0 < one_sided_alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1); got {one_sided_alpha}.")
    return float(stats.norm.ppf(1 - one_sided_alpha))


def wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """(lower, upper) Wilson score bounds of a proportion p observed on n rows, at normal quantile z."""
    if not n > 0 or not math.isfinite(p):
        return math.nan, math.nan
    p = min(max(p, 0.0), 1.0)
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_se(resampled) -> float:
    """Standard deviation (ddof 1) of the finite resampled values; nan with fewer than 2."""
    v = np.asarray(resampled, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.std(ddof=1)) if v.size >= 2 else math.nan


def effective_n(p: float, se: float, n_rows: float) -> float:
    """n_eff = p (1 - p) / se^2, capped at n_rows; n_rows where p is 0 or 1 or se is 0 or unknown."""
    if not (0 < p < 1) or not math.isfinite(se) or se <= 0:
        return float(n_rows)
    return float(min(n_rows, p * (1 - p) / (se * se)))


def proportion_bounds(p: float, resampled, n_rows: float, z: float) -> tuple[float, float]:
    """(lower, upper) bounds of a resampled proportion: Wilson at the bootstrap's effective sample size."""
    if not math.isfinite(p) or not n_rows > 0:
        return math.nan, math.nan
    return wilson(p, effective_n(p, bootstrap_se(resampled), n_rows), z)


def percentile_interval(resampled, low_q: float, high_q: float) -> tuple[float, float]:
    """(low, high) quantiles of the finite resampled values; nan where there are none."""
    v = np.asarray(resampled, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(v, [low_q, high_q])
    return float(lo), float(hi)


def samples_factor(spread: float, distance: float) -> float | None:
    """By how much the number of samples must grow for a bound now `spread` away from its estimate to sit only
    `distance` away (standard errors shrink as 1 / sqrt(n)): (spread / distance)^2, at least 1; None where the
    distance is not positive (more samples cannot move the bound past a limit the estimate has not passed)."""
    if not (distance > 0) or not math.isfinite(spread):
        return None
    return max(1.0, (spread / distance) ** 2)
