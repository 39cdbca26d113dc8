"""Ragged rows (texts of different lengths, their values concatenated) as padded matrices, in blocks of texts of
similar length so that the padding and the memory stay small."""

from __future__ import annotations

import numpy as np


def sizes(rows) -> np.ndarray:
    """[n] the number of values of each of n array-likes (an ndarray's .size read directly: np.size is slow)."""
    return np.fromiter((r.size if type(r) is np.ndarray else np.size(r) for r in rows), np.int64, len(rows))


def flatten(rows) -> tuple[np.ndarray, np.ndarray]:
    """(every row's values concatenated as float64 [sum T], lengths [n]) of n array-likes (each flattened)."""
    rows = list(rows)
    lengths = sizes(rows)
    flat = np.concatenate(rows, axis=None).astype(np.float64) if rows else np.zeros(0)
    return flat, lengths


def length_blocks(lengths: np.ndarray, budget: int = 1 << 22) -> list[np.ndarray]:
    """The texts' indices sorted by length (ascending), cut into consecutive blocks each padded to its longest
    within about `budget` cells (at least one text per block)."""
    order = np.argsort(lengths, kind="stable")
    ordered = np.asarray(lengths)[order]
    blocks, begin, n = [], 0, order.size
    while begin < n:
        rows = min(n - begin, budget)
        cost = np.arange(1, rows + 1) * (ordered[begin : begin + rows] + 1)  # cells, increasing
        stop = begin + max(1, int(np.searchsorted(cost, budget, side="right")))
        blocks.append(order[begin:stop])
        begin = stop
    return blocks


def padded(
    flat: np.ndarray, lengths: np.ndarray, starts: np.ndarray, fill: float, width: int | None = None
) -> np.ndarray:
    """[n, width] rows: text i's values flat[starts[i] : starts[i] + lengths[i]], then `fill` (width: the
    longest text, by default)."""
    n = lengths.size
    out = np.full((n, int(lengths.max()) if width is None else width), fill, dtype=np.float64)
    pos = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # position in its text
    out[np.repeat(np.arange(n), lengths), pos] = flat[np.repeat(starts, lengths) + pos]
    return out


def row_means(rows: np.ndarray, counts: np.ndarray, *, last: bool = False) -> np.ndarray:
    """[n] the mean of each row's first (or, with `last`, last) counts[i] entries, computed as numpy's mean of
    that 1-D slice alone (rows of one count are reduced together: a contiguous row reduces as a 1-D array does)."""
    out = np.empty(rows.shape[0])
    for k in np.unique(counts):
        sel = counts == k
        out[sel] = (rows[sel, rows.shape[1] - k :] if last else rows[sel, :k]).mean(axis=1)
    return out


def row_sums(rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """[n] numpy's sum of each row's first counts[i] entries as a 1-D array alone (0 for a count of 0)."""
    out = np.zeros(rows.shape[0])
    for k in np.unique(counts[counts > 0]):
        sel = counts == k
        out[sel] = rows[sel, :k].sum(axis=1)
    return out


def smallest_means(flat: np.ndarray, lengths: np.ndarray, counts: np.ndarray, budget: int = 1 << 22) -> np.ndarray:
    """[n] the mean of the counts[i] smallest values of each text (1 <= counts[i] <= lengths[i]): numpy's mean of
    np.sort(text)[:counts[i]], the same numbers as one text at a time. NaN values sort last."""
    starts = np.cumsum(lengths) - lengths
    out = np.empty(lengths.size)
    for idx in length_blocks(lengths, budget):
        out[idx] = row_means(np.sort(padded(flat, lengths[idx], starts[idx], np.nan), axis=1), counts[idx])
    return out


def largest_means(flat: np.ndarray, lengths: np.ndarray, counts: np.ndarray, budget: int = 1 << 22) -> np.ndarray:
    """[n] numpy's mean of np.sort(text)[-counts[i]:] of each text (the counts[i] largest values, ascending;
    NaN values sort last, so they are among them)."""
    starts = np.cumsum(lengths) - lengths
    out = np.empty(lengths.size)
    for idx in length_blocks(lengths, budget):
        rows = np.sort(padded(flat, lengths[idx], starts[idx], -np.inf), axis=1)  # the padding sorts first
        out[idx] = row_means(rows, counts[idx], last=True)
    return out
