"""Tests of llmaudit.validate.candidate_validation: the synthetic protocol (quick mode), a hand-made store, the pass rule."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from llmaudit.analyze.candidates import CANDIDATES, CONTROL_FAMILIES, REASON_PARAMETERS
from llmaudit.common.io import atomic_write_json, read_json
from llmaudit.store.losstable import write_loss_table
from llmaudit.validate import candidate_validation as vi
from llmaudit.validate import candidates_synthetic as vis
from llmaudit.validate.synthetic.classifier import quantize_batched
from llmaudit.validate.synthetic.config import load_config
from llmaudit.validate.synthetic.protocol import run_dataset

# ---- synthetic protocol -----------------------------------------------------------------------------------


# quick mode's shape (2 data sets x 40 runs) on smaller classifiers, so the test takes seconds, not minutes
SMALL = ("dim=16", "n_train=24", "n_val=60", "n_boot=20", "disc_hidden=8")


def test_quick_mode_end_to_end_and_cache(tmp_path):
    res = vi.validate_indicators_command(tmp_path, quick=True, overrides=SMALL, stores=[], log=lambda s: None)
    syn = res["synthetic"]
    assert syn["quick"] and syn["datasets"] == ["k6-s1.5", "k6-s3"]
    assert syn["config"]["n_runs"] == 40 and syn["k_runs"] == [5, 10, 15, 30]
    assert set(syn["candidates"]) == set(CANDIDATES)
    for name, c in syn["candidates"].items():
        assert c["version"] == CANDIDATES[name].version
        assert len(c["per_dataset"]) == 2
        assert list(c["stability"]) == ["5", "10", "15", "30"]
        assert -1 <= c["mean_spearman"] <= 1 and c["boot_sd"] >= 0
        assert 0 <= c["extra_dpi_pairs"]["share"] <= 1 and c["extra_pooled_spearman"]["n_cells"] == 16
    # -r_Q is r_Q's ranking reversed, per data set and in the pooled cells
    pub, neg = syn["candidates"]["rq_published"], syn["candidates"]["rq_negated"]
    assert neg["mean_spearman"] == pytest.approx(-pub["mean_spearman"])
    # quick mode never counts; no store: every candidate is "not validated"
    # (controls are never eligible: "control", with what the rule alone would say)
    for name, s in res["status"].items():
        if CANDIDATES[name].family in CONTROL_FAMILIES:
            assert s["status"] == "control" and s["rule_outcome"] == "not validated", name
        else:
            assert s["status"] == "not validated", name
    saved = read_json(tmp_path / "indicators.json")
    assert saved["status"]["rq_published"]["criteria"]["synthetic"]["status"] == "not measured"
    md = (tmp_path / "indicators.md").read_text()
    assert "QUICK mode" in md and "| rq_published | trajectory-only | rq_published/1 |" in md
    assert {p.name for p in (tmp_path / "cache").iterdir()} == {"k6-s1.5.npz", "k6-s3.npz"}
    again = vi.synthetic_validation(
        load_config(None, [*vi.QUICK_OVERRIDES, *SMALL]), cache_dir=tmp_path / "cache", quick=True, log=lambda s: None
    )
    assert all(again["cached"].values())
    assert again["candidates"]["ks_loss"]["per_dataset"] == syn["candidates"]["ks_loss"]["per_dataset"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the protocol's bootstrap on 10 tiny runs
def test_same_mis_and_r_q_as_the_synthetic_protocol():
    """The candidates' synthetic run reuses the protocol: same MIS (same seeds) and the published r_Q."""
    cfg = load_config(
        None,
        [
            "n_runs=10",
            "n_train=16",
            "dim=8",
            "epochs=3",
            "converged_from_epoch=1",
            "n_val=30",
            "disc_hidden=8",
            "disc_epochs=1",
            "n_boot=10",
            "stability_k_runs=[5]",
            "stability_mis_resamples=0",
            "variants=[]",
            "quantizers=[sign, ternary-50, uniform-2, uniform-4]",
        ],
    )
    arrays = vi.synthetic_dataset_arrays(cfg, 0, 4, 1.0, log=lambda s: None)
    ref = run_dataset(cfg, 0, 4, 1.0, log=lambda s: None)
    names = list(cfg.quantizers)
    np.testing.assert_allclose(arrays["mis"], [ref["table"][q]["mis"] for q in names], rtol=0, atol=1e-12)
    i = list(CANDIDATES).index("rq_published")
    for qi, q in enumerate(names):
        np.testing.assert_allclose(arrays["values"][i, qi], ref["r_q_per_run"]["published"][q], rtol=1e-9)
    assert arrays["values"].shape == (len(CANDIDATES), 4, 10)


