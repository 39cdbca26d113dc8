"""A quantizer added in one module (tests/quantize/extension_quantizer.py), touching no other file: it is listed,
planned, quantizes a tiny model, is scored into a store and recorded there."""

import importlib
import sys

import pandas as pd
import pytest
import torch

import llmaudit.quantize as quantize
from llmaudit.config import load_recipe
from llmaudit.planning.plan import make_plan
from llmaudit.planning.throughput import count_params, model_config
from llmaudit.quantize import QUANTIZER_NAMES, get_quantizer, list_quantizers
from llmaudit.store.losstable import read_loss_table
from tests.conftest import TINY_OVERRIDES
from tests.tiny_models import tiny_causal_lm

MODULE = "tests.quantize.extension_quantizer"


@pytest.fixture
def extension(monkeypatch):
    """The extension module imported into a copy of the registry (the other tests see the shipped list)."""
    monkeypatch.setattr(quantize, "_REGISTRY", dict(quantize._REGISTRY))
    sys.modules.pop(MODULE, None)
    yield importlib.import_module(MODULE)
    sys.modules.pop(MODULE, None)


def test_the_new_quantizer_is_listed_and_quantizes_a_tiny_model(extension):
    assert "round-3" in QUANTIZER_NAMES
    (info,) = [i for i in list_quantizers() if i.name == "round-3"]
    assert (info.family, info.bits, info.available, info.reason) == ("round", 3.0, True, None)
    model = tiny_causal_lm("llama")
    before = model.model.layers[0].mlp.up_proj.weight.clone()
    out = get_quantizer("round-3", device="cpu").quantize_model(model)
    after = out.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(after, before)
    for row_before, row in zip(before, after):  # 3 bits: at most 7 levels per row, the largest kept exactly
        assert len(torch.unique(row)) <= 7
        assert row.abs().max().item() == pytest.approx(row_before.abs().max().item(), rel=1e-6)


@pytest.mark.slow  # the plan draws the experiment and measures the unit overhead
def test_the_new_quantizer_is_planned_at_its_own_gpu_cost(extension, tmp_path):
    cfg = load_recipe("demo-cpu", [*TINY_OVERRIDES, "score.quantizers=[fp32,round-3]", f"output_dir={tmp_path}"])
    plan = make_plan(cfg, device="h100", echo=lambda *a: None)
    from llmaudit.finetune.experiment import draw_experiment

    params, layers = count_params(model_config(cfg, draw_experiment(cfg)))
    scale = max(params / layers / 20e6, 0.05)
    assert plan["throughput"]["quantize_s"]["round-3"] == pytest.approx(0.05 * layers * scale)
    assert plan["throughput"]["quantize_s"]["fp32"] == 0.0


@pytest.mark.slow  # a tiny store fine-tuned and scored
def test_the_new_quantizer_is_scored_and_recorded(extension, tmp_path):
    from llmaudit.common.runtime import torch_threads
    from llmaudit.finetune.runs import finetune
    from llmaudit.score.stage import score

    cfg = load_recipe("demo-cpu", [*TINY_OVERRIDES, "score.quantizers=[fp32,round-3]", f"output_dir={tmp_path}"])
    with torch_threads(1):
        store = finetune(cfg, progress=False, echo=lambda *a: None)
        score(cfg, store, progress=False, echo=lambda *a: None)
    table = read_loss_table(store.root / "scores")
    ours, full = table[table["quantizer"] == "round-3"], table[table["quantizer"] == "fp32"]
    trained = full[full["run"] >= 0]  # fp32 also scores the base model: the KL reference
    assert len(ours) == len(trained) > 0
    merged = pd.merge(ours, trained, on=["run", "checkpoint", "split", "sample_id"], suffixes=("", "_fp32"))
    assert len(merged) == len(ours) and (merged["loss"] != merged["loss_fp32"]).any()
