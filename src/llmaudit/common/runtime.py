"""Where computation runs: torch threads, devices, dtypes and the cache directory, in one place.

Threads: every command and job sets torch's intra-op threads through `set_threads` (or temporarily
through `torch_threads`), from one rule: $LLMAUDIT_THREADS if set, else a caller's default (1 for tiny
models, the job's share of the cores on a cluster). The scoring engine's CPU workers stay within
`cpu_parallelism()`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import torch

from llmaudit.common.errors import UserError

THREADS_ENV = "LLMAUDIT_THREADS"
CACHE_ENV = "LLMAUDIT_CACHE"


class DeviceError(UserError):
    """A device was requested that this machine does not have."""


def env_threads() -> int | None:
    """$LLMAUDIT_THREADS as a positive int, or None when unset."""
    env = os.environ.get(THREADS_ENV, "").strip()
    if not env:
        return None
    try:
        value = int(env)
    except ValueError:
        raise UserError(
            f"{THREADS_ENV}={env!r} is not a whole number; set it to the CPU threads to use (e.g. 2) or unset it."
        ) from None
    if value < 1:
        raise UserError(f"{THREADS_ENV}={env!r} must be at least 1.")
    return value


def set_threads(n: int | None) -> int:
    """Set torch's intra-op threads to `n` (None: leave torch's default). Returns the count in force."""
    if n:
        torch.set_num_threads(int(n))
    return torch.get_num_threads()


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run a block with `n` intra-op threads (None or 0: unchanged) and restore the caller's count.

    Tiny batched ops run fastest on one thread and oversubscribe a shared CPU with more."""
    previous = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def configure_threads(tiny_model: bool = False) -> int:
    """CPU threads of a command: $LLMAUDIT_THREADS if set; 1 for a tiny model (its matrices are too small
    for intra-op parallelism to pay: measured 3x faster on 1 thread than on 2 on a loaded 2-core machine);
    otherwise torch's default."""
    return set_threads(env_threads() or (1 if tiny_model else None))


def available_cores() -> int:
    """CPUs in this process's affinity mask (what a cgroup or taskset allows), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_parallelism() -> int:
    """Cores this process may use: $LLMAUDIT_THREADS if set, else the CPUs in its affinity mask."""
    return env_threads() or available_cores()


def pick_device(requested: str = "auto") -> torch.device:
    """auto = cuda when a GPU is visible, else cpu; cuda without a GPU is an error with the fix."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceError("device=cuda was requested but no CUDA GPU is visible; use device=auto or cpu.")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A config's dtype name to a torch dtype; auto = bfloat16 on GPU, float32 on CPU (bf16 matmuls are
    about 6x slower than fp32 on CPUs without AMX)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def cache_dir() -> Path:
    """Reusable built assets (the built-in model, converted GGUF models): $LLMAUDIT_CACHE or ~/.cache/llmaudit."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "llmaudit"))
