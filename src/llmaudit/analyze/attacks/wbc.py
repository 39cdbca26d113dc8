"""WBC [Chen2026] (docs/science.md section 4): the share of sliding windows in which the reference's summed
token loss exceeds the target's, averaged over window sizes. Scores are "higher = more likely a member".
"""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.token_shift import flat_shifts
from llmaudit.common.ragged import length_blocks, row_means

WBC_GRIDS: dict[str, tuple[int, ...]] = {
    "config": (2, 3, 4, 6, 9, 13, 18, 25, 32, 40),
    "paper": (2, 3, 4, 5, 8, 11, 15, 21, 29, 40),
}
"""WBC's window sizes: "config" = the authors' released configuration; "paper" = the paper's geometric grid
round(2 * 20^((k-1)/9)), k = 1..10 (LeakPro's default). `geometric_windows(2, 40, 10)` gives "paper"."""


WBC_LONG = ("clamp", "skip")
"""WBC's rule for a window longer than the text (T < w): "clamp" = the authors' code, the window shrinks to
the whole text (one window, the sign of the total shift); "skip" = LeakPro, that size is left out of the
text's mean, and a text shorter than every size is scored with one window of its own length."""


def geometric_windows(w_min: int, w_max: int, n_windows: int) -> tuple[int, ...]:
    """Make the paper's window grid round(w_min * (w_max / w_min)^((k-1)/(n-1))), k = 1..n.

    Rounding is half to even (no size of the default grid sits at a half); duplicates are kept, as in the paper.

    Args:
        w_min (int): the smallest window, at least 1.
        w_max (int): the largest window, at least w_min.
        n_windows (int): the number of sizes n, at least 2.
    Returns:
        tuple[int, ...]: the sizes.
    Raises:
        ValueError: when the bounds are out of range.
    """
    if not 1 <= w_min <= w_max or n_windows < 2:
        raise ValueError(f"need 1 <= w_min <= w_max and n_windows >= 2; got {w_min}, {w_max}, {n_windows}.")
    k = np.arange(n_windows, dtype=np.float64)
    return tuple(int(w) for w in np.round(w_min * (w_max / w_min) ** (k / (n_windows - 1))))


def window_vote(delta: np.ndarray, window: int, cumulative: np.ndarray | None = None) -> float:
    """Compute the share of windows whose summed shift is > 0 (an exact tie is not a vote).

    Window sums are differences of the running sum [0, cumsum(delta)] (float64): a window of exact zeros sums to
    exactly 0, since adding 0 leaves a float unchanged.

    Args:
        delta (np.ndarray): [T] shifts of log p from the reference to the target.
        window (int): the window size w, 1 <= w <= T.
        cumulative (np.ndarray | None): the running sum, to reuse it across sizes.
    Returns:
        float: the share of the T - w + 1 windows.
    Raises:
        ValueError: when the window does not fit the text.
    """
    delta = np.asarray(delta, dtype=np.float64)
    if not 1 <= window <= delta.size:
        raise ValueError(f"window {window} does not fit a text of {delta.size} tokens.")
    c = np.concatenate([[0.0], np.cumsum(delta)]) if cumulative is None else cumulative
    return float(np.count_nonzero(c[window:] - c[:-window] > 0) / (delta.size - window + 1))


def _running_sums(delta: np.ndarray, lengths: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """[n, max T + 1] rows [0, cumsum(delta_i)], then -inf past each text's end: up to T the same additions, in
    the same order, as `window_vote`'s running sum of one text. delta: every text's shifts concatenated;
    lengths, starts: [n] each text's length and offset in delta."""
    n, width = lengths.size, int(lengths.max()) + 1
    c = np.full((n, width), -np.inf)
    c[:, 0] = 0.0
    pos = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # position in its text
    c[np.repeat(np.arange(n), lengths), pos + 1] = delta[np.repeat(starts, lengths) + pos]
    return np.cumsum(c, axis=1, out=c)


def _window_shares(c: np.ndarray, lengths: np.ndarray, window: int) -> np.ndarray:
    """[n] `window_vote` of each text for one size w, all texts at once; NaN for a text shorter than w.
    c: `_running_sums` [n, max T + 1]; lengths [n] ascending. A window running past its text's end sums to
    -inf or NaN (-inf padding), never a vote."""
    share = np.full(lengths.size, np.nan)
    first = int(np.searchsorted(lengths, window))  # the texts from here on fit the window
    if first < lengths.size:
        with np.errstate(invalid="ignore"):
            votes = np.count_nonzero(c[first:, window:] - c[first:, :-window] > 0, axis=1)
        share[first:] = votes / (lengths[first:] - window + 1)
    return share


def _wbc_block(c: np.ndarray, lengths: np.ndarray, windows: tuple[int, ...], long: str) -> np.ndarray:
    """WBC of a block of texts (lengths ascending) from their running sums c [n, max T + 1]: clamp gives a size
    longer than the text the text's one whole window; skip leaves it out, and a text shorter than every size
    gets that one window."""
    whole = (c[np.arange(lengths.size), lengths] > 0).astype(np.float64)  # one window of the text's length
    shares = np.stack([_window_shares(c, lengths, w) for w in windows], axis=1)  # [n, sizes], NaN: w > T
    if long == "clamp":
        return np.where(np.isnan(shares), whole[:, None], shares).mean(axis=1)
    fits = ~np.isnan(shares)
    n_fit = fits.sum(axis=1)
    first = np.take_along_axis(shares, np.argsort(~fits, axis=1, kind="stable"), axis=1)  # fitting sizes first
    out = whole.copy()
    some = n_fit > 0
    out[some] = row_means(first[some], n_fit[some])  # numpy's mean of the fitting sizes' shares, in grid order
    return out


def wbc_score(
    target_token_losses,
    reference_token_losses,
    *,
    windows: tuple[int, ...] = WBC_GRIDS["config"],
    long: str = "clamp",
    budget: int = 1 << 22,
) -> np.ndarray:
    """Score WBC [Chen2026]: the mean over window sizes of the share of windows voting member.

    A window votes when the reference's summed token loss exceeds the target's (`window_vote`). All texts at once:
    sorted by length, in blocks of about `budget` padded tokens, each a matrix of running sums (the same sums as
    `window_vote`).

    Args:
        target_token_losses (Sequence[np.ndarray]): n texts' per-token losses under the target.
        reference_token_losses (Sequence[np.ndarray]): the same texts' under the reference.
        windows (tuple[int, ...]): the window sizes (`WBC_GRIDS`).
        long (str): a window longer than the text: "clamp" or "skip" (`WBC_LONG`).
        budget (int): padded tokens per block.
    Returns:
        np.ndarray: [n] scores in [0, 1].
    Raises:
        ValueError: on an unknown `long`, a non-positive size, or mismatched texts.
    """
    if long not in WBC_LONG:
        raise ValueError(f"long must be one of {WBC_LONG}; got {long!r}.")
    if not windows or min(windows) < 1:
        raise ValueError(f"windows must be positive sizes; got {windows}.")
    delta, lengths = flat_shifts(target_token_losses, reference_token_losses)
    starts = np.cumsum(lengths) - lengths
    out = np.empty(lengths.size)
    for texts in length_blocks(lengths, budget):
        out[texts] = _wbc_block(_running_sums(delta, lengths[texts], starts[texts]), lengths[texts], windows, long)
    return out
