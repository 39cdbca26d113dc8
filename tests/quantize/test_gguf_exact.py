"""The GGUF quantizers are llama.cpp's, tensor by tensor: a tiny Llama and a tiny Qwen2 built here are quantized by
llama.cpp's own path (its converter `convert_hf_to_gguf.py` to float32, then `llama_model_quantize`, the function of
the `llama-quantize` tool) and by llmaudit's quantizer; every tensor must get the same GGUF type and the same bytes,
and the weights llmaudit scores with must be ggml's own dequantization of those bytes.

The converter comes from llama.cpp's source tree: $LLMAUDIT_LLAMA_CPP_SRC (the `vendor/llama.cpp` directory of the
llama-cpp-python source distribution; `.ci/run` sets it). Without llama-cpp-python or that tree these tests are skipped
with the reason, unless LLMAUDIT_LLAMA_CPP_REQUIRED=1 (CI), which makes that an error.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from llmaudit.quantize import QuantizationError, get_quantizer
from llmaudit.quantize.gguf_backend import GGUF_NAMES
from tests.tiny_models import tiny_causal_lm

REQUIRED = os.environ.get("LLMAUDIT_LLAMA_CPP_REQUIRED") == "1"


def _missing() -> str | None:
    from llmaudit.quantize import llama_cpp_lib

    reason = llama_cpp_lib.availability()
    if reason:
        return reason
    src = os.environ.get("LLMAUDIT_LLAMA_CPP_SRC")
    if not src or not (Path(src) / "convert_hf_to_gguf.py").is_file():
        return "LLMAUDIT_LLAMA_CPP_SRC does not name llama.cpp's source tree (convert_hf_to_gguf.py)"
    return None


if _missing():
    if REQUIRED:
        raise RuntimeError(f"LLMAUDIT_LLAMA_CPP_REQUIRED=1 but {_missing()}")
    pytest.skip(_missing(), allow_module_level=True)

from llmaudit.quantize import llama_cpp_lib  # noqa: E402

# The converter with its vocabulary step left out: the tiny models have a word-level tokenizer the converter does not
# know, and llama_model_quantize never reads a vocabulary (the bytes compared cannot depend on it).
CONVERT = """
import sys
sys.path.insert(0, sys.argv[1])
import convert_hf_to_gguf as convert
from conversion.llama import LlamaModel
from conversion.qwen import Qwen2Model
for cls in (LlamaModel, Qwen2Model):
    cls.set_vocab = lambda self: None
