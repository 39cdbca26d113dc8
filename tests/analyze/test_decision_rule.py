"""The release rule with known truth (docs/science.md section 12): correlated attacks around the limit, one of them
anti-conservatively calibrated (its analytic threshold lets 3.7% of non-members through), pooled over several
targets; and one target judged on its own held-out non-members. What the rule claims: its headline is at least that
of the best attack fixed beforehand minus the selection cost; a false FAIL and a false PASS each have probability
at most alpha; no leakage never FAILs; its intervals have the coverage they state; an open verdict is sized from
the judged attacks' estimates."""

from __future__ import annotations

import numpy as np
import pytest

from llmaudit.analyze.decision import DecisionSettings, decide
from llmaudit.analyze.decision.models import AttackJudgement, Estimate, StrongestAttack
from llmaudit.analyze.decision.verdict import size_to_decide
from tests.analyze.simulate_decision import Miscalibrated, calibrated, empirical, rates

MC = 0.045  # allowance for Monte-Carlo error: about 3 standard errors of a 5% rate over 200 repetitions
SELECTION_COST = 0.025
"""The most the headline may lose, on average, against the best attack fixed beforehand (docs/science.md section
12, "What the simulations show", states what these configurations measure)."""
LEAK = ([0.12, 0.10, 0.08, 0.03], Miscalibrated(at_analytic=0.20, true_tpr=0.01))
"""Four attacks and one whose TPR at the analytic threshold (0.20) hides a TPR at 1% FPR at chance (0.01)."""


def _audits(make, reps: int, seed: int, resamples: int = 150) -> list:
    rng = np.random.default_rng(seed)
    s = DecisionSettings(resamples=resamples)
    return [decide({"q": make(rng)}, None, s).per_quantizer["q"] for _ in range(reps)]


def _measured(d, attack: str) -> float:
    """The attack's TPR where an auditor who fixed it beforehand would measure it (`measured`; where a result has
    no such field, the TPR it judged the attack by)."""
    a = next(a for a in d.attacks if a.attack == attack)
    return (getattr(a, "measured", None) or a.tpr).value


def test_the_rule_keeps_a_leak_that_an_anticonservative_attack_would_hide():
    """The anti-conservative attack looks strongest at the analytic threshold (0.20 against 0.12): chosen there and
    measured at the threshold that holds 1% FPR, it finds chance-level hits and the leak is lost (the rule before
    issue 44: headline about 0.01). Chosen at the threshold it is measured at, it is almost never chosen and the
    headline stays within the selection cost of the best attack fixed beforehand."""
    got = _audits(lambda rng: calibrated(rng, LEAK[0], miscalibrated=LEAK[1]), 12, seed=0, resamples=60)
    headline = np.mean([d.strongest.tpr.value for d in got])
    best_fixed = np.mean([_measured(d, "a0") for d in got])
    assert headline >= best_fixed - SELECTION_COST
    assert np.mean([a == "mis" for d in got for a in d.strongest.selected]) <= 0.1
    assert np.mean([_measured(d, "mis") for d in got]) < 0.03  # the attack the old rule chose: chance at 1% FPR


@pytest.mark.slow
@pytest.mark.parametrize(
    "tprs, mis",
    [LEAK, ([0.08, 0.07, 0.06, 0.03], Miscalibrated(0.12, 0.01)), ([0.06] * 5, Miscalibrated(0.15, 0.06))],
)
def test_the_headline_is_at_least_the_best_fixed_attack_minus_the_selection_cost(tprs, mis):
    got = _audits(lambda rng: calibrated(rng, tprs, miscalibrated=mis), 60, seed=1)
    headline = np.mean([d.strongest.tpr.value for d in got])
    best_fixed = max(np.mean([_measured(d, a) for d in got]) for a in [f"a{i}" for i in range(len(tprs))])
    assert headline >= best_fixed - SELECTION_COST


@pytest.mark.slow
def test_false_fail_rate_at_the_limit_is_at_most_alpha_where_the_in_sample_maximum_fails_almost_always():
    """Every attack's true TPR at 1% FPR equals the limit, the anti-conservative one's too (0.15 at its analytic
    threshold): the rule FAILs at most alpha of the time; the in-sample maximum is above the limit nearly always."""
    r = rates(
        lambda rng: calibrated(rng, [0.05] * 8, miscalibrated=Miscalibrated(0.15, 0.05)),
        200,
        DecisionSettings(resamples=150),
    )
    assert r["FAIL"] <= 0.05 + MC
    assert r["old_fail"] >= 0.9


@pytest.mark.slow
@pytest.mark.parametrize("limit_attack", ["calibrated", "anticonservative"])
def test_false_pass_rate_with_one_attack_at_the_limit_is_at_most_alpha(limit_attack):
    if limit_attack == "calibrated":
        make = lambda rng: calibrated(rng, [0.05] + [0.01] * 6, miscalibrated=Miscalibrated(0.03, 0.01))  # noqa: E731
    else:
        make = lambda rng: calibrated(rng, [0.01] * 7, miscalibrated=Miscalibrated(0.10, 0.05))  # noqa: E731
    r = rates(make, 200, DecisionSettings(resamples=150), seed=2)
    assert r["PASS"] <= 0.05 + MC


