"""The recommendation: which quantizer to release, and the paragraph that says why (docs/science.md section 12).

Candidates are the quantizers whose utility criterion PASSes, the full-precision reference excepted: it is the
baseline every quantizer is compared with (the answer states its verdict first), not a quantization to choose. They are ranked on what the audit can actually tell
apart, never on the noise of an estimate: the overall verdict first (PASS, INCONCLUSIVE, NOT MEASURED, FAIL), then
the comparison with full precision (leaks LESS, the SAME, CANNOT TELL, NOT MEASURED, MORE), then the smaller model
(effective bits per weight), then the smaller utility loss. Two quantizers the data cannot tell apart on leakage
are thus separated by what the releaser gains (size) and loses (utility), both measured without selection.
"""

from __future__ import annotations

import math
from typing import Any

from llmaudit.common.formatting import fmt_ci, fmt_num, fmt_pct
from llmaudit.report.models import Checklist, Criterion, GridRow, Provenance, Recommendation, RunnerUp
from llmaudit.report.policy import FAIL, INCONCLUSIVE, NOT_MEASURED, PASS
from llmaudit.report.release import DIRECTION_ORDER, comparison_sentence, direction_of, size_phrase

SEVERITY = {PASS: 0, INCONCLUSIVE: 1, NOT_MEASURED: 2, FAIL: 3}

RULE = (
    "candidates: every quantizer but the full-precision reference with its utility criterion PASS; order: the overall verdict (PASS, INCONCLUSIVE, NOT MEASURED, FAIL), then "
    "the comparison with full precision (leaks less, the same, cannot tell, not measured, more), then the smaller "
    "model (effective bits per weight), then the smaller utility loss"
)

_KEY_WORDS = ("its verdict", "its comparison with full precision", "its size", "its utility")
_CRITERION_WORDS = {"attack_tpr": "leakage", "r_q": "r_Q", "indicator": "indicator", "utility": "utility"}


def crit(checklist: Checklist, q: str, cid: str) -> Criterion:
    """One criterion of one quantizer in the checklist.

    Args:
        checklist: the report's checklist.
        q: the quantizer.
        cid: the criterion's id ("attack_tpr", "r_q", "indicator", "utility").

    Returns:
        The criterion.
    """
    return checklist.per_quantizer[q].criterion(cid)


def _bits(r: GridRow) -> float:
    for bits in (r.effective_bits, r.bits):
        if bits is not None:
            return float(bits)
    return math.inf


def excess(c: Criterion) -> float:
    """How far a criterion's estimate is on the unsafe side of its limit.

    Args:
        c: the criterion.

    Returns:
        The distance (negative: the safe side; inf: no estimate or no limit).
    """
    if c.value is None or c.threshold is None:
        return math.inf
    return c.value - c.threshold if c.comparison == "<=" else c.threshold - c.value


def ranking_key(r: GridRow, checklist: Checklist) -> tuple:
    """The recommendation's ordering of a candidate grid row (lower = preferred): module doc.

    Args:
        r: the grid row.
        checklist: the report's checklist.

    Returns:
        The key: verdict, comparison with full precision, bits, utility margin.
    """
    q = r.quantizer
    overall = checklist.per_quantizer[q].overall
    return (SEVERITY.get(overall, 9), DIRECTION_ORDER[direction_of(r)], _bits(r), excess(crit(checklist, q, "utility")))


def _lost_on(chosen: tuple, theirs: tuple, names: tuple[dict, dict]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(chosen, theirs)) if a != b), None)
    if i is None:
        return "a tie on every key (grid order decided)"
    mine, other = names
    if i == 0:
        return f"{_KEY_WORDS[0]}: {other['overall']} against {mine['overall']}"
    if i == 1:
        return f"{_KEY_WORDS[1]}: {other['direction']} against {mine['direction']}"
    if i == 2:
        return f"{_KEY_WORDS[2]}: {fmt_num(theirs[2], 2)} against {fmt_num(chosen[2], 2)} effective bits per weight"
    return (
        f"{_KEY_WORDS[3]}: a margin of {fmt_num(-theirs[3])} to the utility limit against {fmt_num(-chosen[3])} "
        f"(the larger margin ranks first)"
    )


def _runner_up(ranked: list[GridRow], checklist: Checklist) -> RunnerUp:
    """The second-ranked quantizer and the key it lost on."""
    chosen, other = ranked[0], ranked[1]
    per_q = checklist.per_quantizer
    names = tuple({"overall": per_q[x.quantizer].overall, "direction": direction_of(x)} for x in (chosen, other))
    return RunnerUp(
        quantizer=other.quantizer,
        lost_on=_lost_on(ranking_key(chosen, checklist), ranking_key(other, checklist), names),
    )


def recommend(grid: list[GridRow], checklist: Checklist) -> Recommendation:
    """The quantizer to release (rules: module doc), whether it is cleared, the ranking and the runner-up.

    Args:
        grid: the report's grid rows.
        checklist: the report's checklist.

    Returns:
        report.json's recommendation (without its explanation).
    """
    per_q = checklist.per_quantizer
    candidates = [r for r in grid if not r.is_reference and crit(checklist, r.quantizer, "utility").status == PASS]
    if not candidates:
        audited = any(not r.is_reference for r in grid)
        return Recommendation(
            quantizer=None,
            rule=RULE,
            overall=None,
            cleared_for_release=False,
            reason="no quantization is within the utility budget with a PASS (see the utility criterion)"
            if audited
            else "only the full-precision reference was audited: there is no quantization to recommend",
        )
    ranked = sorted(candidates, key=lambda r: ranking_key(r, checklist))
    chosen, q = ranked[0], ranked[0].quantizer
    overall = per_q[q].overall
    reason = f"first of {len(candidates)} quantizer(s) within the utility budget: overall {overall}; " + (
        comparison_sentence(chosen) or ""
    )
    runner = _runner_up(ranked, checklist) if len(ranked) > 1 else None
    return Recommendation(
        quantizer=q,
        rule=RULE,
        overall=overall,
        cleared_for_release=overall == PASS,
        reason=reason,
        comparison=direction_of(chosen),
        candidates=[r.quantizer for r in candidates],
        ranking=[r.quantizer for r in ranked],
        runner_up=runner,
    )


