"""One scoring unit: what every unit of a `score` call shares (`ScoreInputs`), the checkpoint's model and the work its
quantizers share (`CheckpointWork`), the unit's quantized model, the engine pass over its samples and its loss table.

llmaudit.score.stage plans the units, claims them and runs them through `score_unit`.
"""

from __future__ import annotations

import copy
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_json
from llmaudit.common.memory import bounded_heap, release_memory
from llmaudit.config import ExperimentConfig
from llmaudit.data.tokenize import Example, tokenize_records
from llmaudit.models.layers import cast_parameters
from llmaudit.models.loading import import_gptqmodel_quietly, load_base_model, load_checkpoint_model, load_tokenizer
from llmaudit.quantize.base import Quantizer
from llmaudit.quantize.calibration import read_calibration_file
from llmaudit.quantize.given import GivenFile, load_given
from llmaudit.score.calibration import (
    calibration_record,
    calibration_texts,
    check_recorded_calibration,
    given_file,
)
from llmaudit.score.engine import ScoringOptions, TokenScores, fragments_heap, score_examples, weights_digest
from llmaudit.score.utility import UnitUtility, UtilityWork, nonfinite_divergence
from llmaudit.store.integrity import check_checkpoint_dir
from llmaudit.store.losstable import REFERENCE_RUN
from llmaudit.store.run_store import RunStore, StoreError
from llmaudit.store.units import Unit


class ScoringError(UserError):
    """A unit cannot be scored (a quantized model that diverges, an unfinished grid)."""


def unit_rows(
    unit: Unit,
    examples: list[Example],
    scores: list[TokenScores],
    members: set[str],
    point_id: str,
    extra: dict[str, list] | None = None,
) -> pd.DataFrame:
    """The loss table of one unit: a row per example (its scores, membership, utility columns where given).

    Args:
        unit (Unit): the scoring unit.
        examples (list[Example]): the examples scored, in table order.
        scores (list[TokenScores]): their scores, in the same order.
        members (set[str]): the sample ids in the unit's run's training set.
        point_id (str): the digest of the quantized point.
        extra (dict[str, list] | None): utility columns, one entry per example (None where a column does not apply).

    Returns:
        pd.DataFrame: the unit's loss table (store.losstable's columns).
    """
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


@dataclass
class ScoreInputs:
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

    def take_base(self) -> Any:
        """The base model for the caller to keep or modify (a checkpoint merges its adapter into it).

        No process keeps a base beside the checkpoint it scores: a merged copy beside it would hold a second model in
        memory between units, while loading it again from its cached files is quick (docs/results.md, "A final
        unit's memory by phase").

        Returns:
            Any: the base held, else one loaded again from its files.
        """
        base, self.base = self.base, None
        if base is None:
            base = load_base_model(self.cfg.model, self.device, dtype=base_dtype(self.device, self.dtype))
        return base


