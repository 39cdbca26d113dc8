"""llama-perplexity's KL statistics as pure functions (``analyze.llama_kld``): each against an independent float64
computation of its definition (docs/science.md section 11), the tool's conventions where they differ (errors 0 at
N <= 10, the median of an even count, float32 percentiles), and its output read by label. (Equality with the tool's
own printed numbers: tests/analyze/test_llama_perplexity.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmaudit.analyze.llama_kld import (
    Printed,
    TokenKLD,
    chunk_statistics,
    covariance,
    differences,
    format_summary,
    kld_summary,
    mean_and_uncertainty,
    parse_perplexity_output,
    percentile,
    printed_values,
)
from llmaudit.quantize.gguf_logits import decode_log_probs, encode_log_probs


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - np.logaddexp.reduce(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def pair():
    """Base and quantized logits of 300 positions over 97 tokens, the quantized ones a perturbation."""
    rng = np.random.default_rng(4)
    base = (rng.standard_normal((300, 97)) * 3).astype(np.float32)
    quant = (base + rng.standard_normal(base.shape) * 0.3).astype(np.float32)
    targets = rng.integers(0, 97, 300)
    return base, quant, targets


def test_per_position_values_are_their_definitions(pair):
    base, quant, targets = pair
    rows = encode_log_probs(base)
    t = chunk_statistics(quant, rows, targets)
    _, _, log_base = decode_log_probs(rows, 97)  # the base as the file stores it
    log_q = _log_softmax(quant)
    at = np.arange(300)
    np.testing.assert_allclose(t.nll, -log_q[at, targets], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t.nll_base, -log_base[at, targets], rtol=1e-6, atol=1e-6)
    kept = log_base > -16
    kld = (np.exp(log_base) * (log_base - log_q) * kept).sum(1)
    np.testing.assert_allclose(t.kld, kld, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(t.p_diff, np.exp(-t.nll.astype(float)) - np.exp(-t.nll_base.astype(float)), atol=1e-6)
    assert (t.same_top == (quant.argmax(1) == log_base.argmax(1))).all()
    assert 0 < t.same_top.mean() < 1 and (t.kld > 0).all()


def test_the_kld_is_close_to_the_exact_one_but_truncated_at_minus_16():
    """Far-apart logits: the base keeps only log p > max - 16, so the tool's KL misses the tail mass the exact
    KL counts."""
    base = np.array([[0.0, -30.0, -30.0]], np.float32)
    quant = np.array([[0.0, 2.0, 2.0]], np.float32)
    t = chunk_statistics(quant, encode_log_probs(base), np.array([0]))
    p, q = np.exp(_log_softmax(base)), _log_softmax(quant)
    exact = float((p * (np.log(p) - q)).sum())
    assert t.kld[0] == pytest.approx(-q[0, 0], rel=1e-5) and exact > t.kld[0]


def test_summary_statistics_are_their_definitions(pair):
    base, quant, targets = pair
    t = chunk_statistics(quant, encode_log_probs(base), targets)
    s = kld_summary(t)
    n = 300
    d = t.nll.astype(float) - t.nll_base.astype(float)
    assert s["n_tokens"] == n
    assert s["kl_mean"] == pytest.approx(t.kld.mean(), rel=1e-12)
    assert s["kl_se"] == pytest.approx(t.kld.std(ddof=1) / math.sqrt(n), rel=1e-6)
    assert s["ln_ppl_ratio"] == pytest.approx(d.mean(), rel=1e-9)
    assert s["ln_ppl_ratio_se"] == pytest.approx(d.std(ddof=1) / math.sqrt(n), rel=1e-4)  # the paired difference
    assert s["ppl_ratio"] == pytest.approx(math.exp(d.mean()), rel=1e-9)
    assert s["ppl_q"] == pytest.approx(math.exp(t.nll.astype(float).mean()), rel=1e-9)
    assert s["cor_ln_ppl"] == pytest.approx(np.corrcoef(t.nll, t.nll_base)[0, 1], rel=1e-4)
    assert s["same_top"] == t.same_top.mean()
    assert s["same_top_se"] == pytest.approx(math.sqrt(s["same_top"] * (1 - s["same_top"]) / (n - 1)))
    dp = t.p_diff.astype(float)
    assert s["delta_p_mean"] == pytest.approx(dp.mean(), rel=1e-6, abs=1e-12)
    assert s["delta_p_rms"] == pytest.approx(math.sqrt((dp**2).mean()), rel=1e-6)
    for name, fraction in (("99", 0.99), ("90", 0.90), ("10", 0.10), ("max", 1.0), ("min", 0.0)):
        assert s["kl_percentiles"][name] == pytest.approx(np.quantile(t.kld, fraction), rel=1e-5)
    assert s["kl_percentiles"]["median"] == pytest.approx(np.median(t.kld), rel=1e-6)


def test_the_tools_conventions_for_few_values():
    assert mean_and_uncertainty(10.0, 30.0, 10) == (1.0, 0.0)  # N <= 10: no error
    f, df = mean_and_uncertainty(11.0, 33.0, 11)
    assert f == 1.0 and df == pytest.approx(math.sqrt((3 - 1) / 10))
    assert mean_and_uncertainty(0.0, 0.0, 0) == (0.0, 0.0)
    assert covariance(1.0, 2.0, 3.0, 9) == 0.0  # N < 10
    assert covariance(10.0, 20.0, 30.0, 10) == pytest.approx((3.0 - 1.0 * 2.0) / 9)
    values = np.array([1.0, 2.0, 4.0, 8.0], np.float32)
    assert percentile(values, 0.5) == pytest.approx(3.0)  # interpolated at 0.5 x 3 = 1.5
    assert percentile(values, 0.0) == 1.0 and percentile(values, 1.0) == 8.0
    t = TokenKLD(*(np.arange(4, dtype=np.float32) for _ in range(4)), np.ones(4, bool))
    assert kld_summary(t)["kl_percentiles"]["median"] == 1.5  # the mean of the two middle values
    with pytest.raises(ValueError, match="at least 2"):
        kld_summary(TokenKLD(*(np.zeros(1, np.float32) for _ in range(4)), np.ones(1, bool)))


TOOL_TAIL = """
  8    84487.3159 ±  3737.5560       0.00170 ±    0.00068       0.00011 ±    0.00000     0.000 ±  0.000 %    97.817 ±  0.651 %

