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

import copy
import functools
import gc
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_json, read_json
from llmaudit.common.runtime import SHORT_DTYPE_NAMES, dtype_name, pick_device
from llmaudit.config import ExperimentConfig
from llmaudit.data.tokenize import Example, tokenize_records
from llmaudit.models.layers import cast_parameters
from llmaudit.models.loading import import_gptqmodel_quietly, load_base_model, load_checkpoint_model, load_tokenizer
from llmaudit.quantize import get_quantizer
from llmaudit.quantize.base import Quantizer
from llmaudit.quantize.calibration import read_calibration_file
from llmaudit.quantize.given import GivenFile, load_given
from llmaudit.score.calibration import calibration_record, calibration_texts, given_file
from llmaudit.score.engine import TokenScores, score_examples, weights_digest
from llmaudit.score.utility import UnitUtility, UtilityWork, nonfinite_divergence, work_fields
from llmaudit.store.integrity import check_checkpoint_dir, check_unit_file, quarantine, verify_store
from llmaudit.store.locks import claim
from llmaudit.store.losstable import REFERENCE_RUN, write_loss_table
from llmaudit.store.markers import clear_stale_markers, running_marker, unit_marker_path
from llmaudit.store.run_store import RunStore, StoreError
from llmaudit.store.shards import shard_items
from llmaudit.store.units import Unit, plan_units
from llmaudit.store.worklog import append_work

log = logging.getLogger(__name__)


class ScoringError(UserError):
    """A unit cannot be scored (a quantized model that diverges, an unfinished grid)."""


def _rows(
    unit: Unit,
    examples: list[Example],
    scores: list[TokenScores],
    members: set[str],
    point_id: str,
    extra: dict[str, list] | None = None,
) -> pd.DataFrame:
    rows = {
        "run": unit.run,
        "checkpoint": unit.step,
        "quantizer": unit.quantizer,
        "sample_id": [e.sample_id for e in examples],
        "split": [e.split for e in examples],
        "member": [e.sample_id in members for e in examples],
        "loss": [s.loss for s in scores],
        "n_tokens": [len(s.token_losses) for s in scores],
        "token_losses": [s.token_losses for s in scores],
        "zlib_bytes": [e.zlib_bytes for e in examples],
        "point_id": point_id,
    }
    if scores and scores[0].vocab_mean is not None:
        rows["token_vocab_mean"] = [s.vocab_mean for s in scores]
        rows["token_vocab_std"] = [s.vocab_std for s in scores]
    if scores and scores[0].top1 is not None:
        rows["token_top1"] = [s.top1 for s in scores]
    for name, values in (extra or {}).items():  # utility columns of the validation rows; None on the pool rows
        rows[name] = list(values) + [None] * (len(examples) - len(values))
    return pd.DataFrame(rows)


def _record_quantizer(store: RunStore, quantizer: Quantizer, qmodel: Any, calibration: dict | None = None) -> None:
    """Once per quantizer: its options, effective bits per weight and model size (for the report), and for a calibrated
    quantizer where its calibration text came from (`calibration_record`)."""
    path = store.quantizer_info_path(quantizer.name)
    if path.exists():
        return
    record = {
        "name": quantizer.name,
        "family": quantizer.family,
        "bits": quantizer.bits,
        "effective_bits": quantizer.effective_bits(qmodel),
        "model_size_bytes": quantizer.model_size_bytes(qmodel),
        "options": quantizer.options,
    }
    if calibration is not None:
        record["calibration"] = calibration
    atomic_write_json(path, record)


def check_recorded_options(store: RunStore, quantizers: dict[str, Quantizer]) -> None:
    """A quantizer name means one set of options in a store: its units scored earlier must not be mixed
    with units scored under other options (the report would show them as one quantizer). A key that a record
    lacks (written before the option existed) reads as the value that made its units (`legacy_options`)."""
    for name, q in quantizers.items():
        path = store.quantizer_info_path(name)
        if not path.exists():
            continue
        recorded = read_json(path, what="quantizer record").get("options") or {}
        why = q.recorded_options_mismatch(recorded)
        if why:
            raise StoreError(f"{store.root}: {why}")


def check_quantizers(cfg: ExperimentConfig, device: torch.device) -> dict[str, Quantizer]:
    """Build every quantizer and reject impossible requests before any work starts."""
    quantizers = {}
    for name in cfg.score.quantizers:
        opts = dict(cfg.score.quantizer_options.get(name, {}))
        opts.setdefault("device", device.type)
        if get_quantizer(name).calibrated:  # the recipe's calibration source, unless the quantizer's own option says
            opts.setdefault("calibration_source", cfg.score.calibration_source)
        q = get_quantizer(name, **opts)
        q.check()
        quantizers[name] = q
    return quantizers


