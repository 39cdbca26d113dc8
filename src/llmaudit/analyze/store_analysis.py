"""The analysis of a run store: from its verified loss tables to one typed result
(`llmaudit.analyze.result.AnalysisResult`: r_Q, attacks and the release decision, memorization, candidate indicators,
blind baseline, utility), written to the store's results/*.json.

`analyze(cfg, store)` is what `llmaudit report` (and `llmaudit audit`) run before rendering; the typed result is what
every report rendering (JSON, Markdown, HTML) is made from.
"""

from __future__ import annotations

import functools
import json
import logging
import textwrap
import warnings
from typing import Any

import numpy as np
import pandas as pd

from llmaudit import __version__
from llmaudit.analyze.attacks.evaluate import attacks_with_evidence
from llmaudit.analyze.attacks.matrices import base_quantizer
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.attacks.workers import forked_beside
from llmaudit.analyze.blind import blind_baseline_for_pool
from llmaudit.analyze.candidates import validation_of
from llmaudit.analyze.candidates_table import candidates_from_table
from llmaudit.analyze.decision import DecisionSettings
from llmaudit.analyze.exposure import vulnerable_samples
from llmaudit.analyze.fidelity import divergence_from_table
from llmaudit.analyze.memorization import memorization_from_table
from llmaudit.analyze.release_risks import check_release_sets, epsilon_block, extraction_block, release_sets_block
from llmaudit.analyze.result import AnalysisResult
from llmaudit.analyze.rq_aggregate import indicator_from_table
from llmaudit.analyze.store_table import StoreTable, UnitFile, read_store_table
from llmaudit.analyze.taskmetrics import task_metrics_from_table
from llmaudit.analyze.utility import add_fidelity, trajectory_from_table, utility_from_table
from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_json, read_json, to_json
from llmaudit.common.runtime import available_cores
from llmaudit.config import ExperimentConfig
from llmaudit.config.fields import FULL_PLACEHOLDER
from llmaudit.quantize import full_precision_reference, get_quantizer
from llmaudit.score.utility import recorded_settings
from llmaudit.store.integrity import StoreVerdict, verify_store
from llmaudit.store.losstable import REFERENCE_RUN, LossTableError
from llmaudit.store.run_store import RunStore, content_digest

log = logging.getLogger(__name__)

RESULT_SCHEMA_VERSION = 1


class AnalysisError(UserError):
    """The store cannot be analysed as it is: the message names the files and the command that repairs them."""


def _verified(store: RunStore, cfg: ExperimentConfig, echo) -> StoreVerdict:
    """The store's verdict (`verify_store`), its notes echoed; refused with any problem or an unfinished run."""
    verdict = verify_store(store, cfg)
    if not verdict.ok:
        raise AnalysisError(verdict.message(store))
    for note in verdict.notes:  # a terminal or a CI log of 120 columns
        echo("\n".join(textwrap.wrap(f"[analyze] note: {note}", 120, subsequent_indent="  ", break_long_words=False)))
    unfinished = [r for r in range(cfg.train.runs) if not store.run_done(r)]
    if unfinished:
        raise AnalysisError(
            f"runs {unfinished} of {store.root} are not finished; `llmaudit finetune` finishes them first."
        )
    return verdict


