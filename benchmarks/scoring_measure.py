"""The measurements of benchmarks/bench_scoring.py: timed rounds, the matmul peak, and peak memory.

Peak memory of a block of code is measured above what was in use when it started. On CPU: the kernel's
high-water mark of resident memory (VmHWM, reset just before the block through /proc/self/clear_refs) where
Linux allows it, else RSS sampled by a thread; beside it the peak of the C heap in use (glibc mallinfo2,
sampled), i.e. live memory without the allocator's free lists. On GPU: torch.cuda.max_memory_allocated, its
peak reset just before the block.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import torch


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_in_use_reader() -> Callable[[], int] | None:
    """Bytes the C heap has handed out and not taken back (glibc mallinfo2: arenas' in-use chunks plus
    mmapped blocks, all threads), i.e. live memory without the allocator's free lists; None off glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2

    def read() -> int:
        info = mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return read


class PeakMemory:
    """Peak memory of a block above what was in use when it started (see the module docstring): on CPU
    `peak_bytes` is the resident high-water mark and `live_bytes` the peak of the C heap in use (sampled);
    on GPU both are torch.cuda.max_memory_allocated."""

    def __init__(self, device: torch.device, interval_s: float = 0.0005):
        self.device, self.interval_s = device, interval_s
        self.peak_bytes = 0
        self.live_bytes: int | None = None
        self.how = ""

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            self.how = "torch.cuda.max_memory_allocated"
            return self
        self._proc = psutil.Process()
        self._heap = _heap_in_use_reader()
        self._hwm = _reset_high_water_mark()
        self._base = self._proc.memory_info().rss
        self.how = "kernel high-water mark (VmHWM)" if self._hwm else "RSS sampled every 0.5 ms"
        self._heap_base = self._heap() if self._heap else 0
        self._rss_peak, self._heap_peak = self._base, self._heap_base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            if not self._hwm:
                self._rss_peak = max(self._rss_peak, self._proc.memory_info().rss)
            if self._heap:
                self._heap_peak = max(self._heap_peak, self._heap())
            time.sleep(self.interval_s)

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
            self.live_bytes = self.peak_bytes
            return
        self._stop.set()
        self._thread.join()
        rss = _high_water_mark() if self._hwm else max(self._rss_peak, self._proc.memory_info().rss)
        self.peak_bytes = rss - self._base
        if self._heap:
            self.live_bytes = max(self._heap_peak, self._heap()) - self._heap_base


def _high_water_mark() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _reset_high_water_mark() -> bool:
    """Reset the kernel's peak-RSS counter of this process (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _high_water_mark()
        return True
    except OSError:
        return False


def peak_memory_here(fn: Callable[[], Any], device: torch.device) -> tuple[int, int | None, str]:
    """Peak memory of one method in this process. GPU: torch.cuda.max_memory_allocated, reset just before,
    above the allocation before (the other methods' tensors are freed by then; cached blocks do not count).
    CPU (--memory in-process, a quick look only): as PeakMemory measures it, but after the other methods, whose
    freed memory the C allocator may hand back to this one."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with PeakMemory(device) as mem:
        fn()
    return mem.peak_bytes, mem.live_bytes, mem.how + ("" if device.type == "cuda" else ", in process")


def timed_rounds(
    methods: dict[str, Callable[[], list[np.ndarray]]], device: torch.device, repeats: int
) -> dict[str, tuple[list[np.ndarray], float, float]]:
    """Each method's result and median wall and process CPU seconds over `repeats` rounds; within a round
    the methods run one after the other, so drift in the machine's speed affects all of them alike."""
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in methods}
    results: dict[str, list[np.ndarray]] = {}
    for _ in range(repeats):
        for name, fn in methods.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[name].append(time.perf_counter() - t0)
            cpu_seconds[name].append(time.process_time() - c0)
    return {
        name: (results[name], statistics.median(seconds[name]), statistics.median(cpu_seconds[name]))
        for name in methods
    }


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, n: int, tries: int = 5) -> tuple[float, float]:
    """Best FLOP/s of a square torch.mm over `tries`, per wall second and per process CPU second."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, best_cpu = 0.0, 0.0
    for _ in range(tries):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
        best_cpu = max(best_cpu, 2 * n**3 / max(time.process_time() - c0, 1e-9))
    return best, best_cpu
