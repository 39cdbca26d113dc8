"""Sizing before compute (docs/science.md section 12, "Sizing before compute"): from the design alone (the member and
non-member scores the attacks will see per target, the targets, the attacks, the rule's settings), whether a PASS
and a FAIL are within reach, from what leak a FAIL can be shown, and the size that would reach a verdict.

Every figure assumes the best case the rule allows (rows counted as independent, every attack at chance for a
PASS, the expected counts for a FAIL): a design out of reach here is out of reach in any audit; one within reach
may still end INCONCLUSIVE where the estimates sit near the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmaudit.analyze.decision.bounds import wilson, z_value
from llmaudit.analyze.decision.exact import (
    MIN_SELECTION_NONMEMBERS,
    ExactDesign,
    clopper_pearson,
    exact_design,
    nonmembers_for_threshold,
)
from llmaudit.analyze.decision.settings import DecisionSettings


@dataclass(frozen=True)
class Design:
    """What the attacks will see: member and non-member scores per target model, the targets, the attacks."""

    members: int
    nonmembers: int
    targets: int
    attacks: int


@dataclass(frozen=True)
class Reach:
    """What the design can decide (module doc)."""

    design: Design
    mode: str
    pass_reachable: bool
    nonmembers_for_pass: int
    """Non-member scores (pooled over targets) a PASS needs: 10 / FPR."""
    members_for_pass: int | None
    """Member scores (pooled) with which every attack at chance would have its simultaneous upper bound below the
    limit; None where no number does (a limit at or below the FPR)."""
    fail_reachable: bool
    fail_route: str | None
    """cross-fitted (enough non-members for the rule's TPR), exact (few non-members, one target), or None."""
    fail_from_tpr: float | None
    """The smallest true TPR at the FPR whose expected hits would show a FAIL at this size."""
    nonmembers_for_fail: int
    """The fewest non-member scores (per target with one target, else pooled) with which a FAIL can be shown."""

    @property
    def verdict_reachable(self) -> bool:
        """Whether a PASS or a FAIL is within reach."""
        return self.pass_reachable or self.fail_reachable


def _smallest(low: float, high: float, holds, steps: int = 60) -> float | None:
    """The smallest x in (low, high] where the monotone predicate holds (bisection); None where it fails at high."""
    if not holds(high):
        return None
    for _ in range(steps):
        mid = (low + high) / 2
        low, high = (low, mid) if holds(mid) else (mid, high)
    return high


def members_for_pass(attacks: int, s: DecisionSettings) -> int | None:
    """Count the fewest member scores with which an attack at chance can clear a PASS.

    At chance (TPR = FPR) the attack's simultaneous one-sided upper bound (Wilson, z = Phi^-1(1 - alpha / attacks))
    must fall below the limit.

    Args:
        attacks (int): the attacks judged (the Bonferroni divisor).
        s (DecisionSettings): the rule's settings (fpr, limit, alpha).
    Returns:
        int | None: the count; None where the limit is at or below the FPR.
    """
    if s.limit <= s.fpr:
        return None
    z = z_value(s.alpha / max(1, attacks))
    n = _smallest(1.0, 1e9, lambda n: wilson(s.fpr, n, z)[1] < s.limit)
    return None if n is None else int(n) + 1


def _fail_from_cross_fitted(members: int, s: DecisionSettings) -> float | None:
    z = z_value(s.alpha)
    return _smallest(s.limit, 1.0, lambda t: wilson(t, members, z)[0] > s.limit)


def _fail_from_exact(design: ExactDesign, s: DecisionSettings) -> float | None:
    n = design.members
    hits = next((x for x in range(n + 1) if clopper_pearson(x, n, design.alpha_bound)[0] > s.limit), None)
    return None if hits is None else hits / n


def sizing(design: Design, s: DecisionSettings) -> Reach:
    """Say what a design can decide under the release rule.

    Args:
        design (Design): member and non-member scores per target, targets, attacks.
        s (DecisionSettings): the rule's settings (fpr, limit, alpha, folds, min_runs).
    Returns:
        Reach: whether PASS and FAIL are within reach, the smallest TPR a FAIL can show, and the sizes a verdict
        needs.
    """
    mode = "calibrated" if design.targets >= max(2, s.min_runs) else "empirical"
    pooled_non, pooled_mem = design.targets * design.nonmembers, design.targets * design.members
    need_mem = members_for_pass(design.attacks, s)
    pass_ok = pooled_non >= s.nonmembers_needed and need_mem is not None and pooled_mem >= need_mem
    route, tpr, fail_need = None, None, s.nonmembers_needed
    if design.targets == 1:
        fail_need = nonmembers_for_threshold(s.fpr, s.alpha / 2) + (
            MIN_SELECTION_NONMEMBERS if design.attacks > 1 else 0
        )
    if pooled_non >= s.nonmembers_needed and pooled_mem > 0:
        route, tpr = "cross-fitted", _fail_from_cross_fitted(pooled_mem, s)
    elif design.targets == 1:
        exact = exact_design(design.members, design.nonmembers, design.attacks, s)
        if isinstance(exact, ExactDesign):
            route, tpr = "exact", _fail_from_exact(exact, s)
    return Reach(
        design=design,
        mode=mode,
        pass_reachable=pass_ok,
        nonmembers_for_pass=s.nonmembers_needed,
        members_for_pass=need_mem,
        fail_reachable=tpr is not None,
        fail_route=route if tpr is not None else None,
        fail_from_tpr=tpr,
        nonmembers_for_fail=fail_need,
    )


def sizing_lines(reach: Reach, s: DecisionSettings, unit: str = "non-member") -> list[str]:
    """Write the sizing in sentences: the design, PASS, FAIL, and what a verdict needs where none is in reach.

    Args:
        reach (Reach): the sizing (`sizing`).
        s (DecisionSettings): the rule's settings.
        unit (str): how the user calls a non-member (e.g. "held-out record").
    Returns:
        list[str]: one sentence per line.
    """
    d = reach.design
    per = "per target model" if d.targets > 1 else "on the one target model"
    lines = [
        f"{d.members} member and {d.nonmembers} non-member scores {per} ({d.targets} target(s), {reach.mode} mode), "
        f"{d.attacks} attacks; limit {s.limit:g} on the TPR at {s.fpr:.0%} FPR, alpha {s.alpha:g}"
    ]
    pooled_non = d.targets * d.nonmembers
    if reach.pass_reachable:
        lines.append(f"PASS within reach: every attack at chance would clear it (it needs {reach.members_for_pass} "
                     f"member and {reach.nonmembers_for_pass} non-member scores in all)")  # fmt: skip
    elif reach.members_for_pass is None:
        lines.append(f"PASS out of reach: the limit {s.limit:g} is not above the FPR {s.fpr:g}")
    else:
        lines.append(
            f"PASS out of reach: it needs at least {reach.nonmembers_for_pass} {unit} scores (here {pooled_non}) "
            f"and {reach.members_for_pass} member scores (here {d.targets * d.members}) in all"
        )
    if reach.fail_reachable:
        how = "exact test on few non-members" if reach.fail_route == "exact" else "the cross-fitted rule"
        lines.append(f"FAIL within reach when the strongest attack's true TPR at {s.fpr:.0%} FPR is at least "
                     f"{reach.fail_from_tpr:.3f} ({how})")  # fmt: skip
    else:
        lines.append(f"FAIL out of reach: it needs at least {reach.nonmembers_for_fail} {unit} scores "
                     f"{'on the target' if d.targets == 1 else 'in all'} (here {d.nonmembers if d.targets == 1 else pooled_non})")  # fmt: skip
    if not reach.verdict_reachable:
        lines.append(f"no verdict is within reach: every quantizer will be NOT MEASURED; at least "
                     f"{reach.nonmembers_for_fail} {unit} scores would make a FAIL possible, {reach.nonmembers_for_pass} a PASS")  # fmt: skip
    return lines
