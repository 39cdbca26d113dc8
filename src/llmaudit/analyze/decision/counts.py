"""Resampled hit counts behind every release decision (docs/science.md section 12).

A decision reads, for each attack, four weighted counts at the decision's FPR level: members above the threshold
(true positives), members, non-members above the threshold (false positives), non-members. The threshold is
empirical (the largest TPR whose FPR on non-member rows is at most the level), so the FPR is what it says without
any assumption on the score's distribution. A bootstrap resample (samples drawn with replacement, each bringing
all its target models) is a vector of per-sample multiplicities w [N]: a row (target, sample) weighs its sample's
multiplicity. Row 0 of every count array is the observed data (w = 1); rows 1..B are the resamples. Two
quantizers resampled with the same multiplicities are paired.

Shapes: M target models, N samples, A attacks, F folds, B resamples (+1 for the observed row).
"""

from __future__ import annotations

import numpy as np

TP, POS, FP, NEG = 0, 1, 2, 3
"""Indices of the last axis of every count array: true positives, members, false positives, non-members."""


def multiplicities(n_units: int, n_boot: int, seed: int, strata: np.ndarray | None = None) -> np.ndarray:
    """Draw the bootstrap's per-sample multiplicities.

    Args:
        n_units (int): the number of samples N.
        n_boot (int): the number of resamples B.
        seed (int): the seed of `numpy.random.default_rng`.
        strata (np.ndarray | None): [N] stratum of each sample; when given, each resample is drawn within each
            stratum, so that it keeps the numbers of each stratum.
    Returns:
        np.ndarray: [B + 1, N] float64 multiplicities, row 0 all ones (the observed data).
    """
    rng = np.random.default_rng(seed)
    out = np.zeros((n_boot + 1, n_units))
    out[0] = 1.0
    groups = [np.arange(n_units)] if strata is None else [np.flatnonzero(strata == s) for s in np.unique(strata)]
    rows = np.arange(1, n_boot + 1)[:, None]
    for members in groups:
        if members.size == 0:
            continue
        draw = members[rng.integers(0, members.size, size=(n_boot, members.size))]
        np.add.at(out, (np.broadcast_to(rows, draw.shape), draw), 1.0)
    return out