def test_dpi_chain_quantizers_are_nested():
    """sign <= uniform-2 <= ... <= uniform-5: each coarser output is a function of each finer one (the
    premise of the DPI-pair check)."""
    g = torch.Generator().manual_seed(0)
    for t in (torch.randn(20, 2, 16, generator=g), torch.randn(20, 2, generator=g) * 0.3):
        q = {n: quantize_batched(n, t) for n in vi.DPI_CHAIN}
        for i, coarse in enumerate(vi.DPI_CHAIN):
            for fine in vi.DPI_CHAIN[i + 1 :]:
                for r in range(t.shape[0]):
                    f, c = q[fine][r].flatten(), q[coarse][r].flatten()
                    for v in f.unique():
                        assert c[f == v].unique().numel() == 1, (coarse, fine)


def test_dpi_pairs_share():
    qs = ["sign", "ternary-50", "uniform-2", "uniform-3", "uniform-4", "uniform-5"]
    decreasing = np.array([5.0, 0.0, 4.0, 3.0, 2.0, 1.0])
    out = vis._dpi_pairs([decreasing], qs)
    assert out == {"share": 1.0, "n_pairs": 10, "n_skipped": 0, "chain": list(vi.DPI_CHAIN)}
    assert vis._dpi_pairs([-decreasing], qs)["share"] == 0.0
    assert vis._dpi_pairs([np.ones(6)], qs)["share"] == 0.5  # ties count 1/2
    with_nan = decreasing.copy()
    with_nan[0] = math.nan
    assert vis._dpi_pairs([with_nan], qs)["n_skipped"] == 4


# ---- a hand-made store -----------------------------------------------------------------------------------

QUANTIZERS = ["fp32", "q8", "q4", "q3", "q2"]


def _unit(run, step, q, j, final):
    """Losses of one scoring unit. Quantizer j widens the member/non-member gap (j = 0 the narrowest)."""
    rows = []
    for i in range(3):
        loss = 2.0 + 0.1 * i + 0.05 * (2 - step) * (i + 1) + 0.01 * j
        rows.append(dict(sample_id=f"v{i}", split="val", member=False, loss=loss))
    if final:
        members = {0: (0, 1), 1: (2, 3)}[run]
        for i in range(4):
            m = i in members
            loss = 2.0 - 0.2 * (j + 1) + 0.1 * i if m else 2.1 + 0.1 * i
            rows.append(dict(sample_id=f"p{i}", split="pool", member=m, loss=loss))
    df = pd.DataFrame(rows)
    df["run"], df["checkpoint"], df["quantizer"] = run, step, q
    df["n_tokens"] = 1
    df["token_losses"] = [[x] for x in df["loss"]]
    return df


def _result(aurocs):
    return {
        "quantizers": QUANTIZERS,
        "reference_quantizer": "fp32",
        "attacks": {
            "quantizers": {
                q: {"attacks": {a: {"headline": {"auroc": v[j]}} for a, v in aurocs.items()}}
                for j, q in enumerate(QUANTIZERS)
            }
        },
    }


@pytest.fixture
def store_dir(tmp_path):
    root = tmp_path / "store"
    for run in (0, 1):
        for step in (1, 2):
            for j, q in enumerate(QUANTIZERS):
                write_loss_table(
                    _unit(run, step, q, j, final=step == 2),
                    root / "scores" / f"run-{run:03d}" / f"step-{step:06d}" / f"{q}.parquet",
                )
    rising = [0.50, 0.55, 0.60, 0.65, 0.70]  # attacks get stronger with the gap
    atomic_write_json(
        root / "results" / "result.json",
        _result({"ref": rising, "lira_offline": rising, "loss": rising, "min_k": [0.5, 0.5, 0.6, 0.5, 0.5]}),
    )
    return root


