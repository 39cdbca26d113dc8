"""The scoring engine against the naive computation (full logits, one sample at a time, float64).

Tiny Qwen2 and Llama models are built in code (hidden 64, 2 layers, vocabulary 512) with
initializer_range 0.1 so that the next-token distributions are far from uniform."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from llmaudit.score import engine as scoring
from llmaudit.score.engine import (
    TokenScores,
    bounded_head_scores,
    head_block_bytes,
    head_scores,
    length_sorted_batches,
    score_examples,
    weights_digest,
)
from tests.tiny_models import tiny_causal_lm

VOCAB = 512
PAD_ID = 0


def _tiny_model(kind: str):

    return tiny_causal_lm(
        kind, vocab_size=VOCAB, max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=False
    )


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request):
    return _tiny_model(request.param)


def _examples(seed: int = 0, n: int = 9, include_prompt: bool = False) -> list[tuple[list[int], list[bool]]]:
    """Lengths 2..40 (distinct, so batches need padding), half prompt; pad id 0 also occurs as a real token."""
    rng = np.random.default_rng(seed)
    out = []
    for length in rng.choice(np.arange(2, 41), size=n, replace=False):
        ids = rng.integers(0, VOCAB, size=int(length)).tolist()
        ids[-1] = PAD_ID
        n_prompt = int(length) // 2
        mask = (
            [False] + [True] * (int(length) - 1)
            if include_prompt
            else [False] * n_prompt + [True] * (int(length) - n_prompt)
        )
        out.append((ids, mask))
    return out


@torch.inference_mode()
def _naive(model, examples) -> list[dict[str, np.ndarray]]:
    """One sample at a time through model(input_ids, labels=...): per-token NLL and the vocabulary
    statistics recomputed from the full logits in float64."""
    out = []
    for ids, mask in examples:
        input_ids = torch.tensor([ids])
        scored = torch.tensor(mask)
        scored[0] = False
        labels = input_ids.masked_fill(~scored[None], -100)
        result = model(input_ids=input_ids, labels=labels)
        logp = torch.log_softmax(result.logits[0, :-1].double(), dim=-1)[scored[1:]]  # [n, V]
        tokens = input_ids[0, 1:][scored[1:]]
        nll = -logp.gather(1, tokens[:, None]).squeeze(1)
        top1 = result.logits[0, :-1][scored[1:]].argmax(-1) == tokens  # full logits, first maximum
        p = logp.exp()
        mean = (p * logp).sum(-1)
        std = (p * (logp - mean[:, None]) ** 2).sum(-1).sqrt()
        if len(nll):  # the model's own loss is the mean of these token losses
            assert float(result.loss) == pytest.approx(float(nll.mean()), abs=1e-5)
        out.append({"nll": nll.numpy(), "mean": mean.numpy(), "std": std.numpy(), "top1": top1.numpy()})
    return out


def _max_diff(
    scores: list[TokenScores], naive: list[dict[str, np.ndarray]], field: str = "token_losses", key: str = "nll"
) -> float:
    diffs = [np.abs(getattr(s, field).astype(np.float64) - ref[key]).max(initial=0.0) for s, ref in zip(scores, naive)]
    return float(max(diffs))


# ------------------------------------------------------------------------------------- batching


def test_length_sorted_batches_hand_example():
    # lengths 5, 3, 8, 2 sorted longest first: 8 | 5, 3 (2 x 5 = 10 <= 10) | 2 (3 x 5 = 15 > 10)
    assert length_sorted_batches([5, 3, 8, 2], 10) == [[2], [0, 1], [3]]
    # a sample longer than the budget still gets a batch of its own
    assert length_sorted_batches([20, 4, 4], 8) == [[0], [1, 2]]


@pytest.mark.parametrize("budget", [1, 17, 64, 500, 10**6])
def test_length_sorted_batches_budget_and_cover(budget):
    lengths = np.random.default_rng(budget).integers(1, 60, size=101).tolist()
    batches = length_sorted_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        width = max(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * width <= budget
        assert lengths[b[0]] == width  # the first index of a batch is its longest
    widths = [lengths[b[0]] for b in batches]
    assert widths == sorted(widths, reverse=True)
    if budget >= sum(lengths) * 60:
        assert len(batches) == 1


# ------------------------------------------------------------------------------------- losses


@torch.inference_mode()
def _greedy_example(model, prompt: list[int], n_new: int) -> tuple[list[int], list[bool]]:
    """The prompt continued by the model's own argmax: every response token is its top-1 prediction."""
    ids = list(prompt)
    for _ in range(n_new):
        ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids, [False] * len(prompt) + [True] * n_new


