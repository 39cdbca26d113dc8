"""Labelled variants of one attack (the published codes' conventions, a quantization-matched reference), each a spec
of its own whose recorded definition lists its parameters."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from llmaudit.analyze.attacks.registry import AttackSpec


def variant_text(params: Mapping) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


def variant_specs(
    variants: Mapping[str, dict],
    builder: Callable[..., Callable],
    formula: str,
    summaries: Mapping[str, str],
    **spec: object,
) -> list[AttackSpec]:
    """One spec per variant: `builder(**params)` its score builder, "1:<formula>,<params>" its definition, the
    variant's `reference` what it compares with; `spec`: further AttackSpec fields shared by the variants."""
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
