"""Resampled counts of per-sample calibrated scores pooled over the target models, and their resampled AUROC, at
the cost of the arithmetic (docs/science.md section 12, "What a resample of the decision costs").

A row (target, sample) weighs its sample's multiplicity. Three observations keep a resample's work far below one
pass over the M x N rows:
- a sum over rows of weight x indicator is a sum over SAMPLES of multiplicity x (the sample's rows with the
  indicator): the totals per class and fold, and the rows above the analytic threshold (the same rows in every
  resample), are one product [B + 1, N] @ [N, 2F] of per-sample row counts;
- an empirical threshold at FPR f (of every non-member row, or of those outside one fold) is set by the top
  f x (non-member weight) of the non-member rows: it is found on the highest-scoring non-members only, a window
  widened until every resample's threshold lies inside it;
- a resample's threshold moves the count only by the rows between it and the analytic threshold: running weights
  per class and fold are kept over that window alone, one running sum per class-fold channel over its own rows,
  read at every threshold of the resample.
Every sum is of integer weights, so the counts equal those of running weights over all rows exactly (the test
compares with rows repeated by their multiplicity). The choice of the attack reads the observed data only.
"""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.decision.counts import ROW_BUDGET, as_counts, normal_quantile, sorted_rows, sorted_threshold
from llmaudit.analyze.roc_kernel import roc_rows, roc_stats


def _per_sample(unit: np.ndarray, channel: np.ndarray, n_units: int, n_channels: int) -> np.ndarray:
    """[N, C] float64: the rows of each sample in each channel."""
    flat = np.bincount(unit * n_channels + channel, minlength=n_units * n_channels)
    return flat.astype(np.float64).reshape(n_units, n_channels)


def _empirical_thresholds(
    s: np.ndarray, neg_unit: np.ndarray, neg_pos: np.ndarray, w: np.ndarray, fpr: float, held_out: bool = False
) -> np.ndarray:
    """[b] empirical threshold at FPR `fpr` of each resample (`counts.sorted_threshold`). In-sample: the score of the
    highest non-member row whose weight at or above it exceeds fpr x W (W the resample's non-member weight), -inf
    when none does. Held out: the k-th largest, k = floor(fpr (W + 1)), the highest non-member row whose weight at
    or above it is at least k (+inf when k = 0). +inf without non-member weight.

    s: [n] ascending scores; neg_pos [m]: positions of the non-member rows (ascending), neg_unit [m] their samples;
    w: [b, N] multiplicities. Only the top K non-members are read, K doubled until every resample's answer is in."""
    m = neg_pos.size
    if not m:
        return np.full(w.shape[0], np.inf)
    total = w @ np.bincount(neg_unit, minlength=w.shape[1]).astype(np.float64)
    rank = np.floor(fpr * (total + 1) + 1e-9)
    cut = rank - 1e-6 if held_out else fpr * total + 1e-6  # at or above > cut: the rows that may hold the threshold
    k = min(m, int(np.ceil(2 * fpr * m)) + 64)
    while True:
        top = w[:, neg_unit[m - k :]]  # [b, K] the highest K non-members, ascending
        at_or_above = np.cumsum(top[:, ::-1], axis=1)[:, ::-1]  # weight at or above each of them
        if k == m or (at_or_above[:, 0] > cut).all():  # every answer inside: those below exceed it too
            break
        k = min(m, 2 * k)
    count = (at_or_above > cut[:, None]).sum(axis=1) + (m - k)  # non-members whose weight at or above exceeds
    thr = np.where(count > 0, s[neg_pos[np.maximum(count - 1, 0)]], -np.inf)
    if held_out:
        thr = np.where(rank >= 1, thr, np.inf)
    return np.where(total > 0, thr, np.inf)


