"""The release decision (docs/science.md section 12): its counts against slow reference loops, its bounds by hand,
and the whole path from a store's loss table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.decision import DecisionSettings
from llmaudit.analyze.decision.bounds import effective_n, samples_factor, wilson
from llmaudit.analyze.decision.counts import (
    FP,
    NEG,
    POS,
    TP,
    empirical_counts,
    multiplicities,
    sample_folds,
)
from llmaudit.analyze.decision.pooled import calibrated_counts, weighted_auroc
from llmaudit.analyze.decision.rule import cross_fit
from llmaudit.analyze.metrics import tpr_at_fpr
from llmaudit.store.losstable import validate_loss_table

THRESHOLD_1PCT = float(stats.norm.ppf(0.99))


# ----------------------------------------------------------------------------------------------------------------
# counts against slow references


def _in_sample_threshold(pos, neg, candidates, fpr):
    """The threshold t (rows count when > t) with the most members above it among those with at most fpr of the
    non-members above it: the largest TPR with FPR <= fpr on the empirical ROC."""
    feasible = [t for t in np.r_[-np.inf, candidates] if (neg > t).sum() <= fpr * neg.size]
    return min(feasible, key=lambda t: (-(pos > t).sum(), t)) if neg.size else np.inf


def _conformal_threshold(neg, fpr):
    """The k-th largest non-member, k = floor(fpr * (n + 1)): a fresh non-member exceeds it w.p. k / (n + 1)."""
    k = math.floor(fpr * (neg.size + 1) + 1e-9)
    return np.sort(neg)[::-1][k - 1] if k >= 1 else np.inf


def _count(rows_pos, rows_neg, thr):
    return [(rows_pos > thr).sum(), rows_pos.size, (rows_neg > thr).sum(), rows_neg.size]


def _reference_empirical(scores, keep, weights, fpr, folds):
    """`empirical_counts` one resample, target and fold at a time, rows repeated by their sample's weight."""
    n_folds = int(folds.max()) + 1
    whole, train, test = np.zeros((weights.shape[0], 4)), np.zeros((n_folds, 4)), None
    test = np.zeros((weights.shape[0], n_folds, 4))
    for b, w in enumerate(weights.astype(int)):
        for m in range(scores.shape[0]):
            ok = np.isfinite(scores[m])

            def rows(mask, m=m, w=w):
                return np.repeat(scores[m, mask], w[mask])

            cands = np.unique(scores[m, ok])
            thr = _in_sample_threshold(rows(ok & keep[m]), rows(ok & ~keep[m]), cands, fpr)
            whole[b] += _count(rows(ok & keep[m]), rows(ok & ~keep[m]), thr)
            for f in range(n_folds):
                rest, own = ok & (folds != f), ok & (folds == f)
                thr = _conformal_threshold(rows(rest & ~keep[m]), fpr)  # measured: f's rows, the others' threshold
                test[b, f] += _count(rows(own & keep[m]), rows(own & ~keep[m]), thr)
                if b == 0:  # chosen: the others' members, f's non-members and their in-sample threshold
                    thr = _in_sample_threshold(rows(rest & keep[m]), rows(own & ~keep[m]), cands, fpr)
                    train[f] += _count(rows(rest & keep[m]), rows(own & ~keep[m]), thr)
    return whole, train, test


def test_empirical_counts_equal_a_slow_reference():
    rng = np.random.default_rng(0)
    M, N = 2, 120
    keep = rng.random((M, N)) < 0.5
    scores = np.round(rng.normal(size=(M, N)) + 0.8 * keep, 1)  # rounded: ties across classes
    scores[0, 3] = np.nan
    weights = multiplicities(N, 6, seed=1)
    folds = sample_folds(keep.sum(0), 3, seed=2)
    got = empirical_counts(scores, keep, weights, 0.1, folds)
    want = _reference_empirical(scores, keep, weights, 0.1, folds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w)


def test_in_sample_counts_give_tpr_at_fpr_of_the_metrics_module():
    rng = np.random.default_rng(3)
    keep = rng.random((1, 500)) < 0.4
    scores = rng.normal(size=(1, 500)) + keep
    whole, _, _ = empirical_counts(scores, keep, multiplicities(500, 0, seed=0), 0.05, np.zeros(500, int))
    tpr, _ = tpr_at_fpr(scores[0], keep[0], 0.05)
    assert whole[0, TP] / whole[0, POS] == pytest.approx(tpr)
    assert whole[0, FP] / whole[0, NEG] <= 0.05


def test_the_conformal_threshold_is_exceeded_by_fresh_non_members_at_most_fpr():
    """A fresh non-member exceeds the k-th largest of n non-members, k = floor(fpr (n + 1)), w.p. k / (n + 1)."""
    from llmaudit.analyze.decision.counts import sorted_threshold

    rng = np.random.default_rng(4)
    n, fpr, reps = 199, 0.05, 4000
    exceeded = []
    for _ in range(reps):
        s = np.sort(rng.normal(size=n))
        thr = sorted_threshold(s, np.cumsum(np.ones((1, n)), axis=1), fpr, held_out=True)[0]
        exceeded.append(rng.normal() > thr)
    k = math.floor(fpr * (n + 1))
    assert np.mean(exceeded) == pytest.approx(k / (n + 1), abs=3 * math.sqrt(0.05 * 0.95 / reps))
    assert k / (n + 1) <= fpr


