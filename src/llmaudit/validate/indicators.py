"""Validation of the candidate attack-free indicators (docs/science.md section 8).

`llmaudit validate indicators` runs `validate_indicators_command`: every candidate of
`llmaudit.analyze.indicators.CANDIDATES`

(a) on the synthetic protocol (docs/science.md section 5) against the baseline MIS, `synthetic_validation`:
    per data set Spearman over the quantizers between the candidate's mean over runs and the MIS; the mean
    over data sets with its bootstrap spread over runs; rank stability at 5, 10, 15 and 30 runs; and, as
    labelled extra columns, the pooled Spearman over all (data set, quantizer) cells and the share of the
    nested-quantizer pairs ordered as the data-processing inequality demands (DPI pairs);
(b) on any run store that has been reported (results/result.json holds the attacks), `store_validation`:
    Spearman with p-value across quantizers between each candidate (`candidates_from_table` on the store's
    loss tables) and each attack's AUROC; expected sign NEGATIVE (higher = more secure goes with weaker
    attacks); the reference attack ("ref") and offline LiRA ("lira_offline") are the ground truth, LOSS
    is shown beside them (the member-vs-held-out candidates are effect sizes of its score);

and writes one table (indicators.json, indicators.md) with each candidate's `validation_status`.

The synthetic part reuses the protocol's own code: `make_dataset`, `init_linear`, `train_batched`, the
quantizers and losses of `classifier`, the MIS discriminators of `mis.mis_estimate` (same seeds as
`llmaudit validate synthetic`, so the MIS are the same numbers) and its bootstrap `boot_spearman`.
Per-data-set arrays (candidate values per run, MIS, discriminator test results) are cached under the
output directory, keyed by the configuration and the candidates' versions, so a rerun is cheap.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from llmaudit.analyze.indicator import ranking_stability
from llmaudit.analyze.indicators import (
    CANDIDATES,
    CONTROL_FAMILIES,
    ORIENTATION,
    PREREGISTRATION,
    candidates_from_table,
    evaluate_candidates,
)
from llmaudit.common.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from llmaudit.common.runtime import torch_threads
from llmaudit.common.stats import partial_spearman, percentile_interval, spearman, spearman_rho
from llmaudit.config import RecipeError, load_recipe
from llmaudit.store.losstable import read_loss_table
from llmaudit.store.run_store import RunStore
from llmaudit.validate.synthetic.classifier import init_linear, point_losses, quantized_params, train_batched
from llmaudit.validate.synthetic.config import SyntheticConfig, load_config
from llmaudit.validate.synthetic.data import derive_seed, make_dataset
from llmaudit.validate.synthetic.mis import mis_estimate
from llmaudit.validate.synthetic.protocol import boot_spearman

STABILITY_K_RUNS = (5, 10, 15, 30)
"""Run counts of the rank-stability study."""
STABILITY_RESAMPLES = 50
"""Random subsets per run count."""
STATUS_K_RUNS = 15
"""The stability column of the summary table."""
DPI_CHAIN = ("sign", "uniform-2", "uniform-3", "uniform-4", "uniform-5")
"""Nested quantizers, coarsest first: each output is a function of every finer one, so the true MIS is
non-increasing along the chain (docs/science.md sections 1 and 8)."""
GROUND_TRUTH_ATTACKS = ("ref", "lira_offline")
"""Attacks whose AUROC is the real-model ground truth."""
SHOWN_ATTACKS = (*GROUND_TRUTH_ATTACKS, "loss")
"""Attacks shown in the table (LOSS shares its statistic with the loss-gap candidates)."""
PASS_SYNTHETIC_MEAN_SPEARMAN = 0.86
"""Pass rule, synthetic part: mean Spearman against the MIS at least the value the indicator paper reports."""
PASS_P_VALUE = 0.05
"""Pass rule, real part: significance level of the Spearman test against an attack's AUROC."""
DAMAGE_CONTROL = "heldout_loss_control"
"""The damage control partialled out of every candidate's real-model correlation (an extra column, not part of
the pre-registered pass rule)."""
REAL_MODEL_RECIPES = ("smollm2-135m-cpu", "qwen2.5-0.5b-smolinstruct")
"""The shipped real-model recipes whose run stores (default output directories) are validated by default
when they exist: the 2-core CPU audit of SmolLM2-135M-Instruct and the indicator paper's Qwen2.5 grid."""
QUICK_OVERRIDES = (
    "k_modes=[6]",
    "sigmas=[1.5, 3.0]",
    "n_runs=40",
    "epochs=6",
    "converged_from_epoch=1",
    "n_val=200",
    "n_boot=200",
    "disc_hidden=32",
    "disc_epochs=2",
    "threads=1",
)
"""quick mode: 2 data sets x 40 runs, 6 epochs, a smaller MIS discriminator, one thread (tiny batched ops
run fastest on one; a smoke test, never counted by the pass rule)."""
CACHE_VERSION = 1
_CACHE_IRRELEVANT = (
    "plots",
    "threads",
    "stability_k_runs",
    "stability_resamples",
    "stability_mis_resamples",
    "n_boot",
    "confidence",
    "variants",
    "converged_from_epoch",
    "perturb_scale",
    "perturb_points",
    "rq_loss_split",
    "rq_ddof",
)
"""Configuration keys that change no cached array (the candidates fix their own ddof and inputs)."""


