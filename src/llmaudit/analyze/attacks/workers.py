"""The quantizers attacked in worker processes (`report.processes`) that inherit the job, the table included, by
fork: each task sends only a quantizer's name, never the table.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Protocol

from threadpoolctl import threadpool_limits

from llmaudit.common.runtime import available_cores

__all__ = ["QuantizerAttack", "attack_in_workers"]


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