====== Perplexity statistics ======
Mean PPL(Q)                   : 84487.315861 ± 3737.556026
Mean PPL(base)                : 84343.878291 ± 3729.738210
Cor(ln(PPL(Q)), ln(PPL(base))):  99.99%
Mean ln(PPL(Q)/PPL(base))     :   0.001699 ±   0.000681
Mean PPL(Q)/PPL(base)         :   1.001701 ±   0.000682
Mean PPL(Q)-PPL(base)         : 143.437569 ±  57.972960

====== KL divergence statistics ======
Mean    KLD:   0.000115 ±   0.000001
Maximum KLD:   0.000176
99.9%   KLD:   0.000176
99.0%   KLD:   0.000164
95.0%   KLD:   0.000152
Median  KLD:   0.000113
 1.0%   KLD:   0.000085
Minimum KLD:   0.000072

====== Token probability statistics ======
Mean    Δp: -0.000 ± 0.000 %
Maximum Δp:  0.000%
Median  Δp: -0.000%
RMS Δp    :  0.000 ± 0.000 %
Same top p: 97.817 ± 0.651 %

llama_perf_context_print:        load time =      97.11 ms
"""


def test_the_output_is_read_by_label_whatever_the_order_and_the_lines_around():
    parsed = parse_perplexity_output(TOOL_TAIL)
    assert parsed["ppl_q"] == Printed(84487.315861, 6) and parsed["ppl_q_se"] == Printed(3737.556026, 6)
    assert parsed["cor_ln_ppl"] == Printed(99.99, 2) and parsed["same_top_se"] == Printed(0.651, 3)
    assert parsed["kl_99"] == Printed(0.000164, 6) and parsed["kl_1"] == Printed(0.000085, 6)
    assert parsed["kl_mean"].value == 0.000115 and parsed["kl_se"].value == 0.000001
    assert parsed["delta_p_median"] == Printed(-0.0, 3) and "delta_p_99" not in parsed  # absent lines stay absent
    lines = TOOL_TAIL.strip().splitlines()
    shuffled = "\n".join(lines[::-1])  # another order (the percentile lines moved between llama.cpp versions)
    assert parse_perplexity_output(shuffled) == parsed
    assert len(parsed) == 28  # nothing read from the per-chunk table or the performance lines


def test_formatted_statistics_read_back_to_the_printed_precision(pair):
    base, quant, targets = pair
    s = kld_summary(chunk_statistics(quant, encode_log_probs(base), targets))
    parsed = parse_perplexity_output(format_summary(s))
    assert len(parsed) == 43
    assert differences(s, parsed) == {}
    values = printed_values(s)
    assert values["same_top"] == 100 * s["same_top"] and values["kl_99.9"] == s["kl_percentiles"]["99.9"]


def test_differences_names_a_statistic_off_by_more_than_half_a_printed_unit():
    s = {"kl_mean": 0.1234564, "kl_se": 0.0000014, "ppl_q": math.nan}
    printed = {"kl_mean": Printed(0.123456, 6), "kl_se": Printed(0.000002, 6), "ppl_q": Printed(math.nan, 6),
               "same_top": Printed(99.0, 3)}  # fmt: skip
    found = differences(s, printed)  # kl_mean rounds to the printed value, nan matches nan
    assert set(found) == {"kl_se", "same_top"} and found["kl_se"] == (0.0000014, 0.000002)


@pytest.mark.parametrize(
    "args, words",
    [
        (["q.gguf"], "either --base-logits"),
        (["q.gguf", "--base-logits", "base.bin", "--base", "q.gguf"], "either --base-logits"),
        (["--base-logits", "base.bin"], "nothing to do"),
        (["q.gguf", "--base", "q.gguf"], "needs --text"),
        (["notes.txt", "--base-logits", "base.bin"], "not a .gguf file"),
        (["q.gguf", "--base-logits", "missing.bin"], "no such file"),
        (["q.gguf", "--base-logits", "notes.txt"], "notes.txt"),  # not a logits file (or llama.cpp missing)
    ],
)
def test_the_kld_command_refuses_bad_input_in_one_line(tmp_path, args, words):
    from tests.conftest import run_cli

    (tmp_path / "q.gguf").write_bytes(b"GGUF")
    (tmp_path / "base.bin").write_bytes(b"_logits_")
    (tmp_path / "notes.txt").write_text("not logits")
    code, _, err = run_cli(["kld", *[a if a.startswith("--") else str(tmp_path / a) for a in args]])
    assert code == 2 and err.count("\n") == 1, err
    assert words in err or "llama-cpp-python" in err, err


def test_the_kld_commands_batch_default_is_the_librarys():
    """`llmaudit kld --batch` defaults to the library's tokens per decode call (the command holds its own copy, so
    that its help imports neither llama.cpp nor torch)."""
    from llmaudit.analyze import gguf_kld
    from llmaudit.commands import kld

    assert kld.DEFAULT_BATCH == gguf_kld.DEFAULT_BATCH == 2048
