"""Every attack on every quantizer's final checkpoints, each run in turn as the target, with naive,
calibrated and per-sample evaluations (docs/science.md section 4).
"""

from __future__ import annotations

import warnings
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from llmaudit import __version__
from llmaudit.analyze.attacks.definitions import DEFAULT_ATTACKS, FULL_PRECISION_NAMES, REF_MODELS, attack_definitions
from llmaudit.analyze.attacks.lira import (
    LiraWarning,
    fpc,
    lira_offline,
    lira_online,
    lira_statistic,
    normality_check,
    out_reference_counts,
)
from llmaudit.analyze.attacks.text import combine_scores, min_k_plus_plus_score, min_k_score, ref_score
from llmaudit.analyze.metrics import (
    DEFAULT_FPRS,
    T_CUTOFF,
    fpr_key,
    per_sample_tpr,
    pooled_calibrated,
    pooled_naive,
    roc_curve_loglog,
)
from llmaudit.store.losstable import REFERENCE_RUN, LossTableError


def _pivot(frame: pd.DataFrame, values: str, runs: np.ndarray, samples: list[str]) -> np.ndarray:
    wide = frame.pivot(index="run", columns="sample_id", values=values)
    return wide.reindex(index=runs, columns=samples).to_numpy()

def final_pool(df: pd.DataFrame, quantizer: str) -> tuple[pd.DataFrame, dict]:
    sub = df[(df["quantizer"] == quantizer) & (df["split"] == "pool") & (df["run"] != REFERENCE_RUN)]
    if sub.empty:
        raise LossTableError(f"quantizer {quantizer!r}: no 'pool' rows of fine-tuned runs to attack.")
    final = sub.groupby("run")["checkpoint"].max()
    rows = sub.merge(final.rename("final").reset_index(), on="run")
    rows = rows[rows["checkpoint"] == rows["final"]].drop(columns="final")
    return rows, {int(r): int(c) for r, c in final.items()}

def _row_text_scores(rows: pd.DataFrame, k: float) -> dict[str, np.ndarray | None]:
    scores: dict[str, np.ndarray | None] = {
        "loss": -rows["loss"].to_numpy(dtype=np.float64),
        "min_k": min_k_score(rows["token_losses"], k),
        "min_k_plus_plus": None,
        "zlib": None,
    }
    if {"token_vocab_mean", "token_vocab_std"} <= set(rows.columns) and rows["token_vocab_mean"].notna().all():
        scores["min_k_plus_plus"] = min_k_plus_plus_score(
            rows["token_losses"], rows["token_vocab_mean"], rows["token_vocab_std"], k
        )
    if "zlib_bytes" in rows.columns and rows["zlib_bytes"].notna().all():
        scores["zlib"] = -rows["loss"].to_numpy(dtype=np.float64) / rows["zlib_bytes"].to_numpy(dtype=np.float64)
    return scores

def _base_losses(df: pd.DataFrame, quantizer: str, samples: list[str]) -> tuple[np.ndarray | None, str | None]:
    base = df[(df["run"] == REFERENCE_RUN) & (df["split"] == "pool")]
    if base.empty:
        return None, None
    source = quantizer if (base["quantizer"] == quantizer).any() else None
    if source is None:
        names = base["quantizer"].unique()
        if len(names) != 1:
            return None, None
        source = str(names[0])
    b = base[base["quantizer"] == source]
    b = b[b["checkpoint"] == b["checkpoint"].max()].set_index("sample_id")["loss"]
    return b.reindex(samples).to_numpy(dtype=np.float64), source

def _ref_matrix(loss: np.ndarray, keep: np.ndarray, base: np.ndarray | None, ref_models: str) -> np.ndarray:
    """[M, N] ref scores with each run as target: references are other runs' out-models and/or the base."""
    M, N = loss.shape
    out = np.empty((M, N))
    for m in range(M):
        refs, mask = [], []
        if ref_models in ("runs", "both"):
            others = np.arange(M) != m
            refs.append(loss[others])
            mask.append(~keep[others])
        if ref_models in ("base", "both"):
            refs.append(base[None, :])
            mask.append(np.isfinite(base)[None, :])
        out[m] = ref_score(loss[m], np.concatenate(refs), np.concatenate(mask))
    return out

