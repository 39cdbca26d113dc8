"""The `llmaudit score` stage: check the quantizers and the store, then score every unit of a shard
that is not done.

A unit is done when its loss table is on disk AND passes `verify_store` (readable, complete for its
samples, consistent with the manifest, finite); a unit that fails is moved to scores/quarantine/ and
scored again. Each unit is claimed with a file lock before it is scored and checked once more after the
claim, so any number of processes (local jobs, SLURM array tasks) can score one store at once and no unit
is ever scored twice; every unit scored is appended to scores/worklog.jsonl.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_json, read_json
from llmaudit.common.runtime import pick_device
from llmaudit.config import ExperimentConfig
from llmaudit.data.records import record_text
from llmaudit.data.tokenize import Example, tokenize_records
from llmaudit.models.loading import import_gptqmodel_quietly, load_base_model, load_checkpoint_model, load_tokenizer
from llmaudit.quantize import get_quantizer
from llmaudit.quantize.base import Quantizer
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
    for name, values in (extra or {}).items():  # utility columns of the validation rows; None on the pool rows
        rows[name] = list(values) + [None] * (len(examples) - len(values))
    return pd.DataFrame(rows)


def _record_quantizer(store: RunStore, quantizer: Quantizer, qmodel: Any) -> None:
    """Once per quantizer: its options, effective bits per weight and model size (for the report)."""
    path = store.quantizer_info_path(quantizer.name)
    if path.exists():
        return
    atomic_write_json(
        path,
        {
            "name": quantizer.name,
            "family": quantizer.family,
            "bits": quantizer.bits,
            "effective_bits": quantizer.effective_bits(qmodel),
            "model_size_bytes": quantizer.model_size_bytes(qmodel),
            "options": quantizer.options,
        },
    )


def check_recorded_options(store: RunStore, quantizers: dict[str, Quantizer]) -> None:
    """A quantizer name means one set of options in a store: its units scored earlier must not be mixed
    with units scored under other options (the report would show them as one quantizer)."""
    for name, q in quantizers.items():
        path = store.quantizer_info_path(name)
        if not path.exists():
            continue
        recorded = read_json(path, what="quantizer record").get("options") or {}
        mine = {k: v for k, v in q.options.items() if k != "device"}
        theirs = {k: v for k, v in recorded.items() if k != "device"}
        if _jsonable(mine) != _jsonable(theirs):
            diff = sorted(k for k in set(mine) | set(theirs) if _jsonable(mine.get(k)) != _jsonable(theirs.get(k)))
            raise StoreError(
                f"{name} was scored in {store.root} with other options ({', '.join(f'{k}={theirs.get(k)!r}' for k in diff)}; "
                f"now {', '.join(f'{k}={mine.get(k)!r}' for k in diff)}): keep the recorded options, or score into a new run "
                "directory; mixing them would report two quantizers as one."
            )


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def check_quantizers(cfg: ExperimentConfig, device: torch.device) -> dict[str, Quantizer]:
    """Build every quantizer and reject impossible requests before any work starts."""
    quantizers = {}
    for name in cfg.score.quantizers:
        opts = dict(cfg.score.quantizer_options.get(name, {}))
        opts.setdefault("device", device.type)
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
    utility: UnitUtility


def _load_inputs(cfg: ExperimentConfig, store: RunStore, device: torch.device, quantizers: dict) -> _Inputs:
    tok = load_tokenizer(cfg.model)
    pool_records = store.read_records("pool")
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    pool = tokenize_records(tok, pool_records, "pool", **kw)
    val = tokenize_records(tok, store.read_records("val"), "val", **kw)
    base = load_base_model(cfg.model, device)
    for quantizer in quantizers.values():  # group sizes and scopes against the real layers, before any unit
        quantizer.check(base)
    import_gptqmodel_quietly()  # peft (adapters) and the GPTQ backend import it
    utility = make_utility(cfg, store, tok, val)
    return _Inputs(cfg, store, device, quantizers, tok, pool_records, pool, val, store.membership(), base, utility)


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


def is_identity(quantizer: Quantizer, dtype: torch.dtype) -> bool:
    """fp32 of a float32 model is the model itself (no copy; its own pass is the KL reference)."""
    return quantizer.family == "full" and quantizer.name == "fp32" and dtype == torch.float32


def _quantized(inputs: _Inputs, quantizer: Quantizer, model: Any, run: int) -> Any:
    if is_identity(quantizer, next(model.parameters()).dtype):
        return model
    kwargs = {}
    if quantizer.family == "gptq":  # calibrated on the run's own training samples (the base: run 0's)
        members = np.flatnonzero(inputs.masks[max(run, 0)])
        kwargs = {"tokenizer": inputs.tok, "calibration_texts": [record_text(inputs.pool_records[i]) for i in members]}
    return quantizer.quantize_model(copy.deepcopy(model), **kwargs)


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


def score_unit(inputs: _Inputs, unit: Unit, model: Any) -> tuple[pd.DataFrame, UtilityWork | None]:
    """The loss table of one unit: `model` (the unit's checkpoint) quantized, scored on its samples; at a run's
    final checkpoint with the utility columns of its validation rows (llmaudit.score.utility), and what they cost."""
    quantizer = inputs.quantizers[unit.quantizer]
    qmodel = _quantized(inputs, quantizer, model, unit.run)
    _record_quantizer(inputs.store, quantizer, qmodel)
    examples = unit_examples(inputs.val, inputs.pool, unit)
    extra, work = None, None
    if inputs.utility.applies(unit):  # validation and pool in separate passes: the reference sees the same batches
        engine = functools.partial(_engine, inputs)
        scores, extra, work = inputs.utility.score_val(unit, model, qmodel, engine, inputs.device)
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
    return _rows(unit, examples, scores, members, weights_digest(qmodel), extra), work


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


def _score_claimed_unit(
    inputs: _Inputs, unit: Unit, path: Path, loaded: tuple[tuple[int, int] | None, Any]
) -> tuple[tuple[int, int] | None, Any]:
    """Score a unit this process has claimed into `path` (under its running marker) and log it in the worklog.

    loaded: ((run, step), model) of the model the previous unit used, reused when this unit is on the same
    checkpoint; returns the pair this unit used."""
    store = inputs.store
    model_key, model = loaded
    with running_marker(unit_marker_path(store, unit.run, unit.step, unit.quantizer)):
        start = time.time()
        if model_key != (unit.run, unit.step):
            model = inputs.base if unit.run == REFERENCE_RUN else _checkpoint_model(inputs, unit.run, unit.step)
            model_key = (unit.run, unit.step)
        table, work = score_unit(inputs, unit, model)
        write_loss_table(table, path, metadata=inputs.utility.metadata() if work is not None else None)
        append_work(
            store.worklog_path,
            {
                "stage": "score",
                "run": unit.run,
                "step": unit.step,
                "quantizer": unit.quantizer,
                "samples": len(unit_examples(inputs.val, inputs.pool, unit)),
                "tokens": sum(len(e.input_ids) for e in unit_examples(inputs.val, inputs.pool, unit)),
                "seconds": round(time.time() - start, 3),
                **work_fields(work),
            },
        )
    return model_key, model


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
    {"units", "scored", "taken_by_others", "seconds"}.

    refresh_utility: also rescore the finished final units whose utility columns were made with other settings
    than the recipe's, or without them (stores scored by an earlier llmaudit)."""
    device = pick_device(cfg.score.device)
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
        f"{len(mine) - len(todo)} already scored, {len(todo)} to do on {device}"
    )
    if not todo:
        return {"units": len(mine), "scored": 0, "taken_by_others": 0, "seconds": 0.0}
    inputs = _load_inputs(cfg, store, device, quantizers)
    masks, pool_ids, val_ids = inputs.masks, [e.sample_id for e in inputs.pool], [e.sample_id for e in inputs.val]
    t0, scored, others = time.time(), 0, []
    bar = tqdm(total=len(todo), desc="scoring", disable=not progress, mininterval=1.0)
    loaded: tuple[tuple[int, int] | None, Any] = (None, None)  # ((run, step), model) of the last unit
    for unit in todo:
        path = store.unit_path(unit.run, unit.step, unit.quantizer)
        with claim(store.lock_path("units", *path.relative_to(store.scores_dir).with_suffix("").parts)) as mine_now:
            done = path.exists() and check_unit_file(path, unit, pool_ids, val_ids, masks) is None
            if not mine_now or (done and not (unit in stale and inputs.utility.stale(unit, path))):
                others.append(unit)  # another process holds it, or finished it since we looked
                bar.update(1)
                continue
            loaded = _score_claimed_unit(inputs, unit, path, loaded)
            scored += 1
        bar.update(1)
    bar.close()
    seconds = time.time() - t0
    echo(
        f"[score] scored {scored} unit(s) in {seconds:.1f}s"
        + (f"; {len(others)} unit(s) were taken by another process" if others else "")
    )
    return {"units": len(mine), "scored": scored, "taken_by_others": len(others), "seconds": seconds}
