"""The scoring grid: every (run, checkpoint, quantizer) unit of an experiment, in a fixed order."""

from __future__ import annotations

from dataclasses import dataclass

from llmaudit.config import ExperimentConfig
from llmaudit.quantize import full_precision_reference
from llmaudit.store.losstable import REFERENCE_RUN
from llmaudit.store.run_store import RunStore


@dataclass(frozen=True, order=True)
class Unit:
    """One scoring unit of the grid: the (run, step, quantizer) key, and whether it also scores the pool.

    A unit's loss table, once written, is `UnitFile` (`analyze/store_table.py`): the key and its path.

    Attributes:
        run: the fine-tuning run; `REFERENCE_RUN` for the base model.
        step: the checkpoint's training step (0 for the base model).
        quantizer: the quantizer's registered name.
        final: the unit also scores the pool: a run's final checkpoint (what the attacks read), or every
            checkpoint with `score.pool_trajectory`.
    """

    run: int
    step: int
    quantizer: str
    final: bool


def grid_units(cfg: ExperimentConfig, steps_per_run: dict[int, list[int]]) -> list[Unit]:
    """The scoring grid for given trajectories, in a fixed order (the basis of --shard I/N).

    The base model comes once (on the first full-precision quantizer) and, with score.matched_base, under every other
    quantizer too (the quantization-matched references); then per run, per checkpoint (all, or the final one with
    score.trajectory=final), every quantizer. A run's final checkpoint also scores the pool.

    Args:
        cfg: the experiment's config (its `score` section).
        steps_per_run: {run: its checkpoints' steps}.

    Returns:
        The units, in grid order.
    """
    units: list[Unit] = []
    quantizers = list(cfg.score.quantizers)
    if cfg.score.score_base:
        reference = full_precision_reference(quantizers) or "fp32"
        units.append(Unit(REFERENCE_RUN, 0, reference, True))
        if cfg.score.matched_base:
            units += [Unit(REFERENCE_RUN, 0, q, True) for q in quantizers if q != reference]
    for run in sorted(steps_per_run):
        steps = sorted(steps_per_run[run])
        chosen = steps if cfg.score.trajectory == "all" else steps[-1:]
        units += [
            Unit(run, step, q, step == steps[-1] or cfg.score.pool_trajectory) for step in chosen for q in quantizers
        ]
    return units


def with_store_reference(cfg: ExperimentConfig, store: RunStore) -> ExperimentConfig:
    """The config with the placeholder quantizer `full` named for the store's dtype (`RunStore.reference_name`).

    Args:
        cfg: the experiment's config.
        store: its run store.

    Returns:
        `cfg` itself when it has no `full` or the store does not exist yet, else a copy with the name resolved.
    """
    if "full" not in cfg.score.quantizers or not store.exists():
        return cfg
    return cfg.model_copy(update={"score": cfg.score.with_reference(store.reference_name())})


def plan_units(cfg: ExperimentConfig, store: RunStore) -> list[Unit]:
    """Every scoring unit of the experiment's finished runs (`grid_units` of their recorded trajectories).

    Args:
        cfg: the experiment's config.
        store: its run store.

    Returns:
        The units of the runs that are done, in grid order.
    """
    cfg = with_store_reference(cfg, store)
    return grid_units(cfg, {run: store.checkpoints(run) for run in range(cfg.train.runs) if store.run_done(run)})
