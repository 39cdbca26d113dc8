"""Membership inference attacks computed from a loss table, and their calibrated evaluation.

SCIENCE.md section 4. Every score is "HIGHER = more likely a member". Token losses are per-token
negative log-likelihoods l_t = -log p(x_t | x_<t) in nats; L(x) = mean_t l_t.

Conventions (recorded in `attack_definitions`, stored with every result so that scores computed under
different definitions are never compared silently):
- loss            -L(x)                                                  (Yeom 2018)
- min_k           mean of log p = -l_t over the ceil(k * T) tokens with the LOWEST probability (largest
                  l_t), at least 1 token; ceil is taken after rounding k * T to 9 decimals so that
                  0.2 * 15 = 3.0000000000000004 counts as 3                  (Shi 2024, k = 0.2)
- min_k_plus_plus per token (log p_t - mu_t) / sigma_t with mu_t, sigma_t the mean and std of log p over
                  the vocabulary UNDER the model's next-token distribution at position t (columns
                  token_vocab_mean / token_vocab_std); then the mean of the lowest ceil(k * T) of those.
                  A position with sigma_t = 0 (a one-token distribution) contributes 0  (Zhang 2024)
- zlib            -L(x) / zlib_bytes(x): mean NLL in nats per token over the zlib-compressed length of
                  the text in bytes (the "-L / zlib length" normalisation of SCIENCE.md; the
                  "log-perplexity over zlib entropy" variant differs by a constant factor)  (Carlini 2021)
- ref             -(L_target(x) - mean_i L_ref_i(x)), references: "runs" = the OTHER runs' models that
                  did NOT train on x (an attacker who trains references knows their training sets),
                  "base" = the base model before fine-tuning (rows with run == -1), "both" = the mean over
                  the union of those models (the base counts as one more reference)
- loss+zlib, loss+ref, loss+zlib+ref
                  each component is z-scored over the pool samples of the target model (mean 0, sd 1
                  across samples, per target) and the z-scores are summed with equal weights
- lira_offline    per-sample standardization (t - mu_out) / sigma_out of the LiRA statistic, mu and sigma
                  from the OTHER models where the sample was out (Carlini 2022, offline)
- lira_online     log N(t; mu_in, sd_in) - log N(t; mu_out, sd_out) (Carlini 2022, online)

LiRA statistic: phi(x) = logit(p) with p = exp(-L(x)), the geometric-mean token probability, i.e.
phi = -L - log(1 - exp(-L)). For L >> 1 (typical of non-members) phi ~ -L, a mean of T token losses and
so close to Gaussian across models by the central limit theorem; for L -> 0 (memorised members) phi ~
-log L, which turns the multiplicative, floor-bounded spread of small losses into a symmetric one. This
is Carlini et al.'s argument for logit-scaled confidences; `neg_loss` (-L) is available as an option.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from llmaudit import __version__
from llmaudit.losstable import REFERENCE_RUN, LossTableError
from llmaudit.metrics import (
    DEFAULT_FPRS,
    T_CUTOFF,
    fpr_key,
    per_sample_tpr,
    pooled_calibrated,
    pooled_naive,
    roc_curve_loglog,
)

TEXT_ATTACKS = ("loss", "min_k", "min_k_plus_plus", "zlib", "ref", "loss+zlib", "loss+ref", "loss+zlib+ref")
DEFAULT_ATTACKS = TEXT_ATTACKS + ("lira_offline", "lira_online")
REF_MODELS = ("runs", "base", "both")
STATISTICS = ("logit", "neg_loss")
VARIANCES = ("per_sample", "global")
# Quantizer names taken for the full-precision reference column when none is named explicitly.
FULL_PRECISION_NAMES = ("fp", "full", "full_precision", "fp32", "fp16", "bf16", "none", "unquantized")


class LiraWarning(UserWarning):
    """Some samples could not be scored by LiRA (too few reference models): their score is NaN."""


# ----------------------------------------------------------------------------------------------------
# Text attacks: one score per sample from its token losses.


def _token_arrays(token_losses) -> list[np.ndarray]:
    arrays = [np.asarray(t, dtype=np.float64).ravel() for t in token_losses]
    if any(a.size == 0 for a in arrays):
        raise ValueError("every sample needs at least one token loss.")
    return arrays


def min_k_count(n_tokens: int, k: float) -> int:
    """Number of tokens min-k% averages over: ceil(k * T) (k * T rounded to 9 decimals first), at least 1."""
    if not 0 < k <= 1:
        raise ValueError(f"k is a fraction in (0, 1]; got {k}.")
    return max(1, math.ceil(round(k * n_tokens, 9)))


def loss_score(token_losses) -> np.ndarray:
    """LOSS attack: -L(x) = -mean_t l_t. token_losses: n sequences of per-token NLLs -> [n]."""
    return np.array([-a.mean() for a in _token_arrays(token_losses)])


def min_k_score(token_losses, k: float = 0.2) -> np.ndarray:
    """min-k%: mean log p (= -l_t) over the ceil(k * T) lowest-probability tokens. -> [n]."""
    out = []
    for a in _token_arrays(token_losses):
        m = min_k_count(a.size, k)
        out.append(-np.sort(a)[-m:].mean())  # largest losses = lowest probabilities
    return np.array(out)


def min_k_plus_plus_score(token_losses, token_vocab_mean, token_vocab_std, k: float = 0.2) -> np.ndarray:
    """Min-K%++: per token (log p_t - mu_t) / sigma_t, then the mean of the lowest ceil(k * T). -> [n].

    token_vocab_mean / token_vocab_std: per sample, per position, E[log p] and sd of log p under the
    model's next-token distribution (loss-table columns of the same names)."""
    if token_vocab_mean is None or token_vocab_std is None:
        raise ValueError(
            "Min-K%++ needs the per-position mean and std of log p over the vocabulary (loss-table columns "
            "'token_vocab_mean' and 'token_vocab_std'); this table has none. Rescore with vocabulary "
            "statistics or leave 'min_k_plus_plus' out of the attacks."
        )
    losses = _token_arrays(token_losses)
    means = [np.asarray(m, dtype=np.float64).ravel() for m in token_vocab_mean]
    stds = [np.asarray(s, dtype=np.float64).ravel() for s in token_vocab_std]
    if not len(losses) == len(means) == len(stds):
        raise ValueError("token_losses, token_vocab_mean and token_vocab_std hold different numbers of samples.")
    out = []
    for i, (a, mu, sd) in enumerate(zip(losses, means, stds)):
        if not a.size == mu.size == sd.size:
            raise ValueError(f"sample {i}: {a.size} token losses but {mu.size} vocab means and {sd.size} stds.")
        if (sd < 0).any():
            raise ValueError(f"sample {i}: negative vocabulary standard deviation.")
        with np.errstate(invalid="ignore", divide="ignore"):
            z = np.where(sd > 0, (-a - mu) / np.where(sd > 0, sd, 1.0), 0.0)
        out.append(np.sort(z)[: min_k_count(a.size, k)].mean())
    return np.array(out)


