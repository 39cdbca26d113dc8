import contextlib
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from llmaudit.config import load_recipe
from llmaudit.finetune.runs import checkpoint_steps, finetune
from llmaudit.store.run_store import RunStore, StoreError
from llmaudit.store.shards import parse_shard, shard_items
from tests.conftest import TINY_OVERRIDES


def _adapters(store, run):
    return {
        step: load_file(str(store.checkpoint_dir(run, step) / "adapter_model.safetensors"))
        for step in store.checkpoints(run)
    }


def test_checkpoint_schedule():
    assert checkpoint_steps(n_train=10, batch_size=4, epochs=2, per_epoch=1) == [3, 6]
    assert checkpoint_steps(n_train=16, batch_size=4, epochs=3, per_epoch=2) == [2, 4, 6, 8, 10, 12]
    assert checkpoint_steps(10_000, 16, 10, 2)[-1] == 6250 and len(checkpoint_steps(10_000, 16, 10, 2)) == 20


def test_sharding_is_a_partition():
    items = list(range(11))
    for n in (1, 2, 3, 5):
        parts = [shard_items(items, (i, n)) for i in range(n)]
        assert sorted(x for p in parts for x in p) == items
    assert parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "x", "1/0"):
        with pytest.raises(ValueError, match="I/N|0 <= I < N"):
            parse_shard(bad)


def test_membership_bookkeeping_and_resume(tiny_cfg):
    store = finetune(tiny_cfg, progress=False, echo=lambda *_: None)
    manifest = store.manifest()
    masks = store.membership()
    pool_ids = manifest["data"]["pool_ids"]
    val_ids = set(manifest["data"]["val_ids"])
    assert masks.shape == (3, 16) and (masks.sum(1) == 8).all()
    assert manifest["membership"]["fpc"] == pytest.approx(0.5)
    assert not set(pool_ids) & val_ids
    pool_records = {r["sample_id"]: r for r in store.read_records("pool")}
    assert list(pool_records) == pool_ids
    for run in range(3):
        done = json.loads(store.run_done_path(run).read_text())
        assert done["n_train"] == 8
        assert store.checkpoints(run) == [2, 4]
        trained = {pool_ids[i] for i in np.flatnonzero(masks[run])}
        assert not trained & val_ids  # no validation sample is ever trained on
        # optimizer state is kept only in the newest checkpoint
        assert not (store.checkpoint_dir(run, 2) / "trainer_state.safetensors").exists()
        assert (store.checkpoint_dir(run, 4) / "trainer_state.safetensors").exists()
    # the runs moved away from the base and differ from each other
    a0, a1 = _adapters(store, 0)[4], _adapters(store, 1)[4]
    key = next(k for k in a0 if "lora_B" in k)
    assert a0[key].abs().sum() > 0 and not torch.equal(a0[key], a1[key])

    # a second invocation does no repeated work
    stamps = {p: p.stat().st_mtime_ns for p in store.root.rglob("*") if p.is_file()}
    finetune(tiny_cfg, progress=False, echo=lambda *_: None)
    assert {p: p.stat().st_mtime_ns for p in store.root.rglob("*") if p.is_file()} == stamps

    # a run whose directory is lost is retrained to bitwise identical adapters (deterministic on CPU)
    before = _adapters(store, 1)
    shutil.rmtree(store.run_dir(1))
    finetune(tiny_cfg, progress=False, echo=lambda *_: None)
    after = _adapters(store, 1)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[s][k], after[s][k]) for s in before for k in before[s])


def test_crash_mid_run_resumes_from_the_last_checkpoint_exactly(tmp_path, monkeypatch):
    over = TINY_OVERRIDES + ["train.runs=2", "train.epochs=3"]
    full = finetune(
        load_recipe("demo-cpu", over + [f"output_dir={tmp_path / 'a'}"]), progress=False, echo=lambda *_: None
    )
    cfg_b = load_recipe("demo-cpu", over + [f"output_dir={tmp_path / 'b'}"])

    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def crashing_step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 4:  # run 0: checkpoint at step 2 is on disk, step 4 is not
            raise KeyboardInterrupt("simulated preemption")
        return real_step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", crashing_step)
    with pytest.raises(KeyboardInterrupt):
        finetune(cfg_b, progress=False, echo=lambda *_: None)
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)
    part = RunStore(cfg_b.resolved_output_dir())
    assert part.checkpoints(0) == [2] and not part.run_done(0)
    assert (part.checkpoint_dir(0, 2) / "trainer_state.safetensors").exists()

    finetune(cfg_b, progress=False, echo=lambda *_: None)
    for run in (0, 1):
        a, b = _adapters(full, run), _adapters(part, run)
        assert a.keys() == b.keys() == {2, 4, 6}
        assert all(torch.equal(a[s][k], b[s][k]) for s in a for k in a[s])