def _weight_below(w, unit, channel, lo: int, hi: int, n_channels: int, positions: dict) -> dict:
    """{name: [b, C]} weight per channel of the rows at positions [lo, positions[name][b]) (lo <= positions <= hi):
    one running sum per channel over its own rows of the window, read at every position asked for."""
    out = {k: np.zeros((w.shape[0], n_channels)) for k in positions}
    rows = np.arange(lo, hi)
    ch = channel[lo:hi]
    pick = np.arange(w.shape[0])
    for c in np.unique(ch):
        idx = rows[ch == c]
        cum = np.zeros((w.shape[0], idx.size + 1))
        np.cumsum(w[:, unit[idx]], axis=1, out=cum[:, 1:])
        for k, p in positions.items():
            out[k][:, c] = cum[pick, np.searchsorted(idx, p, side="left")]
    return out


def _above_thresholds(w, unit, channel, s, p_fixed: int, thresholds: dict, n_channels: int) -> dict:
    """{name: [b, C]} weight per channel strictly above each per-resample threshold MINUS the weight strictly above
    the analytic threshold (at position p_fixed): the rows between the two, with their sign."""
    positions = {k: np.searchsorted(s, t, side="right") for k, t in thresholds.items()}
    lo = min([p_fixed, *(int(p.min()) for p in positions.values())])
    hi = max([p_fixed, *(int(p.max()) for p in positions.values())])
    below = _weight_below(w, unit, channel, lo, hi, n_channels, {**positions, None: np.full(w.shape[0], p_fixed)})
    return {k: below[None] - below[k] for k in positions}


