"""A scoring process merges each checkpoint's adapter into a base of its own and keeps no second base: the base is
taken (loaded again from its files when the previous checkpoint consumed it); the models are bit for bit those of
a merge into a copy."""

from __future__ import annotations

import copy

import torch

from llmaudit.config import load_recipe
from llmaudit.models.loading import load_base_model, load_checkpoint_model
from llmaudit.score.unit_scoring import CheckpointWork, base_dtype, load_checkpoint, load_inputs
from llmaudit.store.losstable import REFERENCE_RUN
from llmaudit.store.run_store import RunStore
from llmaudit.store.units import Unit
from tests.conftest import TINY_OVERRIDES


def _same_parameters(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_each_checkpoint_is_merged_into_a_base_of_its_own(audited_tiny_store):
    cfg = load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={audited_tiny_store}"])
    store = RunStore(audited_tiny_store)
    device, dtype = torch.device("cpu"), torch.float32
    inputs = load_inputs(cfg, store, device, {}, dtype)
    fresh = load_base_model(cfg.model, device, dtype=base_dtype(device, dtype))
    assert inputs.base is not None and _same_parameters(inputs.base, fresh)
    checkpoints = [(run, step) for run in (0, 1) for step in store.checkpoints(run)]
    assert len(checkpoints) >= 3
    work = CheckpointWork()
    for run, step in checkpoints:
        held = inputs.base
        work = load_checkpoint(inputs, work, Unit(run, step, "bf16", final=False))
        assert inputs.base is None  # no base kept beside the checkpoint
        assert held is None or work.model is held  # the base held was merged into, not copied
        expected = load_checkpoint_model(copy.deepcopy(fresh), store.checkpoint_dir(run, step), device)
        assert _same_parameters(work.model, expected)
        assert not _same_parameters(work.model, fresh)  # the adapter was merged
    work = load_checkpoint(inputs, work, Unit(REFERENCE_RUN, 0, "bf16", final=False))
    assert _same_parameters(work.model, fresh)  # the base again, loaded from its files
