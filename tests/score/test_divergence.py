"""Per-token KL(p_ref || p_q) and top-token agreement against a float64 reference computed from full logits."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from llmaudit.score.divergence import (
    DivergenceCollector,
    ReferenceStates,
    divergence_scores,
    identical_divergence,
    merge_divergence_tiles,
    scored_counts,
)
from llmaudit.score.engine import score_examples
from tests.tiny_models import tiny_causal_lm


@torch.no_grad()
def _reference(head_ref, head_q, h_ref, h_q):
    """float64 over the whole vocabulary from the float32 logits both heads give (the models' own numbers):
    sum_v p_ref (log p_ref - log p_q) and the two argmaxes."""
    x_ref, x_q = head_ref(h_ref).double(), head_q(h_q).double()
    lp_ref, lp_q = torch.log_softmax(x_ref, -1), torch.log_softmax(x_q, -1)
    kl = (lp_ref.exp() * (lp_ref - lp_q)).sum(-1)
    return kl.numpy(), (x_ref.argmax(-1) == x_q.argmax(-1)).numpy()


def _dyadic(shape, g, scale=1.0, step=1 / 8):
    """Normal draws rounded to multiples of `step`: every float32 dot product of such vectors (hidden 32-64)
    is exact, whatever the summation order, so the logits are exact and the float64 reference differs from
    the one-pass reduction only by the reduction's own rounding."""
    return torch.round(torch.randn(shape, generator=g) * scale / step) * step


def _heads(vocab=1000, hidden=32, seed=0, scale=1.0, bias=True):
    g = torch.Generator().manual_seed(seed)
    ref = torch.nn.Linear(hidden, vocab, bias=bias)
    with torch.no_grad():
        ref.weight.copy_(_dyadic((vocab, hidden), g, scale / 4))
        if bias:
            ref.bias.copy_(_dyadic((vocab,), g))
    return ref, g


def test_hand_built_pair_of_distributions():
    """Two positions over a 3-token vocabulary with an identity head: the logits are the hidden states."""
    head = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    p_ref = np.array([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]])
    p_q = np.array([[0.5, 0.3, 0.2], [0.4, 0.4, 0.2]])
    h_ref, h_q = torch.tensor(np.log(p_ref), dtype=torch.float32), torch.tensor(np.log(p_q) + 3.0, dtype=torch.float32)
    kl, same = divergence_scores(head, head, h_ref, h_q, vocab_tile=2)  # tiles {0,1}, {2}
    expected = (p_ref * np.log(p_ref / p_q)).sum(1)  # 0.7 ln 1.4 + 0.2 ln(2/3) + 0.1 ln 0.5 = 0.0851...; 0.2609...
    assert expected[0] == pytest.approx(0.7 * np.log(1.4) + 0.2 * np.log(2 / 3) + 0.1 * np.log(0.5))
    assert kl.numpy() == pytest.approx(expected, abs=1e-6)
    assert same.tolist() == [True, False]  # argmax 0/0, then 2 against 0 (first index on the 0.4 tie)


