"""The quantizers attacked in worker processes (`report.processes`) that inherit the job, the table included, by
fork: each task sends only a quantizer's name, never the table. Likewise one block of the analysis computed in a
forked process beside the rest (`forked_beside`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol

from threadpoolctl import threadpool_limits

from llmaudit.common.runtime import available_cores

__all__ = ["QuantizerAttack", "attack_in_workers", "forked_beside"]


class QuantizerAttack(Protocol):
    """What attacking each quantizer reads besides its name (`evaluate.QuantizerJob`)."""

    def attack(self, quantizer: str) -> tuple:
        """Attack one quantizer.

        Args:
            quantizer (str): the quantizer's name.
        Returns:
            tuple: the result of attacking it (`evaluate.QuantizerJob.attack`).
        """


class _ForkedWorker:
    """A worker process's job, set by the pool's initializer (`start`) from the job the worker inherited by fork,
    never pickled. The parent process never sets it."""

    job: QuantizerAttack | None = None

    @classmethod
    def start(cls, job: QuantizerAttack, threads: int) -> None:
        """Keep the job and size the worker's BLAS and OpenMP pools to its share of the cores."""
        cls.job = job
        threadpool_limits(limits=threads)

    @classmethod
    def attack(cls, quantizer: str) -> tuple:
        """The worker's job's `attack` of one quantizer."""
        return cls.job.attack(quantizer)


def attack_in_workers(job: QuantizerAttack, quantizers: Sequence[str], processes: int = 1) -> list[tuple]:
    """`job.attack` of every quantizer, in order, in this process or spread over worker processes.

    With processes > 1 and the fork start method, the workers inherit the job (the table included) by fork without
    copying or pickling it; each quantizer's numbers depend on its own rows and the seed only, so they are those of
    one process. Each worker's BLAS and OpenMP pools get its share of the cores (workers x threads <= cores).

    Args:
        job: what every quantizer's attack reads.
        quantizers: the quantizers attacked.
        processes: at most this many worker processes (1: none).

    Returns:
        One `job.attack(quantizer)` per quantizer, in the order given.

    Raises:
        Exception: what a quantizer's attack raised, as itself.
    """
    workers = min(processes, len(quantizers))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [job.attack(q) for q in quantizers]
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_ForkedWorker.start,
        initargs=(job, max(1, available_cores() // workers)),
    ) as pool:
        return list(pool.map(_ForkedWorker.attack, quantizers))


class _ForkedCall:
    """The call a `forked_beside` process makes, inherited by fork through the pool's initializer, never pickled."""

    call: Callable[[], Any] | None = None

    @classmethod
    def start(cls, call: Callable[[], Any], threads: int) -> None:
        """Keep the call and size the process's BLAS and OpenMP pools to its share of the cores."""
        cls.call = call
        threadpool_limits(limits=threads)

    @classmethod
    def run(cls) -> Any:
        """The inherited call's result (pickled back to the parent)."""
        return cls.call()


@contextlib.contextmanager
def forked_beside(call: Callable[[], Any], processes: int = 1) -> Iterator[Callable[[], Any]]:
    """Compute `call()` in a forked process while the block runs in this one; yields what returns its result.

    The process inherits what `call` reads (a table included) by fork, without pickling it; only the result comes
    back. `call` must depend on its inputs and seeds alone (no state the block changes), so its result is the one
    this process would compute. With processes <= 1, or without the fork start method, `call` runs here when its
    result is asked for.

    Args:
        call: the work, without arguments.
        processes: the processes the analysis may use (`report.processes`); the fork needs at least 2.

    Yields:
        A function returning `call()`'s result (raising what it raised), to be called within the block.
    """
    if processes <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        yield call
        return
    with ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("fork"),
        initializer=_ForkedCall.start,
        initargs=(call, max(1, available_cores() // 2)),
    ) as pool:
        future = pool.submit(_ForkedCall.run)
        yield future.result