def zlib_score(token_losses, zlib_bytes) -> np.ndarray:
    """zlib: -L(x) / zlib_bytes(x) (mean NLL in nats per token over the compressed length in bytes). -> [n]."""
    zlib_bytes = np.asarray(zlib_bytes, dtype=np.float64).ravel()
    if (zlib_bytes <= 0).any() or not np.isfinite(zlib_bytes).all():
        raise ValueError("zlib_bytes must be positive byte counts.")
    loss = -loss_score(token_losses)
    if loss.size != zlib_bytes.size:
        raise ValueError(f"{loss.size} samples but {zlib_bytes.size} zlib lengths.")
    return -loss / zlib_bytes


def ref_score(target_loss, reference_losses, reference_mask=None) -> np.ndarray:
    """ref: -(L_target - mean_i L_ref_i). target_loss: [n]; reference_losses: [R, n] (or [n] for one
    reference); reference_mask: optional [R, n] booleans, True where reference i may be used for sample j.
    NaN where a sample has no usable reference."""
    target = np.asarray(target_loss, dtype=np.float64)
    refs = np.atleast_2d(np.asarray(reference_losses, dtype=np.float64))
    if refs.shape[1:] != target.shape:
        raise ValueError(f"reference_losses {refs.shape} do not match target_loss {target.shape}.")
    mask = np.ones(refs.shape, bool) if reference_mask is None else np.atleast_2d(np.asarray(reference_mask, bool))
    n = mask.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_ref = np.where(n > 0, np.where(mask, refs, 0.0).sum(0) / n, np.nan)
    return -(target - mean_ref)


def combine_scores(*components, axis: int = -1) -> np.ndarray:
    """Equal-weight combination: z-score each component along `axis` (the samples), then sum.

    components: arrays of the same shape, e.g. [M, N] with axis=-1 (z-scored per target model over its
    samples). NaN entries are ignored in the mean and sd and stay NaN in the sum."""
    if not components:
        raise ValueError("combine_scores needs at least one component.")
    total = 0.0
    for comp in components:
        comp = np.asarray(comp, dtype=np.float64)
        mu = np.nanmean(comp, axis=axis, keepdims=True)
        sd = np.nanstd(comp, axis=axis, keepdims=True)
        total = total + (comp - mu) / np.where(sd > 0, sd, 1.0)
    return total


