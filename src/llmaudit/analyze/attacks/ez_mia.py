"""EZ-MIA [Ilic2026] (docs/science.md section 4): the upward against the downward shifts of log p from the
reference to the target in the target's error zone. Scores are "higher = more likely a member".
"""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.token_shift import flat_shifts
from llmaudit.common.ragged import length_blocks, padded, row_sums, sizes

EZ_EDGES = ("top", "bottom")
"""EZ-MIA's conventions for a text whose error zone has no negative shift (N = 0), no position included:
"top" ranks it above every other text (LeakPro, the paper's appendix E.5/E.6: all probability mass moved up
is the strongest member signal); "bottom" scores it 0, the lowest possible value (the authors' released
code). The authors' code also scores a text with fewer than 2 error positions 0; with one position the
ratio is 0 or N = 0 anyway, so that rule adds nothing here."""


def error_zone_masses(delta: np.ndarray, top1: np.ndarray, *, skip_first: bool = False) -> tuple[float, float, int]:
    """Sum the upward and downward shifts of log p in one text's error zone.

    The error zone E is the positions where the target's top-1 prediction is not the token (top1 False).

    Args:
        delta (np.ndarray): [T] shifts of log p from the reference to the target.
        top1 (np.ndarray): [T] bool, True where the target's top-1 prediction is the token.
        skip_first (bool): leave the first scored position out of E.
    Returns:
        tuple[float, float, int]: (P, N, |E|), P = sum over E of max(delta_t, 0), N = sum over E of max(-delta_t, 0).
    Raises:
        ValueError: when delta and top1 differ in length.
    """
    delta = np.asarray(delta, dtype=np.float64)
    wrong = ~np.asarray(top1, dtype=bool)
    if wrong.shape != delta.shape:
        raise ValueError(f"{delta.size} token shifts but {wrong.size} top-1 flags.")
    if skip_first and wrong.size:
        wrong = wrong.copy()
        wrong[0] = False
    zone = delta[wrong]
    return float(np.clip(zone, 0, None).sum()), float(np.clip(-zone, 0, None).sum()), int(wrong.sum())


def ez_mia_score(
    target_token_losses, reference_token_losses, target_top1, *, edge: str = "top", skip_first: bool = False
) -> np.ndarray:
    """Score EZ-MIA [Ilic2026]: P / (P + N) of the shifts of log p in the target's error zone.

    P / (P + N) in [0, 1) is a monotone map of the paper's P / N (the same ranking), finite for every text.
    All texts are scored at once, with the same numbers as `error_zone_masses` text by text (`_zone_sums`).

    Args:
        target_token_losses (Sequence[np.ndarray]): n texts' per-token losses under the target.
        reference_token_losses (Sequence[np.ndarray]): the same texts' per-token losses under the reference.
        target_top1 (Sequence[np.ndarray]): n texts' top-1 flags of the target, one per token.
        edge (str): a text with N = 0: "top" scores 1 + P / (1 + P) in [1, 2), above every other and ordered by
            P (LeakPro's rank); "bottom" scores 0 (the authors' code). P = 0 < N scores 0 under both.
        skip_first (bool): leave the first scored position out of the error zone.
    Returns:
        np.ndarray: [n] scores, higher = more likely a member.
    Raises:
        ValueError: on an unknown edge or texts and flags of different lengths.
    """
    if edge not in EZ_EDGES:
        raise ValueError(f"edge must be one of {EZ_EDGES}; got {edge!r}.")
    flags = [np.asarray(f).ravel() for f in target_top1]
    delta, lengths = flat_shifts(target_token_losses, reference_token_losses)
    if len(flags) != lengths.size:
        raise ValueError(f"{lengths.size} texts but {len(flags)} rows of top-1 flags.")
    if lengths.size == 0:
        return np.zeros(0)
    wrong_size = np.flatnonzero(sizes(flags) != lengths)
    if wrong_size.size:
        i = int(wrong_size[0])
        raise ValueError(f"text {i}: {lengths[i]} token shifts but {flags[i].size} top-1 flags.")
    wrong = ~np.concatenate(flags).astype(bool)  # the error zone
    if skip_first:
        wrong[np.cumsum(lengths) - lengths] = False
    p, n = _zone_sums(delta[wrong], np.add.reduceat(wrong.astype(np.int64), np.cumsum(lengths) - lengths))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = p / (p + n)
    return np.where(n > 0, ratio, 1.0 + p / (1.0 + p) if edge == "top" else 0.0)


def _zone_sums(zone: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P, N) [n] of every text's error zone: zone = the zone shifts of every text concatenated, sizes [n] their
    numbers; each sum is numpy's sum of that text's clipped zone alone, as `error_zone_masses` computes it
    (texts of similar zone sizes padded together, in bounded blocks)."""
    p, n = np.zeros(sizes.size), np.zeros(sizes.size)
    starts = np.cumsum(sizes) - sizes
    up, down = np.clip(zone, 0, None), np.clip(-zone, 0, None)
    for idx in length_blocks(sizes):
        width = max(int(sizes[idx].max()), 1)
        p[idx] = row_sums(padded(up, sizes[idx], starts[idx], 0.0, width=width), sizes[idx])
        n[idx] = row_sums(padded(down, sizes[idx], starts[idx], 0.0, width=width), sizes[idx])
    return p, n
