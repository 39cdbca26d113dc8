"""The `llmaudit score` stage: check the quantizers and the store, then score every unit of a shard
that is not done.

A unit is done when its loss table is on disk AND passes `verify_store` (readable, complete for its
samples, consistent with the manifest, finite); a unit that fails is moved to scores/quarantine/ and
scored again. Each unit is claimed with a file lock before it is scored and checked once more after the
claim, so any number of processes (local jobs, SLURM array tasks) can score one store at once and no unit
is ever scored twice; every unit scored is appended to scores/worklog.jsonl.

Work is done checkpoint by checkpoint: a process claims a checkpoint's group of units (a second lock), loads
and merges the checkpoint once, computes what its quantizers share once (GPTQ's calibration), and scores every
quantizer of it; once no group is free it helps with the units left in groups other processes hold.

Every unit of a store is scored in one dtype (`RunStore.scoring_choice`, recorded by the first `score`): the
checkpoint is merged and quantized in float32, then its parameters are cast to that dtype. `fp32` listed in a
bfloat16 store is the exception that proves the rule: it is scored in float32, as its name says.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from llmaudit.common.memory import frozen_survivors, peak_rss_mib, release_memory, rss_mib
from llmaudit.common.runtime import SHORT_DTYPE_NAMES, dtype_name, pick_device
from llmaudit.config import ExperimentConfig
from llmaudit.models.loading import load_tokenizer
from llmaudit.quantize import get_quantizer
from llmaudit.quantize.base import Quantizer
from llmaudit.score import llama_cpp_engine

# is_identity and token_budget: also imported from here (llmaudit.planning.plan, the benchmarks)
from llmaudit.score.unit_scoring import (
    CheckpointWork,
    ScoreInputs,
    ScoringError,
    load_checkpoint,
    load_inputs,
    make_utility,
    score_unit,
    unit_dtype,
    unit_examples,
)
from llmaudit.score.unit_scoring import is_identity as is_identity
from llmaudit.score.unit_scoring import token_budget as token_budget
from llmaudit.score.utility import work_fields
from llmaudit.store.integrity import check_unit_file, quarantine, verify_store
from llmaudit.store.locks import claim
from llmaudit.store.losstable import write_loss_table
from llmaudit.store.markers import clear_stale_markers, running_marker, unit_marker_path
from llmaudit.store.run_store import RunStore, StoreError
from llmaudit.store.shards import shard_items
from llmaudit.store.units import Unit, plan_units
from llmaudit.store.worklog import append_work

log = logging.getLogger(__name__)


def check_recorded_options(store: RunStore, quantizers: dict[str, Quantizer]) -> None:
    """Check that a quantizer name means one set of options in a store.

    A quantizer's units scored earlier must not be mixed with units scored under other options (the report would show
    them as one quantizer). A key that a record lacks reads as the value that made its units (`legacy_options`).

    Args:
        store (RunStore): the run store.
        quantizers (dict[str, Quantizer]): the quantizers to score, by name.

    Raises:
        StoreError: a quantizer's recorded options differ from the recipe's; the message says which.
    """
    for name, q in quantizers.items():
        record = store.quantizer_record(name)  # parsed by its schema (a StoreError names the file and the field)
        if record is None:
            continue
        why = q.recorded_options_mismatch(record.get("options") or {})
        if why:
            raise StoreError(f"{store.root}: {why}")


def check_quantizers(cfg: ExperimentConfig, device: torch.device) -> dict[str, Quantizer]:
    """Build every quantizer and reject impossible requests before any work starts.

    Args:
        cfg (ExperimentConfig): the experiment's configuration.
        device (torch.device): the device the units are scored on.

    Returns:
        dict[str, Quantizer]: the checked quantizers, by name.
    """
    quantizers = {}
    for name in cfg.score.quantizers:
        opts = dict(cfg.score.quantizer_options.get(name, {}))
        opts.setdefault("device", device.type)
        probe = get_quantizer(name)
        if probe.calibrated:  # the recipe's calibration source, unless the quantizer's own option says
            opts.setdefault("calibration_source", cfg.score.calibration_source)
        if probe.family == "gguf":  # the recipe's engine, unless the quantizer's own option says
            opts.setdefault("engine", cfg.score.engine)
        q = get_quantizer(name, **opts)
        q.check()
        quantizers[name] = q
    return quantizers


def _todo(
    cfg: ExperimentConfig, store: RunStore, shard: tuple[int, int] | None, *, deep: bool, echo
) -> tuple[list[Unit], list[Unit]]:
    """(the units of this shard, those not done). Store problems are refused; failed units are moved aside."""
    unfinished = [r for r in range(cfg.train.runs) if not store.run_done(r)]
    if shard is not None and shard[1] > 1 and unfinished:
        # The round-robin split is over the full grid; with runs missing, shards would disagree on it.
        raise ScoringError(
            f"score --shard {shard[0]}/{shard[1]}: runs {unfinished} of {store.root} are not finished, so the "
            "scoring grid is incomplete. Finish `llmaudit finetune` first (`llmaudit status` shows what is missing)."
        )
    verdict = verify_store(store, cfg, deep=deep)
    if verdict.problems:
        raise StoreError(verdict.message(store))
    mine = shard_items(plan_units(cfg, store), shard)
    for unit, why in verdict.invalid_units.items():
        if unit in set(mine):
            moved = quarantine(store, store.unit_path(unit.run, unit.step, unit.quantizer))
            echo(
                f"[score] {unit_name(unit)} failed its check ({why.removeprefix('invalid: ')}); moved to {moved} and scored again"
            )
    todo = [u for u in mine if not verdict.done(u)]
    clear_stale_markers(unit_marker_path(store, u.run, u.step, u.quantizer) for u in mine if u not in set(todo))
    return mine, todo


def _stale_units(cfg: ExperimentConfig, store: RunStore, mine: list[Unit], todo: list[Unit]) -> set[Unit]:
    """Finished units of this shard whose utility columns differ from what the recipe asks for."""
    utility = make_utility(cfg, store, load_tokenizer(cfg.model))
    waiting = set(todo)
    return {u for u in mine if u not in waiting and utility.stale(u, store.unit_path(u.run, u.step, u.quantizer))}


def unit_name(unit: Unit) -> str:
    """A unit's name in logs: base or run, step, quantizer.

    Args:
        unit (Unit): the scoring unit.

    Returns:
        str: e.g. "run 0/step 8/int8".
    """
    return f"{'base' if unit.run < 0 else f'run {unit.run}'}/step {unit.step}/{unit.quantizer}"


def _score_claimed_unit(inputs: ScoreInputs, unit: Unit, path: Path, work: CheckpointWork) -> CheckpointWork:
    """Score a unit this process has claimed into `path` (under its running marker) and log it in the worklog.

    work: the checkpoint the previous unit used, reused when this unit is on the same checkpoint; returns the one
    this unit used. The log charges a unit its own seconds plus the shared work it paid for (loading the checkpoint,
    a shared calibration), so the logged seconds add up to the wall time."""
    store = inputs.store
    with running_marker(unit_marker_path(store, unit.run, unit.step, unit.quantizer)):
        start = time.time()
        work = load_checkpoint(inputs, work, unit)
        quantizer = inputs.quantizers[unit.quantizer]
        engine = llama_cpp_engine.engine_of(quantizer)
        scorer = llama_cpp_engine.score_unit if engine == llama_cpp_engine.LLAMA_CPP else score_unit
        table, uwork = scorer(inputs, unit, work)
        metadata = llama_cpp_engine.engine_metadata(quantizer)
        write_loss_table(table, path, metadata=metadata | (inputs.utility.metadata() if uwork is not None else {}))
        examples = unit_examples(inputs.val, inputs.pool, unit)
        append_work(
            store.worklog_path,
            {
                "stage": "score",
                "run": unit.run,
                "step": unit.step,
                "quantizer": unit.quantizer,
                "samples": len(examples),
                "tokens": sum(len(e.input_ids) for e in examples),
                "dtype": dtype_name(unit_dtype(quantizer, inputs.dtype)),
                "engine": engine,
                "shared_seconds": round(work.take_paid(), 3),
                "seconds": round(time.time() - start, 3),
                **work_fields(uwork),
                **_memory_fields(),
            },
        )
    return work


def _memory_fields() -> dict[str, float]:
    """The scoring process's memory once a unit is written and its copies freed: what it holds ("rss_mib") and
    its peak so far ("peak_rss_mib"), so the work log shows which units set the process's peak."""
    release_memory()
    now = rss_mib()
    return {"peak_rss_mib": round(peak_rss_mib()), **({"rss_mib": round(now)} if now is not None else {})}


