"""Validation of the candidate indicators on reported run stores (docs/science.md section 8): Spearman
across quantizers between each candidate and each attack's AUROC (`store_validation`). Part of
`llmaudit validate indicators` (`llmaudit.validate.candidate_validation`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from llmaudit.analyze.candidates_table import candidates_from_table
from llmaudit.analyze.result import AnalysisResult, as_result
from llmaudit.common.io import read_json
from llmaudit.common.stats import partial_spearman, spearman
from llmaudit.store.losstable import read_loss_table
from llmaudit.store.run_store import RunStore

PASS_P_VALUE = 0.05
"""Pass rule, real part: significance level of the Spearman test against an attack's AUROC."""
DAMAGE_CONTROL = "heldout_loss_control"
"""The damage control partialled out of every candidate's real-model correlation (an extra column, not part of
the pre-registered pass rule)."""
GROUND_TRUTH_ATTACKS = ("ref", "lira_offline")
"""Attacks whose AUROC is the real-model ground truth."""
SHOWN_ATTACKS = (*GROUND_TRUTH_ATTACKS, "loss")
"""Attacks shown in the table (LOSS shares its statistic with the loss-gap candidates)."""

# ---- (b) a run store against its attacks -------------------------------------------------------------


def is_store_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "manifest.json").exists() or (path / "scores").is_dir())


def _load_source(
    source: RunStore | str | Path | pd.DataFrame, result: Mapping[str, Any] | str | Path | None
) -> tuple[pd.DataFrame, AnalysisResult | None, str, str | None]:
    """(loss table, the typed analysis result or None, label of the source, why the result is missing)."""
    if isinstance(source, pd.DataFrame):
        table, label, result_path = source, "loss table (in memory)", None
    else:
        store = source if isinstance(source, RunStore) else None
        path = Path(source.root if store is not None else source)
        if store is None and is_store_dir(path):
            store = RunStore(path)
        if store is not None:
            table = read_loss_table(store.scores_dir)
            label, result_path = str(store.root), store.results_dir / "result.json"
        else:
            table, label, result_path = read_loss_table(path), str(path), None
    if isinstance(result, (Mapping, AnalysisResult)):
        return table, as_result(dict(result) if isinstance(result, Mapping) else result), label, None
    if result is not None:
        result_path = Path(result)
    if result_path is None:
        return table, None, label, "no result.json given: the attacks are unknown"
    if not result_path.exists():
        return table, None, label, f"{result_path} does not exist: the store has not been analysed/reported yet"
    return table, as_result(read_json(result_path, what="result")), label, None


def _aurocs(result: AnalysisResult) -> dict[str, dict[str, float]]:
    """{attack: {quantizer: pooled naive AUROC}} from the result's attacks."""
    out: dict[str, dict[str, float]] = {}
    for q, block in result.attacks.quantizers.items():
        for attack, entry in block.attacks.items():
            auroc = entry.headline.get("auroc")
            if auroc is not None:
                out.setdefault(attack, {})[q] = float(auroc)
    return out


def _store_selection(
    table: pd.DataFrame, res: AnalysisResult | None, reference_quantizer: str | None
) -> tuple[list[str] | None, str | None]:
    """(quantizers, reference quantizer) of `store_validation`: the result's quantizers present in the table
    (None = all), the argument's reference, else the result's; None when the table lacks it."""
    quantizers = None
    reference = reference_quantizer
    if res is not None:
        present = set(table["quantizer"].astype(str))
        quantizers = [str(q) for q in res.quantizers if str(q) in present] or None
        reference = reference if reference is not None else res.reference_quantizer
    if reference is not None and reference not in set(table["quantizer"].astype(str)):
        reference = None
    return quantizers, reference


