"""Where computation runs: torch threads, devices, dtypes and the cache directory, in one place.

Threads: every command and job sets torch's intra-op threads through `set_threads` (or temporarily
through `torch_threads`), from one rule: $LLMAUDIT_THREADS if set, else a caller's default (1 for tiny
models, the job's share of the cores on a cluster). The scoring engine's CPU workers stay within
`cpu_parallelism()`.

Compute dtype: `dtype: auto` on a CPU is decided by measuring this machine (`matmul_probe`: float32 and
bfloat16 matrix products timed once and cached under the cache directory, keyed by the CPU and torch), not
assumed: bf16 is several times faster than float32 on CPUs with AVX512-BF16 or AMX and several times slower
on CPUs without. `choose_compute_dtype` turns the probe into a choice with its reason; a run store records
the choice when it is created, so every later process scores it in the same dtype.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_json
from llmaudit.common.threads import THREADS_ENV as THREADS_ENV  # the variable and its reading: light, no torch
from llmaudit.common.threads import env_threads

CACHE_ENV = "LLMAUDIT_CACHE"


class DeviceError(UserError):
    """A device was requested that this machine does not have."""


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
    """CPU threads of a command: $LLMAUDIT_THREADS if set; 1 for a tiny model; otherwise torch's default.

    A tiny model's matrices are too small for intra-op parallelism to pay: its ops are shorter than the thread
    pool's hand-offs, so one thread is faster than several.

    Args:
        tiny_model (bool): the command runs a tiny model.

    Returns:
        int: the threads set.
    """
    return set_threads(env_threads() or (1 if tiny_model else None))


def available_cores() -> int:
    """CPUs in this process's affinity mask (what a cgroup or taskset allows), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_parallelism() -> int:
    """Cores this process may use: $LLMAUDIT_THREADS if set, else the CPUs in its affinity mask."""
    return env_threads() or available_cores()


def threads_per_process(processes: int) -> int:
    """The torch threads each of `processes` local processes gets: this process's cores (`cpu_parallelism`) divided
    among them, at least 1. `jobs.local` starts its children with it and `llmaudit plan` measures each stage on it,
    so the two agree.

    Args:
        processes (int): the processes that share the cores.

    Returns:
        int: the threads of one of them.
    """
    return max(1, cpu_parallelism() // max(1, processes))


def pick_device(requested: str = "auto") -> torch.device:
    """auto = cuda when a GPU is visible, else cpu; cuda without a GPU is an error with the fix."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceError("device=cuda was requested but no CUDA GPU is visible; use device=auto or cpu.")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
"""The quantizer (reference column) that is each compute dtype's full precision."""
PROBE_SHAPE = (2048, 576, 1536)
"""[M, K] @ [K, N] of the matmul probe: a decoder projection of a small LLM over a 2048-token batch."""
BF16_MIN_SPEEDUP = 1.3
"""`auto` picks bfloat16 on a CPU only where its matmuls are at least this much faster than float32: the rest of a
forward pass (norms, activations, softmax statistics in float32) gains less than the matmuls do."""
PROBE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the spelling recipes and run stores use)."""
    return str(dtype).removeprefix("torch.")


def cpu_signature() -> dict[str, str]:
    """What decides the speed of bf16 on this CPU: its model name, the bf16/AMX instruction flags it reports,
    and torch's version and CPU capability (the kernels it dispatches to)."""
    model, flags = "", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "flags": " ".join(f for f in PROBE_FLAGS if f in flags),
        "torch": torch.__version__,
        "capability": str(torch.backends.cpu.get_cpu_capability()),
    }