def checkpoint_groups(units: list[Unit]) -> list[list[Unit]]:
    """Units grouped by checkpoint (run, step), in the grid's order: what one process scores together.

    Args:
        units (list[Unit]): the units to score.

    Returns:
        list[list[Unit]]: the units of each checkpoint.
    """
    groups: dict[tuple[int, int], list[Unit]] = {}
    for unit in units:
        groups.setdefault((unit.run, unit.step), []).append(unit)
    return list(groups.values())


@dataclass
class _Progress:
    scored: int = 0
    others: list[Unit] = field(default_factory=list)
    decided: set[Unit] = field(default_factory=set)
    stale: set[Unit] = field(default_factory=set)
    """Finished final units to score again (`--refresh-utility`) when their utility columns are still out of date."""


def _score_group(
    inputs: ScoreInputs, group: list[Unit], work: CheckpointWork, ids, progress: _Progress, bar
) -> CheckpointWork:
    """Every unit of one checkpoint that no other process holds or has finished."""
    store, (pool_ids, val_ids) = inputs.store, ids
    for unit in group:
        if unit in progress.decided:
            continue
        path = store.unit_path(unit.run, unit.step, unit.quantizer)
        with claim(store.lock_path("units", *path.relative_to(store.scores_dir).with_suffix("").parts)) as mine_now:
            done = path.exists() and check_unit_file(path, unit, pool_ids, val_ids, inputs.masks) is None
            if not mine_now or (done and not (unit in progress.stale and inputs.utility.stale(unit, path))):
                progress.others.append(unit)  # another process holds it, or finished it since we looked
                progress.decided.add(unit)
                bar.update(1)
                continue
            work = _score_claimed_unit(inputs, unit, path, work)
            progress.scored += 1
        progress.decided.add(unit)
        bar.update(1)
    return work


