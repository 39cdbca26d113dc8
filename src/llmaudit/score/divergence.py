"""Per-token divergence of a quantized model from its full-precision self: KL(p_ref || p_q) and whether both
models put the same token on top, from the two models' final hidden states, exactly (docs/science.md section 11).

Notation: at one scored position, x_ref = head_ref(h_ref) and x_q = head_q(h_q) are the two logit vectors over
the vocabulary V, p = softmax(x), lse(x) = log sum_v exp(x_v). Then

    KL(p_ref || p_q) = sum_v p_ref,v (log p_ref,v - log p_q,v)
                     = E_{p_ref}[x_ref - x_q] - lse(x_ref) + lse(x_q)
    same_top         = argmax_v x_ref,v == argmax_v x_q,v        (first index on ties, as torch.max and llama.cpp)

Both are computed in ONE pass over vocabulary tiles: each tile's logits of both models are reduced, while in
cache, to their maxima (and argmaxes), their sums of exp(x - max), and sum_v exp(x_ref,v - max_ref) (x_ref,v -
x_q,v), the sums accumulated in float64; the tiles are merged in float64 by the log-sum-exp rule (the KL of a
near-lossless pair is a small difference of two log-sums, which float32 sums would blur). Nothing is truncated
(llama.cpp keeps the base model's log-probabilities above max - 16 only, in 16 bits); no [positions, V] logits of all positions exist; a
model against itself gives exactly 0 and True. The quantizers leave the output head alone (their scope is the
transformer blocks), but each model's own head is used, so a scope that includes the head, or a natively cast
bf16 model, is handled the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from llmaudit.score.engine import HEAD_LOGITS_BYTES, cpu_vocab_tile

STAT_ROWS = 5
"""Per tile and position: max and sum of exp(x - max) of both models, and the p_ref-weighted logit gap."""


@dataclass
class TokenDivergence:
    """One sample's divergence per scored token: KL(p_ref || p_q) in nats and top-token agreement."""

    kl: np.ndarray  # [T] float32, >= 0
    same_top: np.ndarray  # [T] bool


def _tile_stats(
    x_ref: torch.Tensor, x_q: torch.Tensor, gap: torch.Tensor
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor]]:
    """Reduce one tile of both models' float32 logits [C, n] (consumed in place; `gap` is scratch of the same
    shape) to (max_ref, sumexp_ref, weighted gap, max_q, sumexp_q) [C] (the sums in float64) and the two argmaxes
    within the tile."""
    m_ref, a_ref = torch.max(x_ref, 1)
    m_q, a_q = torch.max(x_q, 1)
    torch.sub(x_ref, x_q, out=gap)  # x_ref - x_q
    # sums accumulated in float64: the KL of a near-lossless pair is a small difference of two log-sums
    s_q = x_q.sub_(m_q[:, None]).exp_().sum(1, dtype=torch.float64)
    w = x_ref.sub_(m_ref[:, None]).exp_()  # exp(x_ref - m_ref) <= 1
    s_ref = w.sum(1, dtype=torch.float64)
    weighted = w.mul_(gap).sum(1, dtype=torch.float64)
    return (m_ref, s_ref, weighted, m_q, s_q), (a_ref, a_q)


