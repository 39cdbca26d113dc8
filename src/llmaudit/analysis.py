"""From the loss tables of an experiment to one result object: r_Q, attacks, memorization, utility.

The result object is what every report rendering (JSON, Markdown, HTML) is made from.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import pandas as pd

from llmaudit import __version__
from llmaudit.config import ExperimentConfig
from llmaudit.io import atomic_write_json, read_json
from llmaudit.losstable import REFERENCE_RUN, read_loss_table
from llmaudit.store import RunStore

log = logging.getLogger(__name__)
RESULT_SCHEMA_VERSION = 1


def utility_from_table(df: pd.DataFrame, quantizers: list[str], reference: str, *, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Validation loss of each quantizer's final checkpoint: mean over runs with a bootstrap interval
    over runs, and the change relative to the full-precision reference."""
    from llmaudit.indicator import aggregate_r_q

    val = df[(df["split"] == "val") & (df["run"] != REFERENCE_RUN)]
    out: dict[str, Any] = {}
    per_run: dict[str, np.ndarray] = {}
    for q in quantizers:
        sub = val[val["quantizer"] == q]
        if sub.empty:
            continue
        final = sub[sub["checkpoint"] == sub.groupby("run")["checkpoint"].transform("max")]
        per_run[q] = final.groupby("run")["loss"].mean().sort_index().to_numpy()
    ref = per_run.get(reference)
    for q, losses in per_run.items():
        agg = aggregate_r_q(losses, n_boot=n_boot, seed=seed)
        entry = {
            "val_loss": agg["mean"],
            "val_loss_ci": [agg["ci_low"], agg["ci_high"]],
            "val_loss_per_run": losses.tolist(),
            "n_runs": int(len(losses)),
        }
        if ref is not None and len(ref) == len(losses):
            rel = losses / ref - 1.0
            entry["relative_change"] = float(rel.mean())
            rel_agg = aggregate_r_q(rel, n_boot=n_boot, seed=seed)
            entry["relative_change_ci"] = [rel_agg["ci_low"], rel_agg["ci_high"]]
        out[q] = entry
    base = df[(df["run"] == REFERENCE_RUN) & (df["split"] == "val")]
    if not base.empty:
        out["_base_model"] = {"val_loss": float(base["loss"].mean())}
    return out


def trajectory_from_table(df: pd.DataFrame) -> dict[str, Any]:
    """Mean validation loss per (quantizer, checkpoint), averaged over runs: the loss along training."""
    val = df[(df["split"] == "val") & (df["run"] != REFERENCE_RUN)]
    curve = val.groupby(["quantizer", "checkpoint"])["loss"].mean().reset_index()
    return {q: {"checkpoint": g["checkpoint"].tolist(), "val_loss": g["loss"].tolist()} for q, g in curve.groupby("quantizer")}


def vulnerable_samples(df: pd.DataFrame, quantizer: str, fpc_value: float | None, top: int = 20) -> dict[str, Any]:
    """The samples offline LiRA finds most exposed: ids and scores only, never text.

    Score of a sample = mean over the runs that trained on it of its calibrated LiRA statistic when that
    run is the target (leave-one-out; the other runs where it was OUT give its Gaussian)."""
    from llmaudit.attacks import _final_pool, _leave_one_out, lira_offline, lira_statistic

    rows, _ = _final_pool(df, quantizer)
    loss = rows.pivot(index="run", columns="sample_id", values="loss").sort_index()
    member = rows.pivot(index="run", columns="sample_id", values="member").sort_index().astype(bool)
    samples = [str(c) for c in loss.columns]
    z = _leave_one_out(lira_offline, lira_statistic(loss.to_numpy()), member.to_numpy(), fpc_value)
    keep = member.to_numpy()
    with np.errstate(invalid="ignore"):
        z_in = np.where(keep & np.isfinite(z), z, np.nan)
        counts = np.isfinite(z_in).sum(0)
        score = np.where(counts > 0, np.nansum(np.nan_to_num(z_in, nan=0.0), 0) / np.maximum(counts, 1), np.nan)
    order = [i for i in np.argsort(-np.nan_to_num(score, nan=-np.inf)) if np.isfinite(score[i])][:top]
    return {
        "attack": "lira_offline",
        "score_definition": "mean over the runs that trained on the sample of its calibrated offline-LiRA z-score (leave-one-out)",
        "samples": [{"sample_id": samples[i], "score": float(score[i]), "n_member_runs": int(counts[i])} for i in order],
    }


