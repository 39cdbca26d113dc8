"""The answer in the user's words, the same in every rendering: the terminal's last lines, report.html's banner,
report.md's verdict, the model card and the release gate (docs/reading-a-report.md, "The answer").

First the full-precision baseline (does the fine-tune itself leak?), then one line per candidate quantizer: its
verdict, the criterion that decided it with its number and limit, its leakage (THE headline number,
`llmaudit.report.release.headline_of`), MORE / SAME / LESS than full precision with the paired difference, and
the utility it keeps; last, what may be released. Plain strings: every renderer shows them as text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmaudit.analyze.decision.models import Estimate
from llmaudit.common.formatting import fmt_ci, fmt_num, fmt_pct, fmt_pct_ci
from llmaudit.report.models import Criterion, GridRow, Recommendation, ReportJson
from llmaudit.report.policy import DISABLED, FAIL, INCONCLUSIVE, NOT_MEASURED, PASS
from llmaudit.report.recommend import explain_recommendation, recommend
from llmaudit.report.release import decision_of, headline_of

SEVERITY = {PASS: 0, INCONCLUSIVE: 1, NOT_MEASURED: 2, FAIL: 3}

_RELATION = {
    ("<=", FAIL): ">",
    ("<=", PASS): "<=",
    (">=", FAIL): "<",
    (">=", PASS): ">=",
}
"""How an estimate stands against its limit, by the criterion's comparison and its status (INCONCLUSIVE: across)."""

_INTERVAL = re.compile(r"\[[^\]]*\]")


@dataclass(frozen=True)
class AnswerLine:
    """One quantizer in the answer: every field already in words."""

    quantizer: str
    is_reference: bool
    status: str
    criterion: str | None
    """The id of the criterion that decided the verdict (None: every criterion PASSes)."""
    deciding: str
    """That criterion in words, with its estimate, interval and limit ("" when it is the leakage itself)."""
    leakage: str
    """The headline leakage in words ("leakage TPR 0.140 [0.074, 0.248] > 0.05")."""
    headline: Estimate | None
    comparison: str
    utility: str

    def segments(self) -> list[str]:
        """The line's parts after the verdict, in order.

        Returns:
            The deciding criterion, the leakage, the comparison with full precision and the utility, none empty.
        """
        parts = [self.deciding, self.leakage, self.comparison, self.utility]
        return [p for p in parts if p]

    def text(self) -> str:
        """The whole line: `quantizer  VERDICT  segment; segment; ...`.

        Returns:
            The line's text.
        """
        return f"{self.quantizer}  {self.status}  " + "; ".join(self.segments())


def interval_text(low: float | None, high: float | None, *, signed: bool = False) -> str:
    """An interval as every rendering writes it: " [low, high]".

    Args:
        low: the lower end, or None.
        high: the upper end, or None.
        signed: write each end with its sign and three decimals (a difference).

    Returns:
        The text with its leading space; '' when a side is missing.
    """
    if low is None or high is None:
        return ""
    return f" [{low:+.3f}, {high:+.3f}]" if signed else f" [{fmt_num(low)}, {fmt_num(high)}]"


def proportion_bounds(e: Estimate) -> tuple[float | None, float | None]:
    """A TPR's interval with a one-sided bound's open side closed at the proportion's own limit (0 or 1).

    Args:
        e: the estimate; a one-sided lower bound L reads [L, 1].

    Returns:
        (low, high); (None, None) when neither side was computed.
    """
    if e.low is None and e.high is None:
        return None, None
    return (0.0 if e.low is None else e.low), (1.0 if e.high is None else e.high)


def headline_text(e: Estimate | None) -> str:
    """The headline leakage with its interval: "TPR 0.140 [0.074, 0.248]".

    Args:
        e: the headline estimate, or None.

    Returns:
        The text; "TPR n/a" when not measured.
    """
    if e is None or e.value is None:
        return "TPR n/a"
    return f"TPR {fmt_num(e.value)}{interval_text(*proportion_bounds(e))}"


def level(confidence: float | None) -> str:
    """An interval's confidence as a percentage ("90%").

    Args:
        confidence: the confidence as a fraction, or None.

    Returns:
        The percentage; '' where none was recorded.
    """
    return "" if confidence is None else f"{100 * confidence:.3g}%"


