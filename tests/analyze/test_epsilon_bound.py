"""The one-run epsilon lower bound (Steinke, Nasr and Jagielski 2023): the published test values, and the audit's
use on simulated mechanisms whose epsilon is known (docs/science.md section 15)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from llmaudit.analyze.attacks.registry import attack_spec, registered_attacks
from llmaudit.analyze.epsilon_audit import EpsilonSettings, centred, epsilon_audit, outputs_only
from llmaudit.analyze.epsilon_bound import InclusionDesign, epsilon_lower_bound, one_run_p_value

QUALIFIES = InclusionDesign("independent", 0.5, True, "")


@pytest.mark.parametrize(
    ("r", "v", "delta", "expected"),
    [
        (50, 50, 0.0, 2.7847),
        (100, 90, 0.0, 1.6308),
        (100, 90, 1e-5, 1.6261),
        (500, 300, 0.0, 0.2517),
        (100, 55, 0.0, 0.0),
    ],
)
def test_the_published_values_are_reproduced(r, v, delta, expected):
    assert epsilon_lower_bound(1000, r, v, 0.05, delta) == pytest.approx(expected, abs=1e-3)


def test_all_guesses_right_has_the_closed_form_and_the_bound_sits_where_the_p_value_reaches_the_level():
    for r in (10, 50, 200):
        q = 0.05 ** (1 / r)  # P[Binomial(r, q) >= r] = q^r = 0.05
        assert epsilon_lower_bound(1000, r, r) == pytest.approx(math.log(q / (1 - q)), abs=1e-7)
    eps = epsilon_lower_bound(1000, 400, 300, 0.05, 1e-5)
    assert one_run_p_value(1000, 400, 300, eps, 1e-5) == pytest.approx(0.05, abs=1e-6)
    assert one_run_p_value(1000, 400, 300, eps + 0.01, 1e-5) > 0.05 > one_run_p_value(1000, 400, 300, eps - 0.01, 1e-5)
    # a larger delta or more records (the delta term 2 m delta alpha) can only lower the bound
    assert epsilon_lower_bound(1000, 400, 300, 0.05, 1e-4) < eps < epsilon_lower_bound(1000, 400, 300, 0.05, 0.0)
    assert epsilon_lower_bound(100_000, 400, 300, 0.05, 1e-5) < eps


def test_counts_that_contradict_each_other_are_refused():
    for m, r, v in ((10, 20, 5), (100, 10, 11), (100, -1, 0)):
        with pytest.raises(ValueError, match="counts must satisfy"):
            epsilon_lower_bound(m, r, v)
    with pytest.raises(ValueError, match="significance"):
        epsilon_lower_bound(100, 10, 10, significance=1.0)
    assert epsilon_lower_bound(100, 0, 0) == 0.0


def _randomized_response(eps: float, shape: tuple[int, int], seed: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """keep drawn independently with probability 1/2; the mechanism releases each membership bit flipped with
    probability 1 / (1 + e^eps): exactly eps-DP per record, and the optimal attack reads the released bit."""
    rng = np.random.default_rng(seed)
    keep = rng.random(shape) < 0.5
    told = rng.random(shape) < special.expit(eps)
    released = np.where(told, keep, ~keep).astype(np.float64)
    scores = {"rr": released + 0.01 * rng.standard_normal(shape), "noise": rng.standard_normal(shape)}
    return keep, released, scores


@pytest.mark.parametrize("strategy", ["bonferroni", "split"])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_on_randomized_response_the_bound_is_below_the_true_epsilon_and_close_to_it(strategy, eps):
    """At significance 0.01 a bound above the truth has probability at most 1% (the next test checks the rate)."""
    keep, _, scores = _randomized_response(eps, (10, 2000), seed=int(eps * 10))
    s = EpsilonSettings(strategy=strategy, delta=0.0, significance=0.01)
    result = epsilon_audit("rr-quantizer", scores, keep, QUALIFIES, s)
    assert result.status == "MEASURED"
    assert eps - 0.25 < result.epsilon_lb < eps
    assert result.attack in ("rr", "rr-centred")  # the attack that gives it, never the useless one
    assert result.guesses == result.k_plus + result.k_minus and 0 < result.correct <= result.guesses
    assert result.records == (20_000 if strategy == "bonferroni" else 10_000)
    recomputed = epsilon_lower_bound(
        result.records,
        result.guesses,
        result.correct,
        0.01 / (result.hypotheses if strategy == "bonferroni" else 1),
        0.0,
    )
    assert result.epsilon_lb == pytest.approx(recomputed)


@pytest.mark.parametrize("strategy", ["bonferroni", "split"])
def test_the_bound_exceeds_the_true_epsilon_at_most_at_the_significance_level(strategy):
    """200 audits of a 1-DP mechanism (the extremal one for its epsilon, so the bound is nearly tight): the share
    whose bound exceeds 1 stays within the level plus Monte-Carlo error."""
    s = EpsilonSettings(strategy=strategy, delta=0.0, fractions=(0.0, 0.1, 0.5))
    exceed = 0
    for seed in range(200):
        keep, _, scores = _randomized_response(1.0, (1, 1500), seed=1000 + seed)
        exceed += epsilon_audit("q", {"rr": scores["rr"]}, keep, QUALIFIES, s).epsilon_lb > 1.0
    assert exceed / 200 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 200)


def test_nothing_to_find_gives_no_bound():
    rng = np.random.default_rng(5)
    keep = rng.random((6, 800)) < 0.5
    result = epsilon_audit("q", {"noise": rng.standard_normal(keep.shape)}, keep, QUALIFIES, EpsilonSettings())
    assert result.status == "MEASURED" and result.epsilon_lb == 0.0 and result.attack is None


def test_a_design_that_does_not_qualify_gives_its_reason_instead_of_a_number():
    keep, _, scores = _randomized_response(2.0, (4, 500), seed=1)
    design = InclusionDesign("fixed_fraction", 0.5, False, "each run trains on a fixed-size random subset")
    result = epsilon_audit("q", scores, keep, design)
    assert result.status == "NOT MEASURED" and result.epsilon_lb is None
    assert result.reason == "each run trains on a fixed-size random subset"
    nothing = epsilon_audit("q", {}, keep, QUALIFIES)
    assert nothing.status == "NOT MEASURED" and "reads models only" in nothing.reason


def test_only_attacks_that_read_models_and_never_another_runs_membership_are_used():
    chosen = outputs_only({a: attack_spec(a).references for a in registered_attacks()})
    assert {"loss", "min_k", "zlib", "ez_mia", "wbc", "ref_qbase"} <= set(chosen)
    assert not {"ref", "loss+ref", "lira_offline", "lira_online", "rmia"} & set(chosen)


def test_the_centred_score_subtracts_each_records_mean_over_every_run():
    s = np.array([[1.0, 5.0, np.nan], [3.0, 7.0, np.nan]])
    assert np.array_equal(centred(s)[:, :2], [[-1.0, -1.0], [1.0, 1.0]])
    assert np.isnan(centred(s)[:, 2]).all()


def test_settings_out_of_range_are_refused():
    for bad in (EpsilonSettings(significance=0), EpsilonSettings(fractions=(0.0,)), EpsilonSettings(fractions=(0.7,))):
        with pytest.raises(ValueError):
            bad.check()
