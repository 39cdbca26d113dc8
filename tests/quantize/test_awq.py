"""AWQ 4-bit weight-only through gptqmodel: scored from the checkpoint gptqmodel writes."""

from __future__ import annotations

import copy

import pytest
import torch

from llmaudit.quantize import QuantizationError, get_quantizer
from llmaudit.quantize.base import library_available, target_modules
from tests.tiny_models import tiny_causal_lm

from .conftest import INIT_RANGE, VOCAB, build_tiny, per_sample_loss

pytestmark = pytest.mark.skipif(
    not library_available("gptqmodel"), reason="gptqmodel (the gptq extra) is not installed"
)


def awq_sized() -> torch.nn.Module:
    """A tiny Qwen2 whose every layer has a multiple of 64 outputs (AWQ's clipping search works in rows of 64)."""
    return tiny_causal_lm(
        "qwen2", hidden_size=128, intermediate_size=256, vocab_size=VOCAB, initializer_range=INIT_RANGE
    )


def test_output_widths_awq_cannot_search_are_refused_before_any_work():
    with pytest.raises(QuantizationError, match="outputs; AWQ's clipping search"):
        get_quantizer("awq-4", group_size=32).check(build_tiny("qwen2"))  # k/v_proj: 32 outputs


@pytest.fixture(scope="module")
def quantized(tokenizer, texts):
    base = awq_sized()
    q = get_quantizer("awq-4", group_size=32, calibration_samples=8, device="cpu")
    model = q.quantize_model(copy.deepcopy(base), tokenizer=tokenizer, calibration_texts=texts)
    return base, q, model


@pytest.mark.slow
def test_awq_on_cpu_writes_a_4bit_grid_per_group(quantized):
    base, q, model = quantized
    layers = target_modules(model, q.options["modules"])
    assert len(layers) == 14 and all(type(m) is torch.nn.Linear for _, m in layers)
    for name, module in layers:
        groups = module.weight.detach().reshape(module.out_features, -1, 32)  # group_size 32
        distinct = max(len(torch.unique(row_group)) for row in groups for row_group in row)
        assert distinct <= 16, name  # (code - zero) x scale with 4-bit codes: at most 16 values per row and group
        assert not torch.equal(module.weight, base.get_submodule(name).weight), name
    assert q.effective_bits(model) == pytest.approx(4 + 20 / 32)


@pytest.mark.slow
def test_awq_keeps_the_model_close(quantized, batch):
    base, _, model = quantized
    reference = per_sample_loss(base, *batch)
    change = (per_sample_loss(model, *batch) - reference).abs().mean().item()
    sign = get_quantizer("sign", device="cpu").quantize_model(copy.deepcopy(base))
    assert 0 < change < 0.5 * (per_sample_loss(sign, *batch) - reference).abs().mean().item()  # 0.24 measured


@pytest.mark.gpu
def test_awq_real_kernels_match_the_dequantized_weights(tokenizer, texts, batch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    base = awq_sized()
    kwargs = dict(tokenizer=tokenizer, calibration_texts=texts)
    real = get_quantizer("awq-4", group_size=32, calibration_samples=8, device="cuda", mode="real")
    fake = get_quantizer("awq-4", group_size=32, calibration_samples=8, device="cuda", mode="fake")
    real_loss = per_sample_loss(real.quantize_model(copy.deepcopy(base), **kwargs), *batch)
    fake_loss = per_sample_loss(fake.quantize_model(copy.deepcopy(base), **kwargs), *batch)
    assert torch.allclose(real_loss, fake_loss, atol=0.02)  # the kernels compute in float16