def _status_words(c: Criterion, name: str, value: str, limit: str) -> str:
    if c.status == NOT_MEASURED:
        return f"{name} {value} not judged: {c.reason}" if value else f"{name} not measured: {c.reason}"
    relation = _RELATION.get((c.comparison, c.status), "across")
    return f"{name} {value} {relation} {limit}"


def criterion_words(c: Criterion, row: GridRow) -> str:
    """One criterion in words with its estimate, interval and limit: "validation loss +663.0% [...] > +10%".

    Args:
        c: the checklist criterion.
        row: its quantizer's grid row (the headline leakage).

    Returns:
        The words.
    """
    if c.id == "attack_tpr":
        head = headline_of(row)
        value = "" if head is None or head.value is None else headline_text(head)
        if c.status == PASS:
            return f"leakage {value}: every attack below {c.threshold:g}"
        if c.status == INCONCLUSIVE:
            return f"leakage {value}: undecided against {c.threshold:g}"
        return _status_words(c, "leakage", value, f"{c.threshold:g}")
    if c.id == "utility" and (c.metric or "loss") == "loss":
        value = "" if c.value is None else f"{fmt_pct(c.value)}{fmt_pct_ci(c.ci)}"
        limit = "n/a" if c.threshold is None else f"{100 * c.threshold:+g}%"
        return _status_words(c, "validation loss", value, limit)
    name = {"r_q": "r_Q", "indicator": "indicator"}.get(c.id, str(c.metric or c.id))
    value = "" if c.value is None else f"{fmt_num(c.value)}{fmt_ci(c.ci)}"
    limit = "n/a" if c.threshold is None else f"{c.threshold:g}"
    return _status_words(c, name, value, limit)


def deciding_criterion(report: ReportJson, q: str) -> Criterion | None:
    """The criterion that keeps a quantizer from PASS: the worst-judged one, the first in checklist order among equals.

    Args:
        report: the typed report.
        q: the quantizer.

    Returns:
        The criterion; None when every criterion PASSes (or is DISABLED).
    """
    bad = [c for c in report.checklist.per_quantizer[q].criteria if c.status in SEVERITY and c.status != PASS]
    return max(bad, key=lambda c: SEVERITY[c.status]) if bad else None


def comparison_text(row: GridRow) -> str:
    """MORE / SAME / LESS than full precision with the paired difference and its interval.

    Args:
        row: the quantizer's grid row.

    Returns:
        The words; '' for the reference, "not measured" without a comparison.
    """
    if row.is_reference:
        return ""
    d = decision_of(row)
    if d is None or d.comparison is None:
        return "against full precision: not measured"
    cmp, ref = d.comparison, d.comparison.reference
    words = {"MORE": f"MORE than {ref}", "LESS": f"LESS than {ref}", "SAME": f"SAME as {ref}"}
    head = words.get(cmp.direction, f"{cmp.direction} against {ref}")
    e = cmp.difference
    return head if e.value is None else f"{head} {e.value:+.3f}{interval_text(e.low, e.high, signed=True)}"


def utility_text(c: Criterion) -> str:
    """The utility the quantizer keeps, with its interval: "val loss +1.2% [+0.8%, +1.6%]".

    Args:
        c: the utility criterion.

    Returns:
        The words, on the metric the criterion reads.
    """
    if (c.metric or "loss") == "loss":
        return "val loss n/a" if c.value is None else f"val loss {fmt_pct(c.value)}{fmt_pct_ci(c.ci)}"
    return f"{c.metric} {fmt_num(c.value)}{fmt_ci(c.ci)}"


def answer_line(report: ReportJson, q: str) -> AnswerLine:
    """A quantizer's line of the answer.

    Args:
        report: the typed report.
        q: the quantizer.

    Returns:
        Its verdict with the deciding criterion, leakage, comparison with full precision and utility.
    """
    row, crit = report.row(q), report.criteria(q)
    decided = deciding_criterion(report, q)
    leakage = criterion_words(crit["attack_tpr"], row)
    deciding = ""
    if decided is not None and decided.id != "attack_tpr":
        deciding = criterion_words(decided, row)
    utility = "" if decided is not None and decided.id == "utility" else utility_text(crit["utility"])
    return AnswerLine(
        quantizer=q,
        is_reference=row.is_reference,
        status=report.checklist.per_quantizer[q].overall,
        criterion=None if decided is None else decided.id,
        deciding=deciding,
        leakage=leakage,
        headline=headline_of(row),
        comparison=comparison_text(row),
        utility=utility,
    )


