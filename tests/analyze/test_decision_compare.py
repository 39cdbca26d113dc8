"""The comparison with full precision on leakage beyond chance (docs/science.md section 12, "Compared with full
precision"): simulations with known truth where neither model leaks, one of them a quantizer that scores every
record alike, and where the quantizer leaks more."""

from __future__ import annotations

import numpy as np
import pytest

from llmaudit.analyze.decision import DecisionSettings, QuantizerEvidence, decide
from llmaudit.analyze.decision.compare import compare
from llmaudit.analyze.decision.models import Difference, Estimate
from tests.analyze.simulate_decision import Miscalibrated, calibrated, empirical

MC = 0.045  # about 3 standard errors of a 5% rate over 200 repetitions


def _as(ev: QuantizerEvidence, name: str, scores: dict) -> QuantizerEvidence:
    return QuantizerEvidence(name, ev.mode, ev.sample_ids, ev.keep, scores)


def _null_pair(rng, degenerate: bool) -> dict:
    """Full precision at chance (members scored like non-members, one attack miscalibrated), and a quantizer that
    is also at chance: its scores are full precision's plus quantization noise, or (degenerate) every score equal,
    as from a model the quantizer destroyed."""
    ref = calibrated(rng, [0.01] * 4, miscalibrated=Miscalibrated(0.04, 0.01))
    if degenerate:
        q = {a: np.zeros_like(v) for a, v in ref.scores.items()}
    else:
        q = {a: v + 0.3 * rng.normal(size=v.shape) for a, v in ref.scores.items()}
    return {"fp": _as(ref, "fp", ref.scores), "q": _as(ref, "q", q)}


def _directions(make, reps: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    s = DecisionSettings(resamples=100)
    return [decide(make(rng), "fp", s).per_quantizer["q"].comparison.direction for _ in range(reps)]


@pytest.mark.slow
@pytest.mark.parametrize("degenerate", [True, False])
def test_a_null_reads_more_or_less_at_most_alpha_of_the_time(degenerate):
    """Neither model leaks: MORE or LESS (together) at most alpha of the time, including against a quantizer that
    scores every record alike (no hits at all: TPR 0, FPR 0), which a comparison of hits would call LESS whenever
    full precision's chance-level hits are many enough."""
    got = _directions(lambda rng: _null_pair(rng, degenerate), 200, seed=1 + degenerate)
    assert (got.count("MORE") + got.count("LESS")) / len(got) <= 0.05 + MC


def test_the_degenerate_quantizer_has_no_leakage_beyond_chance_and_no_hits():
    d = decide(_null_pair(np.random.default_rng(3), True), "fp", DecisionSettings(resamples=100)).per_quantizer["q"]
    assert d.strongest.tpr.value == 0.0 and d.strongest.realised_fpr == 0.0
    assert d.strongest.excess.value == 0.0
    assert d.comparison.statistic.startswith("difference of leakage beyond chance")


def _more_pair(rng, planted: float) -> dict:
    ref = calibrated(rng, [0.05] * 4)
    q = {a: v + 0.15 * rng.normal(size=v.shape) + planted * ref.keep for a, v in ref.scores.items()}
    return {"fp": _as(ref, "fp", ref.scores), "q": _as(ref, "q", q)}


@pytest.mark.slow
def test_a_quantizer_that_leaks_more_reads_more():
    got = _directions(lambda rng: _more_pair(rng, 0.8), 20, seed=4)
    assert got.count("MORE") >= 18


def test_the_reference_against_itself_is_the_same_with_difference_zero():
    d = decide(_more_pair(np.random.default_rng(5), 0.0), "fp", DecisionSettings(resamples=100)).per_quantizer["fp"]
    assert d.comparison.direction == "SAME" and d.comparison.difference.value == 0.0
    assert {x.metric for x in d.comparison.per_attack} == {"tpr", "excess_tpr", "auroc"}


def test_one_target_null_reads_neither_more_nor_less_against_a_degenerate_quantizer():
    rng = np.random.default_rng(6)
    ref = empirical(rng, [0.01] * 3)
    pair = {"fp": _as(ref, "fp", ref.scores), "q": _as(ref, "q", {a: np.zeros_like(v) for a, v in ref.scores.items()})}
    c = decide(pair, "fp", DecisionSettings(resamples=100)).per_quantizer["q"].comparison
    assert c.direction in ("SAME", "CANNOT TELL") and c.difference.low <= 0 <= c.difference.high


def _diff(low: float, high: float, metric: str = "excess_tpr") -> Difference:
    return Difference(attack="a", metric=metric, estimate=Estimate(value=(low + high) / 2, low=low, high=high))


def test_compare_reads_the_two_sided_one_minus_alpha_interval_and_the_margin_by_hand():
    s = DecisionSettings(alpha=0.1, margin=0.01)
    draws = np.r_[0.02, np.linspace(0.001, 0.04, 1000)]  # observed 0.02; 5% and 95% quantiles ~0.003 and ~0.038
    c = compare("q", "fp", draws, [_diff(-0.005, 0.005)], s)
    assert c.direction == "MORE" and c.difference.confidence == pytest.approx(0.9)
    assert c.difference.low == pytest.approx(np.quantile(draws[1:], 0.05))
    assert c.sentence.endswith("by less than the margin +-0.01 on every attack")
    c = compare("q", "fp", draws - 0.01, [_diff(-0.005, 0.005)], s)  # the interval reaches 0: not MORE
    assert c.direction == "SAME" and c.equivalent
    c = compare("q", "fp", draws - 0.01, [_diff(-0.005, 0.005), _diff(-0.02, 0.0)], s)
    assert c.direction == "CANNOT TELL" and not c.equivalent
    c = compare("q", "fp", draws - 0.01, [_diff(-0.005, 0.005, metric="tpr")], s)  # SAME reads excess_tpr only
    assert c.direction == "CANNOT TELL"