def criterion_phrase(c: Criterion) -> str:
    """One criterion in words: its name, estimate with interval, the limit and the status.

    Args:
        c: the criterion.

    Returns:
        The phrase.
    """
    name = {"attack_tpr": "attack TPR at 1% FPR", "r_q": "r_Q", "indicator": "indicator", "utility": "utility"}[c.id]
    if c.id == "attack_tpr" and c.attack:
        name += f" (strongest, cross-fitted: {c.attack})" if c.mode else f" ({c.attack})"
    if c.id == "utility":
        name += f" ({c.metric or 'loss'})"
    limit = "no limit" if c.threshold is None else f"limit {c.comparison} {c.threshold:g}"
    return f"{name} {fmt_num(c.value)}{fmt_ci(c.ci)} against {limit}: {c.status}"


def deciding(checklist: Checklist, q: str) -> Criterion | None:
    """The criterion that keeps a quantizer from PASS: the worst-judged one (first in checklist order).

    Args:
        checklist: the report's checklist.
        q: the quantizer.

    Returns:
        The criterion, None where every criterion passes (or is off).
    """
    bad = [c for c in checklist.per_quantizer[q].criteria if c.status in SEVERITY and c.status != PASS]
    return max(bad, key=lambda c: SEVERITY[c.status]) if bad else None


def what_to_do(c: Criterion, provenance: dict[str, Any] | Provenance) -> str:
    """What would turn a criterion into PASS, said from its own numbers.

    Args:
        c: the criterion.
        provenance: the report's provenance (the audit's size).

    Returns:
        The advice, in one sentence.
    """
    words = _CRITERION_WORDS.get(c.id, c.id)
    if c.id == "attack_tpr" and c.mode and c.status in (INCONCLUSIVE, NOT_MEASURED):
        return size_phrase(c.size_needed, provenance) or f"grow the audit: {c.reason}"
    if c.status == NOT_MEASURED:
        return f"grow the measurement behind its {words}: {c.reason}"
    if c.status == FAIL:
        return (
            f"its {words} fails: the whole interval is beyond the limit; only a limit "
            f"beyond it, or another model, changes that"
        )
    ci = c.ci or [None, None]
    bound = ci[1] if c.comparison == "<=" else ci[0]
    return (
        f"the {words} interval reaches {fmt_num(bound)}, across the limit {c.threshold:g}: more runs or more "
        f"samples narrow it"
    )


def _utility_words(checklist: Checklist, q: str) -> str:
    u = crit(checklist, q, "utility")
    if (u.metric or "loss") == "loss" and u.value is not None:
        return f"at {fmt_pct(u.value)} validation loss"
    return f"at utility ({u.metric}) {fmt_num(u.value)}"


def explain_recommendation(
    recommendation: Recommendation, checklist: Checklist, grid: list[GridRow], provenance: dict[str, Any] | Provenance
) -> str:
    """The recommendation in one paragraph a release manager can read: the quantizer, cleared or not and which
    criterion decided, how it leaks against full precision and at what utility, what would decide an open verdict,
    and the runner-up and why it lost.

    Args:
        recommendation: the report's recommendation.
        checklist: the report's checklist.
        grid: the report's grid rows.
        provenance: the report's provenance.

    Returns:
        The paragraph.
    """
    q = recommendation.quantizer
    if q is None:
        quantized = [r.quantizer for r in grid if not r.is_reference]
        if not quantized:
            return "Only full precision was audited: there is no quantization to recommend."
        utility = {name: crit(checklist, name, "utility") for name in quantized}
        closest = min(utility.items(), key=lambda kv: (SEVERITY.get(kv[1].status, 9), excess(kv[1])))
        return (
            f"No quantization can be released: none keeps enough utility with a PASS (utility criterion). Closest: "
            f"{closest[0]}, {criterion_phrase(closest[1])}. To release one, {what_to_do(closest[1], provenance)}."
        )
    row = next(r for r in grid if r.quantizer == q)
    compared = f"{q} is the full-precision reference" if row.is_reference else comparison_sentence(row)
    decided = deciding(checklist, q)
    if recommendation.cleared_for_release:
        text = f"Release {q}: cleared, every criterion passes ({criterion_phrase(crit(checklist, q, 'attack_tpr'))})"
    else:
        text = f"The first-ranked candidate is {q}, but it is NOT cleared for release" + (
            f": {criterion_phrase(decided)}" if decided else ""
        )
    compared = compared or "no comparison with full precision was measured"
    if not compared.startswith(q):  # a sentence, not a quantizer's name, starts with a capital
        compared = compared[:1].upper() + compared[1:]
    text += f". {compared}, {_utility_words(checklist, q)}."
    if decided and not recommendation.cleared_for_release:
        text += f" To decide it: {what_to_do(decided, provenance)}."
    runner = recommendation.runner_up
    if runner:
        text += f" Runner-up: {runner.quantizer}, which lost on {runner.lost_on}."
    else:
        text += " No other quantizer is within the utility budget."
    return text


__all__ = ["RULE", "criterion_phrase", "explain_recommendation", "recommend"]