def test_store_validation_on_a_hand_made_store(store_dir):
    res = vi.store_validation(store_dir, n_boot=50)
    assert res["reported"] and res["source"] == str(store_dir)
    assert res["quantizers"] == QUANTIZERS and res["runs"] == [0, 1] and res["reference_quantizer"] == "fp32"
    assert res["attacks"] == ["ref", "lira_offline", "loss", "min_k"]
    assert res["ground_truth_attacks"] == ["ref", "lira_offline"]
    gap = res["candidates"]["gap_std_final"]
    # a wider gap is less secure: the candidate falls while every attack's AUROC rises -> rho = -1
    means = [gap["means"][q] for q in QUANTIZERS]
    assert all(a > b for a, b in zip(means, means[1:]))
    for a in ("ref", "lira_offline", "loss"):
        c = gap["spearman_vs_auroc"][a]
        assert c["rho"] == pytest.approx(-1.0) and c["n_quantizers"] == 5
        assert c["significant_negative"] and not c["significant_positive"]
    assert gap["spearman_vs_auroc"]["min_k"]["rho"] is not None
    # what a store cannot give: training losses along the trajectory, parameters
    traj = res["candidates"]["gap_std_traj"]
    assert not traj["computable"] and "every checkpoint" in traj["reason"]
    assert traj["spearman_vs_auroc"]["ref"]["rho"] is None
    assert res["candidates"]["qflip_late"]["reason"] == REASON_PARAMETERS
    assert res["candidates"]["rq_published"]["computable"]  # the held-out trajectory is there
    # the damage control: mean held-out loss at the final checkpoint, rising with j by 0.01 per quantizer
    dmg = res["candidates"]["heldout_loss_control"]["means"]
    assert [dmg[q] for q in QUANTIZERS] == pytest.approx([2.1 + 0.01 * j for j in range(5)])
    # gap and damage rise together here: once damage is partialled out, nothing is left to correlate
    part = gap["partial_vs_auroc_given_damage"]
    assert set(part) == {"ref", "lira_offline"} and part["ref"]["rho"] is None


def test_store_validation_from_a_table_and_without_result(store_dir):
    from llmaudit.store.losstable import read_loss_table

    table = read_loss_table(store_dir / "scores")
    res = vi.store_validation(table, store_dir / "results" / "result.json", n_boot=50)
    assert res["candidates"]["gap_std_final"]["spearman_vs_auroc"]["ref"]["rho"] == pytest.approx(-1.0)
    no_result = vi.store_validation(table, n_boot=50)
    assert not no_result["reported"] and "attacks are unknown" in no_result["reason"]
    assert no_result["attacks"] == [] and no_result["candidates"]["gap_std_final"]["computable"]
    (store_dir / "results" / "result.json").unlink()
    unreported = vi.store_validation(store_dir, n_boot=50)
    assert not unreported["reported"] and "does not exist" in unreported["reason"]


def test_validation_status_rule():
    synth = {
        "quick": False,
        "candidates": {
            "gap_std_final": {"mean_spearman": 0.93},
            "rq_published": {"mean_spearman": -0.80},
            "heldout_loss_control": {"mean_spearman": 0.95},
        },
    }

    def store(rho, p, attack="ref", computable=True):
        return {
            "source": "s",
            "reported": True,
            "candidates": {
                n: {"computable": computable, "spearman_vs_auroc": {attack: {"rho": rho, "p_value": p}}}
                for n in ("gap_std_final", "rq_published", "heldout_loss_control")
            },
        }

    def status(name, stores, syn=synth):
        return vi.validation_status(name, {"synthetic": syn, "stores": stores})["status"]

    assert status("gap_std_final", [store(-0.9, 0.001)]) == "passed"
    assert status("gap_std_final", [store(-0.9, 0.001, attack="lira_offline")]) == "passed"
    assert status("gap_std_final", [store(-0.9, 0.001, attack="loss")]) == "not validated"  # not ground truth
    assert status("gap_std_final", [store(-0.4, 0.3)]) == "failed"  # measured, not significant
    assert status("gap_std_final", [store(-0.9, 0.001), store(0.9, 0.001)]) == "failed"  # one significantly positive
    assert status("gap_std_final", []) == "not validated"
    assert status("gap_std_final", [store(None, None)]) == "not validated"
    assert status("rq_published", [store(-0.9, 0.001)]) == "failed"  # synthetic < 0.86
    # a control meets the rule and still is never eligible
    ctrl = vi.validation_status("heldout_loss_control", {"synthetic": synth, "stores": [store(-0.9, 0.001)]})
    assert ctrl["status"] == "control" and ctrl["rule_outcome"] == "passed"
    assert status("gap_std_final", [store(-0.9, 0.001)], syn={**synth, "quick": True}) == "not validated"
    full = vi.validation_status("gap_std_final", {"synthetic": synth, "stores": [store(-0.9, 0.001)]})
    assert full["criteria"]["synthetic"] == {
        "rule": "synthetic mean Spearman vs MIS >= 0.86",
        "status": "passed",
        "value": 0.93,
    }
    assert full["criteria"]["real"]["evidence"] == [{"store": "s", "attack": "ref", "rho": -0.9, "p_value": 0.001}]


