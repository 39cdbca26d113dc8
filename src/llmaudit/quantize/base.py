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
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch import nn

from llmaudit.common.errors import UserError

# Linear layers inside the transformer blocks of HF decoders (`model.layers.<i>.self_attn.q_proj`, ...).
# Embeddings, norms and the output head are left alone, as the real backends do.
DEFAULT_MODULES: tuple[str, ...] = (r"(^|\.)layers\.\d+\.",)
DEVICES = ("auto", "cpu", "cuda")


class QuantizationError(UserError):
    """A quantizer cannot do what was asked: bad option, missing library, impossible request."""


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
# Options


@dataclass(frozen=True)
class Option:
    """One validated option: its default, a human description of what is allowed, and a predicate."""

    default: Any
    allowed: str
    is_valid: Callable[[Any], bool]
    normalise: Callable[[Any], Any] = lambda v: v


def choice(default: Any, values: Iterable[Any]) -> Option:
    """An option taking one of a fixed set of values (of the first value's type).

    Args:
        default: the value when the option is not given.
        values: the values allowed.

    Returns:
        The option.
    """
    values = tuple(values)
    return Option(default, f"one of {list(values)}", lambda v: v in values and type(v) is type(values[0]))


def boolean(default: bool) -> Option:
    """An option that is true or false.

    Args:
        default: the value when the option is not given.

    Returns:
        The option.
    """
    return Option(default, "true or false", lambda v: isinstance(v, bool))


def integer(default: int, allowed: str, ok: Callable[[int], bool]) -> Option:
    """An integer option (a bool is refused).

    Args:
        default: the value when the option is not given.
        allowed: what is allowed, in words (quoted by the error).
        ok: the predicate a valid value satisfies.

    Returns:
        The option.
    """
    return Option(default, allowed, lambda v: isinstance(v, int) and not isinstance(v, bool) and ok(v))


def real(default: float, allowed: str, ok: Callable[[float], bool]) -> Option:
    """A finite real option, normalised to float (a bool is refused).

    Args:
        default: the value when the option is not given.
        allowed: what is allowed, in words (quoted by the error).
        ok: the predicate a valid value satisfies.

    Returns:
        The option.
    """
    return Option(
        default,
        allowed,
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v),
        normalise=float,
    )


def _valid_regex_list(v: Any) -> bool:
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
        return False
    for pattern in v:
        if not isinstance(pattern, str):
            return False
        try:
            re.compile(pattern)
        except re.error:
            return False
    return True


def common_options() -> dict[str, Option]:
    """The options every quantizer takes: ``modules`` (the regexes of the layers quantized) and ``device``.

    Returns:
        {option name: `Option`}, a new dict the caller may extend.
    """
    return {
        "modules": Option(
            list(DEFAULT_MODULES),
            "a non-empty list of regular expressions matched (re.search) against module names; "
            "the linear layers whose name matches any of them are quantized",
            _valid_regex_list,
            normalise=list,
        ),
        "device": choice("auto", DEVICES),
    }


def resolve_options(quantizer_name: str, spec: dict[str, Option], given: dict[str, Any]) -> dict[str, Any]:
    """The options of a quantizer: the defaults overridden by the given values, each validated and normalised.

    Args:
        quantizer_name: the quantizer's name (quoted by the errors).
        spec: {option name: `Option`}.
        given: the values passed.

    Returns:
        {option name: value} for every option of ``spec``.

    Raises:
        QuantizationError: an unknown key or a bad value (the message names the key, the value and what is allowed).
    """
    unknown = sorted(set(given) - set(spec))
    if unknown:
        key = unknown[0]
        raise QuantizationError(
            f"{quantizer_name}: unknown option {key}={given[key]!r}; allowed options: {sorted(spec)}"
        )
    resolved = {}
    for key, option in spec.items():
        value = given.get(key, option.default)
        if not option.is_valid(value):
            raise QuantizationError(f"{quantizer_name}: bad value {key}={value!r}; allowed: {option.allowed}")
        resolved[key] = option.normalise(value)
    return resolved


# --------------------------------------------------------------------------------------------------
# Scope, device


