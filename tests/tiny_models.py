"""The one builder of the tiny transformers models the tests use (nothing is downloaded): a Qwen2 or Llama decoder
with small defaults, each test naming only what it needs to differ (widths a quantizer requires, a vocabulary)."""

from __future__ import annotations

import torch
import transformers

DEFAULTS = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=128,
)

ARCHITECTURES = {
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
}


def tiny_config(arch: str = "qwen2", **overrides) -> transformers.PretrainedConfig:
    """The config of a tiny `arch` decoder: DEFAULTS with `overrides`."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}; got {arch!r}")
    return ARCHITECTURES[arch][0](**(DEFAULTS | overrides))


def tiny_causal_lm(arch: str = "qwen2", *, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
    """A tiny `arch` decoder initialised from `seed` (torch's global generator), in eval mode."""
    torch.manual_seed(seed)
    return ARCHITECTURES[arch][1](tiny_config(arch, **overrides)).eval()