def matmul_rates(shape: tuple[int, int, int] = PROBE_SHAPE, rounds: int = 5) -> dict[str, float]:
    """GFLOP/s of one [M, K] @ [K, N] torch.mm in float32 and in bfloat16 on the CPU, with the threads torch
    has: interleaved rounds (a busy stretch of a shared machine hits both), median of each."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    operands = {
        dt: (torch.randn(m, k, generator=gen).to(dt), torch.randn(k, n, generator=gen).to(dt))
        for dt in DTYPE_NAMES.values()
        if dt != torch.float16
    }
    seconds: dict[torch.dtype, list[float]] = {dt: [] for dt in operands}
    for a, b in operands.values():  # warm-up: oneDNN primitives, page faults
        torch.mm(a, b)
    for _ in range(rounds):
        for dt, (a, b) in operands.items():
            t0 = time.perf_counter()
            for _ in range(3):
                torch.mm(a, b)
            seconds[dt].append((time.perf_counter() - t0) / 3)
    flop = 2.0 * m * k * n
    return {f"{dtype_name(dt)}_gflops": flop / statistics.median(s) / 1e9 for dt, s in seconds.items()}


def matmul_probe(*, measure: Callable[[], dict[str, float]] = matmul_rates) -> dict[str, Any]:
    """This machine's float32 and bfloat16 matmul rates, measured once per CPU and torch version and cached under
    cache_dir()/machine/ (a few seconds the first time). {"cpu", "flags", "torch", "capability", "threads",
    "float32_gflops", "bfloat16_gflops", "bf16_speedup", "measured", "shape"}."""
    signature = {**cpu_signature(), "threads": torch.get_num_threads()}
    key = hashlib.sha256(json.dumps(signature, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "machine" / f"matmul-{key}.json"
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(cached, dict) and isinstance(cached.get("bf16_speedup"), (int, float)):
            return cached
    rates = measure()
    record = {
        **signature,
        **rates,
        "bf16_speedup": rates["bfloat16_gflops"] / rates["float32_gflops"],
        "shape": list(PROBE_SHAPE),
        "measured": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    with contextlib.suppress(OSError):  # a read-only cache only costs the measurement next time
        atomic_write_json(path, record)
    return record


@dataclass(frozen=True)
class ComputeChoice:
    """The dtype a run store computes in (training and scoring), and why."""

    dtype: torch.dtype
    reason: str

    def to_record(self) -> dict[str, str]:
        return {"dtype": dtype_name(self.dtype), "reason": self.reason}


def choose_compute_dtype(
    requested: str, device: torch.device, *, probe: Callable[[], dict[str, Any]] | None = None
) -> ComputeChoice:
    """`requested` (a recipe's dtype: auto, float32, bfloat16, float16) on `device` as a ComputeChoice.
    auto: bfloat16 on a GPU; on a CPU bfloat16 where this machine's probe measured its matmuls at least
    BF16_MIN_SPEEDUP times faster than float32, else float32."""
    if requested != "auto":
        if requested not in DTYPE_NAMES:
            raise UserError(f"dtype {requested!r} is not one of {['auto', *DTYPE_NAMES]}")
        return ComputeChoice(DTYPE_NAMES[requested], f"{requested}: set by the recipe")
    if device.type == "cuda":
        return ComputeChoice(torch.bfloat16, "auto: bfloat16 on a GPU")
    p = (probe or matmul_probe)()
    speed = f"bf16 matmuls at {p['bf16_speedup']:.2f}x float32 on this CPU ({p['cpu']}; {p['flags'] or 'no bf16 flags'}; measured {p['measured']})"
    if p["bf16_speedup"] >= BF16_MIN_SPEEDUP:
        return ComputeChoice(torch.bfloat16, f"auto: {speed}")
    return ComputeChoice(torch.float32, f"auto: float32, {speed}")


def legacy_dtype(name: str, device: torch.device) -> torch.dtype:
    """The rule of run stores whose manifest records no compute dtype: auto = float32 on a CPU, bfloat16 on a GPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPE_NAMES[name]


def check_can_compute(dtype: torch.dtype, device: torch.device, *, what: str) -> None:
    """Refuse, with the fix, a dtype this device cannot compute in (a GPU without bfloat16)."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise DeviceError(
            f"{what} computes in bfloat16 (recorded when it was created), which this GPU does not support; "
            "score it on a GPU with bfloat16 (Ampere or newer) or on the CPU."
        )


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A config's dtype name to a torch dtype; auto = the machine's choice (`choose_compute_dtype`). A run store
    records its choice once; code that works on a store reads the recorded dtype instead of calling this."""
    return choose_compute_dtype(name, device).dtype


def cache_dir() -> Path:
    """Reusable built assets (the built-in model, converted GGUF models): $LLMAUDIT_CACHE or ~/.cache/llmaudit."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "llmaudit"))
