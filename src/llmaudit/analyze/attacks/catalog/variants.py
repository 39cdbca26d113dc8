"""Labelled variants of one attack (the published codes' conventions, a quantization-matched reference), each a spec
of its own whose recorded definition lists its parameters."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from llmaudit.analyze.attacks.registry import AttackSpec


def variant_text(params: Mapping) -> str:
    """Write a variant's parameters as "key=value" pairs joined by commas.

    Args:
        params (Mapping): the variant's parameters, in order.
    Returns:
        str: the text, e.g. "edge=top,skip_first=False,reference=base".
    """
    return ",".join(f"{k}={v}" for k, v in params.items())


def variant_specs(
    variants: Mapping[str, dict],
    builder: Callable[..., Callable],
    formula: str,
    summaries: Mapping[str, str],
    **spec: object,
) -> list[AttackSpec]:
    """Make one attack spec per labelled variant.

    Each spec's definition is "<formula>,<params>" and the variant's `reference` is what it compares with.

    Args:
        variants (Mapping[str, dict]): the parameters of each variant, by attack name.
        builder (Callable[..., Callable]): `builder(**params)` returns the variant's score builder.
        formula (str): the formula text at the start of every definition.
        summaries (Mapping[str, str]): the one-line summary of each variant, by attack name.
        **spec (object): further `AttackSpec` fields shared by the variants.
    Returns:
        list[AttackSpec]: the specs, in the order of `variants`.
    """
    return [
        AttackSpec(
            name,
            1,
            builder(**params),
            f"{formula},{variant_text(params)}",
            summaries[name],
            references=(params["reference"],),
            **spec,
        )
        for name, params in variants.items()
    ]
