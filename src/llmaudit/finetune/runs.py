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

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmaudit.common.io import atomic_dir, atomic_write_json, read_json
from llmaudit.common.memory import bounded_primitive_cache, peak_rss_mib, release_memory
from llmaudit.common.runtime import pick_device
from llmaudit.config import ExperimentConfig
from llmaudit.data.tokenize import tokenize_records
from llmaudit.finetune.checkpoints import (
    drop_trainer_state,
    load_adapter_weights,
    load_trainer_state,
    save_trainer_state,
    write_checkpoint,
)
from llmaudit.finetune.distributed import launched_processes, make_accelerator
from llmaudit.finetune.experiment import prepare_experiment
from llmaudit.models.layers import count_parameters
from llmaudit.models.loading import import_gptqmodel_quietly, load_base_model, load_tokenizer
from llmaudit.models.training import (
    Checkpointing,
    TrainSettings,
    TrainState,
    steps_per_epoch,
    train_epochs,
    train_token_budget,
)
from llmaudit.store.digests import DIGEST_SCOPE
from llmaudit.store.integrity import quarantine
from llmaudit.store.locks import claim
from llmaudit.store.markers import clear_stale_markers, run_marker_path, running_marker
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


def weights_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The base weights' dtype in training: float32 on a CPU (a half-precision store trains there under autocast),
    the store's compute dtype on a GPU."""
    return torch.float32 if device.type == "cpu" else dtype


def autocast_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype | None:
    """On a CPU a half-precision store trains with float32 weights under autocast to its dtype; None otherwise."""
    return dtype if device.type == "cpu" and dtype != torch.float32 else None


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


@contextlib.contextmanager
def lora_on_base(base: Any, cfg: ExperimentConfig, run: int, device: torch.device, *, in_place: bool) -> Iterator[Any]:
    """The run's LoRA model. in_place (one process on a CPU): `base` itself is wrapped, and unwrapped on the way
    out whatever happens (peft's `unload`: its LoRA layers removed, its own layers back, its parameters' gradient
    flags and its modules' train/eval modes as they were); LoRA never writes the base's weights (they are frozen,
    and nothing is merged), so the next run starts from the same base without a copy of the model per run. Otherwise a copy is wrapped and moved to `device`."""
    if not in_place:
        yield _lora_model(copy.deepcopy(base), cfg, run).to(device)
        return
    grads = [p.requires_grad for p in base.parameters()]
    modes = [m.training for m in base.modules()]
    model = _lora_model(base, cfg, run)
    try:
        yield model
    finally:
        model.unload()
        for param, flag in zip(base.parameters(), grads, strict=True):
            param.requires_grad_(flag)
        for module, mode in zip(base.modules(), modes, strict=True):
            module.training = mode


