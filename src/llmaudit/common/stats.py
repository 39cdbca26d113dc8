"""Statistics shared by the analysis, the report and the validations: finite means, percentile bootstrap
intervals of a mean, percentile intervals of resampled statistics, and a guarded Spearman correlation.

Conventions (docs/science.md sections 2 and 4): intervals are percentile bootstraps; a resample of a
mean draws whole units (runs, samples) with replacement with `numpy.random.default_rng(seed)`, so the
same seed gives the same interval everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

ROUNDING_ULPS = 8
"""A spread within this many units in the last place (float64) of the values it is computed from is rounding, not
variation: scores equal but for the rounding of a mean (k copies of x summed and divided by k need not give x
back) are ties. Without this rule the membership-dependent NUMBER of references a mean runs over turns rounding
noise into a score that a per-sample standardisation amplifies to unit scale (docs/science.md section 4, ties)."""


def rounding_tolerance(values, mask=None, axis: int = 0) -> np.ndarray:
    """ROUNDING_ULPS * eps * max |values| along `axis` over the finite (and `mask`ed) entries: the spread below
    which the values are equal but for floating-point rounding (0 where there are none)."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    keep = np.isfinite(v) if mask is None else (np.isfinite(v) & np.asarray(mask, bool))
    return ROUNDING_ULPS * np.finfo(np.float64).eps * np.where(keep, v, 0.0).max(axis=axis)


def finite_values(values) -> np.ndarray:
    """The finite entries of `values` as a flat float64 array (NaN and +-inf dropped)."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    return arr[np.isfinite(arr)]


def finite_mean(values) -> float:
    """Mean of the finite entries; nan when there are none."""
    finite = finite_values(values)
    return float(finite.mean()) if finite.size else math.nan


def percentile_interval(samples, confidence: float = 0.95) -> tuple[float, float]:
    """(low, high) percentiles of the finite `samples` at `confidence` (nan, nan when there are none)."""
    finite = finite_values(samples)
    if finite.size == 0:
        return math.nan, math.nan
    low, high = np.quantile(finite, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


def bootstrap_mean_interval(values, *, n_boot: int, confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of the finite `values` [R] (units resampled with
    replacement, `n_boot` times). One finite value gives (v, v); none, or n_boot = 0, gives (nan, nan)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1); got {confidence}.")
    finite = finite_values(values)
    if finite.size == 1:
        return float(finite[0]), float(finite[0])
    if finite.size == 0 or n_boot <= 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = finite[rng.integers(0, finite.size, size=(n_boot, finite.size))].mean(axis=1)
    return percentile_interval(means, confidence)


@dataclass(frozen=True)
class Correlation:
    """Spearman's rho between two paired samples, with the pairs it used and why it is missing."""

    rho: float | None
    p_value: float | None
    n: int
    reason: str | None = None

    def to_dict(self, count_key: str = "n") -> dict:
        out = {"rho": self.rho, "p_value": self.p_value, count_key: self.n}
        if self.reason:
            out["reason"] = self.reason
        return out


def spearman(x, y, *, min_n: int = 3, p_value: bool = True) -> Correlation:
    """Spearman's rho (scipy, ties averaged) over the pairs where both values are finite, with a
    permutation p-value (`spearman_p_value`; None when p_value=False, for bootstrap loops that need rho only).

    Undefined (rho None, with the reason) with fewer than `min_n` pairs or when either side is constant:
    a rank correlation of 2 points, or of a constant, says nothing."""
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"spearman needs paired samples; got {x.size} and {y.size} values.")
    ok = np.isfinite(x) & np.isfinite(y)
    n = int(ok.sum())
    if n < min_n or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return Correlation(None, None, n, f"needs >= {min_n} pairs with distinct values")
    rho = float(stats.spearmanr(x[ok], y[ok]).statistic)
    return Correlation(rho, spearman_p_value(x[ok], y[ok]) if p_value else None, n)


EXACT_UP_TO = 8
"""Up to this many pairs the p-value enumerates every permutation (8! = 40,320)."""
PERMUTATIONS = 20_000
"""From EXACT_UP_TO to 30 pairs: a seeded Monte Carlo permutation test with this many resamples."""


def spearman_p_value(x, y) -> float:
    """Two-sided p-value of Spearman's rho under independence: an exact permutation test for small
    samples (scipy's t approximation is far too small there: a perfect rho over 5 pairs gets about 1e-24
    instead of the exact 2/120 = 0.017), a seeded Monte Carlo permutation test up to 30 pairs, scipy's
    approximation above."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = x.size
    if n > 30:
        return float(stats.spearmanr(x, y).pvalue)
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    scale = np.sqrt((rx * rx).sum() * (ry * ry).sum())

    def rho(a, axis=-1):
        return (a * ry).sum(axis=axis) / scale

    res = stats.permutation_test(
        (rx,),
        rho,
        permutation_type="pairings",
        vectorized=True,
        n_resamples=np.inf if n <= EXACT_UP_TO else PERMUTATIONS,
        alternative="two-sided",
        random_state=0,
    )
    return float(min(1.0, res.pvalue))


def partial_spearman(x, y, z, *, min_n: int = 4) -> Correlation:
    """Spearman's rho of x and y with z partialled out: the Pearson correlation of the residuals of rank(x)
    and rank(y) after a least-squares line on rank(z) (ranks with ties averaged, over the triples where all
    three are finite); two-sided p-value from Student's t with n - 3 degrees of freedom.

    Undefined (rho None) with fewer than `min_n` triples or when a residual is constant."""
    a = [np.asarray(v, dtype=np.float64).ravel() for v in (x, y, z)]
    if not a[0].shape == a[1].shape == a[2].shape:
        raise ValueError(f"partial_spearman needs paired samples; got {[v.size for v in a]} values.")
    ok = np.isfinite(a[0]) & np.isfinite(a[1]) & np.isfinite(a[2])
    n = int(ok.sum())
    if n < min_n:
        return Correlation(None, None, n, f"needs >= {min_n} triples")
    rx, ry, rz = (stats.rankdata(v[ok]) for v in a)
    design = np.column_stack([np.ones(n), rz])

    def resid(v):
        return v - design @ np.linalg.lstsq(design, v, rcond=None)[0]

    ex, ey = resid(rx), resid(ry)
    if np.ptp(ex) < 1e-12 or np.ptp(ey) < 1e-12:
        return Correlation(None, None, n, "constant once the control is partialled out")
    rho = float(np.clip(np.corrcoef(ex, ey)[0, 1], -1.0, 1.0))
    df = n - 3
    if abs(rho) >= 1.0:
        return Correlation(rho, 0.0, n)
    t = rho * math.sqrt(df / (1.0 - rho * rho))
    return Correlation(rho, float(2.0 * stats.t.sf(abs(t), df)), n)


def spearman_rho(x, y, *, min_n: int = 3) -> float:
    """`spearman(x, y).rho` as a float, nan when undefined (no p-value computed)."""
    rho = spearman(x, y, min_n=min_n, p_value=False).rho
    return math.nan if rho is None else rho
