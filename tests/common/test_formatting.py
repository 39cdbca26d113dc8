"""common.formatting: one way to print numbers in every rendering."""

import math

from llmaudit.common.formatting import (
    finite_or_none,
    fmt_ci,
    fmt_num,
    fmt_pct,
    fmt_sig,
    fmt_size,
    interval_or_none,
)


def test_finite_or_none_and_intervals():
    assert finite_or_none("2.5") == 2.5 and finite_or_none(True) is None and finite_or_none(math.nan) is None
    assert interval_or_none(1, 2) == [1.0, 2.0] and interval_or_none(1, math.inf) is None


def test_fixed_scientific_and_significant_digits():
    assert fmt_num(0.12345) == "0.123" and fmt_num(123456.0) == "1.23e+05" and fmt_num(None) == "n/a"
    assert fmt_num(math.inf) == "inf" and fmt_ci([0.1, 0.2]) == " [0.100, 0.200]" and fmt_ci(None) == ""
    assert fmt_pct(0.0512) == "+5.1%" and fmt_pct(-0.25) == "-25.0%"
    assert fmt_sig(0.012345) == "0.0123" and fmt_sig(12345.6) == "12,346" and fmt_sig(0.0) == "0"
    assert fmt_sig(None) == "n/a" and fmt_sig(math.nan, missing="–") == "–" and fmt_sig(-math.inf) == "-inf"
    assert fmt_size(512) == "512 B" and fmt_size(3 * 1024**2) == "3.0 MiB"
