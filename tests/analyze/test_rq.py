"""Tests for llmaudit.analyze.rq and rq_aggregate (public path llmaudit.indicator). Expected numbers are worked out by hand from docs/science.md section 2."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.rq import (
    STATUS_INFINITE,
    STATUS_OK,
    STATUS_UNDEFINED,
    STATUS_ZERO,
    merge_identical_points,
    r_q,
    r_q_as_printed,
    r_q_details,
    r_q_min_ratio,
    r_q_reciprocal,
)
from llmaudit.analyze.rq_aggregate import (
    RQSettings,
    aggregate_r_q,
    indicator_from_table,
    rank_quantizers,
    ranking_stability,
)
from llmaudit.commands.indicator import indicator_command
from llmaudit.common.io import read_json
from llmaudit.store.losstable import read_loss_table, write_loss_table

# Three quantized checkpoints on n = 4 validation samples, rows deliberately NOT sorted by mean loss.
#   A = [1, 2, 3, 2]  m = 2   (lowest: docs/science.md's k = 1)
#   B = [2, 2, 4, 4]  m = 3   D = B - A = [1, 0, 1, 2]  mean 1, deviations [0,-1,0,1], SS = 2
#                             sigma2 = 2/3 (ddof 1), delta = 1, sigma2/delta^2 = 2/3
#   C = [1, 7, 4, 4]  m = 4   D = C - A = [0, 5, 1, 2]  mean 2, deviations [-2,3,-1,0], SS = 14
#                             sigma2 = 14/3, delta = 2, sigma2/delta^2 = 14/12 = 7/6  <- max
#   r_Q = 1/2 * (7/6)^-1 = 3/7
A = [1.0, 2.0, 3.0, 2.0]
B = [2.0, 2.0, 4.0, 4.0]
C = [1.0, 7.0, 4.0, 4.0]
L3 = np.array([C, A, B])  # original rows: 0 = C, 1 = A, 2 = B
R_L3 = 3 / 7


def test_hand_example_unsorted_rows():
    res = r_q_details(L3)
    assert res.r_q == pytest.approx(R_L3, rel=1e-12)
    assert r_q(L3) == pytest.approx(3 / 7, rel=1e-12)
    assert res.status == STATUS_OK
    assert res.order == (1, 2, 0)  # A, B, C by mean
    assert res.means == pytest.approx((2.0, 3.0, 4.0))
    assert res.delta == pytest.approx((0.0, 1.0, 2.0))
    assert res.sigma2 == pytest.approx((0.0, 2 / 3, 14 / 3))
    # profile delta^2/sigma2: B 1/(2/3) = 3/2, C 4/(14/3) = 6/7
    assert math.isnan(res.profile[0])
    assert res.profile[1:] == pytest.approx((1.5, 6 / 7))
    assert res.argmax_k == 0  # C is original row 0
    assert (res.n_checkpoints, res.n_points) == (3, 3)


def test_ddof_zero_changes_the_number():
    # ddof = 0: sigma2_B = 2/4 = 1/2 (ratio 1/2), sigma2_C = 14/4 = 7/2 (ratio 7/8) -> r_Q = 1/2 * 8/7 = 4/7
    assert r_q(L3, ddof=0) == pytest.approx(4 / 7, rel=1e-12)


def test_two_written_forms_of_algorithm_2_agree():
    # Scale losses by 2 so that m[2] - m[1] = 2 and the printed normalisation is not trivially 1:
    # sigma2 = (8/3, 56/3), delta = (2, 4); printed inner_k = sigma2_k * (2/delta_k)^2 = (8/3, 14/3),
    # r = 1/2 * 3/14 = 3/28, times (m2-m1)^2 = 4 -> 3/7. The min form: 1/2 * min(4/(8/3), 16/(56/3))
    # = 1/2 * min(3/2, 6/7) = 3/7. And r_Q is invariant to scale and shift of the losses.
    scaled = 2 * L3 + 5
    assert r_q_as_printed(scaled) == pytest.approx(3 / 7, rel=1e-12)
    assert r_q_min_ratio(scaled) == pytest.approx(3 / 7, rel=1e-12)
    assert r_q(scaled) == pytest.approx(3 / 7, rel=1e-12)


def test_forms_agree_on_random_trajectories_and_row_order_does_not_matter():
    rng = np.random.default_rng(1)
    for _ in range(20):
        k, n = rng.integers(2, 8), rng.integers(3, 30)
        losses = rng.gamma(2.0, 1.0, size=(k, n)) + rng.normal(0, 0.3, size=(k, 1))
        ref = r_q(losses)
        assert r_q_min_ratio(losses) == pytest.approx(ref, rel=1e-10)
        assert r_q_as_printed(losses) == pytest.approx(ref, rel=1e-10)
        assert r_q_reciprocal(losses) == pytest.approx(1 / (2 * ref), rel=1e-10)
        perm = rng.permutation(k)
        res, res_perm = r_q_details(losses), r_q_details(losses[perm])
        assert res_perm.r_q == pytest.approx(ref, rel=1e-12)
        # argmax_k indexes original rows, so it must follow the permutation
        assert perm[res_perm.argmax_k] == res.argmax_k


def test_identical_rows_are_merged_into_one_point():
    # Rows 3 (= A) and 4 (= C) repeat points. Kept apart, the duplicate of A would be a second point
    # with delta = 0 and give r_Q = 0; merged, the answer is the 3-point one, 3/7.
    losses = np.array([C, A, B, A, C])
    res = r_q_details(losses)
    assert res.n_checkpoints == 5 and res.n_points == 3
    assert res.groups == ((1, 3), (2,), (0, 4))
    assert res.r_q == pytest.approx(3 / 7, rel=1e-12)
    assert res.argmax_k == 0


def test_merge_tolerance():
    # A' = A + e on the first sample only: D = [e,0,0,0], mean e/4, sigma2 = e^2/4 (ddof 1),
    # ratio = (e^2/4) / (e^2/16) = 4 > 7/6, so unmerged r_Q = 1/2 * 1/4 = 1/8.
    a_prime = np.array(A) + np.array([1e-9, 0, 0, 0])
    losses = np.array([C, A, B, a_prime])
    assert r_q(losses) == pytest.approx(1 / 8, rel=1e-5)
    assert r_q_details(losses).n_points == 4
    assert r_q(losses, atol=1e-6) == pytest.approx(3 / 7, rel=1e-12)
    assert merge_identical_points(losses, atol=1e-6) == [[0], [1, 3], [2]]
    with pytest.raises(ValueError, match="atol"):
        merge_identical_points(losses, atol=-1.0)


def test_equal_means_give_zero():
    # A and E = [2, 1, 2, 3] are distinct but both have mean 2: delta = 0 -> r_Q = 0.
    E = [2.0, 1.0, 2.0, 3.0]
    res = r_q_details(np.array([B, A, E]))
    assert res.r_q == 0.0
    assert res.status == STATUS_ZERO
    assert res.argmax_k == 2  # E (row 2) is the point with delta = 0
    assert r_q_min_ratio(np.array([B, A, E])) == 0.0
    assert r_q_reciprocal(np.array([B, A, E])) == math.inf
    # The printed form divides by (m2 - m1) = 0: nan, which is why r_q uses the min form's limit.
    assert math.isnan(r_q_as_printed(np.array([B, A, E])))


def test_single_distinct_point_is_undefined():
    res = r_q_details(np.array([A, A, A]))
    assert math.isnan(res.r_q) and math.isnan(r_q(np.array([A, A])))
    assert res.status == STATUS_UNDEFINED == "undefined: fewer than 2 distinct quantized points"
    assert res.n_points == 1 and res.groups == ((0, 1, 2),) and res.argmax_k is None
    assert math.isnan(r_q(np.array([A])))  # a single checkpoint
    assert math.isnan(r_q_reciprocal(np.array([A, A])))


def test_pure_shift_gives_infinity():
    # [1,2,3] and [2,3,4]: D = [1,1,1], sigma2 = 0 < delta = 1 -> ratio 0 -> r_Q = +inf.
    losses = np.array([[2.0, 3.0, 4.0], [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    res = r_q_details(losses)
    assert res.r_q == math.inf and res.status == STATUS_INFINITE and res.argmax_k is None
    assert r_q_min_ratio(losses) == math.inf
    assert r_q_reciprocal(losses) == 0.0


def test_non_finite_losses_raise_with_rows():
    losses = np.array([A, [1.0, np.nan, 1.0, 1.0], B, [np.inf, 1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match=r"row\(s\) \[1, 3\].*diverged quantized model cannot be scored"):
        r_q(losses)


@pytest.mark.parametrize("bad", [np.array(A), np.zeros((3, 1)), np.zeros((2, 2, 2)), np.zeros((0, 4))])
def test_wrong_shapes_raise(bad):
    with pytest.raises(ValueError):
        r_q(bad)


def test_result_is_frozen_and_serialisable():
    res = r_q_details(np.array([C, A, B, A]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.r_q = 1.0  # type: ignore[misc]
    d = json.loads(json.dumps(res.to_dict()))
    assert d["groups"] == [[1, 3], [2], [0]] and d["argmax_k"] == 0 and d["ddof"] == 1


def test_aggregate_counts_undefined_runs():
    values = [0.5, np.nan, 1.5, 0.0, np.inf, 1.0]
    agg = aggregate_r_q(values, n_boot=500)
    assert agg["n_runs"] == 6 and agg["n_defined"] == 5 and agg["n_undefined"] == 1
    assert agg["n_finite"] == 4 and agg["n_zero"] == 1 and agg["n_infinite"] == 1
    # finite runs 0.5, 1.5, 0, 1: mean 0.75; deviations -.25,.75,-.75,.25 -> SS 1.25, std sqrt(1.25/3)
    assert agg["mean"] == pytest.approx(0.75)
    assert agg["std"] == pytest.approx(math.sqrt(1.25 / 3))
    assert agg["median"] == 1.0  # over defined [0, .5, 1, 1.5, inf]
    assert 0.0 <= agg["ci_low"] < 0.75 < agg["ci_high"] <= 1.5
    assert agg == aggregate_r_q(values, n_boot=500)  # seeded
    const = aggregate_r_q([2.0, 2.0, 2.0])
    assert const["ci_low"] == const["ci_high"] == 2.0
    empty = aggregate_r_q([np.nan, np.nan])
    assert empty["n_undefined"] == 2 and math.isnan(empty["mean"]) and math.isnan(empty["median"])


def test_rank_quantizers_ties_and_nan():
    ranks = rank_quantizers({"a": 1.0, "b": 3.0, "c": 1.0, "d": 2.0, "e": np.nan, "f": np.inf})
    assert ranks["f"] == 1 and ranks["b"] == 2 and ranks["d"] == 3
    assert ranks["a"] == ranks["c"] == 4.5
    assert math.isnan(ranks["e"])


def test_ranking_stability():
    rng = np.random.default_rng(0)
    means = {"x": 0.0, "y": 1.0, "z": 2.0, "w": 3.0}
    per_run = {q: mu + rng.normal(0, 1.0, size=12) for q, mu in means.items()}
    out = ranking_stability(per_run, [1, 4, 12], n_resamples=30)
    full = out["by_size"][-1]
    assert full["k_runs"] == 12 and full["mean_rho"] == pytest.approx(1.0)
    assert full["std_rho"] == pytest.approx(0.0, abs=1e-12)
    assert out["full_ranking"] == rank_quantizers(out["full_mean"])
    assert out["by_size"][0]["mean_rho"] < 1.0  # single runs are noisy
    # noise-free runs: every subset gives the full ranking
    exact = ranking_stability({"x": [1.0] * 5, "y": [2.0] * 5, "z": [3.0] * 5}, [1, 3], n_resamples=5)
    assert [b["mean_rho"] for b in exact["by_size"]] == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="subset size"):
        ranking_stability(per_run, [13])
    with pytest.raises(ValueError, match="same number of runs"):
        ranking_stability({"x": [1.0, 2.0], "y": [1.0]}, [1])


def _rows(run, quantizer, checkpoint, losses, split="val"):
    return [
        {
            "run": run,
            "checkpoint": checkpoint,
            "quantizer": quantizer,
            "sample_id": f"{split}{j}",
            "split": split,
            "member": False,
            "loss": float(v),
            "n_tokens": 1,
            "token_losses": [float(v)],
        }
        for j, v in enumerate(losses)
    ]


def _hand_table():
    rows = []
    # run 0, sign: steps 10, 20, 30 hold C, A, B -> r_Q = 3/7, binding point C = step 10
    for step, losses in zip((10, 20, 30), (C, A, B)):
        rows += _rows(0, "sign", step, losses)
    # run 1, sign: X = [3,4,5,4] (m 4, D = [2,2,2,2], sigma2 0), A, B -> max ratio = 2/3 (B) -> r_Q = 3/4
    for step, losses in zip((10, 20, 30), ([3.0, 4.0, 5.0, 4.0], A, B)):
        rows += _rows(1, "sign", step, losses)
    # uniform-4: run 0 every checkpoint the same point (undefined); run 1 equal means (r_Q = 0)
    for step in (10, 20, 30):
        rows += _rows(0, "uniform-4", step, A)
    for step, losses in zip((10, 20, 30), (A, [2.0, 1.0, 2.0, 3.0], B)):
        rows += _rows(1, "uniform-4", step, losses)
    # the reference run and pool rows must be ignored; they would change every number if used
    rows += _rows(-1, "sign", 0, [9.0, 0.0, 9.0, 0.0])
    rows += _rows(0, "sign", 10, [50.0, 0.0, 50.0, 0.0], split="pool")
    return pd.DataFrame(rows)


def test_indicator_from_hand_written_table(tmp_path):
    path = write_loss_table(_hand_table(), tmp_path / "indicator_losses.parquet")
    result = indicator_from_table(read_loss_table(path), n_boot=200, n_resamples=10)
    assert result["runs"] == [0, 1] and result["quantizers"] == ["sign", "uniform-4"]
    by_key = {(e["run"], e["quantizer"]): e for e in result["per_run"]}
    assert by_key[(0, "sign")]["r_q"] == pytest.approx(3 / 7, rel=1e-12)
    assert by_key[(0, "sign")]["argmax_checkpoint"] == 10
    assert by_key[(1, "sign")]["r_q"] == pytest.approx(3 / 4, rel=1e-12)
    assert by_key[(1, "sign")]["argmax_checkpoint"] == 30
    assert math.isnan(by_key[(0, "uniform-4")]["r_q"])
    assert by_key[(0, "uniform-4")]["groups_checkpoints"] == [[10, 20, 30]]
    assert by_key[(1, "uniform-4")]["r_q"] == 0.0
    sign = result["per_quantizer"]["sign"]
    # mean of 3/7 and 3/4 = (12 + 21) / 56 = 33/56
    assert sign["r_q"]["mean"] == pytest.approx(33 / 56, rel=1e-12)
    assert sign["variant_reciprocal"]["mean"] == pytest.approx((7 / 6 + 2 / 3) / 2, rel=1e-12)
    uni = result["per_quantizer"]["uniform-4"]["r_q"]
    assert uni["n_undefined"] == 1 and uni["n_zero"] == 1 and uni["mean"] == 0.0
    assert result["per_quantizer"]["sign"]["rank"] == 1 and result["per_quantizer"]["uniform-4"]["rank"] == 2
    assert result["protocol"]["ddof"] == 1 and result["protocol"]["variants"] == ["reciprocal"]
    assert [b["k_runs"] for b in result["stability"]["by_size"]] == [1, 2]
    assert result["stability"]["by_size"][1]["mean_rho"] == pytest.approx(1.0)


def test_indicator_command_writes_json(tmp_path):
    path = write_loss_table(_hand_table(), tmp_path / "indicator_losses.parquet")
    out = tmp_path / "out" / "indicator.json"
    result = indicator_command(path, out)
    back = read_json(out)
    assert back["protocol"]["loss_table"] == str(path)
    assert back["per_quantizer"]["sign"]["r_q"]["mean"] == pytest.approx(33 / 56)
    assert result["per_quantizer"]["sign"]["rank"] == back["per_quantizer"]["sign"]["rank"] == 1
    table = read_loss_table(path)
    with pytest.raises(ValueError, match="no rows"):
        indicator_from_table(table[table["split"] == "val"], split="pool")
    # pool rows exist only for run 0 / sign at one step: one checkpoint -> undefined, not dropped
    pool = indicator_from_table(table, split="pool", n_boot=10, n_resamples=2)
    assert pool["per_quantizer"]["sign"]["r_q"]["n_undefined"] == 1


def test_missing_run_quantizer_pair_is_reported_and_counted():
    table = _hand_table()
    table = table[~((table["run"] == 1) & (table["quantizer"] == "uniform-4"))]
    result = indicator_from_table(table, n_boot=10, n_resamples=2)
    entry = next(e for e in result["per_run"] if (e["run"], e["quantizer"]) == (1, "uniform-4"))
    assert entry["status"].startswith("missing") and math.isnan(entry["r_q"])
    uni = result["per_quantizer"]["uniform-4"]["r_q"]
    assert uni["n_runs"] == 2 and uni["n_undefined"] == 2 and math.isnan(uni["mean"])
    assert math.isnan(result["per_quantizer"]["uniform-4"]["rank"])


def test_indicator_from_table_settings_object_equals_keyword_options():
    """`RQSettings` and keyword overrides of its fields are the same call; an unknown option is refused."""
    table = _hand_table()
    by_options = indicator_from_table(table, n_boot=10, n_resamples=2, seed=3)
    by_settings = indicator_from_table(table, RQSettings(n_boot=10, n_resamples=2, seed=3))
    assert json.dumps(by_options, sort_keys=True) == json.dumps(by_settings, sort_keys=True)
    overridden = indicator_from_table(table, RQSettings(n_boot=10, n_resamples=2), seed=3)
    assert json.dumps(overridden, sort_keys=True) == json.dumps(by_options, sort_keys=True)
    with pytest.raises(TypeError):
        indicator_from_table(table, n_bootstrap=10)
