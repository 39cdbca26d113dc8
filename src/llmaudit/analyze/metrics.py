"""Scoring membership inference attacks: ROC metrics and their bootstrap CIs.

Pure functions (arrays in, numbers out; no I/O). Conventions, all from docs/science.md section 4:
- A score is "higher = more likely a member"; a label is True/1 for members.
- TPR at FPR alpha is the LARGEST TPR on the empirical ROC curve whose FPR is <= alpha.
- It is only *reliable* when there are at least 10 / alpha negatives (about 10 false positives are
  needed at the threshold). Unreliable values are kept but flagged (`reliable: False`); a report must
  not present them as solid numbers.
The evaluations over M target models x N samples (pooled naive, pooled calibrated, per-sample) are in
`llmaudit.analyze.metrics_pooled`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

from llmaudit.analyze.bootstrap import FPR_TOL, Resampling, bootstrap_stats, fpr_key
from llmaudit.common.stats import percentile_interval

DEFAULT_FPRS: tuple[float, ...] = (0.2, 0.15, 0.1, 0.05, 0.03, 0.01, 0.001)

_FPR_TOL = FPR_TOL  # k / n_neg compared with alpha in floating point

_CURVE_GRID = np.logspace(-4, 0, 61)


def is_reliable(n_negatives: int | float, alpha: float) -> bool:
    """Say whether a TPR at FPR alpha is estimable: at least 10 / alpha negatives.

    Args:
        n_negatives (int | float): the negatives (non-member scores).
        alpha (float): the FPR level.
    Returns:
        bool: True when n_negatives * alpha >= 10.
    """
    return bool(n_negatives * alpha >= 10 - 1e-9)


def _prepare(scores, labels) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels).ravel().astype(bool)
    if scores.shape != labels.shape:
        raise ValueError(f"scores {scores.shape} and labels {labels.shape} differ in length.")
    if not np.isfinite(scores).all():
        raise ValueError("scores contain NaN or inf; drop those entries first (pooled_* functions do).")
    n_pos = int(labels.sum())
    if n_pos == 0 or n_pos == labels.size:
        raise ValueError(
            f"need both members and non-members to score an attack (got {n_pos} members of {labels.size})."
        )
    return scores, labels


def tpr_at_fpr(scores, labels, alpha: float) -> tuple[float, float]:
    """Find the largest TPR on the empirical ROC with FPR <= alpha, and its threshold.

    Args:
        scores (np.ndarray): [n] scores, higher = member.
        labels (np.ndarray): [n] True for a member.
        alpha (float): the FPR level.
    Returns:
        tuple[float, float]: (TPR, threshold); members are scores >= threshold; +inf when no positive threshold
        keeps FPR <= alpha.
    Raises:
        ValueError: on mismatched lengths, non-finite scores or a single class.
    """
    scores, labels = _prepare(scores, labels)
    fpr, tpr, thr = roc_curve(labels, scores, drop_intermediate=False)
    idx = int(np.searchsorted(fpr, alpha + _FPR_TOL, side="right")) - 1  # fpr is non-decreasing
    return float(tpr[idx]), float(thr[idx])


def roc_metrics(scores, labels, fprs: Sequence[float] = DEFAULT_FPRS) -> dict:
    """Compute AUROC, average precision and TPR at each FPR level, with reliability flags.

    Args:
        scores (np.ndarray): [n] scores, higher = member.
        labels (np.ndarray): [n] True for a member.
        fprs (Sequence[float]): the FPR levels.
    Returns:
        dict: {"auroc", "average_precision", "n_positives", "n_negatives", "tpr_at_fpr": {"0.01": {"tpr",
        "threshold", "reliable", "min_negatives"}, ...}}, JSON-ready.
    Raises:
        ValueError: on mismatched lengths, non-finite scores or a single class.
    """
    scores, labels = _prepare(scores, labels)
    n_neg = int((~labels).sum())
    fpr, tpr, thr = roc_curve(labels, scores, drop_intermediate=False)
    at = {}
    for alpha in fprs:
        idx = int(np.searchsorted(fpr, alpha + _FPR_TOL, side="right")) - 1
        at[fpr_key(alpha)] = {
            "tpr": float(tpr[idx]),
            "threshold": float(thr[idx]),
            "reliable": is_reliable(n_neg, alpha),
            "min_negatives": int(np.ceil(10 / alpha - 1e-9)),
        }
    return {
        "auroc": float(roc_auc_score(labels, scores)),
        "average_precision": float(average_precision_score(labels, scores)),
        "n_positives": int(labels.sum()),
        "n_negatives": n_neg,
        "tpr_at_fpr": at,
    }


def roc_curve_loglog(scores, labels, grid: np.ndarray = _CURVE_GRID) -> dict:
    """Compute a compact ROC for log-log plots: the largest TPR with FPR <= f at each f of a grid.

    Grid points below 1 / n_negatives are left out: no FPR between 0 and 1 / n_negatives is observable.

    Args:
        scores (np.ndarray): [n] scores, higher = member.
        labels (np.ndarray): [n] True for a member.
        grid (np.ndarray): the FPR grid (log-spaced).
    Returns:
        dict: {"fpr": [...], "tpr": [...]}.
    """
    scores, labels = _prepare(scores, labels)
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    grid = np.asarray(grid, dtype=np.float64)
    grid = grid[grid * (~labels).sum() >= 1 - 1e-9]
    idx = np.searchsorted(fpr, grid + _FPR_TOL, side="right") - 1
    return {"fpr": [float(g) for g in grid], "tpr": [float(t) for t in tpr[idx]]}


def _percentile(values: np.ndarray, confidence: float) -> dict:
    """`percentile_interval` of the finite resampled statistics as {"low", "high"} (nan, nan when none)."""
    low, high = percentile_interval(values, confidence)
    return {"low": low, "high": high}


def _resampling_units(
    labels: np.ndarray, groups, stratified: bool, n_rows: int
) -> tuple[np.ndarray, int, np.ndarray | None]:
    """(unit of each row [n], number of units, stratum of each unit or None) of `bootstrap_ci`: a row is its
    own unit without groups; with `stratified`, a unit's stratum is its label (a group must be one class)."""
    if groups is None:
        unit_of_row = np.arange(n_rows)
    else:
        _, unit_of_row = np.unique(np.asarray(groups).ravel(), return_inverse=True)
        if unit_of_row.size != n_rows:
            raise ValueError("groups must have one entry per score.")
    n_units = int(unit_of_row.max()) + 1
    if stratified:
        if groups is not None:
            unit_label = np.zeros(n_units)
            np.add.at(unit_label, unit_of_row, labels.astype(float))
            unit_size = np.bincount(unit_of_row, minlength=n_units)
            if not np.all((unit_label == 0) | (unit_label == unit_size)):
                raise ValueError("stratified=True needs every group to be all members or all non-members.")
            strata = unit_label > 0
        else:
            strata = labels
    else:
        strata = None
    return unit_of_row, n_units, strata


