"""Utility of each quantizer: validation loss of the final checkpoints, the loss along training, and beside them
the divergence from full precision (llmaudit.analyze.fidelity) and the task metrics (llmaudit.analyze.taskmetrics)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from llmaudit.analyze.rq_aggregate import aggregate_r_q
from llmaudit.store.losstable import REFERENCE_RUN

UTILITY_CONFIDENCE = 0.95
"""Coverage of the utility intervals (over runs and over validation samples), recorded with each quantizer's."""


def utility_from_table(
    df: pd.DataFrame, quantizers: list[str], reference: str, *, n_boot: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Measure the validation loss of each quantizer's final checkpoints and its change from full precision.

    Args:
        df (pd.DataFrame): the loss table.
        quantizers (list[str]): the quantizers to measure.
        reference (str): the full-precision reference quantizer.
        n_boot (int): bootstrap resamples (over runs, and over samples for `sample_interval`).
        seed (int): the resampling seed.
    Returns:
        dict[str, Any]: per quantizer the mean over runs with a bootstrap interval over runs, the per-run values and
        the relative change from the reference (over runs and over samples); "_base_model" with the base model's
        validation loss where it was scored.
    """

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
    ref_samples = _final_sample_losses(val, reference)
    for q, losses in per_run.items():
        agg = aggregate_r_q(losses, n_boot=n_boot, confidence=UTILITY_CONFIDENCE, seed=seed)
        entry = {
            "confidence": UTILITY_CONFIDENCE,
            "val_loss": agg["mean"],
            "val_loss_ci": [agg["ci_low"], agg["ci_high"]],
            "val_loss_per_run": losses.tolist(),
            "n_runs": int(len(losses)),
        }
        if ref is not None and len(ref) == len(losses):
            rel = losses / ref - 1.0
            entry["relative_change"] = float(rel.mean())
            rel_agg = aggregate_r_q(rel, n_boot=n_boot, confidence=UTILITY_CONFIDENCE, seed=seed)
            entry["relative_change_ci"] = [rel_agg["ci_low"], rel_agg["ci_high"]]
            entry |= sample_interval(_final_sample_losses(val, q), ref_samples, n_boot=n_boot, seed=seed)
        out[q] = entry
    base = df[(df["run"] == REFERENCE_RUN) & (df["split"] == "val")]
    if not base.empty:
        out["_base_model"] = {"val_loss": float(base["loss"].mean())}
    return out


def _final_sample_losses(val: pd.DataFrame, quantizer: str) -> pd.DataFrame | None:
    """[runs, samples] validation losses of one quantizer's final checkpoints (None without rows)."""
    sub = val[val["quantizer"] == quantizer]
    if sub.empty:
        return None
    final = sub[sub["checkpoint"] == sub.groupby("run")["checkpoint"].transform("max")]
    return final.pivot_table(index="run", columns="sample_id", values="loss")


def relative_change_resampled(q: np.ndarray, ref: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Compute mean(q) / mean(ref) - 1 under each row of sample multiplicities.

    Args:
        q (np.ndarray): [runs, samples] validation losses of the quantizer.
        ref (np.ndarray): [runs, samples] validation losses of the reference, same runs and samples.
        weights (np.ndarray): [B, samples] sample multiplicities.
    Returns:
        np.ndarray: [B] relative changes.
    """
    return (weights @ q.sum(axis=0)) / (weights @ ref.sum(axis=0)) - 1.0


def sample_interval(q: pd.DataFrame | None, ref: pd.DataFrame | None, *, n_boot: int, seed: int) -> dict[str, Any]:
    """Estimate the relative change of validation loss with an interval over validation samples.

    The bootstrap is paired: each resampled sample brings its losses under both quantizers and every run. This is
    what a single fine-tune's utility criterion is judged on; run-to-run variation of training is not in it.

    Args:
        q (pd.DataFrame | None): [runs, samples] the quantizer's final validation losses.
        ref (pd.DataFrame | None): [runs, samples] the reference's.
        n_boot (int): bootstrap resamples (0: no interval).
        seed (int): the resampling seed.
    Returns:
        dict[str, Any]: relative_change_pooled, relative_change_ci_samples (at UTILITY_CONFIDENCE), n_val_samples;
        {} when the two do not share runs and samples or a loss is not finite.
    """
    if q is None or ref is None or n_boot <= 0:
        return {}
    runs = q.index.intersection(ref.index)
    samples = q.columns.intersection(ref.columns)
    a, b = q.loc[runs, samples].to_numpy(np.float64), ref.loc[runs, samples].to_numpy(np.float64)
    if a.size == 0 or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return {}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, samples.size, size=(n_boot, samples.size))
    weights = np.zeros((n_boot, samples.size))
    np.add.at(weights, (np.arange(n_boot)[:, None], draws), 1.0)
    tail = (1 - UTILITY_CONFIDENCE) / 2
    lo, hi = np.quantile(relative_change_resampled(a, b, weights), [tail, 1 - tail])
    return {
        "relative_change_pooled": float(a.sum() / b.sum() - 1.0),
        "relative_change_ci_samples": [float(lo), float(hi)],
        "n_val_samples": int(samples.size),
    }


def trajectory_from_table(df: pd.DataFrame) -> dict[str, Any]:
    """Average the validation loss per (quantizer, checkpoint) over runs: the loss along training.

    Args:
        df (pd.DataFrame): the loss table.
    Returns:
        dict[str, Any]: {quantizer: {"checkpoint": [...], "val_loss": [...]}}.
    """
    val = df[(df["split"] == "val") & (df["run"] != REFERENCE_RUN)]
    curve = val.groupby(["quantizer", "checkpoint"])["loss"].mean().reset_index()
    return {
        q: {"checkpoint": g["checkpoint"].tolist(), "val_loss": g["loss"].tolist()}
        for q, g in curve.groupby("quantizer")
    }


def add_fidelity(utility: dict[str, Any], divergence: dict[str, Any], tasks: dict[str, Any]) -> dict[str, Any]:
    """Add each quantizer's divergence summary and task metrics to the utility result.

    The per-run detail stays in the two inputs.

    Args:
        utility (dict[str, Any]): `utility_from_table`'s result; updated in place.
        divergence (dict[str, Any]): `divergence_from_table`'s result ("divergence": the means over runs of
            llama.cpp's statistics, or why not measured).
        tasks (dict[str, Any]): `task_metrics_from_table`'s result ("task_metrics": value, interval, drop vs the
            reference).
    Returns:
        dict[str, Any]: `utility`.
    """
    for q, entry in utility.items():
        if q.startswith("_"):
            continue
        d = (divergence.get("per_quantizer") or {}).get(q) or {"measured": False, "reason": "not scored"}
        entry["divergence"] = (
            {"measured": True, "n_runs": d["n_runs"]} | d["summary"]
            if d.get("measured")
            else {"measured": False, "reason": d.get("reason")}
        )
        entry["task_metrics"] = {
            name: {
                "value": m["value"],
                "ci": m["ci"],
                "higher_is_better": True,
                "n_runs": m["n_runs"],
                "drop_vs_reference": m.get("drop_vs_reference"),
            }
            for name, m in ((tasks.get("per_quantizer") or {}).get(q) or {}).items()
        }
    return utility
