"""AWQ [Lin2024], 4-bit weight-only (``awq-4``), through gptqmodel's AWQ implementation.

Why gptqmodel and not llm-compressor: llm-compressor 0.14.0.1 (the newest release) requires transformers <= 5.17.0,
compressed-tensors 0.19.0, auto-round and nvidia-ml-py, which would replace the transformers 5.24.0 that llmaudit is
measured with (constraints.txt); AutoAWQ is archived and needs CUDA. gptqmodel (ModelCloud, maintained, already
llmaudit's GPTQ library: the `gptq` extra) ports AutoAWQ's algorithm (per-channel activation-aware scale search, then
group-wise asymmetric round-to-nearest, ``AWQConfig``), runs it on a CPU, and writes the GEMM checkpoint format that
AutoAWQ, transformers and vLLM load (``qweight``/``qzeros`` packed int32, ``scales`` float16, per group of
``group_size`` input columns).

The model and tokenizer are written to a temporary directory (deleted afterwards), loaded with
``GPTQModel.load(dir, AWQConfig(...))``, calibrated on the calibration text (``calibration_source``), quantized and
saved. The score is computed from what gptqmodel wrote:
- ``mode="fake"`` (default on a CPU): every quantized layer becomes an nn.Linear holding the saved tensors dequantized
  by gptqmodel's own ``dequantize_gemm`` ((code - zero) x scale, scale in float16), the AWQ scales folded into the
  preceding norms as gptqmodel saved them (the saved checkpoint's other tensors are loaded too);
- ``mode="real"`` (default on a GPU): the saved checkpoint loaded by ``GPTQModel.load`` with its kernels.

Bits accounting: 4 + (16 + 4) / group_size (one float16 scale and one 4-bit zero per group).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from .base import (
    QuantizationError,
    Quantizer,
    check_group_size,
    choice,
    common_options,
    linear_from_weight,
    replace_module,
    require_linear,
    target_modules,
)
from .calibration import calibration_options, calibration_token_ids
from .gptqmodel_lib import gptqmodel_logs_in, quiet_gptqmodel

AWQ_BITS = {"awq-4": 4}
AWQ_GROUP_SIZES = (-1, 16, 32, 64, 128)


class AWQQuantizer(Quantizer):
    family = "awq"
    library = "gptqmodel"
    install_hint = "pip install 'llmaudit[gptq]'"
    tracked_libraries = ("gptqmodel",)
    gpu_seconds_per_layer = 2.0
    shares_calibration = None
    calibrated = True

    def __init__(self, name: str, **options):
        self.nbits = AWQ_BITS[name]
        spec = common_options()
        spec["group_size"] = choice(128, AWQ_GROUP_SIZES)
        spec["mode"] = choice("auto", ("auto", "fake", "real"))
        spec.update(calibration_options())
        super().__init__(name, self.nbits, spec, options)

    def _check_layer(self, name: str, module: nn.Module) -> None:
        require_linear(self.name, name, module)
        check_group_size(self.name, name, module.in_features, self.options["group_size"])
        if module.out_features % 64:  # AutoAWQ's clipping search, which gptqmodel keeps, works in rows of 64
            raise QuantizationError(
                f"{self.name}: layer '{name}' has {module.out_features} outputs; AWQ's clipping search (gptqmodel) "
                "needs a multiple of 64; fix: restrict modules= to layers whose output width is a multiple of 64"
            )

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        """Bits per weight of a layer: the code width plus a 16-bit scale and a zero point of the code width per group.

        Args:
            in_features: the layer's input width.
            out_features: the layer's output width.

        Returns:
            Bits per weight.
        """
        group = in_features if self.options["group_size"] == -1 else self.options["group_size"]
        return self.nbits + (16.0 + self.nbits) / group

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        samples = calibration_token_ids(self.name, self.options, tokenizer, calibration_texts)
        calibration = [{"input_ids": ids, "attention_mask": [1] * len(ids)} for ids in samples]
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, os.cpu_count() or 2)))
        from gptqmodel import BACKEND, GPTQModel
        from gptqmodel.quantization.config import AWQConfig

        expected = {name for name, _ in target_modules(model, self.options["modules"])}
        with (
            tempfile.TemporaryDirectory(prefix="llmaudit-awq-") as tmp,
            quiet_gptqmodel(os.path.join(tmp, "gptqmodel.log")),
        ):
            config = AWQConfig(bits=self.nbits, group_size=self.options["group_size"], sym=False)
            source, packed = os.path.join(tmp, "source"), os.path.join(tmp, "quantized")
            model.save_pretrained(source)
            tokenizer.save_pretrained(source)
            # its torch AWQ kernel (the CPU's) packs only float16/bfloat16 models: the calibration runs in bfloat16
            dtype = {"dtype": torch.bfloat16} if self.device.type == "cpu" else {}
            wrapped = GPTQModel.load(source, config, device=str(self.device), **dtype)
            with gptqmodel_logs_in(os.path.join(tmp, "logs")):
                # gptqmodel packs AWQ's GEMM format with its CUDA kernel unless told to use its torch one
                backend = BACKEND.AWQ_TORCH if self.device.type == "cpu" else BACKEND.AUTO
                wrapped.quantize(
                    calibration, tokenizer=tokenizer, batch_size=1, calibration_data_min_length=1, backend=backend
                )
            wrapped.save(packed)
            del wrapped
            if self.resolved_mode == "real":
                return GPTQModel.load(packed, device=str(self.device)).model
            return self._from_checkpoint(model, Path(packed), expected)

    def _from_checkpoint(self, model: nn.Module, packed: Path, expected: set[str]) -> nn.Module:
        """The model with every tensor gptqmodel saved: quantized layers dequantized, the rest (the norms it scaled)
        loaded as saved."""
        from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
        from safetensors.torch import load_file

        saved: dict[str, torch.Tensor] = {}
        for file in sorted(packed.glob("*.safetensors")):
            saved.update(load_file(str(file)))
        done = {k.removesuffix(".qweight") for k in saved if k.endswith(".qweight")}
        if done != expected:
            raise QuantizationError(
                f"{self.name}: gptqmodel quantized {len(done)} layers, the scope modules={self.options['modules']!r} "
                f"selects {len(expected)}; not quantized: {sorted(expected - done)[:5]}; fix: restrict modules="
            )
        group = self.options["group_size"]
        dtype = self.compute_dtype
        for name in sorted(done):
            module = model.get_submodule(name)
            qweight, qzeros, scales = (saved.pop(f"{name}.{k}") for k in ("qweight", "qzeros", "scales"))
            group_size = module.in_features if group == -1 else group
            weight = dequantize_gemm(qweight, qzeros, scales, self.nbits, group_size).to(torch.float32).t()
            bias = saved.pop(f"{name}.bias", None)
            replace_module(model, name, linear_from_weight(weight.contiguous(), bias, dtype))
        state = {k: v for k, v in saved.items() if not k.endswith((".g_idx",))}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected:
            raise QuantizationError(f"{self.name}: gptqmodel saved tensors the model does not hold: {unexpected[:5]}")
        return model.to(dtype)
