"""The exact FAIL test on few non-members (docs/science.md section 12, "A FAIL on few non-members"): its parts by
hand, its error rate at the limit and its power with known truth, and the verdicts it gives one imported target
with 400 held-out records."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from llmaudit.analyze.decision import DecisionSettings, QuantizerEvidence, decide
from llmaudit.analyze.decision.exact import (
    ExactDesign,
    ExactResult,
    clopper_pearson,
    exact_design,
    exact_test,
    nonmembers_for_threshold,
    threshold_rank,
)
from tests.analyze.simulate_decision import empirical, shift_for


def test_threshold_rank_and_the_fewest_non_members_by_hand():
    need = nonmembers_for_threshold(0.01, 0.025)
    assert 0.99**need <= 0.025 < 0.99 ** (need - 1) and need == 368
    assert threshold_rank(need, 0.01, 0.025) == (1, pytest.approx(0.99**need))
    assert threshold_rank(need - 1, 0.01, 0.025)[0] == 0
    k, a = threshold_rank(2000, 0.01, 0.025)  # P[Bin(2000, 0.01) >= k] >= 0.975: k = 12
    assert k == 12 and a == pytest.approx(stats.binom.cdf(11, 2000, 0.01))
    assert stats.binom.sf(11, 2000, 0.01) >= 0.975 > stats.binom.sf(12, 2000, 0.01)


def test_clopper_pearson_equals_scipys_exact_interval():
    for x, n in [(0, 50), (3, 40), (12, 240), (40, 40)]:
        ci = stats.binomtest(x, n).proportion_ci(confidence_level=0.9, method="exact")
        lo, hi = clopper_pearson(x, n, 0.05)
        assert lo == pytest.approx(ci.low, abs=1e-9) and hi == pytest.approx(ci.high, abs=1e-9)


def test_the_design_splits_what_the_threshold_can_spare():
    s = DecisionSettings()
    d = exact_design(300, 400, 9, s)
    assert isinstance(d, ExactDesign)
    assert (d.selection_members, d.selection_nonmembers, d.members, d.nonmembers) == (60, 32, 240, 368)
    assert d.k == 1 and d.alpha_threshold + d.alpha_bound == pytest.approx(0.05) and d.alpha_threshold <= 0.025
    one = exact_design(300, 400, 1, s)  # one attack: nothing to choose, every score measured
    assert (one.selection_members, one.selection_nonmembers, one.members, one.nonmembers) == (0, 0, 300, 400)
    assert "needs at least 378" in exact_design(300, 377, 9, s)
    assert "needs at least 368" in exact_design(300, 300, 1, s)


def _flat_above_the_quantile(rng, n_mem: int, n_non: int, tpr: float, attacks: int) -> tuple[dict, np.ndarray]:
    """The exact test's worst case: a member is far above every non-member with probability pi, else scored like
    a non-member, pi chosen so that the true TPR at 1% FPR is `tpr` (pi + (1 - pi) 0.01); any threshold above the
    1% quantile then keeps almost that TPR. Several attacks share the far members (correlated)."""
    pi = (tpr - 0.01) / 0.99
    member = np.r_[np.ones(n_mem, bool), np.zeros(n_non, bool)]
    far = rng.random(n_mem + n_non) < pi
    scores = {}
    for a in range(attacks):
        x = rng.normal(size=member.size)
        scores[f"a{a}"] = np.where(member & far, 10.0 + x, x)
    return scores, member


@pytest.mark.slow
def test_false_fail_rate_at_the_limit_is_at_most_alpha_and_power_on_a_large_leak():
    """Known truth, one target with 300 members and 400 non-members (the threshold's error and the bound's add to
    alpha): every attack at the limit FAILs at most alpha of the time (4,000 audits, three attacks: the selection
    included); an attack at TPR 0.3 FAILs nearly always."""
    s = DecisionSettings()
    rng = np.random.default_rng(0)
    reps = 4000
    fails = sum(exact_test(*_flat_above_the_quantile(rng, 300, 400, 0.05, 3), s).lower > s.limit for _ in range(reps))
    assert fails / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)
    leaks = [exact_test(*_flat_above_the_quantile(rng, 300, 400, 0.3, 3), s) for _ in range(200)]
    assert np.mean([r.lower > s.limit for r in leaks]) >= 0.95


def test_a_binormal_leak_is_found_and_the_attack_chosen_is_the_leaky_one():
    s = DecisionSettings()
    rng = np.random.default_rng(1)
    got = []
    for _ in range(100):
        ev = empirical(rng, [0.01, 0.45, 0.02], n_mem=300, n_non=400)
        got.append(exact_test({a: v[0] for a, v in ev.scores.items()}, ev.keep[0], s))
    assert np.mean([r.attack == "a1" for r in got]) >= 0.95
    assert np.mean([r.lower > s.limit for r in got]) >= 0.9
    assert all(r.realised_fpr <= 0.01 for r in got)


def _one_target(rng, tprs, n_mem=300, n_non=400, targets=1) -> dict:
    ev = empirical(rng, tprs, n_mem=n_mem, n_non=n_non)
    if targets == 1:
        return {"fp": ev}
    keep = np.repeat(ev.keep, targets, axis=0)
    scores = {
        a: np.repeat(v, targets, axis=0) + 0.1 * rng.normal(size=(targets, v.shape[1])) for a, v in ev.scores.items()
    }
    return {"fp": QuantizerEvidence("fp", "empirical", ev.sample_ids, keep, scores)}


def test_an_import_with_400_held_out_records_fails_on_a_large_leak_and_is_not_measured_without_one():
    s = DecisionSettings(resamples=100)
    rng = np.random.default_rng(2)
    leak = decide(_one_target(rng, [0.02, 0.4, 0.03]), None, s).per_quantizer["fp"]
    assert leak.status == "FAIL" and leak.strongest.route == "exact" and leak.strongest.selected == ["a1"]
    assert leak.strongest.tpr.low > s.limit and leak.strongest.tpr.high is None
    assert leak.strongest.tpr.confidence == pytest.approx(0.95)
    assert [c.test for c in leak.tests] == ["FAIL"] and leak.tests[0].held
    null = decide(_one_target(rng, [0.01, 0.01, 0.01]), None, s).per_quantizer["fp"]
    assert null.status == "NOT MEASURED" and "exact FAIL test" in null.reason
    assert [c.test for c in null.tests] == ["FAIL", "MEASURED"] and not any(c.held for c in null.tests)
    assert null.size_needed.towards == "MEASURED" and null.size_needed.factor == pytest.approx(1000 / 400)
    few = decide(_one_target(rng, [0.01, 0.4], n_non=200), None, s).per_quantizer["fp"]
    assert few.status == "NOT MEASURED" and "needs at least 378" in few.reason


def test_two_targets_with_few_non_members_say_why_no_exact_test():
    d = decide(_one_target(np.random.default_rng(3), [0.4], n_non=300, targets=2), None, DecisionSettings(resamples=60))
    q = d.per_quantizer["fp"]
    assert q.status == "NOT MEASURED" and "needs one target model" in q.reason


def test_the_exact_reading_reads_its_threshold_by_hand():
    s = DecisionSettings()
    member = np.r_[np.ones(5, bool), np.zeros(400, bool)]
    x = np.r_[[9.0, 8.0, 0.5, 7.0, -1.0], np.linspace(-3, 1, 400)]  # the largest non-member: 1.0
    r = exact_test({"only": x}, member, s)
    assert isinstance(r, ExactResult) and r.design.k == 1 and r.hits == 3 and r.false_positives == 0
    assert r.lower == pytest.approx(stats.beta.ppf(r.design.alpha_bound, 3, 3))
    assert shift_for(0.01) == pytest.approx(0.0)