def load_store_table(
    store: RunStore, cfg: ExperimentConfig, quantizers: list[str] | None = None, *, echo=print
) -> tuple[StoreTable, list[str], dict[str, int]]:
    """The verified loss tables of the quantizers whose every unit is done.

    Refuses a store with any problem (`verify_store`) or an unfinished run.

    Args:
        store: the run store.
        cfg: its experiment config.
        quantizers: the quantizers asked for (default: every one scored).
        echo: where notes go.

    Returns:
        (the tables, a `StoreTable`: the attacks read the token lists quantizer by quantizer; the quantizers read;
        {quantizer: units missing} for those left out).

    Raises:
        AnalysisError: the store has a problem, or no quantizer is completely scored.
    """
    verdict = _verified(store, cfg, echo)
    wanted = list(quantizers or store.scored_quantizers())
    unknown = [q for q in wanted if q not in store.scored_quantizers()]
    if unknown:
        raise AnalysisError(
            f"quantizer(s) {unknown} were never scored in {store.root}; scored: {store.scored_quantizers()}."
        )
    missing = {q: sum(1 for u, s in verdict.units.items() if u.quantizer == q and s != "done") for q in wanted}
    complete = [q for q in wanted if missing[q] == 0 and any(u.quantizer == q for u in verdict.units)]
    if not complete:
        raise AnalysisError(
            f"no quantizer of {store.root} is completely scored yet; `llmaudit score {store.root}` scores them."
        )
    if any(missing.values()):  # the analysis goes on without them
        left_out = {q: n for q, n in missing.items() if n}
        echo(
            f"[analyze] not completely scored yet, left out of this report (`llmaudit score` finishes them): {left_out}"
        )
    units = [
        UnitFile(u.run, u.step, u.quantizer, store.unit_path(u.run, u.step, u.quantizer))
        for u in sorted(verdict.units)
        if u.quantizer in complete or u.run == REFERENCE_RUN
    ]
    try:
        table = read_store_table(store.scores_dir, units)
    except LossTableError as exc:
        raise AnalysisError(
            f"{exc} Fix: `llmaudit score {store.root} --deep-verify` moves failed units aside and scores them again."
        ) from None
    return table, complete, {q: n for q, n in missing.items() if n}


def _attacks(
    cfg: ExperimentConfig, manifest: dict, store_table: StoreTable, quantizers: list[str], reference: str, r_q: dict
) -> tuple[dict, dict]:
    """(the attacks' result block, {quantizer: the evidence the release decision read}); r_q: the r_Q indicator."""
    membership = manifest["membership"]
    table = store_table.light
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attacks, evidence = attacks_with_evidence(
            table,
            AttackRunSettings(
                attacks=cfg.attack.attacks,
                fpc=cfg.attack.fpc,
                n_boot=cfg.attack.n_boot,
                seed=cfg.attack.seed,
                n_pool=membership["pool_size"],
                n_train=float(np.mean(membership["n_train"])),
            ),
            rows_of=store_table.rows_of,
            quantizers=quantizers,
            r_q={q: e["r_q"]["mean"] for q, e in r_q["per_quantizer"].items()},
            reference_quantizer=reference,
            decision=decision_settings(cfg),
            processes=cfg.report.processes or available_cores(),
        )
        for q, block in attacks.get("quantizers", {}).items():
            fpc_value = block.get("fpc") if isinstance(block.get("fpc"), (int, float)) else None
            block["vulnerable_samples"] = vulnerable_samples(table, q, fpc_value)
    return attacks, evidence


def release_sets_of(cfg: ExperimentConfig, scored: list[str]) -> list[list[str]]:
    """report.release_sets with the placeholder `full` named for the store (its full-precision quantizer).

    Args:
        cfg: the experiment config.
        scored: the quantizers scored in the store.

    Returns:
        The release sets, each a list of quantizer names.

    Raises:
        RecipeError: a set names a quantizer not among `scored` (one line naming the set and the closest name).
    """
    full = full_precision_reference(scored)
    sets = [
        [full if name == FULL_PLACEHOLDER and full else name for name in files] for files in cfg.report.release_sets
    ]
    check_release_sets(sets, scored)
    return sets


RISK_KEYS = ("extraction", "release_sets", "epsilon")
"""The result's store-wide risk blocks (`llmaudit.analyze.result_risks`)."""


