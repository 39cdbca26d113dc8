"""The scoring engine: per-token losses (and the vocabulary statistics Min-K%++ needs) of many samples
under one model, fast and in bounded memory. Pure computation: no files, no configs.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from llmaudit.common.runtime import cpu_parallelism, torch_threads
from llmaudit.data.tokenize import collate
from llmaudit.models.layers import decoder_and_head
from llmaudit.score.cpu_head import HeadScores, head_scores, merge_tiles  # re-exported: callers import them from here


def length_sorted_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices grouped into batches of similar length whose padded size (B x max_len) fits the budget.

    Longest first, so an out-of-memory error shows up on the first batch, not the last.

    Args:
        lengths (Sequence[int]): tokens per example.
        token_budget (int): the largest padded size of a batch (a longer example makes a batch of its own).

    Returns:
        list[list[int]]: the example indices of each batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * width > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


@dataclass
class TokenScores:
    """Scores of one sample: per-token NLL (nats), optionally the next-token distribution's mean and std
    of log p (expectations under the model's own distribution, as Min-K%++ defines them), and whether the
    model's top-1 prediction at each position is the token itself (EZ-MIA's error zone)."""

    token_losses: np.ndarray  # [T] float32
    vocab_mean: np.ndarray | None = None  # [T]
    vocab_std: np.ndarray | None = None  # [T]
    top1: np.ndarray | None = None  # [T] bool: argmax of the logits (lowest id on ties) == the token

    @property
    def loss(self) -> float:
        """The mean token loss of the example (float64 mean of `token_losses`)."""
        return float(self.token_losses.astype(np.float64).mean())


# Bytes of float32 logits per intra-op thread in one [positions, vocabulary tile] block on CPU: each
# thread's rows of the tile stay in its core's L2 cache through the passes that the loss and the
# statistics make over them.
CPU_HEAD_TILE_BYTES = 2 << 20


def cpu_vocab_tile(rows: int, vocab: int) -> int:
    """Vocabulary columns per head tile on CPU (CPU_HEAD_TILE_BYTES per thread).

    benchmarks/bench_scoring.py compares it with whole-vocabulary chunks. Every op ends in a barrier of the thread
    pool, so on an oversubscribed CPU (load above the core count) with several threads the hundreds of small ops
    stall; run such a box with one thread per process (torch.set_num_threads(1) / OMP_NUM_THREADS=1).

    Args:
        rows (int): positions per block.
        vocab (int): vocabulary size.

    Returns:
        int: columns per tile, at most `vocab`.
    """
    per_tile = CPU_HEAD_TILE_BYTES * max(1, torch.get_num_threads())
    return min(vocab, max(1, per_tile // (4 * rows)))


# Bytes of logits, and of the same-sized temporaries made from them, that one head call may hold at once
# wherever the CPU tiles above are not used: on GPU, and for any head that is not a plain nn.Linear (a quantized
# one). Full-vocabulary float32 logits grow with positions x vocabulary, which a large vocabulary makes large.
HEAD_LOGITS_BYTES = 256 << 20


def _full_head_scores(head: Any, h: torch.Tensor, targets: torch.Tensor, *, vocab_stats: bool) -> HeadScores:
    """The same as head_scores from full-vocabulary logits of the C rows, for any head module (e.g. a
    quantized one): few large ops (fused log_softmax / cross_entropy). Holds about HEAD_COPIES
    float32 [C, vocab] blocks plus the head's own output at once; bounded_head_scores keeps that in budget."""
    logits = head(h).float()
    top1 = torch.argmax(logits, 1)  # of the logits, not of log_softmax's rounded copy
    if not vocab_stats:
        return torch.nn.functional.cross_entropy(logits, targets, reduction="none"), None, None, top1
    logp = torch.log_softmax(logits, dim=-1)
    del logits
    nll = -logp.gather(1, targets[:, None]).squeeze(1)
    p = torch.exp(logp)
    mean = torch.linalg.vecdot(p, logp)
    centred = logp.sub_(mean[:, None])
    return nll, mean, torch.linalg.vecdot(p.mul_(centred), centred).clamp_min(0).sqrt(), top1