# ---- (a) the synthetic protocol ------------------------------------------------------------------------


def _finite_means(values: np.ndarray) -> np.ndarray:
    """Mean over the last axis of the finite entries (nan where there are none)."""
    ok = np.isfinite(values)
    with np.errstate(invalid="ignore"):
        return np.where(ok.any(-1), np.where(ok, values, 0.0).sum(-1) / np.maximum(ok.sum(-1), 1), np.nan)


def _trajectory_inputs(
    quantizer: str | None, w: torch.Tensor, b: torch.Tensor, data: dict[str, torch.Tensor], cfg: SyntheticConfig
) -> dict[str, np.ndarray]:
    """Per-run inputs of the candidates for one quantizer (None = full precision), all runs at once.

    w [K, R, C, d], b [K, R, C]: the trajectory checkpoints entering the indicators. Returns val [R, K, n_val],
    train [R, K, n_train] (per-sample cross-entropy of the (quantized) checkpoints) and theta [R, K, C*d + C]
    (flattened (quantized) weight then bias)."""
    K, R, C, d = w.shape
    if quantizer is not None:
        wq, bq = quantized_params(quantizer, w.reshape(K * R, C, d), b.reshape(K * R, C), cfg.quantize_bias)
        w, b = wq.view(K, R, C, d), bq.view(K, R, C)
    with torch.no_grad():
        val = point_losses(w, b, data["x_val"], data["y_val"])
        train = point_losses(w, b, data["x_train"], data["y_train"])
    theta = torch.cat([w.reshape(K, R, C * d), b], -1).transpose(0, 1)
    return {"val": val.double().numpy(), "train": train.double().numpy(), "theta": theta.double().numpy()}


def _cache_key(cfg: SyntheticConfig, ds_index: int, k_modes: int, sigma: float, names: Sequence[str]) -> str:
    relevant = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in _CACHE_IRRELEVANT}
    blob = {
        "cache_version": CACHE_VERSION,
        "config": relevant,
        "dataset": [ds_index, k_modes, sigma],
        "candidates": [CANDIDATES[n].version for n in names],
    }
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _cached_arrays(
    path: Path, key: str, ds_name: str, names: list[str], quantizers: list[str]
) -> dict[str, Any] | None:
    """The arrays of `synthetic_dataset_arrays` from its cache file `path`, or None when the file is missing or
    was written for another key (configuration or candidate versions)."""
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as z:
        if str(z["key"]) != key:
            return None
        return {
            "name": ds_name,
            "values": z["values"],
            "mis": z["mis"],
            "correct": z["correct"],
            "candidates": names,
            "quantizers": quantizers,
            "timing_s": json.loads(str(z["timing"])),
            "cached": True,
        }


def _save_arrays(path: Path, key: str, arrays: Mapping[str, Any]) -> None:
    """Write the arrays of `synthetic_dataset_arrays` to its cache file `path` under `key` (atomically)."""
    buf = io.BytesIO()
    np.savez(
        buf,
        key=np.array(key),
        values=arrays["values"],
        mis=arrays["mis"],
        correct=arrays["correct"],
        candidates=np.array(arrays["candidates"]),
        quantizers=np.array(arrays["quantizers"]),
        timing=np.array(json.dumps(arrays["timing_s"])),
    )
    atomic_write_bytes(path, buf.getvalue())


def _candidate_values(
    w: torch.Tensor,
    b: torch.Tensor,
    data: dict[str, torch.Tensor],
    cfg: SyntheticConfig,
    names: list[str],
    quantizers: list[str],
) -> np.ndarray:
    """values [C, Q, R]: every candidate of `names` per quantizer and run, from the trajectory checkpoints
    w [K, R, C, d], b [K, R, C] (quantized per quantizer; full precision for the *_fp and theta_final inputs)."""
    fp = _trajectory_inputs(None, w, b, data, cfg)
    values = np.full((len(names), len(quantizers), w.shape[1]), math.nan)
    for qi, q in enumerate(quantizers):
        x = _trajectory_inputs(q, w, b, data, cfg)
        inputs = {
            "val": x["val"],
            "train": x["train"],
            "val_fp": fp["val"],
            "train_fp": fp["train"],
            "theta_q_final": x["theta"][:, -1],
            "theta_final": fp["theta"][:, -1],
            "theta_q_traj": x["theta"],
        }
        for ci, v in enumerate(evaluate_candidates(inputs, names).values()):
            values[ci, qi] = v
        del x, inputs
    del fp
    return values


