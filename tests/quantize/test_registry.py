"""Registry, option validation, availability and impossible-request errors."""

import json
import subprocess
import sys

import pytest
import torch

import llmaudit.quantize as quantize
import llmaudit.quantize.base as base
from llmaudit.quantize import QUANTIZER_NAMES, QuantizationError, get_quantizer, list_quantizers
from llmaudit.quantize.gguf_backend import GGUF_NAMES, GGUF_TYPES

from .conftest import build_tiny

EXPECTED = {
    "fp32": ("full", 32),
    "bf16": ("full", 16),
    "fp16": ("full", 16),
    "bnb-nf4": ("bnb", 4),
    "bnb-fp4": ("bnb", 4),
    "bnb-int8": ("bnb", 8),
    "gptq-2": ("gptq", 2),
    "gptq-3": ("gptq", 3),
    "gptq-4": ("gptq", 4),
    "gptq-8": ("gptq", 8),
    "hqq-1": ("hqq", 1),
    "hqq-2": ("hqq", 2),
    "hqq-3": ("hqq", 3),
    "hqq-4": ("hqq", 4),
    "hqq-8": ("hqq", 8),
    "sign": ("simple", 1),
    "ternary-33": ("simple", 1.58),
    "ternary-50": ("simple", 1.58),
    "ternary-90": ("simple", 1.58),
    "uniform-2": ("simple", 2),
    "uniform-3": ("simple", 3),
    "uniform-4": ("simple", 4),
    "uniform-5": ("simple", 5),
    "awq-4": ("awq", 4),
    **{name: ("gguf", GGUF_TYPES[kind].bits) for name, (kind, _) in GGUF_NAMES.items()},
}


def test_names_family_bits_and_json_options():
    assert set(QUANTIZER_NAMES) == set(EXPECTED)
    for name, (family, bits) in EXPECTED.items():
        q = get_quantizer(name)
        assert (q.name, q.family, q.bits) == (name, family, float(bits))
        assert json.loads(json.dumps(q.options)) == q.options
        assert q.options["device"] == "auto"
        if family != "gguf":  # llama.cpp quantizes what llama.cpp quantizes (the embeddings and the head too)
            assert q.options["modules"] == list(quantize.DEFAULT_MODULES)
        assert (q.options.get("calibration_source") == "heldout") is (q.calibrated is True)
    assert {"gguf-q8_0", "gguf-q6_k", "gguf-q5_k_m", "gguf-q4_k_m", "gguf-q3_k_m", "gguf-q2_k", "gguf-iq4_xs"} <= set(
        QUANTIZER_NAMES
    )
    # types llama.cpp refuses to make without an importance matrix exist only with one; Q8_0 ignores one
    assert "gguf-iq2_xxs" not in QUANTIZER_NAMES and "gguf-iq2_xxs-imatrix" in QUANTIZER_NAMES
    assert "gguf-q8_0-imatrix" not in QUANTIZER_NAMES and "gguf-q4_k_m-imatrix" in QUANTIZER_NAMES
    assert get_quantizer("hqq-4").options["group_size"] == 64
    assert get_quantizer("gptq-4", group_size=32, calibration_samples=8).options["calibration_samples"] == 8


@pytest.mark.parametrize(
    "name, options, fragments",
    [
        ("hqq-4", {"group_sz": 64}, ["group_sz", "64", "group_size"]),
        ("hqq-4", {"group_size": 60}, ["group_size", "60", "multiple of 8"]),
        ("hqq-4", {"device": "tpu"}, ["device", "'tpu'", "cuda"]),
        ("bnb-nf4", {"blocksize": 48}, ["blocksize", "48", "64"]),
        ("bnb-nf4", {"double_quant": 1}, ["double_quant", "1", "true or false"]),
        ("bnb-int8", {"mode": "fake"}, ["mode", "'fake'", "real"]),
        ("gptq-4", {"calibration_samples": 0}, ["calibration_samples", "0", "positive"]),
        ("sign", {"modules": "layers"}, ["modules", "'layers'", "regular expressions"]),
        ("uniform-3", {"scale": "absmean"}, ["scale", "allowed options"]),
    ],
)
def test_bad_options_name_key_value_and_allowed(name, options, fragments):
    with pytest.raises(QuantizationError) as err:
        get_quantizer(name, **options)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_unknown_name_lists_allowed():
    with pytest.raises(QuantizationError, match="bnb-3.*allowed.*bnb-nf4"):
        get_quantizer("bnb-3")


