"""Create (or reuse) an experiment's run store: the data draw, the membership masks and the manifest."""

from __future__ import annotations

from typing import Any

from llmaudit.common.io import atomic_write_text
from llmaudit.config import ExperimentConfig
from llmaudit.data.pool import draw_pool_and_val, membership_masks
from llmaudit.data.records import dataset_fingerprint, records_to_jsonl
from llmaudit.data.sources import load_records
from llmaudit.data.tokenize import tokenize_records
from llmaudit.models.loading import load_tokenizer
from llmaudit.store.run_store import RunStore


def prepare_experiment(cfg: ExperimentConfig, store: RunStore) -> dict[str, Any]:
    """Create (or check and reuse) the run store: data draw, membership masks, manifest."""
    store.check_identity(cfg)
    if store.exists():
        return store.manifest()
    need = cfg.data.pool_size + cfg.data.val_size
    records, route = load_records(cfg.data, n_needed=need)  # bad data fails before any model is built
    tok = load_tokenizer(cfg.model)
    # Drop over-long records before drawing, so the pool is exactly pool_size.
    lengths_ok = {
        ex.sample_id
        for ex in tokenize_records(
            tok, records, "any", include_prompt=cfg.data.include_prompt_in_loss, max_length=cfg.data.max_length
        )
    }
    usable = [r for r in records if r["sample_id"] in lengths_ok]
    pool, val = draw_pool_and_val(usable, cfg.data.pool_size, cfg.data.val_size, cfg.data.seed)
    masks = membership_masks(len(pool), cfg.train.runs, cfg.train.member_fraction, cfg.train.seed)
    atomic_write_text(store.root / "data" / "pool.jsonl", records_to_jsonl(pool))
    atomic_write_text(store.root / "data" / "val.jsonl", records_to_jsonl(val))
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
    return store.create(cfg, data_info, masks)
