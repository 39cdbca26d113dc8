"""Token-level comparisons of a target with a reference model (docs/science.md section 4): EZ-MIA and WBC.

Both read, per scored token t of a text, the shift of the log-probability from the reference to the target,
`delta_t = log p_target(x_t) - log p_ref(x_t) = l_ref,t - l_target,t` (token losses in nats), where the
reference is the base model's own loss table (the reference unit, run -1) or, in the `*_qbase` variants,
the base model quantized like the target. Scores are "higher = more likely a member".
"""

from __future__ import annotations

import numpy as np

from llmaudit.common.ragged import length_blocks, padded, row_means, row_sums, sizes

EZ_EDGES = ("top", "bottom")
"""EZ-MIA's conventions for a text whose error zone has no negative shift (N = 0), no position included:
"top" ranks it above every other text (LeakPro, the paper's appendix E.5/E.6: all probability mass moved up
is the strongest member signal); "bottom" scores it 0, the lowest possible value (the authors' released
code). The authors' code also scores a text with fewer than 2 error positions 0; with one position the
ratio is 0 or N = 0 anyway, so that rule adds nothing here."""

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


def _pairs(target_token_losses, reference_token_losses) -> list[tuple[np.ndarray, np.ndarray]]:
    target = [np.asarray(t, dtype=np.float64).ravel() for t in target_token_losses]
    reference = [np.asarray(r, dtype=np.float64).ravel() for r in reference_token_losses]
    if len(target) != len(reference):
        raise ValueError(f"{len(target)} target texts but {len(reference)} reference texts.")
    for i, (t, r) in enumerate(zip(target, reference)):
        if t.size == 0 or t.size != r.size:
            raise ValueError(
                f"text {i}: {t.size} target token losses but {r.size} reference ones; both models must score "
                "the same tokens, at least one."
            )
    return list(zip(target, reference))


def log_prob_shift(target_losses: np.ndarray, reference_losses: np.ndarray) -> np.ndarray:
    """delta_t = l_ref,t - l_target,t = log p_target(x_t) - log p_ref(x_t). [T], [T] -> [T]."""
    return np.asarray(reference_losses, dtype=np.float64) - np.asarray(target_losses, dtype=np.float64)


def error_zone_masses(delta: np.ndarray, top1: np.ndarray, *, skip_first: bool = False) -> tuple[float, float, int]:
    """(P, N, |E|) of one text: E = positions where the target's top-1 prediction is NOT the token
    (top1 False), optionally without the first scored position; P = sum over E of max(delta_t, 0),
    N = sum over E of max(-delta_t, 0). delta, top1: [T]."""
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
    """EZ-MIA [Ilic2026]: the ratio P / N of the upward to the downward shifts of log p in the target's
    error zone, reported as the monotone map P / (P + N) in [0, 1) so that every score is finite (the same
    ranking as P / N, across texts and targets). n texts of per-token losses and top-1 flags -> [n].

    edge="top": a text with N = 0 (all movement upward, or no error position) scores 1 + P / (1 + P) in
    [1, 2), above every other and ordered by P among themselves (LeakPro's rank). edge="bottom": a text with
    N = 0 scores 0 (the authors' code). A text with P = 0 < N scores 0 under both (ratio 0). skip_first
    leaves the first scored position out of the error zone. All texts at once, the same numbers as
    `error_zone_masses` text by text (`_zone_sums`)."""
    if edge not in EZ_EDGES:
        raise ValueError(f"edge must be one of {EZ_EDGES}; got {edge!r}.")
    flags = [np.asarray(f).ravel() for f in target_top1]
    delta, lengths = _flat_shifts(target_token_losses, reference_token_losses)
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


def geometric_windows(w_min: int, w_max: int, n_windows: int) -> tuple[int, ...]:
    """The paper's window grid round(w_min * (w_max / w_min)^((k-1)/(n-1))), k = 1..n (round half to even;
    no size of the default grid sits at a half). Duplicates are kept, as in the paper."""
    if not 1 <= w_min <= w_max or n_windows < 2:
        raise ValueError(f"need 1 <= w_min <= w_max and n_windows >= 2; got {w_min}, {w_max}, {n_windows}.")
    k = np.arange(n_windows, dtype=np.float64)
    return tuple(int(w) for w in np.round(w_min * (w_max / w_min) ** (k / (n_windows - 1))))