@pytest.mark.parametrize("include_prompt", [False, True])
def test_losses_and_vocab_stats_equal_naive(model, include_prompt):
    examples = _examples(include_prompt=include_prompt) + [_greedy_example(model, [3, 17, 250], 9)]
    naive = _naive(model, examples)
    assert max(float(r["nll"].max()) for r in naive) > 1.5 * min(float(r["nll"].min()) for r in naive)  # not uniform
    longest, total = max(len(i) for i, _ in examples), sum(len(i) for i, _ in examples)
    for budget in (1, longest, 2 * longest, total):  # one sample per batch ... all in one batch
        for head_chunk in (1, 7, 4096):
            scores = score_examples(
                model, examples, pad_id=PAD_ID, token_budget=budget, head_chunk=head_chunk, vocab_stats=True
            )
            assert [len(s.token_losses) for s in scores] == [sum(m[1:]) for _, m in examples]
            assert all(s.token_losses.dtype == np.float32 for s in scores)
            assert _max_diff(scores, naive) <= 1e-5, (budget, head_chunk)
            assert _max_diff(scores, naive, "vocab_mean", "mean") <= 1e-5, (budget, head_chunk)
            assert _max_diff(scores, naive, "vocab_std", "std") <= 1e-5, (budget, head_chunk)
            for s, ref in zip(scores, naive):
                assert s.loss == pytest.approx(float(ref["nll"].mean()), abs=1e-6)
                assert s.top1.dtype == bool and np.array_equal(s.top1, ref["top1"]), (budget, head_chunk)
    assert any(s.top1.any() for s in scores) and not all(s.top1.all() for s in scores)  # both outcomes occur


def test_vocab_stats_off_gives_the_same_losses(model):
    examples = _examples(seed=1)
    on = score_examples(model, examples, pad_id=PAD_ID, token_budget=64, head_chunk=5, vocab_stats=True)
    off = score_examples(model, examples, pad_id=PAD_ID, token_budget=64, head_chunk=5, vocab_stats=False)
    assert all(s.vocab_mean is None and s.vocab_std is None for s in off)
    assert _max_diff(off, [{"nll": s.token_losses.astype(np.float64)} for s in on]) <= 1e-6


def test_response_only_losses_are_the_tail_of_full_losses(model):
    full = score_examples(model, _examples(seed=2, include_prompt=True), pad_id=PAD_ID, vocab_stats=True)
    response = score_examples(model, _examples(seed=2, include_prompt=False), pad_id=PAD_ID, vocab_stats=True)
    for f, r in zip(full, response):
        n = len(r.token_losses)
        assert 0 < n < len(f.token_losses)
        np.testing.assert_allclose(r.token_losses, f.token_losses[-n:], atol=1e-6)
        np.testing.assert_allclose(r.vocab_std, f.vocab_std[-n:], atol=1e-6)
        assert r.loss != pytest.approx(f.loss, abs=1e-3)  # the prompt's tokens change the mean


