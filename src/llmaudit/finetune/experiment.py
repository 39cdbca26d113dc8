"""Create (or reuse) an experiment's run store: the data draw, the membership masks and the manifest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llmaudit.common.io import atomic_write_text
from llmaudit.common.runtime import choose_compute_dtype, pick_device
from llmaudit.config import ExperimentConfig
from llmaudit.data.pool import draw_pool_and_val, membership_masks
from llmaudit.data.records import dataset_fingerprint, records_to_jsonl
from llmaudit.data.sources import load_records
from llmaudit.data.tokenize import tokenize_records
from llmaudit.models.loading import load_tokenizer, model_source
from llmaudit.models.sources import ModelSource
from llmaudit.store.run_store import RunStore


@dataclass
class Draw:
    """An experiment's audited samples, drawn but not yet written: what `prepare_experiment` records
    and what `llmaudit plan` counts."""

    pool: list[dict]
    val: list[dict]
    masks: np.ndarray
    data_info: dict[str, Any]
    source: ModelSource
    tokenizer: Any


def draw_experiment(
    cfg: ExperimentConfig, *, echo=print, source: ModelSource | None = None, tokenizer: Any = None
) -> Draw:
    """Load the data, drop records over data.max_length, draw the pool and validation set and the
    membership masks (deterministic in the seeds; train.membership says how each run draws its members). Bad data
    fails before any model is built. `source` and `tokenizer` replace the model's (a plan's stand-ins: nothing is
    built or converted)."""
    need = cfg.data.pool_size + cfg.data.val_size
    records, route = load_records(cfg.data, n_needed=need)
    source = source or model_source(cfg.model, echo=echo)  # a GGUF base is converted once, here
    tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.model)
    # Drop over-long records before drawing, so the pool is exactly pool_size.
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=cfg.data.max_length)
    lengths_ok = {ex.sample_id for ex in tokenize_records(tok, records, "any", **kw)}
    usable = [r for r in records if r["sample_id"] in lengths_ok]
    pool, val = draw_pool_and_val(usable, cfg.data.pool_size, cfg.data.val_size, cfg.data.seed)
    masks = membership_masks(len(pool), cfg.train.runs, cfg.train.member_fraction, cfg.train.seed, cfg.train.membership)
    data_info = {
        "route": route,
        "source": cfg.data.source,
        "path": cfg.data.path,
        "hub_id": cfg.data.hub_id if route == "hub" else None,
        "tasks": cfg.data.tasks,
        "n_available": len(records),
        "n_usable": len(usable),
        "fingerprint": dataset_fingerprint(pool + val),
        "pool_ids": [r["sample_id"] for r in pool],
        "val_ids": [r["sample_id"] for r in val],
    }
    return Draw(pool, val, masks, data_info, source, tok)


def prepare_experiment(cfg: ExperimentConfig, store: RunStore, *, echo=print) -> dict[str, Any]:
    """Create (or check and reuse) the run store: data draw, membership masks, manifest."""
    store.check_identity(cfg)
    if store.exists():
        return store.manifest()
    draw = draw_experiment(cfg, echo=echo)
    store.begin_create(cfg)
    atomic_write_text(store.root / "data" / "pool.jsonl", records_to_jsonl(draw.pool))
    atomic_write_text(store.root / "data" / "val.jsonl", records_to_jsonl(draw.val))
    choice = choose_compute_dtype(cfg.model.dtype, pick_device(cfg.train.device))
    compute = {**choice.to_record(), "device": pick_device(cfg.train.device).type}
    echo(f"[finetune] {store.root}: computes in {compute['dtype']} ({choice.reason})")
    return store.create(cfg, draw.data_info, draw.masks, model_source=draw.source.to_dict(), compute=compute)