def _is_linear_like(module: nn.Module) -> bool:
    """nn.Linear and the backends' quantized linear modules (all expose in/out_features)."""
    if isinstance(module, nn.Linear):
        return True
    return isinstance(getattr(module, "in_features", None), int) and isinstance(
        getattr(module, "out_features", None), int
    )


def target_modules(model: nn.Module, patterns: Iterable[str]) -> list[tuple[str, nn.Module]]:
    """The linear(-like) modules whose qualified name matches one of ``patterns`` (``re.search``).

    Args:
        model: the model searched.
        patterns: regular expressions.

    Returns:
        (qualified name, module) pairs in module order; a match inside another match is kept once, at the top.
    """
    compiled = [re.compile(p) for p in patterns]
    found = []
    for name, module in model.named_modules():
        if not name or not _is_linear_like(module):
            continue
        if any(p.search(name) for p in compiled):
            found.append((name, module))
    # A matched module inside another matched module (e.g. a wrapper) is counted once, at the top.
    tops = []
    for name, module in found:
        if not any(name.startswith(other + ".") for other, _ in tops):
            tops.append((name, module))
    return tops


def resolve_device(device: str) -> torch.device:
    """The device a quantizer's ``device`` option names.

    Args:
        device: ``"auto"`` (a GPU when one is visible, else the CPU), ``"cpu"`` or ``"cuda"``.

    Returns:
        The torch device.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def compute_dtype_for(device: torch.device) -> torch.dtype:
    """The dtype the quantizers compute in on a device.

    Args:
        device: where the quantizer runs.

    Returns:
        float32 on a CPU (where bf16 matmuls are slower without native support), bfloat16 on a GPU.
    """
    return torch.float32 if device.type == "cpu" else torch.bfloat16


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


def require_linear(quantizer_name: str, layer_name: str, module: nn.Module) -> None:
    """Refuse an in-scope layer that is not an ``nn.Linear`` (for a backend that quantizes those only).

    Args:
        quantizer_name: the quantizer's name (quoted).
        layer_name: the layer's qualified name (quoted).
        module: the layer.

    Raises:
        QuantizationError: the layer is another kind of module.
    """
    if not isinstance(module, nn.Linear):
        raise QuantizationError(f"{quantizer_name}: layer '{layer_name}' is {type(module).__name__}, not nn.Linear")


def check_group_size(quantizer_name: str, layer_name: str, in_features: int, group_size: int) -> None:
    """Refuse a group size that does not divide a layer's input width.

    Args:
        quantizer_name: the quantizer's name (quoted).
        layer_name: the layer's qualified name (quoted).
        in_features: the layer's input width.
        group_size: the group size (-1 or 0: one group per row, always allowed).

    Raises:
        QuantizationError: it does not divide (the message lists group sizes that do).
    """
    if group_size > 0 and in_features % group_size != 0:
        divisors = [g for g in (8, 16, 32, 64, 128, 256) if in_features % g == 0]
        raise QuantizationError(
            f"{quantizer_name}: group_size={group_size} does not divide the input width {in_features} "
            f"of layer '{layer_name}'; fix: pass a group_size that divides every in-scope layer's "
            f"input width (here e.g. {divisors}) or restrict modules="
        )


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` in the place of the module called ``name``.

    Args:
        model: the model holding it.
        name: the module's qualified name.
        new: the replacement.
    """
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def replace_each(model: nn.Module, targets: list[tuple[str, nn.Module]], make: Callable) -> None:
    """Replace each target layer by ``make(name, module)``, in order, releasing each original as soon as its
    replacement is in place (iterating over the list would keep every original alive until the last replacement:
    a second copy of the decoder's weights at the peak; docs/results.md).

    Args:
        model: the model holding the layers.
        targets: (qualified name, module) pairs; emptied as the layers are replaced.
        make: builds the replacement of one layer from its name and module.
    """
    targets.reverse()
    while targets:
        name, module = targets.pop()
        replace_module(model, name, make(name, module))
        del module


def linear_from_weight(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> nn.Linear:
    """A plain ``nn.Linear`` holding a given (fake-quantized or dequantized) weight, without gradients.

    Args:
        weight: the weight, [out, in].
        bias: the bias, or None.
        dtype: the parameters' dtype.

    Returns:
        The layer, on the weight's device.
    """
    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.detach().to(dtype), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().to(device=weight.device, dtype=dtype), requires_grad=False)
    return linear
