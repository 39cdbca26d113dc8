"""llama.cpp's --kl-divergence statistics: hand-computed values, llama.cpp's own sum / sum-of-squares formulas as
the reference, and the per-quantizer aggregation from a loss table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.fidelity import (
    divergence_from_table,
    divergence_statistics,
    mean_and_error,
    percentiles,
    share_and_error,
)


def _llama_cpp_mean_and_uncertainty(values):
    """perplexity.cpp's mean_and_uncertainty(sum, sum2, count), without its count > 10 cut-off."""
    n = len(values)
    f = sum(values) / n
    df = sum(v * v for v in values) / n - f * f
    return f, math.sqrt(df / (n - 1)) if df > 0 else 0.0


def test_hand_computed_statistics_of_four_tokens():
    kl = np.array([0.0, 0.1, 0.2, 0.3])
    top = np.array([True, True, False, True])
    nll_q = np.array([1.0, 2.0, 0.5, 0.0])
    nll_ref = np.array([1.0, 1.0, 1.0, 0.0])
    s = divergence_statistics(kl, top, nll_q, nll_ref)
    assert s["n_tokens"] == 4
    assert s["kl_mean"] == pytest.approx(0.15)
    assert s["kl_se"] == pytest.approx(math.sqrt(0.05 / 3) / 2)  # sd = sqrt(0.05/3), / sqrt(4)
    assert s["kl_percentiles"]["99"] == pytest.approx(0.2 + 0.97 * 0.1)  # position 0.99 x 3 = 2.97
    assert s["kl_median"] == pytest.approx(0.15) and s["kl_max"] == 0.3 and s["kl_percentiles"]["min"] == 0.0
    assert s["same_top"] == 0.75 and s["same_top_se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 3))
    dp = np.array([0.0, math.exp(-2) - math.exp(-1), math.exp(-0.5) - math.exp(-1), 0.0])
    assert s["delta_p_mean"] == pytest.approx(dp.mean())
    assert s["delta_p_rms"] == pytest.approx(math.sqrt((dp**2).mean()))
    assert s["delta_p_percentiles"]["75"] == pytest.approx(np.quantile(dp, 0.75))
    assert s["ln_ppl_ratio"] == pytest.approx(0.125)  # mean of (0, 1, -0.5, 0)
    assert s["ppl_ratio"] == pytest.approx(math.exp(0.125))
    assert s["ppl_q"] == pytest.approx(math.exp(0.875)) and s["ppl_ref"] == pytest.approx(math.exp(0.75))


def test_errors_equal_llama_cpps_formulas():
    rng = np.random.default_rng(0)
    kl = rng.exponential(0.01, 500)
    nll_q, nll_ref = rng.exponential(1.0, 500), rng.exponential(1.0, 500)
    nll_q = 0.7 * nll_ref + 0.3 * nll_q  # correlated, as two models of one checkpoint are
    s = divergence_statistics(kl, rng.random(500) < 0.9, nll_q, nll_ref)
    assert s["kl_se"] == pytest.approx(_llama_cpp_mean_and_uncertainty(kl.tolist())[1], rel=1e-9)
    # ln(PPL_q / PPL_ref): sqrt(se_q^2 + se_ref^2 - 2 cov), cov = (sum ab / n - mean a mean b) / (n - 1)
    n = 500
    _, se_q = _llama_cpp_mean_and_uncertainty(nll_q.tolist())
    _, se_r = _llama_cpp_mean_and_uncertainty(nll_ref.tolist())
    cov = ((nll_q * nll_ref).sum() / n - nll_q.mean() * nll_ref.mean()) / (n - 1)
    assert s["ln_ppl_ratio_se"] == pytest.approx(math.sqrt(se_q**2 + se_r**2 - 2 * cov), rel=1e-9)
    assert s["cor_ln_ppl"] == pytest.approx(cov / (se_q * se_r), rel=1e-9)
    dp = np.exp(-nll_q) - np.exp(-nll_ref)
    mse, mse_se = _llama_cpp_mean_and_uncertainty((dp**2).tolist())
    assert s["delta_p_rms_se"] == pytest.approx(0.5 / math.sqrt(mse) * mse_se, rel=1e-9)
    # percentiles: linear between order statistics at fraction x (N - 1), llama.cpp's `percentile`
    ordered = np.sort(kl)
    p = 0.999 * (n - 1)
    i = int(p)
    assert s["kl_percentiles"]["99.9"] == pytest.approx((1 - (p - i)) * ordered[i] + (p - i) * ordered[i + 1])


def test_small_samples_and_a_model_against_itself():
    assert math.isnan(mean_and_error(np.array([1.0]))[1]) and math.isnan(share_and_error(np.array([True]))[1])
    assert all(math.isnan(v) for v in percentiles(np.array([])).values())
    same = divergence_statistics(np.zeros(5), np.ones(5, bool), np.arange(5.0), np.arange(5.0))
    assert same["kl_mean"] == 0 and same["same_top"] == 1 and same["delta_p_rms"] == 0 and same["ppl_ratio"] == 1


def _table(q_token_kl=True, shift=0.0):
    """Two runs (final checkpoint 20, an earlier one at 10), two validation samples; fp32 and q."""
    rows = []
    for run in (0, 1):
        for step in (10, 20):
            for q in ("fp32", "q"):
                for j, tokens in enumerate(([1.0, 2.0], [0.5, 0.5, 0.5])):
                    tl = np.array(tokens) + (0.1 * (run + 1) + shift if q == "q" else 0.0)
                    row = dict(run=run, checkpoint=step, quantizer=q, sample_id=f"v{j}", split="val", member=False)
                    row |= dict(loss=tl.mean(), n_tokens=len(tl), token_losses=tl)
                    final = step == 20 and (q == "fp32" or q_token_kl)
                    kl = np.full(len(tl), 0.0 if q == "fp32" else 0.01 * (run + 1))
                    row["token_kl"] = kl if final else None
                    row["token_same_top"] = np.ones(len(tl), bool) if final else None
                    rows.append(row)
    return pd.DataFrame(rows)


def test_per_quantizer_means_over_runs_with_token_errors():
    out = divergence_from_table(_table(), ["fp32", "q"], "fp32", n_boot=200, seed=0)
    q = out["per_quantizer"]["q"]
    assert q["measured"] and q["n_runs"] == 2
    assert [r["kl_mean"] for r in q["per_run"]] == pytest.approx([0.01, 0.02])
    assert [r["ln_ppl_ratio"] for r in q["per_run"]] == pytest.approx([0.1, 0.2])  # every token +0.1 (run 0)
    assert q["summary"]["kl_mean"]["mean"] == pytest.approx(0.015)
    assert q["summary"]["kl_mean"]["ci"] == pytest.approx([0.01, 0.02])  # two runs: the resampled means span them
    assert q["summary"]["kl_mean"]["token_se"] == 0.0  # constant KL within each run
    ln_se = [r["ln_ppl_ratio_se"] for r in q["per_run"]]
    assert q["summary"]["ln_ppl_ratio"]["token_se"] == pytest.approx(math.sqrt(sum(e * e for e in ln_se)) / 2)
    assert out["per_quantizer"]["fp32"]["summary"]["kl_mean"]["mean"] == 0.0


def test_units_without_the_columns_are_not_measured_with_the_reason():
    out = divergence_from_table(_table(q_token_kl=False), ["fp32", "q"], "fp32", n_boot=50)
    assert out["per_quantizer"]["q"] == {
        "measured": False,
        "reason": "run 0: its final units were scored without per-token KL",
    }
    old = _table().drop(columns=["token_kl", "token_same_top"])  # a store scored before the columns existed
    assert not divergence_from_table(old, ["fp32", "q"], "fp32", n_boot=50)["per_quantizer"]["fp32"]["measured"]
