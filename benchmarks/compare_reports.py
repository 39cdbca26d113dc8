"""Two report.json files compared value by value, apart from when and how fast they were made.

    python benchmarks/compare_reports.py BEFORE/report.json AFTER/report.json

Prints every difference (path, before, after) and exits 1 if there is one. Ignored: time stamps (`*_utc`) and
measured durations (`wall_s`, `*_seconds`, `elapsed*`), which differ between two runs of the same code; the plot
files' paths are compared by name. Numbers are compared exactly (NaN equals NaN): a refactor that claims to
change no number is checked to the last bit.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

IGNORED = re.compile(r"(_utc$|^wall_s$|_seconds$|^elapsed|^seconds$)")


def differences(before, after, path: str = "") -> list[tuple[str, object, object]]:
    """(path, before, after) of every value that differs; dict keys in IGNORED are skipped."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after), key=str):
            if IGNORED.search(str(key)):
                continue
            if key not in before or key not in after:
                out.append((f"{path}/{key}", before.get(key, "<absent>"), after.get(key, "<absent>")))
            else:
                out += differences(before[key], after[key], f"{path}/{key}")
        return out
    if isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            return [(path, f"{len(before)} items", f"{len(after)} items")]
        return [d for i, (b, a) in enumerate(zip(before, after)) for d in differences(b, a, f"{path}[{i}]")]
    if isinstance(before, float) and isinstance(after, float) and math.isnan(before) and math.isnan(after):
        return []
    if isinstance(before, str) and isinstance(after, str) and before.endswith(".png") and after.endswith(".png"):
        return [] if Path(before).name == Path(after).name else [(path, before, after)]
    return [] if before == after and type(before) is type(after) else [(path, before, after)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--show", type=int, default=40, help="print at most this many differences")
    a = ap.parse_args(argv)
    found = differences(json.loads(a.before.read_text()), json.loads(a.after.read_text()))
    for path, b, c in found[: a.show]:
        print(f"{path}: {str(b)[:120]} -> {str(c)[:120]}")
    print(f"{len(found)} difference(s) between {a.before} and {a.after}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
