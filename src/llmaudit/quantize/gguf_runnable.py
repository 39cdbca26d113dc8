"""A Hugging Face decoder as a GGUF file llama.cpp runs: every tensor, in the converter's layout.

``gguf_layout.write_source_gguf`` writes only what ``llama_model_quantize`` reads; this module writes the whole model
as ``convert_hf_to_gguf.py --outtype f32`` does, so that llama.cpp can load and evaluate it (the llama.cpp scoring
engine, ``llmaudit.score.llama_cpp_engine``) and ``llama_model_quantize`` can turn it into the quantized file a
llama.cpp user runs:

- every parameter under gguf-py's tensor names (norms and biases included), float32; the output head only when it is
  not tied to the embeddings;
- Llama's (and Mistral's) attn_q / attn_k rows permuted into llama.cpp's rotary layout, as the converter permutes
  them (``given.rotary_rows``); Qwen2 keeps its order (llama.cpp applies NeoX rotary to it);
- the converter's hyper-parameters for these architectures: block count, context, widths, heads, RMS epsilon, rotary
  base, dimension and scaling (linear; Llama 3's frequency factors as the ``rope_freqs`` tensor), vocabulary size;
- no tokenizer: ``tokenizer.ggml.model = "none"`` with the vocabulary size. llmaudit hands llama.cpp token ids
  (its own chat template and tokenizer made them, the same ids the torch engine scores), so llama.cpp never
  tokenizes; ``vocabulary`` copies the tokenizer of another GGUF file instead (``tokenizer.*`` keys), for a file
  that llama.cpp's own tools should tokenize text with.

``tests/quantize/test_gguf_runnable.py`` compares the tensors and keys with the converter's file and llama.cpp's
logits with the torch model's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .base import QuantizationError
from .gguf_layout import architecture, write_shape_keys
from .given import rotary_rows

SUPPORTED_ROPE = ("default", "linear", "llama3")


def _rope_parameters(config: Any) -> dict[str, Any]:
    """The rotary settings of a transformers config (``rope_parameters``, or the older ``rope_theta`` /
    ``rope_scaling``), with ``rope_type`` filled in."""
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type") or "default")
    return params


def check_runnable(model: nn.Module) -> None:
    """Refuse a model llmaudit cannot write as a GGUF that llama.cpp runs.

    Args:
        model: the model.

    Raises:
        QuantizationError: its architecture, or a rotary scaling the converter handles in ways llmaudit does not.
    """
    architecture(model)
    rope = _rope_parameters(model.config)
    if str(rope["rope_type"]).lower() not in SUPPORTED_ROPE:
        raise QuantizationError(
            f"the llama.cpp scoring engine writes models with rotary scaling {list(SUPPORTED_ROPE)}; this model's is "
            f"{rope['rope_type']!r}; fix: score it with score.engine=torch"
        )
    if getattr(model.config, "use_sliding_window", False):
        raise QuantizationError(
            "the llama.cpp scoring engine does not write sliding-window attention; fix: score.engine=torch"
        )


def head_dim(config: Any) -> int:
    """The width of one attention head.

    Args:
        config: the model's Hugging Face config.

    Returns:
        Its ``head_dim``, else hidden_size // num_attention_heads.
    """
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def _llama3_factors(rope: dict[str, Any], dim: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``rope_freqs`` of a Llama 3 rotary scaling (one factor per frequency)."""
    freqs = 1.0 / (float(rope.get("rope_theta", 10000.0)) ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:  # float32 tensors, as the converter computes them
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def _hyper_parameters(writer, config: Any) -> np.ndarray | None:
    """The keys convert_hf_to_gguf.py writes for Llama / Qwen2 (LlamaModel / Qwen2Model.set_gguf_parameters);
    returns Llama 3's rope_freqs tensor when the scaling has one."""
    import gguf

    write_shape_keys(writer, config)
    rope = _rope_parameters(config)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    dim = head_dim(config)
    writer.add_key_length(dim)
    writer.add_value_length(dim)
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_rope_dimension_count(dim)
    kind = str(rope["rope_type"]).lower()
    if kind == "linear" and rope.get("factor") is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    writer.add_file_type(0)  # ALL_F32
    return _llama3_factors(rope, dim) if kind == "llama3" else None


def _tensors(model: nn.Module, arch: str) -> dict[str, np.ndarray]:
    """{GGUF name: float32 array} of every parameter, in the converter's layout."""
    import gguf

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch], int(config.num_hidden_layers))
    tied = bool(getattr(config, "tie_word_embeddings", False))
    out: dict[str, np.ndarray] = {}
    for hf_name, param in model.named_parameters():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise QuantizationError(f"{hf_name}: gguf-py's name map has no GGUF name for it (a renamed module?)")
        if gguf_name == "output.weight" and tied:
            continue
        values = param.detach().to(device="cpu", dtype=torch.float32)
        if arch == "LLAMA" and gguf_name.endswith(("attn_q.weight", "attn_q.bias", "attn_k.weight", "attn_k.bias")):
            heads = config.num_attention_heads if ".attn_q." in gguf_name else config.num_key_value_heads
            values = values[rotary_rows(values.shape[0], int(heads))]
        out[gguf_name] = values.contiguous().numpy()
    return out


ADD_BOS_KEY = "tokenizer.ggml.add_bos_token"


def copy_vocabulary(writer, source: str | Path, skip: tuple[str, ...] = ()) -> None:
    """Copy every ``tokenizer.*`` key of a GGUF file (its tokenizer, as llama.cpp's tools read it).

    Args:
        writer: the gguf-py ``GGUFWriter`` written to.
        source: the GGUF file read.
        skip: keys not copied.
    """
    import gguf

    reader = gguf.GGUFReader(str(source))
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.") and key not in skip:
            kind = field.types[0]
            sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(key, field.contents(), kind, sub_type=sub_type)


def write_runnable_gguf(
    model: nn.Module, path: str | Path, *, vocabulary: str | Path | None = None, add_bos: bool | None = None
) -> Path:
    """``model`` as the float32 GGUF llama.cpp loads and runs (module docstring) at ``path``.

    Args:
        model: a Hugging Face Llama, Mistral or Qwen2 causal LM (any device and dtype; written as float32).
        path: the file to write.
        vocabulary: a GGUF file whose tokenizer keys to copy; None writes no tokenizer (llama.cpp is then given
            token ids only).
        add_bos: with a vocabulary, whether its tokenizer adds BOS (tokenizer.ggml.add_bos_token), None: as the
            file says.

    Returns:
        The path written.

    Raises:
        QuantizationError: an architecture or rotary scaling the llama.cpp engine does not write.
    """
    import gguf

    check_runnable(model)
    arch = architecture(model)
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[arch]])
    factors = _hyper_parameters(writer, model.config)
    if vocabulary is None:
        writer.add_tokenizer_model("none")
    else:
        copy_vocabulary(writer, vocabulary, skip=(ADD_BOS_KEY,) if add_bos is not None else ())
        if add_bos is not None:
            writer.add_add_bos_token(bool(add_bos))
    tensors = _tensors(model, arch)
    if factors is not None:
        tensors = {"rope_freqs.weight": factors} | tensors
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
