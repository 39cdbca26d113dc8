"""The utility columns of the score stage: per-token KL and top-token agreement against the unquantized
checkpoint, greedy answers, their settings in each unit file, and --refresh-utility for older stores."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from llmaudit.config import load_recipe
from llmaudit.finetune.runs import finetune
from llmaudit.score.stage import score
from llmaudit.score.utility import recorded_settings
from llmaudit.store.losstable import REFERENCE_RUN, read_loss_table
from llmaudit.store.run_store import RunStore
from llmaudit.store.worklog import read_work
from tests.conftest import TINY_OVERRIDES

QUIET = dict(progress=False, echo=lambda *a: None)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two fine-tuned runs of the tiny model (2 checkpoints each), copied fresh for every test."""
    root = tmp_path_factory.mktemp("utility") / "exp"
    cfg = load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={root}", "train.runs=2"])
    finetune(cfg, **QUIET)
    return root


def _store(trained, tmp_path, *overrides):
    root = tmp_path / "exp"
    shutil.copytree(trained, root)
    cfg = load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={root}", "train.runs=2", *overrides])
    return cfg, RunStore(root)


def _with_kl(rows):
    return rows[rows["token_kl"].map(lambda v: isinstance(v, np.ndarray))]


def test_final_units_carry_exact_divergence_and_answers(trained, tmp_path):
    cfg, store = _store(
        trained,
        tmp_path,
        "score.quantizers=[fp32,hqq-8,uniform-2]",
        "score.quantizer_options={hqq-8: {group_size: 32}}",
    )
    score(cfg, store, **QUIET)
    df = read_loss_table(store.scores_dir)
    last = {run: store.checkpoints(run)[-1] for run in (0, 1)}
    final_val = df[(df["run"] != REFERENCE_RUN) & (df["split"] == "val") & (df["checkpoint"] == df["run"].map(last))]
    assert len(_with_kl(df)) == len(final_val) == 3 * 2 * cfg.data.val_size  # exactly the final validation rows
    assert _with_kl(df)["split"].eq("val").all() and not _with_kl(df)["run"].eq(REFERENCE_RUN).any()
    kl = {q: np.concatenate(list(_with_kl(g)["token_kl"])) for q, g in df.groupby("quantizer")}
    top = {q: np.concatenate(list(_with_kl(g)["token_same_top"])) for q, g in df.groupby("quantizer")}
    assert (kl["fp32"] == 0).all() and top["fp32"].all()  # the unquantized model against itself
    assert 0 < kl["hqq-8"].mean() < 1e-3 and top["hqq-8"].mean() > 0.95
    assert kl["uniform-2"].mean() > 100 * kl["hqq-8"].mean()  # a quantizer that destroys the model diverges
    assert top["uniform-2"].mean() < top["hqq-8"].mean()
    answered = df[df["generated"].map(lambda v: isinstance(v, str))]
    assert len(answered) == 3 * 2 * 2  # two answers per final unit
    assert set(answered["sample_id"]) == set(answered[answered["quantizer"] == "fp32"]["sample_id"])
    path = store.unit_path(0, last[0], "hqq-8")
    settings = recorded_settings(path)
    assert settings["divergence"] is True and settings["generation"]["max_new_tokens"] == 8
    assert recorded_settings(store.unit_path(0, store.checkpoints(0)[0], "hqq-8")) is None  # not final: no columns
    work = {(w["run"], w["quantizer"]): w for w in read_work(store.worklog_path) if w.get("step") == last.get(w["run"])}
    assert work[(0, "fp32")]["reference_tokens"] == 0  # fp32 scored first: its own pass is the reference
    assert work[(0, "hqq-8")]["reference_tokens"] == 0 and work[(0, "hqq-8")]["divergence_positions"] > 0
    assert 0 < work[(0, "hqq-8")]["generated_tokens"] <= 2 * 8


def test_without_the_identity_quantizer_the_reference_pass_gives_the_same_kl(trained, tmp_path):
    """uniform-4 alone: one extra validation pass of the unquantized checkpoint per final checkpoint, and the
    same per-token KL as when fp32's own pass supplied the reference."""
    cfg, store = _store(
        trained, tmp_path, "score.quantizers=[uniform-4]", "score.generation_samples=0", "score.score_base=false"
    )
    score(cfg, store, **QUIET)
    cfg2, store2 = _store(trained, tmp_path / "b", "score.quantizers=[fp32,uniform-4]", "score.generation_samples=0")
    score(cfg2, store2, **QUIET)
    alone, paired = (_with_kl(read_loss_table(s.scores_dir)) for s in (store, store2))
    alone = alone.sort_values(["run", "sample_id"])
    paired = paired[paired["quantizer"] == "uniform-4"].sort_values(["run", "sample_id"])
    for a, b in zip(alone["token_kl"], paired["token_kl"]):
        assert np.abs(a - b).max() < 1e-6
    assert np.concatenate(list(alone["token_kl"])).mean() > 1e-3
    log = read_work(store.worklog_path)
    finals = [w for w in log if "reference_tokens" in w]
    val_tokens = next(w["tokens"] for w in log if w["run"] == 0 and "reference_tokens" not in w and w["run"] >= 0)
    assert len(finals) == 2 and all(w["reference_tokens"] == val_tokens for w in finals)  # one validation pass each
    assert "generated" not in alone.columns or alone["generated"].isna().all()


def test_refresh_utility_adds_the_columns_to_a_store_scored_without_them(trained, tmp_path):
    cfg, store = _store(trained, tmp_path, "score.divergence=false", "score.generation_samples=0")
    score(cfg, store, **QUIET)
    assert "token_kl" not in read_loss_table(store.scores_dir).columns
    cfg_new = load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={store.root}", "train.runs=2"])
    assert score(cfg_new, store, **QUIET)["scored"] == 0  # without the flag nothing finished is redone
    done = score(cfg_new, store, refresh_utility=True, **QUIET)
    assert done["scored"] == 2 * len(cfg.score.quantizers)  # every run's final units, never the base or earlier steps
    df = read_loss_table(store.scores_dir)
    assert len(_with_kl(df)) == 2 * len(cfg.score.quantizers) * cfg.data.val_size
    assert score(cfg_new, store, refresh_utility=True, **QUIET)["scored"] == 0  # now current: nothing to redo


def test_a_malformed_settings_record_is_ignored_never_trusted(tmp_path):
    """A unit file from elsewhere whose utility metadata is not what llmaudit writes reads as 'no settings'."""
    import pandas as pd

    from llmaudit.store.losstable import UTILITY_METADATA_KEY, write_loss_table

    row = dict(run=0, checkpoint=1, quantizer="fp32", sample_id="v", split="val", member=False, loss=1.0)
    frame = pd.DataFrame([row | {"n_tokens": 1, "token_losses": np.array([1.0])}])
    for raw in (b"not json", b'{"divergence": "yes"}', b'{"divergence": true, "generation": "x"}', b"[1]"):
        path = write_loss_table(frame, tmp_path / "u.parquet", metadata={UTILITY_METADATA_KEY: raw})
        assert recorded_settings(path) is None
    good = b'{"divergence": true, "generation": {"sample_ids": ["v"], "max_new_tokens": 3, "decoding": "greedy"}}'
    path = write_loss_table(frame, tmp_path / "u.parquet", metadata={UTILITY_METADATA_KEY: good})
    assert recorded_settings(path)["generation"]["max_new_tokens"] == 3