def test_import_does_not_load_backends():
    code = (
        "import sys, llmaudit, llmaudit.quantize as q; q.list_quantizers(); q.get_quantizer('hqq-4'); "
        "q.get_quantizer('gguf-q4_k_m-imatrix'); q.get_quantizer('awq-4'); "
        "bad = [m for m in ('hqq', 'bitsandbytes', 'gptqmodel', 'auto_gptq', 'llama_cpp', 'gguf') if m in sys.modules]; "
        "assert not bad, bad"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize(
    "name, library, hint, options",
    [
        ("hqq-4", "hqq", "pip install 'llmaudit[hqq]'", {}),
        ("bnb-nf4", "bitsandbytes", "pip install 'llmaudit[bnb]'", {}),
        ("gptq-4", "gptqmodel", "pip install 'llmaudit[gptq]'", {"solver": "gptqmodel"}),
        ("awq-4", "gptqmodel", "pip install 'llmaudit[gptq]'", {}),
        ("gguf-q4_k_m", "llama_cpp", "pip install 'llmaudit[llamacpp]'", {}),
    ],
)
def test_missing_library_is_reported_with_install_hint(monkeypatch, name, library, hint, options):
    monkeypatch.setattr(base, "library_available", lambda module: module != library)
    with pytest.raises(QuantizationError) as err:
        get_quantizer(name, **options).check()
    assert library in str(err.value) and hint in str(err.value)
    info = {i.name: i for i in list_quantizers()}
    if options:  # gptq's default on a CPU is llmaudit's own solver, which needs no library
        assert info[name].available is (get_quantizer(name).library is None)
    else:
        assert info[name].available is False and hint in info[name].reason
    assert info["uniform-4"].available is True and info["uniform-4"].reason is None
    # nothing was modified: the model given to quantize_model is refused before any work
    model = build_tiny("qwen2")
    before = model.model.layers[0].mlp.up_proj.weight.clone()
    with pytest.raises(QuantizationError):
        get_quantizer(name, **options).quantize_model(model)
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, before)


def test_cuda_requested_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(QuantizationError, match="device='cuda'.*no CUDA GPU.*device='cpu'"):
        get_quantizer("hqq-4", device="cuda").check()
    assert get_quantizer("hqq-4").device.type == "cpu"
    assert {i.name: i for i in list_quantizers()}["hqq-4"].available is True


def test_group_size_not_dividing_input_width():
    model = build_tiny("qwen2")  # input widths 64 (attention, up/gate) and 128 (down_proj)
    for name in ("hqq-4", "gptq-4"):
        get_quantizer(name, group_size=64).check(model)
        with pytest.raises(QuantizationError) as err:
            get_quantizer(name, group_size=48).check(model)
        assert "group_size=48" in str(err.value) and "input width 64" in str(err.value)
    with pytest.raises(QuantizationError, match="group_size=128.*input width 64"):
        get_quantizer("gptq-4").check(model)  # gptq's default group size 128 does not fit a 64-wide layer


def test_scope_matching_nothing_and_custom_scope():
    model = build_tiny("llama")
    with pytest.raises(QuantizationError, match="matches no linear layer"):
        get_quantizer("hqq-4", modules=[r"encoder\.block"]).check(model)
    q = get_quantizer("uniform-4", modules=[r"mlp\.down_proj$"], device="cpu")
    up_before = model.model.layers[0].mlp.up_proj.weight.clone()
    out = q.quantize_model(model)
    assert torch.equal(out.model.layers[0].mlp.up_proj.weight, up_before)
    assert len(torch.unique(out.model.layers[1].mlp.down_proj.weight)) <= 2 * (2**3 + 1) + 1


def test_gptq_requires_tokenizer_and_texts():
    with pytest.raises(QuantizationError, match="tokenizer= and calibration_texts="):
        get_quantizer("gptq-4", group_size=32).calibration_batch(None, ["a"])


def test_gptq_calibration_sampling(tokenizer, texts):
    q = get_quantizer("gptq-4", calibration_samples=5, calibration_max_length=7, seed=3)
    first = q.calibration_batch(tokenizer, texts)
    assert len(first) == 5 and all(len(s["input_ids"]) == 7 == sum(s["attention_mask"]) for s in first)
    assert first == q.calibration_batch(tokenizer, texts)  # seeded
    other = get_quantizer("gptq-4", calibration_samples=5, calibration_max_length=7, seed=4)
    assert other.calibration_batch(tokenizer, texts) != first
    everything = get_quantizer("gptq-4", calibration_samples=1000).calibration_batch(tokenizer, texts)
    assert len(everything) == len(texts)