def test_batch_composition_never_changes_a_loss(model):
    examples = _examples(seed=3, n=12)
    alone = [score_examples(model, [ex], pad_id=PAD_ID, vocab_stats=True)[0] for ex in examples]
    rng = np.random.default_rng(0)
    for budget in (45, 120, 10**6):
        order = rng.permutation(len(examples))
        shuffled = score_examples(
            model, [examples[i] for i in order], pad_id=PAD_ID, token_budget=budget, vocab_stats=True
        )
        for pos, i in enumerate(order):
            assert np.abs(shuffled[pos].token_losses - alone[i].token_losses).max() <= 1e-5
            assert np.abs(shuffled[pos].vocab_mean - alone[i].vocab_mean).max() <= 1e-5


def test_vocabulary_tiles_and_quantized_head_fallback(model, monkeypatch):
    """Vocabulary tiles that do not divide the vocabulary (CPU path), and a head that is not a plain
    nn.Linear (as a quantized head would be), give the naive answers."""
    examples = _examples(seed=4)
    naive = _naive(model, examples)
    monkeypatch.setattr(scoring, "CPU_HEAD_TILE_BYTES", 4 * 7 * 37)  # 37 columns for a 7-row chunk
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tile width scales with the thread count
    try:
        assert scoring.cpu_vocab_tile(7, VOCAB) == 37
        tiled = score_examples(model, examples, pad_id=PAD_ID, head_chunk=7, vocab_stats=True)
    finally:
        torch.set_num_threads(threads)
    assert _max_diff(tiled, naive) <= 1e-5 and _max_diff(tiled, naive, "vocab_std", "std") <= 1e-5
    assert all(np.array_equal(s.top1, ref["top1"]) for s, ref in zip(tiled, naive))

    class WrappedHead(torch.nn.Linear):
        pass

    wrapped = copy.deepcopy(model)
    old = wrapped.get_output_embeddings()
    head = WrappedHead(old.in_features, old.out_features, bias=False)
    head.weight = old.weight
    wrapped.set_output_embeddings(head)
    fallback = score_examples(wrapped, examples, pad_id=PAD_ID, head_chunk=7, vocab_stats=True)
    assert _max_diff(fallback, naive) <= 1e-5
    assert _max_diff(fallback, naive, "vocab_mean", "mean") <= 1e-5
    assert _max_diff(fallback, naive, "vocab_std", "std") <= 1e-5


def test_head_scores_hand_example():
    """Two positions, vocabulary 3, head = identity on 3 dims: the logits are the hidden states."""
    head = torch.nn.Linear(3, 3, bias=False)
    head.weight.data = torch.eye(3)
    h = torch.tensor([[0.0, 0.0, 0.0], [np.log(2.0), 0.0, -50.0]], dtype=torch.float32)
    targets = torch.tensor([1, 0])
    for tile in (1, 2, 3):
        nll, mean, std, top1 = head_scores(head, h, targets, vocab_stats=True, vocab_tile=tile)
        assert top1.tolist() == [0, 0]  # row 0: a three-way tie goes to the lowest id; row 1: id 0
        # row 0 uniform: nll = ln 3, log p = -ln 3 everywhere, std 0
        # row 1: p ~ (2/3, 1/3, 0): nll(0) = ln 1.5; E log p = 2/3 ln(2/3) + 1/3 ln(1/3); std = ln 2 * sqrt(2/9)
        assert nll.tolist() == pytest.approx([np.log(3), np.log(1.5)], abs=1e-6)
        assert mean.tolist() == pytest.approx([-np.log(3), 2 / 3 * np.log(2 / 3) + 1 / 3 * np.log(1 / 3)], abs=1e-6)
        assert std.tolist() == pytest.approx([0.0, np.log(2) * np.sqrt(2 / 9)], abs=1e-6)


