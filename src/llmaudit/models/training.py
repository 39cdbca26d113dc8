"""The optimisation loop shared by the built-in model's pre-training and LoRA fine-tuning.

Deterministic and resumable: the batch order of epoch e is a permutation seeded by (seed, e), so a run
resumed from a checkpoint at step s continues exactly as the uninterrupted run would.

Data parallel (accelerate/DDP, several processes): every process walks the same global batches; process k
of P computes the summed NLL of its contiguous slice of rows, scaled by P / (scored tokens of the global
batch), so DDP's gradient average equals the single-process gradient of the global-batch mean NLL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from llmaudit.data.tokenize import TrainExample, collate
from llmaudit.models.layers import decoder_and_head


def scored_hidden(
    model: Any, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states that predict the scored tokens: (h [P, H], targets [P], row index [P])."""
    decoder, _ = decoder_and_head(model)
    hidden = decoder(input_ids=ids, attention_mask=attn).last_hidden_state  # [B, T, H]
    pred = mask[:, 1:]  # position t-1 predicts token t
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(pred)[pred]
    return hidden[:, :-1][pred], ids[:, 1:][pred], rows


def summed_nll(model: Any, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood over all scored tokens of the batch (float32)."""
    h, targets, _ = scored_hidden(model, ids, attn, mask)
    _, head = decoder_and_head(model)
    return torch.nn.functional.cross_entropy(head(h).float(), targets, reduction="sum")


def batch_mean_nll(model: Any, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood over all scored tokens of the batch (the training objective)."""
    h, targets, _ = scored_hidden(model, ids, attn, mask)
    _, head = decoder_and_head(model)
    logits = head(h).float()
    return torch.nn.functional.cross_entropy(logits, targets)


class _SliceNLL(torch.nn.Module):
    """What a data-parallel process differentiates: its rows' summed NLL scaled so that the mean over the
    P processes (DDP's gradient average) is the mean NLL of the global batch. Going through this module's
    forward is what lets DDP see the backward pass (the loss itself calls the decoder body and the head
    directly, which DDP would not notice)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        nll = summed_nll(self.model, ids, attn, mask)
        return nll * scale, nll.detach()


def autocast_to(device: torch.device | str, dtype: torch.dtype | None) -> Any:
    """torch.autocast to `dtype` on `device`'s type, or a no-op for None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)


CPU_ACTIVATION_BYTES = 3 * 2**29
"""On a CPU, the activations one forward/backward pass of fine-tuning may hold (1.5 GiB): train.token_budget's
default is this over `activation_bytes_per_token` (the measurements behind it: docs/results.md, "The verdict
audit's memory and time, process by process")."""


def activation_bytes_per_token(config: Any) -> int | None:
    """What one token's activations kept for the backward pass take in a decoder of this `config` (a transformers
    PretrainedConfig), float32: about 8 hidden-wide and 6 intermediate-wide vectors per layer (the attention's
    inputs, outputs and norms; the MLP's gate, up, their product and activation). None when the config does not
    say its sizes."""
    sizes = [getattr(config, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size")]
    if not all(isinstance(v, int) and v > 0 for v in sizes):
        return None
    layers, hidden, inner = sizes
    return 4 * layers * (8 * hidden + 6 * inner)


def train_token_budget(configured: int | None, device: torch.device | str, config: Any) -> int | None:
    """The padded tokens per pass of a run: the recipe's train.token_budget; else on a CPU as many as keep the
    activations within CPU_ACTIVATION_BYTES (model `config`), and the whole batch on other devices (whose memory
    is sized for it and whose kernels want wide batches) or when the config does not say its sizes."""
    if configured is not None:
        return int(configured)
    per_token = activation_bytes_per_token(config)
    if torch.device(device).type != "cpu" or per_token is None:
        return None
    return max(64, CPU_ACTIVATION_BYTES // per_token)


def row_slices(rows: int, width: int, budget: int | None) -> list[tuple[int, int]]:
    """Contiguous row slices [lo, hi) of a batch of `rows` rows padded to `width` tokens, as even as possible,
    each of at most `budget` padded tokens (a row wider than the budget is a slice of its own); one slice when
    the batch fits or `budget` is None."""
    if budget is None or rows * width <= budget:
        return [(0, rows)]
    parts = math.ceil(rows / max(1, budget // max(1, width)))
    return [local_rows(rows, k, parts) for k in range(parts)]


def local_rows(batch_rows: int, rank: int, world: int) -> tuple[int, int]:
    """Contiguous, disjoint slice [lo, hi) of a global batch of `batch_rows` rows for process `rank` of `world`."""
    lo = (batch_rows * rank) // world
    hi = (batch_rows * (rank + 1)) // world
    return lo, hi


@dataclass
class TrainState:
    step: int
    epoch: int
    last_loss: float
    tokens: int = 0
    """Real tokens of the global batches processed by this call (from the resumed step on)."""
    padded_tokens: int = 0
    """Tokens including right padding (what the model computed on)."""


@dataclass(frozen=True)
class TrainSettings:
    """How `train_epochs` optimises: one typed object passed down whole (never unpacked into argument lists).

    autocast: run the forward passes under torch.autocast to this dtype (bf16 matmuls over float32 weights, the
    loss in float32): what a bf16 store trains in on a CPU (faster there than bf16 weights with float32
    adapters, and than float32 on a CPU with AVX512-BF16)."""

    epochs: int
    batch_size: int
    lr: float
    seed: int
    pad_id: int
    weight_decay: float = 0.0
    desc: str = "training"
    schedule: str = "constant"
    device: torch.device | str = "cpu"
    progress: bool = True
    autocast: torch.dtype | None = None
    token_budget: int | None = None
    """Padded tokens per forward/backward pass: a wider batch is computed in row slices (`row_slices`) whose
    gradients add up to the batch's; None = the whole batch at once."""


@dataclass(frozen=True)
class Checkpointing:
    """When and how `train_epochs` checkpoints: on_save(state, optimizer) after each step in save_at; resume =
    {"step": s, "optimizer": state_dict} restores the optimizer and continues at step s."""

    save_at: frozenset[int] | set[int] | None = None
    on_save: Callable[[TrainState, Any], None] | None = None
    resume: dict | None = None


@dataclass(frozen=True)
class _Loop:
    """What the step loop of both paths needs: the settings, the checkpointing, the step to start at."""

    settings: TrainSettings
    checkpoints: Checkpointing
    start: int
    show_progress: bool


def _after_step(state: TrainState, bar: Any, model: Any, optimizer: Any, checkpoints: Checkpointing) -> None:
    """Progress, and a checkpoint when this step is one of save_at (in eval mode, then back to train)."""
    bar.update(1)
    bar.set_postfix(loss=f"{state.last_loss:.3f}", refresh=False)
    if checkpoints.save_at and state.step in checkpoints.save_at and checkpoints.on_save is not None:
        model.eval()
        checkpoints.on_save(state, optimizer)
        model.train()


def steps_per_epoch(n_examples: int, batch_size: int) -> int:
    return math.ceil(n_examples / batch_size)


def epoch_batches(n_examples: int, batch_size: int, seed: int, epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng([seed, epoch, 3]).permutation(n_examples)
    return [order[i : i + batch_size] for i in range(0, n_examples, batch_size)]


def _lr_scheduler(optimizer: torch.optim.Optimizer, schedule: str, total: int) -> Any:
    """The learning-rate schedule over `total` steps: "cosine" decay to 0, otherwise constant."""
    if schedule == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
        )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)


def _resume(optimizer: torch.optim.Optimizer, scheduler: Any, resume: dict | None) -> int:
    """Restore the optimizer and fast-forward the schedule to the resumed step; the step to start at (0: none)."""
    if not resume:
        return 0
    optimizer.load_state_dict(resume["optimizer"])
    start = int(resume["step"])
    with warnings.catch_warnings():
        # Fast-forwarding the schedule to the resumed step: no optimizer step is missing, so torch's
        # "scheduler.step() before optimizer.step()" warning does not apply.
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
        for _ in range(start):
            scheduler.step()
    return start


def _pending_steps(
    n_examples: int, batch_size: int, seed: int, start: int, epochs: int
) -> Iterator[tuple[int, int, np.ndarray]]:
    """(epoch, step number once done, example indices) of every step from `start` on, in training order."""
    spe = steps_per_epoch(n_examples, batch_size)
    for epoch in range(start // spe, epochs):
        batches = epoch_batches(n_examples, batch_size, seed, epoch)
        for b_idx, batch in enumerate(batches):
            if epoch * spe + b_idx < start:
                continue
            yield epoch, epoch * spe + b_idx + 1, batch


def _run_steps(
    model: Any, n_examples: int, optimizer: Any, take_step: Callable[[np.ndarray], tuple[float, int, int]], loop: _Loop
) -> TrainState:
    """The loop both train_epochs paths share: take_step(batch) -> (loss, real tokens, padded tokens) for every
    pending step, with progress and checkpoints after each; the model is in train mode during, eval after."""
    settings, start = loop.settings, loop.start
    spe = steps_per_epoch(n_examples, settings.batch_size)
    model.train()
    state = TrainState(step=start, epoch=start // spe, last_loss=float("nan"))
    bar = tqdm(
        total=spe * settings.epochs,
        initial=start,
        desc=settings.desc,
        disable=not loop.show_progress,
        leave=False,
        mininterval=1.0,
    )
    for epoch, step, batch in _pending_steps(n_examples, settings.batch_size, settings.seed, start, settings.epochs):
        loss, tokens, padded = take_step(batch)
        state = TrainState(step, epoch, loss, state.tokens + tokens, state.padded_tokens + padded)
        _after_step(state, bar, model, optimizer, loop.checkpoints)
    bar.close()
    model.eval()
    return state


def _plain_step(
    model: Any,
    examples: Sequence[TrainExample],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    settings: TrainSettings,
    batch: np.ndarray,
) -> tuple[float, int, int]:
    """One single-process optimizer step on `batch`: (its mean NLL, real tokens, padded tokens computed on).

    A batch wider than settings.token_budget is computed in row slices, each differentiating its summed NLL over
    the batch's scored tokens, so the accumulated gradient is the batch mean's; each slice is cut to its own
    longest row (right padding only ever follows a row's tokens)."""
    ids, attn, mask = collate([examples[i] for i in batch], settings.pad_id)
    slices = row_slices(len(batch), ids.shape[1], settings.token_budget)
    device, autocast = settings.device, settings.autocast
    optimizer.zero_grad(set_to_none=True)
    if len(slices) == 1:
        ids, attn, mask = (t.to(device) for t in (ids, attn, mask))
        with autocast_to(device, autocast):
            loss = batch_mean_nll(model, ids, attn, mask)
        loss.backward()
        mean, padded = float(loss.detach()), ids.numel()
    else:
        n_scored, total, padded = int(mask[:, 1:].sum()), 0.0, 0
        for lo, hi in slices:
            width = int(attn[lo:hi].sum(dim=1).max())
            part = [t[lo:hi, :width].to(device) for t in (ids, attn, mask)]
            with autocast_to(device, autocast):
                nll = summed_nll(model, *part)
            (nll / n_scored).backward()
            total, padded = total + float(nll.detach()), padded + part[0].numel()
        mean = total / n_scored
    optimizer.step()
    scheduler.step()
    return mean, int(attn.sum()), padded


def train_epochs(
    model: Any,
    examples: Sequence[TrainExample],
    settings: TrainSettings,
    checkpoints: Checkpointing | None = None,
    *,
    accelerator: Any | None = None,
) -> TrainState:
    """AdamW over `examples` for `settings.epochs`; calls checkpoints.on_save(state, optimizer) after each step in
    checkpoints.save_at, and resumes from checkpoints.resume (`Checkpointing`).

    accelerator: an `accelerate.Accelerator` of a multi-process launch: data-parallel (DDP) training of this
    one model, each process taking a disjoint slice of every global batch; on_save is called on every
    process (it decides who writes) with the bare `model`. None (the default): the plain one-process loop."""
    checkpoints = checkpoints or Checkpointing()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
    total = steps_per_epoch(len(examples), settings.batch_size) * settings.epochs
    scheduler = _lr_scheduler(optimizer, settings.schedule, total)
    start = _resume(optimizer, scheduler, checkpoints.resume)
    loop = _Loop(settings, checkpoints, start, settings.progress)  # the same for both paths
    if accelerator is not None and accelerator.num_processes > 1:
        try:
            return _train_epochs_ddp(model, examples, accelerator, optimizer, scheduler, loop)
        finally:
            accelerator.free_memory()  # drop accelerate's references to this run's model and optimizer
    take_step = functools.partial(_plain_step, model, examples, optimizer, scheduler, settings)
    return _run_steps(model, len(examples), optimizer, take_step, loop)


def _ddp_step(
    ddp: Any,
    accelerator: Any,
    optimizer: Any,
    scheduler: Any,
    examples: Sequence[TrainExample],
    pad_id: int,
    autocast: torch.dtype | None,
    batch: np.ndarray,
) -> tuple[float, int, int]:
    """One data-parallel optimizer step on the global `batch`: (its mean NLL over all processes, real tokens,
    padded tokens of the whole global batch)."""
    world, rank = accelerator.num_processes, accelerator.process_index
    # Collate the whole global batch (same padding width as one process), then keep this process's rows.
    ids, attn, mask = collate([examples[i] for i in batch], pad_id, "cpu")
    n_global = int(mask[:, 1:].sum())
    tokens, padded = int(attn.sum()), ids.numel()
    lo, hi = local_rows(len(batch), rank, world)
    scale = world / n_global
    if hi == lo:  # fewer rows than processes: run one row with weight 0 so DDP's all-reduce still happens
        lo, hi, scale = 0, 1, 0.0
    ids, attn, mask = (t[lo:hi].to(accelerator.device) for t in (ids, attn, mask))
    with autocast_to(accelerator.device, autocast):
        loss, nll_sum = ddp(ids, attn, mask, scale)
    optimizer.zero_grad(set_to_none=True)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    if scale == 0.0:
        nll_sum = torch.zeros_like(nll_sum)
    global_nll = accelerator.reduce(nll_sum, reduction="sum")
    return float(global_nll) / n_global, tokens, padded


def _train_epochs_ddp(
    model: Any,
    examples: Sequence[TrainExample],
    accelerator: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    loop: _Loop,
) -> TrainState:
    """The loop of train_epochs, data parallel: same global batches, same steps, same checkpoints.

    The scheduler stays on the bare optimizer (accelerate's scheduler wrapper would step it once per process)."""
    ddp, optimizer = accelerator.prepare(_SliceNLL(model), optimizer)
    settings = loop.settings
    take_step = functools.partial(
        _ddp_step, ddp, accelerator, optimizer, scheduler, examples, settings.pad_id, settings.autocast
    )
    loop = dataclasses.replace(loop, show_progress=loop.show_progress and accelerator.is_main_process)
    return _run_steps(model, len(examples), optimizer, take_step, loop)