def sample_folds(labels: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """Deal the samples into folds: a seeded permutation dealt round-robin within each label.

    Every fold holds about 1/F of the members and of the non-members.

    Args:
        labels (np.ndarray): [N] labels (e.g. membership under the only target).
        n_folds (int): the number of folds F.
        seed (int): the seed of the permutation.
    Returns:
        np.ndarray: [N] the fold of each sample.
    """
    rng = np.random.default_rng(seed)
    folds = np.empty(labels.size, dtype=np.int64)
    for value in np.unique(labels):
        idx = np.flatnonzero(labels == value)
        folds[rng.permutation(idx)] = np.arange(idx.size) % n_folds
    return folds


def _cumulative_by_fold(weights: np.ndarray, member: np.ndarray, fold: np.ndarray, n_folds: int) -> np.ndarray:
    """[2, F, B + 1, n] running weight, along the ascending scores, of each class (0 non-members, 1 members) and
    fold: float32 holds these integer counts exactly (below 2^24)."""
    out = np.empty((2, n_folds) + weights.shape, dtype=np.float32)
    for c, is_member in enumerate((False, True)):
        for f in range(n_folds):
            np.cumsum(weights * ((member == is_member) & (fold == f)), axis=1, out=out[c, f])
    return out


def _above(scores: np.ndarray, cum: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """[B + 1] weight strictly above thresholds[b], for ascending scores [n] and a running weight cum [B + 1, n]."""
    if not scores.size:
        return np.zeros(cum.shape[0])
    last = np.searchsorted(scores, thresholds, side="right") - 1  # last position with score <= threshold
    below = np.where(last >= 0, np.take_along_axis(cum, np.maximum(last, 0)[:, None], axis=1)[:, 0], 0.0)
    return cum[:, -1] - below


def sorted_threshold(scores: np.ndarray, cum: np.ndarray, fpr: float, held_out: bool) -> np.ndarray:
    """Find, per resample, the score of the empirical threshold at a false positive rate.

    Members count when their score is strictly above the threshold. With D_i = W - cum_{i-1} the weight at positions
    >= i: in-sample the largest i with D_i > fpr * W, held out the largest i with D_i >= floor(fpr * (W + 1)) (the
    k-th largest). D only steps down at positions with weight, so the position found always holds a non-member.
    In-sample (judged on the same non-members), every threshold above s_j keeps the weighted false positives
    <= fpr * W and none at or below it does: the largest TPR with FPR <= fpr on the empirical ROC
    (`llmaudit.analyze.metrics.tpr_at_fpr`). Held out (applied to OTHER non-members, as in cross-fitting), s_j is
    the k-th largest non-member, which a fresh non-member exceeds with probability k / (n + 1) <= fpr (the conformal
    quantile).

    Args:
        scores (np.ndarray): [n] ascending scores.
        cum (np.ndarray): [B + 1, n] the non-members' running weight along the scores.
        fpr (float): the false positive rate.
        held_out (bool): the conformal (held-out) rule instead of the in-sample one.
    Returns:
        np.ndarray: [B + 1] thresholds; +inf with k = 0 or without non-member weight; -inf in-sample when every
        position is within the budget (fpr >= 1).
    """
    if not scores.size:
        return np.full(cum.shape[0], np.inf)
    total = cum[:, -1].astype(np.float64)
    at_or_above = total[:, None] - np.concatenate([np.zeros((cum.shape[0], 1), cum.dtype), cum[:, :-1]], axis=1)
    if held_out:
        k = np.floor(fpr * (total + 1) + 1e-9)
        i = (at_or_above >= k[:, None] - 1e-6).sum(axis=1) - 1
        thr = np.where((k >= 1) & (i >= 0), scores[np.maximum(i, 0)], np.inf)
    else:
        i = (at_or_above > fpr * total[:, None] + 1e-6).sum(axis=1) - 1
        thr = np.where(i >= 0, scores[np.maximum(i, 0)], -np.inf)
    return np.where(total > 0, thr, np.inf)


ROW_BUDGET = 20_000_000
"""Resampled row weights held at once (float32 elements of the running-weight arrays): resamples are counted in
chunks, so memory stays bounded however large the grid."""


def _counts(s: np.ndarray, part: np.ndarray, thr: np.ndarray) -> np.ndarray:
    """[b, 4] (TP, POS, FP, NEG) of the rows whose running weight per class is part [2, b, n], at thresholds [b]."""
    total = part[:, :, -1] if s.size else np.zeros(part.shape[:2])
    return np.stack([_above(s, part[1], thr), total[1], _above(s, part[0], thr), total[0]], axis=1)


def sorted_rows(scores, member, group, unit):
    """Sort the rows by ascending score (stable).

    Args:
        scores (np.ndarray): [n] scores.
        member (np.ndarray): [n] membership.
        group (np.ndarray): [n] group (e.g. fold) of each row.
        unit (np.ndarray): [n] sample index of each row.
    Returns:
        tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]: (scores, member, group, unit) in that order.
    """
    order = np.argsort(scores, kind="stable")
    return scores[order], member[order], group[order], unit[order]


def _chunks(n_rows: int, n_groups: int, n_resamples: int):
    step = max(1, ROW_BUDGET // max(1, n_rows * 2 * n_groups))
    return [slice(start, start + step) for start in range(0, n_resamples, step)]


def empirical_counts(
    scores: np.ndarray, keep: np.ndarray, weights: np.ndarray, fpr: float, fold_of_sample: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Count one attack's hits with an empirical threshold per target model, whole and cross-fitted.

    whole: every row against the in-sample threshold of all the target's non-members (the TPR at FPR <= fpr of
    every benchmark). Cross-fitting, per fold f, with the roles of the two classes crossed so that the choice and
    the measurement share no sample: "train" (what the attack is chosen on; observed data only), the members
    outside f against the in-sample threshold of f's non-members; "test" (what the chosen attack is measured on),
    f's members and non-members against the conformal threshold of the non-members outside f. The measuring
    threshold never saw what decided the choice, and f's own non-members, fresh to it, give its realised FPR.

    Args:
        scores (np.ndarray): [M, N] raw scores (NaN = not scored).
        keep (np.ndarray): [M, N] membership.
        weights (np.ndarray): [B + 1, N] sample multiplicities (`multiplicities`).
        fpr (float): the false positive rate.
        fold_of_sample (np.ndarray): [N] fold of each sample (`sample_folds`).
    Returns:
        tuple[np.ndarray, np.ndarray, np.ndarray]: (whole [B + 1, 4], train [F, 4], test [B + 1, F, 4]) counts
        (TP, POS, FP, NEG).
    """
    n_folds = int(fold_of_sample.max()) + 1
    whole = np.zeros((weights.shape[0], 4))
    train = np.zeros((n_folds, 4))
    test = np.zeros((weights.shape[0], n_folds, 4))
    for m in range(scores.shape[0]):
        ok = np.flatnonzero(np.isfinite(scores[m]))
        s, member, fold, unit = sorted_rows(scores[m, ok], keep[m, ok], fold_of_sample[ok], ok)
        for rows in _chunks(s.size, n_folds, weights.shape[0]):
            cum = _cumulative_by_fold(weights[rows][:, unit].astype(np.float32), member, fold, n_folds)
            total = cum.sum(axis=1)
            whole[rows] += _counts(s, total, sorted_threshold(s, total[0], fpr, held_out=False))
            for f in range(n_folds):
                own, rest = cum[:, f], total - cum[:, f]
                test[rows, f] += _counts(s, own, sorted_threshold(s, rest[0], fpr, held_out=True))
                if rows.start == 0:  # the choice, on the observed data: f's non-members set the threshold
                    choose = np.stack([own[0, :1], rest[1, :1]])
                    train[f] += _counts(s, choose, sorted_threshold(s, own[0, :1], fpr, held_out=False))[0]
    return whole, train, test


def normal_quantile(p: float) -> float:
    """Compute the standard normal quantile Phi^-1(p).

    Args:
        p (float): the probability, in (0, 1).
    Returns:
        float: the quantile.
    """
    from scipy import stats

    return float(stats.norm.ppf(p))


def normal_scores(z: np.ndarray, n_ref, t_cutoff: float) -> np.ndarray:
    """Map per-sample calibrated scores to one normal scale.

    A score standardised with n references, whose Gaussian predictive law is sqrt(1 + 1/n) t_{n-1}, maps to
    Phi^-1(F_{t,n-1}(z / sqrt(1 + 1/n))), so that one threshold Phi^-1(1 - alpha) is the per-sample Student-t
    threshold of `llmaudit.analyze.metrics.calibrated_threshold` for every n.

    Args:
        z (np.ndarray): [M, N] standardised scores.
        n_ref (np.ndarray | None): [M, N] references per score; None leaves z as it is.
        t_cutoff (float): n at or above it keeps z as it is (the normal threshold); so does n < 2.
    Returns:
        np.ndarray: [M, N] scores on the normal scale.
    """
    from scipy import special, stats

    z = np.asarray(z, dtype=np.float64)
    if n_ref is None:
        return z
    n = np.broadcast_to(np.asarray(n_ref, dtype=np.float64), z.shape)
    small = (n >= 2) & (n < t_cutoff) & np.isfinite(z)
    out = z.copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        log_tail = stats.t.logsf(z[small] / np.sqrt(1 + 1 / n[small]), df=n[small] - 1)
        out[small] = -special.ndtri_exp(log_tail)  # the tail kept in logs: no underflow far out
    return out


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Divide elementwise, NaN where the denominator is 0.

    Args:
        num (np.ndarray): numerators.
        den (np.ndarray): denominators, same shape.
    Returns:
        np.ndarray: num / den, NaN where den == 0.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def as_counts(above: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Arrange weights above the threshold and class totals as (TP, POS, FP, NEG) counts.

    Args:
        above (np.ndarray): [b, 2] weight above the threshold per class (0 non-members, 1 members).
        totals (np.ndarray): [b, 2] total weight per class.
    Returns:
        np.ndarray: [b, 4] counts.
    """
    return np.stack([above[:, 1], totals[:, 1], above[:, 0], totals[:, 0]], axis=1)
