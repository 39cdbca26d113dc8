"""Full-precision references: fp32, bf16, fp16.

``mode``:
- ``"fake"``: the in-scope weights are rounded to the dtype and stored back in the model's dtype
  (exactly the values a bf16/fp16 checkpoint holds; compute stays fp32). Same scope as every other
  quantizer, so the rows of a quantizer grid differ only by the rule applied to the same weights.
- ``"native"``: the whole model is cast to the dtype (what a real bf16/fp16 deployment runs, including
  embeddings, norms and head; activations in the dtype).
- ``"auto"`` (default): fake on CPU (where bf16 matmuls are slower without native support), native on GPU.

Bits accounting: 32 or 16 bits per weight, no metadata.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import Quantizer, choice, common_options, target_modules

FULL_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FULL_PRECISION_NAMES = (*FULL_DTYPES, "fp", "full", "full_precision", "none", "unquantized")
"""Names read as the full-precision reference column (the registry's plus spellings other tools use in
their loss tables)."""


def full_precision_reference(names) -> str | None:
    """The full-precision reference among quantizer names.

    Args:
        names: quantizer names.

    Returns:
        The first whose lower-cased name is in FULL_PRECISION_NAMES, or None when every one of them quantizes.
    """
    return next((q for q in names if str(q).lower() in FULL_PRECISION_NAMES), None)


def missing_reference(names) -> str | None:
    """Why a grid of quantizers cannot be audited: no full-precision reference among them (the base unit, the utility
    and every comparison are measured against the fine-tune at full precision).

    Args:
        names: quantizer names.

    Returns:
        None when a reference is there, else the reason with the fix.
    """
    names = [str(q) for q in names]
    if full_precision_reference(names) is not None:
        return None
    return (
        f"score.quantizers {names} has no full-precision reference, which every quantizer is compared with: add "
        f"`full` (the store's own precision), e.g. 'score.quantizers=[full,{','.join(names)}]'"
    )


class FullPrecision(Quantizer):
    family = "full"
    install_hint = None
    tracked_libraries = ()
    gpu_seconds_per_layer = 0.0
    shares_calibration = None

    def __init__(self, name: str, **options):
        self.dtype = FULL_DTYPES[name]
        spec = common_options()
        spec["mode"] = choice("auto", ("auto", "fake", "native"))
        super().__init__(name, torch.finfo(self.dtype).bits, spec, options)

    @property
    def resolved_mode(self) -> str:
        """The mode the ``mode`` option resolves to: "auto" is fake (the in-scope weights rounded to the dtype) on a CPU, native on a GPU."""
        if self.options["mode"] != "auto":
            return self.options["mode"]
        return "fake" if self.device.type == "cpu" else "native"

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        """Bits per weight of a layer: the dtype's width, no metadata.

        Args:
            in_features: the layer's input width.
            out_features: the layer's output width.

        Returns:
            Bits per weight.
        """
        return float(torch.finfo(self.dtype).bits)

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        if self.resolved_mode == "native":
            return model.to(self.dtype)
        for _, module in target_modules(model, self.options["modules"]):
            module.weight.data = module.weight.data.to(self.dtype).to(module.weight.dtype)
        return model
