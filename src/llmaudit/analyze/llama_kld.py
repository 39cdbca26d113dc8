"""llama.cpp's KL statistics exactly as ``llama-perplexity --kl-divergence`` computes and prints them
(tools/perplexity/perplexity.cpp), for comparing llmaudit's numbers with the tool's number for number; the
protocol and the definitions are in docs/science.md section 11 ("The llama-perplexity protocol").

Per scored position (the second half of each n_ctx chunk), from the quantized model's float32 logits x and the base
model's log-probabilities as the base file stores them (16 bits, ``quantize.gguf_logits``), in float32 where
llama.cpp computes in float and summed in float64 where it sums in double:

    M = max_v x_v, lse = log sum_v exp(x_v - M),  nll = M + lse - x_y,  nll_base = -(log p_base,y)
    KLD = sum_{v: log p_base,v > -16} p_base,v (log p_base,v - x_v + M + lse)
    dp  = exp(-nll) - exp(-nll_base),  same top = argmax x == argmax log p_base (first index on ties)

Over the N positions: means and errors sqrt((E[x^2] - E[x]^2) / (N - 1)) (0 at N <= 10), the covariance of the two
NLLs (0 at N < 10), the PPL and log-PPL-ratio statistics from them, percentiles interpolated at f (N - 1) of the
sorted float32 values in float32, the median the mean of the two middle values. This is not llmaudit's own
per-record protocol (``analyze.fidelity``: exact KL over the whole vocabulary on each record's scored tokens); it is
the tool's, so that the two can be checked against each other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from llmaudit.quantize.gguf_logits import decode_log_probs, expf, log_sum_exp

BLOCK_ROWS = 64
"""Positions per vectorised block (bounds the float32 [rows, vocabulary] temporaries)."""

KLD_LINES = (("max", 1.0), ("99.9", 0.999), ("99", 0.99), ("95", 0.95), ("90", 0.90), ("median", 0.5),
             ("10", 0.10), ("5", 0.05), ("1", 0.01), ("0.1", 0.001), ("min", 0.0))  # fmt: skip
"""The KLD percentiles the tool prints, in its order (name, fraction)."""
DELTA_P_LINES = KLD_LINES[:5] + (("75", 0.75), ("median", 0.5), ("25", 0.25)) + KLD_LINES[6:]


@dataclass
class TokenKLD:
    """Per scored position, what the tool keeps: the two NLLs (float32), the KLD (the float64 sum), dp (float32)
    and whether the top tokens agree."""

    nll: np.ndarray
    nll_base: np.ndarray
    kld: np.ndarray
    p_diff: np.ndarray
    same_top: np.ndarray

    @staticmethod
    def concatenate(parts: list[TokenKLD]) -> TokenKLD:
        """Concatenate the per-position values of several chunks, in order.

        Args:
            parts (list[TokenKLD]): the chunks' values.
        Returns:
            TokenKLD: every position of every part.
        """
        return TokenKLD(*(np.concatenate([getattr(p, f) for p in parts]) for f in TokenKLD.__dataclass_fields__))


def _block(x: np.ndarray, rows: np.ndarray, targets: np.ndarray) -> TokenKLD:
    vocab = x.shape[1]
    top = x.max(axis=1)
    lse = log_sum_exp(x, top)
    at = np.arange(len(targets))
    nll = ((top + lse).astype(np.float32) - x[at, targets]).astype(np.float32)
    scale, floor, log_p = decode_log_probs(rows, vocab)
    q_y = rows[at, 4 + targets].astype(np.float32)
    nll_base = (-((scale * q_y).astype(np.float32) + floor)).astype(np.float32)
    shift = (top + lse).astype(np.float32)
    terms = (expf(log_p) * ((log_p - x).astype(np.float32) + shift[:, None]).astype(np.float32)).astype(np.float32)
    kld = np.where(log_p > np.float32(-16.0), terms, np.float32(0.0)).sum(axis=1, dtype=np.float64)
    p_diff = (expf(-nll) - expf(-nll_base)).astype(np.float32)
    return TokenKLD(nll, nll_base, kld, p_diff, np.argmax(x, axis=1) == np.argmax(log_p, axis=1))


def chunk_statistics(logits: np.ndarray, base_rows: np.ndarray, targets: np.ndarray) -> TokenKLD:
    """Compute the tool's per-position values of one chunk.

    Args:
        logits (np.ndarray): float32 [P, V], the quantized model's logits at the chunk's scored positions.
        base_rows (np.ndarray): uint16 [P, row_width(V)], the base file's rows of the same positions.
        targets (np.ndarray): [P] the next token at each position.
    Returns:
        TokenKLD: the values of the P positions.
    Raises:
        ValueError: when logits, base rows and targets do not hold one row per position.
    """
    x = np.asarray(logits, dtype=np.float32)
    if x.ndim != 2 or base_rows.shape[0] != x.shape[0] or len(targets) != x.shape[0]:
        raise ValueError(f"chunk_statistics needs one row of logits, base log-probs and target per position: "
                         f"{x.shape}, {base_rows.shape}, {len(targets)}")  # fmt: skip
    t = np.asarray(targets, dtype=np.int64)
    parts = [
        _block(x[i : i + BLOCK_ROWS], np.asarray(base_rows[i : i + BLOCK_ROWS]), t[i : i + BLOCK_ROWS])
        for i in range(0, x.shape[0], BLOCK_ROWS)
    ]
    return TokenKLD.concatenate(parts)


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """Compute the tool's mean and error sqrt((E[x^2] - E[x]^2) / (N - 1)) from running sums.

    Args:
        total (float): the sum of the values.
        total2 (float): the sum of their squares.
        count (int): N.
    Returns:
        tuple[float, float]: (mean, error); the error is 0 when N <= 10 or the variance is not positive, both 0
        when N < 1.
    """
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def covariance(sum_a: float, sum_b: float, sum_ab: float, count: int) -> float:
    """Compute the tool's covariance of two per-token series, divided once more by N - 1 (that of their means).

    Args:
        sum_a (float): the sum of the first series.
        sum_b (float): the sum of the second series.
        sum_ab (float): the sum of their products.
        count (int): N.
    Returns:
        float: the covariance of the means, 0 when N < 10.
    """
    if count < 10:
        return 0.0
    return (sum_ab / count - (sum_a / count) * (sum_b / count)) / (count - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """Compute the tool's percentile: linear interpolation at fraction x (N - 1), in float32.

    Args:
        sorted_values (np.ndarray): float32 values sorted ascending.
        fraction (float): the fraction, in [0, 1].
    Returns:
        float: the percentile.
    """
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = np.float32(np.float32(fraction) * np.float32(len(sorted_values) - 1))
    ip = int(p)
    p = np.float32(p - np.float32(ip))
    upper = sorted_values[min(ip + 1, len(sorted_values) - 1)]
    return float(np.float32((np.float32(1) - p) * sorted_values[ip]) + np.float32(p * upper))


def _median(sorted_values: np.ndarray) -> float:
    n = len(sorted_values)
    if n % 2:
        return float(sorted_values[n // 2])
    return float(np.float32(0.5) * np.float32(sorted_values[n // 2] + sorted_values[n // 2 - 1]))


def _percentiles(values: np.ndarray, lines) -> dict[str, float]:
    ordered = np.sort(np.asarray(values, dtype=np.float32))
    return {name: (_median(ordered) if name == "median" else percentile(ordered, f)) for name, f in lines}


def _float_products(a: np.ndarray, b: np.ndarray) -> float:
    """sum of float32 products a * b, each rounded to float32 and summed in float64 (the tool's nll * nll)."""
    return float((a.astype(np.float32) * b.astype(np.float32)).astype(np.float32).sum(dtype=np.float64))


def _sqrt(x: float) -> float:
    """C's sqrt: nan for a negative argument (the tool then prints nan)."""
    return math.sqrt(x) if x >= 0 else math.nan


def _perplexity(t: TokenKLD, n: int) -> dict[str, float]:
    nll, base = t.nll.astype(np.float64), t.nll_base.astype(np.float64)
    q_mean, q_se = mean_and_uncertainty(nll.sum(), _float_products(t.nll, t.nll), n)
    b_mean, b_se = mean_and_uncertainty(base.sum(), _float_products(t.nll_base, t.nll_base), n)
    cov = covariance(nll.sum(), base.sum(), _float_products(t.nll, t.nll_base), n)
    ppl, ppl_base = math.exp(q_mean), math.exp(b_mean)
    ln_ratio, ln_se = q_mean - b_mean, _sqrt(q_se * q_se + b_se * b_se - 2.0 * cov)
    ratio = math.exp(ln_ratio)
    diff_var = (ppl * q_se) ** 2 + (ppl_base * b_se) ** 2 - 2.0 * ppl * ppl_base * cov
    return {
        "ppl_q": ppl, "ppl_q_se": ppl * q_se, "ppl_base": ppl_base, "ppl_base_se": ppl_base * b_se,
        "cor_ln_ppl": cov / (q_se * b_se) if q_se * b_se > 0 else math.nan,
        "ln_ppl_ratio": ln_ratio, "ln_ppl_ratio_se": ln_se, "ppl_ratio": ratio, "ppl_ratio_se": ratio * ln_se,
        "ppl_diff": ppl - ppl_base, "ppl_diff_se": _sqrt(diff_var),
    }  # fmt: skip


def kld_summary(t: TokenKLD) -> dict[str, Any]:
    """Compute every statistic ``llama-perplexity --kl-divergence`` prints, from the values of all chunks.

    The tool prints the final statistics only from 100 positions on.

    Args:
        t (TokenKLD): the per-position values of every chunk.
    Returns:
        dict[str, Any]: {"n_tokens", the PPL statistics (ppl_q, ppl_base, cor_ln_ppl, ln_ppl_ratio, ppl_ratio,
        ppl_diff, each with its "_se"), "kl_mean", "kl_se", "kl_percentiles", "delta_p_mean", "delta_p_se",
        "delta_p_percentiles", "delta_p_rms", "delta_p_rms_se", "same_top", "same_top_se"}: fractions, not percent.
    Raises:
        ValueError: with fewer than 2 scored positions.
    """
    n = len(t.kld)
    if n < 2:
        raise ValueError(f"kld_summary needs at least 2 scored positions, got {n}")
    kl_mean, kl_se = mean_and_uncertainty(float(t.kld.sum()), float((t.kld * t.kld).sum()), n)
    p_diff2 = (t.p_diff * t.p_diff).astype(np.float32).astype(np.float64)
    dp_mean, dp_se = mean_and_uncertainty(float(t.p_diff.astype(np.float64).sum()), float(p_diff2.sum()), n)
    mse, mse_se = mean_and_uncertainty(float(p_diff2.sum()), float((p_diff2 * p_diff2).sum()), n)
    rms = math.sqrt(mse)
    same = float(np.count_nonzero(t.same_top)) / n
    return {
        "n_tokens": n,
        **_perplexity(t, n),
        "kl_mean": kl_mean,
        "kl_se": kl_se,
        "kl_percentiles": _percentiles(t.kld.astype(np.float32), KLD_LINES),
        "delta_p_mean": dp_mean,
        "delta_p_se": dp_se,
        "delta_p_percentiles": _percentiles(t.p_diff, DELTA_P_LINES),
        "delta_p_rms": rms,
        "delta_p_rms_se": 0.5 / rms * mse_se if rms > 0 else math.nan,
        "same_top": same,
        "same_top_se": math.sqrt(same * (1.0 - same) / (n - 1)),
    }


_PPL_LINES = (
    ("Mean PPL(Q)", "ppl_q"), ("Mean PPL(base)", "ppl_base"), ("Mean ln(PPL(Q)/PPL(base))", "ln_ppl_ratio"),
    ("Mean PPL(Q)/PPL(base)", "ppl_ratio"), ("Mean PPL(Q)-PPL(base)", "ppl_diff"),
)  # fmt: skip
_LABELS = {"max": "Maximum", "median": "Median ", "min": "Minimum"}


def _percent_label(name: str) -> str:
    return _LABELS[name] if name in _LABELS else f"{float(name):4.1f}%  "


def format_summary(s: dict[str, Any]) -> str:
    """Write the statistics as the tool prints them (its labels, its printf formats).

    Args:
        s (dict[str, Any]): the output of `kld_summary`.
    Returns:
        str: the three blocks of the tool's output.
    """
    ppl = [f"{label:<30}: {s[key]:10.6f} ± {s[key + '_se']:10.6f}" for label, key in _PPL_LINES[:2]]
    ppl.append(f"Cor(ln(PPL(Q)), ln(PPL(base))): {100.0 * s['cor_ln_ppl']:6.2f}%")
    ppl += [f"{label:<30}: {s[key]:10.6f} ± {s[key + '_se']:10.6f}" for label, key in _PPL_LINES[2:]]
    kld = [f"Mean    KLD: {s['kl_mean']:10.6f} ± {s['kl_se']:10.6f}"]
    kld += [f"{_percent_label(n)} KLD: {s['kl_percentiles'][n]:10.6f}" for n, _ in KLD_LINES]
    dp = [f"Mean    Δp: {100.0 * s['delta_p_mean']:6.3f} ± {100.0 * s['delta_p_se']:5.3f} %"]
    dp += [f"{_percent_label(n)} Δp: {100.0 * s['delta_p_percentiles'][n]:6.3f}%" for n, _ in DELTA_P_LINES]
    dp.append(f"RMS Δp    : {100.0 * s['delta_p_rms']:6.3f} ± {100.0 * s['delta_p_rms_se']:5.3f} %")
    dp.append(f"Same top p: {100.0 * s['same_top']:6.3f} ± {100.0 * s['same_top_se']:5.3f} %")
    return "\n".join(
        ["====== Perplexity statistics ======", *ppl, "", "====== KL divergence statistics ======", *kld, "",
         "====== Token probability statistics ======", *dp]
    )  # fmt: skip


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+|nan|inf)"
_LINE = re.compile(rf"^\s*(?P<label>[^:]*?)\s*:\s*(?P<value>{_NUMBER})\s*%?\s*(?:±\s*(?P<error>{_NUMBER})\s*%?)?\s*$")
_PERCENT = re.compile(r"^(?P<pct>\d+(?:\.\d+)?)%\s*(?P<stat>KLD|Δp)$")
_NAMED = {"Maximum": "max", "Median": "median", "Minimum": "min"}


