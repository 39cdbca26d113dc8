"""GPTQ through gptqmodel (auto-gptq cannot quantize without CUDA and does not import with
transformers 5).

gptqmodel only quantizes a model it loads from a directory, so the model is written to a temporary
directory (deleted afterwards), loaded with ``GPTQModel.load(dir, QuantizeConfig(...))`` and quantized
on calibration samples drawn from ``calibration_texts`` (the run's training texts by default; the
caller passes them): ``calibration_samples`` texts sampled without replacement with ``seed``, each
truncated to ``calibration_max_length`` tokens. On CPU the model is quantized in float32 (gptqmodel's CPU
default, bf16, is about 2x slower end to end); on GPU gptqmodel's own default dtype is used, and the scales
are stored in the dtype of the quantization.

``mode``:
- ``"real"``: the model as gptqmodel returns it (its quantized linear kernels, bf16/fp16 compute).
- ``"fake"``: every gptqmodel quantized linear is replaced by an fp32 ``nn.Linear`` holding its
  ``dequantize_weight()`` and the model is cast to fp32. gptqmodel's torch kernel computes
  ``x @ dequantize_weight() + bias`` but refuses fp32 activations, and bf16 matmuls are about 6x
  slower on CPU; a test proves the fake model equals the real modules fed fp32 activations.
- ``"auto"`` (default): fake on CPU, real on GPU.

Scope: gptqmodel quantizes the linear layers of the decoder blocks it knows for the architecture.
In-block layers outside ``modules`` are excluded through gptqmodel's ``dynamic`` negative rules; after
quantization the set of quantized layers must equal the in-scope set, else QuantizationError.

Bits accounting: bits per weight + (one 16-bit scale + one bits-wide zero point) per group of
``group_size`` input columns + one int32 group index per input column (``g_idx``, shared by the
out_features weights of that column): bits + (16 + bits) / group_size + 32 / out_features
(group_size = -1 means one group per row: group_size = in_features).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import tempfile
from pathlib import Path

import torch
from torch import nn

from .base import (
    QuantizationError,
    Quantizer,
    boolean,
    check_group_size,
    choice,
    common_options,
    integer,
    linear_from_weight,
    real,
    replace_module,
    target_modules,
)

GPTQ_BITS = {"gptq-2": 2, "gptq-3": 3, "gptq-4": 4, "gptq-8": 8}


class GPTQQuantizer(Quantizer):
    family = "gptq"
    library = "gptqmodel"

    def __init__(self, name: str, **options):
        self.nbits = GPTQ_BITS[name]
        spec = common_options()
        spec["group_size"] = integer(
            128,
            "-1 (one group per row) or a positive int dividing each layer's input width",
            lambda g: g == -1 or g > 0,
        )
        spec["desc_act"] = boolean(False)
        spec["sym"] = boolean(True)
        spec["damp_percent"] = real(0.05, "a number in (0, 1)", lambda d: 0 < d < 1)
        spec["calibration_samples"] = integer(128, "a positive int", lambda n: n > 0)
        spec["calibration_max_length"] = integer(512, "a positive int (tokens)", lambda n: n > 0)
        spec["seed"] = integer(0, "an int", lambda s: True)
        spec["mode"] = choice("auto", ("auto", "fake", "real"))
        super().__init__(name, self.nbits, spec, options)

    @property
    def resolved_mode(self) -> str:
        if self.options["mode"] != "auto":
            return self.options["mode"]
        return "fake" if self.device.type == "cpu" else "real"

    def _check_layer(self, name: str, module: nn.Module) -> None:
        if not isinstance(module, nn.Linear):
            raise QuantizationError(f"{self.name}: layer '{name}' is {type(module).__name__}, not nn.Linear")
        check_group_size(self.name, name, module.in_features, self.options["group_size"])

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        group = in_features if self.options["group_size"] == -1 else self.options["group_size"]
        return self.nbits + (16.0 + self.nbits) / group + 32.0 / out_features

    def calibration_batch(self, tokenizer, calibration_texts) -> list[dict]:
        """Sample and tokenize the calibration texts: a list of {input_ids, attention_mask} lists."""
        if tokenizer is None or not calibration_texts:
            raise QuantizationError(
                f"{self.name}: GPTQ needs tokenizer= and calibration_texts= (the run's training texts "
                "by default); fix: pass both to quantize_model"
            )
        texts = [t for t in calibration_texts if isinstance(t, str) and t.strip()]
        if not texts:
            raise QuantizationError(f"{self.name}: calibration_texts holds no non-empty string")
        n = min(self.options["calibration_samples"], len(texts))
        chosen = random.Random(self.options["seed"]).sample(texts, n)
        batch = []
        for text in chosen:
            enc = tokenizer(text, truncation=True, max_length=self.options["calibration_max_length"])
            ids = list(enc["input_ids"])
            batch.append({"input_ids": ids, "attention_mask": [1] * len(ids)})
        return batch

    def _dynamic_exclusions(self, model: nn.Module) -> dict | None:
        """gptqmodel `dynamic` rules that skip in-block linear layers outside the scope."""
        in_scope = {name for name, _ in target_modules(model, self.options["modules"])}
        block = re.compile(r"(^|\.)layers\.\d+\.")
        skipped = [
            n for n, m in model.named_modules() if isinstance(m, nn.Linear) and block.search(n) and n not in in_scope
        ]
        if not skipped:
            return None
        return {f"-:^{re.escape(n)}$": {} for n in skipped}

    def _load_dtype(self) -> dict:
        """On CPU gptqmodel would run the calibration forward passes in bf16, about 6x slower than fp32
        matmuls there (it dominated a SmolLM2 unit); quantizing from an fp32 model is as exact or more.
        On GPU gptqmodel keeps its own default (fp16/bf16, what its kernels run)."""
        return {"dtype": torch.float32} if self.device.type == "cpu" else {}

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        calibration = self.calibration_batch(tokenizer, calibration_texts)
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, os.cpu_count() or 2)))
        from gptqmodel import GPTQModel, QuantizeConfig
        from gptqmodel.nn_modules.qlinear import BaseQuantLinear

        expected = {name for name, _ in target_modules(model, self.options["modules"])}
        with tempfile.TemporaryDirectory(prefix="llmaudit-gptq-") as tmp, _quiet(os.path.join(tmp, "gptqmodel.log")):
            config = QuantizeConfig(  # logs an INFO line on construction: inside _quiet
                bits=self.nbits,
                group_size=self.options["group_size"],
                desc_act=self.options["desc_act"],
                sym=self.options["sym"],
                damp_percent=self.options["damp_percent"],
                dynamic=self._dynamic_exclusions(model),
            )
            source, packed = os.path.join(tmp, "source"), os.path.join(tmp, "quantized")
            model.save_pretrained(source)
            # GPTQModel.load always loads a tokenizer from the model directory; without tokenizer files
            # there it fails ("Couldn't instantiate the backend tokenizer ... sentencepiece or tiktoken").
            tokenizer.save_pretrained(source)
            wrapped = GPTQModel.load(source, config, device=str(self.device), **self._load_dtype())
            with _gptq_logs_in(os.path.join(tmp, "logs")):
                wrapped.quantize(calibration, tokenizer=tokenizer, batch_size=1, calibration_data_min_length=1)
            # The model gptqmodel quantized in place keeps lazy-loading hooks (meta tensors); the saved
            # and reloaded checkpoint is the model users actually deploy.
            wrapped.save(packed)
            del wrapped
            quantized = GPTQModel.load(packed, device=str(self.device)).model
        done = {n for n, m in quantized.named_modules() if isinstance(m, BaseQuantLinear)}
        if done != expected:
            raise QuantizationError(
                f"{self.name}: gptqmodel quantized {len(done)} layers but the scope modules="
                f"{self.options['modules']!r} selects {len(expected)}; not quantized: "
                f"{sorted(expected - done)[:5]}, unexpectedly quantized: {sorted(done - expected)[:5]}. "
                "gptqmodel only quantizes the linear layers inside the decoder blocks; fix: restrict modules="
            )
        if self.resolved_mode == "real":
            return quantized
        return dequantize_gptq_layers(quantized, self.compute_dtype)


@contextlib.contextmanager
def _quiet(log_path: str):
    """gptqmodel prints its progress bars and INFO lines to stdout for every quantization (and accelerate
    warns about untied weights): send them to a file, and add its tail to any error. LLMAUDIT_LOG shows
    them."""
    if os.environ.get("LLMAUDIT_LOG"):
        yield
        return
    noisy = [logging.getLogger(n) for n in ("accelerate", "accelerate.utils.modeling", "gptqmodel")]
    levels = [lg.level for lg in noisy]
    for lg in noisy:
        lg.setLevel(logging.ERROR)
    try:
        with (
            open(log_path, "w", encoding="utf-8") as sink,
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            try:
                yield
            except Exception as exc:
                sink.flush()
                tail = Path(log_path).read_text(encoding="utf-8", errors="replace")[-1500:]
                raise QuantizationError(
                    f"gptqmodel failed ({type(exc).__name__}: {exc}); its last output: {tail}"
                ) from exc
    finally:
        for lg, level in zip(noisy, levels, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def _gptq_logs_in(directory: str):
    """gptqmodel writes a per-layer log file into ./logs of the current directory on every
    quantization; send those files to our temporary directory instead (discarded with it)."""
    try:
        from gptqmodel.looper import loop_processor
    except ImportError:  # layout changed: leave gptqmodel's default
        yield
        return
    previous = getattr(loop_processor, "_PROJECT_LOG_DIR", None)
    if previous is None:
        yield
        return
    loop_processor._PROJECT_LOG_DIR = Path(directory)
    try:
        yield
    finally:
        loop_processor._PROJECT_LOG_DIR = previous


def dequantize_gptq_layers(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace every gptqmodel quantized linear by an nn.Linear holding its dequantized weight
    (the fake-quantized model), and cast the model to ``dtype``. In place; returns the model."""
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

    names = [n for n, m in model.named_modules() if isinstance(m, BaseQuantLinear)]
    for name in names:
        qlinear = model.get_submodule(name)
        weight = qlinear.dequantize_weight()[: qlinear.in_features, : qlinear.out_features].t()
        bias = qlinear.bias if isinstance(qlinear.bias, torch.Tensor) else None
        replace_module(model, name, linear_from_weight(weight.contiguous(), bias, dtype))
    return model.to(dtype)