def test_top1_with_ties_on_every_head_path():
    """Integer logits (0/1 weights and hidden states: exact in float32 and bf16) full of ties, the maximum
    often shared by tokens in different tiles: every path returns the naive argmax of the full logits, the
    FIRST maximum (np.argmax), for every tile width, row block and dtype."""
    gen = torch.Generator().manual_seed(5)
    vocab = 37
    for dtype in (torch.float32, torch.bfloat16):
        head = torch.nn.Linear(4, vocab, bias=False).requires_grad_(False)
        head.weight.copy_(torch.randint(0, 2, (vocab, 4), generator=gen).float())
        head = head.to(dtype)
        h = torch.randint(0, 2, (23, 4), generator=gen).to(dtype)
        targets = torch.randint(0, vocab, (23,), generator=gen)
        logits = (h.double() @ head.weight.double().t()).numpy()
        want = logits.argmax(1)
        shared = (logits == logits.max(1, keepdims=True)).sum(1)
        assert (shared > 1).mean() > 0.5 and len(set(want.tolist())) > 1  # mostly ties, not all the same id
        for vocab_stats in (False, True):
            got = [scoring._full_head_scores(head, h, targets, vocab_stats=vocab_stats)[3]]
            for tile in (1, 2, 5, 36, 37):
                got.append(
                    scoring._vocab_tiled_head_scores(head, h, targets, vocab_stats=vocab_stats, vocab_tile=tile)[3]
                )
                if dtype == torch.float32:
                    got.append(head_scores(head, h, targets, vocab_stats=vocab_stats, vocab_tile=tile)[3])
            got.append(bounded_head_scores(head, h, targets, vocab_stats=vocab_stats, max_bytes=1)[3])
            for g in got:
                assert g.dtype == torch.long and g.tolist() == want.tolist()


def test_head_scores_large_logits_against_float64():
    """Logits spread over hundreds of nats (tiles whose mass underflows next to the top tile), against
    the float64 log-softmax: the tile merge neither overflows nor loses the dominant tile."""
    gen = torch.Generator().manual_seed(3)
    head = torch.nn.Linear(8, 53, bias=True)
    head.weight.data = torch.randn(53, 8, generator=gen) * 30
    head.bias.data = torch.randn(53, generator=gen) * 10
    h = torch.randn(6, 8, generator=gen)
    targets = torch.randint(0, 53, (6,), generator=gen)
    logp = torch.log_softmax(head(h).double(), dim=-1)
    p = logp.exp()
    mean = (p * logp).sum(1)
    std = (p * (logp - mean[:, None]).square()).sum(1).sqrt()
    for tile in (1, 5, 53):
        nll, m, s, _ = head_scores(head, h, targets, vocab_stats=True, vocab_tile=tile)
        assert torch.isfinite(nll).all() and torch.isfinite(m).all() and torch.isfinite(s).all()
        scale = logp.abs().amax().item()  # float32 logits carry about 1e-7 of their magnitude
        assert (nll.double() + logp.gather(1, targets[:, None]).squeeze(1)).abs().max() <= 1e-5 * scale
        assert (m.double() - mean).abs().max() <= 1e-5 * scale
        assert (s.double() - std).abs().max() <= 1e-5 * scale


# ------------------------------------------------------------------------------------- bounded head (GPU path)


def _random_head(vocab: int, dtype: torch.dtype, bias: bool, seed: int = 11, scale: float = 0.5):
    gen = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(48, vocab, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, 48, generator=gen) * scale)
        if bias:
            head.bias.copy_(torch.randn(vocab, generator=gen) * scale)
    h = torch.randn(29, 48, generator=gen)
    targets = torch.randint(0, vocab, (29,), generator=gen)
    return head.to(dtype).requires_grad_(False), h.to(dtype), targets


class _Spy:
    """Records the [rows, columns] blocks the two head paths are asked for."""

    def __init__(self, monkeypatch):
        self.blocks: list[tuple[str, int, int]] = []
        full, tiled = scoring._full_head_scores, scoring._vocab_tiled_head_scores

        def spy_full(head, h, targets, *, vocab_stats):
            self.blocks.append(("full", h.shape[0], head.out_features))
            return full(head, h, targets, vocab_stats=vocab_stats)

        def spy_tiled(head, h, targets, *, vocab_stats, vocab_tile):
            self.blocks.append(("tiled", h.shape[0], vocab_tile))
            return tiled(head, h, targets, vocab_stats=vocab_stats, vocab_tile=vocab_tile)

        monkeypatch.setattr(scoring, "_full_head_scores", spy_full)
        monkeypatch.setattr(scoring, "_vocab_tiled_head_scores", spy_tiled)


