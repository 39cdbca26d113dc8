"""Tests for llmaudit.analyze.candidates and candidates_table (docs/science.md section 8). Expected numbers are worked out by hand."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from llmaudit.analyze import candidates as ind
from llmaudit.analyze.candidates_table import candidates_from_table
from llmaudit.analyze.rq import r_q
from llmaudit.analyze.rq_aggregate import indicator_from_table

# The hand example of tests/analyze/test_rq.py: three quantized checkpoints on n = 4 samples,
# r_Q = 3/7 (binding point C: sigma2/delta^2 = 7/6).
L3 = np.array([[1.0, 7.0, 4.0, 4.0], [1.0, 2.0, 3.0, 2.0], [2.0, 2.0, 4.0, 4.0]])

# A two-checkpoint run (rows = checkpoints, the last = the released model):
#   final: val [2, 4] mean 3, var 2;  train [0, 1, 2] mean 1, var 1
#          s_pooled^2 = (1 * 2 + 2 * 1) / 3 = 4/3, d_T = 2 / sqrt(4/3) = sqrt(3)
#   first: val [1, 3] mean 2, var 2;  train [1, 1, 1] mean 1, var 0
#          s_pooled^2 = 2/3, d_1 = 1 / sqrt(2/3) = sqrt(3/2)
VAL = np.array([[1.0, 3.0], [2.0, 4.0]])
TRAIN = np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]])


def test_registry_is_complete_and_consistent():
    assert list(ind.CANDIDATES) == [
        "rq_published",
        "rq_reciprocal_neg",
        "rq_reciprocal_flip",
        "rq_negated",
        "rq_train",
        "gap_std_final",
        "gap_std_ratio_fp",
        "gap_std_traj",
        "yeom_01",
        "yeom_ce_clip",
        "ks_loss",
        "auc_loss",
        "tv_gauss_margin",
        "qdistortion_angle",
        "qflip_late",
        "heldout_loss_control",
    ]
    for name, c in ind.CANDIDATES.items():
        assert c.name == name and c.version == f"{name}/1"
        assert c.orientation == "higher = more secure"
        assert c.family in ind.FAMILIES
        assert c.checkpoints in ("trajectory", "final", "parameters")
        assert tuple(inspect.signature(c.function).parameters) == c.inputs
        doc = c.function.__doc__ or ""
        assert "Returns:" in doc and "[..." in doc  # shapes documented
        assert (c.family == ind.FAMILY_CONTROL) == (c.checkpoints == "parameters")
    assert {n for n, c in ind.CANDIDATES.items() if c.family == ind.FAMILY_CONTROL} == {
        "qdistortion_angle",
        "qflip_late",
    }
    assert [n for n, c in ind.CANDIDATES.items() if c.family in ind.CONTROL_FAMILIES] == [
        "qdistortion_angle",
        "qflip_late",
        "heldout_loss_control",
    ]
    # the pre-registered hyper-parameters
    assert math.log(2) == ind.YEOM01_THRESHOLD and math.log(100) == ind.YEOM_CE_BOUND
    assert ind.MARGIN_LOSS_CLIP == (1e-6, 30.0) and ind.TV_GRID == 4001 and ind.QFLIP_LAST == 10 and ind.DDOF == 1


def test_r_q_family_by_hand():
    assert float(ind.rq_published(L3)) == pytest.approx(3 / 7, rel=1e-12)
    assert float(ind.rq_negated(L3)) == pytest.approx(-3 / 7, rel=1e-12)
    assert float(ind.rq_reciprocal_neg(L3)) == pytest.approx(-7 / 6, rel=1e-12)  # -1 / (2 * 3/7)
    assert float(ind.rq_reciprocal_flip(L3)) == pytest.approx(7 / 6, rel=1e-12)
    assert float(ind.rq_train(L3)) == pytest.approx(3 / 7, rel=1e-12)
    # edge cases: equal means -> r_Q = 0 -> reciprocals infinite; one distinct point -> nan everywhere
    equal_means = np.array([[1.0, 3.0], [3.0, 1.0]])
    assert float(ind.rq_published(equal_means)) == 0.0
    assert float(ind.rq_reciprocal_neg(equal_means)) == -math.inf
    assert float(ind.rq_reciprocal_flip(equal_means)) == math.inf
    one_point = np.array([[1.0, 2.0], [1.0, 2.0]])
    for f in (ind.rq_published, ind.rq_negated, ind.rq_reciprocal_neg, ind.rq_reciprocal_flip):
        assert math.isnan(float(f(one_point)))
    # batches: [2, 2, 3, 4] -> [2, 2]
    batch = np.stack([np.stack([L3, 2 * L3 + 1]), np.stack([L3[::-1], L3])])
    assert ind.rq_published(batch) == pytest.approx(np.full((2, 2), 3 / 7), rel=1e-12)


def test_published_r_q_is_the_packages_estimator():
    rng = np.random.default_rng(0)
    batch = rng.exponential(1.0, (40, 7, 12))
    batch[1, 3] = batch[1, 0]  # merged points
    batch[2, :] = batch[2, 0]  # one point -> nan
    batch[3, 0] *= 0.01
    batch[3, 1] = batch[3, 0][::-1]  # two distinct lowest points with equal means -> 0
    got = ind.rq_published(batch)
    ref = np.array([r_q(x) for x in batch])
    np.testing.assert_array_equal(got, ref)  # identical numbers, not just close
    assert math.isnan(got[2]) and got[3] == 0.0


def test_gap_family_by_hand():
    assert ind.std_gap(VAL, TRAIN) == pytest.approx([math.sqrt(1.5), math.sqrt(3.0)], rel=1e-12)
    assert float(ind.gap_std_final(VAL, TRAIN)) == pytest.approx(-math.sqrt(3.0), rel=1e-12)
    assert float(ind.gap_std_traj(VAL, TRAIN)) == pytest.approx(-(math.sqrt(1.5) + math.sqrt(3.0)) / 2, rel=1e-12)
    # full precision: final val [1, 3], train [0, 1, 2]: d_FP = 1 / sqrt(4/3) = sqrt(3)/2 -> ratio -2
    val_fp, train_fp = np.array([[1.0, 3.0]]), np.array([[0.0, 1.0, 2.0]])
    assert float(ind.gap_std_ratio_fp(VAL, TRAIN, val_fp, train_fp)) == pytest.approx(-2.0, rel=1e-12)
    # no full-precision gap (d_FP = 0 or < 0): nan
    assert math.isnan(float(ind.gap_std_ratio_fp(VAL, TRAIN, train_fp, train_fp)))
    assert math.isnan(float(ind.gap_std_ratio_fp(VAL, TRAIN, np.array([[0.0, 0.5]]), train_fp)))
    # zero pooled sd: equal means -> 0, different means -> infinite gap
    assert float(ind.gap_std_final(np.ones((1, 2)), np.ones((1, 3)))) == 0.0
    assert float(ind.gap_std_final(2 * np.ones((1, 2)), np.ones((1, 3)))) == -math.inf


def test_yeom_ks_auc_by_hand():
    # final: val [2, 4], train [0, 1, 2]
    # 0-1 loss (L > ln 2): err_val = 1, err_train = 2/3 -> 1 - 1/3 = 2/3
    assert float(ind.yeom_01(VAL, TRAIN)) == pytest.approx(2 / 3, rel=1e-12)
    # clipped CE, B = ln 100 (> 4): 1 - (3 - 1) / B
    assert float(ind.yeom_ce_clip(VAL, TRAIN)) == pytest.approx(1 - 2 / math.log(100), rel=1e-12)
    clipped = np.array([[2.0, 10.0]])  # 10 is clipped to B
    assert float(ind.yeom_ce_clip(clipped, TRAIN)) == pytest.approx(
        1 - ((2 + math.log(100)) / 2 - 1) / math.log(100), rel=1e-12
    )
    # KS: CDFs at 0: 1/3 vs 0, at 1: 2/3 vs 0, at 2 (tie group end): 1 vs 1/2, at 4: 1 vs 1 -> KS = 2/3
    assert float(ind.ks_loss(VAL, TRAIN)) == pytest.approx(1 / 3, rel=1e-12)
    # AUC = P(L_val > L_train) + P(=)/2 over 6 pairs: val 2 -> 1 + 1 + 1/2, val 4 -> 3 = 5.5/6 -> 2 - 11/6
    assert float(ind.auc_loss(VAL, TRAIN)) == pytest.approx(1 / 6, rel=1e-12)
    # agreement with scipy / sklearn definitions on random final rows with ties
    rng = np.random.default_rng(1)
    for _ in range(20):
        t = np.round(rng.exponential(0.5, (2, 20)), 1)
        v = np.round(rng.exponential(1.0, (2, 50)), 1)
        assert 1 - float(ind.ks_loss(v, t)) == pytest.approx(stats.ks_2samp(t[-1], v[-1]).statistic, rel=1e-12)
        u = stats.mannwhitneyu(v[-1], t[-1]).statistic / (20 * 50)
        assert 1 - float(ind.auc_loss(v, t)) / 2 == pytest.approx(u, rel=1e-12)


def test_tv_gauss_margin_by_hand():
    # phi = -log(expm1(L)) <=> L = log(1 + exp(-phi)). train phi [-1, 1]: mean 0, sd sqrt(2);
    # val phi [1, 3]: mean 2, sd sqrt(2). TV(N(0, 2), N(2, 2)) = 2 Phi(2 / (2 sqrt 2)) - 1.
    def loss(phi):
        return np.log1p(np.exp(-np.asarray(phi, dtype=float)))[None]

    expected = 1 - (2 * stats.norm.cdf(1 / math.sqrt(2)) - 1)
    # the trapezoid rule on 4001 points: absolute error about 1e-6
    assert float(ind.tv_gauss_margin(loss([1.0, 3.0]), loss([-1.0, 1.0]))) == pytest.approx(expected, abs=1e-5)
    assert float(ind.tv_gauss_margin(loss([-1.0, 1.0]), loss([-1.0, 1.0]))) == pytest.approx(1.0, abs=1e-9)
    # the Gaussian TV itself
    for dm in (0.0, 0.3, 1.0, 3.0):
        assert float(ind.gauss_tv(0.0, 1.0, dm, 1.0)) == pytest.approx(2 * stats.norm.cdf(dm / 2) - 1, abs=1e-5)
    # a zero loss is clipped to 1e-6 before the logit scaling: finite
    assert np.isfinite(ind.tv_gauss_margin(np.zeros((1, 3)), np.zeros((1, 3))))


def test_controls_by_hand():
    # cos([1, 1], [1, 0]) = 1/sqrt 2
    assert float(ind.qdistortion_angle([1.0, 1.0], [1.0, 0.0])) == pytest.approx(1 - 1 / math.sqrt(2), rel=1e-12)
    assert float(ind.qdistortion_angle([2.0, 0.0], [1.0, 0.0])) == pytest.approx(0.0, abs=1e-15)
    traj = np.array([[0, 0], [1, 0], [1, 1]])  # each pair flips half of the parameters
    assert float(ind.qflip_late(traj)) == -0.5
    long = np.zeros((12, 4))
    long[1:] = 1.0  # the only change is between checkpoints 0 and 1: not among the last 10 pairs
    assert float(ind.qflip_late(long)) == 0.0
    long[-1, 0] = 2.0  # one of 4 parameters changes in the last pair: -(1/4)/10
    assert float(ind.qflip_late(long)) == pytest.approx(-0.025)
    # the damage control: the mean held-out loss of the last row only; [2, 2, 2] runs -> [2]
    assert float(ind.heldout_loss_control(VAL)) == 3.0
    assert ind.heldout_loss_control(np.stack([VAL, VAL + 1.0])).tolist() == [3.0, 4.0]


def test_orientation_higher_is_more_secure():
    rng = np.random.default_rng(2)
    train = 0.1 + rng.random((2, 30)) * 0.01
    close = 0.1 + rng.random((2, 40)) * 0.01
    far = close + 3.0  # held-out much worse than training: more leakage, less secure
    for name in ("gap_std_final", "gap_std_traj", "yeom_01", "yeom_ce_clip", "ks_loss", "auc_loss", "tv_gauss_margin"):
        f = ind.CANDIDATES[name].function
        assert f(far, train) < f(close, train), name
    assert float(ind.ks_loss(close[:, :30] * 0 + train, train)) == 1.0  # identical losses: no leakage


def test_non_finite_losses_are_refused():
    bad = VAL.copy()
    bad[0, 0] = math.nan
    for f in (ind.rq_published, ind.rq_train):
        with pytest.raises(ValueError, match="non-finite"):
            f(bad)
    for f in (ind.gap_std_final, ind.ks_loss, ind.auc_loss, ind.yeom_01):
        with pytest.raises(ValueError, match="non-finite"):
            f(bad, TRAIN)


def test_evaluate_candidates_equals_each_function():
    rng = np.random.default_rng(3)
    R, K, P = 5, 6, 10
    theta = rng.normal(size=(R, K, P))
    inputs = {
        "val": rng.exponential(1.0, (R, K, 30)),
        "train": rng.exponential(0.5, (R, K, 12)),
        "val_fp": rng.exponential(1.0, (R, K, 30)),
        "train_fp": rng.exponential(0.5, (R, K, 12)),
        "theta_q_final": np.sign(theta[:, -1]),
        "theta_final": theta[:, -1],
        "theta_q_traj": np.sign(theta),
    }
    got = ind.evaluate_candidates(inputs)
    assert list(got) == list(ind.CANDIDATES)
    for name, c in ind.CANDIDATES.items():
        direct = c.function(**{a: inputs[a] for a in c.inputs})
        assert got[name].shape == (R,)
        np.testing.assert_array_equal(got[name], direct)


# ---- candidates_from_table --------------------------------------------------------------------------------


def _rows(run, checkpoint, quantizer, split, losses, *, members=()):
    prefix = "v" if split == "val" else "p"
    return [
        {
            "run": run,
            "checkpoint": checkpoint,
            "quantizer": quantizer,
            "sample_id": f"{prefix}{j}",
            "split": split,
            "member": split == "pool" and j in members,
            "loss": float(x),
        }
        for j, x in enumerate(losses)
    ]


def _store_like_table():
    """2 runs x {fp32, q4}; val at checkpoints 10 and 20; the pool at the final checkpoint only (as a store).

    Pool samples p0..p3; run 0 trains on p0, p1, p2, run 1 on p1, p2, p3; the non-member has loss 9.
    q4, run 0: val [[1, 4], [2, 4]] -> points m 2.5 (lowest), 3: delta 0.5, diff [1, 0] var 0.5, ratio 2
               -> r_Q = 1/4. Final val [2, 4], train [0, 1, 2] -> d = sqrt 3 (see VAL / TRAIN above).
    q4, run 1: val [[2, 2], [1, 5]] -> m 2 (lowest), 3: delta 1, diff [-1, 3] var 8, ratio 8 -> r_Q = 1/16.
               Final val [1, 5] (mean 3, var 8), train [1, 1, 1] (var 0): s^2 = 8/3, d = 2/sqrt(8/3) = sqrt 1.5.
    fp32: val [[1, 3], [1, 3]] (one point: r_Q undefined); final train as q4's.
          run 0: d_FP = 1/sqrt(4/3) = sqrt(3)/2 -> ratio for q4 = -2; run 1: d_FP = 1/sqrt(2/3) = sqrt 1.5 -> -1.
    """
    rows = []
    q4_val = {0: [[1, 4], [2, 4]], 1: [[2, 2], [1, 5]]}
    train = {0: [0, 1, 2], 1: [1, 1, 1]}
    members = {0: (0, 1, 2), 1: (1, 2, 3)}
    for run in (0, 1):
        for q, val in (("q4", q4_val[run]), ("fp32", [[1, 3], [1, 3]])):
            for k, ck in enumerate((10, 20)):
                rows += _rows(run, ck, q, "val", val[k])
            pool = [9.0] * 4
            for j, x in zip(members[run], train[run]):
                pool[j] = x
            rows += _rows(run, 20, q, "pool", pool, members=members[run])
    rows += _rows(-1, 0, "fp32", "val", [5, 5]) + _rows(-1, 0, "fp32", "pool", [5, 5, 5, 5])  # base: skipped
    return pd.DataFrame(rows)


def test_candidates_from_table_by_hand():
    res = candidates_from_table(_store_like_table(), n_boot=200)
    assert res["reference_quantizer"] == "fp32"  # found by name
    assert res["runs"] == [0, 1] and res["quantizers"] == ["fp32", "q4"]
    c = res["candidates"]
    q4 = {n: c[n]["per_quantizer"]["q4"] for n in c}
    assert q4["rq_published"]["values"] == pytest.approx([0.25, 1 / 16])
    assert q4["rq_published"]["mean"] == pytest.approx((0.25 + 1 / 16) / 2)
    assert q4["rq_published"]["ci_low"] >= 1 / 16 and q4["rq_published"]["ci_high"] <= 0.25
    assert q4["rq_negated"]["mean"] == pytest.approx(-(0.25 + 1 / 16) / 2)
    assert q4["gap_std_final"]["values"] == pytest.approx([-math.sqrt(3), -math.sqrt(1.5)])
    assert q4["gap_std_ratio_fp"]["values"] == pytest.approx([-2.0, -1.0])
    assert q4["gap_std_ratio_fp"]["mean"] == pytest.approx(-1.5)
    assert q4["ks_loss"]["values"][0] == pytest.approx(1 / 3)
    assert q4["auc_loss"]["values"][0] == pytest.approx(1 / 6)
    assert q4["yeom_01"]["values"][0] == pytest.approx(2 / 3)
    assert (q4["gap_std_final"]["n_finite"], q4["gap_std_final"]["n_nonfinite"]) == (2, 0)
    # the reference quantizer against itself: -d/d = -1
    assert c["gap_std_ratio_fp"]["per_quantizer"]["fp32"]["values"] == pytest.approx([-1.0, -1.0])
    # fp32's trajectory has one distinct point: r_Q undefined, counted, with the reason
    fp = c["rq_published"]["per_quantizer"]["fp32"]
    assert (fp["n_finite"], fp["n_nan"]) == (0, 2) and math.isnan(fp["mean"])
    assert list(fp["reasons"]) == [ind.REASON_NAN]
    # NOT computable from a store: training-sample losses at every checkpoint, parameters
    for name in ("gap_std_traj", "rq_train"):
        assert not c[name]["computable"]
        assert "every checkpoint" in c[name]["reason"] and "[20]" in c[name]["reason"]
        assert all(math.isnan(v) for q in ("fp32", "q4") for v in c[name]["per_quantizer"][q]["values"])
    for name in ("qdistortion_angle", "qflip_late"):
        assert not c[name]["computable"] and c[name]["reason"] == ind.REASON_PARAMETERS
    assert c["gap_std_final"]["computable"] and c["gap_std_final"]["reason"] is None
    entry = next(e for e in res["per_run"] if e["run"] == 1 and e["quantizer"] == "q4")
    assert entry["val_checkpoints"] == [10, 20] and entry["train_checkpoints"] == [20]
    assert (entry["n_val"], entry["n_train"]) == (2, 3)


def test_candidates_from_table_matches_the_published_indicator():
    df = _store_like_table()
    rng = np.random.default_rng(4)
    df.loc[df["split"] == "val", "loss"] = rng.exponential(1.0, int((df["split"] == "val").sum()))
    res = candidates_from_table(df)
    pub = indicator_from_table(df, variants=())
    for e in pub["per_run"]:
        ours = res["candidates"]["rq_published"]["per_quantizer"][e["quantizer"]]["values"][e["run"]]
        assert ours == e["r_q"] or (math.isnan(ours) and math.isnan(e["r_q"]))


def test_candidates_from_table_with_pool_rows_at_every_checkpoint():
    # a user's own table may score the members at every checkpoint: then the trajectory candidates work
    rows = []
    for ck, val, train in ((10, [1, 3], [1, 1, 1]), (20, [2, 4], [0, 1, 2])):
        rows += _rows(0, ck, "q4", "val", val) + _rows(0, ck, "q4", "pool", [*train, 9.0], members=(0, 1, 2))
    res = candidates_from_table(pd.DataFrame(rows))
    c = res["candidates"]
    assert c["gap_std_traj"]["per_quantizer"]["q4"]["values"] == pytest.approx([-(math.sqrt(1.5) + math.sqrt(3.0)) / 2])
    assert c["rq_train"]["computable"]
    assert c["rq_train"]["per_quantizer"]["q4"]["values"] == pytest.approx([float(ind.rq_train(TRAIN))], nan_ok=True)
    # no full-precision quantizer in the table: the ratio is nan with the reason
    assert not c["gap_std_ratio_fp"]["computable"]
    assert "reference" in c["gap_std_ratio_fp"]["reason"]


def test_candidates_from_table_missing_inputs():
    df = _store_like_table()
    no_pool = df[df["split"] == "val"]
    res = candidates_from_table(no_pool, reference_quantizer="fp32")
    assert not res["candidates"]["gap_std_final"]["computable"]
    assert "no member pool rows at the final checkpoint 20" in res["candidates"]["gap_std_final"]["reason"]
    assert res["candidates"]["rq_published"]["computable"]  # needs the held-out trajectory only
    # a named reference that the table does not hold
    res = candidates_from_table(df, reference_quantizer="bf16")
    assert "bf16" in res["candidates"]["gap_std_ratio_fp"]["reason"]
    with pytest.raises(ValueError, match="unknown candidate"):
        candidates_from_table(df, names=["nope"])
