"""Attacks: hand-computed text scores, LiRA on simulations with known answers, and the orchestration."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score

from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.lira import (
    LiraWarning,
    balanced_references,
    confidence_logit,
    fpc,
    lira_offline,
    lira_online,
    normality_check,
    out_reference_counts,
)
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.attacks.text import (
    combine_scores,
    loss_score,
    min_k_count,
    min_k_plus_plus_score,
    min_k_score,
    ref_score,
    zlib_score,
)
from llmaudit.analyze.metrics import calibrated_threshold, per_sample_fpr, pooled_calibrated, pooled_naive
from llmaudit.commands.attack import attack_command
from llmaudit.config import LEGACY_ATTACK_NAMES
from llmaudit.store.losstable import validate_loss_table, write_loss_table

TOKENS = [0.5, 1.0, 2.0, 0.1, 3.0]  # per-token NLLs; log p = -l


# ---------------------------------------------------------------------------------------------- text


def test_loss_score_by_hand():
    # (0.5 + 1 + 2 + 0.1 + 3) / 5 = 1.32
    assert loss_score([TOKENS, [2.0]]) == pytest.approx([-1.32, -2.0])


def test_min_k_by_hand_and_rounding():
    # k = 0.2, T = 5: floor(1.0) = 1 token, the least likely one (l = 3.0): mean log p = -3.0
    assert min_k_score([TOKENS], k=0.2) == pytest.approx([-3.0])
    # k = 0.5: floor(2.5) = 2 tokens (the published int(k * T)), l = 3.0, 2.0: mean log p = -2.5
    assert min_k_score([TOKENS], k=0.5) == pytest.approx([-2.5])
    # 0.29 * 100 is 28.999999999999996 in floating point: still 29 tokens, not 28; 0.2 * 15 stays 3
    assert min_k_count(100, 0.29) == 29 and min_k_count(15, 0.2) == 3
    assert min_k_count(3, 0.2) == 1  # floor(0.6) = 0 is undefined in the published code: one token
    assert min_k_count(1, 0.2) == 1  # at least one token
    assert min_k_count(9, 0.2) == 1  # floor(1.8), where ceil would take 2
    assert min_k_count(7, 1.0) == 7
    with pytest.raises(ValueError):
        min_k_count(5, 0.0)


@pytest.mark.parametrize("budget", [1, 50, 1 << 22])
def test_min_k_arrays_equal_the_per_sample_loop(budget):
    """All texts at once (sorted padded rows in blocks of similar length) against the per-text loop min-k% and
    Min-K%++ one text at a time (tests/analyze/reference_impls.py): ragged texts of 1 to 80 tokens with ties, zero spreads;
    blocks of one text, of a few, and all at once."""
    from llmaudit.common import ragged

    from .reference_impls import min_k_plus_plus_score_per_sample, min_k_score_per_sample

    rng = np.random.default_rng(9)
    lengths = np.r_[1, 1, 2, 5, rng.integers(1, 81, 300)]
    losses = [np.round(rng.gamma(2.0, 1.0, n), 1) for n in lengths]
    means = [-rng.uniform(0.5, 3, n) for n in lengths]
    stds = [rng.uniform(0, 2, n) * (rng.random(n) < 0.9) for n in lengths]
    with pytest.MonkeyPatch.context() as mp:
        for name in ("smallest_means", "largest_means"):
            original = getattr(ragged, name)
            mp.setattr(f"llmaudit.analyze.attacks.text.{name}", lambda *a, f=original: f(*a, budget=budget))
        for k in (0.1, 0.2, 0.5, 1.0):  # bit for bit: each text's mean is numpy's mean of its own slice
            assert np.array_equal(min_k_score(losses, k), min_k_score_per_sample(losses, k))
            got = min_k_plus_plus_score(losses, means, stds, k)
            assert np.array_equal(got, min_k_plus_plus_score_per_sample(losses, means, stds, k))
    assert min_k_score([]).shape == (0,)
    # identical texts score identically wherever they fall (the sums run in one order whatever the block)
    twice = [losses[10], *losses, losses[10]]
    scores = min_k_score(twice, 0.5)
    assert scores[0] == scores[11] == scores[-1]
    with pytest.raises(ValueError, match="sample 1: 2 token losses but 1 vocab means"):
        min_k_plus_plus_score([[1.0], [1.0, 2.0]], [[0.0], [0.0]], [[1.0], [1.0, 1.0]])
    with pytest.raises(ValueError, match="sample 1: negative vocabulary standard deviation"):
        min_k_plus_plus_score([[1.0], [1.0, 2.0]], [[0.0], [0.0, 0.0]], [[1.0], [1.0, -1.0]])
    with pytest.raises(ValueError, match="at least one token loss"):
        min_k_score([[1.0], []])


def test_min_k_plus_plus_by_hand():
    mu = [-1.0, -1.0, -1.0, -1.0, -2.0]
    sd = [0.5, 1.0, 1.0, 1.0, 2.0]
    # log p = -0.5, -1, -2, -0.1, -3 -> z = (logp - mu)/sd = 1.0, 0.0, -1.0, 0.9, -0.5
    # k = 0.4: floor(2) = 2 lowest z: -1.0 and -0.5 -> -0.75. (Plain min-k would pick l = 3.0 and 2.0.)
    assert min_k_plus_plus_score([TOKENS], [mu], [sd], k=0.4) == pytest.approx([-0.75])
    # a one-token distribution (sd 0) contributes z = 0: z = 0, 0 -> lowest 1 of 2 is 0
    assert min_k_plus_plus_score([[0.0, 0.0]], [[0.0, 0.0]], [[0.0, 0.0]], k=0.5) == pytest.approx([0.0])
    with pytest.raises(ValueError, match="token_vocab_mean"):
        min_k_plus_plus_score([TOKENS], None, None)
    with pytest.raises(ValueError, match="token losses but"):
        min_k_plus_plus_score([TOKENS], [mu[:4]], [sd])


def test_zlib_by_hand():
    # -L / zlib_bytes = -1.32 / 33 = -0.04
    assert zlib_score([TOKENS], [33]) == pytest.approx([-0.04])
    with pytest.raises(ValueError, match="positive"):
        zlib_score([TOKENS], [0])


def test_ref_score_by_hand():
    target = [1.0, 2.0]
    refs = [[1.5, 2.0], [2.5, 1.0]]
    # mean refs = 2.0, 1.5 -> -(1 - 2) = 1, -(2 - 1.5) = -0.5
    assert ref_score(target, refs) == pytest.approx([1.0, -0.5])
    # reference 1 not usable for sample 1: mean ref = 2.0 -> -(2 - 2) = 0
    assert ref_score(target, refs, [[True, True], [True, False]]) == pytest.approx([1.0, 0.0])
    assert np.isnan(ref_score([1.0], [[2.0]], [[False]])[0])


def test_combine_scores_by_hand():
    # a = 1, 2, 3: mean 2, population sd sqrt(2/3) -> -1.2247, 0, 1.2247
    # b = 10, 10, 40: mean 20, sd sqrt(200) = 14.142 -> -0.7071, -0.7071, 1.4142
    got = combine_scores([1.0, 2.0, 3.0], [10.0, 10.0, 40.0])
    assert got == pytest.approx([-1.9318, -0.7071, 2.6390], abs=1e-4)
    # per row (target model) along the sample axis
    two = combine_scores(np.array([[1.0, 2.0, 3.0], [5.0, 5.0, 8.0]]), axis=1)
    assert two[1] == pytest.approx([-0.7071, -0.7071, 1.4142], abs=1e-4)


# ---------------------------------------------------------------------------------------------- LiRA


def test_confidence_logit_by_hand():
    # logit(e^-1) = -1 - log(1 - e^-1) = -1 - log(0.632121) = -0.541325
    assert confidence_logit(1.0) == pytest.approx(-0.541325, abs=1e-6)
    # large L: ~ -L; small L: ~ -log L
    assert confidence_logit(30.0) == pytest.approx(-30.0, abs=1e-9)
    assert confidence_logit(1e-6) == pytest.approx(-np.log(1e-6), abs=1e-5)
    assert np.isfinite(confidence_logit(0.0))
    assert np.all(np.diff(confidence_logit(np.linspace(0.01, 10, 50))) < 0)  # same ranking as LOSS


def test_fpc():
    assert fpc(500, 1000) == 0.5
    assert fpc(8000, 10000) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="n_train < n_pool"):
        fpc(1000, 1000)


def test_lira_offline_by_hand():
    scores = np.array([[5.0], [1.0], [2.0], [3.0]])
    keep = np.array([[True], [False], [False], [False]])
    # target 0 (member): sample 0 is out in models 1, 2, 3; balanced references keep one fewer than all (as many
    # as a non-member of the sample has), dropping the first after the target: refs 2, 3 -> mean 2.5, sd 0.7071
    assert lira_offline(scores, keep, 0) == pytest.approx([(5 - 2.5) / np.sqrt(0.5)])
    # fpc = 0.25: sigma^2 / 0.25 -> sd 1.4142
    assert lira_offline(scores, keep, 0, 0.25) == pytest.approx([(5 - 2.5) / np.sqrt(2.0)])
    # target 1 (out) is left out of its own references: refs 2 and 3 -> mean 2.5, sd 0.7071
    assert lira_offline(scores, keep, 1) == pytest.approx([(1 - 2.5) / np.sqrt(0.5)])
    # target 2 (out): refs are the others where the sample was out, 1 and 3 -> mean 2, sd 1.4142
    assert lira_offline(scores, keep, 2) == pytest.approx([(2 - 2.0) / np.sqrt(2.0)])
    # a sample with one out reference cannot be scored per sample: NaN and a warning with the count
    keep2 = np.array([[True], [True], [False], [False]])
    with pytest.warns(LiraWarning, match="1 of 1"):
        assert np.isnan(lira_offline(scores, keep2, 0)[0])
    assert out_reference_counts(keep).ravel().tolist() == [2, 2, 2, 2]


def test_lira_offline_global_variance_by_hand():
    # two samples, both out in models 1..3; target 0 (member of both) drops model 1 (balanced references):
    # sample 0: refs 2, 3 (mean 2.5, SS 0.5); sample 1: refs 10, 13 (mean 11.5, SS 4.5)
    # pooled variance = (0.5 + 4.5) / (1 + 1) = 2.5
    scores = np.array([[4.0, 15.0], [1.0, 10.0], [2.0, 10.0], [3.0, 13.0]])
    keep = np.array([[True, True], [False, False], [False, False], [False, False]])
    z = lira_offline(scores, keep, 0, variance="global")
    assert z == pytest.approx([(4 - 2.5) / np.sqrt(2.5), (15 - 11.5) / np.sqrt(2.5)])


def test_lira_online_by_hand():
    # target 0 (member): in refs 4, 6 (mean 5, sd 1.4142); out in models 3, 4, 5, of which the balance keeps two
    # (dropping model 3, the first after the target): 3, 5 (mean 4, sd 1.4142); target score 5
    scores = np.array([[5.0], [4.0], [6.0], [1.0], [3.0], [5.0]])
    keep = np.array([[True], [True], [True], [False], [False], [False]])
    expected = stats.norm.logpdf(5, 5, np.sqrt(2)) - stats.norm.logpdf(5, 4, np.sqrt(2))  # = 1 / 4
    assert lira_online(scores, keep, 0) == pytest.approx([expected])
    assert expected == pytest.approx(0.25)
    # target 3 (non-member): out refs models 4, 5 (3, 5: mean 4); in refs one fewer than the 3 models in: the
    # first after the target (cyclically 4, 5, 0, ...) holding one is model 0, dropped -> models 1, 2 (4, 6: mean 5)
    expected3 = stats.norm.logpdf(1, 5, np.sqrt(2)) - stats.norm.logpdf(1, 4, np.sqrt(2))
    assert lira_online(scores, keep, 3) == pytest.approx([expected3])


def _per_sample_world(rng, n_models, n_samples, d):
    """Each sample has its own mean and spread; members are shifted by d of the sample's spreads."""
    mean = rng.uniform(-4, 4, n_samples)
    spread = rng.uniform(0.3, 3.0, n_samples)
    keep = rng.random((n_models, n_samples)) < 0.5
    scores = mean + spread * (rng.normal(size=(n_models, n_samples)) + d * keep)
    return scores, keep