def _key(label: str) -> tuple[str, str | None] | None:
    """(statistic, percentile name or None) of a printed label, or None for a line that is not a statistic."""
    text = " ".join(label.split())
    for printed, key in _PPL_LINES:
        if text == printed:
            return key, None
    simple = {"Cor(ln(PPL(Q)), ln(PPL(base)))": "cor_ln_ppl", "Mean KLD": "kl_mean", "Mean Δp": "delta_p_mean",
              "RMS Δp": "delta_p_rms", "Same top p": "same_top"}  # fmt: skip
    if text in simple:
        return simple[text], None
    match = _PERCENT.match(text)
    words = text.split(" ")
    if match:
        pct = float(match["pct"])
        return ("kl" if match["stat"] == "KLD" else "delta_p"), f"{pct:g}"
    if len(words) == 2 and words[0] in _NAMED and words[1] in ("KLD", "Δp"):
        return ("kl" if words[1] == "KLD" else "delta_p"), _NAMED[words[0]]
    return None


@dataclass(frozen=True)
class Printed:
    """A printed number: its value as shown (percent where the tool prints percent) and its decimals."""

    value: float
    decimals: int


def _printed(text: str) -> Printed:
    return Printed(float(text), len(text.split(".")[1]) if "." in text else 0)


def parse_perplexity_output(text: str) -> dict[str, Printed]:
    """Read the final statistics from the tool's output, found by their labels.

    Labels, never line positions, identify a statistic: the percentile lines differ between llama.cpp versions.

    Args:
        text (str): the tool's output.
    Returns:
        dict[str, Printed]: keys "ppl_q", "ppl_q_se", ..., "kl_mean", "kl_se", "kl_99.9", "kl_median", "kl_max",
        "delta_p_mean", "delta_p_se", "delta_p_75", ..., "delta_p_rms", "delta_p_rms_se", "same_top",
        "same_top_se", "cor_ln_ppl" (as printed: percent for Δp, same top p and the correlation).
    """
    out: dict[str, Printed] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        key = _key(match["label"]) if match else None
        if key is None:
            continue
        name = key[0] if key[1] is None else f"{key[0]}_{key[1]}"
        out[name] = _printed(match["value"])
        if match["error"] is not None:
            base = name.removesuffix("_mean") if name in ("kl_mean", "delta_p_mean") else name
            out[f"{base}_se"] = _printed(match["error"])
    return out


