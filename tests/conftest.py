"""Shared fixtures: tests never touch the network or the user's cache, and build tiny models in code."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Built-in models are built into a per-session cache, never into ~/.cache."""
    old = os.environ.get("LLMAUDIT_CACHE")
    os.environ["LLMAUDIT_CACHE"] = str(tmp_path_factory.mktemp("llmaudit-cache"))
    yield
    if old is None:
        os.environ.pop("LLMAUDIT_CACHE", None)
    else:
        os.environ["LLMAUDIT_CACHE"] = old


TINY_OVERRIDES = [
    "model.builtin.hidden_size=32",
    "model.builtin.intermediate_size=64",
    "model.builtin.num_attention_heads=2",
    "model.builtin.num_key_value_heads=1",
    "model.builtin.vocab_size=320",
    "model.builtin.pretrain_samples=320",
    "model.builtin.pretrain_epochs=2",
    "model.builtin.pretrain_lr=0.01",
    "data.pool_size=16",
    "data.val_size=8",
    "train.runs=3",
    "train.epochs=2",
    "train.batch_size=4",
    "train.checkpoints_per_epoch=1",
    "lora.r=4",
    "score.quantizers=[fp32,uniform-4,sign]",
    "attack.n_boot=20",
]


@pytest.fixture
def tiny_cfg(tmp_path):
    """A complete experiment small enough to fine-tune, score and report in seconds."""
    from llmaudit.config import load_recipe

    return load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={tmp_path / 'exp'}"])
