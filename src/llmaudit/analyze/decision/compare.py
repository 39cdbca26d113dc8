"""The paired comparison with full precision (docs/science.md section 12, "Compared with full precision"): does
the quantizer leak more, the same, or less than the model it replaces, on leakage beyond chance.
"""

from __future__ import annotations

import math

import numpy as np

from llmaudit.analyze.decision.bounds import percentile_interval
from llmaudit.analyze.decision.models import Comparison, Difference, Estimate
from llmaudit.analyze.decision.settings import DecisionSettings
from llmaudit.analyze.decision.verdict import none_if_nan

STATISTIC = (
    "difference of leakage beyond chance (TPR minus the realised FPR of the same rows) of the two rules' headlines"
)


def _equivalent_per_attack(per_attack: list[Difference], margin: float) -> tuple[bool, Difference | None]:
    """(every attack's paired difference of leakage beyond chance has its interval inside (-margin, +margin), the
    attack whose interval reaches furthest); False without any interval."""
    diffs = [
        d for d in per_attack if d.metric == "excess_tpr" and d.estimate.low is not None and d.estimate.high is not None
    ]
    if not diffs:
        return False, None
    widest = max(diffs, key=lambda d: max(abs(d.estimate.low), abs(d.estimate.high)))  # type: ignore[arg-type]
    return all(-margin < d.estimate.low and d.estimate.high < margin for d in diffs), widest  # type: ignore[operator]


def compare(
    quantizer: str,
    reference: str,
    diff_resampled: np.ndarray,
    per_attack: list[Difference],
    s: DecisionSettings,
) -> Comparison:
    """Compare a quantizer with the reference (full precision) on leakage beyond chance.

    The direction is MORE when D's two-sided 1 - alpha percentile interval lies above 0, LESS when below (a false
    MORE or LESS has probability at most alpha in all); SAME when every attack's paired difference of excess lies
    inside (-margin, +margin) (intersection-union of two one-sided tests per attack: a false SAME has probability
    at most alpha); else CANNOT TELL. A significant difference inside the margin keeps MORE / LESS and says so.

    Args:
        quantizer (str): the quantizer compared.
        reference (str): the reference it is compared with.
        diff_resampled (np.ndarray): [B + 1] D = excess(quantizer) - excess(reference), row 0 observed, where excess
            is the rule's headline TPR minus the realised FPR of the same rows (both on the same resampled samples):
            a model that scores every record alike has no excess, so a null reads neither MORE nor LESS.
        per_attack (list[Difference]): each attack's paired differences (metric "excess_tpr" is what SAME reads),
            intervals at 1 - 2 alpha.
        s (DecisionSettings): the rule's settings (alpha, margin).
    Returns:
        Comparison: MORE / SAME / LESS / CANNOT TELL (NOT MEASURED without a headline on both), the difference with
        its interval, and a sentence.
    """
    d = diff_resampled[0]
    lo, hi = percentile_interval(diff_resampled[1:], s.alpha / 2, 1 - s.alpha / 2)
    est = Estimate(
        value=none_if_nan(d),
        low=none_if_nan(lo),
        high=none_if_nan(hi),
        confidence=1 - s.alpha,
        method="paired percentile bootstrap (two-sided)",
    )
    base = {"reference": reference, "difference": est, "margin": s.margin, "per_attack": per_attack}
    base["statistic"] = STATISTIC
    if not math.isfinite(d) or not math.isfinite(lo):
        why = f"{quantizer} cannot be compared with {reference}: no headline of leakage beyond chance on both"
        return Comparison(direction="NOT MEASURED", equivalent=False, sentence=why, **base)
    equivalent, widest = _equivalent_per_attack(per_attack, s.margin)
    direction = "MORE" if lo > 0 else "LESS" if hi < 0 else "SAME" if equivalent else "CANNOT TELL"
    sentence = _sentence(quantizer, reference, direction, f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]", widest, s.margin)
    if direction in ("MORE", "LESS") and equivalent:
        sentence += f", by less than the margin +-{s.margin:g} on every attack"
    return Comparison(direction=direction, equivalent=equivalent, sentence=sentence, **base)  # type: ignore[arg-type]


def _sentence(quantizer: str, reference: str, direction: str, interval: str, widest, margin: float) -> str:
    span = f"leakage beyond chance {interval}"
    if widest is not None:
        w = widest.estimate
        span += f"; widest per attack {widest.attack} {w.value:+.3f} [{w.low:+.3f}, {w.high:+.3f}]"
    return {
        "MORE": f"{quantizer} leaks more than {reference} ({span})",
        "LESS": f"{quantizer} leaks less than {reference} ({span})",
        "SAME": f"{quantizer} leaks the same as {reference}: every attack within +-{margin:g} ({span})",
        "CANNOT TELL": f"the data cannot tell whether {quantizer} leaks more or less than {reference} (intervals "
        f"reach beyond +-{margin:g}: {span})",
    }[direction]
