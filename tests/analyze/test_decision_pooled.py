"""The release decision's pooled calibrated counts and resampled AUROC (`llmaudit.analyze.decision.pooled`) equal
the reference computation over every row of every resample (benchmarks/landed_decision.py, the benchmark's
baseline) exactly, where the windows the pooled one reads are much smaller than the rows."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from llmaudit.analyze.decision.counts import multiplicities, sample_folds, sorted_rows, sorted_threshold
from llmaudit.analyze.decision.pooled import _empirical_thresholds, calibrated_counts, weighted_auroc

REFERENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "landed_decision.py"


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location("landed_decision", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scores(seed: int, M: int, N: int, scale: float = 1.0, decimals: int | None = None):
    rng = np.random.default_rng(seed)
    keep = rng.random((M, N)) < 0.5
    z = scale * rng.normal(size=(M, N)) + 0.8 * keep
    z = np.round(z, decimals) if decimals is not None else z
    z[rng.random((M, N)) < 0.02] = np.nan
    return z.astype(np.float32), keep


@pytest.mark.parametrize(
    "seed, fpr, scale, decimals",
    [
        (0, 0.01, 1.0, None),  # calibrated: the empirical threshold near the analytic one
        (1, 0.001, 1.0, 2),  # ties between members and non-members, a tiny FPR
        (2, 0.01, 3.0, None),  # miscalibrated: the empirical threshold far above the analytic one
        (3, 0.01, 0.3, None),  # ... and far below it
        (4, 0.2, 1.0, 1),
    ],
)
def test_calibrated_counts_equal_the_row_by_row_reference(reference, seed, fpr, scale, decimals):
    z, keep = _scores(seed, 10, 3000, scale, decimals)
    weights = multiplicities(z.shape[1], 40, seed=seed)
    folds = sample_folds(keep.sum(0), 5, seed)
    new = calibrated_counts(z, keep, weights, fpr, folds)
    old = reference.landed_calibrated_counts(z, keep, weights, fpr, folds)
    for a, b in zip(new, old):
        np.testing.assert_array_equal(a, b)


def test_calibrated_counts_without_members_or_non_members(reference):
    z, keep = _scores(5, 4, 200)
    weights = multiplicities(200, 5, seed=1)
    for k in (np.zeros_like(keep), np.ones_like(keep)):
        new = calibrated_counts(z, k, weights, 0.05, np.arange(200) % 2)
        old = reference.landed_calibrated_counts(z, k, weights, 0.05, np.arange(200) % 2)
        for a, b in zip(new, old):
            np.testing.assert_array_equal(a, b)


def test_the_threshold_window_widens_until_every_resample_is_inside():
    """Resamples that drop the samples of the top non-members put their thresholds far below the first window:
    it doubles until they are inside, and the thresholds equal those of running weights over every row."""
    rng = np.random.default_rng(7)
    M, N, fpr = 5, 2000, 0.01
    keep = rng.random((M, N)) < 0.5
    z = rng.normal(size=(M, N))
    target, unit = np.nonzero(np.isfinite(z))
    s, member, _, unit = sorted_rows(z.ravel(), keep.ravel(), target, unit)
    weights = multiplicities(N, 6, seed=3)
    top_samples = np.unique(unit[~member][-600:])  # more than the first window of ~264 non-members
    weights[1:4, top_samples] = 0.0
    neg = np.flatnonzero(~member)
    got = _empirical_thresholds(s, unit[neg], neg, weights, fpr)
    full = sorted_threshold(s, np.cumsum(weights[:, unit] * ~member, axis=1), fpr, held_out=False)
    np.testing.assert_array_equal(got, full)
    assert (got[1:4] < got[0]).all()


@pytest.mark.parametrize("decimals", [None, 1])
def test_weighted_auroc_equals_the_row_by_row_reference_and_sklearn(reference, decimals):
    z, keep = _scores(9, 8, 1500, decimals=decimals)
    finite = np.isfinite(z)
    unit = np.broadcast_to(np.arange(z.shape[1]), z.shape)[finite]
    weights = multiplicities(z.shape[1], 30, seed=2)
    got = weighted_auroc(z[finite], keep[finite], unit, weights)
    np.testing.assert_array_equal(got, reference.landed_weighted_auroc(z[finite], keep[finite], unit, weights))
    assert got[0] == pytest.approx(roc_auc_score(keep[finite], z[finite]), abs=1e-12)
    rep = np.repeat(np.arange(unit.size), weights[5][unit].astype(int))
    assert got[5] == pytest.approx(roc_auc_score(keep[finite][rep], z[finite][rep]), abs=1e-12)