_PERCENT_KEYS = ("delta_p", "same_top", "cor_ln_ppl")


def printed_values(s: dict[str, Any]) -> dict[str, float]:
    """Express kld_summary's statistics under parse_perplexity_output's keys and units, unrounded.

    Args:
        s (dict[str, Any]): the output of `kld_summary`.
    Returns:
        dict[str, float]: {key: value}, in percent where the tool prints percent: what to compare with the tool's
        printed numbers.
    """
    flat: dict[str, float] = {}
    for key, value in s.items():
        if key in ("kl_percentiles", "delta_p_percentiles"):
            prefix = key.removesuffix("_percentiles")
            flat |= {f"{prefix}_{name}": v for name, v in value.items()}
        elif key != "n_tokens":
            flat[key] = value
    return {k: (100.0 * v if k.startswith(_PERCENT_KEYS) else v) for k, v in flat.items()}


def differences(mine: dict[str, Any], printed: dict[str, Printed]) -> dict[str, tuple[float, float]]:
    """List the printed statistics that llmaudit's values do not round to.

    A value agrees when |difference| is at most half a unit of the last printed digit, with 1e-9 relative slack for
    the rounding of the last bit.

    Args:
        mine (dict[str, Any]): the output of `kld_summary`.
        printed (dict[str, Printed]): the output of `parse_perplexity_output`.
    Returns:
        dict[str, tuple[float, float]]: {key: (llmaudit's value, the tool's printed value)}; empty when all agree; a
        statistic the tool printed that llmaudit lacks is listed with NaN.
    """
    values = printed_values(mine)
    out = {}
    for key, shown in printed.items():
        value = values.get(key, math.nan)
        tolerance = 0.5 * 10.0 ** (-shown.decimals) + 1e-9 * abs(shown.value)
        both_nan = math.isnan(value) and math.isnan(shown.value)
        if not (both_nan or abs(value - shown.value) <= tolerance):
            out[key] = (value, shown.value)
    return out
