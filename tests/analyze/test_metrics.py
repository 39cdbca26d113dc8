"""Metrics on hand-computed examples, and the vectorised bootstrap against scikit-learn."""

import time

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score

from llmaudit.analyze import metrics
from llmaudit.analyze.metrics import (
    Resampling,
    bootstrap_ci,
    calibrated_threshold,
    is_reliable,
    per_sample_fpr,
    per_sample_tpr,
    pooled_calibrated,
    pooled_naive,
    roc_curve_loglog,
    roc_metrics,
    tpr_at_fpr,
)

from .reference_impls import (
    group_bootstrap_stats,
    sort_rows,
    sorted_bootstrap_stats,
    sorted_roc_stats,
    weighted_roc_stats,
)

# 10 points, 5 members. Walking the threshold down: 0.9 TP, 0.8 TP, 0.7 FP, 0.6 TP, 0.55 TP, 0.5 FP,
# 0.4 FP, 0.3 TP, 0.2 FP, 0.1 FP.
TEN_SCORES = [0.9, 0.8, 0.7, 0.6, 0.55, 0.5, 0.4, 0.3, 0.2, 0.1]
TEN_LABELS = [1, 1, 0, 1, 1, 0, 0, 1, 0, 0]


def test_perfect_and_reversed_separator():
    labels = np.array([0, 0, 0, 1, 1, 1])
    scores = np.arange(6.0)
    perfect = roc_metrics(scores, labels)
    assert perfect["auroc"] == 1.0
    assert perfect["average_precision"] == 1.0
    assert perfect["tpr_at_fpr"]["0.01"]["tpr"] == 1.0
    reversed_ = roc_metrics(-scores, labels)
    assert reversed_["auroc"] == 0.0
    assert reversed_["tpr_at_fpr"]["0.2"]["tpr"] == 0.0  # any threshold catching a member first catches 3 FPs


def test_ten_point_example_by_hand():
    m = roc_metrics(TEN_SCORES, TEN_LABELS)
    # members beat 5, 5, 4, 4, 2 non-members: AUROC = 20 / 25
    assert m["auroc"] == pytest.approx(0.8)
    # precision at each member: 1/1, 2/2, 3/4, 4/5, 5/8 -> mean 4.175 / 5
    assert m["average_precision"] == pytest.approx(0.835)
    at = m["tpr_at_fpr"]
    assert at["0.1"]["tpr"] == pytest.approx(0.4)  # FPR 0 allows only the two top members
    assert at["0.15"]["tpr"] == pytest.approx(0.4)
    assert at["0.2"]["tpr"] == pytest.approx(0.8)  # one FP (0.7) allowed: down to 0.55 -> 4 / 5
    assert at["0.2"]["threshold"] == pytest.approx(0.55)
    assert tpr_at_fpr(TEN_SCORES, TEN_LABELS, 0.4) == (pytest.approx(0.8), pytest.approx(0.5))
    # 5 negatives can support no level: 10 / 0.2 = 50 needed
    assert not any(v["reliable"] for v in at.values())
    assert at["0.2"]["min_negatives"] == 50 and at["0.001"]["min_negatives"] == 10000


def test_reliability_flag_threshold():
    assert is_reliable(100, 0.1) and not is_reliable(99, 0.1)
    assert is_reliable(10000, 0.001) and not is_reliable(9999, 0.001)
    rng = np.random.default_rng(0)
    labels = np.r_[np.ones(50), np.zeros(100)]
    m = roc_metrics(rng.normal(size=150), labels)
    flags = {k: v["reliable"] for k, v in m["tpr_at_fpr"].items()}
    assert flags == {
        "0.2": True,
        "0.15": True,
        "0.1": True,
        "0.05": False,
        "0.03": False,
        "0.01": False,
        "0.001": False,
    }


def test_ties_get_half_credit_and_errors():
    assert roc_metrics([1.0, 1.0, 1.0, 1.0], [0, 1, 0, 1])["auroc"] == 0.5
    with pytest.raises(ValueError, match="both members and non-members"):
        roc_metrics([1.0, 2.0], [1, 1])
    with pytest.raises(ValueError, match="NaN"):
        roc_metrics([1.0, np.nan], [0, 1])