# ----------------------------------------------------------------------------------------------------
# LiRA.


def confidence_logit(loss) -> np.ndarray:
    """LiRA statistic logit(exp(-L)) = -L - log(1 - exp(-L)), computed stably; L is clipped at 1e-12."""
    loss = np.maximum(np.asarray(loss, dtype=np.float64), 1e-12)
    return -loss - np.log(-np.expm1(-loss))


def lira_statistic(loss, statistic: str = "logit") -> np.ndarray:
    """The per-(model, sample) statistic LiRA models as Gaussian: "logit" (default) or "neg_loss" (-L)."""
    if statistic == "logit":
        return confidence_logit(loss)
    if statistic == "neg_loss":
        return -np.asarray(loss, dtype=np.float64)
    raise ValueError(f"statistic must be one of {STATISTICS}; got {statistic!r}.")


def fpc(n_train: float, n_pool: float) -> float:
    """Finite population correction 1 - n_train / n_pool for reference models trained on overlapping
    subsets (without replacement) of a pool of n_pool samples, n_train samples each."""
    if not 0 < n_train < n_pool:
        raise ValueError(
            f"the finite population correction needs 0 < n_train < n_pool; got n_train={n_train}, "
            f"n_pool={n_pool} (with n_train == n_pool every model saw the whole pool and the spread of "
            "out-scores is undefined)."
        )
    return 1.0 - n_train / n_pool


def _check_lira(scores, keep, target) -> tuple[np.ndarray, np.ndarray, int]:
    scores = np.asarray(scores, dtype=np.float64)
    keep = np.asarray(keep).astype(bool)
    if scores.ndim != 2 or scores.shape != keep.shape:
        raise ValueError(f"scores and keep must both be [M models, N samples]; got {scores.shape} and {keep.shape}.")
    target = int(target)
    if not -scores.shape[0] <= target < scores.shape[0]:
        raise IndexError(f"target {target} is not a model index (M = {scores.shape[0]}).")
    return scores, keep, target % scores.shape[0]


def _gaussian_fit(scores, mask, variance: str, fpc_value, min_refs: int):
    """Mean and sd of scores[mask] per column; per-sample or pooled (global) variance; var / fpc."""
    if variance not in VARIANCES:
        raise ValueError(f"variance must be one of {VARIANCES}; got {variance!r}.")
    n = mask.sum(0)
    safe_n = np.maximum(n, 1)
    mu = np.where(mask, scores, 0.0).sum(0) / safe_n
    sq = np.where(mask, (scores - mu) ** 2, 0.0).sum(0)
    if variance == "per_sample":
        with np.errstate(invalid="ignore", divide="ignore"):
            var = np.where(n >= 2, sq / np.maximum(n - 1, 1), np.nan)
    else:  # one variance for all samples: pooled within-sample deviations
        dof = np.maximum(n - 1, 0)
        var = np.full(n.shape, sq[n >= 2].sum() / dof.sum() if dof.sum() > 0 else np.nan)
    if fpc_value is not None:
        if not 0 < fpc_value <= 1:
            raise ValueError(f"fpc must lie in (0, 1]; got {fpc_value}.")
        var = var / fpc_value
    sd = np.sqrt(var)
    ok = (n >= min_refs) & np.isfinite(sd) & (sd > 0)
    return np.where(ok, mu, np.nan), np.where(ok, sd, np.nan), n


def out_reference_counts(keep) -> np.ndarray:
    """[M, N]: for target m and sample j, the number of OTHER models where j was out."""
    keep = np.asarray(keep).astype(bool)
    return (~keep).sum(0)[None, :] - (~keep).astype(int)