@pytest.mark.slow
def test_no_leakage_never_fails_and_a_pass_comes_with_the_size_it_needs():
    s = DecisionSettings(resamples=150)
    null = rates(lambda rng: calibrated(rng, [0.01] * 8, miscalibrated=Miscalibrated(0.04, 0.01)), 60, s, seed=3)
    assert null["FAIL"] == 0
    # PASS needs every one of the simultaneous upper bounds, at the looser of two thresholds, below 0.05: four times
    # the verdict recipe's samples show that for calibrated attacks at chance
    big = rates(lambda rng: calibrated(rng, [0.01] * 8, N=1024), 20, s, seed=3)
    assert big["PASS"] >= 0.9 and big["FAIL"] == 0
    leaky = rates(
        lambda rng: calibrated(rng, [0.2] + [0.01] * 6, miscalibrated=Miscalibrated(0.3, 0.01)), 30, s, seed=4
    )
    assert leaky["FAIL"] >= 0.95


@pytest.mark.slow
def test_the_headline_interval_has_the_coverage_it_states():
    """Every attack at TPR 0.05 (the anti-conservative one too): [low, high] covers 0.05 with at least the stated
    confidence, less Monte-Carlo error (the measuring threshold holds the FPR, so the estimate errs low if at all)."""
    got = _audits(lambda rng: calibrated(rng, [0.05] * 5, miscalibrated=Miscalibrated(0.15, 0.05)), 200, seed=5)
    assert all(d.strongest.tpr.confidence == pytest.approx(0.9) for d in got)
    covered = np.mean([d.strongest.tpr.low <= 0.05 <= d.strongest.tpr.high for d in got])
    assert covered >= 0.9 - MC


@pytest.mark.slow
def test_single_target_false_fail_rate_at_the_limit_is_at_most_alpha():
    """One target model judged on its own held-out non-members (empirical thresholds, classes crossed over folds of
    samples): 8 correlated attacks at the limit FAIL at most alpha of the time."""
    r = rates(lambda rng: empirical(rng, [0.05] * 8), 200, DecisionSettings(resamples=200), seed=4)
    assert r["FAIL"] <= 0.05 + MC
    assert r["old_fail"] >= 0.7


def _judged(name: str, loose: float, upper: float, measured: float, low: float) -> AttackJudgement:
    return AttackJudgement(
        attack=name,
        tpr=Estimate(value=loose, high=upper),
        upper_bound=upper,
        realised_fpr=0.01,
        members=360,
        nonmembers=1140,
        judged=True,
        measured=Estimate(value=measured, low=low, high=measured + (measured - low)),
    )


def _headline(value: float, low: float) -> StrongestAttack:
    return StrongestAttack(
        tpr=Estimate(value=value, low=low, high=value + (value - low)),
        realised_fpr=0.01,
        selected=["loss"],
        folds=5,
        fold_kind="samples",
        selection_stability={},
        members=360,
        nonmembers=1140,
    )


def test_an_open_verdict_is_sized_from_the_judged_attacks_estimates_by_hand():
    s = DecisionSettings()
    attacks = [_judged("loss", 0.072, 0.11, 0.07, 0.045), _judged("ez_mia", 0.069, 0.10, 0.003, 0.0)]
    # a headline below the limit: LOSS's own estimate above it decides, (0.07 - 0.045)^2 / (0.07 - 0.05)^2
    size = size_to_decide(_headline(0.04, 0.02), attacks, s)
    assert size.towards == "FAIL" and size.attack == "loss" and size.factor == pytest.approx((0.025 / 0.02) ** 2)
    # the headline's own estimate above the limit, closer to a FAIL than LOSS's
    size = size_to_decide(_headline(0.09, 0.03), attacks, s)  # the headline's (0.06 / 0.04)^2 = 2.25: LOSS's is less
    assert size.attack == "loss" and size.factor == pytest.approx(1.5625)
    size = size_to_decide(_headline(0.10, 0.06), attacks, s)  # (0.04 / 0.05)^2 < 1: the factor is at least 1
    assert size.attack is None and size.factor == 1.0
    # every estimate below the limit: towards PASS, the last upper bound to fall below it
    low = [_judged("a", 0.02, 0.06, 0.02, 0.01), _judged("b", 0.03, 0.055, 0.03, 0.02)]
    size = size_to_decide(_headline(0.02, 0.01), low, s)
    assert size.towards == "PASS" and size.factor == pytest.approx(max((0.04 / 0.03) ** 2, (0.025 / 0.02) ** 2))
    # an estimate at the limit the PASS reads and none above it where it is measured: no size, said why
    stuck = [_judged("a", 0.06, 0.09, 0.04, 0.02)]
    size = size_to_decide(_headline(0.04, 0.02), stuck, s)
    assert size.factor is None and "a's TPR 0.060" in size.sentence


def test_every_interval_states_its_own_confidence():
    s = DecisionSettings(resamples=60, alpha=0.1)
    rng = np.random.default_rng(7)
    ev = calibrated(rng, [0.05, 0.02], miscalibrated=Miscalibrated(0.1, 0.02))
    d = decide({"fp": ev, "q": ev}, "fp", s).per_quantizer["q"]
    k = sum(a.judged for a in d.attacks)
    assert d.strongest.tpr.confidence == pytest.approx(0.8) and d.strongest.tpr.low < d.strongest.tpr.high
    assert d.strongest.excess.confidence == pytest.approx(0.8)
    for a in d.attacks:
        assert a.tpr.low is None and a.tpr.confidence == pytest.approx(1 - 0.1 / k)  # one-sided, simultaneous
        assert a.measured.confidence == pytest.approx(0.8) and a.measured.low <= a.measured.value <= a.measured.high
    assert d.comparison.difference.confidence == pytest.approx(0.9)
    assert all(x.estimate.confidence == pytest.approx(0.8) for x in d.comparison.per_attack)
