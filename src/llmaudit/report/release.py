"""The attack criterion under the release rule (docs/science.md section 12), read from the analysis' typed
decision: status, the cross-fitted strongest attack with its interval, every attack's simultaneous upper bound,
the comparison with full precision, and what would decide an open verdict, in the checklist's shape.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from llmaudit.analyze.decision.models import Estimate, QuantizerDecision, SizeNeeded
from llmaudit.report.models import AttackVerdict, Criterion, GridRow, InSampleMax, Provenance

DIRECTION_ORDER = {"LESS": 0, "SAME": 1, "CANNOT TELL": 2, "NOT MEASURED": 3, "MORE": 4}
"""How the recommendation ranks a quantizer's comparison with full precision (lower = better)."""


def decision_of(row: dict[str, Any] | GridRow) -> QuantizerDecision | None:
    """The typed decision of a grid row (built or read).

    Args:
        row (dict[str, Any] | GridRow): one quantizer's row of the grid.

    Returns:
        QuantizerDecision | None: the decision; None for a report.json without a release decision.
    """
    if isinstance(row, GridRow):
        return row.decision
    raw = row.get("decision")
    return None if raw is None else QuantizerDecision.model_validate(raw)


def headline_of(row: dict[str, Any] | GridRow) -> Estimate | None:
    """THE leakage of a quantizer, the one number every rendering names (docs/reading-a-report.md, "The headline").

    It is the release decision's strongest attack, its TPR at the decision's FPR chosen on other folds and measured
    on each (`QuantizerDecision.strongest.tpr`), with its interval and the interval's confidence as recorded. A
    report.json without a release decision gives its highest calibrated TPR (the attack criterion it was judged on),
    without a recorded confidence.

    Args:
        row (dict[str, Any] | GridRow): one quantizer's row of the grid.

    Returns:
        Estimate | None: the headline; None where neither was measured.
    """
    d = decision_of(row)
    if d is not None:
        return None if d.strongest is None else d.strongest.tpr
    row = row if isinstance(row, GridRow) else GridRow.model_validate(row)
    best = row.best_attack
    if best is None or best.value is None:
        return None
    low, high = best.ci if best.ci else (None, None)
    return Estimate(value=best.value, low=low, high=high, method="highest calibrated TPR (no release rule)")


def chosen_attack(d: QuantizerDecision) -> str | None:
    """The attack the cross-fitting picked most often across folds (ties: the first picked).

    Args:
        d (QuantizerDecision): the quantizer's decision.

    Returns:
        str | None: the attack's name; None when no fold picked one (or no strongest attack).
    """
    picked = [a for a in (d.strongest.selected if d.strongest else []) if a]
    return Counter(picked).most_common(1)[0][0] if picked else None


def _interval(low: float | None, high: float | None) -> list[float] | None:
    return None if low is None or high is None else [low, high]


def attack_criterion(row: GridRow, d: QuantizerDecision) -> Criterion:
    """The attack criterion of one quantizer in the checklist's shape, from its decision.

    Args:
        row (GridRow): the quantizer's row of the grid.
        d (QuantizerDecision): its decision.

    Returns:
        Criterion: the criterion as the checklist reads it.
    """
    s = d.strongest
    mode = (
        "per-sample calibrated, pooled over target models"
        if d.mode == "calibrated"
        else "empirical threshold on held-out non-members"
    )
    per_attack = {
        a.attack: AttackVerdict(
            value=a.tpr.value,
            upper_bound=a.upper_bound,
            judged=a.judged,
            reason=a.reason,
            realised_fpr=a.realised_fpr,
        )
        for a in d.attacks
    }
    return Criterion(
        id="attack_tpr",
        description=f"strongest attack's TPR at {d.fpr:.0%} FPR ({mode}), chosen on other folds and measured on "
        "each (cross-fitting): FAIL if its lower bound is above the limit, PASS if every attack's simultaneous upper "
        "bound is below it",
        threshold=d.limit,
        comparison="<=",
        attack=chosen_attack(d),
        value=s.tpr.value if s else None,
        ci=_interval(s.tpr.low, s.tpr.high) if s else None,
        confidence=s.tpr.confidence if s else None,
        reliable=d.status != "NOT MEASURED",
        status=d.status,
        reason=d.reason,
        mode=d.mode,
        in_sample_max=InSampleMax(
            attack=d.in_sample_max_attack, value=d.in_sample_max.value if d.in_sample_max else None
        ),
        per_attack=per_attack,
        size_needed=d.size_needed.model_dump() if d.size_needed else None,
        run_to_run_covered=d.run_to_run_covered,
        skipped_attacks=row.skipped_attacks,
    )


def direction_of(row: dict[str, Any] | GridRow) -> str:
    """How the quantizer's leakage compares with full precision.

    Args:
        row (dict[str, Any] | GridRow): one quantizer's row of the grid.

    Returns:
        str: MORE / SAME / LESS / CANNOT TELL / NOT MEASURED; SAME for the reference itself.
    """
    if row.is_reference if isinstance(row, GridRow) else row.get("is_reference"):
        return "SAME"
    d = decision_of(row)
    return "NOT MEASURED" if d is None or d.comparison is None else d.comparison.direction


def comparison_sentence(row: dict[str, Any] | GridRow) -> str | None:
    """The paired comparison with full precision in words.

    Args:
        row (dict[str, Any] | GridRow): one quantizer's row of the grid.

    Returns:
        str | None: the comparison's sentence; None without a decision or a comparison.
    """
    d = decision_of(row)
    return None if d is None or d.comparison is None else d.comparison.sentence


def size_phrase(size: dict[str, Any] | SizeNeeded | None, provenance: dict[str, Any] | Provenance) -> str:
    """What would decide an open verdict in the store's own numbers.

    Args:
        size (dict[str, Any] | SizeNeeded | None): the sample size the decision computed.
        provenance (dict[str, Any] | Provenance): where the store's records come from.

    Returns:
        str: the size's sentence, with the pool (a recipe's data.pool_size) or the imported records scaled by the factor
            the decision computed; '' without a size.
    """
    if size is None:
        return ""
    size = size if isinstance(size, SizeNeeded) else SizeNeeded.model_validate(size)
    if size.factor is None or not math.isfinite(size.factor):
        return size.sentence
    prov = provenance if isinstance(provenance, Provenance) else Provenance.model_validate(provenance)
    pool = prov.membership.pool_size if prov.membership else None
    if pool and prov.origin != "import":
        new = int(math.ceil(pool * size.factor))
        recipe = f"{prov.run_dir}/config.yaml" if prov.run_dir else "RECIPE"
        return (
            f"{size.sentence}: a pool of {new} records instead of {pool} (data.pool_size={new}; "
            f"`llmaudit plan {recipe} data.pool_size={new}` prices it)"
        )
    if pool:
        return (
            f"{size.sentence}: about {int(math.ceil(pool * size.factor))} audited records instead of {pool}, members "
            "and held-out non-members in proportion (--max-train / --max-heldout draw more where the files hold "
            "them; the TPR's interval narrows with the members audited)"
        )
    return size.sentence