def leave_one_out(fn, scores, keep, fpc_value, **kw) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiraWarning)
        return np.stack([fn(scores, keep, m, fpc_value, **kw) for m in range(scores.shape[0])])

def _reference_name(quantizers: Sequence[str], reference_quantizer: str | None) -> str | None:
    if reference_quantizer is not None:
        if reference_quantizer not in quantizers:
            raise ValueError(f"reference quantizer {reference_quantizer!r} is not in the table ({list(quantizers)}).")
        return reference_quantizer
    for q in quantizers:
        if q.lower() in FULL_PRECISION_NAMES:
            return q
    return None

def _headline(entry: dict) -> dict:
    """The numbers compared across quantizers and with r_Q."""
    naive = entry["pooled_naive"]
    calib = entry.get("pooled_calibrated", {})
    key = fpr_key(0.01)
    return {
        "auroc": naive["auroc"],
        "tpr_at_1pct_naive": naive["tpr_at_fpr"].get(key, {}).get("tpr", float("nan")),
        "tpr_at_1pct_calibrated": calib.get("tpr_at_fpr", {}).get(key, {}).get("tpr", float("nan")),
    }

def spearman_vs_indicator(results: Mapping, r_q: Mapping[str, float]) -> dict:
    """Spearman rho (and p-value) across quantizers between r_Q and each attack's headline metrics.

    results: the output of `run_attacks`; r_q: {quantizer: mean r_Q}. Higher r_Q means more secure, so
    the expected sign is NEGATIVE. Needs at least 3 common quantizers."""
    per_q = results["quantizers"]
    common = [q for q in per_q if q in r_q and np.isfinite(r_q[q])]
    out: dict = {"quantizers": common, "expected_sign": "negative (higher r_Q = more secure)", "attacks": {}}
    attacks = sorted({a for q in common for a in per_q[q]["attacks"]})
    for attack in attacks:
        out["attacks"][attack] = {}
        qs = [q for q in common if attack in per_q[q]["attacks"]]
        for metric in ("auroc", "tpr_at_1pct_naive", "tpr_at_1pct_calibrated"):
            x = np.array([r_q[q] for q in qs], dtype=float)
            y = np.array([per_q[q]["attacks"][attack]["headline"][metric] for q in qs], dtype=float)
            ok = np.isfinite(y)
            if ok.sum() < 3 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
                out["attacks"][attack][metric] = {"rho": None, "p_value": None, "n_quantizers": int(ok.sum()),
                                                  "reason": "needs >= 3 quantizers with distinct values"}
                continue
            res = stats.spearmanr(x[ok], y[ok])
            out["attacks"][attack][metric] = {"rho": float(res.statistic), "p_value": float(res.pvalue),
                                              "n_quantizers": int(ok.sum())}
    return out