@dataclass
class _Inputs:
    """What every unit of one `score` call shares, loaded once."""

    cfg: ExperimentConfig
    store: RunStore
    device: torch.device
    quantizers: dict[str, Quantizer]
    tok: Any
    pool_records: list[dict]
    pool: list[Example]
    val: list[Example]
    masks: np.ndarray
    base: Any
    dtype: torch.dtype
    """The store's scoring dtype (RunStore.scoring_choice)."""
    utility: UnitUtility
    calibration_file: tuple[list[str], str] | None = None
    """(texts, sha256) of score.calibration_file when a quantizer calibrates on it."""


def _load_inputs(
    cfg: ExperimentConfig, store: RunStore, device: torch.device, quantizers: dict, dtype: torch.dtype
) -> _Inputs:
    tok = load_tokenizer(cfg.model)
    pool_records = store.read_records("pool")
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    pool = tokenize_records(tok, pool_records, "pool", **kw)
    val = tokenize_records(tok, store.read_records("val"), "val", **kw)
    # On a CPU checkpoints are merged and quantized in float32 whatever the scoring dtype (the quantizers' math is
    # float32 there); on a GPU the base is loaded in the scoring dtype, which its kernels compute in.
    base = load_base_model(cfg.model, device, dtype=torch.float32 if device.type == "cpu" else dtype)
    for quantizer in quantizers.values():  # group sizes and scopes against the real layers, before any unit
        quantizer.check(base)
    import_gptqmodel_quietly()  # peft (adapters) and the GPTQ backend import it
    utility = make_utility(cfg, store, tok, val)
    on_file = any(q.calibrated and q.options["calibration_source"] == "file" for q in quantizers.values())
    calibration_file = read_calibration_file(cfg.score.calibration_file) if on_file else None
    return _Inputs(
        cfg,
        store,
        device,
        quantizers,
        tok,
        pool_records,
        pool,
        val,
        store.membership(),
        base,
        dtype,
        utility,
        calibration_file,
    )