def window_vote(delta: np.ndarray, window: int, cumulative: np.ndarray | None = None) -> float:
    """Share of the T - w + 1 windows of `window` consecutive tokens whose summed shift is > 0 (the
    reference's summed loss exceeds the target's; an exact tie is not a vote). delta: [T], w <= T.

    Window sums are differences of the running sum [0, cumsum(delta)] (float64; pass it as `cumulative`
    to reuse it across sizes): a window of exact zeros sums to exactly 0, since adding 0 leaves a float
    unchanged."""
    delta = np.asarray(delta, dtype=np.float64)
    if not 1 <= window <= delta.size:
        raise ValueError(f"window {window} does not fit a text of {delta.size} tokens.")
    c = np.concatenate([[0.0], np.cumsum(delta)]) if cumulative is None else cumulative
    return float(np.count_nonzero(c[window:] - c[:-window] > 0) / (delta.size - window + 1))


def _flat_shifts(target_token_losses, reference_token_losses) -> tuple[np.ndarray, np.ndarray]:
    """(delta of every text concatenated [sum T], lengths [n]), with `_pairs`' checks: as many texts, each
    scored on the same tokens, at least one."""
    if len(target_token_losses) != len(reference_token_losses):
        raise ValueError(f"{len(target_token_losses)} target texts but {len(reference_token_losses)} reference texts.")
    if len(target_token_losses) == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    n_t, n_r = sizes(target_token_losses), sizes(reference_token_losses)
    bad = np.flatnonzero((n_t == 0) | (n_t != n_r))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"text {i}: {n_t[i]} target token losses but {n_r[i]} reference ones; both models must score "
            "the same tokens, at least one."
        )
    target = np.concatenate(list(target_token_losses), axis=None).astype(np.float64)
    reference = np.concatenate(list(reference_token_losses), axis=None).astype(np.float64)
    return log_prob_shift(target, reference), n_t


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
    """WBC [Chen2026]: the mean over the window sizes w of the share of sliding windows in which the
    reference's summed token loss exceeds the target's (`window_vote`), in [0, 1]. n texts -> [n].
    long: what a window longer than the text does (WBC_LONG).

    All texts at once: sorted by length, in blocks of about `budget` padded tokens, each a matrix of running
    sums whose window sums and votes are array operations (the same sums as `window_vote`)."""
    if long not in WBC_LONG:
        raise ValueError(f"long must be one of {WBC_LONG}; got {long!r}.")
    if not windows or min(windows) < 1:
        raise ValueError(f"windows must be positive sizes; got {windows}.")
    delta, lengths = _flat_shifts(target_token_losses, reference_token_losses)
    starts = np.cumsum(lengths) - lengths
    out = np.empty(lengths.size)
    for texts in length_blocks(lengths, budget):
        out[texts] = _wbc_block(_running_sums(delta, lengths[texts], starts[texts]), lengths[texts], windows, long)
    return out


def wbc_score_per_sample(
    target_token_losses, reference_token_losses, *, windows: tuple[int, ...] = WBC_GRIDS["config"], long: str = "clamp"
) -> np.ndarray:
    """`wbc_score` as it was computed before issue 33, one text at a time (a running sum and `window_vote` per
    size): the reference of the tests and the baseline of benchmarks/bench_analysis.py."""
    if long not in WBC_LONG:
        raise ValueError(f"long must be one of {WBC_LONG}; got {long!r}.")
    out = np.empty(len(target_token_losses))
    for i, (t, r) in enumerate(_pairs(target_token_losses, reference_token_losses)):
        delta = log_prob_shift(t, r)
        if long == "clamp":
            sizes = [min(w, delta.size) for w in windows]
        else:
            sizes = [w for w in windows if w <= delta.size] or [delta.size]
        cumulative = np.concatenate([[0.0], np.cumsum(delta)])
        out[i] = float(np.mean([window_vote(delta, w, cumulative) for w in sizes]))
    return out


def ez_mia_score_per_sample(
    target_token_losses, reference_token_losses, target_top1, *, edge: str = "top", skip_first: bool = False
) -> np.ndarray:
    """`ez_mia_score` as it was computed before issue 33, one text at a time (`error_zone_masses`): the
    reference of the tests and the baseline of benchmarks/bench_analysis.py."""
    if edge not in EZ_EDGES:
        raise ValueError(f"edge must be one of {EZ_EDGES}; got {edge!r}.")
    flags = [np.asarray(f).ravel() for f in target_top1]
    pairs = _pairs(target_token_losses, reference_token_losses)
    if len(flags) != len(pairs):
        raise ValueError(f"{len(pairs)} texts but {len(flags)} rows of top-1 flags.")
    out = np.empty(len(pairs))
    for i, ((t, r), top1) in enumerate(zip(pairs, flags)):
        p, n, _ = error_zone_masses(log_prob_shift(t, r), top1, skip_first=skip_first)
        if n > 0:
            out[i] = p / (p + n)
        else:
            out[i] = 1.0 + p / (1.0 + p) if edge == "top" else 0.0
    return out