def test_offline_lira_tpr_matches_theory_and_naive_is_miscalibrated():
    rng = np.random.default_rng(10)
    d, n_models, n_samples = 1.5, 160, 150
    scores, keep = _per_sample_world(rng, n_models, n_samples, d)
    z = np.stack([lira_offline(scores, keep, m) for m in range(n_models)])
    n_ref = out_reference_counts(keep)
    assert n_ref.min() >= 50  # normal threshold regime (>= 30)
    calib = pooled_calibrated(z, keep, (0.05, 0.01), n_ref)
    for alpha in (0.05, 0.01):
        theory = 1 - stats.norm.cdf(stats.norm.ppf(1 - alpha) - d)  # 0.442 at 5%, 0.183 at 1%
        got = calib["tpr_at_fpr"][f"{alpha:g}"]
        n_in = keep.sum()
        se = np.sqrt(theory * (1 - theory) / n_in)
        assert abs(got["tpr"] - theory) < 4 * se + 0.01  # sampling error + small estimation error of mu, sd
        # the out-mean and sd estimated from ~80 references inflate the FPR a little (t_79 tails)
        se_fpr = np.sqrt(alpha * (1 - alpha) / (~keep).sum())
        assert got["realised_fpr"] == pytest.approx(alpha, abs=4 * se_fpr + 0.004)
    # per-sample FPRs under calibration stay near alpha ...
    cal_fpr = per_sample_fpr(z, keep, calibrated_threshold(0.05, n_ref))
    assert np.quantile(cal_fpr, 0.9) - np.quantile(cal_fpr, 0.1) < 0.15
    # ... while one global threshold on the raw statistic gives samples wildly different FPRs
    naive = pooled_naive(scores, keep, (0.05,))
    spread = naive["tpr_at_fpr"]["0.05"]["per_sample_fpr"]
    assert spread["p10"] == 0.0 and spread["p90"] > 0.15  # reported by pooled_naive itself
    naive_fpr = per_sample_fpr(scores, keep, naive["tpr_at_fpr"]["0.05"]["threshold"])
    assert (naive_fpr == 0).mean() > 0.4  # most samples never flagged when out ...
    assert (naive_fpr > 4 * 0.05).mean() > 0.05  # ... others flagged > 4x as often as the nominal 5%
    assert naive_fpr.std() > 3 * cal_fpr.std()  # calibrated spread is binomial noise only
    # and its pooled TPR is not the per-sample attack's TPR
    assert abs(naive["tpr_at_fpr"]["0.05"]["tpr"] - 0.442) > 0.1


