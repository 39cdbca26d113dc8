"""llama.cpp's importance matrix (the `llama-imatrix` tool), computed with a torch forward pass.

Definition (tools/imatrix/imatrix.cpp, ``collect_imatrix``; docs/science.md "GGUF quantizers"): for every weight
matrix W of a block that a matrix product applies to an input x (one row per token), the tool accumulates per input
column j the sum of squares S_j = sum_t x_{t,j}^2 and the number of token rows n; ``llama-quantize`` hands the
quantizer I_j = S_j / n (tools/quantize/quantize.cpp, ``load_imatrix``). Only weights of the blocks (``blk.*``) are
collected (the output head only with ``--process-output``; the token embedding is a lookup, not a product), so the
embeddings and the head are quantized without one, as by llama.cpp.

Differences from the tool, which change I only through the token stream it sees: the tool reads one text file as a
stream of n_ctx-token chunks (each begun with BOS) and ignores products over fewer than 16 tokens; llmaudit feeds each
calibration text as its own sequence (through the tokenizer, like GPTQ's calibration). Sums are accumulated in
float64 (the tool adds float32 values token by token). Given the same I, the quantized bytes are llama.cpp's
(``llama_model_quantize`` is called with it; tests/quantize/test_gguf_exact.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn


def importance(sum_squares: torch.Tensor, count: int) -> torch.Tensor:
    """The importance of each input column, I = S / n, as llama.cpp's imatrix stores it.

    Args:
        sum_squares: [in_features] the sum over token rows of x^2.
        count: the number of token rows.

    Returns:
        float32 [in_features]; all ones when no token was seen (as load_imatrix does for a zero count).
    """
    if count <= 0:
        return torch.ones_like(sum_squares, dtype=torch.float32)
    return (sum_squares.to(torch.float64) / count).to(torch.float32)


def collect_importance(
    model: nn.Module, modules: dict[str, str], samples: Iterable[Sequence[int]]
) -> dict[str, torch.Tensor]:
    """The importance of every named linear layer's input columns, from one forward pass per sample.

    Args:
        model: the model (unchanged).
        modules: {GGUF name: module name} of the block weights (each an nn.Linear).
        samples: token ids of each calibration sample.

    Returns:
        {GGUF name: I [in_features]} (`importance`).
    """
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    hooks = []

    def hook_for(gguf_name: str):
        def hook(_module, inputs, _output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).to(torch.float64)
            sums[gguf_name] = sums.get(gguf_name, 0) + (x * x).sum(dim=0)
            counts[gguf_name] = counts.get(gguf_name, 0) + x.shape[0]

        return hook

    for gguf_name, module_name in modules.items():
        module = model.get_submodule(module_name)
        if gguf_name.startswith("blk.") and isinstance(module, nn.Linear):
            hooks.append(module.register_forward_hook(hook_for(gguf_name)))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for ids in samples:
                model(input_ids=torch.tensor([list(ids)], device=device))
    finally:
        for handle in hooks:
            handle.remove()
        model.train(was_training)
    return {name: importance(sums[name].cpu(), counts[name]) for name in sums}
