"""EZ-MIA, WBC, RMIA and the quantization-matched reference: hand-computed examples of every edge case, and
a simulated table whose members' target-vs-base shifts are planted, where each must beat LOSS."""

import json
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmaudit.analyze.attacks.catalog.ez_mia_attacks import EZ_MIA_VARIANTS, PREDATES_TOP1
from llmaudit.analyze.attacks.catalog.wbc_attacks import WBC_VARIANTS
from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.ez_mia import EZ_EDGES, error_zone_masses, ez_mia_score
from llmaudit.analyze.attacks.matrices import base_quantizer
from llmaudit.analyze.attacks.registry import attack_definitions, registered_attacks, resolve_attacks
from llmaudit.analyze.attacks.rmia import (
    DEFAULT_A,
    offline_marginal,
    online_marginal,
    rmia_score,
    text_probability,
    tune_offline_a,
)
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.attacks.wbc import WBC_GRIDS, geometric_windows, wbc_score, window_vote
from llmaudit.cli import app
from llmaudit.config import ATTACK_NAMES, AttackConfig
from llmaudit.store.losstable import validate_loss_table

from .reference_impls import ez_mia_score_per_sample, wbc_score_per_sample

REFERENCE_ATTACKS = (*EZ_MIA_VARIANTS, *WBC_VARIANTS, "ref_qbase", "rmia", "rmia_online")

# ---------------------------------------------------------------------------------------------- EZ-MIA

TARGET = [1.0, 0.5, 2.0, 0.2]
BASE = [1.5, 0.4, 3.0, 0.2]  # delta = base - target = [0.5, -0.1, 1.0, 0.0]
TOP1 = [False, False, True, False]  # error zone: positions 0, 1, 3


def test_error_zone_masses_by_hand():
    delta = np.array(BASE) - np.array(TARGET)
    # zone deltas 0.5, -0.1, 0.0 (the correct position 2 with +1.0 is outside): P = 0.5, N = 0.1, |E| = 3
    assert error_zone_masses(delta, TOP1) == pytest.approx((0.5, 0.1, 3))
    # without the first scored position: zone deltas -0.1, 0.0
    assert error_zone_masses(delta, TOP1, skip_first=True) == pytest.approx((0.0, 0.1, 2))
    with pytest.raises(ValueError, match="3 top-1 flags"):
        error_zone_masses(delta, TOP1[:3])


def test_ez_mia_by_hand_with_every_edge_case():
    texts = [
        (TARGET, BASE, TOP1),  # ordinary: P / (P + N) = 0.5 / 0.6
        ([1.0, 1.0], [2.0, 1.5], [False, False]),  # N = 0, P = 1.5: all movement upward
        ([1.0, 1.0], [2.0, 1.5], [True, True]),  # no error position: P = N = 0
        ([1.0, 1.0], [0.5, 3.0], [False, True]),  # P = 0 < N = 0.5: the weakest signal
        ([1.0, 1.0], [1.5, 3.0], [False, True]),  # one error position, upward: N = 0, P = 0.5
    ]
    t, b, f = (list(x) for x in zip(*texts))
    top = ez_mia_score(t, b, f, edge="top")
    assert top == pytest.approx([0.5 / 0.6, 1 + 1.5 / 2.5, 1.0, 0.0, 1 + 0.5 / 1.5])
    bottom = ez_mia_score(t, b, f, edge="bottom")
    assert bottom == pytest.approx([0.5 / 0.6, 0.0, 0.0, 0.0, 0.0])
    first = ez_mia_score(t, b, f, skip_first=True)  # text 0 loses its only upward error position
    assert first[0] == 0.0 and first[1] == pytest.approx(1 + 0.5 / 1.5)
    with pytest.raises(ValueError, match="edge must be one of"):
        ez_mia_score(t, b, f, edge="middle")
    with pytest.raises(ValueError, match="text 0: 4 target token losses but 3 reference ones"):
        ez_mia_score([TARGET], [BASE[:3]], [TOP1])


