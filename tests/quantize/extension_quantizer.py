"""A quantizer added in one module: its class states its facts and registers itself (docs/architecture.md,
"Adding a quantizer"). Round-to-nearest per row: each weight row scaled by its largest magnitude onto the
2^(b-1) - 1 levels either side of zero (symmetric absmax), fake-quantized in place."""

from __future__ import annotations

import torch
from torch import nn

from llmaudit.quantize import register_quantizer
from llmaudit.quantize.base import Quantizer, common_options, target_modules

ROUND_BITS = {"round-3": 3}


class RoundQuantizer(Quantizer):
    """Symmetric round-to-nearest with one absmax scale per output row."""

    family = "round"
    install_hint = None  # pure torch
    tracked_libraries = ()
    gpu_seconds_per_layer = 0.05
    shares_calibration = None

    def __init__(self, name: str, **options):
        self.nbits = ROUND_BITS[name]
        super().__init__(name, self.nbits, common_options(), options)

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        """The code width plus one 32-bit scale per row shared by its ``in_features`` weights.

        Args:
            in_features: the layer's input width.
            out_features: the layer's output width.

        Returns:
            Bits per weight.
        """
        return self.nbits + 32.0 / in_features

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        levels = 2 ** (self.nbits - 1) - 1
        for _, module in target_modules(model, self.options["modules"]):
            w = module.weight.data.float()
            scale = w.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / levels
            module.weight.data = (torch.round(w / scale) * scale).to(module.weight.dtype)
        return model


register_quantizer(RoundQuantizer, ROUND_BITS)
