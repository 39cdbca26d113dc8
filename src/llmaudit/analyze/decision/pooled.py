"""Resampled counts of per-sample calibrated scores pooled over the target models, and their resampled AUROC, at
the cost of the arithmetic (docs/science.md section 12, "What a resample of the decision costs").

A row (target, sample) weighs its sample's multiplicity. Three observations keep a resample's work far below one
pass over the M x N rows:
- a sum over rows of weight x indicator is a sum over SAMPLES of multiplicity x (the sample's rows with the
  indicator): the totals per class and fold, and the rows above the analytic threshold (the same rows in every
  resample), are one product [B + 1, N] @ [N, 2F] of per-sample row counts;
- the empirical threshold at FPR f is set by the top f x (non-member weight) of the non-member rows: it is found on
  the highest-scoring non-members only, a window widened until every resample's threshold lies inside it;
- a resample's threshold moves the count only by the rows between it and the analytic threshold: running weights
  per class and fold are kept over that window alone, one running sum per class-fold channel over its own rows.
Every sum is of integer weights, so the counts equal those of running weights over all rows exactly (the test
compares with rows repeated by their multiplicity).
"""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.decision.counts import ROW_BUDGET, as_counts, normal_quantile, sorted_rows
from llmaudit.analyze.roc_kernel import roc_rows, roc_stats


def _per_sample(unit: np.ndarray, channel: np.ndarray, n_units: int, n_channels: int) -> np.ndarray:
    """[N, C] float64: the rows of each sample in each channel."""
    flat = np.bincount(unit * n_channels + channel, minlength=n_units * n_channels)
    return flat.astype(np.float64).reshape(n_units, n_channels)


def _empirical_thresholds(s: np.ndarray, neg_unit: np.ndarray, neg_pos: np.ndarray, w: np.ndarray, fpr: float):
    """[b] in-sample empirical threshold at FPR `fpr` of each resample (`counts.sorted_threshold`, held_out=False):
    the score of the highest non-member row whose weight at or above it exceeds fpr x W (W the resample's non-member
    weight); -inf when none does, +inf without non-member weight.

    s: [n] ascending scores; neg_pos [m]: positions of the non-member rows (ascending), neg_unit [m] their samples;
    w: [b, N] multiplicities. Only the top K non-members are read, K doubled until every resample's answer is in."""
    m = neg_pos.size
    if not m:
        return np.full(w.shape[0], np.inf)
    total = w @ np.bincount(neg_unit, minlength=w.shape[1]).astype(np.float64)
    budget = fpr * total + 1e-6
    k = min(m, int(np.ceil(2 * fpr * m)) + 64)
    while True:
        top = w[:, neg_unit[m - k :]]  # [b, K] the highest K non-members, ascending
        at_or_above = np.cumsum(top[:, ::-1], axis=1)[:, ::-1]  # weight at or above each of them
        if k == m or (at_or_above[:, 0] > budget).all():  # every answer inside: those below exceed it too
            break
        k = min(m, 2 * k)
    count = (at_or_above > budget[:, None]).sum(axis=1) + (m - k)  # non-members whose weight at or above exceeds
    thr = np.where(count > 0, s[neg_pos[np.maximum(count - 1, 0)]], -np.inf)
    return np.where(total > 0, thr, np.inf)


def _weight_below(w, unit, channel, lo: int, hi: int, n_channels: int, positions: np.ndarray) -> np.ndarray:
    """[b, C] weight per channel of the rows at positions [lo, positions[b]) (lo <= positions <= hi): one running
    sum per channel over its own rows of the window."""
    out = np.zeros((w.shape[0], n_channels))
    rows = np.arange(lo, hi)
    ch = channel[lo:hi]
    pick = np.arange(w.shape[0])
    for c in np.unique(ch):
        idx = rows[ch == c]
        cum = np.zeros((w.shape[0], idx.size + 1))
        np.cumsum(w[:, unit[idx]], axis=1, out=cum[:, 1:])
        out[:, c] = cum[pick, np.searchsorted(idx, positions, side="left")]
    return out


def _above_thresholds(w, unit, channel, s, p_fixed: int, thresholds: dict, n_channels: int) -> dict:
    """{name: [b, C]} weight per channel strictly above each per-resample threshold MINUS the weight strictly above
    the analytic threshold (at position p_fixed): the rows between the two, with their sign."""
    positions = {k: np.searchsorted(s, t, side="right") for k, t in thresholds.items()}
    lo = min([p_fixed, *(int(p.min()) for p in positions.values())])
    hi = max([p_fixed, *(int(p.max()) for p in positions.values())])
    base = _weight_below(w, unit, channel, lo, hi, n_channels, np.full(w.shape[0], p_fixed))
    return {k: base - _weight_below(w, unit, channel, lo, hi, n_channels, p) for k, p in positions.items()}