def merge_divergence_tiles(
    stats: torch.Tensor, argmax: torch.Tensor, offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tile statistics merged into the KL divergence and the top-token agreement per position.

    In float64: Z = sum_t exp(m_t - M) s_t, E = sum_t exp(m_t - M) w_t / Z_ref, KL = E + (M_q - M_ref) + log Z_q -
    log Z_ref, clamped at 0 (a float rounding where the two distributions agree; never a real value).

    Args:
        stats (torch.Tensor): [5, tiles, C] max_ref, sumexp_ref, sum exp(x_ref - max_ref)(x_ref - x_q), max_q, sumexp_q.
        argmax (torch.Tensor): [2, tiles, C] each model's argmax within each tile.
        offsets (torch.Tensor): [tiles] each tile's first vocabulary index.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: (KL [C] float64, same_top [C] bool).
    """
    s = stats.double()
    top_ref, tile_ref = torch.max(s[0], 0)  # first tile on ties = the lowest vocabulary index
    top_q, tile_q = torch.max(s[3], 0)
    share_ref = torch.exp(s[0] - top_ref)
    z_ref = (share_ref * s[1]).sum(0)
    gap = (share_ref * s[2]).sum(0) / z_ref
    z_q = (torch.exp(s[3] - top_q) * s[4]).sum(0)
    kl = gap + (top_q - top_ref) + torch.log(z_q) - torch.log(z_ref)
    rows = torch.arange(s.shape[2], device=s.device)
    arg_ref = offsets[tile_ref] + argmax[0, tile_ref, rows]
    arg_q = offsets[tile_q] + argmax[1, tile_q, rows]
    return kl.clamp_min(0.0), arg_ref == arg_q


def _linear_logits(head: torch.nn.Linear, h: torch.Tensor, v0: int, v1: int, out: torch.Tensor) -> torch.Tensor:
    """float32 logits of vocabulary rows [v0, v1) into `out` [C, v1 - v0], rounded as head(h) rounds them
    (computed in the head's dtype first when that is not float32)."""
    weight = head.weight[v0:v1]
    bias = None if head.bias is None else head.bias[v0:v1]
    if h.dtype == weight.dtype == torch.float32:
        torch.mm(h, weight.t(), out=out)
        if bias is not None:
            out.add_(bias)
        return out
    return out.copy_(torch.nn.functional.linear(h.to(weight.dtype), weight, bias))


def divergence_tile(rows: int, vocab: int, device: torch.device, max_bytes: int | None = None) -> int:
    """Vocabulary columns per tile of `divergence_scores`.

    Args:
        rows (int): positions per block.
        vocab (int): vocabulary size.
        device (torch.device): where the heads run.
        max_bytes (int | None): memory for the three float32 [rows, tile] buffers and the heads' outputs (None:
            HEAD_LOGITS_BYTES).

    Returns:
        int: the engine's cache-sized CPU tile on a CPU; elsewhere as many columns as fit within `max_bytes`.
    """
    if device.type == "cpu" and max_bytes is None:
        return cpu_vocab_tile(rows, vocab)
    budget = HEAD_LOGITS_BYTES if max_bytes is None else int(max_bytes)
    return int(min(vocab, max(1, budget // (5 * 4 * max(1, rows)))))


@torch.no_grad()
def divergence_scores(
    head_ref: Any,
    head_q: Any,
    h_ref: torch.Tensor,
    h_q: torch.Tensor,
    *,
    vocab_tile: int | None = None,
    max_bytes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(p_ref || p_q) and top-token agreement at C positions, p = softmax(head(h)) of each model's own head.

    Memory: at most three float32 [C, vocab_tile] blocks at once. Heads that are not a plain nn.Linear (a quantized
    head cannot be sliced by vocabulary) are applied to blocks of rows with the whole vocabulary, within `max_bytes`.

    Args:
        head_ref (Any): the reference model's output head.
        head_q (Any): the quantized model's output head.
        h_ref (torch.Tensor): [C, H] the reference model's final hidden states.
        h_q (torch.Tensor): [C, H] the quantized model's final hidden states.
        vocab_tile (int | None): vocabulary columns per tile (None: `divergence_tile`).
        max_bytes (int | None): memory for one block of logits (None: HEAD_LOGITS_BYTES).

    Returns:
        tuple[torch.Tensor, torch.Tensor]: KL [C] float64 and same_top [C] bool.

    Raises:
        ValueError: the two heads have different vocabularies, or h_ref and h_q different positions.
    """
    if h_ref.shape[0] != h_q.shape[0]:
        raise ValueError(f"divergence_scores needs the same positions: {h_ref.shape[0]} and {h_q.shape[0]} rows")
    rows = h_ref.shape[0]
    if rows == 0:
        return torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.bool)
    if type(head_ref) is torch.nn.Linear and type(head_q) is torch.nn.Linear:
        vocab = head_ref.weight.shape[0]
        if head_q.weight.shape[0] != vocab:
            raise ValueError(f"the two heads have different vocabularies ({vocab} and {head_q.weight.shape[0]})")
        tile = vocab_tile or divergence_tile(rows, vocab, h_ref.device, max_bytes)
        return _tiled(head_ref, head_q, h_ref, h_q, tile)
    return _row_blocks(head_ref, head_q, h_ref, h_q, max_bytes)


def _tiled(
    head_ref: torch.nn.Linear, head_q: torch.nn.Linear, h_ref: torch.Tensor, h_q: torch.Tensor, tile: int
) -> tuple[torch.Tensor, torch.Tensor]:
    vocab, rows = head_ref.weight.shape[0], h_ref.shape[0]
    starts = list(range(0, vocab, tile))
    device = h_ref.device
    stats = torch.empty(STAT_ROWS, len(starts), rows, dtype=torch.float64, device=device)
    argmax = torch.empty(2, len(starts), rows, dtype=torch.long, device=device)
    buffer = torch.empty(3, rows * tile, dtype=torch.float32, device=device)  # allocated once: no heap churn
    for t, v0 in enumerate(starts):
        v1 = min(v0 + tile, vocab)
        x_ref, x_q, gap = (buffer[i, : rows * (v1 - v0)].view(rows, v1 - v0) for i in range(3))
        _linear_logits(head_ref, h_ref, v0, v1, x_ref)
        _linear_logits(head_q, h_q, v0, v1, x_q)
        values, args = _tile_stats(x_ref, x_q, gap)
        for i, v in enumerate(values):
            stats[i, t] = v
        argmax[0, t], argmax[1, t] = args
    offsets = torch.tensor(starts, dtype=torch.long, device=device)
    return merge_divergence_tiles(stats, argmax, offsets)


def _row_blocks(
    head_ref: Any, head_q: Any, h_ref: torch.Tensor, h_q: torch.Tensor, max_bytes: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    budget = HEAD_LOGITS_BYTES if max_bytes is None else int(max_bytes)
    vocab = int(head_ref(h_ref[:1]).shape[-1])
    block = max(1, budget // (5 * 4 * vocab))
    kl, same = [], []
    zero = torch.zeros(1, dtype=torch.long, device=h_ref.device)
    for r in range(0, h_ref.shape[0], block):
        x_ref = head_ref(h_ref[r : r + block]).float()
        x_q = head_q(h_q[r : r + block]).float()
        values, args = _tile_stats(x_ref, x_q, torch.empty_like(x_ref))
        k, s = merge_divergence_tiles(torch.stack(values)[:, None], torch.stack(args)[:, None], zero)
        kl.append(k)
        same.append(s)
    return torch.cat(kl), torch.cat(same)


def scored_counts(examples: Sequence[tuple[Sequence[int], Sequence[bool]]]) -> list[int]:
    """Scored positions per example as the engine orders them.

    Args:
        examples (Sequence[tuple[Sequence[int], Sequence[bool]]]): (token ids, loss mask) per example.

    Returns:
        list[int]: sum(loss_mask[1:]) per example (the first token is never predicted).
    """
    return [int(sum(bool(m) for m in mask[1:])) for _, mask in examples]


class ReferenceStates:
    """The full-precision final hidden states of a set of examples at their scored positions, captured from the
    scoring engine (`hook`), one [T_i, H] tensor per example, kept on the device they were computed on."""

    def __init__(self, examples: Sequence[tuple[Sequence[int], Sequence[bool]]]):
        self.counts = scored_counts(examples)
        self.states: list[torch.Tensor | None] = [None] * len(examples)

    def hook(self, batch: list[int], h: torch.Tensor, targets: torch.Tensor) -> None:
        """Keep one batch's final hidden states of the reference model (the scoring engine's hook).

        Args:
            batch (list[int]): the examples' indices in the batch.
            h (torch.Tensor): [positions, H] their scored positions' final hidden states.
            targets (torch.Tensor): [positions] the target tokens (unused).
        """
        for i, part in zip(batch, torch.split(h, [self.counts[i] for i in batch])):
            self.states[i] = part.clone()

    @property
    def complete(self) -> bool:
        """True once every example's hidden states are held."""
        return all(s is not None for s in self.states)

    def nbytes(self) -> int:
        """Memory the held hidden states take.

        Returns:
            int: bytes of every held tensor.
        """
        return sum(s.numel() * s.element_size() for s in self.states if s is not None)


class DivergenceCollector:
    """An engine hook that compares each batch of the quantized model's final hidden states with the reference
    states of the same examples and keeps each example's TokenDivergence (thread-safe: batches write disjoint
    slots)."""

    def __init__(self, reference: ReferenceStates, head_ref: Any, head_q: Any):
        if not reference.complete:
            raise ValueError("the reference hidden states are incomplete")
        self.reference, self.head_ref, self.head_q = reference, head_ref, head_q
        self.results: list[TokenDivergence | None] = [None] * len(reference.states)

    def hook(self, batch: list[int], h: torch.Tensor, targets: torch.Tensor) -> None:
        """Score one batch's divergence from the reference states (the scoring engine's hook).

        Args:
            batch (list[int]): the examples' indices in the batch.
            h (torch.Tensor): [positions, H] the quantized model's final hidden states at their scored positions.
            targets (torch.Tensor): [positions] the target tokens (unused).
        """
        h_ref = torch.cat([self.reference.states[i] for i in batch]).to(h.device)
        kl, same = divergence_scores(self.head_ref, self.head_q, h_ref, h)
        kl_np = kl.float().cpu().numpy()
        same_np = same.cpu().numpy()
        offset = 0
        for i in batch:
            n = self.reference.counts[i]
            self.results[i] = TokenDivergence(kl_np[offset : offset + n].copy(), same_np[offset : offset + n].copy())
            offset += n


def identical_divergence(counts: Sequence[int]) -> list[TokenDivergence]:
    """The divergence of the reference model from itself: 0 and True at every position, by definition.

    This is what divergence_scores gives for two identical inputs, without the two head passes.

    Args:
        counts (Sequence[int]): scored positions per example.

    Returns:
        list[TokenDivergence]: one per example.
    """
    return [TokenDivergence(np.zeros(n, np.float32), np.ones(n, bool)) for n in counts]
