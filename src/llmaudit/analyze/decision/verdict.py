"""The three-way verdict of the attack criterion (docs/science.md section 12): the tests it reads, in order, and
what more data would decide an open verdict, computed from the judged attacks' own estimates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmaudit.analyze.decision.bounds import samples_factor
from llmaudit.analyze.decision.models import AttackJudgement, SizeNeeded, StrongestAttack, VerdictTest
from llmaudit.analyze.decision.settings import DecisionSettings


def none_if_nan(x) -> float | None:
    """Turn a missing or non-finite number into None (JSON has no NaN).

    Args:
        x (float | None): the number.
    Returns:
        float | None: x as a float, or None.
    """
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass(frozen=True)
class Verdict:
    """Status, the sentence behind it, what would decide it, and the tests it was read from."""

    status: str
    reason: str
    size: SizeNeeded | None
    tests: list[VerdictTest]


def _fail_test(strongest: StrongestAttack, s: DecisionSettings) -> VerdictTest:
    low = strongest.tpr.low
    return VerdictTest(
        test="FAIL",
        statistic=f"one-sided {1 - s.alpha:g} lower bound of the rule's TPR at {s.fpr:.0%} FPR ({strongest.route})",
        value=low,
        relation=">",
        limit=s.limit,
        held=low is not None and low > s.limit,
    )


def _pass_test(judged: list[AttackJudgement], s: DecisionSettings) -> VerdictTest:
    bounds = [a.upper_bound for a in judged]
    worst = None if not bounds or any(b is None for b in bounds) else max(bounds)  # type: ignore[type-var]
    return VerdictTest(
        test="PASS",
        statistic=f"highest simultaneous upper bound over the {len(judged)} judged attacks (Bonferroni, "
        f"each {1 - s.alpha / max(1, len(judged)):.4g})",
        value=worst,
        relation="<",
        limit=s.limit,
        held=worst is not None and worst < s.limit,
    )


def _measured_test(attacks: list[AttackJudgement], s: DecisionSettings) -> VerdictTest:
    have = max((a.nonmembers for a in attacks), default=0.0)
    return VerdictTest(
        test="MEASURED",
        statistic=f"non-member scores of the attack with the most (a PASS needs 10 / FPR at {s.fpr:.0%} FPR)",
        value=have,
        relation=">=",
        limit=float(s.nonmembers_needed),
        held=have >= s.nonmembers_needed,
    )


def verdict(
    strongest: StrongestAttack, attacks: list[AttackJudgement], s: DecisionSettings, exact_why: str | None = None
) -> Verdict:
    """Read the three-way verdict of the attack criterion from its tests, in order.

    FAIL: the headline's one-sided lower bound is above the limit (leakage shown; a false FAIL has probability
    <= alpha), whether the headline is cross-fitted or exact. PASS: every judged attack's simultaneous upper bound
    is below the limit (a false PASS has probability <= alpha); it needs 10 / FPR non-members. NOT MEASURED: fewer
    non-members than that and no FAIL shown. Otherwise INCONCLUSIVE, with the size that would decide it.

    Args:
        strongest (StrongestAttack): the rule's headline.
        attacks (list[AttackJudgement]): every attack's judgement.
        s (DecisionSettings): the rule's settings.
        exact_why (str | None): why the exact test on few non-members could not be made, where it was tried.
    Returns:
        Verdict: the status, its reason, the size that would decide it and the tests read.
    """
    judged = [a for a in attacks if a.judged]
    fail = _fail_test(strongest, s)
    if fail.held:
        est = strongest.tpr.value
        reason = f"the rule's TPR {est:.3f} ({strongest.route}), lower bound {fail.value:.3f} > limit {s.limit:g}"
        return Verdict("FAIL", reason, None, [fail])
    if not judged:
        measured = _measured_test(attacks, s)
        have = measured.value or 0.0
        text = (
            f"no attack can be judged at {s.fpr:.0%} FPR: {have:.0f} non-member scores, {s.nonmembers_needed} needed "
            "for a PASS (10 / FPR)"
        )
        if strongest.route == "exact" and strongest.tpr.value is not None:
            text += f"; the exact FAIL test's lower bound {fail.value:.3f} is not above the limit {s.limit:g}"
        elif exact_why:
            text += f"; no FAIL can be shown either: {exact_why}"
        factor = s.nonmembers_needed / have if have > 0 else None
        size = SizeNeeded(factor=factor, towards="MEASURED", sentence=_size_sentence(factor, "measure it"))
        tests = [fail, measured] if strongest.route == "exact" else [measured]
        return Verdict("NOT MEASURED", text, size, tests)
    passed = _pass_test(judged, s)
    if passed.held:
        worst = max(judged, key=lambda a: a.upper_bound)  # type: ignore[arg-type, return-value]
        reason = (
            f"every attack's simultaneous upper bound < limit {s.limit:g} (highest: {worst.attack} {passed.value:.3f})"
        )
        return Verdict("PASS", reason, None, [fail, passed])
    return Verdict(
        "INCONCLUSIVE", _open_reason(strongest, judged, s), size_to_decide(strongest, judged, s), [fail, passed]
    )


def _open_reason(strongest: StrongestAttack, judged: list[AttackJudgement], s: DecisionSettings) -> str:
    worst = max(judged, key=lambda a: a.upper_bound if a.upper_bound is not None else math.inf)
    bound = "none" if worst.upper_bound is None else f"{worst.upper_bound:.3f}"
    est, low = (_fmt(x) for x in (strongest.tpr.value, strongest.tpr.low))
    return (
        f"the rule's TPR {est} with lower bound {low} not above the limit {s.limit:g}, and {worst.attack}'s "
        f"simultaneous upper bound {bound} not below it"
    )


def _fmt(x: float | None) -> str:
    return "none" if x is None else f"{x:.3f}"


def _towards_fail(strongest: StrongestAttack, judged: list[AttackJudgement], s: DecisionSettings):
    """(factor, attack) pairs that would show FAIL if the estimates hold: the headline's, and each attack's at the
    measuring threshold whose estimate is above the limit (the rule settles on such an attack as data grow)."""
    out = []
    est, low = strongest.tpr.value, strongest.tpr.low
    if est is not None and low is not None and est > s.limit:
        out.append((samples_factor(est - low, est - s.limit), None))
    for a in judged:
        m = a.measured
        if m is not None and m.value is not None and m.low is not None and m.value > s.limit:
            out.append((samples_factor(m.value - m.low, m.value - s.limit), a.attack))
    return [(f, a) for f, a in out if f is not None]


def size_to_decide(strongest: StrongestAttack, judged: list[AttackJudgement], s: DecisionSettings) -> SizeNeeded:
    """Size the data that would turn INCONCLUSIVE into FAIL or PASS if the estimates hold.

    Standard errors shrink as 1 / sqrt(n). Towards FAIL, the smallest factor that moves a lower bound (the
    headline's, or an attack's at the measuring threshold whose estimate is above the limit) past the limit; towards
    PASS, where every judged attack's estimate is below the limit, the factor that moves the last upper bound below
    it. The smaller of the two is kept.

    Args:
        strongest (StrongestAttack): the rule's headline.
        judged (list[AttackJudgement]): the judged attacks.
        s (DecisionSettings): the rule's settings.
    Returns:
        SizeNeeded: the factor on the audited samples, its direction and a sentence; factor None only where no
        estimate is on either side of the limit (one sits on it).
    """
    options = [(f, "FAIL", a) for f, a in _towards_fail(strongest, judged, s)]
    if all(a.tpr.value is not None and a.tpr.value < s.limit for a in judged):
        factors = [
            samples_factor((a.upper_bound or 0.0) - (a.tpr.value or 0.0), s.limit - (a.tpr.value or 0.0))
            for a in judged
            if a.upper_bound is None or a.upper_bound >= s.limit
        ]
        if all(f is not None for f in factors):
            options.append((max(factors, default=1.0), "PASS", None))  # type: ignore[type-var]
    if not options:
        at = max(judged, key=lambda a: a.tpr.value if a.tpr.value is not None else -1.0)
        return SizeNeeded(
            factor=None,
            towards=None,
            sentence=f"no sample size decides it if the estimates hold: {at.attack}'s TPR {at.tpr.value:.3f} at the "
            f"threshold a PASS reads is not below the limit {s.limit:g}, and no attack's TPR at the measuring "
            "threshold is above it",
            attack=at.attack,
        )
    factor, towards, attack = min(options, key=lambda o: o[0])
    sentence = _size_sentence(factor, towards) + (f" ({attack}'s estimate)" if attack else "")
    return SizeNeeded(factor=factor, towards=towards, sentence=sentence, attack=attack)  # type: ignore[arg-type]


def _size_sentence(factor: float | None, towards: str) -> str:
    if factor is None:
        return "more data cannot be sized from what was observed"
    word = {"FAIL": "show FAIL", "PASS": "clear PASS"}.get(towards, towards)
    return f"about {factor:.1f}x the audited samples would {word} if the estimates hold"
