"""Check d of benchmarks/gpu_check.py: `accelerate launch` of two tiny LoRA runs of `llmaudit finetune`, two
processes over NCCL between two GPUs (skipped with fewer), or over gloo on CPU."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from .common import BUILTIN, ROOT, Result, SkipCheck, _builtin_config, _one_line


def check_ddp(args: argparse.Namespace, result: Result) -> None:
    import torch

    if args.device == "cuda":
        n = torch.cuda.device_count()
        if n < 2:
            raise SkipCheck(f"{n} GPU visible: a 2-process DDP run needs 2")
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    if accelerate is None:
        raise RuntimeError("the accelerate launcher is not installed")
    out = Path(args.work) / "ddp-store"
    shutil.rmtree(out, ignore_errors=True)
    cmd, env = _launch(accelerate, args.device, out)
    _builtin_config_built()  # once, before two processes would both build it
    result.detail(command=" ".join(cmd), backend="nccl" if args.device == "cuda" else "gloo")
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - t0
    print(done.stdout[-4000:] + done.stderr[-4000:])
    if done.returncode:
        result.set(
            status="fail", error=f"accelerate launch exit {done.returncode}: {_one_line(done.stderr[-800:], 800)}"
        )
        return
    runs_done, losses = _train_losses(out)
    parallel = "data parallel on 2 processes" in done.stdout
    finite = bool(losses) and all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses)
    figure = f"2 runs x 2 epochs over {result['details']['backend']} in {seconds:.0f} s; runs done {runs_done}; train losses {[round(x, 3) for x in losses if isinstance(x, float)]}"
    ok = parallel and len(runs_done) == 2 and finite
    error = (
        None
        if ok
        else ("no 'data parallel on 2 processes' line" if not parallel else "runs unfinished or losses not finite")
    )
    result.set(status="pass" if ok else "fail", figure=figure, error=error)


def _launch(accelerate: str, device: str, out: Path) -> tuple[list[str], dict[str, str]]:
    """The `accelerate launch` command of two tiny LoRA runs into `out`, and its environment."""
    overrides = [f"model.builtin.{k}={v}" for k, v in BUILTIN.items()] + [
        "data.pool_size=16",
        "data.val_size=8",
        "train.runs=2",
        "train.epochs=2",
        "train.batch_size=7",
        "train.checkpoints_per_epoch=1",
        "lora.r=4",
        f"train.device={device}",
    ]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        "-m", "llmaudit.cli", "finetune", "demo-cpu", *overrides, "--out", str(out), "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "LLMAUDIT_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return cmd, env


def _train_losses(out: Path) -> tuple[list[int], list]:
    """The runs that finished in the store `out`, and the train loss of each of their checkpoints."""
    from llmaudit.store.run_store import RunStore

    store = RunStore(out)
    runs_done = [r for r in range(2) if store.run_done(r)]
    losses = []
    for r in runs_done:
        for step in store.checkpoints(r):
            info = json.loads((store.checkpoint_dir(r, step) / "checkpoint.json").read_text())
            losses.append(info.get("train_loss"))
    return runs_done, losses


def _builtin_config_built() -> None:
    import torch

    from llmaudit.models.loading import load_base_model

    load_base_model(_builtin_config(), torch.device("cpu"), torch.float32)