def test_weighted_stats_match_sklearn_with_ties():
    rng = np.random.default_rng(1)
    labels = rng.random(3000) < 0.4
    scores = np.round(rng.normal(size=3000) + 0.7 * labels, 1)  # many ties
    _, group = np.unique(-scores, return_inverse=True)
    pos = np.bincount(group, weights=labels)[None]
    neg = np.bincount(group, weights=~labels)[None]
    got = weighted_roc_stats(pos, neg, (0.1, 0.01))
    assert got["auroc"][0] == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert got["average_precision"][0] == pytest.approx(average_precision_score(labels, scores), abs=1e-12)
    assert got["tpr_at_fpr"]["0.01"][0] == pytest.approx(tpr_at_fpr(scores, labels, 0.01)[0])
    assert got["tpr_at_fpr"]["0.1"][0] == pytest.approx(tpr_at_fpr(scores, labels, 0.1)[0])


def test_bootstrap_is_fast_seeded_and_covers_the_truth():
    rng = np.random.default_rng(2)
    labels = np.r_[np.ones(5000, bool), np.zeros(5000, bool)]
    d = 0.5
    scores = rng.normal(size=10000) + d * labels
    start = time.perf_counter()
    ci = bootstrap_ci(scores, labels, n_boot=1000, seed=3)
    assert time.perf_counter() - start < 15  # about 1.5 s on 2 shared cores
    true_auroc = stats.norm.cdf(d / np.sqrt(2))
    assert ci["auroc"]["low"] < true_auroc < ci["auroc"]["high"]
    assert 0.005 < ci["auroc"]["high"] - ci["auroc"]["low"] < 0.04  # sd of AUROC at n=10k is about 0.0055
    true_tpr = 1 - stats.norm.cdf(stats.norm.ppf(0.9) - d)
    assert ci["tpr_at_fpr"]["0.1"]["low"] < true_tpr < ci["tpr_at_fpr"]["0.1"]["high"]
    assert bootstrap_ci(scores, labels, n_boot=50, seed=3) == bootstrap_ci(scores, labels, n_boot=50, seed=3)


def test_group_bootstrap_resamples_samples_not_rows():
    # 10 identical "models": every sample appears 10 times. Resampling rows would pretend 10x the data.
    rng = np.random.default_rng(4)
    labels = rng.random(400) < 0.5
    scores = rng.normal(size=400) + labels
    rep_scores, rep_labels = np.tile(scores, 10), np.tile(labels, 10)
    groups = np.tile(np.arange(400), 10)
    width = lambda c: c["auroc"]["high"] - c["auroc"]["low"]  # noqa: E731
    single = width(bootstrap_ci(scores, labels, n_boot=400, seed=0, resampling=Resampling(stratified=False)))
    grouped = width(bootstrap_ci(rep_scores, rep_labels, n_boot=400, seed=0, groups=groups))
    rows = width(bootstrap_ci(rep_scores, rep_labels, n_boot=400, seed=0, resampling=Resampling(stratified=False)))
    assert grouped == pytest.approx(single, rel=0.25)
    assert rows < 0.5 * grouped  # about 1 / sqrt(10) as wide: the overconfidence groups avoid


def test_calibrated_threshold_normal_and_student():
    assert calibrated_threshold(0.05) == pytest.approx(1.644854, abs=1e-6)
    # n_ref = 10 < 30: t_9(0.95) * sqrt(1 + 1/10) = 1.833113 * 1.048809
    assert calibrated_threshold(0.05, 10) == pytest.approx(1.833113 * 1.048809, abs=1e-5)
    assert calibrated_threshold(0.05, 30) == pytest.approx(1.644854, abs=1e-6)
    thr = calibrated_threshold(0.01, np.array([1, 5, 100]))
    assert np.isnan(thr[0]) and thr[1] > 3 and thr[2] == pytest.approx(2.326348, abs=1e-6)