def test_ez_mia_ranks_as_the_papers_ratio():
    """P / (P + N) is a monotone map of P / N: the same order over ordinary texts (N > 0)."""
    rng = np.random.default_rng(0)
    t = [rng.uniform(0, 3, 20) for _ in range(50)]
    b = [x + rng.normal(0, 0.5, 20) for x in t]
    f = [rng.random(20) < 0.3 for _ in range(50)]
    ratio = []
    for x, y, g in zip(t, b, f):
        p, n, _ = error_zone_masses(y - x, g)
        ratio.append(p / n)
    assert np.array_equal(np.argsort(ez_mia_score(t, b, f)), np.argsort(ratio))


@pytest.mark.parametrize("edge", EZ_EDGES)
@pytest.mark.parametrize("skip_first", [False, True])
def test_ez_mia_arrays_equal_the_per_sample_loop(edge, skip_first):
    """All texts at once against the per-text loop (`ez_mia_score_per_sample`, tests/analyze/reference_impls.py):
    ragged texts of 1 to 60 tokens, empty and all-wrong error zones, exact zeros, N = 0 and P = 0 texts; the same
    numbers bit for bit."""
    rng = np.random.default_rng(8)
    lengths = np.r_[1, 1, 2, rng.integers(1, 61, 300)]
    target = [rng.uniform(0, 3, n) for n in lengths]
    base = [t + np.round(rng.normal(0, 0.5, t.size), 1) * (rng.random(t.size) < 0.7) for t in target]
    top1 = [rng.random(n) < rng.choice([0.0, 0.3, 1.0]) for n in lengths]
    got = ez_mia_score(target, base, top1, edge=edge, skip_first=skip_first)
    want = ez_mia_score_per_sample(target, base, top1, edge=edge, skip_first=skip_first)
    assert np.array_equal(got, want)  # bit for bit: each zone summed as numpy sums it alone
    assert ez_mia_score([], [], [], edge=edge).shape == (0,)
    with pytest.raises(ValueError, match="text 1: 2 token shifts but 3 top-1 flags"):
        ez_mia_score([[1.0], [1.0, 2.0]], [[1.0], [1.0, 2.0]], [[True], [True, False, True]])
    with pytest.raises(ValueError, match="2 texts but 1 rows of top-1 flags"):
        ez_mia_score([[1.0], [1.0]], [[1.0], [1.0]], [[True]])


# ---------------------------------------------------------------------------------------------- WBC

W_TARGET = [2.0] * 5
W_BASE = [3.0, 0.0, 5.0, 1.0, 2.5]  # delta = [1, -2, 3, -1, 0.5]


def test_window_vote_by_hand():
    delta = np.array(W_BASE) - np.array(W_TARGET)
    assert window_vote(delta, 1) == pytest.approx(3 / 5)
    assert window_vote(delta, 2) == pytest.approx(2 / 4)  # sums -1, 1, 2, -0.5
    assert window_vote(delta, 3) == pytest.approx(2 / 3)  # sums 2, 0, 2.5: a zero sum is no vote
    assert window_vote(delta, 5) == 1.0  # sum 1.5
    assert window_vote(np.zeros(4), 2) == 0.0
    with pytest.raises(ValueError, match="does not fit"):
        window_vote(delta, 6)


def test_wbc_by_hand_with_windows_longer_than_the_text():
    # clamp (the authors' code): the size-6 window shrinks to the whole text (vote 1); skip (LeakPro): left out
    assert wbc_score([W_TARGET], [W_BASE], windows=(2, 3, 6), long="clamp") == pytest.approx([(0.5 + 2 / 3 + 1) / 3])
    assert wbc_score([W_TARGET], [W_BASE], windows=(2, 3, 6), long="skip") == pytest.approx([(0.5 + 2 / 3) / 2])
    # no size fits: both score one window of the text's own length
    for long in ("clamp", "skip"):
        assert wbc_score([W_TARGET], [W_BASE], windows=(6, 7), long=long) == pytest.approx([1.0])
    with pytest.raises(ValueError, match="long must be one of"):
        wbc_score([W_TARGET], [W_BASE], long="pad")


def _wbc_slow(target, base, windows, long):
    """WBC from its definition: every window summed directly, sizes longer than the text clamped or skipped."""
    delta = np.asarray(base) - np.asarray(target)
    T = delta.size
    sizes = [min(w, T) for w in windows] if long == "clamp" else ([w for w in windows if w <= T] or [T])
    return np.mean([np.mean([delta[i : i + w].sum() > 0 for i in range(T - w + 1)]) for w in sizes])