def lira_offline(
    scores, keep, target, fpc=None, *, variance: str = "per_sample", min_out: int | None = None
) -> np.ndarray:
    """Offline LiRA: [N] target scores standardized by each sample's OUT distribution.

    scores: [M, N] LiRA statistic (higher = member, e.g. `confidence_logit(loss)`); keep: [M, N] booleans,
    True where model m trained on sample j; target: index of the attacked model. For each sample j,
    mu_out and sigma_out come only from models i != target with keep[i, j] False; sigma^2 is divided by
    `fpc` when given (finite population correction, `fpc(n_train, n_pool)`). variance="global" uses one
    pooled within-sample variance for all samples (steadier with few references). Returns
    (t_target - mu_out) / sigma_out: ~N(0, 1) for non-members, higher = member. Samples with fewer than
    `min_out` out references (default 2 per-sample, 1 global) or a zero spread get NaN; a LiraWarning
    reports how many."""
    scores, keep, target = _check_lira(scores, keep, target)
    refs = ~keep
    refs[target] = False
    refs &= np.isfinite(scores)
    if min_out is None:
        min_out = 2 if variance == "per_sample" else 1
    mu, sd, _ = _gaussian_fit(scores, refs, variance, fpc, min_out)
    z = (scores[target] - mu) / sd
    n_nan = int(np.isnan(z).sum())
    if n_nan:
        warnings.warn(
            f"offline LiRA: {n_nan} of {z.size} samples have fewer than {min_out} out-references (or zero "
            "spread) and score NaN.", LiraWarning, stacklevel=2,
        )
    return z


def lira_online(
    scores, keep, target, fpc=None, *, variance: str = "per_sample", min_in: int = 2, min_out: int = 2
) -> np.ndarray:
    """Online LiRA: [N] log-likelihood ratio log N(t; mu_in, sd_in) - log N(t; mu_out, sd_out).

    Same inputs as `lira_offline`; the IN Gaussian comes from the other models that trained on the
    sample. Samples with fewer than min_in in- or min_out out-references score NaN (LiraWarning)."""
    scores, keep, target = _check_lira(scores, keep, target)
    others = np.ones(scores.shape, bool)
    others[target] = False
    others &= np.isfinite(scores)
    mu_in, sd_in, _ = _gaussian_fit(scores, keep & others, variance, fpc, min_in)
    mu_out, sd_out, _ = _gaussian_fit(scores, ~keep & others, variance, fpc, min_out)
    t = scores[target]
    llr = stats.norm.logpdf(t, mu_in, sd_in) - stats.norm.logpdf(t, mu_out, sd_out)
    n_nan = int(np.isnan(llr).sum())
    if n_nan:
        warnings.warn(
            f"online LiRA: {n_nan} of {llr.size} samples lack {min_in} in- or {min_out} out-references "
            "and score NaN.", LiraWarning, stacklevel=2,
        )
    return llr


def normality_check(out_scores, keep=None, *, level: float = 0.05, min_n: int = 5) -> dict:
    """Shapiro-Wilk per sample on its out-scores: the share of samples rejected at `level`.

    out_scores: [M, N]; keep: optional [M, N], then only entries with keep False are tested. Samples with
    fewer than min_n finite entries are skipped. Under exact normality the share is about `level`; a
    much larger share means the Gaussian calibration of LiRA is off for this statistic."""
    scores = np.asarray(out_scores, dtype=np.float64)
    mask = np.isfinite(scores) if keep is None else (~np.asarray(keep, bool) & np.isfinite(scores))
    p_values = []
    for j in range(scores.shape[1]):
        col = scores[mask[:, j], j]
        if col.size >= max(min_n, 3) and np.ptp(col) > 0:
            p_values.append(stats.shapiro(col).pvalue)
    p_values = np.asarray(p_values)
    return {
        "test": "shapiro-wilk",
        "level": float(level),
        "n_samples_tested": int(p_values.size),
        "share_rejected": float((p_values < level).mean()) if p_values.size else float("nan"),
        "expected_share_if_gaussian": float(level),
    }


# ----------------------------------------------------------------------------------------------------
# Orchestration from a loss table.


def attack_definitions(
    *, k: float = 0.2, ref_models: str = "runs", statistic: str = "logit", lira_variance: str = "per_sample",
    fpc_value: float | None = None, t_cutoff: float = T_CUTOFF,
) -> dict[str, str]:
    """Versioned definition string of every attack; stored in each result."""
    fpc_txt = "none" if fpc_value is None else f"{fpc_value:.6g}"
    lira = f"stat={statistic},var={lira_variance},fpc={fpc_txt}"
    return {
        "loss": "1:-mean_nll",
        "min_k": f"1:k={k:g},ceil(k*T)>=1,mean_logp_lowest",
        "min_k_plus_plus": f"1:k={k:g},ceil(k*T)>=1,(logp-mu_vocab)/sigma_vocab",
        "zlib": "1:-mean_nll/zlib_bytes",
        "ref": f"1:refs={ref_models},out-only,mean",
        "loss+zlib": "1:sum_zscore_per_target",
        "loss+ref": f"1:sum_zscore_per_target,refs={ref_models}",
        "loss+zlib+ref": f"1:sum_zscore_per_target,refs={ref_models}",
        "lira_offline": f"1:{lira},min_out=2",
        "lira_online": f"1:{lira},min_in=2,min_out=2",
        "calibration": f"1:per-sample-out-zscore,fpc={fpc_txt},student_t_below={t_cutoff:g}",
    }