@pytest.mark.parametrize("vocab_stats", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bounded_head_equals_the_full_path(vocab_stats, bias, dtype, monkeypatch):
    """The GPU head path in vocabulary tiles (forced on CPU with a small byte budget) gives the full-vocabulary
    path's numbers to float rounding, for tiles that divide the vocabulary or not, down to one column; in bf16
    too, since each tile's logits are rounded like the whole head's output and the target's logit is read from
    them. The budget holds: every block it asks for costs at most max_bytes."""
    vocab = 1000
    head, h, targets = _random_head(vocab, dtype, bias)
    full = scoring._full_head_scores(head, h, targets, vocab_stats=vocab_stats)
    assert full[0].min() > 0.5  # far from uniform: losses of several nats
    spy = _Spy(monkeypatch)
    per_column = head_block_bytes(29, 1, dtype, vocab_stats=vocab_stats)
    cases = ((1, 1), (7, 7), (255, 255), (333, 256), (999, 896))  # whole 128s from 256 on
    if dtype == torch.bfloat16:  # a thousand one-column bf16 matmuls take a CPU 20 s
        cases = cases[1:]
    for columns, tile in cases:
        budget = columns * per_column
        spy.blocks.clear()
        out = bounded_head_scores(head, h, targets, vocab_stats=vocab_stats, max_bytes=budget)
        assert spy.blocks == [("tiled", 29, tile)]
        assert all(head_block_bytes(r, c, dtype, vocab_stats=vocab_stats) <= budget for _, r, c in spy.blocks)
        assert torch.equal(out[3], full[3])  # the same top-1 ids
        for got, want in zip(out[:3], full[:3]):
            if want is None:
                assert got is None
            else:
                assert got.dtype == torch.float32 and got.shape == (29,)
                assert (got - want).abs().max() < 1e-5, (tile, got, want)
    spy.blocks.clear()
    whole = bounded_head_scores(head, h, targets, vocab_stats=vocab_stats, max_bytes=vocab * per_column)
    assert spy.blocks == [("full", 29, vocab)]  # everything fits: the fused full path itself
    assert all(torch.equal(a, b) for a, b in zip(whole, full) if b is not None)


def test_bounded_head_large_logits_against_float64():
    """Logits spread over hundreds of nats, one column per tile: the tile merge against float64."""
    head, h, targets = _random_head(53, torch.float32, True, seed=3, scale=30.0)
    logp = torch.log_softmax(head(h).double(), dim=-1)
    p = logp.exp()
    mean = (p * logp).sum(1)
    std = (p * (logp - mean[:, None]).square()).sum(1).sqrt()
    nll, m, s, _ = bounded_head_scores(head, h, targets, vocab_stats=True, max_bytes=1)
    scale = logp.abs().amax().item()
    assert (nll.double() + logp.gather(1, targets[:, None]).squeeze(1)).abs().max() <= 1e-5 * scale
    assert (m.double() - mean).abs().max() <= 1e-5 * scale
    assert (s.double() - std).abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("vocab_stats", [False, True])
def test_bounded_head_rows_for_a_quantized_head(model, vocab_stats, monkeypatch):
    """A head that is not a plain nn.Linear cannot be sliced by vocabulary: it is called on blocks of rows,
    each within the budget (at least one row), through score_examples' own dispatch (head_logits_bytes), and
    the scores equal the naive loop's."""

    class WrappedHead(torch.nn.Linear):
        pass

    wrapped = copy.deepcopy(model)
    old = wrapped.get_output_embeddings()
    head = WrappedHead(old.in_features, old.out_features, bias=False)
    head.weight = old.weight
    wrapped.set_output_embeddings(head)
    examples = _examples(seed=8)
    naive = _naive(model, examples)
    spy = _Spy(monkeypatch)
    per_row = head_block_bytes(1, VOCAB, torch.float32, vocab_stats=vocab_stats)
    for rows in (1, 3, 16):
        spy.blocks.clear()
        scores = score_examples(
            wrapped,
            examples,
            pad_id=PAD_ID,
            head_chunk=16,
            vocab_stats=vocab_stats,
            head_logits_bytes=rows * per_row,
        )
        assert spy.blocks and {kind for kind, _, _ in spy.blocks} == {"full"}
        assert max(r for _, r, _ in spy.blocks) == rows
        assert _max_diff(scores, naive) <= 1e-5
        if vocab_stats:
            assert _max_diff(scores, naive, "vocab_mean", "mean") <= 1e-5
            assert _max_diff(scores, naive, "vocab_std", "std") <= 1e-5


def test_default_budget_bounds_a_large_vocabulary(monkeypatch):
    """At Qwen2.5's vocabulary and the default head_chunk (1024 positions) in bf16, the default budget splits
    the vocabulary into tiles whose blocks fit in HEAD_LOGITS_BYTES; full logits would need about 2.2 GiB."""
    seen = []
    monkeypatch.setattr(
        scoring,
        "_vocab_tiled_head_scores",
        lambda head, h, targets, *, vocab_stats, vocab_tile: seen.append(vocab_tile),
    )
    head = torch.nn.Linear(8, 151936, bias=False, device="meta", dtype=torch.bfloat16)
    h = torch.empty(1024, 8, device="meta", dtype=torch.bfloat16)
    bounded_head_scores(head, h, torch.empty(1024, dtype=torch.long, device="meta"), vocab_stats=True)
    (tile,) = seen
    assert head_block_bytes(1024, 151936, torch.bfloat16, vocab_stats=True) > 2 * 2**30
    assert head_block_bytes(1024, tile, torch.bfloat16, vocab_stats=True) <= scoring.HEAD_LOGITS_BYTES
    assert tile % 128 == 0 and tile * 9 > 151936  # ten tiles or fewer


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("vocab_stats", [False, True])
def test_gpu_head_memory_is_bounded(vocab_stats):
    """On CUDA at Qwen2.5's vocabulary: the default budget's peak (torch.cuda.max_memory_allocated above what
    was allocated before) stays under HEAD_LOGITS_BYTES, where the full path needs gigabytes; the tiled numbers
    equal the full path's (float32 head: to 1e-4; bf16 head: to two bf16 steps of the largest logit, as a slice
    of the weight may round a logit one step away from the whole matmul)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    vocab, hidden, rows = 151936, 896, 1024
    for dtype in (torch.bfloat16, torch.float32):
        head = torch.nn.Linear(hidden, vocab, bias=False, device="cuda", dtype=dtype).requires_grad_(False)
        head.weight.normal_(0, 0.05, generator=gen)
        h = torch.randn(rows, hidden, device="cuda", dtype=dtype, generator=gen)
        targets = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
        largest = float(head(h[:64]).abs().max())  # also allocates the matmul's workspace before the measurement
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        tiled = bounded_head_scores(head, h, targets, vocab_stats=vocab_stats)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        assert peak <= scoring.HEAD_LOGITS_BYTES + (16 << 20), peak / 2**20
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        full = scoring._full_head_scores(head, h, targets, vocab_stats=vocab_stats)
        torch.cuda.synchronize()
        assert torch.cuda.max_memory_allocated() - before > 4 * scoring.HEAD_LOGITS_BYTES
        tol = 2 * 2**-7 * largest if dtype == torch.bfloat16 else 1e-4
        assert (tiled[3] == full[3]).float().mean() > 0.99  # near-ties may round to another maximum
        for got, want in zip(tiled[:3], full[:3]):
            if want is not None:
                assert (got - want).abs().max() <= tol, (dtype, (got - want).abs().max(), tol)


def test_samples_without_scored_tokens(model):
    examples = [([5], [True]), ([5, 6, 7], [False, False, False]), ([5, 6, 7], [False, True, True])]
    scores = score_examples(model, examples, pad_id=PAD_ID, vocab_stats=True)
    assert [len(s.token_losses) for s in scores] == [0, 0, 2]
    assert [len(s.vocab_std) for s in scores] == [0, 0, 2]
    assert np.isfinite(scores[2].token_losses).all() and (scores[2].token_losses > 0).all()


def test_deterministic_on_cpu(model):
    examples = _examples(seed=5)
    for workers in (1, 3):
        a = score_examples(
            model, examples, pad_id=PAD_ID, token_budget=80, head_chunk=16, vocab_stats=True, cpu_workers=workers
        )
        b = score_examples(
            model, examples, pad_id=PAD_ID, token_budget=80, head_chunk=16, vocab_stats=True, cpu_workers=workers
        )
        for x, y in zip(a, b):
            assert x.token_losses.tobytes() == y.token_losses.tobytes()
            assert x.vocab_mean.tobytes() == y.vocab_mean.tobytes()
            assert x.vocab_std.tobytes() == y.vocab_std.tobytes()


def test_cpu_workers_match_the_naive_loop(model):
    """Batches scored by concurrent worker threads land on the right samples, in input order."""
    examples = _examples(seed=6, n=23)
    naive = _naive(model, examples)
    threads = torch.get_num_threads()
    for workers in (1, 2, 5, 64):
        scores = score_examples(
            model, examples, pad_id=PAD_ID, token_budget=60, head_chunk=8, vocab_stats=True, cpu_workers=workers
        )
        assert torch.get_num_threads() == threads  # the thread count is restored
        assert [len(s.token_losses) for s in scores] == [len(ref["nll"]) for ref in naive]
        assert _max_diff(scores, naive) <= 1e-5 and _max_diff(scores, naive, "vocab_std", "std") <= 1e-5


def test_worker_threads_only_for_stock_layers(model, monkeypatch):
    """A model with a non-stock linear layer (as a real quantized kernel would be) is scored one batch at a
    time: its forward may keep state that concurrent calls would race on."""
    assert scoring.plain_modules(model)

    class StatefulLinear(torch.nn.Linear):
        def forward(self, x):
            self.calls = getattr(self, "calls", 0) + 1
            return super().forward(x)

    odd = copy.deepcopy(model)
    old = odd.model.layers[0].mlp.up_proj
    odd.model.layers[0].mlp.up_proj = StatefulLinear(old.in_features, old.out_features, bias=False)
    odd.model.layers[0].mlp.up_proj.weight = old.weight
    assert not scoring.plain_modules(odd)
    seen = []
    real_pool = scoring.ThreadPoolExecutor
    monkeypatch.setattr(scoring, "ThreadPoolExecutor", lambda *a, **k: seen.append(a) or real_pool(*a, **k))
    examples = _examples(seed=7, n=12)
    score_examples(odd, examples, pad_id=PAD_ID, token_budget=40, cpu_workers=4)
    assert seen == []  # no pool for the stateful model
    score_examples(model, examples, pad_id=PAD_ID, token_budget=40, cpu_workers=4)
    assert seen and seen[0][0] == 4


def test_cpu_parallelism_honours_llmaudit_threads(monkeypatch):
    monkeypatch.setenv("LLMAUDIT_THREADS", "3")
    assert scoring.cpu_parallelism() == 3
    monkeypatch.delenv("LLMAUDIT_THREADS")
    assert scoring.cpu_parallelism() >= 1


def test_weights_digest_tracks_every_parameter(model):
    clone = copy.deepcopy(model)
    assert weights_digest(clone) == weights_digest(model)
    with torch.no_grad():
        clone.model.layers[-1].mlp.down_proj.weight[0, 0] += 1e-3
    assert weights_digest(clone) != weights_digest(model)