sys.argv = ["convert_hf_to_gguf.py", sys.argv[2], "--outtype", "f32", "--outfile", sys.argv[3]]
convert.main()
"""


def tiny(arch: str) -> transformers.PreTrainedModel:
    """Llama: widths that are multiples of 256 (the k-quant block), 4 layers (the mixes depend on the layer: Q4_K_M
    raises layers 2 and 3), GQA 4, tied embeddings (as SmolLM2). Qwen2: hidden 192, not a multiple of 256 (llama.cpp
    falls back to 32-blocks there), biases, an untied head."""
    if arch == "llama":
        return tiny_causal_lm(
            "llama", seed=7, hidden_size=256, intermediate_size=256, num_hidden_layers=4, num_key_value_heads=1,
            max_position_embeddings=256, tie_word_embeddings=True,
        )  # fmt: skip
    return tiny_causal_lm(
        "qwen2", seed=7, hidden_size=192, intermediate_size=256, num_hidden_layers=4, max_position_embeddings=256,
        tie_word_embeddings=False,
    )  # fmt: skip


def read_gguf(path: Path) -> dict[str, tuple[str, int, np.ndarray]]:
    import gguf

    out = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        rows = int(np.prod(t.shape[1:]))
        raw = np.array(t.data, copy=True).view(np.uint8).reshape(rows, -1)
        out[t.name] = (gguf.GGMLQuantizationType(int(t.tensor_type)).name, int(t.tensor_type), raw)
    return out


class Reference:
    """llama.cpp's own path for one tiny model: converted once to float32, quantized per file type."""

    def __init__(self, arch: str, root: Path):
        self.model = tiny(arch)
        model_dir = root / arch
        self.model.save_pretrained(model_dir)
        self.f32 = root / f"{arch}-f32.gguf"
        result = subprocess.run(
            [sys.executable, "-c", CONVERT, os.environ["LLMAUDIT_LLAMA_CPP_SRC"], str(model_dir), str(self.f32)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        self.f32_tensors = read_gguf(self.f32)
        self.root = root

    def quantize(self, kind: str, ftype: int, imatrix) -> dict[str, tuple[str, int, np.ndarray]]:
        target = self.root / f"ref-{kind}-{imatrix is not None}.gguf"
        llama_cpp_lib.quantize_file(self.f32, target, ftype=ftype, imatrix=imatrix, threads=2)
        return read_gguf(target)

    def row_order(self, name: str, weight: torch.Tensor) -> np.ndarray:
        """order[i] = the row of the Hugging Face weight that the converter wrote as row i (the converter permutes
        Llama's attn_q / attn_k rows into llama.cpp's rotary layout; every other tensor keeps its order)."""
        converted = self.f32_tensors[name][2].view(np.float32)
        original = weight.detach().numpy()
        index = {row.tobytes(): i for i, row in enumerate(original)}
        order = np.array([index[row.tobytes()] for row in converted])
        assert sorted(order.tolist()) == list(range(len(original)))
        return order


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-exact")
    return {arch: Reference(arch, root) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def calibration():
    g = torch.Generator().manual_seed(3)
    return [" ".join(f"w{int(i)}" for i in torch.randint(0, 500, (40,), generator=g)) for _ in range(12)]


def _imatrix(quantizer, model, tokenizer, calibration):
    if not quantizer.with_imatrix:
        return None
    return quantizer.importance_matrix(model, tokenizer=tokenizer, calibration_texts=calibration)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("name", sorted(GGUF_NAMES))
def test_types_and_bytes_equal_llama_cpp(references, tokenizer, calibration, arch, name):
    ref = references[arch]
    quantizer = get_quantizer(name, device="cpu")
    model = copy.deepcopy(ref.model)
    imatrix = _imatrix(quantizer, model, tokenizer, calibration)
    expected = ref.quantize(quantizer.kind, quantizer.spec.ftype, imatrix)
    mine = quantizer.quantize_blocks(model, imatrix)
    # every tensor llama.cpp quantized, and nothing else (norms and biases stay float32 in every type)
    assert {t.name for t in mine} == {n for n, (type_name, _, _) in expected.items() if type_name != "F32"}
    for tensor in mine:
        type_name, _, raw = expected[tensor.name]
        assert tensor.type_name == type_name, tensor.name
        weight = model.get_submodule(tensor.module).weight
        rows = tensor.raw.reshape(weight.shape[0], -1)[ref.row_order(tensor.name, weight)]
        assert np.array_equal(rows, raw), f"{tensor.name} ({type_name}): bytes differ from llama.cpp's"


@pytest.mark.parametrize(
    "arch, name, expected_types",
    [
        ("llama", "gguf-q4_k_m", {"Q4_K", "Q6_K"}),  # the mix: Q6_K on some attn_v / ffn_down and on the head
        ("llama", "gguf-q3_k_m-imatrix", {"Q3_K", "Q4_K", "Q5_K", "Q6_K"}),
        ("qwen2", "gguf-q4_k_m", {"Q5_0", "Q4_K", "Q6_K", "Q8_0"}),  # width 192: Q4_K -> Q5_0, Q6_K -> Q8_0
        ("qwen2", "gguf-iq4_xs", {"IQ4_NL", "IQ4_XS", "Q8_0"}),  # width 192: IQ4_XS -> IQ4_NL, the head Q6_K -> Q8_0
    ],
)
def test_the_weights_scored_are_ggml_dequantization_of_those_bytes(
    references, tokenizer, calibration, arch, name, expected_types
):
    ref = references[arch]
    quantizer = get_quantizer(name, device="cpu")
    model = copy.deepcopy(ref.model)
    imatrix = _imatrix(quantizer, model, tokenizer, calibration)
    expected = ref.quantize(quantizer.kind, quantizer.spec.ftype, imatrix)
    original = {n: m.weight.detach().clone() for n, m in model.named_modules() if hasattr(m, "weight")}
    quantized = quantizer.quantize_model(model, imatrix=imatrix)
    assert set(quantizer.tensor_types().values()) == expected_types
    changed = 0
    for module_name, record in quantizer.tensors.items():
        gguf_name = record.name
        _, type_id, raw = expected[gguf_name]
        weight = quantized.get_submodule(module_name).weight.detach()
        order = ref.row_order(gguf_name, original[module_name])
        values = llama_cpp_lib.dequantize(type_id, raw, weight.numel()).reshape(weight.shape)
        restored = np.empty_like(values)
        restored[order] = values
        assert np.array_equal(weight.numpy(), restored), module_name
        changed += int(not torch.equal(weight, original[module_name]))
    assert changed == len(quantizer.tensor_types())  # every tensor llama.cpp quantized moved
    if arch == "llama":  # tied: the output head reads the embeddings' blocks
        assert quantized.lm_head.weight is quantized.model.embed_tokens.weight


def test_effective_bits_and_size_are_the_files(references):
    ref = references["llama"]
    quantizer = get_quantizer("gguf-q8_0", device="cpu")
    model = quantizer.quantize_model(copy.deepcopy(ref.model))
    # Q8_0: 34 bytes per 32 values everywhere (the head/embeddings too: Q8_0 is never raised to Q6_K)
    assert quantizer.effective_bits(model) == pytest.approx(8.5)
    norms = sum(p.numel() * 4 for n, p in model.named_parameters() if "norm" in n)
    weights = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n)
    assert quantizer.model_size_bytes(model) == weights * 34 // 32 + norms


def test_rotary_rows_are_the_converters_layout(references):
    from llmaudit.quantize.given import rotary_rows

    ref = references["llama"]
    for layer in range(2):
        attn = ref.model.model.layers[layer].self_attn
        for gguf, module, heads in (("attn_q", attn.q_proj, 4), ("attn_k", attn.k_proj, 1)):
            order = ref.row_order(f"blk.{layer}.{gguf}.weight", module.weight)
            assert order.tolist() == rotary_rows(module.weight.shape[0], heads).tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_users_own_gguf_is_scored_as_llmaudits_quantization_of_it(references, arch):
    """A .gguf made by llama.cpp's converter + quantizer of the checkpoint is read back (un-permuted) into exactly
    the weights llmaudit's own gguf-q4_k_m gives; another model's file is refused."""
    from llmaudit.quantize.given import load_gguf

    ref = references[arch]
    path = ref.root / f"user-{arch}.gguf"
    llama_cpp_lib.quantize_file(ref.f32, path, ftype=15, imatrix=None, threads=2)  # Q4_K_M, llama.cpp's own file
    given = load_gguf(path, copy.deepcopy(ref.model), "gguf-q4_k_m")
    own = get_quantizer("gguf-q4_k_m", device="cpu").quantize_model(copy.deepcopy(ref.model))
    for (name, a), (_, b) in zip(given.named_parameters(), own.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    other = "qwen2" if arch == "llama" else "llama"
    with pytest.raises(QuantizationError, match="architecture"):
        load_gguf(path, copy.deepcopy(references[other].model), "gguf-q4_k_m")
    stranger = tiny(arch)
    torch.manual_seed(99)
    for p in stranger.parameters():
        torch.nn.init.normal_(p, std=0.02)
    with pytest.raises(QuantizationError, match="not a quantization of this checkpoint"):
        load_gguf(path, stranger, "gguf-q4_k_m")