def test_finite_population_correction_recovers_the_true_spread():
    # Reference models trained on overlapping subsets (size n, without replacement) of a finite pool of
    # N+ values; a model's statistic is the mean of its training set's values. Independent training sets
    # from the population (values ~ N(0, 1)) would give sd 1 / sqrt(n). Each column is one pool.
    rng = np.random.default_rng(11)
    n_pools, n_models = 300, 41
    for n, n_pool in ((100, 200), (160, 200)):
        true_sd = 1 / np.sqrt(n)
        pools = rng.normal(size=(n_pools, n_pool))
        scores = np.empty((n_models, n_pools))
        for m in range(n_models):
            pick = np.argsort(rng.random((n_pools, n_pool)), axis=1)[:, :n]
            scores[m] = np.take_along_axis(pools, pick, axis=1).mean(1)
        f = fpc(n, n_pool)  # 0.5 and 0.2
        ratio = scores[1:].std(0, ddof=1) / true_sd
        # sqrt(N+ / (N+ - 1)) ~ 1.0025 separates the exact finite-population factor from sqrt(FPC)
        assert np.median(ratio) == pytest.approx(np.sqrt(f), rel=0.05)
        assert np.median(ratio / np.sqrt(f)) == pytest.approx(1.0, abs=0.05)
        # lira_offline divides the variance by fpc: its z shrinks by exactly sqrt(fpc) ...
        keep = np.zeros(scores.shape, bool)
        raw, corrected = lira_offline(scores, keep, 0), lira_offline(scores, keep, 0, f)
        assert corrected == pytest.approx(raw * np.sqrt(f))
        # ... and a target drawn from the SAME pool is already N(0, 1) without it (the pool is shared), so
        # within one pool the correction is conservative: its z has sd sqrt(fpc).
        assert raw.std() == pytest.approx(1.0, rel=0.12)
        assert corrected.std() == pytest.approx(np.sqrt(f), rel=0.12)


