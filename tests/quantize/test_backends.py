"""Every backend on tiny Qwen2 / Llama / LoRA-merged models: it quantizes, losses are finite, the
loss change against full precision shrinks as bits rise, fake quantization equals the real modules."""

import copy
import math

import pytest
import torch
from torch import nn

from llmaudit.quantize import QUANTIZER_NAMES, get_quantizer, list_quantizers

from .conftest import build_lora_merged, build_tiny, per_sample_loss

AVAILABLE = {i.name for i in list_quantizers() if i.available}
# the calibrated quantizers aside (GPTQ below, AWQ in test_awq.py on a model whose widths its search supports,
# GGUF with an importance matrix in test_gguf_exact.py): they need a tokenizer and calibration text
NON_GPTQ = [n for n in QUANTIZER_NAMES if n in AVAILABLE and not get_quantizer(n).calibrated]
needs_gptq = pytest.mark.skipif("gptq-4" not in AVAILABLE, reason="gptqmodel not installed")
GPTQ_OPTIONS = dict(group_size=32, calibration_samples=16, calibration_max_length=32)


def cpu_quantizer(name, **options):
    """CPU tests pin the device, so a GPU machine runs them exactly as a CPU-only one does."""
    return get_quantizer(name, device="cpu", **options)


LADDERS = {  # names in increasing bits, per family (sign/ternary use the published unscaled rule)
    "full": ["bf16", "fp32"],
    "hqq": ["hqq-1", "hqq-2", "hqq-3", "hqq-4", "hqq-8"],
    "bnb": ["bnb-nf4", "bnb-int8"],
    "simple": ["uniform-2", "uniform-3", "uniform-4", "uniform-5"],
}


@pytest.fixture(scope="module")
def lora_results(batch):
    """{name: (quantizer, quantized model, per-sample losses)} on the LoRA-merged model, + 'ref'."""
    base = build_lora_merged()
    results = {"ref": per_sample_loss(base, *batch)}
    for name in NON_GPTQ:
        q = cpu_quantizer(name)
        model = q.quantize_model(copy.deepcopy(base))
        results[name] = (q, model, per_sample_loss(model, *batch))
    return results


def mean_abs_change(results, name):
    return float((results[name][2] - results["ref"]).abs().mean())


def test_every_cpu_quantizer_gives_finite_changed_losses(lora_results):
    ref = lora_results["ref"]
    assert ref.shape == (16,) and torch.isfinite(ref).all()
    for name in NON_GPTQ:
        q, model, losses = lora_results[name]
        assert losses.shape == ref.shape and torch.isfinite(losses).all(), name
        if name != "fp32":
            assert not torch.equal(losses, ref), f"{name} did not change the model"
        hidden = model.model(input_ids=torch.tensor([[1, 2, 3]])).last_hidden_state
        assert model.get_output_embeddings()(hidden).shape == (1, 3, 512)
    assert torch.equal(lora_results["fp32"][2], ref)


@pytest.mark.parametrize("family", sorted(LADDERS))
def test_loss_change_does_not_grow_with_bits(lora_results, family):
    changes = [mean_abs_change(lora_results, n) for n in LADDERS[family] if n in AVAILABLE]
    assert changes == sorted(changes, reverse=True), dict(zip(LADDERS[family], changes))
    assert changes[0] > changes[-1]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_architectures(arch, batch):
    base = build_tiny(arch)
    ref = per_sample_loss(base, *batch)
    for name in ["bf16", "sign", "ternary-90", "uniform-4", "hqq-3", "bnb-nf4", "bnb-int8"]:
        if name not in AVAILABLE:
            continue
        losses = per_sample_loss(cpu_quantizer(name).quantize_model(copy.deepcopy(base)), *batch)
        assert torch.isfinite(losses).all() and not torch.equal(losses, ref), (arch, name)


def test_default_scope_leaves_embeddings_norms_head(lora_results):
    base = build_lora_merged()
    _, model, _ = lora_results["hqq-2"]
    base_params = dict(base.named_parameters())
    for name, param in model.named_parameters():
        if ".layers." in name and name.endswith("proj.weight"):
            assert not torch.equal(param, base_params[name]), name
        else:
            assert torch.equal(param, base_params[name]), name


def test_effective_bits_and_size(lora_results):
    base = build_lora_merged()
    fp32_bytes = sum(p.numel() * 4 for p in base.parameters())
    in_scope = sum(m.weight.numel() for n, m in base.named_modules() if isinstance(m, nn.Linear) and ".layers." in n)
    expected_bits = {
        "fp32": 32,
        "bf16": 16,
        "hqq-1": 1.5,
        "hqq-4": 4.5,
        "hqq-8": 8.5,
        "bnb-nf4": 4.5,
        "sign": 1.0,
        "ternary-50": math.log2(3),
    }
    for name, bits in expected_bits.items():
        q, model, _ = lora_results[name]
        assert math.isclose(q.effective_bits(model), bits, rel_tol=1e-12), name
        expected_size = fp32_bytes - in_scope * 4 + in_scope * bits / 8
        assert abs(q.model_size_bytes(model) - expected_size) <= 1, name
    dq = cpu_quantizer("bnb-nf4", double_quant=True)
    assert math.isclose(dq.bits_per_weight(64, 64), 4 + 8 / 64 + 32 / (256 * 64))
    q8, m8, _ = lora_results["bnb-int8"]
    widths = [(m.in_features, m.out_features) for n, m in m8.named_modules() if n.endswith("proj")]
    expected = sum(i * o * (8 + 32 / i) for i, o in widths) / sum(i * o for i, o in widths)
    assert math.isclose(q8.effective_bits(m8), expected)