def analyze(cfg: ExperimentConfig, store: RunStore, *, echo=print) -> dict[str, Any]:
    """Compute every result from the stored loss tables and write results/*.json."""
    from llmaudit.attacks import run_attacks
    from llmaudit.indicator import indicator_from_table
    from llmaudit.memorization import memorization_from_table

    manifest = store.manifest()
    table = read_loss_table(store.scores_dir)
    quantizers = [q for q in cfg.score.quantizers if q in set(table["quantizer"])]
    missing = [q for q in cfg.score.quantizers if q not in quantizers]
    if missing:
        echo(f"[analyze] not scored yet (run `llmaudit score`): {missing}")
    reference = next((q for q in quantizers if q in ("fp32", "bf16", "fp16")), quantizers[0])
    n_boot = cfg.attack.n_boot

    echo("[analyze] r_Q indicator ...")
    indicator = indicator_from_table(table[table["quantizer"].isin(quantizers)], split="val", n_boot=max(n_boot, 200), seed=cfg.attack.seed)
    r_q_means = {q: indicator["per_quantizer"][q]["r_q"]["mean"] for q in quantizers if q in indicator["per_quantizer"]}

    echo("[analyze] attacks ...")
    membership = manifest["membership"]
    fpc: Any = {"auto": "auto", "off": None}.get(cfg.attack.fpc, cfg.attack.fpc) if isinstance(cfg.attack.fpc, str) else cfg.attack.fpc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attacks = run_attacks(
            table,
            quantizers=quantizers,
            attacks=cfg.attack.attacks,
            fpc=fpc,
            n_boot=n_boot,
            seed=cfg.attack.seed,
            n_pool=membership["pool_size"],
            n_train=float(np.mean(membership["n_train"])),
            r_q=r_q_means,
            reference_quantizer=reference,
        )

    for q in quantizers:
        block = attacks.get("quantizers", {}).get(q)
        if block is not None:
            fpc_value = block.get("fpc") if isinstance(block.get("fpc"), (int, float)) else None
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                block["vulnerable_samples"] = vulnerable_samples(table, q, fpc_value)

    memorization = None
    params = manifest.get("parameters", {})
    if (table["run"] == REFERENCE_RUN).any():
        echo("[analyze] memorization ...")
        memorization = memorization_from_table(
            table,
            adapter_params=params.get("adapter_trainable"),
            model_params=params.get("model_total"),
            n_boot=max(n_boot, 200),
            seed=cfg.attack.seed,
        )

    quantizer_info = {}
    for q in quantizers:
        path = store.scores_dir / "quantizers" / f"{q}.json"
        quantizer_info[q] = read_json(path) if path.exists() else {"name": q}

    result = {
        "schema_version": RESULT_SCHEMA_VERSION,
        "llmaudit_version": __version__,
        "experiment": {
            "name": manifest["name"],
            "run_dir": str(store.root),
            "identity_hash": manifest["identity_hash"],
            "model": cfg.model.name,
            "lora": cfg.lora.model_dump(),
            "train": cfg.train.model_dump(),
            "data": {k: v for k, v in manifest["data"].items() if k not in ("pool_ids", "val_ids")},
            "membership": {k: v for k, v in membership.items() if k != "masks"},
            "parameters": params,
            "versions": manifest["versions"],
            "seeds": manifest["seeds"],
        },
        "reference_quantizer": reference,
        "quantizers": quantizers,
        "quantizer_info": quantizer_info,
        "utility": utility_from_table(table, quantizers, reference, n_boot=max(n_boot, 200), seed=cfg.attack.seed),
        "trajectory": trajectory_from_table(table),
        "indicator": indicator,
        "attacks": attacks,
        "memorization": memorization,
        "thresholds": cfg.report.model_dump(),
    }
    store.results_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(store.results_dir / "indicator.json", indicator)
    atomic_write_json(store.results_dir / "attacks.json", attacks)
    if memorization is not None:
        atomic_write_json(store.results_dir / "memorization.json", memorization)
    atomic_write_json(store.results_dir / "result.json", result)
    return result
