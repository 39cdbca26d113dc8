"""Release sets (docs/science.md section 14): files of one fine-tune published together, combined per record, judged
by the release rule and compared with their best single file; a simulation with known truth shows the combined
attack finding what each file alone hides."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special, stats

from llmaudit.analyze.attacks.lira import leave_one_out, lira_offline, out_reference_counts
from llmaudit.analyze.decision import DecisionSettings, QuantizerEvidence
from llmaudit.analyze.decision.counts import normal_scores
from llmaudit.analyze.decision.decide import decide_one
from llmaudit.analyze.metrics_pooled import T_CUTOFF
from llmaudit.analyze.release_sets import (
    check_release_sets,
    combined_scores,
    decide_release_set,
    joint_weights,
    rank_normal,
    release_set_evidence,
    sidak_log_tail,
)
from llmaudit.config import RecipeError, load_recipe
from llmaudit.data.pool import membership_masks


def _files(shift: float, noise: list[float], M: int = 12, N: int = 600, seed: int = 1) -> dict[str, QuantizerEvidence]:
    """k files of the same M fine-tuned models: a record's raw score under file f is its difficulty + `shift` for
    members + the run's own noise (shared by the files of that run) + the file's quantization noise (independent
    across files given the model, sd noise[f]); each file calibrated per sample as the attack evaluation does."""
    rng = np.random.default_rng(seed)
    keep = membership_masks(N, M, 0.5, seed=3)
    model = rng.normal(0, 2, N) + shift * keep + 0.3 * rng.standard_normal((M, N))
    ids = [f"s{i}" for i in range(N)]
    out = {}
    for f, sd in enumerate(noise):
        raw = model + sd * rng.standard_normal((M, N))
        z = leave_one_out(lira_offline, raw, keep, None, zero_spread="pooled")
        z = normal_scores(z, out_reference_counts(keep), T_CUTOFF)
        out[f"q{f}"] = QuantizerEvidence(f"q{f}", "calibrated", ids, keep, {"loss": z.astype(np.float32)})
    return out


S = DecisionSettings(resamples=200, limit=0.05)


def test_the_combined_attack_finds_what_each_file_alone_hides():
    """Four files with independent quantization noise: each alone PASSes (its TPR at 1% FPR about 0.02-0.03, below
    the limit 0.05), the four together FAIL (about 0.08, lower bound above the limit), and the set leaks MORE than
    its best single file with an interval above 0."""
    evidence = _files(0.6, [1.0, 1.0, 1.0, 1.0])
    singles = {f: decide_one(ev, S).decision for f, ev in evidence.items()}
    assert all(d.status == "PASS" for d in singles.values()), {f: d.status for f, d in singles.items()}
    result = decide_release_set(evidence, list(evidence), S)
    assert result.decision.status == "FAIL" and result.decision.strongest.tpr.low > S.limit
    assert result.direction == "MORE" and result.versus_best_single.low > 0
    assert result.best_single_file in evidence
    assert result.sentence.startswith("publishing q0, q1, q2, q3 together leaks MORE than the strongest of them alone")
    strongest = set(result.decision.strongest.selection_stability)
    assert strongest & {"mean:loss", "joint:loss"}  # a combination, not a file alone, is the strongest attack
    assert result.single_files["q0"].value == pytest.approx(singles["q0"].strongest.tpr.value)


def test_without_membership_signal_the_set_neither_fails_nor_reads_more():
    evidence = _files(0.0, [1.0, 1.0, 1.0], M=10, N=500)
    result = decide_release_set(evidence, list(evidence), S)
    assert result.decision.status != "FAIL" and result.direction != "MORE"
    for name in ("mean:loss", "joint:loss", "max:loss"):
        judged = next(a for a in result.decision.attacks if a.attack == name)
        assert judged.realised_fpr <= 0.015  # the normal scale of each combination holds under non-membership


def test_the_joint_weights_favour_the_less_noisy_file_and_the_combinations_are_standardised():
    evidence = _files(0.0, [0.3, 2.0], M=10, N=800)
    z = np.stack([evidence[f].scores["loss"] for f in ("q0", "q1")]).astype(np.float64)
    keep = evidence["q0"].keep
    combined, w = combined_scores(z, keep)
    assert w[0] > w[1] >= 0 and w.sum() == pytest.approx(1.0)
    for name in ("mean", "joint"):
        assert np.nanstd(combined[name][~keep]) == pytest.approx(1.0, abs=0.05)
    scored = np.isfinite(z).all(axis=0)
    assert np.isfinite(combined["max"][scored]).all()  # a finite score wherever every file scored the record
    assert (combined["max"][~keep] > 2.326).mean() <= 0.012  # the Sidak tail keeps the 1% threshold
    three = _files(0.0, [1.0, 1.0, 1.0], M=10, N=800)
    z3 = np.stack([three[f].scores["loss"] for f in three]).astype(np.float64)
    top = combined_scores(z3, keep)[0]["max"]
    assert 0.005 <= (top[~keep] > 2.326).mean() <= 0.012  # close to 1% for (nearly) independent files
    same = joint_weights(np.array([[1.0, 0.999999], [0.999999, 1.0]]))  # bf16 and Q8_0: nearly one file
    assert (same >= 0).all() and same.sum() == pytest.approx(1.0)


def test_the_sidak_tail_is_the_tail_of_the_largest_of_k_independent_normals_far_out_too():
    t = np.array([-40.0, -1.0, 0.0, 2.326, 5.0, 12.0, 40.0])
    exact = np.log(-np.expm1(3 * stats.norm.logcdf(t[1:5])))  # log(1 - Phi(t)^3), without cancellation
    assert sidak_log_tail(t, 3)[1:5] == pytest.approx(exact, rel=1e-9)
    assert sidak_log_tail(t, 3)[5:] == pytest.approx(np.log(3) + stats.norm.logsf(t[5:]), rel=1e-12)
    assert np.isfinite(sidak_log_tail(t, 3)).all() and (sidak_log_tail(t, 3) < 0).all()
    scores = -special.ndtri_exp(sidak_log_tail(t, 1))
    assert scores[1:6] == pytest.approx(t[1:6], abs=1e-9)  # one file: its own normal score


def _heavy_tailed(M: int = 10, N: int = 800) -> dict[str, QuantizerEvidence]:
    """Three files whose calibrated scores have a counting attack's heavy tails (Student-t, 3 degrees of freedom,
    unit variance) rather than N(0, 1): two carry a member shift, one (a destroyed model) none."""
    rng = np.random.default_rng(0)
    keep = membership_masks(N, M, 0.5, seed=3)
    ids = [f"s{i}" for i in range(N)]
    out = {}
    for f, shift in enumerate([1.2, 1.0, 0.0]):
        z = shift * keep + rng.standard_t(3, size=(M, N)) / np.sqrt(3)
        out[f"q{f}"] = QuantizerEvidence(f"q{f}", "calibrated", ids, keep, {"count": z.astype(np.float32)})
    return out


def test_files_with_heavy_tails_are_put_on_their_non_members_normal_scale_before_they_are_combined():
    """Combined as if N(0, 1), heavy tails hide the gain (the set reads CANNOT TELL against its best file, +0.03
    [-0.004, +0.06]); on each file's own non-member scale the set leaks MORE (+0.11 [+0.09, +0.13])."""
    evidence = _heavy_tailed()
    result = decide_release_set(evidence, list(evidence), S)
    assert result.direction == "MORE" and result.versus_best_single.low > 0.05
    z = np.stack([evidence[f].scores["count"] for f in evidence]).astype(np.float64)
    keep = evidence["q0"].keep
    normal = rank_normal(z[2], ~keep)  # the file without signal: its non-members exactly N(0, 1) after
    assert (normal[~keep] > 2.326).mean() == pytest.approx(0.01, abs=0.002)
    assert (z[2][~keep] > 2.326).mean() > 0.011  # before: the t's heavier tail (1.4% beyond it in theory)
    order = np.argsort(z[2].ravel())
    assert (np.diff(normal.ravel()[order]) >= 0).all()  # monotone: the file's own ranking is kept
    beyond = rank_normal(np.array([[-50.0, 0.0, 50.0, np.nan]]), np.array([[False, True, False, False]]))
    assert np.isnan(beyond[0, 3]) and beyond.shape == (1, 4)  # fewer than 2 distinct non-members: as it is