def bootstrap_ci(
    scores,
    labels,
    *,
    fprs: Sequence[float] = DEFAULT_FPRS,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
    groups=None,
    resampling: Resampling = Resampling(),
) -> dict:
    """Compute percentile bootstrap CIs of AUROC, average precision and TPR at each FPR.

    Resamples that lose one class give NaN and are ignored.

    Args:
        scores (np.ndarray): [n] scores, higher = member.
        labels (np.ndarray): [n] True for a member.
        fprs (Sequence[float]): the FPR levels.
        n_boot (int): bootstrap resamples.
        confidence (float): the intervals' confidence.
        seed (int): the resampling seed.
        groups (np.ndarray | None): [n] resampling unit of each row (e.g. the sample index when scores pool
            several models): a drawn unit brings all its rows.
        resampling (Resampling): whether the numbers of members and non-members stay fixed in every resample.
    Returns:
        dict: {"auroc": {"low", "high"}, "average_precision": {...}, "tpr_at_fpr": {key: {...}}, "n_boot", ...}.
    Raises:
        ValueError: on groups of the wrong length, or stratified groups mixing classes.
    """
    scores, labels = _prepare(scores, labels)
    stratified = resampling.stratified
    if stratified is None:
        stratified = groups is None
    unit_of_row, n_units, strata = _resampling_units(labels, groups, stratified, scores.size)
    parts = bootstrap_stats(scores, labels, unit_of_row, n_units, strata, fprs, n_boot, seed)
    joined = {
        "auroc": np.concatenate([p["auroc"] for p in parts]),
        "average_precision": np.concatenate([p["average_precision"] for p in parts]),
    }
    out = {name: _percentile(vals, confidence) for name, vals in joined.items()}
    out["tpr_at_fpr"] = {
        fpr_key(a): _percentile(np.concatenate([p["tpr_at_fpr"][fpr_key(a)] for p in parts]), confidence) for a in fprs
    }
    out.update(
        n_boot=int(n_boot),
        confidence=float(confidence),
        seed=int(seed),
        method="percentile bootstrap",
        resampling="groups (samples)"
        if groups is not None
        else ("rows, stratified by label" if stratified else "rows"),
    )
    return out
