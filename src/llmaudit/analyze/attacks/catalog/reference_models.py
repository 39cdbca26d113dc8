"""The reference attack (the target's loss against reference models' losses) and its combinations with LOSS and
zlib (docs/science.md section 4)."""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.lira import balanced_references
from llmaudit.analyze.attacks.registry import AttackSpec, AttackUnavailable
from llmaudit.analyze.attacks.text import combine_scores, ref_score


def ref_matrix(loss: np.ndarray, keep: np.ndarray, base: np.ndarray | None, ref_models: str) -> np.ndarray:
    """Compute the [M, N] reference-attack scores with each run in turn the target.

    References are the other runs' out-models (as many for a member of the target as for a non-member,
    `balanced_references`) and/or the base model.

    Args:
        loss (np.ndarray): [M, N] mean token losses of the runs.
        keep (np.ndarray): [M, N] bool, True where the run trained on the sample.
        base (np.ndarray | None): [N] base-model losses (NaN where unscored); needed for "base" and "both".
        ref_models (str): "runs", "base" or "both".
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    """
    M, N = loss.shape
    out = np.empty((M, N))
    for m in range(M):
        refs, mask = [], []
        if ref_models in ("runs", "both"):
            others = np.arange(M) != m
            refs.append(loss[others])
            mask.append(balanced_references(keep, m)[0][others])
        if ref_models in ("base", "both"):
            refs.append(base[None, :])
            mask.append(np.isfinite(base)[None, :])
        out[m] = ref_score(loss[m], np.concatenate(refs), np.concatenate(mask))
    return out


def ref(ctx: AttackContext) -> np.ndarray:
    """Score the reference attack; with one run and base rows, the base is the reference whatever ref_models says.

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    Raises:
        AttackUnavailable: when the references asked for (base rows, or other runs) are absent.
    """
    t, base = ctx.target, ctx.base_loss
    ref_models = ctx.settings.ref_models
    if ref_models == "runs" and t.runs.size == 1 and base is not None:
        ref_models = "base"
    if ref_models in ("base", "both") and base is None:
        raise AttackUnavailable("no base-model rows (run == -1) on split 'pool' for this quantizer")
    if ref_models == "runs" and t.runs.size == 1:
        raise AttackUnavailable("one fine-tuning run and no base-model rows: no reference model")
    return ref_matrix(t.loss, t.keep, base, ref_models)


def combination(*parts: str):
    """Build the score builder of the sum of the components' per-target z-scores.

    Args:
        *parts (str): the names of the component attacks.
    Returns:
        Callable[[AttackContext], np.ndarray]: the builder of the [M, N] combined scores; it raises
        AttackUnavailable when a component is unavailable.
    """

    def build(ctx: AttackContext) -> np.ndarray:
        matrices, lacking = [], []
        for part in parts:
            try:
                matrices.append(ctx.scores(part))
            except AttackUnavailable:
                lacking.append(part)
        if lacking:
            raise AttackUnavailable(f"component(s) {lacking} unavailable")
        return combine_scores(*matrices, axis=1)

    return build


SPECS: list[AttackSpec] = []

SPECS.append(
    AttackSpec(
        "ref",
        2,
        ref,
        lambda d: f"refs={d.ref_models},out-only,balanced,mean,rounding_ties=0",
        "reference model (Carlini 2021): -(L_target(x) - mean L_ref(x)) over the other runs that did not train on x "
        "and/or the base model",
        references=("runs", "base"),
    )
)
for _name in ("loss+zlib", "loss+ref", "loss+zlib+ref"):
    _refs = ",refs={}" if "ref" in _name.split("+") else ""
    SPECS.append(
        AttackSpec(
            _name,
            2,
            combination(*_name.split("+")),
            (lambda d, r=_refs: "sum_zscore_per_target,rounding_constant=0" + r.format(d.ref_models)),
            f"{_name}: the components' scores z-scored per target and summed with equal weights",
            references=("runs", "base") if "ref" in _name.split("+") else (),
        )
    )
