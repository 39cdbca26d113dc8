"""Quantization adapters: one registry of named quantizers over several backends.

>>> q = get_quantizer("hqq-4", group_size=64, device="auto")
>>> q.check(model); qmodel = q.quantize_model(model)

Importing this package never imports bitsandbytes, gptqmodel, hqq or llama.cpp: each backend imports its library
inside ``quantize_model``, behind a cached ``importlib.util.find_spec`` availability check.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llmaudit.common.names import is_safe_name

from .awq_backend import AWQ_BITS, AWQQuantizer
from .base import DEFAULT_MODULES, QuantizationError, Quantizer, QuantizerInfo
from .bnb_backend import BNB_KINDS, BnbQuantizer
from .full import FULL_DTYPES, FULL_PRECISION_NAMES, FullPrecision, full_precision_reference, missing_reference
from .gguf_backend import GGUF_NAMES, GGUFQuantizer
from .gptq_backend import GPTQ_BITS, GPTQQuantizer
from .hqq_backend import HQQ_BITS, HQQQuantizer
from .simple import SIMPLE_SPECS, SimpleQuantizer, sign_quantize, ternary_quantize, uniform_quantize

_REGISTRY: dict[str, type[Quantizer]] = {}


def register_quantizer(cls: type[Quantizer], names: Iterable[str]) -> None:
    """Register a quantizer class under its names: the one list every command, plan and store reads.

    Args:
        cls: a subclass of `Quantizer` (its facts were checked when it was defined).
        names: the names it answers to; each is safe as a file name and not yet taken by another class.

    Raises:
        TypeError: ``cls`` is not a `Quantizer` subclass.
        ValueError: no name, a name unsafe as a path component or reserved (``full``), or one taken by another class.
    """
    if not (isinstance(cls, type) and issubclass(cls, Quantizer)):
        raise TypeError(f"register_quantizer: {cls!r} is not a subclass of llmaudit.quantize.Quantizer")
    names = tuple(names)
    if not names:
        raise ValueError(f"register_quantizer: {cls.__qualname__} is registered under no name")
    for name in names:
        if not isinstance(name, str) or not is_safe_name(name) or name == "full":
            raise ValueError(
                f"register_quantizer: {name!r} cannot name a quantizer (it names files; 'full' is reserved)"
            )
        if _REGISTRY.get(name, cls) is not cls:
            raise ValueError(f"register_quantizer: {name!r} is already {_REGISTRY[name].__qualname__}")
    for name in names:
        _REGISTRY[name] = cls


class _RegisteredNames(Sequence[str]):
    """The registered quantizer names, in registration order, read from the registry at each use."""

    def __getitem__(self, index):  # type: ignore[override]
        return tuple(_REGISTRY)[index]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __contains__(self, name: object) -> bool:
        return name in _REGISTRY

    def __repr__(self) -> str:
        return repr(tuple(_REGISTRY))


for _cls, _names in (
    (FullPrecision, FULL_DTYPES),
    (BnbQuantizer, BNB_KINDS),
    (GPTQQuantizer, GPTQ_BITS),
    (HQQQuantizer, HQQ_BITS),
    (SimpleQuantizer, SIMPLE_SPECS),
    (AWQQuantizer, AWQ_BITS),
    (GGUFQuantizer, GGUF_NAMES),
):
    register_quantizer(_cls, _names)

QUANTIZER_NAMES: Sequence[str] = _RegisteredNames()
"""Every registered quantizer name (a live view of the registry)."""


def quantizer_class(name: str) -> type[Quantizer]:
    """The class registered under ``name``, whose facts (`Quantizer`) need no instance.

    Args:
        name: a registered quantizer name.

    Returns:
        The quantizer class.

    Raises:
        QuantizationError: ``name`` is not registered.
    """
    if name not in _REGISTRY:
        raise QuantizationError(f"unknown quantizer {name!r}; allowed: {[*QUANTIZER_NAMES, 'full']}")
    return _REGISTRY[name]


def tracked_libraries() -> tuple[str, ...]:
    """The distributions whose versions a run store records for the registered quantizers.

    Returns:
        Each registered class's ``tracked_libraries``, in registration order, each name once.
    """
    return tuple(dict.fromkeys(lib for cls in _REGISTRY.values() for lib in cls.tracked_libraries))


def get_quantizer(name: str, **options) -> Quantizer:
    """The quantizer called ``name`` with validated options; does not import the backend's library.

    Args:
        name: a registered quantizer name.
        **options: the quantizer's options (see its class).

    Returns:
        The quantizer.

    Raises:
        QuantizationError: ``full`` (a recipe's placeholder), an unknown name, or an unknown option key or bad value
            (the message names the key, the value and what is allowed).
    """
    if name == "full":
        raise QuantizationError(
            "quantizer 'full' is a recipe's placeholder for the run store's full precision: it is named for the dtype "
            "the store computes in (bf16, fp32 or fp16) once the store is known; name one of those here."
        )
    return quantizer_class(name)(name, **options)


def list_quantizers() -> list[QuantizerInfo]:
    """Every registered quantizer with its family, nominal bits and whether it can run here.

    Returns:
        One `QuantizerInfo` per registered name, in registration order (the reason it cannot run, with the fix).
    """
    infos = []
    for name in QUANTIZER_NAMES:
        q = get_quantizer(name)
        reason = q.availability()
        infos.append(QuantizerInfo(name, q.family, q.bits, reason is None, reason))
    return infos


__all__ = [
    "DEFAULT_MODULES",
    "FULL_PRECISION_NAMES",
    "QUANTIZER_NAMES",
    "QuantizationError",
    "Quantizer",
    "QuantizerInfo",
    "get_quantizer",
    "quantizer_class",
    "register_quantizer",
    "tracked_libraries",
    "list_quantizers",
    "full_precision_reference",
    "missing_reference",
    "sign_quantize",
    "ternary_quantize",
    "uniform_quantize",
]