def test_a_set_keeps_every_files_own_attacks_and_works_with_one_run():
    evidence = _files(0.8, [1.0, 1.0], M=1, N=1500)
    one_run = {f: QuantizerEvidence(f, "empirical", ev.sample_ids, ev.keep, ev.scores) for f, ev in evidence.items()}
    ev, weights = release_set_evidence(one_run, ["q0", "q1"])
    assert set(ev.scores) == {"mean:loss", "joint:loss", "max:loss", "q0:loss", "q1:loss"}
    assert set(weights["loss"]) == {"q0", "q1"}
    result = decide_release_set(one_run, ["q0", "q1"], S)
    assert result.decision.mode == "empirical" and result.name == "q0+q1"


def test_release_sets_that_cannot_be_judged_are_refused():
    evidence = _files(0.5, [1.0, 1.0], M=4, N=100)
    with pytest.raises(ValueError, match="no evidence of"):
        release_set_evidence(evidence, ["q0", "q7"])
    with pytest.raises(ValueError, match="at least two different files"):
        release_set_evidence(evidence, ["q0", "q0"])
    with pytest.raises(RecipeError, match=r"'gguf-q4_k' .* is not a scored quantizer \(did you mean 'gguf-q4_k_m'\?\)"):
        check_release_sets([["bf16", "gguf-q4_k"]], ["bf16", "gguf-q4_k_m"])
    check_release_sets([["bf16", "gguf-q4_k_m"]], ["bf16", "gguf-q4_k_m"])