def test_statistic_choice_logit_is_gaussian_where_neg_loss_is_not():
    # Memorised members: their loss across models is multiplicative around a small value (lognormal),
    # bounded by 0. -L is skewed; logit(exp(-L)) ~ -log L is Gaussian. For L >> 1 the two coincide.
    rng = np.random.default_rng(12)
    loss = np.exp(rng.normal(np.log(0.05), 0.6, size=(40, 300)))
    keep = np.zeros(loss.shape, bool)
    neg_loss = normality_check(-loss, keep)
    logit = normality_check(confidence_logit(loss), keep)
    assert neg_loss["share_rejected"] > 0.4
    assert logit["share_rejected"] < 0.12
    assert logit["n_samples_tested"] == 300


# ---------------------------------------------------------------------------------------------- orchestration


def _table(rng, n_runs=6, n_samples=40, n_tokens=8, shifts=None, with_vocab=True, with_zlib=True):
    """A small loss table: base model plus fine-tuned runs, two checkpoints each; per quantizer a member
    shift. Checkpoint 1 REVERSES the membership signal so that using a non-final checkpoint shows."""
    shifts = shifts or {"fp": 0.8, "q4": 0.4}
    difficulty = rng.uniform(1.0, 3.0, n_samples)
    keep = rng.random((n_runs, n_samples)) < 0.5
    rows = []
    for q, shift in shifts.items():
        for run in [-1, *range(n_runs)]:
            for ckpt in [0] if run < 0 else [1, 2]:
                for j in range(n_samples):
                    member = bool(run >= 0 and keep[run, j])
                    sign = 1.0 if ckpt == 2 else -1.0
                    tl = np.abs(rng.normal(difficulty[j] - sign * shift * member, 0.4, n_tokens))
                    row = dict(
                        run=run,
                        checkpoint=ckpt,
                        quantizer=q,
                        sample_id=f"s{j:03d}",
                        split="pool",
                        member=member,
                        loss=float(tl.mean()),
                        n_tokens=n_tokens,
                        token_losses=tl,
                    )
                    if with_vocab:
                        row.update(token_vocab_mean=np.full(n_tokens, -2.0), token_vocab_std=np.full(n_tokens, 1.5))
                    if with_zlib:
                        row["zlib_bytes"] = 30 + j
                    rows.append(row)
    return validate_loss_table(pd.DataFrame(rows))


