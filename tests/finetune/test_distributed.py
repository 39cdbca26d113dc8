"""Data-parallel (accelerate/DDP) training of one run: 2 CPU processes over gloo give the single-process adapters."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from llmaudit.config import load_recipe
from llmaudit.finetune.runs import finetune
from llmaudit.models.training import local_rows
from llmaudit.store.run_store import RunStore
from tests.conftest import TINY_OVERRIDES

# batch_size=7 on 8 members: global batches of 7 and 1 rows, i.e. uneven slices (3/4 rows, different token
# counts) and a batch with fewer rows than processes (one process contributes a zero-weight row).
OVERRIDES = TINY_OVERRIDES + ["train.runs=2", "train.batch_size=7"]


def _adapters(store, run):
    return {
        step: load_file(str(store.checkpoint_dir(run, step) / "adapter_model.safetensors"))
        for step in store.checkpoints(run)
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out, overrides, processes=2):
    """`accelerate launch` of `llmaudit finetune` on CPU: torch's elastic launcher, gloo between the processes."""
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    cmd = [
        accelerate, "launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
        "-m", "llmaudit.cli", "finetune", "demo-cpu", *overrides, "--out", str(out), "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "LLMAUDIT_THREADS": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_local_rows_partition_every_batch():
    for rows in range(0, 10):
        for world in (1, 2, 3, 4):
            parts = [local_rows(rows, k, world) for k in range(world)]
            assert parts[0][0] == 0 and parts[-1][1] == rows
            assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))


@pytest.mark.slow
def test_two_processes_train_the_single_process_adapters(tmp_path):
    single = finetune(
        load_recipe("demo-cpu", OVERRIDES + [f"output_dir={tmp_path / 'single'}"]), progress=False, echo=lambda *_: None
    )
    stdout = _launch(tmp_path / "ddp", OVERRIDES)
    assert "data parallel on 2 processes" in stdout
    ddp = RunStore(tmp_path / "ddp")
    assert ddp.manifest()["data"] == single.manifest()["data"]
    assert (ddp.membership() == single.membership()).all()
    worst = 0.0
    for run in (0, 1):
        assert ddp.run_done(run) and ddp.checkpoints(run) == single.checkpoints(run) == [2, 4]
        assert not (ddp.run_dir(run) / "RUNNING.json").exists()
        assert not (ddp.checkpoint_dir(run, 2) / "trainer_state.safetensors").exists()
        assert (ddp.checkpoint_dir(run, 4) / "trainer_state.safetensors").exists()
        a, b = _adapters(single, run), _adapters(ddp, run)
        assert a.keys() == b.keys()
        for step in a:
            assert a[step].keys() == b[step].keys()
            for k in a[step]:
                scale = float(a[step][k].abs().max()) or 1.0
                worst = max(worst, float((a[step][k] - b[step][k]).abs().max()) / scale)
            la = json.loads((single.checkpoint_dir(run, step) / "checkpoint.json").read_text())["train_loss"]
            lb = json.loads((ddp.checkpoint_dir(run, step) / "checkpoint.json").read_text())["train_loss"]
            assert lb == pytest.approx(la, rel=1e-5)  # the logged loss is the global-batch mean, as in one process
    # Same gradients up to the order of float reductions (Adam amplifies those on near-zero gradient entries).
    print(f"max |single - ddp| / max |single| over adapter tensors: {worst:.2e}")
    assert worst < 1e-4

    # A run that lost its last checkpoint is retrained data parallel to the same adapters; finished runs are left alone.
    shutil.rmtree(ddp.checkpoint_dir(1, 4))
    (ddp.run_done_path(1)).unlink()
    before = _adapters(ddp, 0)
    _launch(tmp_path / "ddp", OVERRIDES)
    assert ddp.run_done(1) and ddp.checkpoints(1) == [2, 4]
    after = _adapters(ddp, 0)
    assert all(torch.equal(before[s][k], after[s][k]) for s in before for k in before[s])
    b4 = _adapters(single, 1)[4]
    r4 = _adapters(ddp, 1)[4]
    assert max(float((b4[k] - r4[k]).abs().max()) / (float(b4[k].abs().max()) or 1.0) for k in b4) < 1e-4