def test_bnb_accounting_matches_real_storage():
    import bitsandbytes as bnb

    model = cpu_quantizer("bnb-nf4", mode="real").quantize_model(build_tiny("qwen2"))
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 14
    stored_bits = sum(
        m.weight.data.numel() * m.weight.data.element_size() * 8 + m.weight.quant_state.absmax.numel() * 32
        for m in layers
    )
    n = sum(m.in_features * m.out_features for m in layers)
    assert math.isclose(stored_bits / n, cpu_quantizer("bnb-nf4").effective_bits(model))


def _real_vs_fake(name, **options):
    base = build_lora_merged()
    real_model = cpu_quantizer(name, mode="real", **options).quantize_model(copy.deepcopy(base))
    fake_model = cpu_quantizer(name, mode="fake", **options).quantize_model(copy.deepcopy(base))
    return real_model, fake_model


@pytest.mark.parametrize("name", ["hqq-1", "hqq-4"])
def test_hqq_fake_equals_real_hqqlinear(name, batch):
    from hqq.core.quantize import HQQLinear

    real_model, fake_model = _real_vs_fake(name)
    assert sum(isinstance(m, HQQLinear) for m in real_model.modules()) == 14
    assert not any(isinstance(m, HQQLinear) for m in fake_model.modules())
    torch.testing.assert_close(
        per_sample_loss(fake_model, *batch), per_sample_loss(real_model, *batch), rtol=0, atol=1e-5
    )