def _release_risks(
    cfg: ExperimentConfig,
    store: RunStore,
    table: pd.DataFrame,
    evidence: dict,
    quantizers: list[str],
    reference: str,
    echo,
) -> dict[str, Any]:
    """The result's "extraction", "release_sets" (after the per-quantizer decision) and "epsilon" blocks, typed."""
    echo("[analyze] extraction risk, release sets, epsilon lower bound ...")
    settings = decision_settings(cfg)
    extraction = extraction_block(table, quantizers, reference, store.read_records("val"), settings)
    release_sets = []
    if cfg.report.release_sets:
        release_sets = release_sets_block(evidence, release_sets_of(cfg, quantizers), settings)
    epsilon = epsilon_block(evidence, store.manifest(), cfg.attack.seed)
    return {"extraction": extraction, "release_sets": release_sets, "epsilon": epsilon}


def decision_settings(cfg: ExperimentConfig) -> DecisionSettings:
    """The release rule's settings from a recipe's report section (docs/science.md section 12).

    Args:
        cfg: the experiment config.

    Returns:
        The settings.
    """
    r = cfg.report
    return DecisionSettings(
        limit=r.max_tpr_at_1pct_fpr,
        alpha=r.alpha,
        margin=r.equivalence_margin,
        folds=r.selection_folds,
        resamples=r.decision_resamples,
        seed=cfg.attack.seed,
        min_runs=r.min_runs,
    )


def _without_matched_base(table: pd.DataFrame, reference: str) -> pd.DataFrame:
    """The table without the base model's quantization-matched units (score.matched_base): only the
    attacks' *_qbase variants read them; memorization and utility compare with the reference unit."""
    base_q = base_quantizer(table, reference)
    if base_q is None:
        return table
    return table[(table["run"] != REFERENCE_RUN) | (table["quantizer"] == base_q)]


def _quantizer_info(store: RunStore, quantizers: list[str]) -> dict[str, dict]:
    return {q: store.quantizer_record(q) or {"name": q} for q in quantizers}  # each parsed by its schema


def _experiment_block(cfg: ExperimentConfig, store: RunStore, manifest: dict) -> dict[str, Any]:
    return {
        "name": manifest["name"],
        "run_dir": str(store.root),
        "identity_hash": manifest["identity_hash"],
        "origin": manifest.get("origin", "finetune"),
        "model": cfg.model.name,
        "model_source": manifest.get("model_source"),
        "lora": cfg.lora.model_dump(),
        "train": cfg.train.model_dump(),
        "data": {k: v for k, v in manifest["data"].items() if k not in ("pool_ids", "val_ids")},
        "membership": {k: v for k, v in manifest["membership"].items() if k != "masks"},
        "parameters": manifest.get("parameters", {}),
        "versions": manifest["versions"],
        "seeds": manifest["seeds"],
        "left_out_quantizers": {
            q: get_quantizer(q).availability() or "not scored in this store"
            for q in cfg.score.if_available
            if q not in store.scored_quantizers()
        },
    }


def _indicators(
    cfg: ExperimentConfig, table: pd.DataFrame, quantizers: list[str], reference: str, n_boot: int
) -> dict[str, Any]:
    """Every candidate indicator per quantizer (means over runs with intervals), with its recorded
    validation status; the per-run values stay in results/indicators_candidates.json."""
    full = candidates_from_table(
        table, reference_quantizer=reference, quantizers=quantizers, n_boot=n_boot, seed=cfg.attack.seed
    )
    if cfg.report.indicator not in full["candidates"]:
        raise AnalysisError(
            f"report.indicator={cfg.report.indicator!r} is not a candidate; choose one of {sorted(full['candidates'])}."
        )
    out = {"primary": cfg.report.indicator, "reference_quantizer": full.get("reference_quantizer"), "candidates": {}}
    for name, entry in full["candidates"].items():
        per_q = {
            q: {k: v for k, v in agg.items() if k not in ("values",)}
            for q, agg in (entry.get("per_quantizer") or {}).items()
        }
        out["candidates"][name] = {k: v for k, v in entry.items() if k != "per_quantizer"} | {
            "per_quantizer": per_q,
            "validation": validation_of(name),
        }
    return out


