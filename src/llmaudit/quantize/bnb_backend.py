"""bitsandbytes: NF4 / FP4 (4-bit blockwise, optional double quantization) and LLM.int8().

4-bit ``mode``:
- ``"real"``: the layers become ``bitsandbytes.nn.Linear4bit`` (compute dtype fp32 on CPU, bf16 on GPU).
  NOTE: on CPUs with AVX512-BF16, bitsandbytes' eval-time CPU path repacks the weight and runs a fused
  kernel that casts the activations to bf16, so "real" losses on such a CPU carry bf16 rounding.
- ``"fake"``: ``bitsandbytes.functional.quantize_4bit`` then ``dequantize_4bit`` into an fp32
  ``nn.Linear``. This equals Linear4bit's generic forward (dequantize, then an fp32 matmul) exactly;
  a test proves it.
- ``"auto"`` (default): fake on CPU, real on GPU.

int8 is always the real ``Linear8bitLt`` (``has_fp16_weights=False``, outlier ``threshold`` option,
default 6.0 as in transformers): LLM.int8() also quantizes the ACTIVATIONS row-wise at run time, so
quantizing only the weights would not give the same losses (measured: it does not). On a CPU each layer is
then an ``Int8Linear`` holding bitsandbytes' own codes and scales, whose forward makes bitsandbytes' CPU
operations in fewer passes: its outputs bit for bit (``bnb_int8``; tested against ``Linear8bitLt``).

Bits accounting: 4-bit: 4 + 32 / blocksize (one fp32 absmax per block); with double quantization the
absmax is stored in 8 bits plus one fp32 per 256 blocks: 4 + 8 / blocksize + 32 / (256 * blocksize).
int8: 8 + 32 / in_features (one fp32 scale per output row).
"""

from __future__ import annotations

from torch import Tensor, nn

from .base import (
    Quantizer,
    boolean,
    choice,
    common_options,
    linear_from_weight,
    real,
    replace_each,
    require_linear,
    target_modules,
)
from .bnb_int8 import Int8Linear

BNB_KINDS = {"bnb-nf4": ("nf4", 4), "bnb-fp4": ("fp4", 4), "bnb-int8": ("int8", 8)}
BLOCKSIZES = (64, 128, 256, 512, 1024, 2048, 4096)
DOUBLE_QUANT_BLOCKSIZE = 256  # bitsandbytes' blocksize for the nested (absmax) quantization


class BnbQuantizer(Quantizer):
    family = "bnb"
    library = "bitsandbytes"
    install_hint = "pip install 'llmaudit[bnb]'"
    tracked_libraries = ("bitsandbytes",)
    gpu_seconds_per_layer = 0.02
    shares_calibration = None

    def __init__(self, name: str, **options):
        self.kind, bits = BNB_KINDS[name]
        spec = common_options()
        if self.kind == "int8":
            spec["threshold"] = real(
                6.0, "a number >= 0 (LLM.int8() outlier threshold; 0 disables it)", lambda t: t >= 0
            )
            spec["mode"] = choice("auto", ("auto", "real"))
        else:
            spec["double_quant"] = boolean(False)
            spec["blocksize"] = choice(64, BLOCKSIZES)
            spec["mode"] = choice("auto", ("auto", "fake", "real"))
        super().__init__(name, bits, spec, options)

    @property
    def resolved_mode(self) -> str:
        """The mode the ``mode`` option resolves to: "auto" is fake quantization on a CPU (int8: real, its CPU forward is `bnb_int8`) and real on a GPU."""
        if self.options["mode"] != "auto":
            return self.options["mode"]
        return "fake" if (self.device.type == "cpu" and self.kind != "int8") else "real"

    def _check_layer(self, name: str, module: nn.Module) -> None:
        require_linear(self.name, name, module)

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        """Bits per weight of a layer: int8: 8 plus a 32-bit scale per row; nf4/fp4: 4 plus a 32-bit absmax per block, or with double quantization an 8-bit absmax per block plus a 32-bit one per block of blocks.

        Args:
            in_features: the layer's input width.
            out_features: the layer's output width.

        Returns:
            Bits per weight.
        """
        if self.kind == "int8":
            return 8.0 + 32.0 / in_features
        b = self.options["blocksize"]
        if self.options["double_quant"]:
            return 4.0 + 8.0 / b + 32.0 / (DOUBLE_QUANT_BLOCKSIZE * b)
        return 4.0 + 32.0 / b

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        dtype = self.compute_dtype
        device = self.device
        fake = self.resolved_mode == "fake"

        def make(name: str, linear: nn.Module) -> nn.Module:
            weight = linear.weight.data.to(device=device, dtype=dtype).contiguous()
            bias = linear.bias.data.to(device=device, dtype=dtype) if linear.bias is not None else None
            if self.kind == "int8":
                new = self._int8_layer(linear, weight, bias)
            elif fake:
                new = self._fake_4bit(weight, bias)
            else:
                new = self._4bit_layer(linear, weight)
            if not fake and bias is not None:
                new.bias = nn.Parameter(bias.cpu(), requires_grad=False)
            if fake:
                return new
            new = new.to(device)  # moving a bnb parameter to a device is what quantizes it
            # on a CPU, bitsandbytes' int8 operations in fewer passes, bit for bit (quantize.bnb_int8)
            return Int8Linear.from_bitsandbytes(new) if self.kind == "int8" and device.type == "cpu" else new

        replace_each(model, target_modules(model, self.options["modules"]), make)
        if device.type != "cpu":
            for _, param in model.named_parameters():
                if param.dtype.is_floating_point:
                    param.data = param.data.to(dtype)
        return model

    def _int8_layer(self, linear: nn.Linear, weight: Tensor, bias: Tensor | None) -> nn.Module:
        """bitsandbytes' LLM.int8() layer of `linear` (quantized when moved to its device)."""
        import bitsandbytes as bnb

        new = bnb.nn.Linear8bitLt(
            linear.in_features,
            linear.out_features,
            bias=bias is not None,
            has_fp16_weights=False,
            threshold=self.options["threshold"],
        )
        new.weight = bnb.nn.Int8Params(weight.cpu(), requires_grad=False, has_fp16_weights=False)
        return new

    def _fake_4bit(self, weight: Tensor, bias: Tensor | None) -> nn.Module:
        """A plain Linear holding the 4-bit weight quantized and dequantized by bitsandbytes' own functions."""
        import bitsandbytes.functional as bnb_f

        dtype = self.compute_dtype
        packed, state = bnb_f.quantize_4bit(
            weight,
            blocksize=self.options["blocksize"],
            compress_statistics=self.options["double_quant"],
            quant_type=self.kind,
        )
        return linear_from_weight(bnb_f.dequantize_4bit(packed, state).to(dtype), bias, dtype)

    def _4bit_layer(self, linear: nn.Linear, weight: Tensor) -> nn.Module:
        """bitsandbytes' 4-bit layer (nf4 / fp4) of `linear` (quantized when moved to its device)."""
        import bitsandbytes as bnb

        new = bnb.nn.Linear4bit(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            compute_dtype=self.compute_dtype,
            compress_statistics=self.options["double_quant"],
            quant_type=self.kind,
        )
        new.weight = bnb.nn.Params4bit(
            weight.cpu(),
            requires_grad=False,
            blocksize=self.options["blocksize"],
            compress_statistics=self.options["double_quant"],
            quant_type=self.kind,
            module=new,
        )
        return new