def _score_todo(inputs: ScoreInputs, todo: list[Unit], bar, stale: set[Unit]) -> _Progress:
    """Claim checkpoint groups no other process holds and score them; then help with what is left of the groups
    that others hold (their units are claimed one by one, so nothing is scored twice)."""
    store, progress, work = inputs.store, _Progress(stale=set(stale)), CheckpointWork()
    ids = ([e.sample_id for e in inputs.pool], [e.sample_id for e in inputs.val])
    groups = checkpoint_groups(todo)
    for first_pass in (True, False):
        for group in groups:
            if all(u in progress.decided for u in group):
                continue
            lock = store.lock_path("groups", f"run-{group[0].run:+04d}-step-{group[0].step:06d}")
            with claim(lock) as held:
                if first_pass and not held:
                    continue
                work = _score_group(inputs, group, work, ids, progress, bar)
    return progress


def _counts(units: int, done: _Progress | None, seconds: float, dtype: torch.dtype) -> dict[str, Any]:
    """score()'s result: {"units", "scored", "taken_by_others", "seconds", "dtype"}."""
    return {
        "units": units,
        "scored": done.scored if done else 0,
        "taken_by_others": len(done.others) if done else 0,
        "seconds": seconds,
        "dtype": dtype_name(dtype),
    }


def check_scoring(cfg: ExperimentConfig, store: RunStore) -> tuple[ExperimentConfig, torch.device, Any, list]:
    """What `score` checks before it touches a file: the device, the quantizers, the store and the options it
    recorded; also what a parent checks before it starts scoring processes (`jobs.local.score_in_processes`).

    Args:
        cfg: the experiment's configuration.
        store: the run store.

    Returns:
        (cfg with its reference quantizer named for the scoring dtype, the device, the store's `ComputeChoice`, the
        quantizers).

    Raises:
        UserError: a device, quantizer, store or recorded option is refused.
    """
    device = pick_device(cfg.score.device)
    check_quantizers(cfg.model_copy(update={"score": cfg.score.with_reference("fp32")}), device)  # before any file
    choice = store.scoring_choice(cfg.score.dtype, device)
    cfg = cfg.model_copy(update={"score": cfg.score.with_reference(SHORT_DTYPE_NAMES[choice.dtype])})
    quantizers = check_quantizers(cfg, device)
    check_recorded_options(store, quantizers)
    return cfg, device, choice, quantizers


def score(
    cfg: ExperimentConfig,
    store: RunStore,
    *,
    shard: tuple[int, int] | None = None,
    progress: bool = True,
    echo=print,
    deep_verify: bool = False,
    refresh_utility: bool = False,
) -> dict[str, Any]:
    """Score every unit of this shard that is not done.

    Args:
        cfg (ExperimentConfig): the experiment's configuration.
        store (RunStore): the run store.
        shard (tuple[int, int] | None): (i, n): this process scores share i of n of the units; None: all of them.
        progress (bool): show a progress bar.
        echo (Callable): where progress lines go.
        deep_verify (bool): verify the store in full (`verify_store(deep=True)`) before scoring.
        refresh_utility (bool): also rescore the finished final units whose utility columns were made with other
            settings than the recipe's, or without them.

    Returns:
        dict[str, Any]: counts and timings {"units", "scored", "taken_by_others", "seconds", "dtype"}.
    """
    cfg, device, choice, quantizers = check_scoring(cfg, store)
    store.update_config(cfg)
    mine, todo = _todo(cfg, store, shard, deep=deep_verify, echo=echo)
    stale = _stale_units(cfg, store, mine, todo) if refresh_utility else set()
    if stale:
        echo(f"[score] {len(stale)} finished final unit(s) lack the recipe's utility columns: scoring them again")
        todo = [u for u in mine if u in set(todo) | stale]
    echo(
        f"[score] {store.root}: {len(plan_units(cfg, store))} unit(s) in the grid, {len(mine)} in this shard, "
        f"{len(mine) - len(todo)} already scored, {len(todo)} to do on {device} in {dtype_name(choice.dtype)}"
    )
    if not todo:
        return _counts(len(mine), None, 0.0, choice.dtype)
    inputs = load_inputs(cfg, store, device, quantizers, choice.dtype)
    t0 = time.time()
    bar = tqdm(total=len(todo), desc="scoring", disable=not progress, mininterval=1.0)
    with frozen_survivors():  # the imports and inputs: each unit's release_memory then skips them
        done = _score_todo(inputs, todo, bar, stale)
    bar.close()
    seconds = time.time() - t0
    echo(
        f"[score] scored {done.scored} unit(s) in {seconds:.1f}s"
        + (f"; {len(done.others)} unit(s) were taken by another process" if done.others else "")
    )
    return _counts(len(mine), done, seconds, choice.dtype)