def _blind_baseline(store: RunStore, manifest: dict, cfg: ExperimentConfig) -> dict[str, Any]:
    """The blind baseline of the store's pool (reused from results/blind_baseline.json when it was
    computed on the same data and membership, e.g. by `llmaudit import`)."""
    key = {
        "fingerprint": manifest["data"].get("fingerprint"),
        "masks": content_digest({"membership": manifest["membership"]}),
    }
    path = store.results_dir / "blind_baseline.json"
    if path.exists():
        cached = read_json(path, what="blind baseline")
        if cached.get("key") == key:
            return cached
    blind = blind_baseline_for_pool(store.read_records("pool"), store.membership(), seed=cfg.attack.seed)
    blind["key"] = key
    atomic_write_json(path, blind)
    return blind


def _utility(
    cfg: ExperimentConfig,
    store: RunStore,
    table: pd.DataFrame,
    quantizers: list[str],
    reference: str,
    n_boot: int,
    echo,
) -> dict[str, Any]:
    """The result's utility blocks: "utility" (validation loss, with each quantizer's divergence summary and task
    metrics), "divergence" (llama.cpp's statistics per run) and "task_metrics" (per run, and the settings)."""
    echo("[analyze] divergence from full precision and task metrics ...")
    seed = cfg.attack.seed
    divergence = divergence_from_table(table, quantizers, reference, n_boot=n_boot, seed=seed)
    tasks = task_metrics_from_table(table, store.read_records("val"), quantizers, reference, n_boot=n_boot, seed=seed)
    utility = utility_from_table(table, quantizers, reference, n_boot=n_boot, seed=seed)
    return {
        "utility": add_fidelity(utility, divergence, tasks),
        "divergence": divergence,
        "task_metrics": tasks | {"settings": utility_settings(store, quantizers)},
    }


def utility_settings(store: RunStore, quantizers: list[str]) -> dict[str, Any] | None:
    """The utility settings recorded by the final units of the first run (docs/science.md section 11).

    Args:
        store: the run store.
        quantizers: the quantizers reported.

    Returns:
        The settings, None when no unit recorded any.
    """
    steps = store.checkpoints(0) if store.run_done(0) else []
    for q in quantizers:
        if steps and store.unit_path(0, steps[-1], q).exists():
            settings = recorded_settings(store.unit_path(0, steps[-1], q))
            if settings:
                return settings
    return None


def _beside_risks(
    cfg: ExperimentConfig,
    store: RunStore,
    table: pd.DataFrame,
    manifest: dict,
    quantizers: list[str],
    reference: str,
    n_boot: int,
    echo,
) -> dict[str, Any]:
    """The blocks that read neither the attacks nor the release risks, computed beside the risks (`forked_beside`):
    memorization, the candidate indicators, the blind baseline and the utility blocks, each from its own seed."""
    memorization = _memorization(table, manifest, cfg, n_boot, echo)
    echo("[analyze] candidate indicators and blind baseline ...")
    candidates, blind = _indicators(cfg, table, quantizers, reference, n_boot), _blind_baseline(store, manifest, cfg)
    return {
        **_utility(cfg, store, table, quantizers, reference, n_boot, echo),
        "memorization": memorization,
        "blind_baseline": blind,
        "indicators": candidates,
    }


def _memorization(table: pd.DataFrame, manifest: dict, cfg: ExperimentConfig, n_boot: int, echo) -> dict | None:
    """The memorization view when the table holds the base model's rows (run == REFERENCE_RUN), else None."""
    if not (table["run"] == REFERENCE_RUN).any():
        return None
    echo("[analyze] memorization ...")
    params = manifest.get("parameters", {})
    return memorization_from_table(
        table,
        adapter_params=params.get("adapter_trainable"),
        model_params=params.get("model_total"),
        n_boot=n_boot,
        seed=cfg.attack.seed,
    )