def make_utility(cfg: ExperimentConfig, store: RunStore, tok: Any, val: list[Example] | None = None) -> UnitUtility:
    """The utility columns' plan of this store (val: its tokenised validation records, tokenised here if None)."""
    records = store.read_records("val")
    if val is None:
        val = tokenize_records(tok, records, "val", include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    return UnitUtility(cfg, store, tok, val, records)


def _checkpoint_model(inputs: _Inputs, run: int, step: int) -> Any:
    """The fine-tuned model of (run, step): the base with the LoRA adapter merged, or a full checkpoint."""
    store = inputs.store
    directory = store.checkpoint_dir(run, step)
    record = store.done_record(run) if store.manifest().get("imported") is None else None
    expected = None
    if record is not None:
        expected = dict(zip((str(s) for s in record["steps"]), record.get("adapter_sha256") or [], strict=False)).get(
            str(step)
        )
    why = check_checkpoint_dir(store, run, step, directory, expected_sha256=expected, deep=True)
    if why:
        raise StoreError(f"{directory}: {why}; `llmaudit status {store.root}` shows what is missing.")
    return load_checkpoint_model(inputs.base, directory, inputs.device)


@dataclass
class CheckpointWork:
    """What the units of one checkpoint share inside one process: the merged model, and the work that depends only
    on it (GPTQ's Hessians, shared by every bit width and group size with the same calibration), done on first use.
    `paid` holds the seconds of shared work not yet charged to a unit (the work log charges the unit that paid)."""

    key: tuple[int, int] | None = None
    model: Any = None
    shared: dict[Any, Any] = field(default_factory=dict)
    paid: float = 0.0

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        if key not in self.shared:
            t0 = time.time()
            self.shared[key] = make()
            self.paid += time.time() - t0
        return self.shared[key]

    def take_paid(self) -> float:
        paid, self.paid = self.paid, 0.0
        return paid

    def reference(self, dtype: torch.dtype) -> Any:
        """The checkpoint itself in `dtype`: the store's full precision, and the model the KL divergence of every
        quantizer of this checkpoint is measured against (a copy cast once when `dtype` is not the merged model's)."""
        if next(self.model.parameters()).dtype == dtype:
            return self.model
        return self.get(("reference", str(dtype)), lambda: cast_parameters(copy.deepcopy(self.model), dtype))


def unit_dtype(quantizer: Quantizer, store_dtype: torch.dtype) -> torch.dtype:
    """The dtype a unit is scored in: the store's, except `fp32`, which is float32 (full precision as named) in a
    store that scores in a half-precision dtype."""
    return torch.float32 if quantizer.family == "full" and quantizer.name == "fp32" else store_dtype


def _calibration_kwargs(inputs: _Inputs, quantizer: Quantizer, work: CheckpointWork, run: int) -> dict[str, Any]:
    """Calibration of a calibrated quantizer's unit (`calibration_texts`); GPTQ's Hessians are computed once per
    checkpoint and calibration, and shared by the GPTQ quantizers that calibrate alike."""
    kwargs: dict[str, Any] = {"tokenizer": inputs.tok, "calibration_texts": calibration_texts(inputs, quantizer, run)}
    key = quantizer.calibration_key() if quantizer.family == "gptq" else None
    if key is not None:  # Hessians of the unquantized checkpoint: the same for every bit width and group size
        shared = ("gptq", json.dumps(key, sort_keys=True))
        kwargs["hessians"] = work.get(shared, lambda: quantizer.collect_hessians(work.model, **kwargs))
    return kwargs


def is_identity(quantizer: Quantizer, dtype: torch.dtype) -> bool:
    """The quantizer that is the checkpoint itself in the unit's dtype (bf16 of a bf16 store, fp32 of a float32
    one): no copy, and its own pass is the KL reference of the checkpoint's other units."""
    return quantizer.family == "full" and getattr(quantizer, "dtype", None) == dtype


def _quantized(inputs: _Inputs, quantizer: Quantizer, work: CheckpointWork, unit: Unit, given: GivenFile | None) -> Any:
    """The unit's model: the checkpoint quantized (float32 math on a CPU), or the user's own quantized model of it
    (`given`) scored as given, its parameters in the unit's dtype."""
    dtype, run = unit_dtype(quantizer, inputs.dtype), unit.run
    if is_identity(quantizer, dtype):
        return work.reference(dtype)
    if given is not None:
        return cast_parameters(load_given(given, copy.deepcopy(work.model), inputs.device), dtype)
    kwargs = _calibration_kwargs(inputs, quantizer, work, run) if quantizer.calibrated else {}
    return cast_parameters(quantizer.quantize_model(copy.deepcopy(work.model), **kwargs), dtype)


def unit_examples(val: list[Example], pool: list[Example], unit: Unit) -> list[Example]:
    """What a unit scores: the validation samples, plus the pool at a run's final checkpoint (attacks)."""
    return val + (pool if unit.final else [])


def token_budget(cfg: ExperimentConfig, device: torch.device) -> int:
    """Padded tokens per batch: the recipe's, else 2048 on CPU (cache-sized batches), 16384 on GPU."""
    return cfg.score.token_budget or (16384 if device.type == "cuda" else 2048)


def _engine(inputs: _Inputs, model: Any, examples: list[Example], hidden_hook: Any = None) -> list[TokenScores]:
    cfg, device = inputs.cfg, inputs.device
    return score_examples(
        model,
        [(e.input_ids, e.loss_mask) for e in examples],
        pad_id=inputs.tok.pad_token_id,
        token_budget=token_budget(cfg, device),
        head_chunk=cfg.score.head_chunk,
        vocab_stats=cfg.score.vocab_stats,
        device=device,
        cpu_workers=cfg.score.cpu_workers,
        hidden_hook=hidden_hook,
    )


def score_unit(inputs: _Inputs, unit: Unit, work: CheckpointWork) -> tuple[pd.DataFrame, UtilityWork | None]:
    """The loss table of one unit: its checkpoint (`work.model`) quantized, scored on its samples; at a run's
    final checkpoint with the utility columns of its validation rows (llmaudit.score.utility), measured against
    the checkpoint in the store's dtype (`work.reference`), and what they cost."""
    quantizer = inputs.quantizers[unit.quantizer]
    given = given_file(inputs.store, unit)
    qmodel = _quantized(inputs, quantizer, work, unit, given)
    if given is None:  # the record describes llmaudit's quantization; a user's own file is recorded at import
        _record_quantizer(inputs.store, quantizer, qmodel, calibration_record(inputs, quantizer))
    examples = unit_examples(inputs.val, inputs.pool, unit)
    extra, uwork = None, None
    if inputs.utility.applies(unit):  # validation and pool in separate passes: the reference sees the same batches
        engine = functools.partial(_engine, inputs)
        reference = work.reference(inputs.dtype)
        scores, extra, uwork = inputs.utility.score_val(unit, reference, qmodel, engine, inputs.device)
        scores += _engine(inputs, qmodel, inputs.pool) if unit.final else []
    else:
        scores = _engine(inputs, qmodel, examples)
    nonfinite = [e.sample_id for e, s in zip(examples, scores, strict=True) if not np.isfinite(s.token_losses).all()]
    if nonfinite:
        raise ScoringError(
            f"unit run={unit.run} step={unit.step} quantizer={unit.quantizer}: non-finite losses on "
            f"{len(nonfinite)} sample(s) (e.g. {nonfinite[:3]}): the quantized model diverges. Remove "
            "this quantizer from score.quantizers, or try other options (group size, compute dtype); "
            "the units scored so far are kept."
        )
    if extra is not None and nonfinite_divergence(extra):
        raise ScoringError(
            f"unit run={unit.run} step={unit.step} quantizer={unit.quantizer}: non-finite KL divergence on "
            f"{nonfinite_divergence(extra)} validation sample(s): the quantized model's logits overflow. Remove this "
            "quantizer from score.quantizers, or set score.divergence=false; the units scored so far are kept."
        )
    members = (
        set()
        if unit.run == REFERENCE_RUN
        else {inputs.pool[i].sample_id for i in np.flatnonzero(inputs.masks[unit.run])}
    )
    return _rows(unit, examples, scores, members, weights_digest(qmodel), extra), uwork


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
    return f"{'base' if unit.run < 0 else f'run {unit.run}'}/step {unit.step}/{unit.quantizer}"


def _load_checkpoint(inputs: _Inputs, work: CheckpointWork, unit: Unit) -> CheckpointWork:
    """`work` for the unit's checkpoint: the same object when it already holds it, else a new one (the previous
    checkpoint's model and shared work are released first: one checkpoint in memory at a time)."""
    key = (unit.run, unit.step)
    if work.key == key:
        return work
    work.model = None
    work.shared.clear()
    gc.collect()
    t0 = time.time()
    model = inputs.base if unit.run == REFERENCE_RUN else _checkpoint_model(inputs, unit.run, unit.step)
    return CheckpointWork(key=key, model=model, paid=time.time() - t0)


def _score_claimed_unit(inputs: _Inputs, unit: Unit, path: Path, work: CheckpointWork) -> CheckpointWork:
    """Score a unit this process has claimed into `path` (under its running marker) and log it in the worklog.

    work: the checkpoint the previous unit used, reused when this unit is on the same checkpoint; returns the one
    this unit used. The log charges a unit its own seconds plus the shared work it paid for (loading the checkpoint,
    a shared calibration), so the logged seconds add up to the wall time."""
    store = inputs.store
    with running_marker(unit_marker_path(store, unit.run, unit.step, unit.quantizer)):
        start = time.time()
        work = _load_checkpoint(inputs, work, unit)
        table, uwork = score_unit(inputs, unit, work)
        write_loss_table(table, path, metadata=inputs.utility.metadata() if uwork is not None else None)
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
                "dtype": dtype_name(unit_dtype(inputs.quantizers[unit.quantizer], inputs.dtype)),
                "shared_seconds": round(work.take_paid(), 3),
                "seconds": round(time.time() - start, 3),
                **work_fields(uwork),
            },
        )
    return work