def test_run_attacks_on_a_small_table():
    rng = np.random.default_rng(20)
    df = _table(rng)
    with pytest.warns(UserWarning, match="token_vocab_mean is -2 at every one"):  # the table's made-up means
        res = run_attacks(df, AttackRunSettings(attacks=LEGACY_ATTACK_NAMES, n_boot=20, seed=1))
    assert res["reference_quantizer"] == "fp"
    assert res["attack_definitions"]["min_k"] == "2:k=0.2,floor(k*T)>=1,mean_logp_lowest"
    fp = res["quantizers"]["fp"]
    assert set(fp["final_checkpoints"].values()) == {2}
    assert fp["fpc"] == pytest.approx(1 - np.mean([fp["n_train"]]) / 40)
    assert fp["skipped"] == {}
    assert set(fp["attacks"]) == {
        "loss",
        "min_k",
        "min_k_plus_plus",
        "zlib",
        "ref",
        "loss+zlib",
        "loss+ref",
        "loss+zlib+ref",
        "lira_offline",
        "lira_online",
    }
    # LOSS pooled naive AUROC equals sklearn on the final-checkpoint rows (checkpoint 1 would give < 0.5)
    final = df[(df.quantizer == "fp") & (df.run >= 0) & (df.checkpoint == 2)]
    loss_entry = fp["attacks"]["loss"]
    assert loss_entry["pooled_naive"]["auroc"] == pytest.approx(roc_auc_score(final.member, -final.loss))
    assert loss_entry["pooled_naive"]["auroc"] > 0.6
    # every evaluation side by side, with CIs, reliability flags and the definition
    for key in ("pooled_naive", "pooled_calibrated", "per_sample"):
        assert "ci" in loss_entry[key]
    assert loss_entry["pooled_naive"]["tpr_at_fpr"]["0.001"]["reliable"] is False
    assert loss_entry["definition"] == res["attack_definitions"]["loss"]
    # LiRA beats plain LOSS here: per-sample difficulty is large relative to the member shift
    assert fp["attacks"]["lira_offline"]["headline"]["auroc"] > loss_entry["pooled_naive"]["auroc"]
    # the reference column compares with itself as 0
    assert fp["attacks"]["loss"]["vs_reference"]["auroc"] == 0.0
    assert res["quantizers"]["q4"]["attacks"]["loss"]["vs_reference"]["auroc"] < 0
    json.dumps(res)  # JSON-ready (NaN allowed)