def base_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype the base is loaded in.

    Args:
        device (torch.device): the scoring device.
        dtype (torch.dtype): the store's scoring dtype.

    Returns:
        torch.dtype: float32 on a CPU, where checkpoints are merged and quantized in float32 whatever the scoring dtype
            (the quantizers' math is float32 there); on a GPU the scoring dtype, which its kernels compute in.
    """
    return torch.float32 if device.type == "cpu" else dtype


def load_inputs(
    cfg: ExperimentConfig, store: RunStore, device: torch.device, quantizers: dict, dtype: torch.dtype
) -> ScoreInputs:
    """Everything a scoring process reads once: tokenizer, records, base model, utility plan, calibration file.

    Each quantizer is checked against the base model's real layers before any unit is scored.

    Args:
        cfg (ExperimentConfig): the experiment's configuration.
        store (RunStore): the run store.
        device (torch.device): the scoring device.
        quantizers (dict): the checked quantizers, by name.
        dtype (torch.dtype): the store's scoring dtype.

    Returns:
        ScoreInputs: the process's scoring inputs.
    """
    tok = load_tokenizer(cfg.model)
    pool_records = store.read_records("pool")
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    pool = tokenize_records(tok, pool_records, "pool", **kw)
    val = tokenize_records(tok, store.read_records("val"), "val", **kw)
    base = load_base_model(cfg.model, device, dtype=base_dtype(device, dtype))
    for quantizer in quantizers.values():  # group sizes and scopes against the real layers, before any unit
        quantizer.check(base)
    import_gptqmodel_quietly()  # peft (adapters) and the GPTQ backend import it
    utility = make_utility(cfg, store, tok, val)
    on_file = any(q.calibrated and q.options["calibration_source"] == "file" for q in quantizers.values())
    calibration_file = read_calibration_file(cfg.score.calibration_file) if on_file else None
    if calibration_file is not None:
        check_recorded_calibration(store, quantizers, calibration_file[1])
    return ScoreInputs(
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
    """The utility columns' plan of this store.

    Args:
        cfg (ExperimentConfig): the experiment's configuration.
        store (RunStore): the run store.
        tok (Any): the tokenizer.
        val (list[Example] | None): the tokenised validation records (None: tokenised here).

    Returns:
        UnitUtility: the plan.
    """
    records = store.read_records("val")
    if val is None:
        val = tokenize_records(tok, records, "val", include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    return UnitUtility(cfg, store, tok, val, records)


def checkpoint_model(inputs: ScoreInputs, run: int, step: int) -> Any:
    """The fine-tuned model of (run, step): the base with the LoRA adapter merged, or a full checkpoint.

    Args:
        inputs (ScoreInputs): the process's scoring inputs.
        run (int): the run.
        step (int): the checkpoint's step.

    Returns:
        Any: the model.

    Raises:
        StoreError: the checkpoint is missing or does not match its record; the message names the directory.
    """
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
    return load_checkpoint_model(inputs.take_base(), directory, inputs.device, consume=True)


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
        """Work shared by the units of this checkpoint (a calibration), made once and timed.

        Args:
            key (Any): what the work is.
            make (Callable[[], Any]): makes it, the first time it is asked for.

        Returns:
            Any: the work.
        """
        if key not in self.shared:
            t0 = time.time()
            self.shared[key] = make()
            self.paid += time.time() - t0
        return self.shared[key]

    def take_paid(self) -> float:
        """The seconds of shared work made since the last call, for the unit that paid them; resets the count.

        Returns:
            float: seconds.
        """
        paid, self.paid = self.paid, 0.0
        return paid

    def reference(self, dtype: torch.dtype) -> Any:
        """The checkpoint itself in `dtype`: the model the KL divergence of every quantizer of this checkpoint is
        measured against.

        Args:
            dtype (torch.dtype): the store's full precision (a copy is cast once when it is not the merged model's).

        Returns:
            Any: the model.
        """
        if next(self.model.parameters()).dtype == dtype:
            return self.model
        return self.get(("reference", str(dtype)), lambda: cast_parameters(copy.deepcopy(self.model), dtype))


def load_checkpoint(inputs: ScoreInputs, work: CheckpointWork, unit: Unit) -> CheckpointWork:
    """`work` for the unit's checkpoint.

    Args:
        inputs (ScoreInputs): the process's scoring inputs.
        work (CheckpointWork): the checkpoint the previous unit used.
        unit (Unit): the unit to score.

    Returns:
        CheckpointWork: the same object when it already holds the checkpoint, else a new one (the previous checkpoint's
            model and shared work are released first: one checkpoint in memory at a time).
    """
    key = (unit.run, unit.step)
    if work.key == key:
        return work
    work.model = None
    work.shared.clear()
    release_memory()  # the previous checkpoint's model and shared work, handed back before the next is loaded
    t0 = time.time()
    model = inputs.take_base() if unit.run == REFERENCE_RUN else checkpoint_model(inputs, unit.run, unit.step)
    return CheckpointWork(key=key, model=model, paid=time.time() - t0)


def unit_dtype(quantizer: Quantizer, store_dtype: torch.dtype) -> torch.dtype:
    """The dtype a unit is scored in.

    Args:
        quantizer (Quantizer): the unit's quantizer.
        store_dtype (torch.dtype): the store's scoring dtype.

    Returns:
        torch.dtype: the store's, except for `fp32`, which is float32 (full precision as named) in a store that scores
            in a half-precision dtype.
    """
    return torch.float32 if quantizer.family == "full" and quantizer.name == "fp32" else store_dtype


def _calibrated(inputs: ScoreInputs, quantizer: Quantizer, work: CheckpointWork, run: int) -> Any:
    """The checkpoint quantized by a calibrated quantizer (`calibration_texts`); the calibration of a quantizer
    that shares it (`Quantizer.shares_calibration`, e.g. GPTQ's Hessians) is collected once per checkpoint, group and
    `calibration_key()`, and reused by every quantizer of the group that calibrates alike."""
    kwargs: dict[str, Any] = {"tokenizer": inputs.tok, "calibration_texts": calibration_texts(inputs, quantizer, run)}
    group = quantizer.shares_calibration
    key = quantizer.calibration_key() if group is not None else None
    if key is None:
        return quantizer.quantize_model(copy.deepcopy(work.model), **kwargs)
    # statistics of the unquantized checkpoint: the same for every member of the group with this key
    shared = work.get(
        (group, json.dumps(key, sort_keys=True)), lambda: quantizer.collect_shared_calibration(work.model, **kwargs)
    )
    return quantizer.quantize_shared(copy.deepcopy(work.model), shared)


def is_identity(quantizer: Quantizer, dtype: torch.dtype) -> bool:
    """Whether the quantizer is the checkpoint itself in the unit's dtype (bf16 of a bf16 store, fp32 of a float32 one).

    Such a unit makes no copy, and its own pass is the KL reference of the checkpoint's other units.

    Args:
        quantizer (Quantizer): the unit's quantizer.
        dtype (torch.dtype): the unit's dtype.

    Returns:
        bool: True for the identity quantizer.
    """
    return quantizer.family == "full" and getattr(quantizer, "dtype", None) == dtype


def _quantized(
    inputs: ScoreInputs, quantizer: Quantizer, work: CheckpointWork, unit: Unit, given: GivenFile | None
) -> Any:
    """The unit's model: the checkpoint quantized (float32 math on a CPU), or the user's own quantized model of it
    (`given`) scored as given, its parameters in the unit's dtype."""
    dtype, run = unit_dtype(quantizer, inputs.dtype), unit.run
    if is_identity(quantizer, dtype):
        return work.reference(dtype)
    if given is not None:
        return cast_parameters(load_given(given, copy.deepcopy(work.model), inputs.device), dtype)
    if quantizer.calibrated:
        return cast_parameters(_calibrated(inputs, quantizer, work, run), dtype)
    return cast_parameters(quantizer.quantize_model(copy.deepcopy(work.model)), dtype)


def unit_examples(val: list[Example], pool: list[Example], unit: Unit) -> list[Example]:
    """What a unit scores: the validation samples, plus the pool at a run's final checkpoint (attacks).

    Args:
        val (list[Example]): the validation examples.
        pool (list[Example]): the pool examples.
        unit (Unit): the unit.

    Returns:
        list[Example]: the examples, validation first.
    """
    return val + (pool if unit.final else [])


def token_budget(cfg: ExperimentConfig, device: torch.device) -> int:
    """Padded tokens per batch.

    Args:
        cfg (ExperimentConfig): the experiment's configuration.
        device (torch.device): the scoring device.

    Returns:
        int: the recipe's, else 2048 on CPU (cache-sized batches), 16384 on GPU.
    """
    return cfg.score.token_budget or (16384 if device.type == "cuda" else 2048)


def _engine(inputs: ScoreInputs, model: Any, examples: list[Example], hidden_hook: Any = None) -> list[TokenScores]:
    cfg, device = inputs.cfg, inputs.device
    return score_examples(
        model,
        [(e.input_ids, e.loss_mask) for e in examples],
        pad_id=inputs.tok.pad_token_id,
        options=ScoringOptions(
            token_budget=token_budget(cfg, device),
            head_chunk=cfg.score.head_chunk,
            vocab_stats=cfg.score.vocab_stats,
            device=device,
            cpu_workers=cfg.score.cpu_workers,
        ),
        hidden_hook=hidden_hook,
    )


def score_unit(inputs: ScoreInputs, unit: Unit, work: CheckpointWork) -> tuple[pd.DataFrame, UtilityWork | None]:
    """The loss table of one unit: its checkpoint (`work.model`) quantized, scored on its samples.

    At a run's final checkpoint the table has the utility columns of its validation rows (llmaudit.score.utility),
    measured against the checkpoint in the store's dtype (`work.reference`). A model whose scoring would fragment the
    heap (`fragments_heap`: real quantized layers, the int8 layers) is scored with large blocks mapped.

    Args:
        inputs (ScoreInputs): the process's scoring inputs.
        unit (Unit): the unit.
        work (CheckpointWork): the unit's checkpoint, loaded.

    Returns:
        tuple[pd.DataFrame, UtilityWork | None]: the loss table and what its utility columns cost (None without them).

    Raises:
        ScoringError: the quantized model's losses, or its KL divergence, are not finite (it diverges).
    """
    quantizer = inputs.quantizers[unit.quantizer]
    given = given_file(inputs.store, unit)
    qmodel = _quantized(inputs, quantizer, work, unit, given)
    if given is None:  # the record describes llmaudit's quantization; a user's own file is recorded at import
        _record_quantizer(inputs.store, quantizer, qmodel, calibration_record(inputs, quantizer))
    examples = unit_examples(inputs.val, inputs.pool, unit)
    with bounded_heap(fragments_heap(qmodel)):
        scores, extra, uwork = _unit_scores(inputs, unit, work, qmodel)
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
    return unit_rows(unit, examples, scores, members, weights_digest(qmodel), extra), uwork


def _unit_scores(
    inputs: ScoreInputs, unit: Unit, work: CheckpointWork, qmodel: Any
) -> tuple[list[TokenScores], dict | None, UtilityWork | None]:
    """The engine's scores of the unit's samples (validation, then the pool at a final checkpoint), with the
    utility columns of the validation rows and what they cost where they apply."""
    if not inputs.utility.applies(unit):
        return _engine(inputs, qmodel, unit_examples(inputs.val, inputs.pool, unit)), None, None
    # validation and pool in separate passes: the reference sees the same batches
    engine = functools.partial(_engine, inputs)
    scores, extra, uwork = inputs.utility.score_val(unit, work.reference(inputs.dtype), qmodel, engine, inputs.device)
    scores += _engine(inputs, qmodel, inputs.pool) if unit.final else []
    return scores, extra, uwork
