"""Numbers as people read them: finite-or-None coercion, fixed/scientific notation, intervals,
percentages and sizes, used by every rendering.
"""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(x: Any) -> float | None:
    """A finite float, or None (for None, NaN, +-inf and anything not a number)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def interval_or_none(low: Any, high: Any) -> list | None:
    lo, hi = finite_or_none(low), finite_or_none(high)
    return None if lo is None or hi is None else [lo, hi]


def fmt_num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x != 0 and (abs(x) < 10**-digits or abs(x) >= 10**5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


def fmt_ci(ci: Any, digits: int = 3) -> str:
    if not ci or ci[0] is None:
        return ""
    return f" [{fmt_num(ci[0], digits)}, {fmt_num(ci[1], digits)}]"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "n/a"
    return f"{'+' if x >= 0 else ''}{100 * x:.{digits}f}%"


def fmt_pct_ci(ci: list | None) -> str:
    return "" if not ci else f" [{fmt_pct(ci[0])}, {fmt_pct(ci[1])}]"


def fmt_size(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_sig(x: Any, digits: int = 3, *, missing: str = "n/a") -> str:
    """`digits` significant digits (thousands separators from 1000 on); `missing` for None and NaN."""
    value = finite_or_none(x)
    if value is None:
        if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return missing
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"
