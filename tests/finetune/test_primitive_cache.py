"""Fine-tuning bounds oneDNN's primitive cache (it grew by every run's shapes under bf16 autocast): the bound is
read by oneDNN when the process makes its first primitive, holds within `finetune`, and leaves no trace in the
environment of the processes started after; a user's own setting is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import llmaudit.finetune.runs as runs_module
from llmaudit.common.memory import ONEDNN_CACHE_ENV, TRAINING_PRIMITIVE_CACHE, bounded_primitive_cache
from tests.conftest import run_cli

CHILD = """
import sys, torch
from llmaudit.common.memory import bounded_primitive_cache
w = torch.randn(8, 4, 3, 3)
def convs():
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON_CREATION):
        for n in (32, 33, 34, 32):  # the last shape was seen three primitives ago
            torch.nn.functional.conv2d(torch.randn(2, 4, n, n), w)
if sys.argv[1] == "bounded":
    with bounded_primitive_cache(2):
        convs()
else:
    convs()
"""


def _convolution_creations(mode: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_CACHE_ENV}
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ",create:cache_" in ln and ",convolution," in ln]
    return [ln.split(",create:")[1].split(",")[0] for ln in lines]


def test_the_bound_set_after_torch_is_imported_holds_in_that_process():
    default, bounded = _convolution_creations("default"), _convolution_creations("bounded")
    if len(default) != 4:
        pytest.skip(f"this CPU's torch does not run these convolutions through oneDNN: {default}")
    assert default == ["cache_miss", "cache_miss", "cache_miss", "cache_hit"]
    assert bounded == ["cache_miss"] * 4  # two primitives kept: the first shape was evicted


def test_the_variable_is_set_within_and_gone_after(monkeypatch):
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    with bounded_primitive_cache():
        assert os.environ[ONEDNN_CACHE_ENV] == str(TRAINING_PRIMITIVE_CACHE)
    assert ONEDNN_CACHE_ENV not in os.environ
    with pytest.raises(RuntimeError), bounded_primitive_cache(8):
        raise RuntimeError("a run failed")
    assert ONEDNN_CACHE_ENV not in os.environ
    monkeypatch.setenv(ONEDNN_CACHE_ENV, "512")
    with bounded_primitive_cache():
        assert os.environ[ONEDNN_CACHE_ENV] == "512"  # the user's
    assert os.environ[ONEDNN_CACHE_ENV] == "512"


def test_finetune_holds_the_bound_from_its_start(tiny_cfg, monkeypatch):
    """The store's bf16 probe (in prepare_experiment) makes the process's first oneDNN primitives: the bound must
    already hold then, and for every run."""
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    seen = []
    for name in ("prepare_experiment", "train_run"):
        real = getattr(runs_module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            seen.append((_name, os.environ.get(ONEDNN_CACHE_ENV)))
            return _real(*args, **kwargs)

        monkeypatch.setattr(runs_module, name, spy)
    runs_module.finetune(tiny_cfg, progress=False, echo=lambda *a: None)
    bound = str(TRAINING_PRIMITIVE_CACHE)
    assert seen == [("prepare_experiment", bound)] + [("train_run", bound)] * tiny_cfg.train.runs
    assert ONEDNN_CACHE_ENV not in os.environ


@pytest.mark.parametrize("command", ["finetune", "audit"])
def test_the_commands_hold_the_bound_before_they_read_the_recipe(command, tmp_path, monkeypatch):
    """`llmaudit finetune` and `audit` bound the cache before anything else (a recipe's model conversion may make
    primitives), and the variable is gone when the bounded part ends, also on failure (`audit` starts its scoring
    processes after it, so they keep oneDNN's default)."""
    monkeypatch.delenv(ONEDNN_CACHE_ENV, raising=False)
    seen = []

    def stop(*args, **kwargs):
        seen.append(os.environ.get(ONEDNN_CACHE_ENV))
        raise SystemExit(3)

    monkeypatch.setattr("llmaudit.planning.targets.config_from_recipe", stop)  # the commands import it when they run
    code, _, _ = run_cli([command, "demo-cpu", "--out", tmp_path / "exp"])
    assert code == 3 and seen == [str(TRAINING_PRIMITIVE_CACHE)]
    assert ONEDNN_CACHE_ENV not in os.environ
