"""common.stats: the shared intervals and the guarded Spearman, against hand-computed values."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from llmaudit.common.stats import (
    bootstrap_mean_interval,
    finite_mean,
    finite_values,
    partial_spearman,
    percentile_interval,
    spearman,
    spearman_rho,
)


def test_finite_values_and_mean_drop_nan_and_inf():
    assert finite_values([1.0, np.nan, np.inf, -np.inf, 3.0]).tolist() == [1.0, 3.0]
    assert finite_mean([1.0, np.nan, 3.0, np.inf]) == 2.0
    assert math.isnan(finite_mean([np.nan, np.inf]))


def test_percentile_interval_matches_numpy_quantiles():
    samples = np.arange(101, dtype=float)  # quantiles are exact on 0..100
    assert percentile_interval(samples, 0.9) == pytest.approx((5.0, 95.0))
    assert all(math.isnan(v) for v in percentile_interval([np.nan], 0.9))


def test_bootstrap_mean_interval_is_the_percentile_interval_of_resampled_means():
    values = np.array([1.0, 2.0, 4.0, 8.0, np.nan])
    low, high = bootstrap_mean_interval(values, n_boot=500, confidence=0.9, seed=3)
    rng = np.random.default_rng(3)
    finite = values[:4]
    means = finite[rng.integers(0, 4, size=(500, 4))].mean(1)
    assert (low, high) == tuple(np.quantile(means, [0.05, 0.95]))
    assert 1.0 <= low < finite.mean() < high <= 8.0


def test_bootstrap_mean_interval_edge_cases():
    assert bootstrap_mean_interval([5.0, np.nan], n_boot=100) == (5.0, 5.0)  # one run: no spread
    assert all(math.isnan(v) for v in bootstrap_mean_interval([1.0, 2.0], n_boot=0))
    assert all(math.isnan(v) for v in bootstrap_mean_interval([], n_boot=100))
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_mean_interval([1.0, 2.0], n_boot=10, confidence=1.5)


def test_spearman_matches_scipy_on_finite_pairs_and_refuses_degenerate_input():
    x = [1.0, 2.0, 3.0, 4.0, np.nan]
    y = [2.0, 1.0, 4.0, 3.0, 7.0]
    res = spearman(x, y)
    want = stats.spearmanr(x[:4], y[:4])
    # the p-value enumerates the 4! pairings: |rho| >= 0.6 in 10 of the 24
    exact = np.mean(
        [
            abs(stats.spearmanr(x[:4], np.array(y[:4])[list(p)]).statistic) >= abs(want.statistic) - 1e-12
            for p in itertools.permutations(range(4))
        ]
    )
    assert res.n == 4 and res.rho == pytest.approx(want.statistic) and res.p_value == pytest.approx(exact)
    assert res.to_dict("n_quantizers") == {"rho": res.rho, "p_value": res.p_value, "n_quantizers": 4}
    constant = spearman([1, 2, 3], [5, 5, 5])
    assert constant.rho is None and "distinct" in constant.reason
    assert spearman([1, 2], [2, 1]).rho is None
    assert spearman([1, 2], [2, 1], min_n=2).rho == pytest.approx(-1.0)
    assert math.isnan(spearman_rho([1, 2, 3], [1, 1, 1]))
    with pytest.raises(ValueError, match="paired"):
        spearman([1, 2, 3], [1, 2])


def test_spearman_p_value_is_exact_for_few_pairs_and_never_the_t_approximation():
    perfect = spearman([1, 2, 3, 4, 5], [2, 4, 6, 8, 10])
    assert perfect.p_value == pytest.approx(2 / 120)  # only the identity and its reverse are as extreme
    assert stats.spearmanr([1, 2, 3, 4, 5], [2, 4, 6, 8, 10]).pvalue < 1e-10  # what the approximation says
    many = spearman(np.arange(13), np.arange(13)[::-1])
    assert 0 < many.p_value < 1e-3


def test_partial_spearman_is_the_textbook_formula_on_spearman_rhos():
    rng = np.random.default_rng(5)
    z = rng.normal(size=12)
    x, y = z + rng.normal(size=12), z + rng.normal(size=12)

    def rho(a, b):
        return stats.spearmanr(a, b).statistic

    want = (rho(x, y) - rho(x, z) * rho(y, z)) / math.sqrt((1 - rho(x, z) ** 2) * (1 - rho(y, z) ** 2))
    got = partial_spearman(x, y, z)
    assert got.rho == pytest.approx(want, rel=1e-10) and got.n == 12
    t = want * math.sqrt(9 / (1 - want * want))
    assert got.p_value == pytest.approx(2 * stats.t.sf(abs(t), 9), rel=1e-8)
    # non-finite triples are dropped; too few, or x fully explained by z: undefined with the reason
    x_nan = x.copy()
    x_nan[0] = math.nan
    assert partial_spearman(x_nan, y, z).n == 11
    assert partial_spearman(x[:3], y[:3], z[:3]).rho is None
    lin = partial_spearman(2 * z, y, z)
    assert lin.rho is None and "control" in lin.reason
    with pytest.raises(ValueError, match="paired"):
        partial_spearman(x, y, z[:5])