def test_wbc_equals_the_direct_window_loop():
    rng = np.random.default_rng(3)
    target = [rng.uniform(0, 3, rng.integers(1, 70)) for _ in range(60)]
    base = [t + rng.normal(0, 0.5, t.size) * (rng.random(t.size) < 0.7) for t in target]  # exact zeros too
    for grid in WBC_GRIDS.values():
        for long in ("clamp", "skip"):
            want = [_wbc_slow(t, b, grid, long) for t, b in zip(target, base)]
            assert wbc_score(target, base, windows=grid, long=long) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("long", ["clamp", "skip"])
@pytest.mark.parametrize("budget", [1, 97, 1 << 22])
def test_wbc_arrays_equal_the_per_sample_loop(long, budget):
    """Ragged texts of 1 to 90 tokens (windows longer than many of them, length 1 included), shifts with exact
    zeros and ties, duplicate and unsorted sizes; blocks of one text, of a few, and all at once. The reference is
    the per-text loop (`wbc_score_per_sample`, tests/analyze/reference_impls.py)."""
    rng = np.random.default_rng(7)
    lengths = np.r_[1, 1, 2, 40, 41, rng.integers(1, 91, 300)]
    target = [rng.uniform(0, 3, n) for n in lengths]
    base = [t + np.round(rng.normal(0, 0.5, t.size), 1) * (rng.random(t.size) < 0.7) for t in target]
    grids = [*WBC_GRIDS.values(), (40, 2, 2, 1, 95), (1,), (100,)]
    for grid in grids:
        got = wbc_score(target, base, windows=grid, long=long, budget=budget)
        want = wbc_score_per_sample(target, base, windows=grid, long=long)
        assert np.array_equal(got, want), grid  # bit for bit: the same sums, votes and means
    assert wbc_score([], [], long=long).shape == (0,)


def test_wbc_grids():
    assert geometric_windows(2, 40, 10) == WBC_GRIDS["paper"] == (2, 3, 4, 5, 8, 11, 15, 21, 29, 40)
    assert WBC_GRIDS["config"] == (2, 3, 4, 6, 9, 13, 18, 25, 32, 40)
    with pytest.raises(ValueError):
        geometric_windows(5, 2, 10)


# ---------------------------------------------------------------------------------------------- RMIA


def test_rmia_marginals_by_hand():
    p = np.array([[0.2, 0.5], [0.4, 0.9]])
    out = np.array([[True, False], [True, True]])
    # mean_out = [0.3, 0.9]; a = 0.5: 0.75 * mean_out + 0.25
    assert offline_marginal(p, out, 0.5) == pytest.approx([0.475, 0.925])
    assert offline_marginal(p, out, 1.0) == pytest.approx([0.3, 0.9])
    assert offline_marginal(p, out, 0.0) == pytest.approx([0.65, 0.95])  # (1 + mean_out) / 2
    assert np.isnan(offline_marginal(p, ~out, 0.5)).tolist() == [True, False]
    # online: text 0 has IN 0.2 and OUT 0.4 -> 0.3; text 1 has no IN reference -> NaN
    online = online_marginal(p, np.array([[True, False], [False, False]]))
    assert online[0] == pytest.approx(0.3) and np.isnan(online[1])
    with pytest.raises(ValueError, match="a must lie in"):
        offline_marginal(p, out, 1.5)


def test_rmia_score_by_hand():
    # LR_x = [2, 1]; LR_z = [1, 0.5, 2]. x0 beats z0 and z1 (not z2: a tie is not > 1); x1 beats z1 only
    scores = rmia_score([0.5, 0.25], [0.25, 0.25], [0.5, 0.125, 0.5], [0.5, 0.25, 0.25])  # exact in binary
    assert scores == pytest.approx([2 / 3, 1 / 3])
    assert np.isnan(rmia_score([0.6], [np.nan], [0.5], [0.5])).all()
    assert text_probability([0.0, np.log(2)]) == pytest.approx([1.0, 0.5])


