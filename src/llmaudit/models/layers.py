"""The parts of a causal LM the engines call directly, and parameter counts."""

from __future__ import annotations

from typing import Any, NamedTuple


def decoder_and_head(model: Any) -> tuple[Any, Any]:
    """The transformer body and the output head of a causal LM (peft wrappers unwrapped).

    Calling the body, then the head on the scored positions only, avoids materialising [B, T, V] logits."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else base.model
    head = base.get_output_embeddings()
    if decoder is None or head is None:
        raise TypeError(f"{type(base).__name__} is not a causal LM with a decoder body and an output head")
    return decoder, head


class ParameterCount(NamedTuple):
    trainable: int
    total: int


def count_parameters(model: Any) -> ParameterCount:
    """Trainable and total parameter counts (tied parameters counted once)."""
    params = list(model.parameters())
    return ParameterCount(sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params))


def cast_parameters(model: Any, dtype: Any) -> Any:
    """Cast every floating-point parameter of `model` to `dtype`, in place; returns the model.

    Buffers keep their dtype (rotary inverse frequencies stay float32: rounding them to bf16 would move every
    position's encoding), integer parameters (quantized codes, e.g. bitsandbytes' int8 weights) are left alone,
    and tied parameters are cast once."""
    for param in model.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
    return model
