"""How far each quantized model's next-token distribution is from its full-precision self, the way
llama.cpp's `llama-perplexity --kl-divergence` measures it (tools/perplexity/perplexity.cpp), on the held-out
(validation) tokens of every run's final checkpoint; docs/science.md section 11.

Per run, over all N scored validation tokens (l_q, l_ref the per-token NLLs of the quantized and reference
units, kl the per-token KL(p_ref || p_q) the scorer recorded, top whether both argmaxes agree):

    mean and standard error     se(x) = sd(x, ddof=1) / sqrt(N)        (llama.cpp: sqrt(var_pop / (N - 1)), equal)
    KL                          mean kl +- se, percentiles max, 99.9, 99, 95, 90, median, 10, 5, 1, 0.1, min
    same top p                  share of top, se = sqrt(p (1 - p) / (N - 1))
    delta p                     dp = exp(-l_q) - exp(-l_ref): mean +- se, percentiles (75 and 25 too),
                                RMS = sqrt(mean dp^2), se(RMS) = se(dp^2) / (2 RMS)
    ln(PPL_q / PPL_ref)         mean(l_q - l_ref) +- se of the paired difference (llama.cpp's
                                sqrt(se_q^2 + se_ref^2 - 2 cov), the same number)
    PPL_q / PPL_ref             exp of that, se = ratio x se(ln ratio)
    Cor(ln PPL_q, ln PPL_ref)   Pearson correlation of the token NLLs (llama.cpp's cov / (se_q se_ref))

Percentiles interpolate linearly between order statistics at fraction x (N - 1), llama.cpp's rule and numpy's
default. Two differences from llama.cpp, both deliberate: its errors are set to 0 below 11 tokens (here they
are computed from 2 tokens on, and nan below), and it reads the base model's log-probabilities truncated at
max - 16 and rounded to 16 bits (here the KL is exact, llmaudit.score.divergence).

Per quantizer: every per-run value is averaged over runs with a percentile bootstrap interval over runs (like
every other figure), beside the token-level error of that mean, sqrt(sum_r se_r^2) / R: the interval says how
much the runs disagree, the token error how precisely the held-out tokens pin each run down. Near-lossless
quantizers differ by less than either, and then their order by KL means nothing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from llmaudit.common.stats import bootstrap_mean_interval
from llmaudit.store.losstable import REFERENCE_RUN

KL_PERCENTILES = (
    ("max", 1.0),
    ("99.9", 0.999),
    ("99", 0.99),
    ("95", 0.95),
    ("90", 0.90),
    ("median", 0.5),
    ("10", 0.10),
    ("5", 0.05),
    ("1", 0.01),
    ("0.1", 0.001),
    ("min", 0.0),
)
DELTA_P_PERCENTILES = KL_PERCENTILES[:5] + (("75", 0.75), ("median", 0.5), ("25", 0.25)) + KL_PERCENTILES[6:]

SUMMARY_KEYS = (
    "kl_mean",
    "kl_median",
    "kl_99",
    "kl_max",
    "same_top",
    "delta_p_mean",
    "delta_p_rms",
    "ln_ppl_ratio",
    "ppl_ratio",
)
"""Per-run statistics averaged over runs in the report (every per-run statistic stays in the result)."""
TOKEN_ERRORS = {
    "kl_mean": "kl_se",
    "same_top": "same_top_se",
    "delta_p_mean": "delta_p_se",
    "delta_p_rms": "delta_p_rms_se",
    "ln_ppl_ratio": "ln_ppl_ratio_se",
    "ppl_ratio": "ppl_ratio_se",
}

DEFINITION = (
    "llama.cpp --kl-divergence statistics over the scored validation tokens of each run's final checkpoint, "
    "against the unquantized model of the same checkpoint (KL, same top) and the reference quantizer's unit "
    "(delta p, PPL ratio); exact KL over the whole vocabulary; mean over runs with a 95% bootstrap interval "
    "over runs, token-level standard error beside it"
)


def mean_and_error(values: np.ndarray) -> tuple[float, float]:
    """Compute the mean and its standard error sd(ddof=1) / sqrt(N).

    Args:
        values (np.ndarray): [N] values.
    Returns:
        tuple[float, float]: (mean, se); se NaN below 2 values, both NaN without values.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return math.nan, math.nan
    if x.size < 2:
        return float(x.mean()), math.nan
    return float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))


