"""Quantization adapters: one registry of named quantizers over several backends.

>>> q = get_quantizer("hqq-4", group_size=64, device="auto")
>>> q.check(model); qmodel = q.quantize_model(model)

Importing this package never imports bitsandbytes, gptqmodel, hqq or llama.cpp: each backend imports its library
inside ``quantize_model``, behind a cached ``importlib.util.find_spec`` availability check.
"""

from __future__ import annotations

from .awq_backend import AWQ_BITS, AWQQuantizer
from .base import DEFAULT_MODULES, QuantizationError, Quantizer, QuantizerInfo
from .bnb_backend import BNB_KINDS, BnbQuantizer
from .full import FULL_DTYPES, FULL_PRECISION_NAMES, FullPrecision, full_precision_reference, missing_reference
from .gguf_backend import GGUF_NAMES, GGUFQuantizer
from .gptq_backend import GPTQ_BITS, GPTQQuantizer
from .hqq_backend import HQQ_BITS, HQQQuantizer
from .simple import SIMPLE_SPECS, SimpleQuantizer, sign_quantize, ternary_quantize, uniform_quantize

_REGISTRY: dict[str, type[Quantizer]] = {
    **dict.fromkeys(FULL_DTYPES, FullPrecision),
    **dict.fromkeys(BNB_KINDS, BnbQuantizer),
    **dict.fromkeys(GPTQ_BITS, GPTQQuantizer),
    **dict.fromkeys(HQQ_BITS, HQQQuantizer),
    **dict.fromkeys(SIMPLE_SPECS, SimpleQuantizer),
    **dict.fromkeys(AWQ_BITS, AWQQuantizer),
    **dict.fromkeys(GGUF_NAMES, GGUFQuantizer),
}

QUANTIZER_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def get_quantizer(name: str, **options) -> Quantizer:
    """The quantizer called ``name`` with validated ``options`` (unknown key or bad value ->
    QuantizationError naming the key, the value and what is allowed). Does not import the backend."""
    if name == "full":
        raise QuantizationError(
            "quantizer 'full' is a recipe's placeholder for the run store's full precision: it is named for the dtype "
            "the store computes in (bf16, fp32 or fp16) once the store is known; name one of those here."
        )
    if name not in _REGISTRY:
        raise QuantizationError(f"unknown quantizer {name!r}; allowed: {[*QUANTIZER_NAMES, 'full']}")
    return _REGISTRY[name](name, **options)


def list_quantizers() -> list[QuantizerInfo]:
    """Every quantizer with its family, nominal bits and whether it can run here (else why not)."""
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
    "list_quantizers",
    "full_precision_reference",
    "missing_reference",
    "sign_quantize",
    "ternary_quantize",
    "uniform_quantize",
]