def test_command_with_a_store_only(store_dir, tmp_path):
    out = tmp_path / "out"
    res = vi.validate_indicators_command(out, synthetic=False, stores=[store_dir], log=lambda s: None)
    assert res["synthetic"] is None and len(res["stores"]) == 1
    # the real criterion passes, the synthetic one is not measured: not validated
    assert res["status"]["gap_std_final"]["status"] == "not validated"
    assert res["status"]["gap_std_final"]["criteria"]["real"]["status"] == "passed"
    md = (out / "indicators.md").read_text()
    assert "store 1: rho (p) vs ref AUROC" in md and "vs loss AUROC (not ground truth)" in md
    assert "| gap_std_traj | member vs held-out | gap_std_traj/1 | not computable |" in md
    assert read_json(out / "indicators.json")["stores"][0]["source"] == str(store_dir)


def test_default_stores_are_the_real_model_recipes_stores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert vi.default_stores() == []
    for recipe in vi.REAL_MODEL_RECIPES:
        (tmp_path / "llmaudit-out" / recipe / "scores").mkdir(parents=True)
    assert vi.default_stores() == [tmp_path / "llmaudit-out" / r for r in vi.REAL_MODEL_RECIPES]


def test_the_shipped_registry_follows_the_pass_rule_from_its_own_numbers():
    """Every status in llmaudit/analyze/indicator_validation.json (what reports print) is what the pass rule
    gives on the numbers recorded beside it, for the current candidate versions."""
    from llmaudit.analyze.candidates import validation_registry

    reg = validation_registry()
    assert set(reg["candidates"]) == set(CANDIDATES)
    for name, entry in reg["candidates"].items():
        assert entry["version"] == CANDIDATES[name].version, name
        syn = entry["synthetic"]
        results = {
            "synthetic": None
            if syn is None
            else {"quick": syn["quick"], "candidates": {name: {"mean_spearman": syn["mean_spearman"]}}},
            "stores": [
                {
                    "source": e["store"],
                    "reported": True,
                    "candidates": {
                        name: {"spearman_vs_auroc": {e["attack"]: {"rho": e["rho"], "p_value": e["p_value"]}}}
                    },
                }
                for e in entry["real"]["evidence"]
            ],
        }
        assert vi.validation_status(name, results)["status"] == entry["status"], name
    # only a passed candidate may drive a checklist criterion; a control never passes
    for name, entry in reg["candidates"].items():
        if CANDIDATES[name].family in CONTROL_FAMILIES:
            assert entry["status"] == "control", name


def test_registry_from_results_records_status_numbers_and_the_damage_check(store_dir, tmp_path):
    res = vi.validate_indicators_command(tmp_path / "out", synthetic=False, stores=[store_dir], log=lambda s: None)
    reg = read_json(tmp_path / "out" / "registry.json")
    assert reg == json.loads(
        json.dumps(vi.registry_from_results(res, measured=reg["measured"], command=reg["command"]))
    )
    assert reg["command"] == f"llmaudit validate indicators --out {tmp_path / 'out'} --store {store_dir} --no-synthetic"
    gap = reg["candidates"]["gap_std_final"]
    assert gap["status"] == "not validated" and gap["synthetic"] is None
    assert gap["real"]["status"] == "passed" and len(gap["real"]["evidence"]) == 2
    # the hand-made store's gap rises with its damage: nothing is left once damage is partialled out
    assert gap["beyond_damage"]["answer"] == "not measured"
    assert reg["real_stores"] == [{"source": str(store_dir), "quantizers": QUANTIZERS, "runs": [0, 1]}]
    assert reg["candidates"]["heldout_loss_control"]["status"] == "control"