def test_student_t_threshold_is_exact_with_few_references():
    # out-scores standardized by a mean and sd from n = 5 references: the normal threshold lets through
    # far more than alpha, the Student-t predictive threshold about alpha.
    rng = np.random.default_rng(5)
    n, trials = 5, 40000
    refs = rng.normal(size=(trials, n))
    fresh = rng.normal(size=trials)
    z = ((fresh - refs.mean(1)) / refs.std(1, ddof=1))[None, :]
    members = np.zeros_like(z, bool)
    members[0, :10] = True  # a few members so that TPR is defined
    normal = pooled_calibrated(z, members, (0.01,))["tpr_at_fpr"]["0.01"]["realised_fpr"]
    student = pooled_calibrated(z, members, (0.01,), n_ref=n)["tpr_at_fpr"]["0.01"]["realised_fpr"]
    assert normal > 0.03
    assert student == pytest.approx(0.01, abs=0.002)


def test_per_sample_tpr_by_hand():
    # one sample, 4 models: in-scores 3 and 1, out-scores 2 and 0
    scores = np.array([[3.0], [2.0], [1.0], [0.0]])
    members = np.array([[True], [False], [True], [False]])
    r = per_sample_tpr(scores, members, (0.5, 0.2))
    # alpha 0.5: k = floor(0.5 * 2) = 1 -> threshold = 2nd largest out-score 0 -> in-scores > 0: 2 / 2
    assert r["tpr_at_fpr"]["0.5"]["tpr"] == 1.0
    assert r["tpr_at_fpr"]["0.5"]["realised_fpr"] == 0.5
    # alpha 0.2: k = 0 -> threshold = max out-score 2 -> only 3 passes: 1 / 2; 2 out-models < 10 / 0.2
    assert r["tpr_at_fpr"]["0.2"]["tpr"] == 0.5
    assert r["tpr_at_fpr"]["0.2"]["realised_fpr"] == 0.0
    assert not r["tpr_at_fpr"]["0.2"]["reliable"]


def test_pooled_naive_reports_per_sample_fpr_spread_and_group_ci():
    # sample 0 always scores high, sample 1 always low: one threshold flags only sample 0's non-members
    scores = np.array([[5.0, 0.0], [5.1, 0.1], [6.0, 1.0], [6.1, 1.1]])
    members = np.array([[False, False], [False, False], [True, True], [True, True]])
    assert per_sample_fpr(scores, members, 2.0).tolist() == [1.0, 0.0]
    r = pooled_naive(scores, members, (0.5,), n_boot=20)
    assert r["auroc"] == pytest.approx(0.75)  # ranks: 0.0 .1 | 1.0 1.1 | 5.0 5.1 | 6.0 6.1
    assert r["tpr_at_fpr"]["0.5"]["tpr"] == 1.0  # threshold 5.0: FPR 2/4, TPR 4/4
    assert r["tpr_at_fpr"]["0.5"]["per_sample_fpr"]["p10"] == pytest.approx(0.0, abs=0.11)
    assert r["tpr_at_fpr"]["0.5"]["per_sample_fpr"]["p90"] == pytest.approx(1.0, abs=0.11)
    assert r["ci"]["resampling"] == "groups (samples)"


def test_roc_curve_loglog_starts_at_one_over_negatives():
    curve = roc_curve_loglog(TEN_SCORES, TEN_LABELS)
    assert min(curve["fpr"]) >= 0.2 - 1e-12  # 5 negatives: nothing below FPR 1/5 is observable
    assert curve["tpr"][-1] == 1.0


def _ci_values(ci: dict) -> np.ndarray:
    """Every interval end of a `bootstrap_ci` result, in a fixed order."""
    ends = [ci["auroc"], ci["average_precision"], *ci["tpr_at_fpr"].values()]
    return np.array([[e["low"], e["high"]] for e in ends])