def candidate_lines(report: ReportJson) -> list[AnswerLine]:
    """One line per candidate quantizer (every quantizer but the full-precision reference), in grid order.

    Args:
        report: the typed report.

    Returns:
        The lines.
    """
    return [answer_line(report, r.quantizer) for r in report.grid if not r.is_reference]


NOT_AUDITED = "NOT AUDITED"


def left_out(report: ReportJson) -> list[tuple[str, str]]:
    """The quantizers the recipe asked for only where they can run (score.if_available) that could not run.

    Shown in the answer beside the candidates, never skipped silently.

    Args:
        report: the typed report.

    Returns:
        (quantizer, why) for each one left out where the store was scored.
    """
    return [
        (q, f"left out on the machine that scored it: {why}")
        for q, why in report.provenance.left_out_quantizers.items()
    ]


def reference_row(report: ReportJson) -> GridRow | None:
    """The full-precision reference's grid row.

    Args:
        report: the typed report.

    Returns:
        The row, or None when no reference was audited.
    """
    return next((r for r in report.grid if r.is_reference), None)


def _kept(report: ReportJson) -> list[str]:
    """The candidates whose utility criterion PASSes: the quantizations that keep the model."""
    return [
        r.quantizer
        for r in report.grid
        if not r.is_reference and report.criteria(r.quantizer)["utility"].status == PASS
    ]


def _consequence(report: ReportJson, leaks: bool) -> str:
    """What the baseline means for the candidates: which of those that keep the model are cleared."""
    kept = _kept(report)
    cleared = [q for q in kept if report.checklist.per_quantizer[q].overall == PASS]
    if not [r for r in report.grid if not r.is_reference]:
        return " No quantization was audited."
    if not kept:
        return " No quantization audited keeps the model's utility."
    if leaks and not cleared:
        return " No quantization that keeps the model changes that: none of them is cleared for release."
    if cleared:
        return f" Cleared for release among the quantizations that keep the model: {', '.join(cleared)}."
    return " None of the quantizations that keep the model is cleared for release."


def baseline_sentence(report: ReportJson) -> str:
    """The first sentence of the answer: does the fine-tune itself leak at full precision?

    Args:
        report: the typed report.

    Returns:
        The sentence, with the reference's headline leakage, its interval and the limit.
    """
    ref = reference_row(report)
    if ref is None:
        return "No full-precision reference was audited, so the audit cannot say whether the fine-tune itself leaks."
    q = ref.quantizer
    attack = report.criteria(q)["attack_tpr"]
    head = headline_of(ref)
    limit = f"{attack.threshold:g}"
    at = f"{headline_text(head)}" + (f" ({level(head.confidence)} interval)" if head and head.confidence else "")
    fpr = _fpr_words(report)
    if attack.status == FAIL:
        text = f"Your fine-tune leaks at full precision ({q}): {at} at {fpr} against the limit {limit}."
    elif attack.status == PASS:
        text = (
            f"Your fine-tune does not leak measurably at full precision ({q}): every attack's TPR at {fpr} is "
            f"below the limit {limit} (strongest {at})."
        )
    elif attack.status == INCONCLUSIVE:
        text = f"The audit cannot tell whether your fine-tune leaks at full precision ({q}): {at} at {fpr}, across the limit {limit}."
    else:
        text = f"Leakage at full precision ({q}) is not measured: {attack.reason}."
    overall = report.checklist.per_quantizer[q].overall
    decided = deciding_criterion(report, q)
    if decided is not None and decided.id != "attack_tpr" and decided.status != DISABLED:
        text += f" Full precision's verdict is {overall} on another criterion: {criterion_words(decided, ref)}."
    return text + _consequence(report, attack.status == FAIL)


def _fpr_words(report: ReportJson) -> str:
    rule = report.decision_rule
    fpr = rule.fpr if rule is not None and rule.fpr is not None else 0.01
    return f"{100 * fpr:g}% FPR"


def recommendation_of(report: ReportJson) -> Recommendation:
    """The report's recommendation, ranked again from its own rows where report.json's names the full-precision
    reference or carries no explanation.

    Args:
        report: the typed report.

    Returns:
        The recommendation with its explanation.
    """
    rec = report.recommendation
    if rec.explanation is not None and (rec.quantizer is None or rec.quantizer != report.reference_quantizer):
        return rec
    again = recommend(report.grid, report.checklist)
    again.explanation = explain_recommendation(again, report.checklist, report.grid, report.provenance)
    return again