def _candidate_vs_attacks(
    entry: Mapping[str, Any],
    quantizers: Sequence[str],
    aurocs: Mapping[str, Mapping[str, float]],
    attacks: Sequence[str],
    damage: Mapping[str, float],
) -> dict[str, Any]:
    """One candidate of `store_validation`: its means per quantizer (from its `candidates_from_table` entry),
    Spearman against each attack's AUROC with the significance flags, and the partial Spearman against each
    ground-truth attack given the damage control."""
    means = {q: e["mean"] for q, e in entry["per_quantizer"].items()}
    corr = {}
    for a in attacks:
        qs = [q for q in quantizers if q in aurocs[a]]
        c = spearman([means[q] for q in qs], [aurocs[a][q] for q in qs])
        d = c.to_dict("n_quantizers")
        d["significant_negative"] = c.rho is not None and c.p_value < PASS_P_VALUE and c.rho < 0
        d["significant_positive"] = c.rho is not None and c.p_value < PASS_P_VALUE and c.rho > 0
        corr[a] = d
    partial = {}
    for a in (x for x in GROUND_TRUTH_ATTACKS if x in aurocs):
        qs = [q for q in quantizers if q in aurocs[a]]
        partial[a] = partial_spearman(
            [means[q] for q in qs], [aurocs[a][q] for q in qs], [damage.get(q, math.nan) for q in qs]
        ).to_dict("n_quantizers")
    return {
        **{k: entry[k] for k in ("name", "version", "family", "checkpoints", "formula", "orientation")},
        "computable": entry["computable"],
        "reason": entry["reason"],
        "means": means,
        "n_finite": {q: e["n_finite"] for q, e in entry["per_quantizer"].items()},
        "spearman_vs_auroc": corr,
        "partial_vs_auroc_given_damage": partial,
    }


def store_validation(
    source: RunStore | str | Path | pd.DataFrame,
    result: AnalysisResult | Mapping[str, Any] | str | Path | None = None,
    *,
    reference_quantizer: str | None = None,
    names: Sequence[str] | None = None,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Every candidate on a run store (or a loss table) against the store's attacks.

    source: a RunStore, a run directory (its loss tables are `read_loss_table(store.scores_dir)`, its result
    `results/result.json`), a loss-table path, or a loss table. result: the result object or its path
    (default: the store's results/result.json). The candidates are `candidates_from_table` on the table
    restricted to the result's quantizers (reference quantizer: the argument, else the result's). Per candidate
    and attack: Spearman (ties averaged) with p-value across quantizers between the candidate's mean and the
    attack's pooled AUROC; expected sign NEGATIVE. Ground truth: "ref" and "lira_offline"; every attack
    present in the result is correlated. Without a result the candidates are computed and no correlation is
    (reported = False, with the reason)."""
    table, res, label, missing = _load_source(source, result)
    quantizers, reference = _store_selection(table, res, reference_quantizer)
    if names is not None and DAMAGE_CONTROL not in names:
        names = [*names, DAMAGE_CONTROL]  # the partial correlations below need it
    cand = candidates_from_table(
        table, reference_quantizer=reference, quantizers=quantizers, names=names, n_boot=n_boot, seed=seed
    )
    damage = {q: e["mean"] for q, e in cand["candidates"][DAMAGE_CONTROL]["per_quantizer"].items()}
    aurocs = _aurocs(res) if res is not None else {}
    attacks = [a for a in SHOWN_ATTACKS if a in aurocs] + sorted(a for a in aurocs if a not in SHOWN_ATTACKS)
    out_c = {
        n: _candidate_vs_attacks(entry, cand["quantizers"], aurocs, attacks, damage)
        for n, entry in cand["candidates"].items()
    }
    return {
        "kind": "store",
        "source": label,
        "reported": res is not None,
        "reason": missing,
        "reference_quantizer": cand["reference_quantizer"],
        "quantizers": cand["quantizers"],
        "runs": cand["runs"],
        "attacks": attacks,
        "ground_truth_attacks": [a for a in GROUND_TRUTH_ATTACKS if a in attacks],
        "expected_sign": "negative (higher = more secure goes with a lower attack AUROC)",
        "auroc": aurocs,
        "candidates": out_c,
        "indicator_table": {k: v for k, v in cand.items() if k != "per_run"},
    }