@pytest.mark.parametrize("case", ["rows", "stratified", "groups", "ties", "few"])
def test_sorted_bootstrap_equals_the_landed_group_bootstrap(case):
    """The package's bootstrap (one sort, one compiled pass per resample) gives the intervals of both reference
    engines (numpy cumulative sums over the sorted rows; weights of the distinct-score groups): the same resamples
    (same generator, same blocks), AUROC and TPR exactly, average precision to rounding; with ties between and
    within the classes, grouped rows, resamples that lose a class, every FPR level."""
    rng = np.random.default_rng(11)
    n = {"few": 7}.get(case, 3000)
    labels = rng.random(n) < 0.35
    scores = rng.normal(size=n) + 0.6 * labels
    if case in ("ties", "groups"):
        scores = np.round(scores, 1)
    kw = dict(fprs=(0.2, 0.05, 0.01, 0.001), n_boot=257, seed=5)
    if case == "groups":  # 6 models x 500 samples: a drawn sample brings its 6 rows
        kw["groups"] = np.tile(np.arange(500), 6)
        labels = np.tile(rng.random(500) < 0.5, 6) ^ (rng.random(n) < 0.3)
    stratified = None
    if case == "rows":
        stratified = False
    if case == "few":  # tiny unstratified resamples: some lose a class (NaN, ignored)
        stratified, kw["fprs"] = False, (0.2,)
        labels = np.array([1, 0, 0, 0, 0, 0, 1], bool)
    got = bootstrap_ci(scores, labels, resampling=Resampling(stratified), **kw)
    for engine in (group_bootstrap_stats, sorted_bootstrap_stats):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(metrics, "bootstrap_stats", engine)
            want = bootstrap_ci(scores, labels, resampling=Resampling(stratified), **kw)
        a, b = _ci_values(got), _ci_values(want)
        assert np.array_equal(np.delete(a, 1, axis=0), np.delete(b, 1, axis=0), equal_nan=True)
        assert np.allclose(a[1], b[1], rtol=0, atol=1e-12, equal_nan=True)
        assert {k: v for k, v in got.items() if k not in ("auroc", "average_precision", "tpr_at_fpr")} == {
            k: v for k, v in want.items() if k not in ("auroc", "average_precision", "tpr_at_fpr")
        }


def test_sorted_roc_stats_equal_the_group_stats_per_resample():
    """Resample by resample (not only the percentiles): integer weights with zeros, ties across classes."""
    rng = np.random.default_rng(12)
    labels = rng.random(800) < 0.4
    scores = np.round(rng.normal(size=800) + labels, 1)
    counts = rng.poisson(1.0, size=(40, 800)).astype(np.float64)
    fprs = (0.3, 0.1, 0.01)
    got = sorted_roc_stats(sort_rows(scores, labels, np.arange(800)), counts, fprs)
    _, group = np.unique(-scores, return_inverse=True)
    pos = np.stack([np.bincount(group, weights=c * labels) for c in counts])
    neg = np.stack([np.bincount(group, weights=c * ~labels) for c in counts])
    want = weighted_roc_stats(pos, neg, fprs)
    assert np.array_equal(got["auroc"], want["auroc"])
    assert np.allclose(got["average_precision"], want["average_precision"], rtol=0, atol=1e-13)
    for key in want["tpr_at_fpr"]:
        assert np.array_equal(got["tpr_at_fpr"][key], want["tpr_at_fpr"][key])


@pytest.mark.parametrize("decimals", [None, 1])
def test_compiled_roc_stats_equal_the_sorted_ones_per_resample(decimals):
    """The compiled pass (`roc_kernel`) resample by resample: AUROC and TPR exactly, AP to rounding, with and
    without ties, zero weights, several rows per unit, a resample without members (NaN), every level order."""
    from llmaudit.analyze.roc_kernel import roc_rows, roc_stats

    rng = np.random.default_rng(14)
    unit = np.tile(np.arange(300), 4)  # 4 rows per unit
    labels = rng.random(1200) < 0.4
    scores = rng.normal(size=1200) + labels
    scores = np.round(scores, decimals) if decimals is not None else scores
    counts = rng.poisson(1.0, size=(60, 300)).astype(np.float64)
    counts[7, np.unique(unit[labels])] = 0.0  # no member left in resample 7
    fprs = (0.01, 0.3, 0.1, 0.001, 0.5)
    want = sorted_roc_stats(sort_rows(scores, labels, unit), counts, fprs)
    auroc, ap, tpr = roc_stats(roc_rows(scores, labels, unit, 300), counts, fprs)
    assert np.array_equal(auroc, want["auroc"], equal_nan=True) and np.isnan(auroc[7])
    assert np.allclose(ap, want["average_precision"], rtol=0, atol=1e-13, equal_nan=True)
    for i, alpha in enumerate(fprs):
        assert np.array_equal(tpr[:, i], want["tpr_at_fpr"][f"{alpha:g}"], equal_nan=True)


