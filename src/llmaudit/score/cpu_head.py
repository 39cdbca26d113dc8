"""The CPU head: NLL (and the vocabulary statistics Min-K%++ needs) of many positions under a plain nn.Linear head,
in vocabulary tiles that stay in cache, merged once at the end. Pure computation (llmaudit.score.engine calls it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

HeadScores = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]
"""(NLL of the targets, mean of log p or None, std of log p or None, top-1 token id), each [C]."""


def merge_tiles(
    stats: torch.Tensor, target_logit: torch.Tensor, tile_top: torch.Tensor, tile_width: int, *, vocab_stats: bool
) -> HeadScores:
    """Per-tile statistics merged over the tiles: log-sum-exp, and the law of total variance.

    The variances are merged by the pairwise update of Chan, Golub & LeVeque 1979, for all tiles at once. The top-1
    token is taken from the first tile holding the overall max (argmax over tiles takes the first), so ties go to the
    lowest id.

    Args:
        stats (torch.Tensor): [2 or 4, tiles, C] max, sum of exp(x - max), and with vocab_stats the p-weighted mean and
            variance of x.
        target_logit (torch.Tensor): [C] the logit of each position's target token.
        tile_top (torch.Tensor): [tiles, C] each tile's argmax within the tile.
        tile_width (int): columns per tile.
        vocab_stats (bool): also merge the mean and std of log p.

    Returns:
        HeadScores: the NLL of the targets, with vocab_stats the mean and std of log p under the model's distribution,
            and the top-1 token id.
    """
    top = stats[0].amax(0)
    best_tile = stats[0].argmax(0)  # [C]
    top1 = tile_top.gather(0, best_tile[None]).squeeze(0) + best_tile * tile_width
    weights = stats[1] * torch.exp(stats[0] - top)  # [tiles, C]: each tile's share of the mass
    total = weights.sum(0)
    lse = top + total.log()
    nll = lse - target_logit
    if not vocab_stats:
        return nll, None, None, top1
    tile_mean, tile_var = stats[2], stats[3]
    mean = (weights * tile_mean).sum(0) / total
    spread = (weights * (tile_var + (tile_mean - mean).square())).sum(0)  # within + between tiles
    return nll, mean - lse, (spread / total).clamp_min(0).sqrt(), top1


@dataclass
class _TileBuffers:
    """What head_scores allocates once per call and writes in place: per tile the statistics [2 or 4, tiles, C]
    and the argmax [tiles, C], the float32 logits buffer (x, and with vocab_stats w and a scratch block, each
    `full` = C x vocab_tile elements), the targets' logits [C] and, for a half-precision head, the tile in its dtype."""

    stats: torch.Tensor
    tile_top: torch.Tensor
    buffer: torch.Tensor
    full: int
    target_logit: torch.Tensor
    half: torch.Tensor | None


def _tile_buffers(
    head: torch.nn.Linear, h: torch.Tensor, targets: torch.Tensor, *, vocab_stats: bool, vocab_tile: int
) -> _TileBuffers:
    """head_scores' buffers; a float32 head's target logits are the dot products of h with their weight rows."""
    weight, bias = head.weight, head.bias
    vocab, rows = weight.shape[0], h.shape[0]
    n_tiles = len(range(0, vocab, vocab_tile))
    half = None
    if weight.dtype == torch.float32:
        target_logit = torch.linalg.vecdot(h, weight[targets])
        if bias is not None:
            target_logit += bias[targets].float()
    else:  # half-precision logits: the target's is read from its rounded tile, as head(h) would give it
        target_logit = torch.zeros(rows, dtype=torch.float32, device=h.device)
        half = torch.empty(rows * vocab_tile, dtype=weight.dtype, device=h.device)
    stats = torch.empty(4 if vocab_stats else 2, n_tiles, rows, dtype=torch.float32, device=h.device)
    tile_top = torch.empty(n_tiles, rows, dtype=torch.long, device=h.device)
    full = rows * vocab_tile
    buffer = torch.empty(full * (3 if vocab_stats else 1), dtype=torch.float32, device=h.device)
    return _TileBuffers(stats, tile_top, buffer, full, target_logit, half)


