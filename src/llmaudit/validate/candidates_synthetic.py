"""Validation of the candidate indicators on the synthetic protocol (docs/science.md sections 5 and 8):
per data set, every candidate's mean over runs against the baseline MIS, rank stability and DPI pairs
(`synthetic_validation`). Part of `llmaudit validate indicators` (`llmaudit.validate.candidate_validation`).

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
import torch

from llmaudit.analyze.candidates import (
    CANDIDATES,
    ORIENTATION,
    PREREGISTRATION,
    evaluate_candidates,
)
from llmaudit.analyze.rq_aggregate import ranking_stability
from llmaudit.common.io import atomic_write_bytes
from llmaudit.common.runtime import torch_threads
from llmaudit.common.stats import percentile_interval, spearman, spearman_rho
from llmaudit.validate.synthetic.classifier import init_linear, point_losses, quantized_params, train_batched
from llmaudit.validate.synthetic.config import SyntheticConfig
from llmaudit.validate.synthetic.data import derive_seed, make_dataset
from llmaudit.validate.synthetic.mis import mis_estimate
from llmaudit.validate.synthetic.protocol import boot_spearman

STABILITY_K_RUNS = (5, 10, 15, 30)
"""Run counts of the rank-stability study."""
STABILITY_RESAMPLES = 50
"""Random subsets per run count."""
DPI_CHAIN = ("sign", "uniform-2", "uniform-3", "uniform-4", "uniform-5")
"""Nested quantizers, coarsest first: each output is a function of every finer one, so the true MIS is
non-increasing along the chain (docs/science.md sections 1 and 8)."""
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
    out = _train_and_score(cfg, (ds_index, k_modes, sigma), names, log)
    if path is not None:
        _save_arrays(path, key, out)
    return out


def _train_and_score(
    cfg: SyntheticConfig, dataset: tuple[int, int, float], names: list[str], log: Callable[[str], None]
) -> dict[str, Any]:
    """The arrays of `synthetic_dataset_arrays` computed (not cached) for dataset = (index, k_modes, sigma):
    train the runs, every candidate per run on the trajectory, the baseline MIS on the final checkpoints."""
    ds_index, k_modes, sigma = dataset
    quantizers = list(cfg.quantizers)
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
    ds_name = f"k{k_modes}-s{sigma:g}"
    log(
        f"[{ds_index + 1}] {ds_name}: train {t_train:.0f}s, candidates {t_cand:.0f}s, MIS {t_mis:.0f}s; MIS "
        + " ".join(f"{q}={m:.3f}" for q, m in zip(quantizers, mis["mis"]))
    )
    return {
        "name": ds_name,
        "values": values,
        "mis": np.asarray(mis["mis"], dtype=np.float64),
        "correct": np.asarray(mis["correct_per_run"], dtype=np.float64),
        "candidates": names,
        "quantizers": quantizers,
        "timing_s": {"train": t_train, "candidates": t_cand, "mis": t_mis},
        "cached": False,
    }


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
