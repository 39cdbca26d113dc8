"""Shared fixtures: tests never touch the network or the user's cache, and build tiny models in code."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pytest_collection_modifyitems(config, items):
    if any("slurm" in item.keywords for item in items):
        from tests.jobs.slurm_cluster import cluster_unreachable

        why = cluster_unreachable()
        if why and os.environ.get("LLMAUDIT_SLURM_REQUIRED", "") not in ("", "0"):
            raise pytest.UsageError(f"LLMAUDIT_SLURM_REQUIRED is set, but {why}")
        for item in items:
            if why and "slurm" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=why))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _session_working_directory(tmp_path_factory):
    """Module- and session-scoped fixtures run in a directory of their own, never in the user's checkout."""
    old = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(old)


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path, monkeypatch):
    """Every test runs in its own empty directory: no test reads or writes the directory pytest was started
    in (a demo store the README's first command left in ./llmaudit-out once changed what a test saw)."""
    monkeypatch.chdir(tmp_path)


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
    "score.if_available=[]",
    "score.generation_samples=2",
    "score.generation_max_new_tokens=8",
    "attack.n_boot=20",
    # one process per stage, as the tests' own calls run them (the demo's two are tested in tests/jobs/test_local.py)
    "train.processes=1",
    "score.processes=1",
]


@pytest.fixture(scope="session")
def audited_tiny_store(tmp_path_factory):
    """One tiny experiment (TINY_OVERRIDES), fine-tuned, scored and reported once per session: the received
    store that the untrusted-input cases copy and tamper with (never change it: copy it)."""
    from llmaudit.common.runtime import torch_threads
    from llmaudit.config import load_recipe
    from llmaudit.finetune.runs import finetune
    from llmaudit.score.stage import score

    root = tmp_path_factory.mktemp("audited") / "exp"
    cfg = load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={root}"])
    # The commands run a built-in model on one thread; train it the same way so that a case retraining it
    # through the command line gets the same bits (a CPU's matrix kernels may sum in another order on 2).
    with torch_threads(1):
        store = finetune(cfg, progress=False, echo=lambda *a: None)
        score(cfg, store, progress=False, echo=lambda *a: None)
    code, _, err = run_cli(["report", str(root)])
    assert code == 0, err
    return root


@pytest.fixture
def tiny_cfg(tmp_path):
    """A complete experiment small enough to fine-tune, score and report in seconds."""
    from llmaudit.config import load_recipe

    return load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={tmp_path / 'exp'}"])


def write_store_from_table(root, cfg, pool, val, membership, table, *, parameters=None):
    """A consistent run store written by hand from records and one loss table, as `finetune` + `score`
    would leave it: manifest (real fingerprint), data files, each run's checkpoints (a stand-in adapter)
    with its DONE record, and one parquet file per scoring unit (pool rows only at a run's final step)."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from llmaudit.common.io import atomic_write_json, atomic_write_text
    from llmaudit.data.records import dataset_fingerprint, records_to_jsonl
    from llmaudit.store.losstable import REFERENCE_RUN, write_loss_table
    from llmaudit.store.run_store import RunStore, file_digest

    store = RunStore(root)
    data = {
        "route": "synthetic",
        "source": "synthetic",
        "path": None,
        "hub_id": None,
        "tasks": sorted({r["task"] for r in pool + val}),
        "n_available": len(pool) + len(val),
        "n_usable": len(pool) + len(val),
        "fingerprint": dataset_fingerprint(pool + val),
        "pool_ids": [r["sample_id"] for r in pool],
        "val_ids": [r["sample_id"] for r in val],
    }
    manifest = store.create(cfg, data, np.asarray(membership, bool))
    if parameters:
        manifest["parameters"] = parameters
        store.write_manifest(manifest)
    store.update_config(cfg)
    atomic_write_text(root / "data" / "pool.jsonl", records_to_jsonl(pool))
    atomic_write_text(root / "data" / "val.jsonl", records_to_jsonl(val))
    runs = sorted(int(r) for r in table["run"].unique() if r != REFERENCE_RUN)
    for run in runs:
        steps = sorted(int(s) for s in table.loc[table["run"] == run, "checkpoint"].unique())
        digests = []
        for step in steps:
            directory = store.own_checkpoint_dir(run, step)
            directory.mkdir(parents=True, exist_ok=True)
            save_file(
                {"lora_A": torch.full((2, 2), float(run * 1000 + step))}, str(directory / "adapter_model.safetensors")
            )
            digests.append(file_digest(directory / "adapter_model.safetensors"))
            atomic_write_json(directory / "checkpoint.json", {"run": run, "step": step, "adapter_sha256": digests[-1]})
        atomic_write_json(store.run_done_path(run), {"run": run, "steps": steps, "adapter_sha256": digests})
    for (run, step, q), unit in table.groupby(["run", "checkpoint", "quantizer"]):
        final = run == REFERENCE_RUN or step == table.loc[table["run"] == run, "checkpoint"].max()
        rows = unit if final else unit[unit["split"] == "val"]
        write_loss_table(rows.reset_index(drop=True), store.unit_path(int(run), int(step), str(q)))
    return store


def run_cli(args, env=None):
    """`llmaudit ARGS` in this process through the console entry point; (exit code, stdout, stderr)."""
    import contextlib
    import io
    import sys

    from llmaudit import cli

    out, err = io.StringIO(), io.StringIO()
    old_argv, old_env = sys.argv, dict(os.environ)
    sys.argv = ["llmaudit", *[str(a) for a in args]]
    os.environ.update(env or {})
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = int(exc.code or 0)
    finally:
        sys.argv = old_argv
        os.environ.clear()
        os.environ.update(old_env)
    return code, out.getvalue(), err.getvalue()
