"""Weighted ROC statistics of many bootstrap resamples in one compiled pass over the sorted rows (docs/science.md
section 4, "Bootstrap over samples"; the numbers of the numpy reference `sorted_roc_stats` in the tests).

The rows are sorted once by score, descending, and cut into tie groups (rows of equal score). A resample is a
vector of unit multiplicities c [n_units]; a row weighs its unit's multiplicity. Walking the groups in order
with the running member weight TP and non-member weight FP above the group, and the group's member and
non-member weights g+ and g-:
- AUROC = 1 - sum_groups g+ (2 FP + g-) / 2 / (n+ n-): the weighted (member, non-member) pairs in the wrong order,
  a tie counted one half;
- AP = sum_groups g+ (TP + g+) / max(TP + g+ + FP + g-, 1) / n+ (the precision at each member row, its tie group
  counted in full);
- TPR at FPR alpha = the TP + g+ of the last group whose FP + g- <= floor(alpha n-) (the integer weights make
  "<= alpha n-" and "<= floor(alpha n-)" the same), / n+.
Every sum but AP's is of integer weights in float64, so AUROC and TPR equal the numpy path exactly; AP differs by
the order of its floating-point sum (about 1e-14). The pass branches only at the end of a tie group (a mispredicted
branch per row costs more than the arithmetic), and the TPR levels are visited once each as FP rises, O(rows + levels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

FPR_TOL = 1e-12  # as `bootstrap.FPR_TOL`: alpha n- compared in floating point


@dataclass(frozen=True)
class RocRows:
    """The rows of one score vector in descending order of score, cut into tie groups."""

    unit: np.ndarray  # [n] int64 resampling unit of each row
    member: np.ndarray  # [n] float64 1.0 for a member row, 0.0 for a non-member
    last: np.ndarray  # [n] bool: the last row of its tie group
    unit_members: np.ndarray  # [n_units] float64 member rows of each unit
    unit_non_members: np.ndarray  # [n_units] float64 non-member rows of each unit


def roc_rows(scores: np.ndarray, labels: np.ndarray, unit_of_row: np.ndarray, n_units: int) -> RocRows:
    """Sort the rows once, by descending score, and cut them into tie groups.

    Args:
        scores (np.ndarray): [n] scores.
        labels (np.ndarray): [n] membership.
        unit_of_row (np.ndarray): [n] resampling unit of each row.
        n_units (int): the length of a resample's counts.
    Returns:
        RocRows: the sorted rows.
    """
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    s = np.asarray(scores, dtype=np.float64)[order]
    labels = np.asarray(labels, dtype=bool)
    unit = np.asarray(unit_of_row, dtype=np.int64)
    return RocRows(
        unit=unit[order],
        member=labels[order].astype(np.float64),
        last=np.r_[s[1:] != s[:-1], True] if s.size else np.zeros(0, bool),
        unit_members=np.bincount(unit[labels], minlength=n_units).astype(np.float64),
        unit_non_members=np.bincount(unit[~labels], minlength=n_units).astype(np.float64),
    )


@numba.njit(cache=True, nogil=True)
def _one_resample(c, rows, levels, tp_at):  # pragma: no cover
    rows_unit, member, last, unit_members, unit_non_members = rows
    caps, level_of = levels
    n_pos = 0.0
    n_neg = 0.0
    for u in range(c.size):
        n_pos += c[u] * unit_members[u]
        n_neg += c[u] * unit_non_members[u]
    fp, tp, above, ap_sum, gp, gn, j = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0
    cap = np.floor(caps[0] * n_neg) if caps.size else np.inf
    for i in range(rows_unit.size):
        w = c[rows_unit[i]]
        wp = w * member[i]
        gp += wp
        gn += w - wp
        if last[i]:  # the group's last row (every row without ties: a branch always taken)
            fp_hi, tp_hi = fp + gn, tp + gp
            while j < caps.size and fp_hi > cap:  # the levels FP has just passed keep the TP before this group
                tp_at[level_of[j]] = tp
                j += 1
                cap = np.floor(caps[j] * n_neg) if j < caps.size else np.inf
            above += gp * (fp + fp_hi)  # no branch on gp > 0: a mispredicted branch per row costs more
            ap_sum += gp * (tp_hi / max(tp_hi + fp_hi, 1.0))
            fp, tp, gp, gn = fp_hi, tp_hi, 0.0, 0.0
    while j < caps.size:
        tp_at[level_of[j]] = tp
        j += 1
    return n_pos, n_neg, above, ap_sum


@numba.njit(cache=True, nogil=True)
def _roc_block(counts, rows, levels, out):  # pragma: no cover
    auroc, ap, tpr = out
    for b in range(counts.shape[0]):
        n_pos, n_neg, above, ap_sum = _one_resample(counts[b], rows, levels, tpr[b])
        pairs = n_pos * n_neg
        auroc[b] = (pairs - 0.5 * above) / pairs if pairs > 0 else np.nan
        ap[b] = ap_sum / n_pos if n_pos > 0 else np.nan
        for k in range(tpr.shape[1]):
            tpr[b, k] = tpr[b, k] / n_pos if n_pos > 0 else np.nan


def roc_stats(rows: RocRows, counts: np.ndarray, fprs: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute AUROC, average precision and TPR at each FPR of every resample, in one compiled pass each.

    Args:
        rows (RocRows): the sorted rows (`roc_rows`).
        counts (np.ndarray): [B, n_units] integer multiplicities of the units.
        fprs (Sequence[float]): the FPR levels.
    Returns:
        tuple[np.ndarray, np.ndarray, np.ndarray]: (AUROC [B], AP [B], TPR [B, len(fprs)]), NaN for a resample that
        lost a class.
    """
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    levels = np.asarray(list(fprs), dtype=np.float64) + FPR_TOL
    level_of = np.argsort(levels, kind="stable").astype(np.int64)
    auroc, ap = np.empty(counts.shape[0]), np.empty(counts.shape[0])
    tpr = np.zeros((counts.shape[0], levels.size))
    arrays = (rows.unit, rows.member, rows.last, rows.unit_members, rows.unit_non_members)
    _roc_block(counts, arrays, (levels[level_of], level_of), (auroc, ap, tpr))
    return auroc, ap, tpr


def warm_up() -> None:
    """Compile the kernel now with a tiny call (from numba's on-disk cache after the first time on a machine).

    A measurement that follows then times the arithmetic, not the compiler.
    """
    rows = roc_rows(np.array([0.0, 1.0]), np.array([False, True]), np.array([0, 1]), 2)
    roc_stats(rows, np.ones((1, 2)), (0.5,))
