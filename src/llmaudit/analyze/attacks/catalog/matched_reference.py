"""ref_qbase: the reference attack against the base model quantized like the target (docs/science.md section 4)."""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.registry import AttackSpec
from llmaudit.analyze.attacks.text import ref_score


def ref_qbase(ctx: AttackContext) -> np.ndarray:
    """Score the reference attack against the base model quantized like the target: -(L_target - L_qbase).

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    Raises:
        AttackUnavailable: when the base model was not scored under this quantizer.
    """
    ref = ctx.reference_rows("matched")["loss"].to_numpy(dtype=np.float64)
    t = ctx.target
    return np.stack([ref_score(t.loss[m], ref, np.isfinite(ref)) for m in range(t.runs.size)])


SPECS: list[AttackSpec] = []

SPECS.append(
    AttackSpec(
        "ref_qbase",
        1,
        ref_qbase,
        "-(L_target-L_base),base=same-quantizer",
        "reference attack against the base model quantized like the target: -(L_target(x) - L_qbase(x))",
        references=("matched",),
    )
)