def synthetic_dataset_arrays(
    cfg: SyntheticConfig,
    ds_index: int,
    k_modes: int,
    sigma: float,
    *,
    names: Sequence[str] | None = None,
    cache_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train one data set's runs and compute every candidate per run and the baseline MIS.

    Returns values [C, Q, R] (candidate x quantizer x run, higher = more secure), mis [Q],
    correct [Q, R_test] (fraction of correctly classified rows per discriminator test run), and the names.
    Cached as `cache_dir/<data set>.npz` when `cache_dir` is given (keyed by config and candidate versions)."""
    names = list(CANDIDATES) if names is None else list(names)
    quantizers = list(cfg.quantizers)
    ds_name = f"k{k_modes}-s{sigma:g}"
    key = _cache_key(cfg, ds_index, k_modes, sigma, names)
    path = None if cache_dir is None else Path(cache_dir) / f"{ds_name}.npz"
    cached = None if path is None else _cached_arrays(path, key, ds_name, names, quantizers)
    if cached is not None:
        log(f"[{ds_index + 1}] {ds_name}: cached ({path})")
        return cached
    t0 = time.perf_counter()
    data = make_dataset(cfg, ds_index, k_modes, sigma)
    R = cfg.n_runs
    w0, b0 = init_linear([derive_seed(cfg.seed, ds_index, "init", r) for r in range(R)], cfg.dim)
    traj_w, traj_b = train_batched(
        data["x_train"], data["y_train"], w0, b0, data["order"], lr=cfg.lr, batch_size=cfg.batch_size
    )
    t_train = time.perf_counter() - t0

    t1 = time.perf_counter()
    e0 = cfg.rq_first_epoch
    values = _candidate_values(traj_w[e0:], traj_b[e0:], data, cfg, names, quantizers)
    t_cand = time.perf_counter() - t1

    t2 = time.perf_counter()
    mis = mis_estimate(quantizers, traj_w[-1], traj_b[-1], data, torch.arange(R), cfg, (ds_index, "mis", R))
    t_mis = time.perf_counter() - t2
    timing = {"train": t_train, "candidates": t_cand, "mis": t_mis}
    log(
        f"[{ds_index + 1}] {ds_name}: train {t_train:.0f}s, candidates {t_cand:.0f}s, MIS {t_mis:.0f}s; MIS "
        + " ".join(f"{q}={m:.3f}" for q, m in zip(quantizers, mis["mis"]))
    )
    out = {
        "name": ds_name,
        "values": values,
        "mis": np.asarray(mis["mis"], dtype=np.float64),
        "correct": np.asarray(mis["correct_per_run"], dtype=np.float64),
        "candidates": names,
        "quantizers": quantizers,
        "timing_s": timing,
        "cached": False,
    }
    if path is not None:
        _save_arrays(path, key, out)
    return out


def _stability(
    per_run: np.ndarray, mis: np.ndarray, k_runs: Sequence[int], seed: int
) -> tuple[dict[str, float], dict[str, float]]:
    """(vs the all-runs ranking, vs the MIS ranking): mean Spearman of k-run rankings, per k.

    per_run [Q, R]. The first is `ranking_stability` (docs/science.md section 2); the second draws the same
    subsets (same generator, same order) and compares their means with the MIS instead."""
    Q, R = per_run.shape
    ks = [int(k) for k in k_runs if k <= R]
    own = ranking_stability({str(i): per_run[i] for i in range(Q)}, ks, n_resamples=STABILITY_RESAMPLES, seed=seed)
    rng = np.random.default_rng(seed)
    vs_mis = {}
    for k in ks:
        rhos = [
            spearman_rho(_finite_means(per_run[:, rng.choice(R, size=k, replace=False)]), mis, min_n=2)
            for _ in range(STABILITY_RESAMPLES)
        ]
        vs_mis[str(k)] = float(np.nanmean(rhos)) if np.isfinite(rhos).any() else math.nan
    return {str(s["k_runs"]): s["mean_rho"] for s in own["by_size"]}, vs_mis


def _dpi_pairs(series: Sequence[np.ndarray], quantizers: Sequence[str]) -> dict[str, Any]:
    """Share of the DPI-chain pairs (coarser, finer) where series[coarser] >= series[finer] (ties 1/2),
    over data sets; pairs with a non-finite side are skipped and counted."""
    chain = [quantizers.index(q) for q in DPI_CHAIN if q in quantizers]
    scores, skipped = [], 0
    for v in series:
        for a in range(len(chain)):
            for b in range(a + 1, len(chain)):
                x, y = v[chain[a]], v[chain[b]]
                if not (np.isfinite(x) and np.isfinite(y)):
                    skipped += 1
                    continue
                scores.append(1.0 if x > y else 0.5 if x == y else 0.0)
    return {
        "share": float(np.mean(scores)) if scores else math.nan,
        "n_pairs": len(scores),
        "n_skipped": skipped,
        "chain": [quantizers[i] for i in chain],
    }


def _dataset_statistics(
    cfg: SyntheticConfig,
    ds_index: int,
    k_modes: int,
    sigma: float,
    names: list[str],
    cache_dir: Path | None,
    k_runs: Sequence[int],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """One data set of `synthetic_validation`: its arrays (`synthetic_dataset_arrays`), the candidates' means
    over runs [C, Q], their Spearman with the MIS [C], the bootstrap rhos [C, n_boot] (the same generator seed
    for every candidate), the rank stability per candidate and the non-finite run counts [C, Q]."""
    with torch_threads(cfg.threads or None):
        arrays = synthetic_dataset_arrays(cfg, ds_index, k_modes, sigma, names=names, cache_dir=cache_dir, log=log)
    means = _finite_means(arrays["values"])  # [C, Q]
    ds = {"name": arrays["name"], "k_modes": k_modes, "sigma": sigma, "mis": arrays["mis"], "means": means}
    ds["rho"] = np.array([spearman_rho(means[c], arrays["mis"]) for c in range(len(names))])
    ds["boots"] = np.stack(
        [
            boot_spearman(
                arrays["values"][c],
                arrays["correct"],
                cfg.n_boot,
                np.random.default_rng(derive_seed(cfg.seed, ds_index, "indicators-boot")),
            )
            for c in range(len(names))
        ]
    )  # [C, n_boot]
    stab_seed = derive_seed(cfg.seed, ds_index, "indicators-stab")
    ds["stability"] = [_stability(arrays["values"][c], arrays["mis"], k_runs, stab_seed) for c in range(len(names))]
    ds["n_nonfinite"] = (~np.isfinite(arrays["values"])).sum(-1)  # [C, Q]
    ds["timing_s"] = arrays["timing_s"]
    ds["cached"] = arrays["cached"]
    return ds


def _synthetic_summary(
    name: str,
    c: int,
    per_ds: Sequence[Mapping[str, Any]],
    mis_all: np.ndarray,
    quantizers: Sequence[str],
    confidence: float,
) -> dict[str, Any]:
    """Candidate `name` (row `c` of every data set's arrays) over the data sets of `synthetic_validation`: mean,
    bootstrap sd and interval, min and max of the per-data-set Spearman, stability, and the two extras."""
    ds_names = [d["name"] for d in per_ds]
    rhos = np.array([d["rho"][c] for d in per_ds])
    boots = np.nanmean(np.stack([d["boots"][c] for d in per_ds]), axis=0)
    cells = np.concatenate([d["means"][c] for d in per_ds])
    pooled = spearman(cells, mis_all)
    stab_keys = per_ds[0]["stability"][c][0].keys()
    return {
        **CANDIDATES[name].describe(),
        "mean_spearman": float(np.nanmean(rhos)) if np.isfinite(rhos).any() else math.nan,
        "boot_sd": float(np.nanstd(boots)) if np.isfinite(boots).any() else math.nan,
        "boot_ci": list(percentile_interval(boots, confidence)),
        "per_dataset": dict(zip(ds_names, rhos.tolist())),
        "min": float(np.nanmin(rhos)) if np.isfinite(rhos).any() else math.nan,
        "max": float(np.nanmax(rhos)) if np.isfinite(rhos).any() else math.nan,
        "stability": {k: float(np.nanmean([d["stability"][c][0][k] for d in per_ds])) for k in stab_keys},
        "stability_vs_mis": {k: float(np.nanmean([d["stability"][c][1][k] for d in per_ds])) for k in stab_keys},
        "extra_pooled_spearman": pooled.to_dict("n_cells"),
        "extra_dpi_pairs": _dpi_pairs([d["means"][c] for d in per_ds], quantizers),
        "n_nonfinite_runs": int(sum(d["n_nonfinite"][c].sum() for d in per_ds)),
        "means": {d["name"]: dict(zip(quantizers, d["means"][c].tolist())) for d in per_ds},
    }


def _synthetic_protocol(cfg: SyntheticConfig) -> dict[str, Any]:
    """The `protocol` block of `synthetic_validation`: what is compared with what, and how."""
    return {
        "protocol": "docs/science.md section 5 (data, classifier, quantizers, baseline MIS as in "
        "`llmaudit validate synthetic`, same seeds); candidates of docs/science.md section 8",
        "trajectory": f"checkpoints of epochs {cfg.rq_first_epoch}..{cfg.epochs}; the last = the released model",
        "inputs": "val: per-sample cross-entropy on the data set's validation points; train: on the run's own "
        "training samples; *_fp: unquantized checkpoints; theta: flattened (quantized) weight and bias",
        "comparison": "per data set: Spearman (ties averaged) over the quantizers between the candidate's mean "
        "over its finite runs and the MIS; mean over data sets",
        "spread": f"bootstrap ({cfg.n_boot} resamples) of candidate runs and MIS test runs (discriminator fixed), "
        "the same resamples for every candidate; per-data-set rhos averaged per resample; sd and percentile CI",
        "stability": f"{STABILITY_RESAMPLES} random subsets of k runs (without replacement) per k; mean Spearman of "
        "the subset ranking with the all-runs ranking (`stability`) and with the MIS (`stability_vs_mis`)",
        "extra_pooled_spearman": "EXTRA: Spearman over all (data set, quantizer) cells of candidate means vs MIS: "
        "an indicator of leakage must also follow the MIS across data sets",
        "extra_dpi_pairs": "EXTRA: share of the pairs (coarser, finer) of the nested chain "
        + " <= ".join(DPI_CHAIN)
        + " in which the candidate ranks the coarser quantizer at least as secure (ties 1/2), over data sets; "
        "the true MIS satisfies every pair (data-processing inequality)",
        "orientation": ORIENTATION,
        "preregistration": PREREGISTRATION,
    }


def synthetic_validation(
    cfg: SyntheticConfig,
    *,
    names: Sequence[str] | None = None,
    cache_dir: str | Path | None = None,
    k_runs: Sequence[int] = STABILITY_K_RUNS,
    quick: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every candidate on the synthetic protocol (docs/science.md sections 5 and 8) against the baseline MIS.

    Per data set: Spearman over the quantizers between the candidate's mean over its finite runs and the
    MIS; bootstrap over runs (`boot_spearman`: candidate runs and MIS test runs resampled, discriminator
    fixed; the same resamples for every candidate); rank stability at `k_runs` (`ranking_stability`, 50
    subsets) against the all-runs ranking and against the MIS. Summary: mean over data sets, bootstrap sd
    and interval of that mean, per-data-set min and max, and two labelled extras: the pooled Spearman over
    all (data set, quantizer) cells and the DPI-pair share. Returns a JSON-ready dict."""
    names = list(CANDIDATES) if names is None else list(names)
    quantizers = list(cfg.quantizers)
    grid = [(k, s) for k in cfg.k_modes for s in cfg.sigmas]
    t0 = time.perf_counter()
    per_ds = [
        _dataset_statistics(cfg, i, k, s, names, None if cache_dir is None else Path(cache_dir), k_runs, log)
        for i, (k, s) in enumerate(grid)
    ]
    wall = time.perf_counter() - t0

    ds_names = [d["name"] for d in per_ds]
    mis_all = np.concatenate([d["mis"] for d in per_ds])
    candidates = {n: _synthetic_summary(n, c, per_ds, mis_all, quantizers, cfg.confidence) for c, n in enumerate(names)}
    return {
        "kind": "synthetic",
        "quick": quick,
        "config": cfg.model_dump(mode="json"),
        "protocol": _synthetic_protocol(cfg),
        "datasets": ds_names,
        "quantizers": quantizers,
        "k_runs": [int(k) for k in k_runs if k <= cfg.n_runs],
        "mis": {d["name"]: dict(zip(quantizers, d["mis"].tolist())) for d in per_ds},
        "mis_dpi_pairs": _dpi_pairs([d["mis"] for d in per_ds], quantizers),
        "candidates": candidates,
        "timing_s": {d["name"]: d["timing_s"] for d in per_ds},
        "cached": {d["name"]: d["cached"] for d in per_ds},
        "wall_time_s": wall,
    }


# ---- (b) a run store against its attacks -------------------------------------------------------------


def _is_store_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "manifest.json").exists() or (path / "scores").is_dir())