def test_tune_offline_a_picks_the_first_best_coefficient():
    """The paired model's own probabilities separate its members, their ratio to the reference does not:
    a = 1 (marginal = mean_out) gives AUROC 0, a = 0 (marginal (1 + mean_out) / 2) is the first of AUROC 1."""
    keep = np.array([True, True, False, False])
    a, auc = tune_offline_a([0.9, 0.8, 0.3, 0.2], [[0.9, 0.9, 0.1, 0.1]], np.ones((1, 4), bool), keep, [0.5], [[0.5]])
    assert (a, auc) == (0.0, 1.0)
    a, auc = tune_offline_a(
        [0.9, 0.8, 0.3, 0.2], np.zeros((0, 4)), np.zeros((0, 4), bool), keep, [0.5], np.zeros((0, 1))
    )
    assert a == DEFAULT_A and np.isnan(auc)


# ------------------------------------------------------------------------------------- planted signal


def _rows(run, quantizer, split, ids, losses, member, top1=None):
    out = []
    for j, (sid, tl) in enumerate(zip(ids, losses)):
        row = dict(
            run=run,
            checkpoint=0 if run < 0 else 10,
            quantizer=quantizer,
            sample_id=sid,
            split=split,
            member=bool(member[j]),
            loss=float(tl.mean()),
            n_tokens=len(tl),
            token_losses=tl,
        )
        if top1 is not None:
            row["token_top1"] = top1[j]
        out.append(row)
    return out


def planted_table(seed=0, runs=6, n_pool=150, n_val=40, shift=0.6, quant_noise=0.8, with_top1=True):
    """Texts of very different difficulty (so LOSS is weak), members' token losses lowered by `shift` on half
    their tokens in each run that trained on them, per-run noise everywhere. Quantizer q4 adds the same
    per-token change (sd quant_noise) to the base and to every run: only a reference quantized the same way
    cancels it. top-1 is right where the target's token loss is below 0.25."""
    rng = np.random.default_rng(seed)
    n = n_pool + n_val
    ids = [f"p{j}" for j in range(n_pool)] + [f"v{j}" for j in range(n_val)]
    lengths = rng.integers(12, 60, n)
    difficulty = rng.lognormal(0.0, 0.8, n)
    base = [d * rng.gamma(2.0, 0.5, k) for d, k in zip(difficulty, lengths)]
    memorised = [rng.random(k) < 0.5 for k in lengths]
    q_change = [rng.normal(0, quant_noise, k) for k in lengths]
    keep = np.zeros((runs, n), bool)
    keep[:, :n_pool] = rng.random((runs, n_pool)) < 0.5
    rows = []
    for q in ("fp32", "q4"):
        change = [c if q == "q4" else np.zeros_like(c) for c in q_change]
        b = [np.maximum(x + c, 0) for x, c in zip(base, change)]
        rows += _rows(-1, q, "pool", ids[:n_pool], b[:n_pool], np.zeros(n_pool))
        for m in range(runs):
            tl = [
                np.maximum(x + c - 0.1 + rng.normal(0, 0.3, x.size) - shift * keep[m, j] * mem, 0)
                for j, (x, c, mem) in enumerate(zip(base, change, memorised))
            ]
            top1 = [t < 0.25 for t in tl] if with_top1 else None
            pool_top1 = top1[:n_pool] if top1 is not None else None
            rows += _rows(m, q, "pool", ids[:n_pool], tl[:n_pool], keep[m, :n_pool], pool_top1)
            rows += _rows(
                m, q, "val", ids[n_pool:], tl[n_pool:], np.zeros(n_val), None if top1 is None else top1[n_pool:]
            )
    return validate_loss_table(pd.DataFrame(rows))


@pytest.fixture(scope="module")
def planted():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_attacks(planted_table(), AttackRunSettings(n_boot=10, attacks=("loss", "ref") + REFERENCE_ATTACKS))


def _auroc(result, q, attack):
    return result["quantizers"][q]["attacks"][attack]["headline"]["auroc"]


@pytest.mark.parametrize("attack", ["ez_mia", "ez_mia_bottom", "wbc", "wbc_paper_grid", "rmia", "rmia_online"])
def test_each_new_attack_beats_loss_on_the_planted_signal(planted, attack):
    loss = _auroc(planted, "fp32", "loss")
    assert loss < 0.75  # difficulty hides the signal from LOSS
    assert _auroc(planted, "fp32", attack) > loss + 0.1, attack