def _resample_blocks(n_resamples: int, width: int):
    step = max(1, ROW_BUDGET // max(1, width))
    return [slice(start, start + step) for start in range(0, n_resamples, step)]


def calibrated_counts(
    z: np.ndarray, keep: np.ndarray, weights: np.ndarray, fpr: float, fold_of_target: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(strict [B + 1, 4], loose [B + 1, 4], train [B + 1, F, 4], test [B + 1, F, 4]) counts of one attack's
    per-sample calibrated scores pooled over the target models.

    z: [M, N] calibrated scores on the normal scale (`normal_scores`: a non-member is N(0, 1) where the calibration's
    Gaussian model holds); keep: [M, N]; weights: [B + 1, N]; fold_of_target: [M]. Two thresholds: the analytic one,
    Phi^-1(1 - fpr), and the empirical one, the in-sample threshold of the pooled non-member rows (FPR <= fpr
    whatever the scores' distribution). strict = every row against the HIGHER of the two, loose = against the
    LOWER: a FAIL reads the strict one and a PASS the loose one, so neither rests on the Gaussian model where the
    data contradict it. Cross-fitting over folds of targets: "train", the rows of the other targets against the
    analytic threshold (the attack is chosen on a threshold with no sampling noise, so no luck of a low threshold
    decides the choice); "test", the fold's rows against the strict threshold."""
    n_folds = int(fold_of_target.max()) + 1
    B1, n_units = weights.shape
    analytic = normal_quantile(1 - fpr)
    ok = np.isfinite(z)
    target, unit = np.nonzero(ok)
    s, member, fold, unit = sorted_rows(z[ok], keep[ok], fold_of_target[target], unit)
    strict, loose = np.zeros((B1, 4)), np.zeros((B1, 4))
    train, test = np.zeros((B1, n_folds, 4)), np.zeros((B1, n_folds, 4))
    if not s.size:
        return strict, loose, train, test
    C = 2 * n_folds
    channel = member.astype(np.int64) * n_folds + fold  # class (0 non-member, 1 member) x fold
    p_fixed = int(np.searchsorted(s, analytic, side="right"))
    totals = (weights @ _per_sample(unit, channel, n_units, C)).reshape(B1, 2, n_folds)
    at_fixed = weights @ _per_sample(unit[p_fixed:], channel[p_fixed:], n_units, C)  # [B + 1, C]
    neg_pos = np.flatnonzero(~member)
    for rows in _resample_blocks(B1, s.size):
        w = weights[rows]
        empirical = _empirical_thresholds(s, unit[neg_pos], neg_pos, w, fpr)
        thresholds = {"high": np.maximum(empirical, analytic), "low": np.minimum(empirical, analytic)}
        moved = _above_thresholds(w, unit, channel, s, p_fixed, thresholds, C)
        above = {k: (at_fixed[rows] + d).reshape(-1, 2, n_folds) for k, d in moved.items()}
        out = _as_count_arrays(above, at_fixed[rows].reshape(-1, 2, n_folds), totals[rows])
        strict[rows], loose[rows], train[rows], test[rows] = out
    return strict, loose, train, test


def _as_count_arrays(above: dict, at_analytic: np.ndarray, totals: np.ndarray) -> tuple[np.ndarray, ...]:
    """(strict [b, 4], loose [b, 4], train [b, F, 4], test [b, F, 4]) from the weights [b, 2, F] per class and fold
    above the high and low thresholds, above the analytic one, and in all."""
    all_folds, all_above = totals.sum(axis=2), at_analytic.sum(axis=2)  # [b, 2]
    folds = range(totals.shape[2])
    train = np.stack([as_counts(all_above - at_analytic[:, :, f], all_folds - totals[:, :, f]) for f in folds], axis=1)
    test = np.stack([as_counts(above["high"][:, :, f], totals[:, :, f]) for f in folds], axis=1)
    return as_counts(above["high"].sum(axis=2), all_folds), as_counts(above["low"].sum(axis=2), all_folds), train, test


def weighted_auroc(scores: np.ndarray, labels: np.ndarray, unit: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[B + 1] AUROC of pooled rows under each row of sample multiplicities (ties count one half).

    scores, labels, unit: [R] rows (score, member flag, sample index); weights: [B + 1, N]. A row weighs the
    multiplicity of its sample. The rows are sorted once; each resample's AUROC is one compiled pass over them
    (`roc_kernel`), exact for integer weights."""
    auroc, _, _ = roc_stats(roc_rows(scores, labels, unit, weights.shape[1]), weights, ())
    return auroc
