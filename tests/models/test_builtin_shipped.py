"""The CPU demo's base model comes with llmaudit: installed from models/assets/ when its digests hold, built
otherwise (another `model.builtin`, a file that fails its digest, or LLMAUDIT_BUILD_BUILTIN=1); and building it here
gives the same model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from llmaudit.common.io import atomic_dir
from llmaudit.config import load_recipe
from llmaudit.models import builtin


@pytest.fixture
def demo_model():
    return load_recipe("demo-cpu").model


@pytest.fixture
def counted_builds(monkeypatch, tmp_path):
    """A cache in tmp_path and a build that records itself instead of pre-training."""
    monkeypatch.setenv("LLMAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(builtin.BUILD_ENV, raising=False)
    builds = []

    def build(cfg, root):
        builds.append(root)
        with atomic_dir(root) as tmp:
            (tmp / "DONE").write_text(json.dumps({"version": "test"}))
        return root

    monkeypatch.setattr(builtin, "build_builtin_model", build)
    monkeypatch.setattr("transformers.PreTrainedTokenizerFast.from_pretrained", lambda path: path)
    return builds


def _name(cfg) -> str:
    return f"{cfg.name[len(builtin.BUILTIN_PREFIX) :]}-{builtin.builtin_key(cfg)}"


def test_the_demo_recipes_base_is_shipped_and_is_that_recipes_model(demo_model):
    files = builtin.shipped_files(_name(demo_model))
    assert files is not None, "the demo's model.builtin changed: ship its new build (see models/builtin.py)"
    done = json.loads(files["DONE"].read_text())
    assert done["config"] == demo_model.model_dump() and done["version"] == builtin.BUILTIN_VERSION


def test_the_shipped_base_is_installed_without_a_build(demo_model, counted_builds):
    root, _ = builtin.builtin_dir(demo_model, pretrain=True)
    assert counted_builds == []
    shipped = builtin.shipped_files(root.name)
    assert sorted(p.name for p in root.iterdir()) == sorted(shipped)
    assert all((root / name).read_bytes() == path.read_bytes() for name, path in shipped.items())


def test_a_shipped_file_that_fails_its_digest_is_not_used(demo_model, counted_builds, monkeypatch, tmp_path):
    assets = tmp_path / "assets"
    shutil.copytree(builtin.ASSETS / _name(demo_model), assets / _name(demo_model))
    weights = assets / _name(demo_model) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(builtin, "ASSETS", assets)
    root, _ = builtin.builtin_dir(demo_model, pretrain=True)
    assert counted_builds == [root]  # built, not copied


@pytest.mark.parametrize("value, built", [("1", True), ("0", False)])
def test_the_build_variable_builds_the_shipped_base_here(demo_model, counted_builds, monkeypatch, value, built):
    monkeypatch.setenv(builtin.BUILD_ENV, value)
    root, _ = builtin.builtin_dir(demo_model, pretrain=True)
    assert counted_builds == ([root] if built else [])


@pytest.mark.slow  # the demo's pre-training: about half a minute on one thread
def test_building_the_demo_base_here_gives_the_shipped_model(demo_model, monkeypatch, tmp_path):
    """Bit for bit on a CPU whose kernels sum as the shipping machine's did; anywhere, the same model to the
    precision that training in float32 on another CPU's kernels keeps (its loss on held-out records within 1%)."""
    from transformers import AutoModelForCausalLM

    from llmaudit.common.runtime import torch_threads
    from llmaudit.data.chem import SUPPORTED_TASKS, generate_records
    from llmaudit.data.tokenize import collate, format_record
    from llmaudit.models.training import summed_nll

    monkeypatch.setenv("LLMAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(builtin.BUILD_ENV, "1")
    with torch_threads(1):
        root, tok = builtin.builtin_dir(demo_model, pretrain=True)
    shipped = builtin.ASSETS / root.name
    records = generate_records(SUPPORTED_TASKS, 32, seed=99, stream="audit")
    ids, attn, mask = collate([format_record(tok, r, include_prompt=True)[:2] for r in records], tok.pad_token_id)
    losses = []
    for path in (root, shipped):
        model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
        with torch.no_grad():
            losses.append(float(summed_nll(model, ids, attn, mask)) / int(mask[:, 1:].sum()))
    assert abs(losses[0] - losses[1]) <= 0.01 * losses[1], losses
    assert (root / "tokenizer.json").read_bytes() == (shipped / "tokenizer.json").read_bytes()
