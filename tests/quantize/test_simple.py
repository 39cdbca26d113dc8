"""The simple quantizers of docs/science.md section 3, against hand-computed outputs."""

import math

import pytest
import torch

from llmaudit.quantize import get_quantizer, sign_quantize, ternary_quantize, uniform_quantize

from .conftest import build_tiny


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def test_sign_values_and_zero():
    assert torch.equal(sign_quantize(t(0.3, -0.01, 0.0, 2.0)), t(1, -1, 0, 1))


def test_ternary_zeroes_smallest_magnitudes():
    w = t(0.4, -0.1, 0.3, -0.8, 0.05, 0.6)
    # 50% of 6 = 3 smallest magnitudes: 0.05, 0.1, 0.3
    assert torch.equal(ternary_quantize(w, 0.5), t(1, 0, 0, -1, 0, 1))
    # 33% of 6 = 1.98 -> 2 zeroed: 0.05, 0.1
    assert torch.equal(ternary_quantize(w, 0.33), t(1, 0, 1, -1, 0, 1))
    # 90% of 6 = 5.4 -> 5 zeroed: only the largest (-0.8) survives
    assert torch.equal(ternary_quantize(w, 0.9), t(0, 0, 0, -1, 0, 0))
    assert torch.equal(ternary_quantize(w, 0.0), torch.sign(w))


def test_ternary_ties_at_threshold_are_all_zeroed():
    # 50% of 6 = 3, the 3rd smallest magnitude is 0.2 and is shared by three weights:
    # all of them are zeroed (4 zeros, sparsity 4/6 >= 50%), whatever their position.
    w = t(0.2, -0.1, -0.2, 0.5, 0.2, -0.9)
    q = ternary_quantize(w, 0.5)
    assert torch.equal(q, t(0, 0, 0, 1, 0, -1))
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    assert torch.equal(ternary_quantize(w[perm], 0.5), q[perm])
    # one weight below a tie: 33% of 6 = 2 -> threshold 0.2 (2nd smallest) -> 0.1 and all three 0.2
    assert int((ternary_quantize(w, 0.33) == 0).sum()) == 4


def test_uniform_hand_computed_levels():
    # max|w| = 0.5 -> alpha = 2^round(-1) = 0.5; b = 2: step alpha/2 = 0.25, x = 2|w|/alpha = 4|w|
    w = t(0.1, -0.2, 0.3, 0.5, -0.05, 0.0)
    # floor(1 + clip(x, 0, 2)): x = .4 -> 1, .8 -> 1, 1.2 -> 2, 2 -> 3 (top of the clip), .2 -> 1, 0 -> 1 (sign 0)
    assert torch.allclose(uniform_quantize(w, 2), t(0.25, -0.25, 0.5, 0.75, -0.25, 0.0))
    # b = 3: step 0.125, x = 8|w|: .8 -> 1, 1.6 -> 2, 2.4 -> 3, 4 -> 5, .4 -> 1
    assert torch.allclose(uniform_quantize(w, 3), t(0.125, -0.25, 0.375, 0.625, -0.125, 0.0))


def test_uniform_top_clip_when_max_exceeds_alpha():
    # max|w| = 1.4: log2 = 0.485 -> alpha = 1; b = 2: x = 2|w| = 2.8 clipped to 2 -> level 3 * 0.5 = 1.5
    w = t(1.4, -1.3, 0.7, 0.2)
    # 1.3 -> x 2.6 -> clip 2 -> 1.5; 0.7 -> x 1.4 -> 2 -> 1.0; 0.2 -> x .4 -> 1 -> 0.5
    assert torch.allclose(uniform_quantize(w, 2), t(1.5, -1.5, 1.0, 0.5))
    # max|w| = 0.7: log2 = -0.515 -> alpha = 0.5; x = 4|w| = 2.8 -> clip 2 -> 0.75
    assert torch.allclose(uniform_quantize(t(0.7, 0.1), 2), t(0.75, 0.25))


def test_all_zero_tensor_and_batches():
    assert torch.equal(uniform_quantize(torch.zeros(3, 4), 3), torch.zeros(3, 4))
    assert torch.equal(ternary_quantize(torch.zeros(3, 4), 0.5), torch.zeros(3, 4))
    w = torch.stack([torch.zeros(2, 3), torch.full((2, 3), 0.3)])
    q = uniform_quantize(w, 2, batch_dims=1)
    assert torch.equal(q[0], torch.zeros(2, 3)) and torch.isfinite(q).all()
    assert torch.allclose(q[1], torch.full((2, 3), 0.375))  # alpha 0.25: x = 2.4 -> clip 2 -> 3 * 0.125


def test_batch_dims_quantize_each_tensor_independently():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(7, 8, 16, generator=g) * torch.logspace(-3, 1, 7)[:, None, None]
    for fn in (lambda x, **k: ternary_quantize(x, 0.9, **k), lambda x, **k: uniform_quantize(x, 4, **k)):
        batched = fn(w, batch_dims=1)
        assert torch.equal(batched, torch.stack([fn(x) for x in w]))
        # different scales per tensor: the pooled (batch_dims=0) result must differ
        assert not torch.equal(batched, fn(w))
    assert math.isclose(float((ternary_quantize(w, 0.9, batch_dims=1) == 0).float().mean()), 115 / 128)
    with pytest.raises(ValueError, match="batch_dims"):
        uniform_quantize(w, 4, batch_dims=3)


def test_dtype_preserved_and_bad_arguments():
    w = torch.randn(4, 8).to(torch.bfloat16)
    assert uniform_quantize(w, 3).dtype == torch.bfloat16
    assert ternary_quantize(w, 0.5).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="sparsity"):
        ternary_quantize(w, 90)
    with pytest.raises(ValueError, match="bits"):
        uniform_quantize(w, 1)


def test_quantize_tensor_matches_pure_functions_and_absmean_scale():
    w = t(0.4, -0.1, 0.3, -0.8, 0.05, 0.6)
    assert torch.equal(get_quantizer("ternary-50").quantize_tensor(w), ternary_quantize(w, 0.5))
    assert torch.equal(get_quantizer("uniform-3").quantize_tensor(w), uniform_quantize(w, 3))
    # absmean: kept weights 0.4, 0.8, 0.6 -> scale 0.6
    q = get_quantizer("ternary-50", scale="absmean").quantize_tensor(w)
    assert torch.allclose(q, t(0.6, 0, 0, -0.6, 0, 0.6))


def test_model_scope_only_block_linears_change():
    model = build_tiny("qwen2")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    q = get_quantizer("uniform-3", device="cpu")
    out = q.quantize_model(model)
    for name, param in out.named_parameters():
        in_scope = ".layers." in name and "proj.weight" in name
        changed = not torch.equal(param, before[name])
        assert changed == in_scope, name
        if in_scope:
            assert torch.equal(param, uniform_quantize(before[name], 3))
    assert q.options["modules"] == [r"(^|\.)layers\.\d+\."]
    # effective bits: log2(2^3 + 2) per weight + one 32-bit alpha per matrix
    shapes = [(m.in_features, m.out_features) for n, m in out.named_modules() if n.endswith("proj")]
    n_weights = sum(i * o for i, o in shapes)
    expected = math.log2(10) + 32 * len(shapes) / n_weights
    assert math.isclose(q.effective_bits(out), expected, rel_tol=1e-12)
    assert get_quantizer("ternary-90").bits == 1.58