def _pivot(frame: pd.DataFrame, values: str, runs: np.ndarray, samples: list[str]) -> np.ndarray:
    wide = frame.pivot(index="run", columns="sample_id", values=values)
    return wide.reindex(index=runs, columns=samples).to_numpy()


def _final_pool(df: pd.DataFrame, quantizer: str) -> tuple[pd.DataFrame, dict]:
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


def _leave_one_out(fn, scores, keep, fpc_value, **kw) -> np.ndarray:
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
        rows, final = _final_pool(df, q)
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
            matrices["lira_offline"] = _leave_one_out(lira_offline, stat, keep, fpc_value, **lira_kw)
        if "lira_online" in attacks:
            n_in = keep.sum(0)[None, :] - keep.astype(int)
            if np.median(n_in) < 2 or np.median(n_ref) < 2:
                skipped["lira_online"] = (f"too few reference models: median {np.median(n_in):g} in- and "
                                          f"{np.median(n_ref):g} out-references per sample (needs >= 2 each)")
            else:
                matrices["lira_online"] = _leave_one_out(lira_online, stat, keep, fpc_value, **lira_kw)

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
                z = _leave_one_out(lira_offline, scores, keep, fpc_value, variance="per_sample")
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


def plot_roc_loglog(results: Mapping, path: str | Path) -> list[Path]:
    """One log-log ROC PNG per quantizer: offline LiRA (calibrated) and the best other attack (naive and
    calibrated), with the chance line. Files: PATH_STEM_<quantizer>.png next to `path`."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from llmaudit.io import atomic_write_bytes

    path = Path(path)
    written = []
    grid = np.logspace(-4, 0, 50)
    for q, block in results["quantizers"].items():
        fig, ax = plt.subplots(figsize=(5, 5))
        curves = []
        if "lira_offline" in block["attacks"]:
            curves.append(("LiRA offline", block["attacks"]["lira_offline"]["roc_curve"].get("pooled_calibrated"), "-"))
        best = block.get("best_attack")
        if best:
            rc = block["attacks"][best]["roc_curve"]
            curves.append((f"{best} (pooled naive)", rc.get("pooled_naive"), "--"))
            curves.append((f"{best} (calibrated)", rc.get("pooled_calibrated"), ":"))
        for label, curve, style in curves:
            if curve:
                ax.plot(curve["fpr"], np.maximum(curve["tpr"], 1e-5), style, label=label)
        ax.plot(grid, grid, color="grey", lw=0.8, label="chance")
        ax.set(xscale="log", yscale="log", xlim=(1e-4, 1), ylim=(1e-4, 1.05),
               xlabel="false positive rate", ylabel="true positive rate", title=f"ROC, quantizer {q}")
        ax.legend(loc="lower right", fontsize=8)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(q))
        written.append(atomic_write_bytes(path.parent / f"{path.stem}_{safe}.png", buf.getvalue()))
    return written


def attack_command(
    loss_table: Path,
    out: Path,
    *,
    quantizers: Sequence[str] | None = None,
    attacks: Sequence[str] = DEFAULT_ATTACKS,
    fpc: str | float | None = "auto",
    n_boot: int = 1000,
    seed: int = 0,
    n_pool: int | None = None,
    n_train: float | None = None,
    r_q: Mapping[str, float] | Path | None = None,
    reference_quantizer: str | None = None,
    plots: bool = True,
) -> dict:
    """`llmaudit attack LOSS_TABLE --out FILE`: run the attacks, write FILE (JSON) and, with plots, the
    log-log ROC PNGs FILE_STEM_roc_<quantizer>.png next to it. r_q: {quantizer: r_Q} or a JSON file of it."""
    from llmaudit.io import atomic_write_json, read_json
    from llmaudit.losstable import read_loss_table

    df = read_loss_table(loss_table)
    if r_q is not None and not isinstance(r_q, Mapping):
        r_q = {str(q): float(v) for q, v in read_json(r_q).items()}
    results = run_attacks(df, quantizers=quantizers, attacks=attacks, fpc=fpc, n_boot=n_boot, seed=seed,
                          n_pool=n_pool, n_train=n_train, r_q=r_q, reference_quantizer=reference_quantizer)
    results["loss_table"] = str(loss_table)
    out = Path(out)
    if plots:
        results["plots"] = [str(p) for p in plot_roc_loglog(results, out.parent / f"{out.stem}_roc")]
    atomic_write_json(out, results)
    return results