def test_hqq_per_layer_path_equals_hqq_model_api(batch):
    """Our per-layer HQQLinear path (which honours `modules`) equals hqq's AutoHQQHFModel.quantize_model."""
    from hqq.core.quantize import BaseQuantizeConfig
    from hqq.models.hf.base import AutoHQQHFModel

    base = build_lora_merged()
    ours = cpu_quantizer("hqq-3", mode="real").quantize_model(copy.deepcopy(base))
    theirs = copy.deepcopy(base)
    AutoHQQHFModel.quantize_model(
        theirs, quant_config=BaseQuantizeConfig(nbits=3, group_size=64), compute_dtype=torch.float32, device="cpu"
    )
    torch.testing.assert_close(per_sample_loss(ours, *batch), per_sample_loss(theirs, *batch), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name, double_quant", [("bnb-nf4", False), ("bnb-nf4", True), ("bnb-fp4", False)])
def test_bnb_fake_equals_real_linear4bit(name, double_quant, batch):
    import bitsandbytes as bnb

    real_model, fake_model = _real_vs_fake(name, double_quant=double_quant)
    layers = [m for m in real_model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 14
    for m in layers:
        # On AVX512-BF16 CPUs bitsandbytes switches eval-time inference to a fused kernel that casts the
        # activations to bf16; the generic path (dequantize, then an fp32 matmul) is what fake mode equals.
        m.support_avx512bf16_for_cpu = False
    torch.testing.assert_close(
        per_sample_loss(fake_model, *batch), per_sample_loss(real_model, *batch), rtol=0, atol=1e-5
    )


@pytest.fixture(scope="module")
def gptq_results(tokenizer, texts, batch):
    """gptq-8 through the default (fake on CPU) path; gptq-2 in real mode, scored twice: real modules
    fed fp32 activations, then the same model converted to the fake form."""
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

    from llmaudit.quantize.gptq_backend import dequantize_gptq_layers

    base = build_lora_merged()
    out = {"ref": per_sample_loss(base, *batch)}
    q8 = cpu_quantizer("gptq-8", **GPTQ_OPTIONS)
    m8 = q8.quantize_model(copy.deepcopy(base), tokenizer=tokenizer, calibration_texts=texts)
    out["gptq-8"] = (q8, m8, per_sample_loss(m8, *batch))
    q2 = cpu_quantizer("gptq-2", mode="real", **GPTQ_OPTIONS)
    real = q2.quantize_model(copy.deepcopy(base), tokenizer=tokenizer, calibration_texts=texts)
    out["n_real_layers"] = sum(isinstance(m, BaseQuantLinear) for m in real.modules())
    for param in real.parameters():  # non-quantized parts to fp32; quantized layers cast their weights to x's dtype
        param.data = param.data.float()
    out["gptq-2-real"] = per_sample_loss(real, *batch)
    fake = dequantize_gptq_layers(real, torch.float32)
    out["gptq-2"] = (q2, fake, per_sample_loss(fake, *batch))
    return out


@needs_gptq
def test_gptq_quantizes_on_cpu(gptq_results):
    ref = gptq_results["ref"]
    assert gptq_results["n_real_layers"] == 14
    for name in ("gptq-2", "gptq-8"):
        q, model, losses = gptq_results[name]
        assert torch.isfinite(losses).all() and not torch.equal(losses, ref)
        assert all(type(m) is nn.Linear for n, m in model.named_modules() if n.endswith("proj"))
        assert next(model.parameters()).dtype == torch.float32
    change = {n: float((gptq_results[n][2] - ref).abs().mean()) for n in ("gptq-2", "gptq-8")}
    assert change["gptq-2"] > change["gptq-8"], change
    q8, m8, _ = gptq_results["gptq-8"]
    widths = [(m.in_features, m.out_features) for n, m in m8.named_modules() if n.endswith("proj")]
    expected = sum(i * o * (8 + 24 / 32 + 32 / o) for i, o in widths) / sum(i * o for i, o in widths)
    assert math.isclose(q8.effective_bits(m8), expected)


@needs_gptq
def test_gptq_fake_equals_real_modules(gptq_results):
    torch.testing.assert_close(gptq_results["gptq-2"][2], gptq_results["gptq-2-real"], rtol=0, atol=1e-5)


@needs_gptq
def test_gptq_loss_change_ladder(gptq_results, tokenizer, texts, batch):
    base = build_lora_merged()
    ref = gptq_results["ref"]
    changes = {n: float((gptq_results[n][2] - ref).abs().mean()) for n in ("gptq-2", "gptq-8")}
    for name in ("gptq-3", "gptq-4"):
        model = cpu_quantizer(name, **GPTQ_OPTIONS).quantize_model(
            copy.deepcopy(base), tokenizer=tokenizer, calibration_texts=texts
        )
        changes[name] = float((per_sample_loss(model, *batch) - ref).abs().mean())
    ladder = [changes[n] for n in ("gptq-2", "gptq-3", "gptq-4", "gptq-8")]
    assert ladder == sorted(ladder, reverse=True), changes


# ---- GPU paths (real kernels, bf16 compute) ---------------------------------------------------------


def real_kernel(name: str) -> type:
    """The module class a quantizer must leave in every in-scope layer on a GPU."""
    if name in ("bf16", "uniform-4"):
        return torch.nn.Linear
    if name == "hqq-4":
        from hqq.core.quantize import HQQLinear

        return HQQLinear
    import bitsandbytes as bnb

    return bnb.nn.Linear8bitLt if name == "bnb-int8" else bnb.nn.Linear4bit


def gpu_tolerance(effect: float) -> float:
    """A quarter of the quantization effect (mean |loss_q - loss_fp32| on the CPU), never below bf16's own
    rounding of the activations (0.01 nats): tight enough that a wrong kernel or wrong weights fail."""
    return max(0.25 * effect, 0.01)


@pytest.mark.parametrize("name", ["bf16", "hqq-4", "bnb-nf4", "bnb-int8", "uniform-4"])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_real_kernels_match_cpu(name, batch, lora_results):
    from llmaudit.quantize.base import DEFAULT_MODULES, target_modules

    q = get_quantizer(name, device="cuda")
    model = q.quantize_model(build_lora_merged())
    layers = target_modules(model, DEFAULT_MODULES)
    assert layers and all(type(m) is real_kernel(name) or isinstance(m, real_kernel(name)) for _, m in layers), {
        n: type(m).__name__ for n, m in layers
    }
    if name == "bf16":
        assert all(m.weight.dtype == torch.bfloat16 and m.weight.device.type == "cuda" for _, m in layers)
    losses = per_sample_loss(model, *batch).float().cpu()
    assert torch.isfinite(losses).all()
    cpu_losses = lora_results[name][2]
    effect = mean_abs_change(lora_results, name)
    gap = float((losses - cpu_losses).abs().mean())
    assert gap < gpu_tolerance(effect), (name, gap, effect)


@needs_gptq
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_gptq_uses_its_kernels_and_moves_losses_like_the_cpu(tokenizer, texts, batch):
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

    base = build_lora_merged()
    ref = per_sample_loss(base, *batch)
    cpu = cpu_quantizer("gptq-4", **GPTQ_OPTIONS).quantize_model(
        copy.deepcopy(base), tokenizer=tokenizer, calibration_texts=texts
    )
    cpu_losses = per_sample_loss(cpu, *batch)
    model = get_quantizer("gptq-4", device="cuda", **GPTQ_OPTIONS).quantize_model(
        copy.deepcopy(base), tokenizer=tokenizer, calibration_texts=texts
    )
    from llmaudit.quantize.base import DEFAULT_MODULES, target_modules

    in_scope = len(target_modules(base, DEFAULT_MODULES))  # every linear layer of the 2 blocks
    assert sum(isinstance(m, BaseQuantLinear) for m in model.modules()) == in_scope == 14
    losses = per_sample_loss(model, *batch).float().cpu()
    effect = float((cpu_losses - ref).abs().mean())
    # GPTQ on the GPU calibrates in bf16, so its weights differ slightly from the CPU's: half the effect
    assert torch.isfinite(losses).all() and float((losses - cpu_losses).abs().mean()) < max(0.5 * effect, 0.01)
