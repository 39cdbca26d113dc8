"""The quantizers' options: each a default, what is allowed in words, and a predicate; ``resolve_options``
validates what a user passes against them."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import QuantizationError

# Linear layers inside the transformer blocks of HF decoders (`model.layers.<i>.self_attn.q_proj`, ...).
# Embeddings, norms and the output head are left alone, as the real backends do.
DEFAULT_MODULES: tuple[str, ...] = (r"(^|\.)layers\.\d+\.",)
DEVICES = ("auto", "cpu", "cuda")


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