def share_and_error(flags: np.ndarray) -> tuple[float, float]:
    """Compute the share of True and llama.cpp's error of "same top p", sqrt(p (1 - p) / (N - 1)).

    Args:
        flags (np.ndarray): [N] booleans.
    Returns:
        tuple[float, float]: (share, error); error NaN below 2 flags, both NaN without flags.
    """
    x = np.asarray(flags, dtype=bool)
    if x.size == 0:
        return math.nan, math.nan
    p = float(x.mean())
    return p, (math.sqrt(p * (1 - p) / (x.size - 1)) if x.size > 1 else math.nan)


def percentiles(values: np.ndarray, spec=KL_PERCENTILES) -> dict[str, float]:
    """Compute percentiles with linear interpolation between order statistics at f (N - 1).

    Args:
        values (np.ndarray): [N] values.
        spec (tuple[tuple[str, float], ...]): (name, fraction f) pairs, e.g. KL_PERCENTILES.
    Returns:
        dict[str, float]: {name: value at f}; NaN without values.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return {name: math.nan for name, _ in spec}
    return {name: float(v) for (name, _), v in zip(spec, np.quantile(x, [f for _, f in spec]))}


def divergence_statistics(
    token_kl: np.ndarray, same_top: np.ndarray, nll_q: np.ndarray, nll_ref: np.ndarray
) -> dict[str, Any]:
    """Compute llama.cpp's statistics (module docstring) of one run.

    Args:
        token_kl (np.ndarray): [N] KL(p_ref || p_q) per scored token.
        same_top (np.ndarray): [N] whether both argmaxes agree.
        nll_q (np.ndarray): [N] token NLLs of the quantized unit.
        nll_ref (np.ndarray): [N] token NLLs of the reference unit.
    Returns:
        dict[str, Any]: n_tokens, the KL, same-top, delta p and PPL statistics with their errors.
    Raises:
        ValueError: when the four arrays differ in length.
    """
    n = len(token_kl)
    if not (len(same_top) == len(nll_q) == len(nll_ref) == n):
        raise ValueError("divergence_statistics needs one value per token in each of its four inputs")
    kl_mean, kl_se = mean_and_error(token_kl)
    top, top_se = share_and_error(same_top)
    dp = np.exp(-np.asarray(nll_q, np.float64)) - np.exp(-np.asarray(nll_ref, np.float64))
    dp_mean, dp_se = mean_and_error(dp)
    mse, mse_se = mean_and_error(dp * dp)
    rms = math.sqrt(mse) if mse == mse else math.nan
    ln_ratio, ln_se = mean_and_error(np.asarray(nll_q, np.float64) - np.asarray(nll_ref, np.float64))
    ratio = math.exp(ln_ratio) if ln_ratio == ln_ratio else math.nan
    q_mean, q_se = mean_and_error(nll_q)
    ref_mean, ref_se = mean_and_error(nll_ref)
    cor = np.corrcoef(nll_q, nll_ref)[0, 1] if n > 1 and np.ptp(nll_q) > 0 and np.ptp(nll_ref) > 0 else math.nan
    kl_pct = percentiles(token_kl)
    return {
        "n_tokens": n,
        "kl_mean": kl_mean,
        "kl_se": kl_se,
        "kl_percentiles": kl_pct,
        "kl_median": kl_pct["median"],
        "kl_99": kl_pct["99"],
        "kl_max": kl_pct["max"],
        "same_top": top,
        "same_top_se": top_se,
        "delta_p_mean": dp_mean,
        "delta_p_se": dp_se,
        "delta_p_percentiles": percentiles(dp, DELTA_P_PERCENTILES),
        "delta_p_rms": rms,
        "delta_p_rms_se": (0.5 / rms * mse_se) if rms and rms == rms else math.nan,
        "ln_ppl_ratio": ln_ratio,
        "ln_ppl_ratio_se": ln_se,
        "ppl_ratio": ratio,
        "ppl_ratio_se": ratio * ln_se,
        "ppl_q": math.exp(q_mean) if n else math.nan,
        "ppl_q_se": math.exp(q_mean) * q_se if n else math.nan,
        "ppl_ref": math.exp(ref_mean) if n else math.nan,
        "ppl_ref_se": math.exp(ref_mean) * ref_se if n else math.nan,
        "cor_ln_ppl": float(cor),
    }


def _present(value: Any) -> bool:
    return isinstance(value, (np.ndarray, list))


def _final_rows(val: pd.DataFrame, quantizer: str) -> dict[int, pd.DataFrame]:
    """{run: the quantizer's validation rows at that run's final checkpoint}, rows sorted by sample id."""
    sub = val[val["quantizer"] == quantizer]
    out = {}
    for run, rows in sub.groupby("run"):
        final = rows[rows["checkpoint"] == rows["checkpoint"].max()]
        out[int(run)] = final.sort_values("sample_id").reset_index(drop=True)
    return out


def _run_statistics(rows: pd.DataFrame, ref_rows: pd.DataFrame | None) -> tuple[dict | None, str | None]:
    """(statistics, None) of one run, or (None, why not)."""
    if "token_kl" not in rows.columns or not rows["token_kl"].map(_present).all():
        return None, "its final units were scored without per-token KL"
    if ref_rows is None or list(ref_rows["sample_id"]) != list(rows["sample_id"]):
        return None, "the reference quantizer's final unit of the same run does not hold the same validation samples"
    if (ref_rows["n_tokens"].to_numpy() != rows["n_tokens"].to_numpy()).any():
        return None, "the reference quantizer's unit scored other tokens"
    flat = {c: np.concatenate([np.asarray(v) for v in rows[c]]) for c in ("token_kl", "token_same_top", "token_losses")}
    nll_ref = np.concatenate([np.asarray(v, np.float64) for v in ref_rows["token_losses"]])
    return divergence_statistics(flat["token_kl"], flat["token_same_top"], flat["token_losses"], nll_ref), None


def _aggregate(per_run: list[dict], *, n_boot: int, seed: int) -> dict[str, Any]:
    out = {}
    for key in SUMMARY_KEYS:
        values = np.array([r[key] for r in per_run], dtype=np.float64)
        low, high = bootstrap_mean_interval(values, n_boot=n_boot, seed=seed)
        entry = {"mean": float(np.mean(values)), "ci": [low, high]}
        if key in TOKEN_ERRORS:
            errors = np.array([r[TOKEN_ERRORS[key]] for r in per_run], dtype=np.float64)
            entry["token_se"] = float(math.sqrt(np.sum(errors**2)) / len(errors))
        out[key] = entry
    return out


def divergence_from_table(
    df: pd.DataFrame, quantizers: list[str], reference: str, *, n_boot: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """Compute llama.cpp's statistics per run and their means over runs for each quantizer (module docstring).

    Args:
        df (pd.DataFrame): the loss table.
        quantizers (list[str]): the quantizers to measure.
        reference (str): the reference quantizer (delta p and the PPL ratio are against its units).
        n_boot (int): bootstrap resamples over runs.
        seed (int): the resampling seed.
    Returns:
        dict[str, Any]: definition, reference_quantizer and per_quantizer (per run, summary, or why not measured).
    """
    val = df[(df["split"] == "val") & (df["run"] != REFERENCE_RUN)]
    ref_by_run = _final_rows(val, reference)
    per_q: dict[str, Any] = {}
    for q in quantizers:
        runs = _final_rows(val, q)
        per_run, reasons = [], []
        for run, rows in sorted(runs.items()):
            stats, why = _run_statistics(rows, ref_by_run.get(run))
            if stats is None:
                reasons.append(f"run {run}: {why}")
            else:
                per_run.append({"run": run} | stats)
        if reasons or not per_run:
            per_q[q] = {"measured": False, "reason": reasons[0] if reasons else "no final validation rows"}
            continue
        per_q[q] = {
            "measured": True,
            "n_runs": len(per_run),
            "summary": _aggregate(per_run, n_boot=n_boot, seed=seed),
            "per_run": per_run,
        }
    return {"definition": DEFINITION, "reference_quantizer": reference, "per_quantizer": per_q}