def run_attacks(
    df: pd.DataFrame,
    *,
    quantizers: Sequence[str] | None = None,
    attacks: Sequence[str] = DEFAULT_ATTACKS,
    fpc: str | float | None = "auto",
    n_boot: int = 1000,
    seed: int = 0,
    n_pool: int | None = None,
    n_train: float | None = None,
    fprs: Sequence[float] = DEFAULT_FPRS,
    k: float = 0.2,
    ref_models: str = "runs",
    statistic: str = "logit",
    lira_variance: str = "per_sample",
    t_cutoff: float = T_CUTOFF,
    confidence: float = 0.95,
    r_q: Mapping[str, float] | None = None,
    reference_quantizer: str | None = None,
) -> dict:
    """Run every attack on a validated loss table, each run in turn as the target (leave-one-out).

    For each quantizer: each run's FINAL checkpoint (max checkpoint per run) on split "pool"; samples
    scored by every run (others dropped, counted). Per attack: pooled naive, pooled calibrated (the
    attack score standardized per sample by the other models' out-scores, `lira_offline`; LiRA offline
    is its own calibration) and per-sample evaluations with bootstrap CIs over samples. fpc: "auto"
    (1 - n_train / n_pool, n_train = mean members per run and n_pool = pool samples unless given), a
    number, or None (no correction). The correction targets the threat of a model trained on an
    independent draw; within one pool (targets and references from the same pool, as here) it is
    conservative: the realised FPR of the calibrated evaluation falls below alpha, and is reported.
    Cost: the bootstraps dominate, about 15 s per 1000 resamples per evaluation at 20 models x 10k
    samples on 2 CPU cores. Returns a JSON-ready dict."""
    unknown = sorted(set(attacks) - set(DEFAULT_ATTACKS))
    if unknown:
        raise ValueError(f"unknown attack(s) {unknown}; known: {list(DEFAULT_ATTACKS)}.")
    if ref_models not in REF_MODELS:
        raise ValueError(f"ref_models must be one of {REF_MODELS}; got {ref_models!r}.")
    lira_statistic(np.ones(1), statistic)  # validates the name
    if isinstance(fpc, str) and fpc != "auto":
        raise ValueError(f"fpc must be 'auto', a number in (0, 1] or None; got {fpc!r}.")
    available = sorted(df.loc[(df["split"] == "pool") & (df["run"] != REFERENCE_RUN), "quantizer"].unique())
    quantizers = list(available if quantizers is None else quantizers)
    missing = sorted(set(quantizers) - set(available))
    if missing:
        raise ValueError(f"quantizer(s) {missing} have no pool rows of fine-tuned runs; available: {available}.")
    reference = _reference_name(quantizers, reference_quantizer)
    kw_eval = dict(n_boot=n_boot, seed=seed, confidence=confidence)

    per_q: dict = {}
    definitions: dict | None = None
    for q in quantizers:
        rows, final = final_pool(df, q)
        runs = np.array(sorted(final))
        if runs.size < 2:
            raise LossTableError(f"quantizer {q!r}: attacks need at least 2 fine-tuned runs; got {runs.size}.")
        per_run = rows.groupby("sample_id")["run"].nunique()
        samples = sorted(per_run.index[per_run == runs.size])
        n_dropped = int((per_run < runs.size).sum())
        rows = rows[rows["sample_id"].isin(samples)]
        keep = _pivot(rows, "member", runs, samples).astype(bool)
        loss = _pivot(rows, "loss", runs, samples).astype(np.float64)
        pool_size = int(n_pool) if n_pool is not None else len(samples) + n_dropped
        train_size = float(n_train) if n_train is not None else float(keep.sum(1).mean())
        fpc_value = _fpc_factor(train_size, pool_size) if fpc == "auto" else (None if fpc is None else float(fpc))
        definitions = attack_definitions(k=k, ref_models=ref_models, statistic=statistic,
                                         lira_variance=lira_variance, fpc_value=fpc_value, t_cutoff=t_cutoff)

        text = _row_text_scores(rows, k)
        rows = rows.assign(**{f"_s_{name}": v for name, v in text.items() if v is not None})
        matrices: dict[str, np.ndarray] = {
            name: _pivot(rows, f"_s_{name}", runs, samples).astype(np.float64)
            for name, v in text.items() if v is not None
        }
        skipped: dict[str, str] = {}
        if text["min_k_plus_plus"] is None:
            skipped["min_k_plus_plus"] = "loss table has no token_vocab_mean / token_vocab_std columns"
        if text["zlib"] is None:
            skipped["zlib"] = "loss table has no zlib_bytes column"
        base, base_source = _base_losses(df, q, samples)
        if ref_models in ("base", "both") and base is None:
            skipped["ref"] = "no base-model rows (run == -1) on split 'pool' for this quantizer"
        else:
            matrices["ref"] = _ref_matrix(loss, keep, base, ref_models)
        for combo in ("loss+zlib", "loss+ref", "loss+zlib+ref"):
            parts = combo.split("+")
            lacking = [p for p in parts if p not in matrices]
            if lacking:
                skipped[combo] = f"component(s) {lacking} unavailable"
            else:
                matrices[combo] = combine_scores(*(matrices[p] for p in parts), axis=1)
        stat = lira_statistic(loss, statistic)
        n_ref = out_reference_counts(keep)
        lira_kw = dict(variance=lira_variance)
        if "lira_offline" in attacks:
            matrices["lira_offline"] = leave_one_out(lira_offline, stat, keep, fpc_value, **lira_kw)
        if "lira_online" in attacks:
            n_in = keep.sum(0)[None, :] - keep.astype(int)
            if np.median(n_in) < 2 or np.median(n_ref) < 2:
                skipped["lira_online"] = (f"too few reference models: median {np.median(n_in):g} in- and "
                                          f"{np.median(n_ref):g} out-references per sample (needs >= 2 each)")
            else:
                matrices["lira_online"] = leave_one_out(lira_online, stat, keep, fpc_value, **lira_kw)

        results: dict = {}
        for attack in attacks:
            if attack not in matrices:
                skipped.setdefault(attack, "not computed")
                continue
            scores = matrices[attack]
            fin = np.isfinite(scores)
            if not (fin.any() and 0 < keep[fin].sum() < fin.sum()):
                # e.g. LiRA with a single out-reference per sample: no spread to standardise with
                why = f"no finite scores with both members and non-members ({int(fin.sum())} finite of {scores.size})"
                if attack.startswith("lira"):
                    why += f": median {np.median(n_ref):g} out-reference runs per sample, LiRA needs >= 2; train more runs"
                skipped[attack] = why
                continue
            if attack == "lira_offline":
                z = scores
            else:
                z = leave_one_out(lira_offline, scores, keep, fpc_value, variance="per_sample")
            n_ref_eff = None if lira_variance == "global" and attack == "lira_offline" else n_ref
            entry = {
                "definition": definitions[attack],
                "n_nan_scores": int(np.isnan(scores).sum()),
                "pooled_naive": pooled_naive(scores, keep, fprs, **kw_eval),
                "pooled_calibrated": pooled_calibrated(z, keep, fprs, n_ref_eff, t_cutoff=t_cutoff, **kw_eval),
                "per_sample": per_sample_tpr(scores, keep, fprs, **kw_eval),
            }
            zfin = np.isfinite(z)
            entry["roc_curve"] = {"pooled_naive": roc_curve_loglog(scores[fin], keep[fin])}
            if zfin.any() and 0 < keep[zfin].sum() < zfin.sum():
                entry["roc_curve"]["pooled_calibrated"] = roc_curve_loglog(z[zfin], keep[zfin])
            entry["headline"] = _headline(entry)
            results[attack] = entry
        non_lira = [a for a in results if not a.startswith("lira")]
        per_q[q] = {
            "runs": [int(r) for r in runs],
            "final_checkpoints": final,
            "n_models": int(runs.size),
            "n_samples": len(samples),
            "n_samples_dropped": n_dropped,
            "n_train": train_size,
            "n_pool": pool_size,
            "fpc": fpc_value,
            "base_model_quantizer": base_source,
            "lira_statistic": statistic,
            "normality": normality_check(stat, keep),
            "attacks": results,
            "skipped": skipped,
            "best_attack": max(non_lira, key=lambda a: results[a]["headline"]["auroc"]) if non_lira else None,
        }

    if reference is not None:
        for q, block in per_q.items():
            for attack, entry in block["attacks"].items():
                ref_entry = per_q[reference]["attacks"].get(attack)
                if ref_entry is not None:
                    entry["vs_reference"] = {
                        m: entry["headline"][m] - ref_entry["headline"][m] for m in entry["headline"]
                    }
    out = {
        "llmaudit_version": __version__,
        "attack_definitions": definitions or attack_definitions(k=k, ref_models=ref_models, statistic=statistic,
                                                                lira_variance=lira_variance, t_cutoff=t_cutoff),
        "settings": {
            "fpc": fpc, "n_boot": n_boot, "seed": seed, "confidence": confidence, "fprs": list(fprs), "k": k,
            "ref_models": ref_models, "statistic": statistic, "lira_variance": lira_variance,
            "t_cutoff": t_cutoff, "n_pool": n_pool, "n_train": n_train, "checkpoint": "final (max per run)",
            "split": "pool",
        },
        "reference_quantizer": reference,
        "quantizers": per_q,
    }
    out["spearman_vs_r_q"] = spearman_vs_indicator(out, r_q) if r_q else None
    return out

_fpc_factor = fpc  # run_attacks' `fpc` argument shadows the function