def test_run_attacks_skips_missing_inputs_and_correlates_with_r_q(tmp_path):
    rng = np.random.default_rng(21)
    df = _table(rng, shifts={"a": 0.1, "b": 0.6, "c": 1.5}, with_vocab=False, with_zlib=False)
    r_q = {"a": 3.0, "b": 2.0, "c": 1.0}  # higher r_Q = more secure: the least shifted quantizer
    res = run_attacks(
        df,
        AttackRunSettings(attacks=("loss", "zlib", "min_k_plus_plus", "lira_offline"), n_boot=0, fpc=None),
        r_q=r_q,
        quantizers=["a", "b", "c"],
    )
    a = res["quantizers"]["a"]
    assert "token_vocab_mean" in a["skipped"]["min_k_plus_plus"] and "zlib_bytes" in a["skipped"]["zlib"]
    assert a["fpc"] is None and res["reference_quantizer"] is None
    rho = res["spearman_vs_r_q"]["attacks"]["loss"]["auroc"]
    assert rho["rho"] == pytest.approx(-1.0) and rho["n_quantizers"] == 3


def test_two_runs_skip_lira_with_a_reason_and_keep_the_other_attacks():
    """With two runs each sample has at most one out-reference: LiRA cannot standardise anything. It is
    skipped with the reason and the fix; the attacks that need no reference models are still scored."""
    rng = np.random.default_rng(22)
    df = _table(rng, n_runs=2)
    res = run_attacks(df, AttackRunSettings(n_boot=0, seed=1))
    fp = res["quantizers"]["fp"]
    assert "train more runs" in fp["skipped"]["lira_offline"]
    assert "too few reference models" in fp["skipped"]["lira_online"]
    assert "lira_offline" not in fp["attacks"] and "lira_online" not in fp["attacks"]
    assert fp["attacks"]["loss"]["pooled_naive"]["auroc"] > 0.5
    json.dumps(res)


def test_attack_command_writes_json_and_plots(tmp_path):
    rng = np.random.default_rng(22)
    table = write_loss_table(_table(rng, n_runs=5, n_samples=30), tmp_path / "scores.parquet")
    out = tmp_path / "attack.json"
    res = attack_command(table, out, AttackRunSettings(n_boot=10, attacks=("loss", "lira_offline")))
    saved = json.loads(out.read_text())
    assert saved["attack_definitions"] == res["attack_definitions"]
    assert len(saved["plots"]) == 2
    for p in saved["plots"]:
        with open(p, "rb") as fh:
            assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_leave_one_out_never_uses_the_target_as_reference():
    rng = np.random.default_rng(23)
    scores = rng.normal(size=(5, 20))
    keep = rng.random((5, 20)) < 0.5
    scores2 = scores.copy()
    scores2[2] += 100.0  # moving the target's own score must not move the reference distribution
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiraWarning)
        z, z2 = lira_offline(scores, keep, 2), lira_offline(scores2, keep, 2)
    ok = np.isfinite(z)
    refs, _ = balanced_references(keep, 2)
    sd = np.array([scores[refs[:, j], j].std(ddof=1) if refs[:, j].sum() >= 2 else np.nan for j in range(20)])
    assert ok.sum() >= 10
    assert z2[ok] == pytest.approx(z[ok] + 100.0 / sd[ok])
