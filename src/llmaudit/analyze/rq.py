"""The published attack-free indicator r_Q (docs/science.md section 2): the estimator of one training run.

Pure functions: per-sample losses in, numbers out. The published estimator is `r_q` (Algorithm 2 of
the indicator paper, docs/science.md section 2 step 4). Variants that docs/science.md section 5 asks us to
investigate live in separate, clearly named functions (`r_q_reciprocal`, ...) and are never swapped in
silently. Its aggregation over runs and quantizers, and its scoring of a loss table, are in
`llmaudit.analyze.rq_aggregate`; the stable public import path of both is `llmaudit.indicator`.
Notation follows docs/science.md:

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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

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
        """Write the result as a JSON-ready dict (tuples as lists).

        Returns:
            dict[str, Any]: every field.
        """
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
    """Group the rows of `losses` that are the same quantized point.

    Two rows are the same point when max_j |L[a, j] - L[b, j]| <= atol. Greedy in row order: a row joins the first
    group whose representative (its first row) is within `atol`, so groups do not chain.

    Args:
        losses (np.ndarray): [K, n] per-sample losses.
        atol (float): the tolerance, >= 0 (0: exact equality).
    Returns:
        list[list[int]]: groups of original row indices, in order of first row.
    Raises:
        ValueError: on a wrong shape, non-finite losses or a negative atol.
    """
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


@dataclass(frozen=True)
class _SortedPoints:
    """The distinct quantized points of a losses array [K, n], sorted by mean loss (ascending, stable)."""

    n_checkpoints: int
    groups: list[list[int]]
    order: np.ndarray
    points: np.ndarray
    means: np.ndarray


@dataclass(frozen=True)
class _Profile:
    """What Algorithm 2 computed from the sorted points, as plain Python numbers."""

    r_q: float
    status: str
    delta: tuple[float, ...]
    sigma2: tuple[float, ...]
    profile: tuple[float, ...]
    argmax_k: int | None


def _sorted_points(arr: np.ndarray, atol: float) -> _SortedPoints:
    """Merge identical rows of `arr` [K, n] (`merge_identical_points`) and sort the points by mean loss."""
    groups = merge_identical_points(arr, atol=atol)
    reps = np.array([g[0] for g in groups])
    means_unsorted = arr[reps].mean(axis=1)
    sort = np.argsort(means_unsorted, kind="stable")
    order = reps[sort]
    points = arr[order]
    return _SortedPoints(arr.shape[0], [groups[i] for i in sort], order, points, points.mean(axis=1))


def _undefined_profile(n_points: int, n_samples: int) -> _Profile:
    """r_Q undefined (nan): fewer than 2 distinct points, or too few samples for the variance (n - ddof <= 0)."""
    status = STATUS_UNDEFINED if n_points < 2 else f"undefined: n - ddof <= 0 (n = {n_samples})"
    zeros = (0.0,) * n_points
    return _Profile(math.nan, status, zeros, zeros, (math.nan,) * n_points, None)


def _profile(pts: _SortedPoints, ddof: int) -> _Profile:
    """Algorithm 2 on at least 2 sorted points: delta, sigma2, the per-point profile and r_Q with its status."""
    points, means, order = pts.points, pts.means, pts.order
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
    return _Profile(
        float(r),
        status,
        tuple(float(d) for d in delta),
        tuple(float(s) for s in sigma2),
        (math.nan, *(float(p) for p in profile)),
        argmax_k,
    )


def r_q_details(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> RQResult:
    """Compute Algorithm 2 of the indicator paper (docs/science.md section 2, steps 2-4) with full diagnostics.

    Args:
        losses (np.ndarray): [K, n] per-sample validation losses of the K quantized checkpoints of one run (rows in any
            order).
        ddof (int): variance convention for sigma2 (1 = unbiased).
        atol (float): merge tolerance for identical quantized points (0 = exact equality).
    Returns:
        RQResult: r_Q with its status, the merged points, their means, delta, sigma2 and profile.
    Raises:
        ValueError: on non-finite losses or a wrong shape.
    """
    arr = _check_losses(losses)
    pts = _sorted_points(arr, atol)
    n_points = len(pts.order)
    if n_points < 2 or arr.shape[1] - ddof <= 0:
        prof = _undefined_profile(n_points, arr.shape[1])
    else:
        prof = _profile(pts, ddof)
    return RQResult(
        r_q=prof.r_q,
        status=prof.status,
        n_checkpoints=pts.n_checkpoints,
        n_points=n_points,
        groups=tuple(tuple(g) for g in pts.groups),
        order=tuple(int(i) for i in pts.order),
        means=tuple(float(m) for m in pts.means),
        delta=prof.delta,
        sigma2=prof.sigma2,
        profile=prof.profile,
        argmax_k=prof.argmax_k,
        ddof=ddof,
        atol=float(atol),
    )


def r_q(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> float:
    """Compute the indicator r_Q of one training run: Algorithm 2, docs/science.md section 2 step 4.

    r_Q = 1/2 * [max_{k>=2} sigma2_k / (m[k] - m[1])^2]^{-1}, with identical rows merged first.

    Args:
        losses (np.ndarray): [K, n] per-sample validation losses of the K quantized checkpoints of one run (rows in any
            order).
        ddof (int): variance convention for sigma2 (1 = unbiased).
        atol (float): merge tolerance for identical quantized points (0 = exact equality).
    Returns:
        float: r_Q; 0.0 if two distinct points share a mean, +inf if every sigma2 is 0, NaN with fewer than 2
        distinct points (`r_q_details` gives the status).
    Raises:
        ValueError: on non-finite losses or a wrong shape.
    """
    return r_q_details(losses, ddof=ddof, atol=atol).r_q


def r_q_min_ratio(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> float:
    """Compute the theorem's form, docs/science.md section 2: r_Q = 1/2 * min_{k>1} delta_k^2 / sigma_k^2.

    Mathematically the same number as `r_q` (1/max(x) = min(1/x) for x >= 0, with 1/0 = inf and 1/inf = 0);
    computed independently, from the per-point profile, so tests can check that the two written forms agree.

    Args:
        losses (np.ndarray): [K, n] per-sample validation losses.
        ddof (int): variance convention for sigma2 (1 = unbiased).
        atol (float): merge tolerance for identical quantized points (0 = exact equality).
    Returns:
        float: r_Q, NaN when undefined.
    """
    res = r_q_details(losses, ddof=ddof, atol=atol)
    if res.n_points < 2 or math.isnan(res.r_q):
        return math.nan
    return 0.5 * float(np.min(np.asarray(res.profile[1:])))


def r_q_as_printed(losses: Any, *, ddof: int = 1, atol: float = 0.0) -> float:
    """Compute Algorithm 2 exactly as printed: r = 1/2 [max_k sigma2_k ((m[2]-m[1]) / (m[k]-m[1]))^2]^{-1}.

    Equal to `r_q` whenever m[2] > m[1]; the printed normalisation is 0/0 when the two lowest points share a mean,
    so this form returns NaN there while `r_q` returns the limit 0.0. It serves to verify the equivalence.

    Args:
        losses (np.ndarray): [K, n] per-sample validation losses.
        ddof (int): variance convention for sigma2 (1 = unbiased).
        atol (float): merge tolerance for identical quantized points (0 = exact equality).
    Returns:
        float: r * (m[2] - m[1])^2; NaN with fewer than 2 points or equal lowest means.
    """
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
    """Compute the variant max_{k>=2} sigma_k^2 / delta_k^2 = 1 / (2 r_Q) (not the published estimator).

    docs/science.md section 5 reports that this reciprocal tracks the baseline MIS at about +0.80 Spearman where the
    published r_Q gave about -0.80, "which is what a missing inversion would produce". It is a strictly decreasing
    function of r_Q, so its rankings are exactly r_Q's reversed: it tests the sign convention, nothing more.

    Args:
        losses (np.ndarray): [K, n] per-sample validation losses.
        ddof (int): variance convention for sigma2 (1 = unbiased).
        atol (float): merge tolerance for identical quantized points (0 = exact equality).
    Returns:
        float: 1 / (2 r_Q); NaN when undefined, +inf when r_Q = 0, 0 when r_Q = inf.
    """
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