def test_calibrated_intervals_equal_the_landed_computation(monkeypatch):
    """pooled_calibrated's intervals: every level's counts re-summed in one product and the pooled z's ROC
    bootstrap on the sorted path give the landed numbers (levels one product each, the group bootstrap)."""
    rng = np.random.default_rng(13)
    members = rng.random((8, 300)) < 0.5
    z = rng.normal(size=(8, 300)) + 0.8 * members
    z[0, :5] = np.nan
    got = pooled_calibrated(z, members, (0.1, 0.01), n_ref=np.full(300, 7), n_boot=200, seed=4)
    monkeypatch.setattr(metrics, "bootstrap_stats", group_bootstrap_stats)
    landed = pooled_calibrated(z, members, (0.1, 0.01), n_ref=np.full(300, 7), n_boot=200, seed=4)
    assert got["ci"]["tpr_at_fpr"] == landed["ci"]["tpr_at_fpr"]
    assert got["ci"]["roc"]["auroc"] == landed["ci"]["roc"]["auroc"]
    ap, ap_landed = got["ci"]["roc"]["average_precision"], landed["ci"]["roc"]["average_precision"]
    assert ap["low"] == pytest.approx(ap_landed["low"], abs=1e-12)
    assert ap["high"] == pytest.approx(ap_landed["high"], abs=1e-12)
    # one level's interval by hand: the same resamples, its four counts re-summed alone
    counts = metrics.resample_counts(np.random.default_rng(4), 300, 200)
    fin = np.isfinite(z)
    thr = metrics.calibrated_threshold(0.1, np.full((8, 300), 7.0))
    above = fin & (z >= thr)
    boot = counts @ np.stack([(members & above).sum(0), (members & fin).sum(0)]).T.astype(float)
    lo, hi = np.quantile(boot[:, 0] / boot[:, 1], [0.025, 0.975])
    assert got["ci"]["tpr_at_fpr"]["0.1"]["tpr"] == {"low": lo, "high": hi}


def test_calibrated_threshold_of_an_array_is_the_elementwise_formula():
    """Each distinct reference count's quantile is computed once and spread back: the same numbers as the
    formula applied to every entry (NaN and counts below 2 included)."""
    rng = np.random.default_rng(14)
    n = rng.integers(0, 45, (20, 300)).astype(float)
    n[0, 0] = np.nan
    for alpha in (0.1, 0.01, 0.001):
        with np.errstate(invalid="ignore", divide="ignore"):
            student = stats.t.ppf(1 - alpha, df=np.where(n >= 2, n - 1, np.nan)) * np.sqrt(1 + 1 / n)
        want = np.where(n >= 30, stats.norm.ppf(1 - alpha), student)
        assert np.array_equal(calibrated_threshold(alpha, n), want, equal_nan=True)


def test_percentile_is_the_shared_percentile_interval():
    """`metrics._percentile` (the bootstrap CIs' percentiles) is common.stats.percentile_interval: finite
    values only, numpy's linear quantiles at (1 -+ confidence) / 2, nan when nothing is finite."""
    from llmaudit.analyze.metrics import _percentile

    def written_out(values, confidence):  # the formula metrics.py used before it shared the common one
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            return {"low": float("nan"), "high": float("nan")}
        lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
        return {"low": float(lo), "high": float(hi)}

    rng = np.random.default_rng(0)
    cases = [rng.normal(size=n) for n in (1, 2, 7, 1000)]
    cases += [np.array([np.nan, 1.0, np.inf, 3.0, -np.inf, 2.0]), np.array([np.nan, np.nan]), np.array([])]
    for values in cases:
        for confidence in (0.5, 0.9, 0.95, 0.999):
            got, want = _percentile(values, confidence), written_out(values, confidence)
            np.testing.assert_array_equal([got["low"], got["high"]], [want["low"], want["high"]])