def _load_source(
    source: RunStore | str | Path | pd.DataFrame, result: Mapping[str, Any] | str | Path | None
) -> tuple[pd.DataFrame, Mapping[str, Any] | None, str, str | None]:
    """(loss table, result object or None, label of the source, why the result is missing)."""
    if isinstance(source, pd.DataFrame):
        table, label, result_path = source, "loss table (in memory)", None
    else:
        store = source if isinstance(source, RunStore) else None
        path = Path(source.root if store is not None else source)
        if store is None and _is_store_dir(path):
            store = RunStore(path)
        if store is not None:
            table = read_loss_table(store.scores_dir)
            label, result_path = str(store.root), store.results_dir / "result.json"
        else:
            table, label, result_path = read_loss_table(path), str(path), None
    if isinstance(result, Mapping):
        return table, result, label, None
    if result is not None:
        result_path = Path(result)
    if result_path is None:
        return table, None, label, "no result.json given: the attacks are unknown"
    if not result_path.exists():
        return table, None, label, f"{result_path} does not exist: the store has not been analysed/reported yet"
    return table, read_json(result_path, what="result"), label, None


def _aurocs(result: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """{attack: {quantizer: pooled naive AUROC}} from a result object's attacks block."""
    out: dict[str, dict[str, float]] = {}
    for q, block in ((result.get("attacks") or {}).get("quantizers") or {}).items():
        for attack, entry in (block.get("attacks") or {}).items():
            auroc = (entry.get("headline") or {}).get("auroc")
            if auroc is not None:
                out.setdefault(attack, {})[q] = float(auroc)
    return out


def _store_selection(
    table: pd.DataFrame, res: Mapping[str, Any] | None, reference_quantizer: str | None
) -> tuple[list[str] | None, str | None]:
    """(quantizers, reference quantizer) of `store_validation`: the result's quantizers present in the table
    (None = all), the argument's reference, else the result's; None when the table lacks it."""
    quantizers = None
    reference = reference_quantizer
    if res is not None:
        present = set(table["quantizer"].astype(str))
        quantizers = [str(q) for q in res.get("quantizers", []) if str(q) in present] or None
        reference = reference if reference is not None else res.get("reference_quantizer")
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
    result: Mapping[str, Any] | str | Path | None = None,
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


# ---- (c) the command, the table and the pass rule ----------------------------------------------------------


def default_stores() -> list[Path]:
    """The run stores of the shipped real-model recipes (`REAL_MODEL_RECIPES`, their default output
    directories relative to the working directory) that exist, as absolute paths; else none."""
    found = []
    for recipe in REAL_MODEL_RECIPES:
        try:
            path = load_recipe(recipe).resolved_output_dir()
        except RecipeError:
            continue  # a recipe this installation does not ship
        if _is_store_dir(path):
            found.append(path.resolve())
    return found


def validation_status(name: str, results: Mapping[str, Any]) -> dict[str, Any]:
    """The pass rule of docs/science.md section 8 for candidate `name`, from the results of
    `validate_indicators_command` ({"synthetic": ..., "stores": [...]}).

    passed: synthetic mean Spearman >= 0.86 (full protocol, not quick mode) AND, on the real stores, a
    significantly negative Spearman (p < 0.05) against the AUROC of at least one ground-truth attack with none
    significantly positive. failed: a criterion is measured and not met. not validated: otherwise (a criterion
    could not be measured: no synthetic run, quick mode, no reported store, or the candidate is not computable
    from the stores). Returns {"status", "criteria"}."""
    synth = results.get("synthetic")
    crit_syn: dict[str, Any] = {"rule": f"synthetic mean Spearman vs MIS >= {PASS_SYNTHETIC_MEAN_SPEARMAN}"}
    if not synth or name not in synth.get("candidates", {}):
        crit_syn.update(status="not measured", value=None, why="no synthetic validation")
    elif synth.get("quick"):
        value = synth["candidates"][name]["mean_spearman"]
        crit_syn.update(status="not measured", value=value, why="quick mode (a smoke test) does not count")
    else:
        value = synth["candidates"][name]["mean_spearman"]
        ok = value is not None and math.isfinite(value) and value >= PASS_SYNTHETIC_MEAN_SPEARMAN
        crit_syn.update(status="passed" if ok else "failed", value=value)

    crit_real: dict[str, Any] = {
        "rule": f"Spearman vs the AUROC of {' or '.join(GROUND_TRUTH_ATTACKS)}: at least one significantly "
        f"negative (p < {PASS_P_VALUE}), none significantly positive",
        "evidence": [],
    }
    for st in results.get("stores") or []:
        entry = (st.get("candidates") or {}).get(name)
        if not st.get("reported") or entry is None:
            continue
        for a in GROUND_TRUTH_ATTACKS:
            c = (entry.get("spearman_vs_auroc") or {}).get(a)
            if c and c.get("rho") is not None:
                crit_real["evidence"].append(
                    {"store": st["source"], "attack": a, "rho": c["rho"], "p_value": c["p_value"]}
                )
    ev = crit_real["evidence"]
    if not ev:
        crit_real["status"] = "not measured"
    else:
        neg = any(e["rho"] < 0 and e["p_value"] < PASS_P_VALUE for e in ev)
        pos = any(e["rho"] > 0 and e["p_value"] < PASS_P_VALUE for e in ev)
        crit_real["status"] = "passed" if neg and not pos else "failed"
    states = (crit_syn["status"], crit_real["status"])
    status = "failed" if "failed" in states else "passed" if states == ("passed", "passed") else "not validated"
    if name in CANDIDATES and CANDIDATES[name].family in CONTROL_FAMILIES:
        # a control is measured with the same rule to show what the rule can tell apart; never eligible
        return {"status": "control", "rule_outcome": status, "criteria": {"synthetic": crit_syn, "real": crit_real}}
    return {"status": status, "criteria": {"synthetic": crit_syn, "real": crit_real}}


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _table_head(synth: Mapping[str, Any] | None, stores: Sequence[Mapping[str, Any]], k: str) -> list[str]:
    """The column names of indicators.md: the candidate, the synthetic columns, each reported store's columns."""
    head = ["candidate", "family", "version"]
    if synth:
        head += [
            "synthetic mean rho vs MIS (+- boot sd)",
            f"stability at {k} runs",
            "extra: pooled rho (all cells)",
            "extra: DPI pairs right",
        ]
    for i, st in enumerate(stores):
        for a in SHOWN_ATTACKS:
            if a in st["attacks"]:
                gt = "" if a in GROUND_TRUTH_ATTACKS else " (not ground truth)"
                head.append(f"store {i + 1}: rho (p) vs {a} AUROC{gt}")
        for a in GROUND_TRUTH_ATTACKS:
            if a in st["attacks"]:
                head.append(f"extra, store {i + 1}: partial rho (p) vs {a} AUROC given held-out loss")
    head.append("status")
    return head


def _table_preamble(results: Mapping[str, Any], synth: Mapping[str, Any] | None) -> list[str]:
    """The lines of indicators.md above the table: title, orientation, the synthetic protocol, the stores."""
    lines = [
        "# Candidate attack-free indicators (docs/science.md section 8)",
        "",
        f"Orientation: {ORIENTATION} for every candidate. Expected sign: positive against the MIS, negative "
        "against an attack's AUROC.",
        "",
    ]
    if synth:
        cfg = synth["config"]
        lines.append(
            f"Synthetic: {len(synth['datasets'])} data sets x {cfg['n_runs']} runs, {cfg['epochs']} epochs, batch "
            f"{cfg['batch_size']}"
            + (" (QUICK mode: a smoke test, not the protocol)" if synth.get("quick") else "")
            + f"; MIS estimate's own DPI pairs right: {_f(synth['mis_dpi_pairs']['share'], '.2f')}."
        )
    for i, st in enumerate(results.get("stores") or []):
        if st.get("reported"):
            lines.append(
                f"Store {i + 1}: {st['source']} ({len(st['quantizers'])} quantizers, {len(st['runs'])} runs, "
                f"reference {st['reference_quantizer']})."
            )
        else:
            lines.append(f"Store {st['source']}: not used ({st.get('reason')}).")
    return lines


def _synthetic_cells(s: Mapping[str, Any] | None, k: str) -> list[str]:
    """A candidate's synthetic cells of indicators.md ("-" when the candidate was not run)."""
    if s is None:
        return ["-"] * 4
    return [
        f"{_f(s['mean_spearman'], '+.2f')} +- {_f(s['boot_sd'], '.2f')}",
        _f(s["stability"].get(k), ".2f"),
        _f(s["extra_pooled_spearman"]["rho"], "+.2f"),
        _f(s["extra_dpi_pairs"]["share"], ".2f"),
    ]


def _store_cells(e: Mapping[str, Any] | None, st: Mapping[str, Any]) -> list[str]:
    """A candidate's cells of indicators.md for one reported store: rho (p) per shown attack, then the partial
    rho (p) per ground-truth attack; "not computable" or "-" where there is no number."""
    row = []
    for a in SHOWN_ATTACKS:
        if a not in st["attacks"]:
            continue
        corr = (e or {}).get("spearman_vs_auroc", {}).get(a)
        if e is None or not e["computable"]:
            row.append("not computable")
        elif corr is None or corr.get("rho") is None:
            row.append("-")
        else:
            row.append(f"{corr['rho']:+.2f} ({corr['p_value']:.2g})")
    for a in GROUND_TRUTH_ATTACKS:
        if a not in st["attacks"]:
            continue
        part = (e or {}).get("partial_vs_auroc_given_damage", {}).get(a)
        if e is None or not e["computable"]:
            row.append("not computable")
        elif part is None or part.get("rho") is None:
            row.append("-")
        else:
            row.append(f"{part['rho']:+.2f} ({part['p_value']:.2g})")
    return row


def _table_footer() -> list[str]:
    """The lines of indicators.md below the table: the pass rule and what the controls and extras mean."""
    return [
        "",
        f"Pass rule: synthetic mean rho >= {PASS_SYNTHETIC_MEAN_SPEARMAN} (full protocol) AND on a real store a "
        f"significantly negative rho (p < {PASS_P_VALUE}) against the AUROC of "
        + " or ".join(GROUND_TRUTH_ATTACKS)
        + ", none significantly positive. 'not computable': the store lacks the inputs (e.g. training-sample losses "
        "at every checkpoint) or the candidate is a data-free control needing parameters.",
        "",
        "Controls (family 'control ...') go through the same rule and are never eligible: they show what the rule "
        f"can tell apart. The extra partial columns remove the damage control ({DAMAGE_CONTROL}, the mean held-out "
        "loss) from both sides: a quantizer that destroys the model destroys every attack too, so a candidate that "
        "tracks leakage beyond damage keeps a negative partial rho. They are not part of the pre-registered rule "
        "(Student's t p-value, n - 3 degrees of freedom).",
    ]


def markdown_table(results: Mapping[str, Any]) -> str:
    """indicators.md: one row per candidate."""
    synth = results.get("synthetic")
    stores = [s for s in results.get("stores") or [] if s.get("reported")]
    k = str(STATUS_K_RUNS)
    head = _table_head(synth, stores, k)
    lines = _table_preamble(results, synth)
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, c in CANDIDATES.items():
        row = [name, c.family, c.version]
        if synth:
            row += _synthetic_cells(synth["candidates"].get(name), k)
        for st in stores:
            row += _store_cells(st["candidates"].get(name), st)
        state = results.get("status", {}).get(name, {})
        outcome = state.get("rule_outcome")
        row.append(state.get("status", "-") + (f" (the rule alone: {outcome})" if outcome else ""))
        lines.append("| " + " | ".join(row) + " |")
    lines += _table_footer()
    return "\n".join(lines) + "\n"


def validate_indicators_command(
    out_dir: str | Path,
    *,
    synthetic_recipe: str | Path | None = None,
    overrides: Sequence[str] = (),
    stores: Sequence[RunStore | str | Path] | None = None,
    quick: bool = False,
    synthetic: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """`llmaudit validate indicators`: every candidate on the synthetic protocol and on run stores.

    out_dir: where indicators.json, indicators.md and the synthetic cache (cache/) go. synthetic_recipe /
    overrides: the synthetic protocol's recipe (default: its defaults, = recipes/synthetic-validation.yaml)
    and key=value overrides. stores: run directories (or RunStores) to validate against their attacks;
    None = `default_stores()` (the real-model recipes' stores that exist); [] = none. quick: 2 data sets
    x 40 runs, 6 epochs (QUICK_OVERRIDES, before `overrides`). synthetic=False skips the synthetic part.
    Returns {"synthetic", "stores", "status", "files"}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"synthetic": None, "stores": []}
    if synthetic:
        cfg = load_config(synthetic_recipe, [*(QUICK_OVERRIDES if quick else ()), *overrides])
        log(
            f"indicators: synthetic protocol, {len(cfg.k_modes) * len(cfg.sigmas)} data sets x {cfg.n_runs} runs, "
            f"{len(CANDIDATES)} candidates -> {out}"
        )
        results["synthetic"] = synthetic_validation(cfg, cache_dir=out / "cache", quick=quick, log=log)
    for st in default_stores() if stores is None else stores:
        log(f"indicators: store {st.root if isinstance(st, RunStore) else st}")
        results["stores"].append(store_validation(st))
    results["status"] = {n: validation_status(n, results) for n in CANDIDATES}
    results["files"] = {
        "json": str(atomic_write_json(out / "indicators.json", results)),
        "markdown": str(atomic_write_text(out / "indicators.md", markdown_table(results))),
        "registry": str(
            atomic_write_json(
                out / "registry.json",
                registry_from_results(
                    results,
                    command=" ".join(
                        ["llmaudit validate indicators", "--out", str(out)]
                        + [f"--store {s['source']}" for s in results["stores"]]
                        + (["--quick"] if quick else [])
                        + (["--no-synthetic"] if not synthetic else [])
                        + list(overrides)
                    ),
                ),
            )
        ),
    }
    return results


def beyond_damage(name: str, results: Mapping[str, Any]) -> dict[str, Any]:
    """Whether candidate `name` tracks the ground-truth attacks beyond the damage control on the real stores:
    "yes" when some partial Spearman (damage partialled out) is significantly negative and none significantly
    positive, "no" when they are measured and none is significantly negative, "not measured" otherwise."""
    ev = []
    for st in results.get("stores") or []:
        entry = (st.get("candidates") or {}).get(name) or {}
        if not st.get("reported") or not entry.get("computable"):
            continue
        for a, c in (entry.get("partial_vs_auroc_given_damage") or {}).items():
            if c.get("rho") is not None:
                ev.append({"store": st["source"], "attack": a, "rho": c["rho"], "p_value": c["p_value"]})
    if not ev:
        return {"answer": "not measured", "evidence": ev}
    neg = any(e["rho"] < 0 and e["p_value"] < PASS_P_VALUE for e in ev)
    pos = any(e["rho"] > 0 and e["p_value"] < PASS_P_VALUE for e in ev)
    return {"answer": "yes" if neg and not pos else "no", "evidence": ev}


def registry_from_results(
    results: Mapping[str, Any], *, measured: str | None = None, command: str | None = None
) -> dict[str, Any]:
    """The registry llmaudit ships (`llmaudit/analyze/indicator_validation.json`, read by every report) from
    the results of a full `validate_indicators_command`: per candidate its status and the numbers behind it,
    and whether it tracks the attacks beyond damage (an extra, outside the pass rule)."""
    synth = results.get("synthetic") or {}
    cfg = synth.get("config") or {}
    out: dict[str, Any] = {
        "about": "Validation status of every candidate attack-free indicator (docs/science.md section 8), written "
        "by `llmaudit validate indicators` (file registry.json of its output directory). A report labels each "
        "indicator with its status; only a 'passed' indicator may drive a checklist criterion.",
        "measured": measured or time.strftime("%Y-%m-%d", time.gmtime()),
        "command": command,
        "synthetic_protocol": (
            None
            if not synth
            else f"{len(synth.get('datasets', []))} data sets x {cfg.get('n_runs')} runs"
            + (" (QUICK mode: does not count)" if synth.get("quick") else "")
        ),
        "real_stores": [
            {"source": st["source"], "quantizers": st["quantizers"], "runs": st["runs"]}
            for st in results.get("stores") or []
            if st.get("reported")
        ],
        "candidates": {},
    }
    for name, c in CANDIDATES.items():
        state = (results.get("status") or {}).get(name) or validation_status(name, results)
        s = (synth.get("candidates") or {}).get(name)
        real = dict(state["criteria"]["real"])
        out["candidates"][name] = {
            "status": state["status"],
            **({"rule_outcome": state["rule_outcome"]} if "rule_outcome" in state else {}),
            "version": c.version,
            "family": c.family,
            "synthetic": None
            if s is None
            else {
                "mean_spearman": s["mean_spearman"],
                "boot_sd": s["boot_sd"],
                f"stability_{STATUS_K_RUNS}": s["stability"].get(str(STATUS_K_RUNS)),
                "quick": bool(synth.get("quick")),
            },
            "real": real,
            "beyond_damage": beyond_damage(name, results),
        }
    return out