@pytest.mark.parametrize("tile", [1, 7, 128, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_equals_float64_reference_for_any_tile(tile, bias):
    ref, g = _heads(bias=bias)
    q = copy.deepcopy(ref)
    with torch.no_grad():
        q.weight.add_(_dyadic(q.weight.shape, g, 0.05, 1 / 64))
    h_ref = _dyadic((50, 32), g)
    h_q = h_ref + _dyadic((50, 32), g, 0.1, 1 / 64)
    kl, same = divergence_scores(ref, q, h_ref, h_q, vocab_tile=tile)
    want_kl, want_same = _reference(ref, q, h_ref, h_q)
    assert np.abs(kl.numpy() - want_kl).max() < 5e-8 * max(1.0, want_kl.max())
    assert (same.numpy() == want_same).all()
    assert 0 < want_same.mean() < 1  # both outcomes occur: the test can tell them apart


def test_model_against_itself_is_exactly_zero_and_same_top():
    ref, g = _heads(scale=3.0)
    h = _dyadic((40, 32), g)
    kl, same = divergence_scores(ref, copy.deepcopy(ref), h, h.clone(), vocab_tile=64)
    assert (kl == 0).all() and same.all()
    assert [d.kl.tolist() for d in identical_divergence([2, 0])] == [[0.0, 0.0], []]


def test_near_lossless_pair_keeps_its_relative_accuracy():
    """KL of order 1e-6 (smaller than any real quantizer's): the one-pass reduction stays within 0.5% of
    float64 (float32 logits and exp, sums accumulated in float64), so near-lossless quantizers are not ranked
    by rounding. With float32 sums the error was 2.4% here."""
    ref, g = _heads(vocab=4096, hidden=64, scale=0.5)
    h_ref = _dyadic((64, 64), g)
    h_q = h_ref + _dyadic((64, 64), g, 2e-3, 1 / 1024)
    kl, _ = divergence_scores(ref, ref, h_ref, h_q, vocab_tile=512)
    want, _ = _reference(ref, ref, h_ref, h_q)
    assert 1e-7 < want.mean() < 1e-4
    assert np.abs(kl.numpy() - want).max() < 0.005 * want.min()


def test_large_logits_and_ties_across_tiles():
    """Logits of +-1e3 (exp would overflow without the max shift); an exact tie between two tiles goes to the
    lower index in both models."""
    head = torch.nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(4))
    h_ref = torch.tensor([[1000.0, 0.0, 1000.0, -1000.0]])
    h_q = torch.tensor([[999.0, 0.0, 1000.0, -1000.0]])
    kl, same = divergence_scores(head, head, h_ref, h_q, vocab_tile=2)
    # p_ref = (1/2, 0, 1/2, 0); p_q = (1/(1+e), 0, e/(1+e), 0)
    e = np.e
    want = 0.5 * np.log(0.5 * (1 + e)) + 0.5 * np.log(0.5 * (1 + e) / e)
    assert kl.item() == pytest.approx(want, rel=1e-6)
    assert same.item() is False  # ref: index 0 (first of the tie), q: index 2
    kl2, same2 = divergence_scores(head, head, h_ref, h_ref.clone(), vocab_tile=2)
    assert kl2.item() == 0.0 and same2.item() is True


def test_each_model_uses_its_own_head_and_non_linear_heads_use_row_blocks():
    ref, g = _heads(vocab=300)
    q = copy.deepcopy(ref)
    with torch.no_grad():
        q.weight.mul_(1.3)

    class Wrapped(torch.nn.Module):  # a head that cannot be sliced by vocabulary (like a quantized one)
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    h = _dyadic((20, 32), g)
    want, want_same = _reference(ref, q, h, h)
    for head_q, max_bytes in ((q, None), (Wrapped(q), 5 * 4 * 300 * 3)):  # row blocks of 3
        kl, same = divergence_scores(ref, head_q, h, h, max_bytes=max_bytes)
        assert np.abs(kl.numpy() - want).max() < 2e-6 and (same.numpy() == want_same).all()
    assert want.min() > 1e-3  # the heads differ: KL is not trivially 0


def test_merge_of_hand_written_tile_statistics():
    # one position, two tiles: ref logits (0, ln 3 | ln 2, 0) and q logits (0, 0 | 0, 0)
    x_ref = np.array([0.0, np.log(3), np.log(2), 0.0])
    p_ref = np.exp(x_ref) / np.exp(x_ref).sum()
    tiles = []
    for part in (slice(0, 2), slice(2, 4)):
        xr, xq = x_ref[part], np.zeros(2)
        m = xr.max()
        tiles.append([m, np.exp(xr - m).sum(), (np.exp(xr - m) * (xr - xq)).sum(), 0.0, 2.0])
    stats = torch.tensor(np.array(tiles).T[:, :, None], dtype=torch.float32)
    argmax = torch.tensor([[[1], [0]], [[0], [0]]])
    kl, same = merge_divergence_tiles(stats, argmax, torch.tensor([0, 2]))
    assert kl.item() == pytest.approx((p_ref * np.log(p_ref / 0.25)).sum(), abs=1e-6)
    assert same.item() is False  # ref's top is index 1, q's (a four-way tie) index 0


def _tiny_model():
    return tiny_causal_lm(
        "qwen2",
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )


def _examples(n=7, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for length in rng.integers(3, 30, size=n):
        ids = rng.integers(1, 256, size=int(length)).tolist()
        out.append((ids, [False] * (int(length) // 2) + [True] * (int(length) - int(length) // 2)))
    return out


def test_engine_hooks_capture_and_compare_hidden_states():
    """Through the scoring engine: the reference pass captures every scored position, the quantized pass is
    compared batch by batch, and the result equals the float64 reference from full forward passes."""
    model = _tiny_model()
    noisy = copy.deepcopy(model)
    with torch.no_grad():
        for p in noisy.model.layers.parameters():
            p.add_(0.02 * torch.randn_like(p))
    examples = _examples()
    reference = ReferenceStates(examples)
    score_examples(model, examples, pad_id=0, token_budget=64, hidden_hook=reference.hook, cpu_workers=2)
    assert reference.complete and [s.shape[0] for s in reference.states] == scored_counts(examples)
    collector = DivergenceCollector(reference, model.lm_head, noisy.lm_head)
    score_examples(noisy, examples, pad_id=0, token_budget=64, hidden_hook=collector.hook, cpu_workers=2)
    for (ids, mask), got in zip(examples, collector.results):
        with torch.no_grad():
            x_ref = model(torch.tensor([ids])).logits[0, :-1].double()
            x_q = noisy(torch.tensor([ids])).logits[0, :-1].double()
        scored = torch.tensor(mask[1:])
        lp_ref, lp_q = torch.log_softmax(x_ref[scored], -1), torch.log_softmax(x_q[scored], -1)
        want = (lp_ref.exp() * (lp_ref - lp_q)).sum(-1).numpy()
        assert np.abs(got.kl - want).max() < 1e-5
        assert (got.same_top == (x_ref[scored].argmax(-1) == x_q[scored].argmax(-1)).numpy()).all()
    assert np.concatenate([r.kl for r in collector.results]).mean() > 1e-4  # the perturbation is visible


def test_bounded_tile_on_other_devices():
    from llmaudit.score.divergence import divergence_tile

    assert divergence_tile(100, 50_000, torch.device("cuda"), max_bytes=2_000_000) == 2_000_000 // (20 * 100)
    assert divergence_tile(1, 10, torch.device("cuda")) == 10