def test_directory_of_another_experiment_is_refused(tiny_cfg):
    finetune(tiny_cfg, progress=False, echo=lambda *_: None)
    other = tiny_cfg.model_copy(update={"train": tiny_cfg.train.model_copy(update={"epochs": 5})})
    with pytest.raises(StoreError, match="another experiment's manifest.*train.epochs"):
        finetune(other, progress=False, echo=lambda *_: None)
    with pytest.raises(StoreError, match="no manifest.json"):
        RunStore(tiny_cfg.resolved_output_dir() / "nope").manifest()


def test_score_shards_wait_for_every_run(tiny_cfg):
    from llmaudit.score.stage import score

    store = finetune(tiny_cfg, shard=(0, 2), progress=False, echo=lambda *_: None)
    assert [store.run_done(r) for r in range(3)] == [True, False, True]
    with pytest.raises(ValueError, match=r"runs \[1\] .* not finished"):
        score(tiny_cfg, store, shard=(0, 2), progress=False, echo=lambda *_: None)


def test_lora_fine_tuning_leaves_a_membership_signal(tiny_cfg):
    """Members' losses fall below non-members' after fine-tuning, in every run, by a clear margin: the
    signal every attack and indicator measures exists at all (and the base model shows none)."""
    from llmaudit.config import load_recipe
    from llmaudit.score.stage import score
    from llmaudit.store.losstable import read_loss_table

    cfg = load_recipe(
        "demo-cpu",
        [
            *TINY_OVERRIDES,
            "score.quantizers=[fp32]",
            "train.epochs=8",
            "train.lr=0.01",
            "lora.r=8",
            f"output_dir={tiny_cfg.output_dir}",
        ],
    )
    store = finetune(cfg, progress=False, echo=lambda *a: None)
    score(cfg, store, progress=False, echo=lambda *a: None)
    table = read_loss_table(store.scores_dir)
    pool = table[table["split"] == "pool"]
    gaps = []
    for run in range(cfg.train.runs):
        final = pool[(pool["run"] == run)]
        final = final[final["checkpoint"] == final["checkpoint"].max()]
        gaps.append(final.loc[~final["member"], "loss"].mean() - final.loc[final["member"], "loss"].mean())
    base = pool[pool["run"] == -1].set_index("sample_id")["loss"]
    masks = store.membership()
    ids = store.manifest()["data"]["pool_ids"]
    base_gaps = [
        base[[i for i, m in zip(ids, row) if not m]].mean() - base[[i for i, m in zip(ids, row) if m]].mean()
        for row in masks
    ]
    assert min(gaps) > 0.02, gaps
    assert max(abs(g) for g in base_gaps) < min(gaps) / 2, (base_gaps, gaps)


def test_runs_on_the_base_itself_equal_runs_on_copies(tmp_path, monkeypatch):
    """One process on a CPU wraps the base itself for each run and unwraps it after (no copy of the model per run):
    every checkpoint of every run is bit for bit the one a fresh copy of the base gives."""
    import llmaudit.finetune.runs as runs

    over = TINY_OVERRIDES + ["train.runs=3"]
    in_place = finetune(
        load_recipe("demo-cpu", over + [f"output_dir={tmp_path / 'a'}"]), progress=False, echo=lambda *_: None
    )
    real = runs.lora_on_base
    monkeypatch.setattr(runs, "lora_on_base", lambda *a, **k: real(*a, **{**k, "in_place": False}))
    copies = finetune(
        load_recipe("demo-cpu", over + [f"output_dir={tmp_path / 'b'}"]), progress=False, echo=lambda *_: None
    )
    for run in range(3):
        a, b = _adapters(in_place, run), _adapters(copies, run)
        assert a.keys() == b.keys() and a
        assert all(torch.equal(a[s][k], b[s][k]) for s in a for k in a[s])


def _state(model):
    return (
        repr(model),
        [(n, p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()],
        [m.training for m in model.modules()],
    )


def test_the_base_comes_back_as_it_was_after_a_run_and_after_a_failure(tiny_cfg):
    """Its layers, weights, gradient flags and train/eval modes, whether the run ends or raises."""
    from llmaudit.finetune.runs import lora_on_base
    from tests.tiny_models import tiny_causal_lm

    base = tiny_causal_lm("llama", seed=0, vocab_size=64, hidden_size=16, intermediate_size=32)
    base.eval()
    base.model.layers[0].requires_grad_(False)  # flags that differ between parameters come back as they were
    before = _state(base)
    for fail in (False, True):
        expect = pytest.raises(RuntimeError) if fail else contextlib.nullcontext()
        with expect, lora_on_base(base, tiny_cfg, 0, torch.device("cpu"), in_place=True) as model:
            assert model is not base and "lora" in repr(model).lower()
            model.train()
            assert not any(p.requires_grad for n, p in model.named_parameters() if "lora" not in n)
            loss = model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss
            loss.backward()
            if fail:
                raise RuntimeError("a run that fails")
        after = _state(base)
        assert after[0] == before[0] and after[2] == before[2]
        assert [(n, g) for n, _, g in after[1]] == [(n, g) for n, _, g in before[1]]
        assert all(torch.equal(a, b) for (_, a, _), (_, b, _) in zip(after[1], before[1], strict=True))
