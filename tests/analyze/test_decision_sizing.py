"""Sizing before compute (docs/science.md section 12, "Sizing before compute"): what a design can decide, by hand."""

from __future__ import annotations

import pytest

from llmaudit.analyze.decision import DecisionSettings
from llmaudit.analyze.decision.bounds import wilson, z_value
from llmaudit.analyze.decision.exact import clopper_pearson, exact_design
from llmaudit.analyze.decision.sizing import Design, members_for_pass, sizing, sizing_lines

S = DecisionSettings()


def test_members_for_pass_is_where_an_attack_at_chance_clears_its_simultaneous_bound():
    z = z_value(0.05 / 9)
    n = members_for_pass(9, S)
    assert wilson(0.01, n, z)[1] < 0.05 <= wilson(0.01, n - 1, z)[1] and n == 192
    assert members_for_pass(16, S) == 222
    assert members_for_pass(9, DecisionSettings(limit=0.01)) is None  # a limit at the FPR: no size clears it


def test_an_import_with_400_non_members_can_fail_but_not_pass():
    r = sizing(Design(members=300, nonmembers=400, targets=1, attacks=9), S)
    assert (r.mode, r.pass_reachable, r.fail_reachable, r.fail_route) == ("empirical", False, True, "exact")
    d = exact_design(300, 400, 9, S)
    x = round(r.fail_from_tpr * d.members)
    assert clopper_pearson(x, d.members, d.alpha_bound)[0] > 0.05 >= clopper_pearson(x - 1, d.members, d.alpha_bound)[0]
    assert r.nonmembers_for_fail == 378 and r.verdict_reachable
    lines = sizing_lines(r, S, unit="held-out record")
    assert lines[1].startswith("PASS out of reach: it needs at least 1000 held-out record scores (here 400)")
    assert lines[2].startswith("FAIL within reach when the strongest attack's true TPR at 1% FPR is at least 0.0")


def test_too_few_non_members_reach_no_verdict_and_say_what_would():
    r = sizing(Design(300, 200, 1, 9), S)
    assert not r.verdict_reachable and r.fail_from_tpr is None
    assert sizing_lines(r, S)[-1] == (
        "no verdict is within reach: every quantizer will be NOT MEASURED; at least 378 non-member scores would make "
        "a FAIL possible, 1000 a PASS"
    )
    one = sizing(Design(300, 370, 1, 1), S)  # one attack: nothing to choose, 368 non-members suffice
    assert one.fail_route == "exact" and one.nonmembers_for_fail == 368


def test_several_targets_pool_their_rows_and_fail_from_the_cross_fitted_rule():
    r = sizing(Design(64, 192, 6, 16), S)
    assert (r.mode, r.pass_reachable, r.fail_route) == ("calibrated", True, "cross-fitted")
    t, z = r.fail_from_tpr, z_value(0.05)
    assert wilson(t, 384, z)[0] > 0.05 and wilson(t - 1e-3, 384, z)[0] < 0.05
    few = sizing(Design(64, 100, 6, 16), S)  # 600 pooled non-member rows, not independent: no exact test
    assert not few.verdict_reachable and few.nonmembers_for_fail == 1000
    assert sizing(Design(64, 192, 3, 16), S).mode == "empirical"  # fewer runs than min_runs


@pytest.mark.parametrize("members", [50, 150])
def test_pass_needs_the_members_too(members):
    r = sizing(Design(members, 1200, 1, 9), S)
    assert r.pass_reachable == (members >= 192)
