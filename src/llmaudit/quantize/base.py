"""Shared pieces of the quantization adapters: the error type, option validation, module scope,
device resolution and the bits/size accounting.

Accounting (``effective_bits`` and ``model_size_bytes``)
--------------------------------------------------------
``effective_bits(model)`` is the storage cost per quantized weight, averaged over the in-scope
weight matrices (weighted by element count)::

    sum_l numel(W_l) * bits_per_weight_l / sum_l numel(W_l)

where ``bits_per_weight_l`` is the backend's code width plus its per-group / per-row / per-tensor
metadata divided by the number of weights that share it (each backend documents its formula in
``bits_per_weight``). It is computed from the layer shapes and the options, so it is the same for a
real quantized module and for the equivalent fake-quantized ``nn.Linear``. Biases are not counted
(they stay in floating point; they are counted by ``model_size_bytes``).

``model_size_bytes(model)`` = in-scope weights at ``bits_per_weight`` + every other parameter of the
returned model at its element size (embeddings, norms, output head, biases of quantized layers),
tied parameters counted once, rounded up to whole bytes.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch import nn

from .errors import QuantizationError
from .layers import (
    check_group_size,
    compute_dtype_for,
    linear_from_weight,
    replace_each,
    replace_module,
    require_linear,
    resolve_device,
    target_modules,
)
from .options import DEFAULT_MODULES, DEVICES, Option, boolean, choice, common_options, integer, real, resolve_options


@dataclass(frozen=True)
class QuantizerInfo:
    name: str
    family: str
    bits: float
    available: bool
    reason: str | None

    def to_dict(self) -> dict:
        """The info as JSON-able data.

        Returns:
            {"name", "family", "bits", "available", "reason"}.
        """
        return {
            "name": self.name,
            "family": self.family,
            "bits": self.bits,
            "available": self.available,
            "reason": self.reason,
        }


@cache
def library_available(module_name: str) -> bool:
    """Whether a library can be imported here, found without importing it (cached).

    Args:
        module_name: the library's import name.

    Returns:
        True when ``importlib.util.find_spec`` finds it.
    """
    return importlib.util.find_spec(module_name) is not None


def missing_library_reason(module_name: str, install_hint: str) -> str | None:
    """Why a library is missing, with the fix.

    Args:
        module_name: the library's import name.
        install_hint: the command that installs it (a quantizer's ``install_hint``).

    Returns:
        None when the library can be imported here, else one line naming it and the fix.
    """
    if library_available(module_name):
        return None
    return f"the Python package '{module_name}' is not installed; fix: {install_hint}"


# --------------------------------------------------------------------------------------------------
# Base class


FACTS: tuple[str, ...] = ("family", "install_hint", "tracked_libraries", "gpu_seconds_per_layer", "shares_calibration")
"""What every quantizer class states about itself (`Quantizer` documents each); a class that lacks one, or
states one of the wrong type, is refused when it is defined (`check_facts`)."""


def _fact_problem(cls: type, fact: str) -> str | None:
    """What is wrong with one fact of a quantizer class, or None."""
    if not hasattr(cls, fact):
        return "is missing"
    value = getattr(cls, fact)
    if fact == "family":
        ok = isinstance(value, str) and value != ""
    elif fact == "install_hint":
        ok = value is None or (isinstance(value, str) and value != "")
        if ok and value is None and cls.library is not None:  # a class attribute or a property
            return "is None, but the class names a library (`library`): say how to install it"
    elif fact == "tracked_libraries":
        ok = isinstance(value, tuple) and all(isinstance(v, str) and v for v in value)
    elif fact == "gpu_seconds_per_layer":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    else:  # shares_calibration
        ok = value is None or (isinstance(value, str) and value != "")
        if ok and value is not None and cls.collect_shared_calibration is Quantizer.collect_shared_calibration:
            return "names a group, but the class does not override collect_shared_calibration and quantize_shared"
    return None if ok else f"has the wrong type or value {value!r}"


def check_facts(cls: type) -> None:
    """Refuse a quantizer class that does not state every fact in `FACTS`.

    Args:
        cls: a subclass of `Quantizer`.

    Raises:
        TypeError: a fact is missing or malformed (the message names the class, the fact and what it must be).
    """
    for fact in FACTS:
        problem = _fact_problem(cls, fact)
        if problem:
            raise TypeError(
                f"quantizer class {cls.__qualname__}: {fact} {problem}; every quantizer class states "
                f"{', '.join(FACTS)} (see llmaudit.quantize.base.Quantizer)"
            )


class Quantizer:
    """Common behaviour of the quantizers; each backend module defines a subclass.

    A subclass states its facts as class attributes (checked when the class is defined, `check_facts`):

    - ``family``: the backend family's name (``"hqq"``, ``"gptq"``...), shown by ``llmaudit quantizers``.
    - ``install_hint``: the command that installs the backend's library, or None when it needs none; required
      whenever ``library`` names one.
    - ``tracked_libraries``: the distributions whose versions a run store's manifest records for it (may be empty).
    - ``gpu_seconds_per_layer``: the assumed seconds to quantize one transformer layer on a GPU, for a layer of about
      20M parameters (``llmaudit plan`` scales it by layer size).
    - ``shares_calibration``: None, or the name of a group: quantizers of one group whose ``calibration_key()`` is
      equal share one ``collect_shared_calibration`` per checkpoint (``quantize_shared`` takes it).

    It also defines its option spec (passed to ``__init__``), ``bits_per_weight`` and ``_quantize``, and may define
    ``_check_options`` and ``_check_layer``.
    """

    family: str
    install_hint: str | None
    tracked_libraries: tuple[str, ...]
    gpu_seconds_per_layer: float
    shares_calibration: str | None
    library: str | None = None  # import name of the backend library, if any
    calibrated: bool = (
        False  # fits itself to calibration text: has the option calibration_source (quantize.calibration)
    )
    # option -> the value a store's record without that key means
    legacy_options: dict[str, Any] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_facts(cls)

    def __init__(self, name: str, bits: float, option_spec: dict[str, Option], options: dict[str, Any]):
        self.name = name
        self.bits = float(bits)
        self._spec = option_spec
        self.options = resolve_options(name, option_spec, options)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, options={self.options!r})"

    # ---- public API -------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """The device the ``device`` option resolves to (`resolve_device`)."""
        return resolve_device(self.options["device"])

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype this quantizer computes in on its device (`compute_dtype_for`)."""
        return compute_dtype_for(self.device)

    def availability(self) -> str | None:
        """Whether this quantizer can run here.

        Returns:
            None when it can, else the reason with the fix (a missing library, a GPU asked for and absent).
        """
        if self.library is not None:
            reason = missing_library_reason(self.library, self.install_hint or "install it")
            if reason:
                return f"{self.name}: {reason}"
        if self.options["device"] == "cuda" and not torch.cuda.is_available():
            return (
                f"{self.name}: device='cuda' was requested but no CUDA GPU is available; "
                "fix: run on a GPU machine or pass device='cpu' (or 'auto')"
            )
        return None

    def check(self, model: nn.Module | None = None) -> None:
        """Refuse, before any work, a request that cannot be carried out.

        Args:
            model: the model to quantize, whose in-scope layers are checked; None checks the options alone.

        Raises:
            QuantizationError: the quantizer cannot run here, an option does not fit, ``modules`` matches no linear
                layer of ``model``, or an in-scope layer does not fit the backend.
        """
        reason = self.availability()
        if reason:
            raise QuantizationError(reason)
        self._check_options()
        if model is not None:
            targets = target_modules(model, self.options["modules"])
            if not targets:
                raise QuantizationError(
                    f"{self.name}: modules={self.options['modules']!r} matches no linear layer of "
                    f"{type(model).__name__}; fix: pass modules= regexes matching names such as "
                    f"{[n for n, m in model.named_modules() if isinstance(m, nn.Linear)][:3]}"
                )
            for name, module in targets:
                self._check_layer(name, module)

    def quantize_model(self, model: nn.Module, *, tokenizer=None, calibration_texts=None) -> nn.Module:
        """The model quantized (in place, in eval mode, on this quantizer's device).

        Args:
            model: the model to quantize.
            tokenizer: its tokenizer (a calibrated quantizer needs it).
            calibration_texts: the texts to calibrate on (a calibrated quantizer needs them).

        Returns:
            The quantized model.

        Raises:
            QuantizationError: the request is refused by `check`.
        """
        self.check(model)
        model.eval()
        model.to(self.device)
        with torch.no_grad():
            out = self._quantize(model, tokenizer=tokenizer, calibration_texts=calibration_texts)
        out.eval()
        return out

    def calibration_key(self) -> dict | None:
        """What this quantizer's shared calibration depends on besides the checkpoint and the texts.

        Returns:
            None when this quantizer shares no calibration (the default), else a JSON-able dict: quantizers of one
            ``shares_calibration`` group with equal keys share one ``collect_shared_calibration``.
        """
        return None

    def collect_shared_calibration(self, model: nn.Module, *, tokenizer, calibration_texts) -> Any:
        """The calibration statistics of ``model`` that every quantizer of this one's group and key can reuse.

        Args:
            model: the unquantized checkpoint (left unchanged).
            tokenizer: the checkpoint's tokenizer.
            calibration_texts: the texts to calibrate on.

        Returns:
            What ``quantize_shared`` takes.

        Raises:
            QuantizationError: this quantizer shares no calibration.
        """
        raise QuantizationError(f"{self.name}: shares no calibration (shares_calibration is None)")

    def quantize_shared(self, model: nn.Module, shared: Any) -> nn.Module:
        """The quantized model, calibrated with statistics another quantizer of the group collected.

        Args:
            model: the checkpoint the statistics were collected on (quantized in place).
            shared: a ``collect_shared_calibration`` result of a quantizer with the same ``calibration_key()``.

        Returns:
            The quantized model.

        Raises:
            QuantizationError: this quantizer shares no calibration.
        """
        raise QuantizationError(f"{self.name}: shares no calibration (shares_calibration is None)")

    def recorded_options_mismatch(self, recorded: dict[str, Any]) -> str | None:
        """How the options a store recorded for this quantizer differ from this quantizer's, ``device`` aside.

        Args:
            recorded: the recorded options (JSON); a key it lacks reads as its ``legacy_options`` value.

        Returns:
            None when they are equal, else one line naming each differing option, with the fix.
        """

        def jsonable(value: Any) -> Any:
            return json.loads(json.dumps(value, default=str))

        mine = jsonable({k: v for k, v in self.options.items() if k != "device"})
        theirs = jsonable({**self.legacy_options, **{k: v for k, v in recorded.items() if k != "device"}})
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if not diff:
            return None
        keep = ", ".join(f"{k}={theirs.get(k)!r}" for k in diff)
        now = ", ".join(f"{k}={mine.get(k)!r}" for k in diff)
        return (
            f"{self.name} was scored with {keep}, now {now}: mixing them would report two quantizers as one; fix: "
            f"pass {keep} to continue this store (score.quantizer_options.{self.name}), or score into a new run directory"
        )

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        """The storage cost of one weight of a layer: the code width plus the metadata shared per weight.

        Args:
            in_features: the layer's input width.
            out_features: the layer's output width.

        Returns:
            Bits per weight.
        """
        raise NotImplementedError

    def effective_bits(self, model: nn.Module) -> float:
        """The bits per quantized weight over the in-scope layers, weighted by their sizes (the module docstring).

        Args:
            model: the model (quantized or not: only the shapes are read).

        Returns:
            Bits per weight.

        Raises:
            QuantizationError: no linear layer is in scope.
        """
        targets = target_modules(model, self.options["modules"])
        if not targets:
            raise QuantizationError(f"{self.name}: no in-scope linear layer in the model")
        total_bits = 0.0
        total_weights = 0
        for _, module in targets:
            n = module.in_features * module.out_features
            total_bits += n * self.bits_per_weight(module.in_features, module.out_features)
            total_weights += n
        return total_bits / total_weights

    def model_size_bytes(self, model: nn.Module) -> int:
        """The size of the quantized model (the module docstring): the in-scope weights at ``bits_per_weight``, every
        other parameter at its element size, tied parameters once.

        Args:
            model: the model (quantized or not: shapes and element sizes are read).

        Returns:
            Bytes, rounded up.
        """
        targets = target_modules(model, self.options["modules"])
        target_names = [name for name, _ in targets]
        bits = 0.0
        for _, module in targets:
            bits += (
                module.in_features * module.out_features * self.bits_per_weight(module.in_features, module.out_features)
            )
            bias = getattr(module, "bias", None)
            if isinstance(bias, torch.Tensor):
                bits += bias.numel() * bias.element_size() * 8
        for name, param in model.named_parameters():  # shared (tied) parameters appear once
            if any(name.startswith(t + ".") for t in target_names):
                continue
            bits += param.numel() * param.element_size() * 8
        return int(math.ceil(bits / 8))

    @property
    def resolved_mode(self) -> str:
        """A backend with a `mode` option: "auto" is fake quantization on CPU (the libraries' kernels need a GPU)
        and the library's real quantized layers on a GPU."""
        if self.options.get("mode", "auto") != "auto":
            return self.options["mode"]
        return "fake" if self.device.type == "cpu" else "real"

    # ---- hooks for backends -----------------------------------------------------------------------
    def _check_options(self) -> None:
        """Backend-specific checks that need no model."""

    def _check_layer(self, name: str, module: nn.Module) -> None:
        """Backend-specific checks on one in-scope layer (e.g. group size divides in_features)."""

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        raise NotImplementedError


__all__ = [  # the options, the layer helpers and the error are imported from here by the backends
    "DEFAULT_MODULES",
    "DEVICES",
    "Option",
    "QuantizationError",
    "boolean",
    "check_group_size",
    "choice",
    "common_options",
    "compute_dtype_for",
    "integer",
    "linear_from_weight",
    "real",
    "replace_each",
    "replace_module",
    "require_linear",
    "resolve_device",
    "resolve_options",
    "target_modules",
    "FACTS",
    "Quantizer",
    "QuantizerInfo",
    "check_facts",
    "library_available",
    "missing_library_reason",
]