def checkpoint_groups(units: list[Unit]) -> list[list[Unit]]:
    """Units grouped by checkpoint (run, step), in the grid's order: what one process scores together."""
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
    inputs: _Inputs, group: list[Unit], work: CheckpointWork, ids, progress: _Progress, bar
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


def _score_todo(inputs: _Inputs, todo: list[Unit], bar, stale: set[Unit]) -> _Progress:
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
    """Score every unit of this shard that is not done. Returns counts and timings:
    {"units", "scored", "taken_by_others", "seconds", "dtype"}.

    refresh_utility: also rescore the finished final units whose utility columns were made with other settings
    than the recipe's, or without them (stores scored by an earlier llmaudit)."""
    device = pick_device(cfg.score.device)
    check_quantizers(cfg.model_copy(update={"score": cfg.score.with_reference("fp32")}), device)  # before any file
    choice = store.scoring_choice(cfg.score.dtype, device)
    cfg = cfg.model_copy(update={"score": cfg.score.with_reference(SHORT_DTYPE_NAMES[choice.dtype])})
    quantizers = check_quantizers(cfg, device)
    check_recorded_options(store, quantizers)
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
        return {
            "units": len(mine),
            "scored": 0,
            "taken_by_others": 0,
            "seconds": 0.0,
            "dtype": dtype_name(choice.dtype),
        }
    inputs = _load_inputs(cfg, store, device, quantizers, choice.dtype)
    t0 = time.time()
    bar = tqdm(total=len(todo), desc="scoring", disable=not progress, mininterval=1.0)
    done = _score_todo(inputs, todo, bar, stale)
    bar.close()
    seconds = time.time() - t0
    echo(
        f"[score] scored {done.scored} unit(s) in {seconds:.1f}s"
        + (f"; {len(done.others)} unit(s) were taken by another process" if done.others else "")
    )
    return {
        "units": len(mine),
        "scored": done.scored,
        "taken_by_others": len(done.others),
        "seconds": seconds,
        "dtype": dtype_name(choice.dtype),
    }
