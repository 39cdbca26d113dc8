"""Bootstrap resamples of ROC statistics as multiplicities over a fixed sorted order (docs/science.md section 4,
"Bootstrap over samples").

A resample of units (samples, or rows) with replacement is a vector of multiplicities c [n_units]; every row
of a unit carries its unit's multiplicity as its weight. The rows are sorted ONCE, members and non-members
apart, by score descending; in that order a resample's weighted AUROC, average precision and TPR at an FPR
level are cumulative sums of its weights, never a re-sort: one compiled pass over the sorted rows per resample
(`roc_kernel`). The tests compare it with numpy references (tests/analyze/reference_impls.py) that draw the same
multiplicities from the same generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from llmaudit.analyze.roc_kernel import FPR_TOL, roc_rows, roc_stats

__all__ = ["FPR_TOL", "Resampling", "block_size", "bootstrap_stats", "fpr_key", "resample_counts"]


def fpr_key(alpha: float) -> str:
    """The JSON key of an FPR level.

    Args:
        alpha: the FPR level, e.g. 0.01.

    Returns:
        Its shortest decimal text: 0.01 -> "0.01", 0.001 -> "0.001".
    """
    return f"{alpha:g}"


def resample_counts(rng: np.random.Generator, n_units: int, n_boot: int, strata=None) -> np.ndarray:
    """The multiplicities of `n_boot` bootstrap resamples of `n_units` units.

    Args:
        rng: the generator the draws come from (its state advances).
        n_units: how many units are resampled.
        n_boot: how many resamples.
        strata: optional [n_units] labels; each stratum is resampled within itself (its size kept).

    Returns:
        [n_boot, n_units] float64 multiplicities, each row summing to n_units.
    """
    groups = [np.arange(n_units)] if strata is None else [np.flatnonzero(strata == s) for s in np.unique(strata)]
    offsets = (np.arange(n_boot) * n_units)[:, None]
    counts = np.zeros(n_boot * n_units)
    for members in groups:
        draw = members[rng.integers(0, members.size, size=(n_boot, members.size))]
        counts += np.bincount((draw + offsets).ravel(), minlength=n_boot * n_units)
    return counts.reshape(n_boot, n_units)


def block_size(n_boot: int, width: int, budget: int = 2_000_000) -> int:
    """How many resamples one block holds.

    Args:
        n_boot: the resamples in all.
        width: the numbers per resample in a block's arrays.
        budget: about how many numbers a block's [block, width] arrays may hold.

    Returns:
        The resamples per block, between 1 and `n_boot`.
    """
    return max(1, min(n_boot, budget // max(width, 1)))


def bootstrap_stats(
    scores: np.ndarray,
    labels: np.ndarray,
    unit_of_row: np.ndarray,
    n_units: int,
    strata: np.ndarray | None,
    fprs: Sequence[float],
    n_boot: int,
    seed: int,
) -> list[dict]:
    """Weighted ROC statistics of `n_boot` resamples of the units, one compiled pass per resample (`roc_kernel`).

    The resamples are drawn in blocks (`block_size`) from one generator, so that any engine drawing the same
    blocks gives the same resamples.

    Args:
        scores: [n] scores, higher = more likely a member.
        labels: [n] booleans, True for a member row.
        unit_of_row: [n] the resampling unit of each row, in [0, n_units).
        n_units: how many units there are.
        strata: optional [n_units] labels to resample within (`resample_counts`).
        fprs: the FPR levels of the TPRs.
        n_boot: how many resamples.
        seed: the generator's seed.

    Returns:
        One dict per block, in draw order: {"auroc": [B], "average_precision": [B], "tpr_at_fpr": {key: [B]}}; a
        resample that lost a class gives NaN.
    """
    rows = roc_rows(scores, labels, unit_of_row, n_units)
    rng = np.random.default_rng(seed)
    step = block_size(n_boot, np.unique(scores).size + n_units)
    parts = []
    for start in range(0, n_boot, step):
        auroc, ap, tpr = roc_stats(rows, resample_counts(rng, n_units, min(step, n_boot - start), strata), fprs)
        parts.append(
            {"auroc": auroc, "average_precision": ap, "tpr_at_fpr": {fpr_key(a): tpr[:, i] for i, a in enumerate(fprs)}}
        )
    return parts


@dataclass(frozen=True)
class Resampling:
    """How `metrics.bootstrap_ci` resamples.

    Args:
        stratified: keep the numbers of members and non-members fixed in every resample (None: True without
            groups, False with them).
    """

    stratified: bool | None = None
