"""Per-sample calibration of scores whose OUT references tie (counting scores such as WBC and RMIA)."""

import warnings

import numpy as np
import pytest

from llmaudit.analyze.attacks.evaluate import leave_one_out
from llmaudit.analyze.attacks.lira import LiraWarning, lira_offline, out_reference_counts
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
    n_ref = out_reference_counts(keep)
    usable = n_ref >= 2
    assert np.isfinite(z[usable]).all()
    res = pooled_calibrated(z, keep, (0.01,), n_ref)
    assert res["tpr_at_fpr"]["0.01"]["tpr"] > 0.5  # Student-t thresholds at a sample's few (balanced) references
    assert res["tpr_at_fpr"]["0.01"]["realised_fpr"] <= 0.03
    old = leave_one_out(lira_offline, scores, keep, None)
    assert np.isnan(old[usable]).mean() > 0.2  # the default rule drops the tied samples


# ------------------------------------------------------------------------------------------ rounding ties


def test_equal_losses_give_a_reference_score_of_exactly_zero_whatever_the_number_of_references():
    """The mean of k copies of x need not be x in floating point ((0.1 + 0.1 + 0.1) / 3 - 0.1 = 1.4e-17), and k
    (a sample's OUT references) depends on membership: a difference within rounding must be 0."""
    from llmaudit.analyze.attacks.text import ref_score

    for x in (0.1, 0.7, 1 / 3, 2.718281828459045, 13.37):
        for k in range(1, 12):
            refs = np.full((k, 1), x)
            assert ref_score(np.array([x]), refs)[0] == 0.0, (x, k)
    assert ref_score(np.array([1.0]), np.array([[1.0 + 1e-9]]))[0] != 0.0  # a real difference stays


def test_a_component_constant_but_for_rounding_adds_nothing_to_a_combination():
    from llmaudit.analyze.attacks.text import combine_scores

    x = 0.1
    rounding = np.array([[x, (x + x + x) / 3, x, np.nextafter(x, 1.0)]])  # 0.1 but for the last bit
    signal = np.array([[1.0, 2.0, 3.0, 4.0]])
    combined = combine_scores(signal, rounding, axis=1)
    np.testing.assert_allclose(combined, combine_scores(signal, axis=1))


def test_references_equal_but_for_rounding_are_ties_for_the_calibration():
    x = 0.1
    scores = np.array([[x, x], [x, x + 1e-17], [(x + x + x) / 3, x], [x, x]])  # one model per row
    keep = np.zeros((4, 2), dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiraWarning)
        assert np.isnan(lira_offline(scores, keep, 0)).all()  # zero spread: NaN by default
        z = lira_offline(scores, keep, 0, zero_spread="pooled")
    assert (z == 0.0).all()  # every sample tied, the target ties too: no evidence either way


def test_runs_with_identical_losses_leak_nothing_whatever_their_membership():
    """The artefact of a fine-tune that learned nothing (quantization erased the update, every run scores the
    pool identically): per-sample calibration of ref-based combinations turned the rounding of means over a
    membership-dependent number of references into a 'TPR' of 0.06-0.09 at 1% FPR. Now no attack finds anything."""
    from llmaudit.analyze.attacks.evaluate import run_attacks
    from llmaudit.analyze.attacks.settings import AttackRunSettings
    from llmaudit.store.losstable import validate_loss_table

    rng = np.random.default_rng(3)
    n_runs, n_samples, n_tokens = 8, 300, 6
    keep = rng.random((n_runs, n_samples)) < 0.5
    tokens = rng.uniform(0.05, 4.0, (n_samples, n_tokens))
    import pandas as pd

    rows = [
        dict(run=r, checkpoint=1, quantizer="q", sample_id=f"s{j:04d}", split="pool", member=bool(keep[r, j]),
             loss=float(tokens[j].mean()), n_tokens=n_tokens, token_losses=tokens[j].copy())
        for r in range(n_runs) for j in range(n_samples)
    ]  # fmt: skip
    res = run_attacks(
        validate_loss_table(pd.DataFrame(rows)),
        AttackRunSettings(attacks=("loss", "ref", "loss+ref", "lira_offline"), n_boot=0),
    )
    for name, entry in res["quantizers"]["q"]["attacks"].items():
        calibrated = entry.get("pooled_calibrated")
        if calibrated is not None:
            assert calibrated["tpr_at_fpr"]["0.01"]["tpr"] == 0.0, name


def test_balanced_references_give_members_and_non_members_the_same_calibration_under_the_null():
    """Scores that do not depend on membership but are not Gaussian (a few discrete values, like losses that
    differ only by float32 rounding between runs): with as many references for a member of the target as for a
    non-member, both classes are equally often above the calibrated threshold. With one OUT reference more for
    members (the unbalanced design) their Student-t threshold is lower and members were 'detected' far more."""
    from llmaudit.analyze.attacks.lira import balanced_references
    from llmaudit.analyze.metrics import calibrated_threshold

    rng = np.random.default_rng(11)
    m, n = 8, 4000
    keep = rng.random((m, n)) < 0.5
    scores = rng.integers(0, 3, (m, n)).astype(float) * 1e-7 + 2.0  # three values, independent of membership
    z = leave_one_out(lira_offline, scores, keep, None, zero_spread="pooled")
    thr = calibrated_threshold(0.01, out_reference_counts(keep))
    above = np.isfinite(z) & (z >= thr)
    hit_members = above[keep & np.isfinite(z)].mean()
    hit_non = above[~keep & np.isfinite(z)].mean()
    assert abs(hit_members - hit_non) < 0.01, (hit_members, hit_non)
    out_refs, in_refs = balanced_references(keep, 3)
    counts = out_refs.sum(0)
    assert (counts == np.maximum((~keep).sum(0) - 1, 0)).all() and not out_refs[3].any() and not in_refs[3].any()
    assert (in_refs.sum(0) == np.maximum(keep.sum(0) - 1, 0)).all()


def test_balanced_references_of_a_single_model_are_empty_not_an_error():
    """One imported fine-tune: no other model to calibrate against; the references are empty (the per-sample
    attacks then score NaN and are not judged), not a crash of the report."""
    from llmaudit.analyze.attacks.lira import balanced_references

    keep = np.array([[True, False, True]])
    out_refs, in_refs = balanced_references(keep, 0)
    assert out_refs.shape == in_refs.shape == (1, 3) and not out_refs.any() and not in_refs.any()