def _r_q(cfg: ExperimentConfig, table: pd.DataFrame, quantizers: list[str], n_boot: int, echo) -> dict[str, Any]:
    """The r_Q indicator of the quantizers reported, over runs (`indicator_from_table`)."""
    echo("[analyze] r_Q indicator ...")
    scored = table[table["quantizer"].isin(quantizers)]
    return indicator_from_table(scored, split="val", n_boot=n_boot, seed=cfg.attack.seed)


def _write_results(store: RunStore, result: AnalysisResult) -> None:
    """results/indicator.json, attacks.json, memorization.json (those computed) and result.json."""
    blocks = {"indicator": result.r_q, "attacks": result.attacks, "memorization": result.memorization}
    for name, block in blocks.items():
        if block is not None:
            atomic_write_json(store.results_dir / f"{name}.json", block.model_dump(mode="json", by_alias=True))
    atomic_write_json(store.results_dir / "result.json", result.to_json())


def _typed(result: dict[str, Any]) -> AnalysisResult:
    """The typed result of the analysis' blocks: numpy numbers made Python numbers (NaN kept), the release decision
    and the risk blocks kept as the analysis' own pydantic objects (`RISK_KEYS`), in their places."""
    decision = result["attacks"].pop("decision", None)
    risks = {k: result[k] for k in RISK_KEYS}
    typed = AnalysisResult.model_validate(json.loads(to_json(result | dict.fromkeys(RISK_KEYS))))
    if decision is not None:
        typed.attacks.decision = decision
    for key, block in risks.items():
        setattr(typed, key, block)
    return typed


def analyze(
    cfg: ExperimentConfig, store: RunStore, *, quantizers: list[str] | None = None, echo=print
) -> AnalysisResult:
    """Compute every result from the verified loss tables and write results/*.json.

    Args:
        cfg: the store's experiment config.
        store: the run store.
        quantizers: the quantizers to report (default: every quantizer scored in the store, add-only).
        echo: where progress lines go.

    Returns:
        The typed result (`AnalysisResult`), as written to results/result.json.

    Raises:
        AnalysisError: the store cannot be analysed as it is (the message names the files and the fix)."""
    manifest = store.manifest()
    release_sets_of(cfg, quantizers or store.scored_quantizers())  # refused before any work
    store_table, quantizers, not_scored = load_store_table(store, cfg, quantizers, echo=echo)
    reference = full_precision_reference(quantizers) or quantizers[0]
    table = _without_matched_base(store_table.light, reference)  # "base" everywhere else: the reference unit alone
    n_boot = max(cfg.attack.n_boot, 200)
    indicator = _r_q(cfg, table, quantizers, n_boot, echo)
    echo("[analyze] attacks ...")
    attacks, evidence = _attacks(cfg, manifest, store_table, quantizers, reference, indicator)
    side = functools.partial(_beside_risks, cfg, store, table, manifest, quantizers, reference, n_boot, echo)
    with forked_beside(side, cfg.report.processes or available_cores()) as side_blocks:
        risks = _release_risks(cfg, store, table, evidence, quantizers, reference, echo)
        beside = side_blocks()
    result = {
        "schema_version": RESULT_SCHEMA_VERSION,
        "llmaudit_version": __version__,
        "experiment": _experiment_block(cfg, store, manifest),
        "reference_quantizer": reference,
        "quantizers": quantizers,
        "not_scored": not_scored,
        "quantizer_info": _quantizer_info(store, quantizers),
        "trajectory": trajectory_from_table(table),
        "indicator": indicator,
        "attacks": attacks,
        **beside,
        **risks,
        "thresholds": cfg.report.model_dump(exclude={"processes"}),  # how the stage runs is not a threshold
    }
    _write_results(store, typed := _typed(result))
    return typed
