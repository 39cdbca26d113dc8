"""From the loss tables of an experiment to one result object: r_Q, attacks, memorization, utility.

The result object is what every report rendering (JSON, Markdown, HTML) is made from.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np

from llmaudit import __version__
from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.exposure import vulnerable_samples
from llmaudit.analyze.indicator import indicator_from_table
from llmaudit.analyze.memorization import memorization_from_table
from llmaudit.analyze.utility import trajectory_from_table, utility_from_table
from llmaudit.common.io import atomic_write_json, read_json
from llmaudit.config import ExperimentConfig
from llmaudit.quantize import full_precision_reference
from llmaudit.store.losstable import REFERENCE_RUN, read_loss_table
from llmaudit.store.run_store import RunStore

log = logging.getLogger(__name__)

RESULT_SCHEMA_VERSION = 1


def analyze(cfg: ExperimentConfig, store: RunStore, *, echo=print) -> dict[str, Any]:
    """Compute every result from the stored loss tables and write results/*.json."""

    manifest = store.manifest()
    table = read_loss_table(store.scores_dir)
    quantizers = [q for q in cfg.score.quantizers if q in set(table["quantizer"])]
    missing = [q for q in cfg.score.quantizers if q not in quantizers]
    if missing:
        echo(f"[analyze] not scored yet (run `llmaudit score`): {missing}")
    reference = full_precision_reference(quantizers) or quantizers[0]
    n_boot = cfg.attack.n_boot

    echo("[analyze] r_Q indicator ...")
    indicator = indicator_from_table(
        table[table["quantizer"].isin(quantizers)], split="val", n_boot=max(n_boot, 200), seed=cfg.attack.seed
    )
    r_q_means = {q: indicator["per_quantizer"][q]["r_q"]["mean"] for q in quantizers if q in indicator["per_quantizer"]}

    echo("[analyze] attacks ...")
    membership = manifest["membership"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attacks = run_attacks(
            table,
            quantizers=quantizers,
            attacks=cfg.attack.attacks,
            fpc=cfg.attack.fpc,
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
