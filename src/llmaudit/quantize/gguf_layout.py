"""A Hugging Face decoder as the GGUF file llama.cpp's quantizer reads, and the quantized file back as weights.

``write_source_gguf`` writes, in float32, the tensors llama.cpp quantizes (the token embeddings, the output head when
it is not tied to them, and the 2-D weights of every block), under the names and with the hyper-parameters that
llama.cpp's ``convert_hf_to_gguf.py`` gives them (names through gguf-py's own ``TensorNameMap``). Norms and biases
stay float32 in every GGUF type, so they are not written. Two differences from a converted file do not change a
quantized byte, and the bit-exactness test (tests/quantize/test_gguf_exact.py) compares against the converter's file
itself:
- the rows of attn_q / attn_k are not permuted into llama.cpp's rotary layout (the converter does this for Llama):
  every GGUF type quantizes each row on its own, with an importance matrix per column, so a permutation of rows
  permutes the quantized rows and nothing else;
- no vocabulary is written: ``llama_model_quantize`` reads the hyper-parameters, never the vocabulary.

``read_quantized`` returns, per tensor, its GGUF type, its bytes and its weights dequantized by ggml's own
``to_float`` (llama_cpp_lib), in the Hugging Face layout [out_features, in_features].
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import llama_cpp_lib
from .base import QuantizationError

# Hugging Face model_type -> gguf-py MODEL_ARCH name, as convert_hf_to_gguf.py registers the architectures
# (MistralForCausalLM is converted by its LlamaModel class).
ARCHITECTURES = {"llama": "LLAMA", "mistral": "LLAMA", "qwen2": "QWEN2"}
_EMBEDDING = "token_embd.weight"
_OUTPUT = "output.weight"


@dataclass(frozen=True)
class GGUFTensor:
    """One quantized tensor: where its weights go in the model, its GGUF name and type, its bytes."""

    module: str
    """The nn.Module (nn.Linear or nn.Embedding) of the Hugging Face model whose weight this is."""
    name: str
    type_name: str
    type_id: int
    shape: tuple[int, int]
    """[out_features, in_features] (rows, columns)."""
    raw: np.ndarray
    """The tensor's bytes as llama.cpp wrote them (uint8)."""

    @property
    def n_bytes(self) -> int:
        """The tensor's size in the file, in bytes."""
        return int(self.raw.size)


def architecture(model: nn.Module) -> str:
    """The gguf-py MODEL_ARCH name of a model.

    Args:
        model: a Hugging Face causal LM.

    Returns:
        The architecture's name.

    Raises:
        QuantizationError: an architecture llmaudit cannot write (the message names the supported ones).
    """
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ARCHITECTURES:
        raise QuantizationError(
            f"the GGUF quantizers write the model as llama.cpp's converter does for {sorted(ARCHITECTURES)} "
            f"(Hugging Face model_type); this model is {model_type!r}; fix: quantize it with llama.cpp yourself and "
            "pass the .gguf as your own quantized file (llmaudit import --quantized NAME=FILE), or use another quantizer"
        )
    return ARCHITECTURES[model_type]


def _name_map(model: nn.Module):
    import gguf

    config = model.config
    return gguf.get_tensor_name_map(gguf.MODEL_ARCH[architecture(model)], int(config.num_hidden_layers))


def quantized_modules(model: nn.Module) -> dict[str, tuple[str, nn.Module]]:
    """The tensors llama.cpp quantizes: the embeddings, the output head unless it is tied to them, and every 2-D weight
    inside the blocks (nn.Linear).

    Args:
        model: the model.

    Returns:
        {GGUF tensor name: (module name, module)}.
    """
    names = _name_map(model)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    found: dict[str, tuple[str, nn.Module]] = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            continue
        gguf_name = names.get_name(f"{module_name}.weight", try_suffixes=(".weight",))
        if gguf_name is None:
            continue
        if gguf_name == _OUTPUT and tied:
            continue
        if gguf_name != _EMBEDDING and not gguf_name.startswith("blk.") and gguf_name != _OUTPUT:
            continue
        found[gguf_name] = (module_name, module)
    if _EMBEDDING not in found or not any(n.startswith("blk.") for n in found):
        raise QuantizationError(
            f"{type(model).__name__}: gguf-py's name map found no token embedding or no block weight "
            "(a renamed module?); fix: use a standard Hugging Face checkpoint of this architecture"
        )
    return found


def write_shape_keys(writer, config) -> None:
    """Write the model-shape keys convert_hf_to_gguf.py writes for Llama / Qwen2 (layers, context, widths, heads).

    Args:
        writer: a gguf-py ``GGUFWriter``.
        config: the model's Hugging Face config.
    """
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_context_length(int(getattr(config, "max_position_embeddings", 2048)))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads))


def _hyper_parameters(writer, config) -> None:
    """The keys convert_hf_to_gguf.py writes that llama.cpp's loader reads for these architectures."""
    write_shape_keys(writer, config)
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim != config.hidden_size // config.num_attention_heads:
        writer.add_key_length(int(head_dim))
        writer.add_value_length(int(head_dim))
    writer.add_rope_dimension_count(int(head_dim))
    writer.add_file_type(0)  # ALL_F32


def write_source_gguf(model: nn.Module, path: Path) -> dict[str, str]:
    """Write the float32 GGUF that llama_model_quantize reads.

    Args:
        model: the model.
        path: the file written.

    Returns:
        {GGUF name: module name} of the tensors it holds.
    """
    import gguf

    arch = architecture(model)
    modules = quantized_modules(model)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[arch]])
    _hyper_parameters(writer, model.config)
    for gguf_name, (_, module) in modules.items():
        weight = module.weight.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()
        writer.add_tensor(gguf_name, weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {name: module_name for name, (module_name, _) in modules.items()}


def read_quantized(path: Path, modules: dict[str, str]) -> Iterator[GGUFTensor]:
    """The tensors of a quantized file that ``modules`` names, with their bytes.

    Args:
        path: the quantized GGUF file.
        modules: {GGUF name: module name}.

    Yields:
        One `GGUFTensor` per named tensor.
    """
    import gguf

    reader = gguf.GGUFReader(str(path))
    seen = set()
    for tensor in reader.tensors:
        if tensor.name not in modules:
            continue
        seen.add(tensor.name)
        type_id = int(tensor.tensor_type)
        columns, rows = (int(n) for n in tensor.shape[:2])
        yield GGUFTensor(
            modules[tensor.name],
            tensor.name,
            gguf.GGMLQuantizationType(type_id).name,
            type_id,
            (rows, columns),
            np.array(tensor.data, copy=True).view(np.uint8).reshape(-1),  # a copy: the file is temporary
        )
    missing = sorted(set(modules) - seen)
    if missing:
        raise QuantizationError(f"llama.cpp's quantized file {path} lacks {missing[:3]}")


def dequantized_weight(tensor: GGUFTensor) -> torch.Tensor:
    """A tensor's weights as ggml reads them.

    Args:
        tensor: a quantized tensor of the file.

    Returns:
        float32 [out_features, in_features].
    """
    rows, columns = tensor.shape
    values = llama_cpp_lib.dequantize(tensor.type_id, tensor.raw, rows * columns)
    return torch.from_numpy(values.reshape(rows, columns))
