"""The `llmaudit score` stage: check the quantizers, then score every unit of a shard that is not on disk."""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from llmaudit.common.io import atomic_write_json
from llmaudit.common.runtime import pick_device
from llmaudit.config import ExperimentConfig
from llmaudit.data.tokenize import Example, tokenize_records
from llmaudit.models.loading import import_gptqmodel_quietly, load_base_model, load_tokenizer
from llmaudit.quantize import get_quantizer
from llmaudit.score.engine import TokenScores, score_examples, weights_digest
from llmaudit.score.units import Unit, plan_units
from llmaudit.store.losstable import REFERENCE_RUN, write_loss_table
from llmaudit.store.markers import clear_stale_markers, each_marked, unit_marker_path
from llmaudit.store.run_store import RunStore
from llmaudit.store.shards import shard_items

log = logging.getLogger(__name__)


def _rows(
    unit: Unit, examples: list[Example], scores: list[TokenScores], members: set[str], point_id: str
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
    return pd.DataFrame(rows)


def _record_quantizer(store: RunStore, quantizer: Any, qmodel: Any) -> None:
    """Once per quantizer: its options, effective bits per weight and model size (for the report)."""

    path = store.scores_dir / "quantizers" / f"{quantizer.name}.json"
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


def check_quantizers(cfg: ExperimentConfig, device: torch.device) -> dict[str, Any]:
    """Build every quantizer and reject impossible requests before any work starts."""

    quantizers = {}
    for name in cfg.score.quantizers:
        opts = dict(cfg.score.quantizer_options.get(name, {}))
        opts.setdefault("device", device.type)
        q = get_quantizer(name, **opts)
        q.check()
        quantizers[name] = q
    return quantizers


def score(
    cfg: ExperimentConfig, store: RunStore, *, shard: tuple[int, int] | None = None, progress: bool = True, echo=print
) -> dict[str, Any]:
    """Score every unit of this shard that is not on disk yet. Returns counts and timings."""
    from peft import PeftModel

    device = pick_device(cfg.score.device)
    quantizers = check_quantizers(cfg, device)
    store.update_config(cfg)
    unfinished = [r for r in range(cfg.train.runs) if not store.run_done(r)]
    if shard is not None and shard[1] > 1 and unfinished:
        # The round-robin split is over the full grid; with runs missing, shards would disagree on it.
        raise ValueError(
            f"score --shard {shard[0]}/{shard[1]}: runs {unfinished} of {store.root} are not finished, so the "
            "scoring grid is incomplete. Finish `llmaudit finetune` first (`llmaudit status` shows what is missing)."
        )
    all_units = plan_units(cfg, store)
    mine = shard_items(all_units, shard)
    todo = [u for u in mine if not store.unit_path(u.run, u.step, u.quantizer).exists()]
    pending = set(todo)
    clear_stale_markers(unit_marker_path(store, u.run, u.step, u.quantizer) for u in mine if u not in pending)
    echo(
        f"[score] {store.root}: {len(all_units)} unit(s) in the grid, {len(mine)} in this shard, {len(mine) - len(todo)} already scored, {len(todo)} to do on {device}"
    )
    if not todo:
        return {"units": len(mine), "scored": 0, "seconds": 0.0}
    tok = load_tokenizer(cfg.model)
    pool_records = store.read_records("pool")
    pool = tokenize_records(tok, pool_records, "pool", include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    val = tokenize_records(
        tok, store.read_records("val"), "val", include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9
    )
    masks = store.membership()
    base = load_base_model(cfg.model, device)
    import_gptqmodel_quietly()  # peft (adapters) and the GPTQ backend import it
    t0 = time.time()
    bar = tqdm(total=len(todo), desc="scoring", disable=not progress, mininterval=1.0)
    merged_key, merged = None, None
    for unit in each_marked(todo, lambda u: unit_marker_path(store, u.run, u.step, u.quantizer)):
        if unit.run == REFERENCE_RUN:
            model, members = base, set()
        else:
            if merged_key != (unit.run, unit.step):
                # Load the base once; merge each adapter into a working copy.
                adapter = PeftModel.from_pretrained(copy.deepcopy(base), str(store.checkpoint_dir(unit.run, unit.step)))
                merged, merged_key = adapter.merge_and_unload().eval(), (unit.run, unit.step)
            model = merged
            members = {pool[i].sample_id for i in np.flatnonzero(masks[unit.run])}
        quantizer = quantizers[unit.quantizer]
        kwargs = {}
        if quantizer.family == "gptq":
            member_texts = [
                pool_records[i]["input"] + "\n" + pool_records[i]["output"]
                for i in np.flatnonzero(masks[max(unit.run, 0)])
            ]
            kwargs = {"tokenizer": tok, "calibration_texts": member_texts}
        qmodel = (
            model
            if quantizer.family == "full"
            and quantizer.name == "fp32"
            and next(model.parameters()).dtype == torch.float32
            else quantizer.quantize_model(copy.deepcopy(model), **kwargs)
        )
        _record_quantizer(store, quantizer, qmodel)
        examples = val + (pool if unit.final else [])
        scores = score_examples(
            qmodel,
            [(e.input_ids, e.loss_mask) for e in examples],
            pad_id=tok.pad_token_id,
            token_budget=cfg.score.token_budget or (16384 if device.type == "cuda" else 2048),
            head_chunk=cfg.score.head_chunk,
            vocab_stats=cfg.score.vocab_stats,
            device=device,
            cpu_workers=cfg.score.cpu_workers,
        )
        nonfinite = [e.sample_id for e, s in zip(examples, scores) if not np.isfinite(s.token_losses).all()]
        if nonfinite:
            raise FloatingPointError(
                f"unit run={unit.run} step={unit.step} quantizer={unit.quantizer}: non-finite losses on "
                f"{len(nonfinite)} sample(s) (e.g. {nonfinite[:3]}): the quantized model diverges. Remove "
                "this quantizer from score.quantizers, or try other options (group size, compute dtype)."
            )
        df = _rows(unit, examples, scores, members, weights_digest(qmodel))
        write_loss_table(df, store.unit_path(unit.run, unit.step, unit.quantizer))
        del qmodel
        bar.update(1)
    bar.close()
    seconds = time.time() - t0
    echo(f"[score] scored {len(todo)} unit(s) in {seconds:.1f}s")
    return {"units": len(mine), "scored": len(todo), "seconds": seconds}
