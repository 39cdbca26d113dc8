"""WBC (Chen 2026) and its labelled variants (docs/science.md section 4): the paper's geometric grid, windows
longer than the text skipped (LeakPro), and the quantization-matched reference."""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.catalog.variants import variant_specs
from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.wbc import WBC_GRIDS, wbc_score

WBC_DEFAULT = {"grid": "config", "long": "clamp"}
"""WBC's conventions (docs/science.md section 4)."""

WBC_VARIANTS: dict[str, dict] = {
    "wbc": dict(WBC_DEFAULT, reference="base"),
    "wbc_paper_grid": dict(WBC_DEFAULT, grid="paper", reference="base"),
    "wbc_skip_long": dict(WBC_DEFAULT, long="skip", reference="base"),
    "wbc_qbase": dict(WBC_DEFAULT, reference="matched"),
}


def wbc_builder(grid: str, long: str, reference: str):
    """Build the score builder of one WBC variant.

    Args:
        grid (str): the window grid, a key of `WBC_GRIDS` ("config" or "paper").
        long (str): windows longer than the text: "clamp" or "skip".
        reference (str): the reference rows, "base" or "matched" (`AttackContext.reference_rows`).
    Returns:
        Callable[[AttackContext], np.ndarray]: the builder of the [M, N] scores of the target's rows against
        `reference`'s, NaN where a row has no usable pair.
    """

    def build(ctx: AttackContext) -> np.ndarray:
        target, ref, usable = ctx.paired_tokens(reference)
        scores = wbc_score(target, ref, windows=WBC_GRIDS[grid], long=long)
        return ctx.per_row(np.where(usable, scores, np.nan))

    return build


_SUMMARY = {
    "wbc": "WBC (Chen 2026): the mean over window sizes of the share of sliding windows in which the base model's "
    "summed token loss exceeds the target's",
    "wbc_paper_grid": "WBC on the paper's geometric window grid",
    "wbc_skip_long": "WBC with windows longer than the text left out (LeakPro)",
    "wbc_qbase": "WBC against the base model quantized like the target",
}

SPECS = variant_specs(WBC_VARIANTS, wbc_builder, "window-sign-vote", _SUMMARY)
