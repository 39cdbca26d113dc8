"""The release decision's resampled counts as they landed before issue 33's last step (running weights over every
row of every resample): the baseline `bench_analysis.py` times beside the current `llmaudit.analyze.decision.pooled`.
Kept here, not in the library: the tests compare the library with a slower reference of rows repeated by their
multiplicity, and this file only with the library (`tests/analyze/test_decision_pooled.py`)."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from llmaudit.analyze.decision.counts import _chunks, as_counts, normal_quantile, ratio, sorted_rows, sorted_threshold
from llmaudit.analyze.decision.pooled import _choice_counts


def landed_calibrated_counts(
    z: np.ndarray, keep: np.ndarray, weights: np.ndarray, fpr: float, fold_of_sample: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`llmaudit.analyze.decision.pooled.calibrated_counts` (same arguments, same result) computed as it landed:
    running weights per class and fold over every row of every resample (the choice, on the observed data only, is
    the library's)."""
    n_folds = int(fold_of_sample.max()) + 1
    analytic = float(normal_quantile(1 - fpr))
    ok = np.isfinite(z)
    _, unit = np.nonzero(ok)
    s, member, fold, unit = sorted_rows(z[ok], keep[ok], fold_of_sample[unit], unit)
    strict, loose = np.zeros((weights.shape[0], 4)), np.zeros((weights.shape[0], 4))
    test = np.zeros((weights.shape[0], n_folds, 4))
    if not s.size:
        return strict, loose, np.zeros((n_folds, 4)), test
    groups = _class_fold_indicator(member, fold, n_folds)
    for rows in _chunks(s.size, n_folds, weights.shape[0]):
        w = weights[rows][:, unit].astype(np.float32)
        empirical = sorted_threshold(s, np.cumsum(w * ~member, axis=1), fpr, held_out=False)
        thresholds = {"high": empirical, "low": np.minimum(empirical, analytic)}
        for f in range(n_folds):
            thresholds[f] = sorted_threshold(s, np.cumsum(w * (~member & (fold != f)), axis=1), fpr, held_out=True)
        totals, _, above = _above_by_class_fold(s, w, groups, analytic, thresholds)
        all_folds = totals.sum(axis=2)  # [b, 2]
        strict[rows] = as_counts(above["high"].sum(axis=2), all_folds)
        loose[rows] = as_counts(above["low"].sum(axis=2), all_folds)
        for f in range(n_folds):
            test[rows, f] = as_counts(above[f][:, :, f], totals[:, :, f])
    return strict, loose, _choice_counts(s, member, fold, unit, weights[0], fpr), test


def _class_fold_indicator(member: np.ndarray, fold: np.ndarray, n_folds: int) -> np.ndarray:
    """[n, 2, F] float64: 1 where row i is of class c (0 non-member, 1 member) and in fold f."""
    out = np.zeros((member.size, 2, n_folds))
    out[np.arange(member.size), member.astype(int), fold] = 1.0
    return out


def _above_by_class_fold(
    s: np.ndarray, w: np.ndarray, groups: np.ndarray, fixed: float, thresholds: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Weights per (resample, class, fold) [b, 2, F]: in all, strictly above the `fixed` threshold, and strictly
    above each per-resample threshold of `thresholds` ({name: [b]}), for ascending scores s [n], row weights
    w [b, n] and the rows' class-fold indicator `groups` [n, 2, F].

    The rows above the fixed threshold are the same in every resample (one matrix product); a per-resample
    threshold differs from it only on the rows between the two, so running weights are kept only over the
    window of positions that some resample's threshold reaches. Integer weights: every sum is exact, so the
    counts equal those of running weights over all rows."""
    b, n = w.shape
    flat = groups.reshape(n, -1)
    w64 = w.astype(np.float64)
    totals = (w64 @ flat).reshape(b, 2, -1)
    p_fixed = int(np.searchsorted(s, fixed, side="right"))
    at_fixed = (w64[:, p_fixed:] @ flat[p_fixed:]).reshape(b, 2, -1)
    positions = {k: np.searchsorted(s, t, side="right") for k, t in thresholds.items()}
    lo = min([p_fixed, *(int(p.min()) for p in positions.values())])
    hi = max([p_fixed, *(int(p.max()) for p in positions.values())])
    # prefix[:, k] = weight of the rows in [lo, lo + k), per class and fold; k = 0 .. hi - lo
    prefix = np.zeros((b, hi - lo + 1, flat.shape[1]))
    if hi > lo:
        np.cumsum(w64[:, lo:hi, None] * flat[None, lo:hi], axis=1, out=prefix[:, 1:])
    at = lambda p: np.take_along_axis(prefix, (np.asarray(p) - lo).reshape(-1, 1, 1), axis=1)[:, 0]  # noqa: E731
    base = at(np.full(b, p_fixed))
    above = {k: at_fixed + (base - at(p)).reshape(b, 2, -1) for k, p in positions.items()}
    return totals, at_fixed, above


def landed_weighted_auroc(
    scores: np.ndarray, labels: np.ndarray, unit: np.ndarray, weights: np.ndarray, budget: int = 4_000_000
) -> np.ndarray:
    """[B + 1] AUROC of pooled rows under each row of sample multiplicities (ties count one half).

    scores, labels, unit: [R] rows (score, member flag, sample index); weights: [B + 1, N]. A row weighs the
    multiplicity of its sample. Rows with equal scores form one group; the sum runs over groups in ascending
    order, P(member > non-member) + P(tie) / 2, computed for `budget` / groups resamples at a time."""
    _, group = np.unique(scores, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.size else 0
    shape = (weights.shape[1], n_groups)
    to_pos = sp.csr_matrix((labels.astype(np.float64), (unit, group)), shape=shape)
    to_neg = sp.csr_matrix(((~labels).astype(np.float64), (unit, group)), shape=shape)
    out = np.empty(weights.shape[0])
    step = max(1, budget // max(n_groups, 1))
    for start in range(0, weights.shape[0], step):
        w = weights[start : start + step]
        pos = np.asarray((to_pos.T @ w.T).T)
        neg = np.asarray((to_neg.T @ w.T).T)
        below = np.cumsum(neg, axis=1) - neg
        num = (pos * (below + 0.5 * neg)).sum(axis=1)
        out[start : start + step] = ratio(num, pos.sum(axis=1) * neg.sum(axis=1))
    return out
