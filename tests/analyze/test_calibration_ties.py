"""Per-sample calibration of scores whose OUT references tie (counting scores such as WBC and RMIA)."""

import warnings

import numpy as np
import pytest

from llmaudit.analyze.attacks.evaluate import leave_one_out
from llmaudit.analyze.attacks.lira import LiraWarning, lira_offline
from llmaudit.analyze.metrics import pooled_calibrated

KEEP = np.zeros((4, 2), dtype=bool)  # every sample OUT everywhere; target 0, references = models 1..3


def _z(scores, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiraWarning)
        return lira_offline(np.asarray(scores, dtype=float).T, KEEP, 0, **kw)


def test_a_tied_sample_is_nan_by_default_and_pooled_sd_on_request():
    # sample 0: references 1, 2, 3 (mean 2, sd 1), target 5 -> z = 3
    # sample 1: references 2, 2, 2 (zero spread), target 4
    scores = [[5, 1, 2, 3], [4, 2, 2, 2]]
    z = _z(scores)
    assert z[0] == pytest.approx(3.0) and np.isnan(z[1])
    # pooled within-sample variance: (1 + 0 + 1 + 0 + 0 + 0) / (2 + 2) = 0.5 -> sd 0.7071
    z = _z(scores, zero_spread="pooled")
    assert z[0] == pytest.approx(3.0)
    assert z[1] == pytest.approx(2.0 / np.sqrt(0.5))


def test_every_sample_tied_scores_zero_where_the_target_ties_and_nan_where_it_does_not():
    z = _z([[2, 2, 2, 2], [3, 1, 1, 1]], zero_spread="pooled")
    assert z[0] == 0.0 and np.isnan(z[1])


def test_the_rule_is_checked():
    with pytest.raises(ValueError, match="zero_spread"):
        _z([[1, 2, 3, 4]] * 2, zero_spread="ignore")


def test_tied_references_keep_their_non_members_in_the_calibrated_count():
    """A counting score that ties on most samples' OUT runs: before, those samples were dropped (the count of
    calibrated non-members fell below what the design has); now every sample with 2 OUT references counts,
    and a planted member signal is found at the calibrated threshold."""
    rng = np.random.default_rng(0)
    m, n = 6, 400
    keep = rng.random((m, n)) < 0.25
    scores = np.where(rng.random((m, n)) < 0.7, 1.0, rng.random((m, n)))  # 70% of scores tie at 1.0
    scores = np.where(keep, scores + 3.0, scores)  # members score far above every non-member
    z = leave_one_out(lira_offline, scores, keep, None, zero_spread="pooled")
    n_ref = (~keep).sum(0)[None, :] - (~keep).astype(int)
    usable = n_ref >= 2
    assert np.isfinite(z[usable]).all()
    res = pooled_calibrated(z, keep, (0.01,), n_ref)
    assert res["tpr_at_fpr"]["0.01"]["tpr"] > 0.75  # Student-t thresholds where a sample has few references
    assert res["tpr_at_fpr"]["0.01"]["realised_fpr"] <= 0.03
    old = leave_one_out(lira_offline, scores, keep, None)
    assert np.isnan(old[usable]).mean() > 0.2  # the default rule drops the tied samples