def _reduce_tile(x: torch.Tensor, t: int, tiles: _TileBuffers, *, vocab_stats: bool) -> None:
    """Tile t's logits x [C, w] reduced in place to its max (and argmax), the sum of exp(x - max) and (vocab_stats)
    the p-weighted mean and centred variance of x, written into tiles.stats[:, t] and tiles.tile_top[t]."""
    stats, buffer, full = tiles.stats, tiles.buffer, tiles.full
    rows, width = x.shape
    size = rows * width
    m, _ = torch.max(x, 1, out=(stats[0, t], tiles.tile_top[t]))  # one pass: the max and its first position
    x.sub_(m[:, None])  # x - m <= 0
    if not vocab_stats:
        torch.sum(x.exp_(), 1, out=stats[1, t])
        return
    w = torch.exp(x, out=buffer[full : full + size].view(rows, width))  # unnormalised p in the tile
    scratch = buffer[2 * full : 2 * full + size].view(rows, width)
    w_sum = torch.sum(w, 1, out=stats[1, t])  # >= 1: the max contributes exp(0)
    mean = torch.sum(torch.mul(w, x, out=scratch), 1, out=stats[2, t]).div_(w_sum)  # of x - m
    x.sub_(mean[:, None])
    torch.sum(torch.mul(w.mul_(x), x, out=scratch), 1, out=stats[3, t]).div_(w_sum)
    mean.add_(m)


@torch.no_grad()
def head_scores(
    head: torch.nn.Linear, h: torch.Tensor, targets: torch.Tensor, *, vocab_stats: bool, vocab_tile: int
) -> HeadScores:
    """NLL of `targets` under softmax(head(h)), without holding more than [C, vocab_tile] logits.

    Each vocabulary tile's logits x are reduced in place, while they are still in cache, to their max m (with its
    position: the tile's argmax), the sum of exp(x - m) and (vocab_stats) the p-weighted mean and centred variance of
    x within the tile. The tiles are merged once at the end (`merge_tiles`), so no variance is ever formed as E[x^2] -
    E[x]^2. mean log p = E_p[x] - logsumexp(x) and var log p = var_p(x). The target's logit is the dot product of its
    hidden state with its weight row, computed once. The tile buffers and the per-tile statistics are allocated once
    per call and written in place: a fresh block per tile, interleaved with small long-lived ones, fragments the C
    heap, and the process then grows with the number of tiles although the live tensors do not.

    Args:
        head (torch.nn.Linear): the output head.
        h (torch.Tensor): [C, H] final hidden states.
        targets (torch.Tensor): [C] target token ids.
        vocab_stats (bool): also compute the mean and std of log p under the model's distribution.
        vocab_tile (int): vocabulary columns per tile.

    Returns:
        HeadScores: NLL, optionally mean and std of log p (all [C] float32), and the top-1 token id [C] (int64, the
            lowest id on ties, as torch.argmax).
    """
    weight, bias = head.weight, head.bias
    vocab, rows = weight.shape[0], h.shape[0]
    h = h.to(weight.dtype)  # a float32 head on half-precision hidden states computes in float32
    tiles = _tile_buffers(head, h, targets, vocab_stats=vocab_stats, vocab_tile=vocab_tile)
    for t, v0 in enumerate(range(0, vocab, vocab_tile)):
        v1 = min(v0 + vocab_tile, vocab)
        x = tiles.buffer[: rows * (v1 - v0)].view(rows, v1 - v0)
        if tiles.half is None:
            torch.mm(h, weight[v0:v1].t(), out=x)
            if bias is not None:
                x.add_(bias[v0:v1])
        else:
            _half_tile_logits(h, head, (v0, v1), x, targets, tiles)
        _reduce_tile(x, t, tiles, vocab_stats=vocab_stats)
    return merge_tiles(tiles.stats, tiles.target_logit, tiles.tile_top, vocab_tile, vocab_stats=vocab_stats)


def _half_tile_logits(
    h: torch.Tensor,
    head: torch.nn.Linear,
    span: tuple[int, int],
    x: torch.Tensor,
    targets: torch.Tensor,
    tiles: _TileBuffers,
) -> None:
    """Logits of vocabulary tile span = [v0, v1) for a half-precision head (bf16/fp16 weights and hidden states):
    the matmul in the weights' dtype into tiles.half (oneDNN accumulates in float32 and rounds once, as head(h)
    does), then float32 in `x` for every reduction; the targets that fall in the tile get their logit from it."""
    v0, v1 = span
    weight, bias = head.weight, head.bias
    assert tiles.half is not None
    half = tiles.half[: x.numel()].view(x.shape)
    torch.mm(h, weight[v0:v1].t(), out=half)
    if bias is not None:
        half.add_(bias[v0:v1])
    x.copy_(half)
    inside = (targets >= v0) & (targets < v1)
    if bool(inside.any()):
        rows = torch.nonzero(inside).squeeze(1)
        tiles.target_logit[rows] = x[rows, targets[rows] - v0]
