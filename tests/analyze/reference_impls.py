"""Reference implementations the tests compare the package with, and the baseline benchmarks/bench_analysis.py
times: each computes what a function of `llmaudit.analyze` computes, the straightforward way.

- `sorted_bootstrap_stats` / `sorted_roc_stats`: the bootstrap's weighted ROC statistics as numpy cumulative sums
  over the rows sorted once (the reference of `llmaudit.analyze.roc_kernel`, the package's engine).
- `group_bootstrap_stats` / `weighted_roc_stats`: the same statistics from the weights of every distinct-score
  group (dense [resamples, groups] matrices).
- `ez_mia_score_per_sample`, `wbc_score_per_sample`, `min_k_score_per_sample`, `min_k_plus_plus_score_per_sample`:
  the text attacks one text at a time (the package computes all texts at once).

Every engine here takes the arguments of `llmaudit.analyze.bootstrap.bootstrap_stats` and draws the same
resamples from the same generator, so a test can swap one in (`metrics.bootstrap_stats`) and compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from llmaudit.analyze.attacks.ez_mia import EZ_EDGES, error_zone_masses
from llmaudit.analyze.attacks.text import _token_arrays, min_k_count
from llmaudit.analyze.attacks.token_shift import log_prob_shift, paired_texts
from llmaudit.analyze.attacks.wbc import WBC_GRIDS, WBC_LONG, window_vote
from llmaudit.analyze.bootstrap import block_size, fpr_key, resample_counts
from llmaudit.analyze.roc_kernel import FPR_TOL


@dataclass(frozen=True)
class SortedRows:
    """The rows of one score vector in a fixed order: members (P) and non-members (Q) apart, each by score
    descending. Per member row i, in P's order: fp_lo / fp_hi = the non-member rows scoring above / at least
    s_i (indices into Q's running sum [0, cumsum]), and tp_hi = the member rows scoring at least s_i (its tie
    group's last row + 1)."""

    unit_p: np.ndarray  # [nP] resampling unit of each member row
    unit_q: np.ndarray  # [nQ] of each non-member row
    fp_lo: np.ndarray  # [nP]
    fp_hi: np.ndarray  # [nP]
    tp_hi: np.ndarray  # [nP]
    ties: bool  # any member row tied with a non-member row (fp_lo != fp_hi somewhere)
    member_ties: bool  # any two member rows tied (tp_hi is not 1, 2, ..., nP)
    max_weight: int  # the largest total weight a resample can give: n_units x the most rows of one unit


def sort_rows(scores: np.ndarray, labels: np.ndarray, unit_of_row: np.ndarray) -> SortedRows:
    """The one sort of a bootstrap: scores, labels, unit_of_row [n] -> `SortedRows`."""
    pos, neg = np.flatnonzero(labels), np.flatnonzero(~labels)
    pos = pos[np.argsort(-scores[pos], kind="stable")]
    neg = neg[np.argsort(-scores[neg], kind="stable")]
    desc_p, desc_q = -scores[pos], -scores[neg]  # ascending
    fp_lo = np.searchsorted(desc_q, desc_p, side="left")
    fp_hi = np.searchsorted(desc_q, desc_p, side="right")
    tp_hi = np.searchsorted(desc_p, desc_p, side="right")
    ties, member_ties = bool((fp_lo != fp_hi).any()), bool((tp_hi != np.arange(1, pos.size + 1)).any())
    sizes = np.bincount(unit_of_row)
    max_weight = int(sizes.size) * int(sizes.max())
    return SortedRows(unit_of_row[pos], unit_of_row[neg], fp_lo, fp_hi, tp_hi, ties, member_ties, max_weight)


def _weights(rows: SortedRows, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(member weights w_P [B, nP], their running sum TP [B, nP], the non-members' [0, cumsum(w_Q)] [B, nQ + 1])
    in counts' dtype (float32 holds integer sums below 2^24 exactly, at half the memory traffic of float64)."""
    w_p = np.take(counts, rows.unit_p, axis=1)
    fp = np.zeros((counts.shape[0], rows.unit_q.size + 1), dtype=counts.dtype)
    np.cumsum(np.take(counts, rows.unit_q, axis=1), axis=1, out=fp[:, 1:])
    return w_p, np.cumsum(w_p, axis=1), fp


def sorted_roc_stats(rows: SortedRows, counts: np.ndarray, fprs: Sequence[float]) -> dict:
    """Weighted ROC statistics of a block of resamples. counts: [B, n_units] integer multiplicities, float32
    when every resample's total weight stays below 2^24 (else float64). Returns {"auroc": [B],
    "average_precision": [B], "tpr_at_fpr": {key: [B]}}, the values `weighted_roc_stats` gives on the same
    weights (AUROC and TPR exactly: every sum is of integers, accumulated in float64; AP to rounding).

    With w the weights in the sorted order, TP_i = cumsum(w_P)[tp_hi_i - 1] and FP_i = [0, cumsum(w_Q)][fp_hi_i]
    the member and non-member weight scoring at least s_i: AUROC = 1 - sum_i w_i (FP_lo_i + FP_i) / 2 / (n+ n-)
    (a tie counts a half), AP = sum_i w_i TP_i / max(TP_i + FP_i, 1) / n+, and TPR at alpha = the TP of the
    last member row with FP_i <= alpha n- (0 if none) / n+."""
    w_p, tp, fp = _weights(rows, counts)
    n_pos, n_neg = tp[:, -1].astype(np.float64), fp[:, -1].astype(np.float64)
    fp_hi = np.take(fp, rows.fp_hi, axis=1)
    tp_hi = np.take(tp, rows.tp_hi - 1, axis=1) if rows.member_ties else tp
    above = _pairs_above(rows, w_p, fp, fp_hi)
    precision = np.divide(tp_hi, np.maximum(tp_hi + fp_hi, 1), dtype=np.float64)  # 0 / 1 where no weight yet
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample that lost a class: NaN, ignored
        auroc = (n_pos * n_neg - 0.5 * above) / (n_pos * n_neg)
        ap = np.einsum("ij,ij->i", w_p, precision, dtype=np.float64) / n_pos
    levels = np.asarray(list(fprs), dtype=np.float64) + FPR_TOL
    tpr = np.empty((counts.shape[0], levels.size))
    for b in range(counts.shape[0]):  # FP rises along the order: the members up to the last within the level
        # integer FP <= v exactly when FP <= floor(v), which counts' dtype holds
        last_q = np.searchsorted(fp[b], np.floor(levels * n_neg[b]).astype(fp.dtype), side="right") - 1
        n_in = np.searchsorted(rows.fp_hi, last_q, side="right")
        with np.errstate(invalid="ignore", divide="ignore"):
            tpr[b] = np.where(n_in > 0, tp[b, np.maximum(n_in - 1, 0)], 0).astype(np.float64) / n_pos[b]
    return {"auroc": auroc, "average_precision": ap, "tpr_at_fpr": {fpr_key(a): tpr[:, i] for i, a in enumerate(fprs)}}


def _pairs_above(rows: SortedRows, w_p: np.ndarray, fp: np.ndarray, fp_hi: np.ndarray) -> np.ndarray:
    """[B] sum_i w_i (FP_lo_i + FP_hi_i): twice the weighted (member, non-member) pairs with the non-member at or
    above the member, a tie counted once (w_p [B, nP]; fp [B, nQ + 1] the non-members' running weight; fp_hi [B, nP]
    its value at each member's fp_hi)."""
    above = np.einsum("ij,ij->i", w_p, fp_hi, dtype=np.float64)
    if not rows.ties:
        return 2 * above
    return above + np.einsum("ij,ij->i", w_p, np.take(fp, rows.fp_lo, axis=1), dtype=np.float64)


def sorted_bootstrap_stats(
    scores: np.ndarray,
    labels: np.ndarray,
    unit_of_row: np.ndarray,
    n_units: int,
    strata: np.ndarray | None,
    fprs: Sequence[float],
    n_boot: int,
    seed: int,
) -> list[dict]:
    """`sorted_roc_stats` of `n_boot` resamples of the units, drawn in blocks from one generator (`seed`): the
    list of the blocks' results, in draw order. The blocks and the draws are those of
    `llmaudit.analyze.bootstrap.bootstrap_stats` and `group_bootstrap_stats`, so all give the same resamples."""
    rows = sort_rows(scores, labels, unit_of_row)
    n_groups = np.unique(scores).size
    rng = np.random.default_rng(seed)
    step = block_size(n_boot, n_groups + n_units)
    dtype = np.float32 if rows.max_weight < 2**24 else np.float64
    return [
        sorted_roc_stats(rows, resample_counts(rng, n_units, min(step, n_boot - start), strata).astype(dtype), fprs)
        for start in range(0, n_boot, step)
    ]


def weighted_roc_stats(pos_w: np.ndarray, neg_w: np.ndarray, fprs: Sequence[float], pos_cols=None) -> dict:
    """pos_w, neg_w: [B, G] weights of members / non-members in each distinct-score group, groups sorted
    by score DESCENDING; pos_cols: optional indices of the groups holding any member (a speed-up).
    Returns {"auroc": [B], "average_precision": [B], "tpr_at_fpr": {key: [B]}}; with unit weights these
    equal sklearn's roc_auc_score, average_precision_score and `tpr_at_fpr`."""
    n_pos = pos_w.sum(1, dtype=np.float64)
    n_neg = neg_w.sum(1, dtype=np.float64)
    tp = np.cumsum(pos_w, axis=1)
    fp = np.cumsum(neg_w, axis=1)
    cols = slice(None) if pos_cols is None else pos_cols
    pw, tpp, fpp = (np.asarray(a[:, cols], dtype=np.float64) for a in (pos_w, tp, fp))
    nwp = np.asarray(neg_w[:, cols], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        # a member in group g beats the non-members below g (n_neg - fp_g) and ties half with those in g
        beaten = n_pos * n_neg - np.einsum("ij,ij->i", pw, fpp) + 0.5 * np.einsum("ij,ij->i", pw, nwp)
        auroc = beaten / (n_pos * n_neg)
        denom = tpp + fpp
        denom[denom == 0] = 1.0  # only where pw == 0 too
        ap = np.einsum("ij,ij->i", pw, tpp / denom) / n_pos
    levels = np.asarray(list(fprs), dtype=np.float64) + FPR_TOL
    tpr = np.empty((tp.shape[0], levels.size))
    for b in range(tp.shape[0]):  # fp rises along groups: the first k groups keep FPR <= alpha
        k = np.searchsorted(fp[b], levels * n_neg[b], side="right")
        tpr[b] = np.where(k > 0, tp[b, np.maximum(k - 1, 0)], 0.0) / n_pos[b]
    at = {fpr_key(a): tpr[:, i] for i, a in enumerate(fprs)}
    return {"auroc": auroc, "average_precision": ap, "tpr_at_fpr": at}


def group_bootstrap_stats(
    scores: np.ndarray,
    labels: np.ndarray,
    unit_of_row: np.ndarray,
    n_units: int,
    strata: np.ndarray | None,
    fprs: Sequence[float],
    n_boot: int,
    seed: int,
) -> list[dict]:
    """The bootstrap over distinct-score groups: per block, the weights of every group (sparse unit -> group
    maps) and `weighted_roc_stats` on the dense [B, groups] matrices. Same arguments, resamples and result as
    `llmaudit.analyze.bootstrap.bootstrap_stats` (average precision to rounding)."""
    _, group_of_row = np.unique(-scores, return_inverse=True)
    n_groups = int(group_of_row.max()) + 1
    shape = (n_units, n_groups)
    # float32 holds these integer counts exactly (< 2^24) and halves the memory traffic
    to_pos = sp.csc_matrix((labels.astype(np.float32), (unit_of_row, group_of_row)), shape=shape)
    to_neg = sp.csc_matrix(((~labels).astype(np.float32), (unit_of_row, group_of_row)), shape=shape)
    pos_cols = np.unique(group_of_row[labels])
    rng = np.random.default_rng(seed)
    parts: list[dict] = []
    step = block_size(n_boot, n_groups + n_units)
    for start in range(0, n_boot, step):
        counts = resample_counts(rng, n_units, min(step, n_boot - start), strata).astype(np.float32)
        pos_w = np.asarray(counts @ to_pos)
        neg_w = np.asarray(counts @ to_neg)
        parts.append(weighted_roc_stats(pos_w, neg_w, fprs, pos_cols))
    return parts


def ez_mia_score_per_sample(
    target_token_losses, reference_token_losses, target_top1, *, edge: str = "top", skip_first: bool = False
) -> np.ndarray:
    """`ez_mia_score` one text at a time (`error_zone_masses`)."""
    if edge not in EZ_EDGES:
        raise ValueError(f"edge must be one of {EZ_EDGES}; got {edge!r}.")
    flags = [np.asarray(f).ravel() for f in target_top1]
    pairs = paired_texts(target_token_losses, reference_token_losses)
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


def wbc_score_per_sample(
    target_token_losses, reference_token_losses, *, windows: tuple[int, ...] = WBC_GRIDS["config"], long: str = "clamp"
) -> np.ndarray:
    """`wbc_score` one text at a time (a running sum and `window_vote` per size)."""
    if long not in WBC_LONG:
        raise ValueError(f"long must be one of {WBC_LONG}; got {long!r}.")
    out = np.empty(len(target_token_losses))
    for i, (t, r) in enumerate(paired_texts(target_token_losses, reference_token_losses)):
        delta = log_prob_shift(t, r)
        if long == "clamp":
            sizes = [min(w, delta.size) for w in windows]
        else:
            sizes = [w for w in windows if w <= delta.size] or [delta.size]
        cumulative = np.concatenate([[0.0], np.cumsum(delta)])
        out[i] = float(np.mean([window_vote(delta, w, cumulative) for w in sizes]))
    return out


def min_k_score_per_sample(token_losses, k: float = 0.2) -> np.ndarray:
    """`min_k_score` one text at a time."""
    return np.array([-np.sort(a)[-min_k_count(a.size, k) :].mean() for a in _token_arrays(token_losses)])


def min_k_plus_plus_score_per_sample(token_losses, token_vocab_mean, token_vocab_std, k: float = 0.2) -> np.ndarray:
    """`min_k_plus_plus_score` one text at a time."""
    losses = _token_arrays(token_losses)
    means = [np.asarray(m, dtype=np.float64).ravel() for m in token_vocab_mean]
    stds = [np.asarray(s, dtype=np.float64).ravel() for s in token_vocab_std]
    out = []
    for a, mu, sd in zip(losses, means, stds):
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.where(sd > 0, (-a - mu) / np.where(sd > 0, sd, 1.0), 0.0)
        out.append(np.sort(z)[: min_k_count(a.size, k)].mean())
    return np.array(out)
