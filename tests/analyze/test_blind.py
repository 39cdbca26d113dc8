"""The blind baseline: ~0.5 on llmaudit's random splits, far above it when the held-out texts differ."""

from __future__ import annotations

import json

import numpy as np

from llmaudit.analyze.blind import blind_baseline, blind_baseline_for_pool
from llmaudit.data.chem import generate_records
from llmaudit.data.pool import membership_masks
from llmaudit.data.records import record_text

TASKS = ["molecule_captioning", "molecule_generation"]


def test_random_split_of_llmaudit_records_sits_at_chance():
    records = generate_records(TASKS, 240, seed=0)
    masks = membership_masks(len(records), 2, 0.5, seed=0)
    result = blind_baseline_for_pool(records, masks, seed=0, n_boot=200)
    assert result["runs"] == 2 and len(result["per_run"]) == 2
    for run in result["per_run"]:
        assert run["ci_low"] <= 0.5 <= run["ci_high"], run
        assert not run["excludes_chance"]
        assert run["n_in"] == 120 and run["n_out"] == 120 and run["folds"] == 5
    assert abs(result["mean_auroc"] - 0.5) < 0.1
    assert result["warning"] is None and result["runs_excluding_chance"] == []
    assert "random" in result["note"]
    json.dumps(result)  # JSON-ready


def test_shifted_heldout_is_detected_without_any_model():
    # Held-out texts from another task: the classifier separates the files from the texts alone.
    train = generate_records(["molecule_captioning"], 60, seed=1)
    heldout = generate_records(["molecule_generation"], 60, seed=2)
    texts = [record_text(r) for r in train + heldout]
    result = blind_baseline(texts, [True] * 60 + [False] * 60, n_boot=100)
    assert result["auroc"] > 0.9 and result["ci_low"] > 0.5 and result["excludes_chance"]


def test_an_added_date_string_is_enough_to_separate_the_files():
    records = generate_records(TASKS, 120, seed=3)
    train = [record_text(r) for r in records[:60]]
    heldout = [f"{record_text(r)} (collected 2024-0{1 + i % 9}-1{i % 10})" for i, r in enumerate(records[60:])]
    pool = [{"input": t, "output": "x", "task": "t"} for t in train + heldout]
    result = blind_baseline_for_pool(pool, [[True] * 60 + [False] * 60], seed=0, n_boot=100)
    assert result["per_run"][0]["auroc"] > 0.9
    assert result["warning"] and "distribution shift" in result["warning"]
    assert result["note"] is None  # one run: no random-split note


def test_small_samples_use_fewer_folds_or_say_why():
    texts = [f"sample {i} " + "ab" * i for i in range(10)]
    few = blind_baseline(texts[:6], [True, True, True, True, False, False], n_boot=10)
    assert few["auroc"] is None and "too few" in few["reason"]
    some = blind_baseline(texts[:8], [True] * 4 + [False] * 4, n_boot=10)
    assert some["folds"] == 2 and some["auroc"] is not None
    lone = blind_baseline_for_pool([{"input": "a b c", "output": "d", "task": "t"}] * 3, np.ones((1, 3), bool))
    assert lone["mean_auroc"] is None and "too few" in lone["reason"]


def test_deterministic_for_a_seed():
    records = generate_records(TASKS, 80, seed=4)
    masks = membership_masks(len(records), 1, 0.5, seed=1)
    assert blind_baseline_for_pool(records, masks, seed=3, n_boot=50) == blind_baseline_for_pool(
        records, masks, seed=3, n_boot=50
    )