def _resample_blocks(n_resamples: int, width: int):
    step = max(1, ROW_BUDGET // max(1, width))
    return [slice(start, start + step) for start in range(0, n_resamples, step)]


def choice_threshold(scores: np.ndarray, weights: np.ndarray, fpr: float) -> float:
    """Find the threshold an attack is chosen at: the higher of two estimates of the 1 - fpr quantile.

    The estimates are a normal law fitted to the non-member rows (weighted mean + sd Phi^-1(1 - fpr): calibrated
    scores are N(0, 1) for non-members where the calibration holds) and their in-sample empirical threshold
    (`counts.sorted_threshold`: it reads a heavy tail the fit misses). A choosing threshold that falls low by chance
    makes its attack look strong, one that falls high only costs it the choice: the higher of the two removes the
    low errors of each. Only the choice reads it: the measuring threshold is empirical.

    Args:
        scores (np.ndarray): [n] ascending calibrated scores of the rows.
        weights (np.ndarray): [n] weights of the non-member rows that set it (0 elsewhere).
        fpr (float): the false positive rate.
    Returns:
        float: the threshold, +inf without non-member weight.
    """
    total = weights.sum()
    if not total > 0:
        return np.inf
    mean = float((weights * scores).sum() / total)
    sd = float(np.sqrt((weights * (scores - mean) ** 2).sum() / total))
    order = float(sorted_threshold(scores, np.cumsum(weights)[None], fpr, held_out=False)[0])
    return max(mean + sd * float(normal_quantile(1 - fpr)), order)


def _choice_counts(s, member, fold, unit, w0: np.ndarray, fpr: float) -> np.ndarray:
    """[F, 4] what the attack is chosen on, for each fold f, on the observed data (row weights w0 [N]): the member
    rows of the other folds and f's non-member rows against `choice_threshold` of f's non-member rows (rows the
    measurement's threshold never reads)."""
    n_folds = int(fold.max()) + 1 if fold.size else 1
    out = np.zeros((n_folds, 4))
    rw = w0[unit]
    for f in range(n_folds):
        neg = rw * (~member & (fold == f))
        above = s > choice_threshold(s, neg, fpr)
        pos = rw * (member & (fold != f))
        out[f] = [pos[above].sum(), pos.sum(), neg[above].sum(), neg.sum()]
    return out


def calibrated_counts(
    z: np.ndarray, keep: np.ndarray, weights: np.ndarray, fpr: float, fold_of_sample: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Count one attack's per-sample calibrated scores pooled over the target models, whole and cross-fitted.

    Two thresholds over every row: the empirical one (the in-sample threshold of the pooled non-member rows, FPR <=
    fpr whatever the scores' distribution) and the analytic one, Phi^-1(1 - fpr).

    Args:
        z (np.ndarray): [M, N] calibrated scores on the normal scale (`normal_scores`).
        keep (np.ndarray): [M, N] membership.
        weights (np.ndarray): [B + 1, N] sample multiplicities.
        fpr (float): the false positive rate.
        fold_of_sample (np.ndarray): [N] fold of each sample (a sample's rows under every target in one fold).
    Returns:
        tuple: (measured [B + 1, 4]: every row against the empirical threshold; loose [B + 1, 4]: against the lower
        of the two, what a PASS reads; train [F, 4]: the member rows outside f against `choice_threshold` of f's
        non-member rows, observed data only; test [B + 1, F, 4]: f's rows against the conformal threshold of the
        non-member rows outside f, which a fresh non-member exceeds with probability <= fpr), counts (TP, POS, FP, NEG).
    """
    n_folds = int(fold_of_sample.max()) + 1
    B1, n_units = weights.shape
    analytic = normal_quantile(1 - fpr)
    ok = np.isfinite(z)
    _, unit = np.nonzero(ok)
    s, member, fold, unit = sorted_rows(z[ok], keep[ok], fold_of_sample[unit], unit)
    measured, loose, test = np.zeros((B1, 4)), np.zeros((B1, 4)), np.zeros((B1, n_folds, 4))
    if not s.size:
        return measured, loose, np.zeros((n_folds, 4)), test
    C = 2 * n_folds
    channel = member.astype(np.int64) * n_folds + fold  # class (0 non-member, 1 member) x fold
    p_fixed = int(np.searchsorted(s, analytic, side="right"))
    totals = (weights @ _per_sample(unit, channel, n_units, C)).reshape(B1, 2, n_folds)
    at_fixed = weights @ _per_sample(unit[p_fixed:], channel[p_fixed:], n_units, C)  # [B + 1, C]
    neg_pos = np.flatnonzero(~member)
    outside = [neg_pos[fold[neg_pos] != f] for f in range(n_folds)]
    for rows in _resample_blocks(B1, s.size):
        w = weights[rows]
        empirical = _empirical_thresholds(s, unit[neg_pos], neg_pos, w, fpr)
        thresholds: dict = {"high": empirical, "low": np.minimum(empirical, analytic)}
        for f, rest in enumerate(outside):
            thresholds[f] = _empirical_thresholds(s, unit[rest], rest, w, fpr, held_out=True)
        moved = _above_thresholds(w, unit, channel, s, p_fixed, thresholds, C)
        above = {k: (at_fixed[rows] + d).reshape(-1, 2, n_folds) for k, d in moved.items()}
        all_folds = totals[rows].sum(axis=2)
        measured[rows] = as_counts(above["high"].sum(axis=2), all_folds)
        loose[rows] = as_counts(above["low"].sum(axis=2), all_folds)
        for f in range(n_folds):
            test[rows, f] = as_counts(above[f][:, :, f], totals[rows][:, :, f])
    return measured, loose, _choice_counts(s, member, fold, unit, weights[0], fpr), test


def weighted_auroc(scores: np.ndarray, labels: np.ndarray, unit: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Compute the AUROC of pooled rows under each row of sample multiplicities (ties count one half).

    A row weighs the multiplicity of its sample. The rows are sorted once; each resample's AUROC is one compiled
    pass over them (`roc_kernel`), exact for integer weights.

    Args:
        scores (np.ndarray): [R] the rows' scores.
        labels (np.ndarray): [R] the rows' membership.
        unit (np.ndarray): [R] the rows' sample index.
        weights (np.ndarray): [B + 1, N] sample multiplicities.
    Returns:
        np.ndarray: [B + 1] AUROCs.
    """
    auroc, _, _ = roc_stats(roc_rows(scores, labels, unit, weights.shape[1]), weights, ())
    return auroc
