"""The process's memory: what it holds now and at its peak, and handing freed memory back to the system.

A long-lived process that frees large tensors does not always shrink: glibc's allocator keeps freed blocks below
its mmap threshold (which grows up to 32 MiB as large blocks are freed) in its heaps for reuse. After a stage that
allocated gigabytes (a fine-tuning run's activations, a scoring unit's quantized copy) the process would hold them
while it waits, or while other processes work (`llmaudit audit`'s parent while two scoring processes run;
docs/results.md, "The verdict audit's memory and time, process by process"). `release_memory` frees what Python no longer references and asks the allocator
to return its free pages (`malloc_trim(0)`); it is a no-op where the C library has no such call.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import resource
import sys
from collections.abc import Callable, Iterator

__all__ = [
    "MMAP_THRESHOLD",
    "ONEDNN_CACHE_ENV",
    "TRAINING_PRIMITIVE_CACHE",
    "bound_allocator",
    "bounded_heap",
    "bounded_primitive_cache",
    "frozen_survivors",
    "peak_rss_mib",
    "release_memory",
    "rss_mib",
]

MMAP_THRESHOLD = 4 << 20
"""Blocks of at least this many bytes get their own mapping, returned to the system when freed. glibc's default
threshold starts at 128 KiB and rises to the largest block freed so far (up to 32 MiB, DYNAMIC_CEILING), after
which a forward pass's float32 temporaries (a few MiB each on a small model) live in the heap and fragment it.
Mapping costs page faults, so only the units of real quantized layers are scored under it (`bounded_heap`); the
measurements behind the value: docs/results.md, "The verdict audit's memory and time, process by process"."""

DYNAMIC_CEILING = 32 << 20
"""The value glibc's dynamic mmap threshold rises to on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX)."""

_M_MMAP_THRESHOLD = -3  # glibc malloc.h


@functools.cache
def _libc_function(name: str, argtypes: tuple, restype: type) -> Callable | None:
    """glibc's function `name` with its C signature, or None (another C library, another system)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
    function.argtypes, function.restype = list(argtypes), restype
    return function


def _malloc_trim() -> Callable | None:
    return _libc_function("malloc_trim", (ctypes.c_size_t,), ctypes.c_int)


def _mallopt() -> Callable | None:
    return _libc_function("mallopt", (ctypes.c_int, ctypes.c_int), ctypes.c_int)


def bound_allocator(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes for this process (MMAP_THRESHOLD says why; `bounded_heap`
    sets and lifts it around one scoring unit). True when set, False where the C library has no mallopt (nothing
    changes there)."""
    opt = _mallopt()
    return opt is not None and opt(_M_MMAP_THRESHOLD, int(threshold)) == 1


@contextlib.contextmanager
def bounded_heap(active: bool = True) -> Iterator[None]:
    """Within: large blocks mapped and returned on free (`bound_allocator` at MMAP_THRESHOLD); after: the threshold
    at DYNAMIC_CEILING, where glibc's own rule would have taken it (the rule cannot be switched back on), and the
    freed memory handed back (`release_memory`). Nothing happens when not `active`."""
    if not active:
        yield
        return
    bound_allocator(MMAP_THRESHOLD)
    try:
        yield
    finally:
        bound_allocator(DYNAMIC_CEILING)
        release_memory()


ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"

TRAINING_PRIMITIVE_CACHE = 64
"""Primitives oneDNN keeps for reuse in a fine-tuning process (its default: 1024). A CPU's bf16 autocast makes a
primitive, with its packed weights, for every distinct shape of matrix product, and the padded lengths of the
training batches vary, so without a bound the process grows run after run, all of it in that cache. The bound was
chosen from the primitive-cache measurements of docs/results.md, section 5."""


@contextlib.contextmanager
def bounded_primitive_cache(capacity: int = TRAINING_PRIMITIVE_CACHE) -> Iterator[None]:
    """Within: oneDNN's primitive cache holds at most `capacity` primitives in this process, unless the user set
    ONEDNN_PRIMITIVE_CACHE_CAPACITY (theirs is kept). oneDNN reads the variable once, when the process makes its
    first primitive, so this bounds a process whose oneDNN work begins within (`llmaudit finetune` and `audit` hold
    it from their start; elsewhere it changes nothing) for the rest of its life, `audit`'s scoring in its own
    process included. After: the variable is gone again, so the processes started later (`audit`'s scoring
    processes) keep oneDNN's default."""
    if ONEDNN_CACHE_ENV in os.environ:
        yield
        return
    os.environ[ONEDNN_CACHE_ENV] = str(int(capacity))
    try:
        yield
    finally:
        os.environ.pop(ONEDNN_CACHE_ENV, None)


def release_memory() -> bool:
    """Collect Python's garbage and return the allocator's free pages to the system. True when the allocator
    could be asked (glibc), False when only the garbage collection ran."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@contextlib.contextmanager
def frozen_survivors() -> Iterator[None]:
    """Within: the objects alive at entry (the imported modules, a process's loaded inputs) are left out of every
    garbage collection (`gc.freeze`, after one collection), so each `release_memory` within walks only the objects
    made since. A scoring process holds hundreds of thousands of such objects, and walking them at every unit
    was most of a unit of the demo's tiny model (docs/results.md, "Where a demo unit's time goes"). Frozen objects
    are still freed when their last reference goes (a model, whose modules form no reference cycle); only cyclic
    garbage among them waits for the exit. After: they are collected again as before (`gc.unfreeze`)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def peak_rss_mib() -> float:
    """The largest resident set of this process's memory so far, in MiB: VmHWM on Linux (the high-water mark of
    this process's own address space), else getrusage (kilobytes on Linux, bytes on macOS). Not getrusage on Linux:
    its maximum survives exec, so a process started from a large parent (llmaudit's scoring processes, spawned by
    `llmaudit audit` after fine-tuning) would report the parent's size as its own."""
    status = _proc_status_kib("VmHWM")
    if status is not None:
        return status / 2**10
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)


def _proc_status_kib(key: str) -> int | None:
    """A "kB" line of /proc/self/status (VmHWM, VmRSS), None where there is none."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_mib() -> float | None:
    """The resident set of this process now, in MiB (VmRSS of /proc/self/status on Linux; None elsewhere)."""
    now = _proc_status_kib("VmRSS")
    return None if now is None else now / 2**10
