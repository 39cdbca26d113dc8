"""HQQ (half-quadratic quantization) through hqq's own API: ``hqq.core.quantize.HQQLinear`` applied
to each in-scope linear layer (the per-layer form of ``AutoHQQHFModel.quantize_model``, which lets the
``modules`` scope be honoured exactly; transformers 5's ``HqqConfig`` is a stub).

``mode``:
- ``"real"``: the layers become ``HQQLinear`` modules (compute dtype fp32 on CPU, bf16 on GPU).
- ``"fake"``: each layer is replaced by an ``nn.Linear`` holding the dequantized HQQ weight. HQQLinear's
  PyTorch forward is exactly ``x @ dequantize().T + bias``, so the losses are the same (a test keeps
  proving it); the plain Linear is faster to score. On CPU the weight comes from ``hqq_fast`` (the same
  arithmetic as ``HQQLinear(...).dequantize()`` at compute dtype float32, bit-identical and tested, and faster:
  docs/results.md); on a GPU, and through
  ``quantize_model_with_hqqlinear``, from ``HQQLinear`` itself.
- ``"auto"`` (default): fake on CPU, real on GPU.

``axis`` (default 1, hqq's default): 1 = groups of ``group_size`` consecutive input columns of a row,
0 = groups along the output dimension. ``optimize`` (default True, hqq's default): HQQ's half-quadratic
refinement of the zero points; False = plain round-to-nearest with min-max zero and scale. Measured on
SmolLM2-135M-Instruct dequantized from GGUF Q4_1 (docs/results.md): the base weights already sit on a
4-bit grid of 32-column blocks, so group_size 32 with axis 1 reproduces them almost exactly, while
group_size 64 breaks that grid; there hqq's optimizer costs more than plain rounding.

hqq stores the codes bit-packed along the grouped matrix's rows (out*in/group_size of them for axis 1):
8 per byte for 1 bit, 4 for 2 bits, 2 for 4 bits. A layer whose row count is not a multiple of that cannot
be stored (hqq's dequantize fails on it), so it is refused before any work, in every mode.

Bits accounting: nbits per weight + one scale and one zero per group of ``group_size`` weights,
each counted at 16 bits (the dtype hqq checkpoints store them in): nbits + 32 / group_size
(e.g. hqq-4 with group_size 64: 4.5 bits).
"""

from __future__ import annotations

import torch
from torch import nn

from . import hqq_fast
from .base import (
    QuantizationError,
    Quantizer,
    boolean,
    check_group_size,
    choice,
    common_options,
    integer,
    linear_from_weight,
    replace_each,
    require_linear,
    target_modules,
)

HQQ_BITS = {"hqq-1": 1, "hqq-2": 2, "hqq-3": 3, "hqq-4": 4, "hqq-8": 8}
# Codes per packed row group: hqq packs 8 1-bit, 4 2-bit or 2 4-bit rows together (3 bits pad, 8 bits do not pack).
PACKED_ROWS = {1: 8, 2: 4, 4: 2}


class HQQQuantizer(Quantizer):
    family = "hqq"
    library = "hqq"
    install_hint = "pip install 'llmaudit[hqq]'"
    tracked_libraries = ("hqq",)
    gpu_seconds_per_layer = 0.3
    shares_calibration = None

    def __init__(self, name: str, **options):
        self.nbits = HQQ_BITS[name]
        spec = common_options()
        spec["group_size"] = integer(
            64, "a positive multiple of 8 dividing each layer's input width", lambda g: g > 0 and g % 8 == 0
        )
        spec["axis"] = choice(1, (1, 0))
        spec["optimize"] = boolean(True)
        spec["mode"] = choice("auto", ("auto", "fake", "real"))
        super().__init__(name, self.nbits, spec, options)

    def _check_layer(self, name: str, module: nn.Module) -> None:
        require_linear(self.name, name, module)
        group_size = self.options["group_size"]
        check_group_size(self.name, name, module.in_features, group_size)
        rows = module.out_features * module.in_features // group_size
        pack = PACKED_ROWS.get(self.nbits, 1)
        if self.options["axis"] == 1 and rows % pack:
            raise QuantizationError(
                f"{self.name}: layer '{name}' ({module.out_features}x{module.in_features}) has {rows} groups of "
                f"{group_size}, which hqq cannot pack {pack} to a byte; fix: pass axis=0, a group_size giving "
                f"a multiple of {pack} groups, or restrict modules="
            )

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        """Bits per weight of a layer: the code width plus a 16-bit scale and a 16-bit zero point per group.

        Args:
            in_features: the layer's input width.
            out_features: the layer's output width.

        Returns:
            Bits per weight.
        """
        return self.nbits + 32.0 / self.options["group_size"]

    def quantize_model_with_hqqlinear(self, model: nn.Module) -> nn.Module:
        """The model quantized one layer at a time by hqq's own ``HQQLinear`` in every mode (fake: its ``dequantize()``):
        the reference the fast CPU path is tested against and the baseline of benchmarks/bench_hqq.py.

        Args:
            model: the model (quantized in place).

        Returns:
            The quantized model.

        Raises:
            QuantizationError: the request is refused by `check`.
        """
        self.check(model)
        model.eval()
        model.to(self.device)
        with torch.no_grad():
            out = self._quantize_hqqlinear(model)
        return out.eval()

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        if self.resolved_mode != "fake" or self.device.type != "cpu":
            return self._quantize_hqqlinear(model)
        workspace = hqq_fast.Workspace()
        o = self.options

        def fake(name: str, linear: nn.Module) -> nn.Linear:
            try:
                weight = hqq_fast.fake_quantize(
                    linear.weight, self.nbits, o["group_size"], o["axis"], o["optimize"], workspace=workspace
                )
            except QuantizationError as exc:
                raise QuantizationError(f"{self.name}: layer '{name}': {exc}") from None
            return linear_from_weight(weight, linear.bias, self.compute_dtype)

        replace_each(model, target_modules(model, o["modules"]), fake)
        return model

    def _quantize_hqqlinear(self, model: nn.Module) -> nn.Module:
        from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

        quant_config = BaseQuantizeConfig(
            nbits=self.nbits, group_size=self.options["group_size"], axis=self.options["axis"]
        )
        quant_config["weight_quant_params"]["optimize"] = self.options["optimize"]
        device = str(self.device)
        dtype = self.compute_dtype
        fake = self.resolved_mode == "fake"

        def make(name: str, linear: nn.Module) -> nn.Module:
            linear = linear.to(dtype)
            hqq_linear = HQQLinear(linear, quant_config, compute_dtype=dtype, device=device, del_orig=not fake)
            return linear_from_weight(hqq_linear.dequantize(), linear.bias, dtype) if fake else hqq_linear

        replace_each(model, target_modules(model, self.options["modules"]), make)
        if self.device.type != "cpu":
            # Modules outside the scope (embeddings, norms, head) follow the compute dtype too.
            for _, param in model.named_parameters():
                param.data = param.data.to(dtype)
        return model