def _member_examples(cfg: ExperimentConfig, store: RunStore, run: int, tok: Any) -> list[tuple[list[int], list[bool]]]:
    """The run's training samples (its members of the pool), tokenised as the scorer sees them."""
    pool = store.read_records("pool")
    members = [pool[i] for i in np.flatnonzero(store.membership()[run])]
    tokenised = tokenize_records(tok, members, "pool", include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    return [(list(ex.input_ids), list(ex.loss_mask)) for ex in tokenised]


def _resume(store: RunStore, run: int, model: Any, device: torch.device) -> dict[str, Any] | None:
    """Load the newest checkpoint on disk into `model`; the optimizer state and step to resume from."""
    from peft import set_peft_model_state_dict

    steps = store.checkpoints_on_disk(run)
    if not steps:
        return None
    last = store.own_checkpoint_dir(run, steps[-1])
    state = load_trainer_state(last, device)
    if state is None:
        return None
    set_peft_model_state_dict(model, load_adapter_weights(last, device))
    torch.set_rng_state(state["torch_rng"])
    log.info("run %d: resuming from step %d", run, state["step"])
    return {"step": state["step"], "optimizer": state["optimizer"]}


def needs_training(store: RunStore, run: int) -> bool:
    """A run needs (re)training when it has no DONE record, or when a checkpoint of its recorded
    trajectory is gone: its record is then moved aside and the run is trained again (deterministically,
    so the checkpoints that survived are reproduced; units scored from a checkpoint whose weights come
    out different are moved to scores/quarantine/ and scored again)."""
    record = store.done_record(run)
    if record is None:
        return True
    missing = [s for s in record["steps"] if not (store.own_checkpoint_dir(run, s) / "checkpoint.json").exists()]
    if not missing:
        return False
    stamp = time.strftime("%Y%m%dT%H%M%S")
    store.run_done_path(run).rename(store.run_dir(run) / f"DONE.{stamp}.incomplete.json")
    log.warning("run %d: checkpoint(s) %s of its recorded trajectory are missing; training it again", run, missing)
    return True


def _stale_units(store: RunStore, run: int, step: int, digest: str, previous: dict[str, str]) -> None:
    """A retrained checkpoint whose weights differ from the ones scored before: move those units aside."""
    if previous.get(str(step)) in (None, digest):
        return
    unit_dir = store.unit_path(run, step, "fp32").parent
    for path in sorted(unit_dir.glob("*.parquet")) if unit_dir.is_dir() else []:
        quarantine(store, path)
        log.warning("run %d step %d: retrained weights differ; moved %s aside to score it again", run, step, path.name)


def _previous_digests(store: RunStore, run: int) -> dict[str, str]:
    """Adapter digests of a run's earlier trajectory (from a moved-aside record), by step."""
    out: dict[str, str] = {}
    for path in sorted(store.run_dir(run).glob("DONE.*.incomplete.json")):
        record = read_json(path, what="run record")
        out.update(zip((str(s) for s in record.get("steps", [])), record.get("adapter_sha256") or [], strict=False))
    return out


def _saver(store: RunStore, run: int, model: Any, accelerator: Any | None) -> Callable[[TrainState, Any], None]:
    """on_save for train_epochs: the main process writes the checkpoint (only the newest keeps the resume state)
    and moves aside units scored from a retrained checkpoint whose weights changed; every process then waits."""
    writer = accelerator is None or accelerator.is_main_process
    previous = _previous_digests(store, run) if writer else {}
    digests: dict[int, str] = {}

    def on_save(state: TrainState, optimizer: torch.optim.Optimizer) -> None:
        if writer:
            with atomic_dir(store.own_checkpoint_dir(run, state.step)) as tmp:
                digests[state.step] = write_checkpoint(
                    tmp, model, run=run, step=state.step, epoch=state.epoch, train_loss=state.last_loss
                )
                save_trainer_state(tmp, state.step, optimizer)
            _stale_units(store, run, state.step, digests[state.step], previous)
            for step in store.checkpoints_on_disk(run):  # only the newest checkpoint keeps the resume state
                if step < state.step:
                    drop_trainer_state(store.own_checkpoint_dir(run, step))
        if accelerator is not None:
            accelerator.wait_for_everyone()  # the main process writes the checkpoint

    return on_save


def _train_settings(
    cfg: ExperimentConfig, store: RunStore, run: int, pad_id: int, device: torch.device, progress: bool, model: Any
) -> TrainSettings:
    """The run's optimisation settings: the recipe's, with the run's own batch-order seed (`model`: the base, whose
    sizes set the default token budget of a pass)."""
    return TrainSettings(
        epochs=cfg.train.epochs,
        batch_size=cfg.train.batch_size,
        lr=cfg.train.lr,
        weight_decay=cfg.train.weight_decay,
        seed=int(np.random.default_rng([cfg.train.seed, run, 9]).integers(2**31)),
        pad_id=pad_id,
        desc=f"run {run}",
        device=device,
        progress=progress,
        autocast=autocast_dtype(store.train_dtype(cfg.model.dtype, device), device),
        token_budget=train_token_budget(cfg.train.token_budget, device, getattr(model, "config", None)),
    )


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
    """Train one run (resuming from its newest checkpoint). With `accelerator` (multi-process), every process
    calls this for the same run; they train it data parallel and only the main process writes."""
    t0 = time.time()
    examples = _member_examples(cfg, store, run, tok)
    save_at = checkpoint_steps(len(examples), cfg.train.batch_size, cfg.train.epochs, cfg.train.checkpoints_per_epoch)
    settings = _train_settings(cfg, store, run, tok.pad_token_id, device, progress, base)
    with lora_on_base(base, cfg, run, device, in_place=device.type == "cpu" and accelerator is None) as model:
        resume = _resume(store, run, model, device)
        checkpoints = Checkpointing(
            save_at=frozenset(save_at), on_save=_saver(store, run, model, accelerator), resume=resume
        )
        final = train_epochs(model, examples, settings, checkpoints, accelerator=accelerator)
    if accelerator is None or accelerator.is_main_process:
        _write_done(store, run, save_at, len(examples), final, time.time() - t0, resumed=resume is not None)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    return RunResult(run, False, save_at, final.last_loss, time.time() - t0)


def _write_done(
    store: RunStore, run: int, steps: list[int], n_train: int, final: TrainState, seconds: float, *, resumed: bool
) -> None:
    """DONE.json, written last: the trajectory (steps and adapter digests) the run's scores refer to."""
    digests, files = [], []
    for step in steps:
        info = read_json(store.own_checkpoint_dir(run, step) / "checkpoint.json", what="checkpoint record")
        digests.append(info.get("adapter_sha256"))
        files.append(info.get("files") if info.get("digest_scope") == DIGEST_SCOPE else None)
    complete = all(isinstance(f, dict) for f in files)  # a trajectory resumed from an older checkpoint is not
    atomic_write_json(
        store.run_done_path(run),
        {
            "run": run,
            "steps": steps,
            "adapter_sha256": digests,
            **({"checkpoint_files": files, "digest_scope": DIGEST_SCOPE} if complete else {}),
            "n_train": n_train,
            "final_train_loss": final.last_loss,
            "train_tokens": final.tokens,
            "train_padded_tokens": final.padded_tokens,
            "resumed": resumed,
            "seconds": round(seconds, 2),
        },
    )


def _record_parameters(store: RunStore, manifest: dict, base: Any, cfg: ExperimentConfig) -> None:
    if "parameters" not in manifest:
        with lora_on_base(base, cfg, 0, torch.device("cpu"), in_place=True) as model:
            trainable, total = count_parameters(model)
        manifest["parameters"] = {"adapter_trainable": trainable, "model_total": total - trainable}
        store.write_manifest(manifest)


def finetune(
    cfg: ExperimentConfig,
    *,
    out: Path | None = None,
    shard: tuple[int, int] | None = None,
    progress: bool = True,
    echo=print,
) -> RunStore:
    """Train every run of this shard that is not done, each claimed with a file lock so that several
    processes (or SLURM array tasks) on one store never train the same run twice. oneDNN's primitive cache is
    bounded from the start (`bounded_primitive_cache`: the bf16 probe makes the process's first primitives)."""
    with bounded_primitive_cache():
        accelerator = make_accelerator(pick_device(cfg.train.device)) if launched_processes() > 1 else None
        if accelerator is not None:
            return _finetune_data_parallel(cfg, accelerator, out=out, shard=shard, progress=progress, echo=echo)
        return _finetune_here(cfg, RunStore(out or cfg.resolved_output_dir()), shard, progress, echo)


def _finetune_here(
    cfg: ExperimentConfig, store: RunStore, shard: tuple[int, int] | None, progress: bool, echo
) -> RunStore:
    """`finetune` in this process alone."""
    manifest = prepare_experiment(cfg, store, echo=echo)
    device = pick_device(cfg.train.device)
    tok = load_tokenizer(cfg.model)
    todo, runs = _runs_to_train(cfg, store, shard), len(shard_items(list(range(cfg.train.runs)), shard))
    where = f"{store.root}" + (f" (shard {shard[0]}/{shard[1]})" if shard else "")
    echo(f"[finetune] {where}: {runs - len(todo)} of {runs} run(s) already done; training {len(todo)} on {device}")
    if not todo:
        return store
    base = load_base_model(cfg.model, device, dtype=weights_dtype(store.train_dtype(cfg.model.dtype, device), device))
    _record_parameters(store, manifest, base, cfg)
    release_memory()  # what loading (or converting) the model left behind, before the first run's activations
    for run in todo:
        with claim(store.lock_path("runs", f"run-{run:03d}")) as mine:
            if not mine or store.run_done(run):
                echo(f"[finetune] run {run}: trained by another process; skipped")
                continue
            with running_marker(run_marker_path(store, run)):
                res = train_run(cfg, store, run, base, tok, device, progress=progress)
        release_memory()  # the run's activations and optimizer, before the next run or the scoring processes
        echo(
            f"[finetune] run {run}: {len(res.steps)} checkpoints, final train loss {res.final_loss:.4f} "
            f"({res.seconds:.1f}s; this process's peak memory so far {peak_rss_mib() / 1024:.1f} GiB)"
        )
    del base
    release_memory()
    return store


def _runs_to_train(cfg: ExperimentConfig, store: RunStore, shard: tuple[int, int] | None) -> list[int]:
    """The runs of this shard still to train; the stale RUNNING markers of the others cleared."""
    runs = shard_items(list(range(cfg.train.runs)), shard)
    todo = [r for r in runs if needs_training(store, r)]
    clear_stale_markers(run_marker_path(store, r) for r in runs if r not in todo)
    return todo


def prepare_runs(cfg: ExperimentConfig, *, out: Path | None = None, echo=print) -> tuple[RunStore, list[int]]:
    """What a parent does once before several processes train a store's runs (`train.processes`): the store
    created (data draw, membership, manifest), so that the processes started next all find the same one.

    Args:
        cfg: the experiment's config.
        out: the run directory, or None for the config's.
        echo: where progress lines go.

    Returns:
        The run store and the runs still to train.
    """
    store = RunStore(out or cfg.resolved_output_dir())
    prepare_experiment(cfg, store, echo=echo)
    return store, _runs_to_train(cfg, store, None)


def build_base(cfg: ExperimentConfig) -> None:
    """Build a built-in base model once (a cached, file-locked build; a hub model: its tokenizer is read), what a
    parent does while the training processes it started import their libraries: they wait for the build's lock.

    Args:
        cfg: the experiment's config.
    """
    with bounded_primitive_cache():
        load_tokenizer(cfg.model)


def _parallel_base(
    cfg: ExperimentConfig, store: RunStore, manifest: dict, device: torch.device, accelerator: Any
) -> Any:
    """The base model on every process (the main one first: it builds a built-in model once), parameters recorded."""
    with accelerator.main_process_first():
        base = load_base_model(
            cfg.model, device, dtype=weights_dtype(store.train_dtype(cfg.model.dtype, device), device)
        )
    if accelerator.is_main_process:
        _record_parameters(store, manifest, base, cfg)
    accelerator.wait_for_everyone()
    return base


def _finetune_data_parallel(
    cfg: ExperimentConfig, accelerator: Any, *, out: Path | None, shard: tuple[int, int] | None, progress: bool, echo
) -> RunStore:
    """finetune() across the processes of one launch: each run is trained by all of them together (DDP).

    The main process creates the store and builds any built-in model first; the others then read them.
    Only the main process writes (manifest, checkpoints, DONE, markers), claims runs and prints; its
    decision to train a run is broadcast so that every process trains the same runs."""
    from accelerate.utils import broadcast_object_list

    main = accelerator.is_main_process
    say = echo if main else (lambda *_: None)
    store = RunStore(out or cfg.resolved_output_dir())
    requested = pick_device(cfg.train.device)  # fails early on device=cuda without a GPU
    device = accelerator.device if cfg.train.device in ("auto", "cuda") else requested
    with accelerator.main_process_first():
        manifest = prepare_experiment(cfg, store, echo=say)
        tok = load_tokenizer(cfg.model)
    runs = shard_items(list(range(cfg.train.runs)), shard)
    todo = broadcast_object_list([[r for r in runs if needs_training(store, r)] if main else None])[0]
    if main:
        clear_stale_markers(run_marker_path(store, r) for r in runs if r not in todo)
    say(
        f"[finetune] {store.root}: {len(runs) - len(todo)} of {len(runs)} run(s) already done; training {len(todo)} "
        f"data parallel on {accelerator.num_processes} processes ({device.type})"
    )
    if not todo:
        accelerator.wait_for_everyone()
        return store
    base = _parallel_base(cfg, store, manifest, device, accelerator)
    for run in todo:
        with contextlib.ExitStack() as held:
            mine = held.enter_context(claim(store.lock_path("runs", f"run-{run:03d}"))) if main else None
            go = broadcast_object_list([bool(mine) and not store.run_done(run) if main else None])[0]
            if not go:
                say(f"[finetune] run {run}: trained by another process; skipped")
                continue
            if main:
                held.enter_context(running_marker(run_marker_path(store, run)))
            res = train_run(cfg, store, run, base, tok, device, progress=progress, accelerator=accelerator)
        say(
            f"[finetune] run {run}: {len(res.steps)} checkpoints, final train loss {res.final_loss:.4f} ({res.seconds:.1f}s)"
        )
    accelerator.wait_for_everyone()
    return store
