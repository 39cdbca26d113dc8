"""`llmaudit finetune`: N LoRA runs, each on a random subset of a sample pool, with adapter checkpoints
saved along every training trajectory.

Resumable at every checkpoint: a finished run (DONE.json) is skipped; an interrupted one restarts from its
latest complete checkpoint (adapter + optimizer state) and reproduces the uninterrupted trajectory.

Launched with several processes (`accelerate launch --multi_gpu --num_processes N -m llmaudit.cli finetune ...`
or `torchrun --nproc_per_node N -m llmaudit.cli finetune ...`; on CPU too, over gloo), every run is trained
data parallel (DDP) by all the processes together; only the main process writes to the run store.
(`accelerate launch --cpu` starts a single process.)
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmaudit.common.io import atomic_dir, atomic_write_json
from llmaudit.common.runtime import pick_device
from llmaudit.config import ExperimentConfig
from llmaudit.data.tokenize import tokenize_records
from llmaudit.finetune.distributed import launched_processes, make_accelerator
from llmaudit.finetune.experiment import prepare_experiment
from llmaudit.models.layers import count_parameters
from llmaudit.models.loading import import_gptqmodel_quietly, load_base_model, load_tokenizer
from llmaudit.models.training import TrainState, steps_per_epoch, train_epochs
from llmaudit.store.markers import clear_stale_markers, each_marked, run_marker_path
from llmaudit.store.run_store import RunStore
from llmaudit.store.shards import shard_items

log = logging.getLogger(__name__)


def checkpoint_steps(n_train: int, batch_size: int, epochs: int, per_epoch: int) -> list[int]:
    """Evenly spaced optimizer steps at which an adapter checkpoint is saved (the last step included)."""
    spe = steps_per_epoch(n_train, batch_size)
    total = spe * epochs
    k = epochs * per_epoch
    return sorted({max(1, round(total * i / k)) for i in range(1, k + 1)})


@dataclass
class RunResult:
    run: int
    skipped: bool
    steps: list[int]
    final_loss: float | None
    seconds: float


def _lora_model(base: Any, cfg: ExperimentConfig, run: int) -> Any:
    from peft import LoraConfig, get_peft_model

    import_gptqmodel_quietly()  # peft's LoRA dispatch imports it

    lora = LoraConfig(
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=list(cfg.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(int(np.random.default_rng([cfg.train.seed, run, 5]).integers(2**31)))
    return get_peft_model(base, lora)


def train_run(
    cfg: ExperimentConfig,
    store: RunStore,
    run: int,
    base: Any,
    tok: Any,
    device: torch.device,
    *,
    progress: bool = True,
    accelerator: Any | None = None,
) -> RunResult:
    """Train one run (resuming from its latest checkpoint). With `accelerator` (multi-process), every process
    calls this for the same run; they train it data parallel and only the main process writes."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    t0 = time.time()
    if store.run_done(run):
        return RunResult(run, True, store.checkpoints(run), None, 0.0)
    masks = store.membership()
    pool = store.read_records("pool")
    members = [pool[i] for i in np.flatnonzero(masks[run])]
    examples = [
        (list(ex.input_ids), list(ex.loss_mask))
        for ex in tokenize_records(
            tok, members, "pool", include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9
        )
    ]
    save_at = checkpoint_steps(len(examples), cfg.train.batch_size, cfg.train.epochs, cfg.train.checkpoints_per_epoch)
    model = _lora_model(copy.deepcopy(base), cfg, run)
    model.to(device)
    resume = None
    done_steps = store.checkpoints(run)
    if done_steps:
        last = store.checkpoint_dir(run, done_steps[-1])
        state_path = last / "trainer_state.pt"
        if state_path.exists():
            set_peft_model_state_dict(model, load_file(str(last / "adapter_model.safetensors")))
            trainer_state = torch.load(state_path, map_location=device, weights_only=False)
            torch.set_rng_state(trainer_state["torch_rng"])
            resume = {"step": trainer_state["step"], "optimizer": trainer_state["optimizer"]}
            log.info("run %d: resuming from step %d", run, trainer_state["step"])

    writer = accelerator is None or accelerator.is_main_process

    def on_save(state: TrainState, optimizer: torch.optim.Optimizer) -> None:
        if not writer:
            accelerator.wait_for_everyone()  # the main process writes the checkpoint
            return
        target = store.checkpoint_dir(run, state.step)
        with atomic_dir(target) as tmp:
            model.save_pretrained(tmp)
            torch.save(
                {"step": state.step, "optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()},
                tmp / "trainer_state.pt",
            )
            atomic_write_json(
                tmp / "checkpoint.json",
                {"run": run, "step": state.step, "epoch": state.epoch, "train_loss": state.last_loss},
            )
        # Only the newest checkpoint keeps the optimizer state needed to resume (it is large on real models).
        for step in store.checkpoints(run):
            if step < state.step:
                (store.checkpoint_dir(run, step) / "trainer_state.pt").unlink(missing_ok=True)
        if accelerator is not None:
            accelerator.wait_for_everyone()

    final = train_epochs(
        model,
        examples,
        epochs=cfg.train.epochs,
        batch_size=cfg.train.batch_size,
        lr=cfg.train.lr,
        weight_decay=cfg.train.weight_decay,
        seed=int(np.random.default_rng([cfg.train.seed, run, 9]).integers(2**31)),
        pad_id=tok.pad_token_id,
        desc=f"run {run}",
        device=device,
        save_at=set(save_at),
        on_save=on_save,
        resume=resume,
        progress=progress,
        accelerator=accelerator,
    )
    steps = store.checkpoints(run)
    if writer:
        atomic_write_json(
            store.run_done_path(run),
            {
                "run": run,
                "steps": steps,
                "n_train": len(examples),
                "final_train_loss": final.last_loss,
                "seconds": round(time.time() - t0, 2),
            },
        )
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return RunResult(run, False, steps, final.last_loss, time.time() - t0)


def finetune(
    cfg: ExperimentConfig,
    *,
    out: Path | None = None,
    shard: tuple[int, int] | None = None,
    progress: bool = True,
    echo=print,
) -> RunStore:
    accelerator = make_accelerator(pick_device(cfg.train.device)) if launched_processes() > 1 else None
    if accelerator is not None:
        return _finetune_data_parallel(cfg, accelerator, out=out, shard=shard, progress=progress, echo=echo)
    store = RunStore(out or cfg.resolved_output_dir())
    manifest = prepare_experiment(cfg, store)
    runs = shard_items(list(range(cfg.train.runs)), shard)
    device = pick_device(cfg.train.device)
    tok = load_tokenizer(cfg.model)
    todo = [r for r in runs if not store.run_done(r)]
    clear_stale_markers(run_marker_path(store, r) for r in runs if r not in todo)
    echo(
        f"[finetune] {store.root}: {len(runs) - len(todo)} of {len(runs)} run(s) already done; training {len(todo)} on {device}"
    )
    if todo:
        base = load_base_model(cfg.model, device)
        trainable, total = count_parameters(_lora_model(copy.deepcopy(base), cfg, 0))
        if "parameters" not in manifest:
            manifest["parameters"] = {"adapter_trainable": trainable, "model_total": total - trainable}
            store.write_manifest(manifest)
        for run in each_marked(todo, lambda r: run_marker_path(store, r)):
            res = train_run(cfg, store, run, base, tok, device, progress=progress)
            echo(
                f"[finetune] run {run}: {len(res.steps)} checkpoints, final train loss {res.final_loss:.4f} ({res.seconds:.1f}s)"
            )
    return store


def _finetune_data_parallel(
    cfg: ExperimentConfig, accelerator: Any, *, out: Path | None, shard: tuple[int, int] | None, progress: bool, echo
) -> RunStore:
    """finetune() across the processes of one launch: each run is trained by all of them together (DDP).

    The main process creates the store and builds any built-in model first; the others then read them.
    Only the main process writes (manifest, checkpoints, DONE, RUNNING markers) and prints."""
    main = accelerator.is_main_process
    say = echo if main else (lambda *_: None)
    store = RunStore(out or cfg.resolved_output_dir())
    requested = pick_device(cfg.train.device)  # fails early on device=cuda without a GPU
    device = accelerator.device if cfg.train.device in ("auto", "cuda") else requested
    with accelerator.main_process_first():
        manifest = prepare_experiment(cfg, store)
        tok = load_tokenizer(cfg.model)
    runs = shard_items(list(range(cfg.train.runs)), shard)
    todo = [r for r in runs if not store.run_done(r)]
    if accelerator.is_main_process:
        clear_stale_markers(run_marker_path(store, r) for r in runs if r not in todo)
    say(
        f"[finetune] {store.root}: {len(runs) - len(todo)} of {len(runs)} run(s) already done; training {len(todo)} "
        f"data parallel on {accelerator.num_processes} processes ({device.type})"
    )
    if todo:
        with accelerator.main_process_first():
            base = load_base_model(cfg.model, device)
        trainable, total = count_parameters(_lora_model(copy.deepcopy(base), cfg, 0))
        if main and "parameters" not in manifest:
            manifest["parameters"] = {"adapter_trainable": trainable, "model_total": total - trainable}
            store.write_manifest(manifest)
        accelerator.wait_for_everyone()
        for run in each_marked(todo, lambda r: run_marker_path(store, r)) if main else todo:
            res = train_run(cfg, store, run, base, tok, device, progress=progress, accelerator=accelerator)
            say(
                f"[finetune] run {run}: {len(res.steps)} checkpoints, final train loss {res.final_loss:.4f} ({res.seconds:.1f}s)"
            )
    accelerator.wait_for_everyone()
    return store