@pytest.mark.parametrize("n_ref", [3, 8, 40])
def test_normal_scores_put_the_student_t_threshold_at_the_normal_one(n_ref):
    from llmaudit.analyze.decision.counts import normal_scores
    from llmaudit.analyze.metrics import calibrated_threshold

    t = calibrated_threshold(0.01, np.array([n_ref]), 30)[0]
    z = np.array([[t, t - 1e-6, t + 1e-6]])
    zz = normal_scores(z, np.full(z.shape, n_ref), 30)
    assert zz[0, 0] == pytest.approx(THRESHOLD_1PCT, abs=1e-6)
    assert zz[0, 1] < THRESHOLD_1PCT < zz[0, 2]
    assert np.isfinite(normal_scores(np.array([[1e6]]), np.array([[3]]), 30)).all()  # far tail: no overflow


def test_multiplicities_keep_row_zero_observed_and_strata_sizes():
    strata = np.r_[np.ones(30, bool), np.zeros(70, bool)]
    w = multiplicities(100, 50, seed=5, strata=strata)
    assert w.shape == (51, 100) and np.all(w[0] == 1)
    assert np.all(w[1:, strata].sum(1) == 30) and np.all(w[1:, ~strata].sum(1) == 70)
    assert np.array_equal(w, multiplicities(100, 50, seed=5, strata=strata))  # seeded


@pytest.mark.parametrize("M, N, fpr", [(5, 60, 0.1), (6, 1500, 0.01)])
def test_calibrated_counts_equal_a_slow_reference(M, N, fpr):
    """Calibrated scores pooled over targets: every row at the empirical threshold (measured) and at the lower of it
    and the analytic one (loose); per fold of samples, the choice (the other folds' members against a normal fitted
    to the fold's non-members) and the measurement (the fold's rows against the others' conformal threshold). The larger case finds the empirical threshold among the top non-members only
    (`pooled._empirical_thresholds`' window)."""
    rng = np.random.default_rng(8)
    keep = rng.random((M, N)) < 0.4
    z = np.round(rng.normal(size=(M, N)) + keep, 1)
    z[2, 5] = np.nan
    weights = multiplicities(N, 4, seed=9)
    folds = np.arange(N) % 3
    measured, loose, train, test = calibrated_counts(z, keep, weights, fpr, folds)
    analytic = stats.norm.ppf(1 - fpr)
    for b, w in enumerate(weights.astype(int)):

        def rows(samples, cls, w=w):
            picked = [cls[m] & np.isfinite(z[m]) & samples for m in range(M)]
            return np.concatenate([np.repeat(z[m, picked[m]], w[picked[m]]) for m in range(M)])

        everyone = np.ones(N, bool)
        emp = _in_sample_threshold(rows(everyone, keep), rows(everyone, ~keep), np.unique(z[np.isfinite(z)]), fpr)
        low = min(analytic, emp)
        assert measured[b].tolist() == _count(rows(everyone, keep), rows(everyone, ~keep), emp)
        assert loose[b].tolist() == _count(rows(everyone, keep), rows(everyone, ~keep), low)
        for f in range(3):
            other, own = folds != f, folds == f
            measuring = _conformal_threshold(rows(other, ~keep), fpr)
            assert test[b, f].tolist() == _count(rows(own, keep), rows(own, ~keep), measuring)
            if b == 0:  # the choice: the others' members against f's non-members' fitted or empirical quantile
                neg = rows(own, ~keep)
                empirical = _in_sample_threshold(np.array([]), neg, np.unique(neg), fpr)
                choosing = max(neg.mean() + neg.std() * analytic, empirical)
                assert train[f] == pytest.approx(_count(rows(other, keep), neg, choosing))


def test_cross_fit_chooses_on_the_observed_data_and_keeps_that_choice_in_every_resample():
    # 2 attacks, 2 folds. Attack 0 looks best where fold 0 is measured, attack 1 where fold 1 is.
    train = np.zeros((2, 2, 4))
    train[0, 0] = [9, 10, 0, 10]  # attack 0, chosen for fold 0: 0.9
    train[1, 0] = [1, 10, 0, 10]
    train[0, 1] = [1, 10, 0, 10]
    train[1, 1] = [9, 10, 0, 10]  # attack 1, chosen for fold 1: 0.9
    test = np.zeros((2, 2, 2, 4))
    test[0, 0, 0] = [2, 10, 1, 50]  # measured: attack 0 on fold 0
    test[0, 1, 1] = [3, 10, 0, 50]  # attack 1 on fold 1
    test[0, 1, 0] = [10, 10, 0, 50]  # never picked for fold 0: must not count
    test[1] = test[0] + 1  # a resample: the same attacks are counted in it
    cf = cross_fit(train, test)
    assert cf.picked.tolist() == [0, 1]
    assert cf.tpr[0] == pytest.approx(5 / 20) and cf.fpr[0] == pytest.approx(1 / 100)
    assert cf.pooled[0].tolist() == [5, 20, 1, 100]
    assert cf.pooled[1].tolist() == [7, 22, 3, 102]
    train[:, 1] = 0  # no attack has members where fold 1 is chosen: the fold is left out
    assert cross_fit(train, test).picked.tolist() == [0, -1] and cross_fit(train, test).pooled[0].tolist() == [
        2,
        10,
        1,
        50,
    ]