def conclusion(report: ReportJson) -> str:
    """What may be released, in one sentence (the last line of the answer).

    The full-precision reference is the baseline every quantizer is compared with, never a candidate.

    Args:
        report: the typed report.

    Returns:
        The sentence.
    """
    rec = recommendation_of(report)
    q = rec.quantizer
    if q is not None and rec.cleared_for_release:
        return f"Release {q}: cleared for release."
    if q is not None:
        return (
            f"Nothing is cleared for release; of the quantizations that keep the model, {q} ranks first "
            f"({report.checklist.per_quantizer[q].overall}; order: verdict, comparison with full precision, size, "
            f"utility)."
        )
    if not candidate_lines(report):
        return "Nothing to clear: only full precision was audited."
    return "Nothing is cleared for release: no quantization audited keeps the model's utility."


def cleared_kind(report: ReportJson) -> str:
    """Whether the answer clears a quantization.

    Args:
        report: the typed report.

    Returns:
        "cleared" (a quantization may be released), "notcleared" (none is) or "none" (none keeps the model).
    """
    rec = recommendation_of(report)
    return "none" if rec.quantizer is None else "cleared" if rec.cleared_for_release else "notcleared"


def wrap_segments(head: str, segments: list[str], width: int, indent: int) -> list[str]:
    """`head` followed by `segments` joined with "; ", wrapped between segments.

    A segment longer than a line is wrapped between words, never inside an interval "[low, high]".

    Args:
        head: the start of the first line, ending in a space.
        segments: the parts.
        width: the most columns of a line.
        indent: spaces before each continuation line.

    Returns:
        The lines.
    """
    pieces = [seg + (";" if i < len(segments) - 1 else "") for i, seg in enumerate(segments)]
    lines, current, fresh, pad = [], head, True, " " * indent
    for piece in pieces:
        if len(current) + (0 if fresh else 1) + len(piece) <= width:
            current, fresh = current + ("" if fresh else " ") + piece, False
            continue
        if not fresh:
            lines.append(current.rstrip())
            current, fresh = pad, True
            if len(current) + len(piece) <= width:
                current, fresh = current + piece, False
                continue
        for word in _words(piece):
            if not fresh and len(current) + 1 + len(word) > width:
                lines.append(current.rstrip())
                current, fresh = pad, True
            current, fresh = current + ("" if fresh else " ") + word, False
    lines.append(current.rstrip())
    return lines


def _words(text: str) -> list[str]:
    """The words of `text`, an interval "[low, high]" (with what is glued to it) kept as one word."""
    protected = _INTERVAL.sub(lambda m: m.group(0).replace(" ", "\x00"), text)
    return [w.replace("\x00", " ") for w in protected.split()]


def _held_out(report: ReportJson) -> int | None:
    """Held-out records no run trained on (the validation split the indicator scored)."""
    indicator = report.result.get("indicator")
    per_run = indicator.get("per_run") if isinstance(indicator, dict) else None
    return per_run[0].get("n_samples") if per_run and isinstance(per_run[0], dict) else None


def design_sentence(report: ReportJson) -> str:
    """The membership design in words: a recipe's random draws from a pool, or an import's own split.

    Args:
        report: the typed report.

    Returns:
        The sentence.
    """
    mem = report.provenance.membership
    runs = None if mem is None else mem.runs
    pool = None if mem is None else mem.pool_size
    n_train = sorted({int(n) for n in (mem.n_train or [])}) if mem is not None else []
    members = "-".join(str(n) for n in (n_train[:1] + n_train[-1:] if len(n_train) > 1 else n_train)) or "n/a"
    held = _held_out(report)
    if report.provenance.origin == "import":
        outside = f"{pool - n_train[-1]}" if pool is not None and n_train else "the rest"
        return (
            f"your own split: the members are the {members} records of the training file(s) you supplied, the "
            f"non-members {outside} records of the held-out file you supplied"
            + (f", and {held} more held-out records measure utility" if held else "")
            + f" ({runs} fine-tune(s) audited). The split is yours: the blind baseline (a text-only classifier of "
            "members against non-members) says how much of an attack's success the texts alone explain."
        )
    return (
        f"{runs} independent fine-tuning runs, each on {members} records drawn at random from a pool of {pool} (the "
        "rest of the pool are its non-members)"
        + (f"; {held} held-out records that no run trained on" if held else "")
        + "."
    )
