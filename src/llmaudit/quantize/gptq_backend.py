"""GPTQ [Frantar2023] with two solvers: llmaudit's own (``gptq_solver``, the fake-quantization default) and
gptqmodel (auto-gptq cannot quantize without CUDA and does not import with transformers 5).

``solver``:
- ``"llmaudit"``: llmaudit's own solver (``gptq_solver``: the solve batched over layers of one kind; the
  calibration passes in ``gptq_calibration``). Fake quantization only. On the same Hessian it gives
  gptqmodel's integer codes, scales and zero points bit for bit (tested).
- ``"gptqmodel"``: the model is written to a temporary directory (deleted afterwards), loaded with
  ``GPTQModel.load(dir, QuantizeConfig(...))``, quantized, saved packed and loaded again; its own
  per-layer loop. On CPU the model is quantized in float32 (gptqmodel's CPU default, bf16, is slower end to
  end there); on GPU gptqmodel's own default dtype is used. This is the real-kernel path, and what a recorded
  unit without ``solver`` was quantized with.
- ``"auto"`` (default): llmaudit for fake mode, gptqmodel for real mode.

``calibration`` (which activations the Hessians come from; docs/science.md "GPTQ in llmaudit"):
- ``"sequential"``: gptqmodel's convention, and the GPTQ reference implementation's: block after block, each
  calibrated on the model quantized so far (q/k/v, then o_proj, then gate/up, then down_proj). With
  llmaudit's solver this is gptqmodel's quantized model, every code bit for bit (tested), without its
  directory round trip. One calibration pass per bit width.
- ``"shared"``: every layer's inputs from one forward pass of the UNQUANTIZED model, so the Hessians do not
  depend on the bits: ``collect_hessians`` once per checkpoint, then ``quantize_model(..., hessians=h)`` for
  every GPTQ quantizer with the same ``calibration_key()`` (gptq-4 and gptq-8). Cheaper, but each layer no
  longer compensates the drift of the layers below it: on SmolLM2 gptq-4's mean loss increase is 2.3x
  gptqmodel's (docs/results.md). llmaudit's solver only.
- ``"auto"`` (default): sequential.
Both options are resolved when the quantizer is built, so the options recorded in a store name the solver
and the calibration that made its units.

Calibration samples are drawn from ``calibration_texts``, which the caller passes: the score stage passes those of
``calibration_source`` (held-out records by default, the run's own training records with ``members``, a user's file
with ``file``: quantize.calibration; a recorded unit without the option calibrated on ``members``): ``calibration_samples`` texts sampled without replacement with ``seed``, each truncated to
``calibration_max_length`` tokens.

``mode``:
- ``"real"``: the model as gptqmodel returns it (its quantized linear kernels, bf16/fp16 compute).
- ``"fake"``: every in-scope layer becomes an ``nn.Linear`` holding the dequantized weight
  ``fp16(scale) * (code - zero)`` in float32 (the value the packed checkpoint stores, scales in float16).
  With solver=gptqmodel the weight is gptqmodel's ``dequantize_weight()``, which on CPU reloads the scales
  as bfloat16 and multiplies in bfloat16; a test proves it equals the real modules fed fp32 activations.
- ``"auto"`` (default): fake on CPU, real on GPU.

Scope: the linear layers matched by ``modules`` (default: those inside the decoder blocks). gptqmodel only
quantizes the decoder blocks' layers it knows for the architecture; in-block layers outside ``modules``
are excluded through its ``dynamic`` negative rules, and the set it quantized must equal the scope.

Bits accounting: bits per weight + (one 16-bit scale + one bits-wide zero point) per group of
``group_size`` input columns + one int32 group index per input column (``g_idx``, shared by the
out_features weights of that column): bits + (16 + bits) / group_size + 32 / out_features
(group_size = -1 means one group per row: group_size = in_features).
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import time
from dataclasses import dataclass, field

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
    replace_each,
    require_linear,
    target_modules,
)
from .calibration import CALIBRATION_SOURCES, DEFAULT_CALIBRATION_SOURCE, LEGACY_CALIBRATION_SOURCE
from .gptq_calibration import check_finite, collect_hessians, quantize_sequential
from .gptq_solver import GPTQSpec, solve_layers
from .gptqmodel_lib import dequantize_gptq_layers, gptqmodel_logs_in, quiet_gptqmodel

GPTQ_BITS = {"gptq-2": 2, "gptq-3": 3, "gptq-4": 4, "gptq-8": 8}
SOLVERS = ("auto", "llmaudit", "gptqmodel")
CALIBRATIONS = ("auto", "sequential", "shared")
# what a store scored before these options existed used: gptqmodel, which is sequential
LEGACY_OPTIONS = {"solver": "gptqmodel", "calibration": "sequential", "calibration_source": LEGACY_CALIBRATION_SOURCE}
# what calibration='auto' means with llmaudit's solver: gptqmodel's convention (its codes bit for bit), as
# shared Hessians cost gptq-4 twice gptqmodel's loss increase on SmolLM2 (docs/science.md, docs/results.md)
LLMAUDIT_CALIBRATION = "sequential"
HESSIAN_CONVENTION = "full-precision-inputs/v1"  # bump when collect_hessians computes something else


@dataclass
class GPTQHessians:
    """The Hessians of one checkpoint's calibration, for every GPTQ quantizer with the same key.

    key: the ``calibration_key()`` of the quantizer that collected them. hessians: {layer name: H [in, in]
    float32}, layers reading the same input share one tensor. tokens: calibration tokens (n of H = 2/n X^T
    X). seconds: collection time. factors: inverse Hessian factors the solves cache here (one per column
    order and damping), so the second bit width skips them; about as much memory as the Hessians."""

    key: dict
    hessians: dict[str, torch.Tensor]
    tokens: int
    seconds: float
    factors: dict = field(default_factory=dict, repr=False)


class GPTQQuantizer(Quantizer):
    family = "gptq"
    calibrated = True
    install_hint = "pip install 'llmaudit[gptq]'"  # solver='gptqmodel'
    tracked_libraries = ("gptqmodel", "optimum")
    gpu_seconds_per_layer = 2.0
    shares_calibration = "gptq"  # the Hessians of calibration='shared' (solver llmaudit)

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
        spec["calibration_source"] = choice(DEFAULT_CALIBRATION_SOURCE, CALIBRATION_SOURCES)
        spec["calibration_samples"] = integer(128, "a positive int", lambda n: n > 0)
        spec["calibration_max_length"] = integer(512, "a positive int (tokens)", lambda n: n > 0)
        spec["seed"] = integer(0, "an int", lambda s: True)
        spec["mode"] = choice("auto", ("auto", "fake", "real"))
        spec["solver"] = choice("auto", SOLVERS)
        spec["calibration"] = choice("auto", CALIBRATIONS)
        super().__init__(name, self.nbits, spec, options)
        # recorded resolved: a store names the solver and the calibration of its units
        if self.options["solver"] == "auto":
            self.options["solver"] = "llmaudit" if self.resolved_mode == "fake" else "gptqmodel"
        if self.options["calibration"] == "auto":
            self.options["calibration"] = LLMAUDIT_CALIBRATION if self.solver == "llmaudit" else "sequential"

    legacy_options = LEGACY_OPTIONS

    @property
    def library(self) -> str | None:  # llmaudit's solver needs no GPTQ library
        """The library this quantizer needs: gptqmodel for solver='gptqmodel', none for llmaudit's own solver."""
        return "gptqmodel" if self.options["solver"] == "gptqmodel" else None

    @property
    def solver(self) -> str:
        """The resolved solver: ``"llmaudit"`` or ``"gptqmodel"``."""
        return self.options["solver"]

    def _check_options(self) -> None:
        if self.solver == "gptqmodel" and self.options["calibration"] != "sequential":
            raise QuantizationError(
                f"{self.name}: gptqmodel calibrates sequentially only (calibration='shared' is llmaudit's solver); "
                "fix: pass calibration='sequential', or solver='llmaudit'"
            )
        if self.solver == "llmaudit" and self.resolved_mode == "real":
            raise QuantizationError(
                f"{self.name}: solver='llmaudit' gives fake-quantized layers only (mode='real' needs gptqmodel's "
                "kernels); fix: pass mode='fake', or solver='gptqmodel' (or 'auto')"
            )

    def _check_layer(self, name: str, module: nn.Module) -> None:
        require_linear(self.name, name, module)
        check_group_size(self.name, name, module.in_features, self.options["group_size"])

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        """Bits per weight of a layer: the code width plus a 16-bit scale and a zero point of the code width per group,
        plus a 32-bit group index per input column shared by the layer's rows.

        Args:
            in_features: the layer's input width.
            out_features: the layer's output width.

        Returns:
            Bits per weight.
        """
        group = in_features if self.options["group_size"] == -1 else self.options["group_size"]
        return self.nbits + (16.0 + self.nbits) / group + 32.0 / out_features

    def spec(self) -> GPTQSpec:
        """The solve's options (gptqmodel's defaults for what llmaudit does not expose: group-aware ordering where it
        applies, damping step 0.01, blocks of 128 columns).

        Returns:
            The `GPTQSpec`.
        """
        o = self.options
        return GPTQSpec(
            bits=self.nbits, group_size=o["group_size"], sym=o["sym"], desc_act=o["desc_act"],
            damp_percent=o["damp_percent"],
        )  # fmt: skip

    # ---- shared calibration ---------------------------------------------------------------------------
    def calibration_key(self) -> dict | None:
        """What this quantizer's Hessians depend on besides the checkpoint and the calibration texts: GPTQ quantizers with
        equal keys (gptq-4 and gptq-8 with the same calibration options) can share one ``collect_hessians`` of the same
        checkpoint.

        Returns:
            The key, or None unless calibration='shared' (solver llmaudit): sequential Hessians depend on the bits.
        """
        if self.solver != "llmaudit" or self.options["calibration"] != "shared":
            return None
        o = self.options
        return {
            "convention": HESSIAN_CONVENTION,
            "calibration_source": o["calibration_source"],
            "calibration_samples": o["calibration_samples"],
            "calibration_max_length": o["calibration_max_length"],
            "seed": o["seed"],
            "modules": list(o["modules"]),
        }

    def collect_hessians(self, model: nn.Module, *, tokenizer, calibration_texts) -> GPTQHessians:
        """The Hessians of the calibration, from one forward pass per calibration sample.

        Args:
            model: the unquantized checkpoint (unchanged).
            tokenizer: its tokenizer.
            calibration_texts: the texts to calibrate on.

        Returns:
            The Hessians, with this quantizer's key, the tokens seen and the time taken.

        Raises:
            QuantizationError: calibration is not 'shared' (the Hessians depend on the bits), the request is refused by
                `check`, or the calibration activations are not finite.
        """
        if self.calibration_key() is None:
            raise QuantizationError(
                f"{self.name}: solver={self.solver!r} with calibration={self.options['calibration']!r} has no "
                "Hessians to share (they depend on the bits); fix: calibration='shared' (solver llmaudit)"
            )
        self.check(model)
        samples = [b["input_ids"] for b in self.calibration_batch(tokenizer, calibration_texts)]
        names = [n for n, _ in target_modules(model, self.options["modules"])]
        t0 = time.perf_counter()
        model.eval()
        model.to(self.device)
        try:
            hessians = collect_hessians(model, names, samples)
        except ValueError as exc:
            raise QuantizationError(f"{self.name}: {exc}") from exc
        return GPTQHessians(self.calibration_key(), hessians, sum(map(len, samples)), time.perf_counter() - t0)

    def quantize_model(
        self, model: nn.Module, *, tokenizer=None, calibration_texts=None, hessians: GPTQHessians | None = None
    ) -> nn.Module:
        """The quantized model (in place).

        Args:
            model: the model to quantize.
            tokenizer: its tokenizer (needed unless ``hessians`` is given).
            calibration_texts: the texts to calibrate on (likewise).
            hessians: a ``collect_hessians`` result of THIS checkpoint to reuse (solver llmaudit only); without it the
                Hessians are collected here.

        Returns:
            The quantized model.

        Raises:
            QuantizationError: the request is refused by `check`, or ``hessians`` were collected with another key or
                this quantizer cannot take them.
        """
        if hessians is None:
            return super().quantize_model(model, tokenizer=tokenizer, calibration_texts=calibration_texts)
        self._check_shared(hessians)
        self.check(model)
        model.eval()
        model.to(self.device)
        with torch.no_grad():
            out = self._solve(model, hessians)
        out.eval()
        return out

    def collect_shared_calibration(self, model: nn.Module, *, tokenizer, calibration_texts) -> GPTQHessians:
        """The Hessians the GPTQ quantizers with this one's ``calibration_key()`` share (``collect_hessians``).

        Args:
            model: the unquantized checkpoint (left unchanged).
            tokenizer: the checkpoint's tokenizer.
            calibration_texts: the texts to calibrate on.

        Returns:
            The collected Hessians.

        Raises:
            QuantizationError: this quantizer's calibration depends on its bits (nothing to share).
        """
        return self.collect_hessians(model, tokenizer=tokenizer, calibration_texts=calibration_texts)

    def quantize_shared(self, model: nn.Module, shared: GPTQHessians) -> nn.Module:
        """The quantized model from shared Hessians (``quantize_model(model, hessians=shared)``).

        Args:
            model: the checkpoint the Hessians were collected on (quantized in place).
            shared: a ``collect_shared_calibration`` result of a quantizer with the same ``calibration_key()``.

        Returns:
            The quantized model.

        Raises:
            QuantizationError: the Hessians were collected with another key, or this quantizer shares none.
        """
        return self.quantize_model(model, hessians=shared)

    def _check_shared(self, hessians: GPTQHessians) -> None:
        if self.calibration_key() is None:
            raise QuantizationError(
                f"{self.name}: solver={self.solver!r} with calibration={self.options['calibration']!r} cannot take "
                "shared Hessians; fix: calibration='shared' (solver llmaudit), or call quantize_model without hessians="
            )
        if hessians.key != self.calibration_key():
            raise QuantizationError(
                f"{self.name}: the Hessians were collected with {hessians.key}, this quantizer calibrates with "
                f"{self.calibration_key()}; fix: collect_hessians with this quantizer"
            )

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        if self.solver == "gptqmodel":
            return self._quantize_gptqmodel(model, tokenizer=tokenizer, calibration_texts=calibration_texts)
        if self.options["calibration"] == "shared":
            return self._solve(
                model, self.collect_hessians(model, tokenizer=tokenizer, calibration_texts=calibration_texts)
            )
        return self._solve_sequential(model, tokenizer=tokenizer, calibration_texts=calibration_texts)

    def _solve_sequential(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        """llmaudit's solver, gptqmodel's convention: block after block on the model quantized so far."""
        samples = [b["input_ids"] for b in self.calibration_batch(tokenizer, calibration_texts)]
        targets = target_modules(model, self.options["modules"])
        try:
            # the exact order of operations: gptqmodel's codes bit for bit, at no measurable cost here (the per-block
            # solves are small); the fast order would let one rounding tie change every later block's inputs
            solved = quantize_sequential(model, [n for n, _ in targets], samples, self.spec(), exact=True)
        except ValueError as exc:
            raise QuantizationError(f"{self.name}: {exc}") from exc
        return self._fake_layers(model, targets, solved)

    def _fake_layers(self, model: nn.Module, targets: list, solved: dict) -> nn.Module:
        """Every target replaced by an nn.Linear with its dequantized weight (`targets` is emptied)."""

        def fake(name: str, module: nn.Module) -> nn.Linear:
            bias = module.bias if isinstance(module.bias, torch.Tensor) else None
            return linear_from_weight(solved.pop(name).weight(), bias, self.compute_dtype)

        replace_each(model, targets, fake)
        return model.to(self.compute_dtype)

    def _solve(self, model: nn.Module, hessians: GPTQHessians) -> nn.Module:
        """llmaudit's solver on shared Hessians: every in-scope layer becomes an nn.Linear with its dequantized
        weight."""
        targets = target_modules(model, self.options["modules"])
        for name, module in targets:
            h = hessians.hessians.get(name)
            if h is None or h.shape != (module.in_features, module.in_features):
                raise QuantizationError(
                    f"{self.name}: no Hessian of shape [{module.in_features}, {module.in_features}] for layer "
                    f"'{name}' (got {None if h is None else tuple(h.shape)}); the Hessians come from another model; "
                    "fix: collect_hessians on this checkpoint"
                )
        weights = {n: m.weight.detach() for n, m in targets}
        try:
            check_finite(weights, hessians.hessians)
        except ValueError as exc:
            raise QuantizationError(f"{self.name}: {exc}") from exc
        solved = solve_layers(
            weights, {n: hessians.hessians[n] for n, _ in targets}, self.spec(), factor_cache=hessians.factors
        )
        return self._fake_layers(model, targets, solved)

    # ---- calibration samples (both solvers), gptqmodel ------------------------------------------------
    def calibration_batch(self, tokenizer, calibration_texts) -> list[dict]:
        """The calibration samples: texts sampled and tokenized as the options say (`calibration_token_ids`).

        Args:
            tokenizer: the checkpoint's tokenizer.
            calibration_texts: the texts to calibrate on.

        Returns:
            One {"input_ids", "attention_mask"} dict of lists per sample.

        Raises:
            QuantizationError: the tokenizer or the texts are missing or give no token.
        """
        if tokenizer is None or not calibration_texts:
            raise QuantizationError(
                f"{self.name}: GPTQ needs tokenizer= and calibration_texts= (the score stage passes those of "
                "calibration_source); fix: pass both to quantize_model"
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
            if not ids:
                raise QuantizationError(f"{self.name}: a calibration text tokenizes to no token: {text[:60]!r}")
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
        """On CPU gptqmodel would run the calibration forward passes in bf16, slower than fp32 matmuls there;
        quantizing from an fp32 model is as exact or more.
        On GPU gptqmodel keeps its own default (fp16/bf16, what its kernels run)."""
        return {"dtype": torch.float32} if self.device.type == "cpu" else {}

    def _quantize_gptqmodel(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        calibration = self.calibration_batch(tokenizer, calibration_texts)
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, os.cpu_count() or 2)))
        from gptqmodel import GPTQModel, QuantizeConfig
        from gptqmodel.nn_modules.qlinear import BaseQuantLinear

        expected = {name for name, _ in target_modules(model, self.options["modules"])}
        with (
            tempfile.TemporaryDirectory(prefix="llmaudit-gptq-") as tmp,
            quiet_gptqmodel(os.path.join(tmp, "gptqmodel.log")),
        ):
            config = QuantizeConfig(  # logs an INFO line on construction: inside quiet_gptqmodel
                bits=self.nbits,
                group_size=self.options["group_size"],
                desc_act=self.options["desc_act"],
                sym=self.options["sym"],
                damp_percent=self.options["damp_percent"],
                # gptqmodel's default group-aware ordering refuses group_size=-1: off there (and with desc_act)
                act_group_aware=self.spec().ordering == "group_aware",
                dynamic=self._dynamic_exclusions(model),
            )
            source, packed = os.path.join(tmp, "source"), os.path.join(tmp, "quantized")
            model.save_pretrained(source)
            # GPTQModel.load always loads a tokenizer from the model directory; without tokenizer files
            # there it fails ("Couldn't instantiate the backend tokenizer ... sentencepiece or tiktoken").
            tokenizer.save_pretrained(source)
            wrapped = GPTQModel.load(source, config, device=str(self.device), **self._load_dtype())
            with gptqmodel_logs_in(os.path.join(tmp, "logs")):
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
