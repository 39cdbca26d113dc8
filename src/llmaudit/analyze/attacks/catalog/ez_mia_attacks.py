"""EZ-MIA (Ilic 2026) and its labelled variants (docs/science.md section 4): the other edge convention (the
authors' code), the first scored position left out, and the quantization-matched reference."""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.catalog.variants import variant_specs
from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.ez_mia import ez_mia_score

EZ_MIA_DEFAULT = {"edge": "top", "skip_first": False}
"""EZ-MIA's conventions (docs/science.md section 4: which one, and the evidence that chose it)."""

EZ_MIA_VARIANTS: dict[str, dict] = {
    "ez_mia": dict(EZ_MIA_DEFAULT, reference="base"),
    "ez_mia_bottom": dict(EZ_MIA_DEFAULT, edge="bottom", reference="base"),
    "ez_mia_skip_first": dict(EZ_MIA_DEFAULT, skip_first=True, reference="base"),
    "ez_mia_qbase": dict(EZ_MIA_DEFAULT, reference="matched"),
}

PREDATES_TOP1 = (
    "EZ-MIA not measurable: table predates top-1 (no token_top1 column, as in loss tables of version 1); "
    "delete the unit files and `llmaudit score` them again to measure it"
)


def ez_mia_builder(edge: str, skip_first: bool, reference: str):
    """Build the score builder of one EZ-MIA variant.

    Args:
        edge (str): the edge convention, "top" or "bottom" (docs/science.md section 4).
        skip_first (bool): leave the first scored position out.
        reference (str): the reference rows, "base" or "matched" (`AttackContext.reference_rows`).
    Returns:
        Callable[[AttackContext], np.ndarray]: the builder of the [M, N] scores of the target's rows against
        `reference`'s, NaN where a row has no usable pair.
    """

    def build(ctx: AttackContext) -> np.ndarray:
        target, ref, usable = ctx.paired_tokens(reference)
        top1 = list(ctx.target.rows["token_top1"])
        scores = ez_mia_score(target, ref, top1, edge=edge, skip_first=skip_first)
        return ctx.per_row(np.where(usable, scores, np.nan))

    return build


_SUMMARY = {
    "ez_mia": "EZ-MIA (Ilic 2026): P / (P + N) of the upward and downward shifts of log p from the base model in the "
    "target's error zone",
    "ez_mia_bottom": "EZ-MIA with the authors' code's edge convention (N = 0 scores 0)",
    "ez_mia_skip_first": "EZ-MIA without the first scored position",
    "ez_mia_qbase": "EZ-MIA against the base model quantized like the target",
}

SPECS = variant_specs(
    EZ_MIA_VARIANTS,
    ez_mia_builder,
    "error-zone,P/(P+N)",
    _SUMMARY,
    columns=("token_top1",),
    missing_columns=PREDATES_TOP1,
)