def test_the_matched_reference_cancels_a_shared_quantization_change(planted):
    """Under q4 the quantizer's change is in target and matched base alike: the *_qbase variants beat the
    same attack against the full-precision base, and ref_qbase beats LOSS."""
    for attack in ("ez_mia", "wbc"):
        assert _auroc(planted, "q4", f"{attack}_qbase") > _auroc(planted, "q4", attack) + 0.05, attack
    assert _auroc(planted, "q4", "ref_qbase") > _auroc(planted, "q4", "loss") + 0.1
    block = planted["quantizers"]
    assert block["q4"]["base_model_quantizer"] == "fp32" and block["q4"]["matched_base"] is True
    assert "ez_mia_qbase" not in block["fp32"]["attacks"]  # the reference quantizer's match is the base itself
    assert "the reference quantizer's match is the base itself" in block["fp32"]["skipped"]["ez_mia_qbase"]
    assert len(block["fp32"]["rmia_offline_a"]) == 6


def test_a_table_without_top1_reports_every_other_attack():
    """A version-1 table (no token_top1): EZ-MIA is not measurable and says why; WBC, RMIA, ref run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = run_attacks(
            planted_table(runs=4, n_pool=60, with_top1=False),
            AttackRunSettings(n_boot=0, attacks=("loss", "ref") + REFERENCE_ATTACKS),
        )
    block = res["quantizers"]["fp32"]
    for name in EZ_MIA_VARIANTS:
        if name != "ez_mia_qbase":
            assert block["skipped"][name] == PREDATES_TOP1
    assert block["skipped"]["ez_mia"].startswith("EZ-MIA not measurable: table predates top-1")
    assert {"loss", "ref", "rmia", "rmia_online"} | set(WBC_VARIANTS) - {"wbc_qbase"} <= set(block["attacks"])
    assert set(res["quantizers"]["q4"]["attacks"]) >= {"wbc_qbase", "ref_qbase"}


def test_base_means_the_reference_unit():
    """With the base scored under several quantizers, "base" is the reference quantizer's unit."""
    df = planted_table(runs=2, n_pool=10, n_val=4)
    assert base_quantizer(df, "fp32") == "fp32"
    assert base_quantizer(df, "q4") == "q4"
    assert base_quantizer(df[df["quantizer"] != "fp32"], "fp32") == "q4"  # the only one
    assert base_quantizer(df[df["run"] >= 0], "fp32") is None


def test_every_attack_of_earlier_versions_means_every_attack():
    legacy = ["loss", "min_k", "min_k_plus_plus", "zlib", "ref", "loss+zlib", "loss+ref", "loss+zlib+ref"]
    legacy += ["lira_offline", "lira_online"]
    every = registered_attacks()
    context = {ATTACK_NAMES: every}
    assert AttackConfig.model_validate({"attacks": legacy}, context=context).attacks == ["all"]
    assert AttackConfig.model_validate({"attacks": legacy}).attacks == ["all"]  # a store read without the registry
    assert AttackConfig.model_validate({}, context=context).attacks == ["all"]
    assert AttackConfig.model_validate({"attacks": ["loss", "wbc"]}, context=context).attacks == ["loss", "wbc"]
    assert resolve_attacks(["all"]) == every
    definitions = attack_definitions()
    assert set(every) <= set(definitions)  # every attack records a versioned definition
    assert definitions["ez_mia"] == "1:error-zone,P/(P+N),edge=top,skip_first=False,reference=base"
    assert definitions["wbc_paper_grid"] == "1:window-sign-vote,grid=paper,long=clamp,reference=base"


def test_the_attack_command_on_a_version_1_table(tmp_path):
    """`llmaudit attack` on a table written before top-1 (no column, no version metadata) reports every other
    attack and prints why EZ-MIA is not measured."""
    table = planted_table(runs=4, n_pool=40, n_val=12, with_top1=False)
    path = tmp_path / "old.parquet"
    pq.write_table(pa.Table.from_pandas(table, preserve_index=False), path)
    out = tmp_path / "attacks.json"
    res = CliRunner().invoke(app, ["attack", str(path), "--out", str(out), "--n-boot", "5"])
    assert res.exit_code == 0, res.output
    assert "EZ-MIA not measurable: table predates top-1" in res.output
    assert "fp32: strongest attack by AUROC" in res.output
    written = json.loads(out.read_text())
    assert {"wbc", "rmia", "rmia_online", "loss"} <= set(written["quantizers"]["fp32"]["attacks"])