def test_the_recipe_names_release_sets_of_scored_quantizers():
    cfg = load_recipe("demo-cpu", ["report.release_sets=[[fp32,uniform-2],[bnb-nf4,hqq-4,gptq-4]]"])
    assert cfg.report.release_sets == [["fp32", "uniform-2"], ["bnb-nf4", "hqq-4", "gptq-4"]]
    assert load_recipe("demo-cpu").report.release_sets == [["fp32", "hqq-4"], ["bnb-nf4", "gptq-4", "hqq-4"]]
    # the command line's grid keeps the recipe's sets it scores, drops the others; a set given with it is checked
    assert load_recipe("demo-cpu", ["score.quantizers=[fp32,hqq-4]"]).report.release_sets == [["fp32", "hqq-4"]]
    assert load_recipe("demo-cpu", ["score.quantizers=[fp32,sign]"]).report.release_sets == []
    with pytest.raises(RecipeError, match="'hqq-4' is not among score.quantizers"):
        load_recipe("demo-cpu", ["score.quantizers=[fp32,sign]", "report.release_sets=[[fp32,hqq-4]]"])
    full = load_recipe("demo-cpu", ["score.quantizers=[full,uniform-5]", "report.release_sets=[[bf16,uniform-5]]"])
    assert full.report.release_sets == [["bf16", "uniform-5"]]  # `full` becomes bf16, fp32 or fp16
    refused = {
        "[[fp32,unifrm-2]]": r"'unifrm-2' is not among score.quantizers \(did you mean 'uniform-2'\?\)",
        "[[fp32]]": "two or more different quantizers",
        "[[fp32,fp32]]": "two or more different quantizers",
        "[[fp32,uniform-2],[uniform-2,fp32]]": "given twice",
        "[[fp32,'../x']]": "not allowed",
    }
    for value, why in refused.items():
        with pytest.raises(RecipeError, match=why):
            load_recipe("demo-cpu", [f"report.release_sets={value}"])