HEAD_COPIES = {False: 2, True: 3}
"""float32 [rows, columns] blocks the head paths hold at once beside the head's own output (vocab_stats off /
on): logits and log-softmax / exp; with the statistics also p and one product that vecdot forms."""


def head_block_bytes(rows: int, columns: int, out_dtype: torch.dtype, *, vocab_stats: bool) -> int:
    """Bytes a [rows, columns] block of logits costs on the full or tiled head path.

    Args:
        rows (int): positions in the block.
        columns (int): vocabulary columns in the block.
        out_dtype (torch.dtype): the head's output dtype (its output is dropped once converted, unless already float32).
        vocab_stats (bool): whether the mean and std of log p are computed (more float32 copies).

    Returns:
        int: the head's output in `out_dtype` plus HEAD_COPIES float32 blocks.
    """
    out = 0 if out_dtype == torch.float32 else torch.finfo(out_dtype).bits // 8
    return rows * columns * (4 * HEAD_COPIES[vocab_stats] + out)


def _head_out_features(head: Any, h: torch.Tensor) -> int:
    size = getattr(head, "out_features", None)
    if isinstance(size, int):
        return size
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(weight.shape[0])
    return int(head(h[:1]).shape[-1])


@torch.no_grad()
def bounded_head_scores(
    head: Any, h: torch.Tensor, targets: torch.Tensor, *, vocab_stats: bool, max_bytes: int | None = None
) -> HeadScores:
    """head_scores' results for any head module on any device, within a memory bound.

    At most `max_bytes` of logits and their temporaries are held at once (head_block_bytes), one block below that at
    least: a single row, or a single vocabulary column.

    - All C rows x the whole vocabulary fit: the fused full path (_full_head_scores).
    - A plain nn.Linear head: vocabulary tiles of all C rows (one large matmul per tile, the weight read once),
      reduced as head_scores reduces them; each tile's logits are computed in the head's dtype and rounded exactly as
      head(h) would round them, and the target's logit is read from those rounded logits, as the full path reads it,
      so the two paths differ by float rounding only.
    - Any other head (quantized kernels cannot be sliced by vocabulary): blocks of rows through the full path.

    Args:
        head (Any): the output head module.
        h (torch.Tensor): [C, H] final hidden states.
        targets (torch.Tensor): [C] target token ids.
        vocab_stats (bool): also compute the mean and std of log p.
        max_bytes (int | None): memory for logits and temporaries (None: HEAD_LOGITS_BYTES).

    Returns:
        HeadScores: as `head_scores` gives them.
    """
    budget = HEAD_LOGITS_BYTES if max_bytes is None else int(max_bytes)
    rows = h.shape[0]
    vocab = _head_out_features(head, h)
    out_dtype = head.weight.dtype if type(head) is torch.nn.Linear else h.dtype
    per_row = head_block_bytes(1, vocab, out_dtype, vocab_stats=vocab_stats)
    if rows == 0 or rows * per_row <= budget:
        return _full_head_scores(head, h, targets, vocab_stats=vocab_stats)
    if type(head) is torch.nn.Linear:
        per_column = head_block_bytes(rows, 1, out_dtype, vocab_stats=vocab_stats)
        columns = max(1, budget // per_column)
        if columns >= 256:
            columns -= columns % 128  # whole tensor-core tiles
        return _vocab_tiled_head_scores(head, h, targets, vocab_stats=vocab_stats, vocab_tile=columns)
    block = max(1, budget // per_row)
    parts = [
        _full_head_scores(head, h[r : r + block], targets[r : r + block], vocab_stats=vocab_stats)
        for r in range(0, rows, block)
    ]
    if not vocab_stats:
        return torch.cat([p[0] for p in parts]), None, None, torch.cat([p[3] for p in parts])
    return tuple(torch.cat([p[i] for p in parts]) for i in range(4))  # type: ignore[return-value]


def _vocab_tiled_head_scores(
    head: torch.nn.Linear, h: torch.Tensor, targets: torch.Tensor, *, vocab_stats: bool, vocab_tile: int
) -> HeadScores:
    """The vocabulary-tiled reduction of head_scores, shaped for a GPU: per tile a few large ops on freshly
    allocated blocks (the caching allocator reuses them), the logits rounded to the head's dtype first as
    head(h) rounds them, and the target's logit gathered from the tile that holds it (no extra dot product
    whose rounding would differ from the logits')."""
    weight, bias = head.weight, head.bias
    vocab, rows = weight.shape[0], h.shape[0]
    tiles = range(0, vocab, vocab_tile)
    stats = torch.empty(4 if vocab_stats else 2, len(tiles), rows, dtype=torch.float32, device=h.device)
    tile_top = torch.empty(len(tiles), rows, dtype=torch.long, device=h.device)
    target_logit = torch.zeros(rows, dtype=torch.float32, device=h.device)
    for t, v0 in enumerate(tiles):
        v1 = min(v0 + vocab_tile, vocab)
        x = torch.nn.functional.linear(h, weight[v0:v1], None if bias is None else bias[v0:v1]).float()
        inside = (targets >= v0) & (targets < v1)
        picked = x.gather(1, (targets - v0).clamp(0, v1 - v0 - 1)[:, None]).squeeze(1)
        target_logit = torch.where(inside, picked, target_logit)
        torch.argmax(x, 1, out=tile_top[t])  # documented tie rule: the first maximum
        m = torch.amax(x, 1, out=stats[0, t])
        x.sub_(m[:, None])  # x - m <= 0
        if not vocab_stats:
            torch.sum(x.exp_(), 1, out=stats[1, t])
            continue
        w = torch.exp(x)  # unnormalised p in the tile
        w_sum = torch.sum(w, 1, out=stats[1, t])  # >= 1: the max contributes exp(0)
        mean = stats[2, t].copy_(torch.linalg.vecdot(w, x)).div_(w_sum)  # of x - m
        x.sub_(mean[:, None])
        stats[3, t].copy_(torch.linalg.vecdot(w.mul_(x), x)).div_(w_sum)
        mean.add_(m)
        del w
    return merge_tiles(stats, target_logit, tile_top, vocab_tile, vocab_stats=vocab_stats)


def plain_modules(model: Any) -> bool:
    """Whether a model's forward is safe to call from several threads at once.

    Real quantized layers of the libraries (bitsandbytes, HQQ, GPTQ kernels) keep mutable state.

    Args:
        model (Any): the model.

    Returns:
        bool: True when every module that holds parameters is a stock torch.nn layer, a transformers layer (norms,
            rotary tables) or a layer that declares `stateless_forward` (llmaudit's own, e.g.
            quantize.bnb_int8.Int8Linear).
    """
    for module in model.modules():
        if next(module.parameters(recurse=False), None) is None and next(module.buffers(recurse=False), None) is None:
            continue
        if getattr(type(module), "stateless_forward", False) is True:
            continue
        home = type(module).__module__
        if not (home.startswith("torch.nn.") or home.startswith("transformers.")):
            return False
        if isinstance(module, torch.nn.Linear) and type(module) is not torch.nn.Linear:
            return False
    return True


def fragments_heap(model: Any) -> bool:
    """Whether scoring the model would fragment the heap under glibc's dynamic mmap threshold: it has real quantized
    layers (not `plain_modules`: their float32 temporaries), or a layer that declares `large_temporaries` (its
    forward allocates blocks the size of the batch: quantize.bnb_int8.Int8Linear).

    Args:
        model (Any): the model.

    Returns:
        bool: True when the model should be scored with large blocks mapped (common.memory.bounded_heap).
    """
    declared = any(getattr(type(module), "large_temporaries", False) is True for module in model.modules())
    return declared or not plain_modules(model)


@dataclass(frozen=True)
class ScoringOptions:
    """How score_examples batches and bounds its work (see there): the engine's typed settings.

    token_budget: padded tokens per batch; head_chunk: positions per head call; vocab_stats: the mean and std of
    log p (Min-K%++); cpu_workers: threads scoring whole batches on CPU (None: one per core); head_logits_bytes:
    the logits budget of one head call off the CPU tiles (None: HEAD_LOGITS_BYTES)."""

    token_budget: int = 8192
    head_chunk: int = 1024
    vocab_stats: bool = False
    device: torch.device | str = "cpu"
    cpu_workers: int | None = None
    head_logits_bytes: int | None = None


def _chunk_head_scores(head: Any, h: torch.Tensor, targets: torch.Tensor, options: ScoringOptions) -> list[HeadScores]:
    """The head's scores of the positions h [P, H], `options.head_chunk` positions at a time."""
    tiled = type(head) is torch.nn.Linear  # tiles slice the weight; any other head (quantized) is called whole
    on_cpu = torch.device(options.device).type == "cpu"
    parts = []
    for start in range(0, h.shape[0], options.head_chunk):
        h_c, t_c = h[start : start + options.head_chunk], targets[start : start + options.head_chunk]
        tile = cpu_vocab_tile(h_c.shape[0], head.weight.shape[0]) if tiled and on_cpu else None
        if tile is not None and tile < head.weight.shape[0]:
            parts.append(head_scores(head, h_c, t_c, vocab_stats=options.vocab_stats, vocab_tile=tile))
        else:  # GPU, a quantized head, or a vocabulary within one CPU tile: full logits, within the byte budget
            parts.append(
                bounded_head_scores(
                    head, h_c, t_c, vocab_stats=options.vocab_stats, max_bytes=options.head_logits_bytes
                )
            )
    return parts


def _split_scores(
    parts: list[HeadScores], targets: torch.Tensor, counts: list[int], *, vocab_stats: bool
) -> list[TokenScores]:
    """The batch's head scores (its samples' positions one after the other) as one TokenScores per sample."""
    none = [torch.zeros(0)]  # a batch of one-token samples has no scored position
    nll_np = torch.cat([p[0] for p in parts] or none).cpu().numpy()
    top1_np = (torch.cat([p[3] for p in parts]) == targets).cpu().numpy() if parts else np.zeros(0, bool)
    # A negative log-likelihood is >= 0; a token the model is sure of (p ~ 1) can come out at -1e-7 from
    # float rounding of logsumexp - logit. Clamp that rounding, never a real value.
    np.maximum(nll_np, 0.0, out=nll_np)
    mu_np = torch.cat([p[1] for p in parts] or none).cpu().numpy() if vocab_stats else None
    sd_np = torch.cat([p[2] for p in parts] or none).cpu().numpy() if vocab_stats else None
    out, offset = [], 0
    for count in counts:
        sl = slice(offset, offset + count)
        out.append(
            TokenScores(
                nll_np[sl].copy(),
                None if mu_np is None else mu_np[sl].copy(),
                None if sd_np is None else sd_np[sl].copy(),
                top1_np[sl].copy(),
            )
        )
        offset += count
    return out


def _score_batch(
    decoder: Any,
    head: Any,
    examples: Sequence[tuple[Sequence[int], Sequence[bool]]],
    pad_id: int,
    options: ScoringOptions,
    hidden_hook: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
) -> list[TokenScores]:
    """Scores of one length-sorted batch (see score_examples; options.device is a torch.device here)."""
    ids, _, mask = collate(list(examples), pad_id, options.device)
    # Right padding + causal attention: a real token only attends to earlier tokens, which are all real,
    # so no padding mask is needed; without one the decoder takes the fused causal attention kernel.
    # use_cache=False: no key/value cache is built (it would copy every layer's keys and values).
    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state
    pred = mask[:, 1:]
    h = hidden[:, :-1][pred]  # [P, H]
    targets = ids[:, 1:][pred]  # [P]
    del hidden
    if hidden_hook is not None:
        hidden_hook(h, targets)
    parts = _chunk_head_scores(head, h, targets, options)
    return _split_scores(parts, targets, pred.sum(1).tolist(), vocab_stats=options.vocab_stats)


def _worker_count(model: Any, device: torch.device, n_batches: int, cpu_workers: int | None) -> int:
    """Threads that score whole batches at once (see score_examples): on CPU `cpu_workers` (None: one per
    available core), at most one per batch; 1 on GPU, for a single batch, and for models with non-stock layers."""
    workers = 1
    if device.type == "cpu" and n_batches > 1:
        workers = min(cpu_workers or cpu_parallelism(), n_batches)
        if workers > 1 and not plain_modules(model):
            workers = 1
    return workers


def _in_input_order(
    n_examples: int, batches: list[list[int]], results: Iterable[list[TokenScores]]
) -> list[TokenScores]:
    """The scores of length-sorted `batches` (results: one list per batch, in batch order) put back in input order."""
    out: list[TokenScores | None] = [None] * n_examples
    for batch, scores in zip(batches, results):
        for i, s in zip(batch, scores):
            out[i] = s
    return out  # type: ignore[return-value]


@torch.inference_mode()
def score_examples(
    model: Any,
    examples: Sequence[tuple[Sequence[int], Sequence[bool]]],
    *,
    pad_id: int,
    options: ScoringOptions | None = None,
    hidden_hook: Callable[[list[int], torch.Tensor, torch.Tensor], None] | None = None,
    **overrides: Any,
) -> list[TokenScores]:
    """Per-token losses of each (input_ids, loss_mask) example, in input order, scored as `options` says.

    On CPU, `cpu_workers` threads (None: one per available core, at most one per batch) each score whole batches,
    longest first, with the torch threads divided among them. A small model's ops are too short for the thread pool
    inside each op to pay, and concurrent batches keep every core busy between ops (benchmarks/bench_scoring.py).
    Each batch's numbers depend only on the batch and the threads per worker, so a rerun with the same settings is
    bitwise identical. Models with non-stock layers (real quantized kernels) are scored one batch at a time.

    Memory: per worker, the body's activations for one batch (<= token_budget tokens) plus logits for at most
    `head_chunk` positions at a time, in float32: on CPU `head_chunk` x a vocabulary tile of CPU_HEAD_TILE_BYTES per
    thread; on GPU (and for a head that is not a plain nn.Linear) at most `head_logits_bytes` (None:
    HEAD_LOGITS_BYTES) of logits and their temporaries, in vocabulary tiles or blocks of rows (bounded_head_scores):
    independent of batch x length x vocab.

    Args:
        model (Any): the causal LM.
        examples (Sequence[tuple[Sequence[int], Sequence[bool]]]): (input_ids, loss_mask) per example.
        pad_id (int): the padding token id.
        options (ScoringOptions | None): how to score (None: the defaults).
        hidden_hook (Callable | None): hidden_hook(batch, h, targets), if given, sees each batch's final hidden states
            at its scored positions before the head: `batch` the example indices in batch order, h [P, H] the rows of
            those examples one after the other (each example's sum(loss_mask[1:]) positions in order), targets [P] the
            tokens they predict. It runs in the worker thread of that batch (llmaudit.score.divergence uses it).
        **overrides (Any): any field of ScoringOptions by keyword, applied over `options` (e.g. vocab_stats=True).

    Returns:
        list[TokenScores]: one per example, in input order.
    """
    options = dataclasses.replace(options or ScoringOptions(), **overrides)
    options = dataclasses.replace(options, device=torch.device(options.device))  # a torch.device from here on
    decoder, head = decoder_and_head(model)
    batches = length_sorted_batches([len(ids) for ids, _ in examples], options.token_budget)
    workers = _worker_count(model, options.device, len(batches), options.cpu_workers)

    def run(batch: list[int]) -> list[TokenScores]:
        with torch.inference_mode():  # thread-local: worker threads enter it themselves
            hook = None if hidden_hook is None else functools.partial(hidden_hook, batch)
            return _score_batch(decoder, head, [examples[i] for i in batch], pad_id, options, hook)

    if workers == 1:
        results = map(run, batches)
    else:
        with (
            torch_threads(max(1, torch.get_num_threads() // workers)),
            ThreadPoolExecutor(workers, thread_name_prefix="llmaudit-score") as pool,
        ):
            results = list(pool.map(run, batches))
    return _in_input_order(len(examples), batches, results)


def weights_digest(model: Any) -> str:
    """Digest of all parameters and buffers: equal digests mean the same (quantized) point.

    Args:
        model (Any): the model.

    Returns:
        str: the hex digest.
    """
    h = hashlib.sha1()
    for name, tensor in sorted(model.state_dict().items()):
        if not isinstance(tensor, torch.Tensor):
            continue
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())  # the buffer, not a copy
    return h.hexdigest()[:16]