def test_wilson_and_effective_n_by_hand():
    lo, hi = wilson(0.1, 100, 1.959964)
    assert lo == pytest.approx(0.05522, abs=1e-4) and hi == pytest.approx(0.17436, abs=1e-4)
    assert wilson(0.0, 384, 2.0)[1] == pytest.approx(4 / (384 + 4))  # z^2 / (n + z^2) at p = 0
    assert effective_n(0.1, 0.03, 1000) == pytest.approx(100)  # 0.09 / 0.0009
    assert effective_n(0.0, 0.03, 1000) == 1000 and effective_n(0.1, 0.0, 1000) == 1000
    assert samples_factor(0.02, 0.01) == pytest.approx(4.0) and samples_factor(0.02, -0.01) is None


def test_weighted_auroc_equals_sklearn_and_repetition():
    rng = np.random.default_rng(6)
    scores = np.round(rng.normal(size=200), 1)
    labels = rng.random(200) < 0.3
    unit = np.arange(200) % 100  # two rows per sample
    w = np.ones((2, 100))
    w[1, :10] = 3.0
    got = weighted_auroc(scores, labels, unit, w)
    assert got[0] == pytest.approx(roc_auc_score(labels, scores))
    rep = np.repeat(np.arange(200), w[1][unit].astype(int))
    assert got[1] == pytest.approx(roc_auc_score(labels[rep], scores[rep]))


# ----------------------------------------------------------------------------------------------------------------
# a store: the whole path from a loss table (the simulations with known truth: test_decision_rule.py,
# test_decision_exact.py, test_decision_compare.py)


def _store_table(rng, *, n_runs=6, n_samples=400, n_tokens=8, planted=0.25):
    """A loss table of a store: full precision "fp", "q-same" = fp's token losses plus quantization noise, and
    "q-more" = the same plus a further drop of its members' losses by `planted` nats (it leaks more)."""
    difficulty = rng.uniform(1.0, 3.0, n_samples)
    keep = np.zeros((n_runs, n_samples), bool)
    for r in range(n_runs):
        keep[r, rng.choice(n_samples, n_samples // 4, replace=False)] = True
    rows = []
    for run in range(n_runs):
        for j in range(n_samples):
            member = bool(keep[run, j])
            fp = np.abs(rng.normal(difficulty[j] - 0.3 * member, 0.5, n_tokens))
            noise = rng.normal(0, 0.02, n_tokens)
            for q, tl in (
                ("fp32", fp),
                ("q-same", np.abs(fp + noise)),
                ("q-more", np.abs(fp + noise - planted * member)),
            ):
                rows.append(
                    dict(run=run, checkpoint=1, quantizer=q, sample_id=f"s{j:04d}", split="pool", member=member,
                         loss=float(tl.mean()), n_tokens=n_tokens, token_losses=tl)
                )  # fmt: skip
    return validate_loss_table(pd.DataFrame(rows))


@pytest.mark.slow
def test_a_planted_difference_in_a_store_is_found_as_more_and_an_unshifted_quantizer_is_not():
    df = _store_table(np.random.default_rng(7))
    res = run_attacks(
        df,
        AttackRunSettings(attacks=("loss", "ref", "lira_offline"), n_boot=0),
        reference_quantizer="fp32",
        decision=DecisionSettings(resamples=300),
    )
    per_q = res["decision"]["per_quantizer"]
    assert res["decision"]["rule"]["mode"] == "calibrated"
    more, same = per_q["q-more"]["comparison"], per_q["q-same"]["comparison"]
    assert more["direction"] == "MORE" and more["difference"]["low"] > 0
    assert same["direction"] in ("SAME", "CANNOT TELL") and same["difference"]["low"] <= 0 <= same["difference"]["high"]
    assert per_q["fp32"]["comparison"]["direction"] == "SAME"  # the reference against itself: difference 0
    # the per-attack paired differences point the same way for the planted quantizer
    loss_tpr = next(d for d in more["per_attack"] if d["attack"] == "loss" and d["metric"] == "auroc")
    assert loss_tpr["estimate"]["value"] > 0


def test_the_loss_gap_beside_the_tpr_by_hand():
    from llmaudit.analyze.decision.decide import loss_gap

    loss = np.array([[1.0, 2.0, 4.0], [3.0, 2.0, np.nan]])
    keep = np.array([[True, False, False], [False, True, True]])
    gap = loss_gap(loss, keep, multiplicities(3, 50, seed=0))
    # non-members 2, 4, 3 (mean 3); members 1, 2 (the NaN left out: mean 1.5)
    assert gap.value == pytest.approx(1.5) and gap.low <= gap.value <= gap.high
