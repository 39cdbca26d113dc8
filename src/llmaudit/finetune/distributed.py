"""Data-parallel launches: how many processes a launcher started, and the accelerate Accelerator for them."""

from __future__ import annotations

import os
from typing import Any

import torch


def launched_processes() -> int:
    """How many processes a launcher (accelerate launch, torchrun) started for this job; 1 when run plainly."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def make_accelerator(device: torch.device) -> Any | None:
    """An accelerate.Accelerator when launched with more than one process, else None (the plain path).

    On CPU (device cpu, or no GPU) the processes talk over gloo. mixed_precision="no": the model trains in
    the recipe's model.dtype, as in one process."""
    if launched_processes() <= 1:
        return None
    from accelerate import Accelerator, DistributedDataParallelKwargs

    accelerator = Accelerator(
        cpu=device.type == "cpu",
        mixed_precision="no",
        kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)],
    )
    if accelerator.num_processes <= 1:
        raise RuntimeError(
            f"launched as {launched_processes()} processes (WORLD_SIZE) but accelerate found no distributed setup "
            f"({accelerator.distributed_type}); the processes would all write the same runs"
        )
    return accelerator
