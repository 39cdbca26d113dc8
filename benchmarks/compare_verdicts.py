"""Two audits of the same recipe compared within their noise: the same verdicts, and each estimate of one inside the
other's interval.

    python benchmarks/compare_verdicts.py BEFORE/report.json AFTER/report.json

Where `compare_reports.py` demands every number to the last bit (a refactor that changes none), this is for two
audits whose fine-tunes differ by float rounding (another summation order in training, another machine): each
fine-tune, hence each score, moves a little, and the audit is only the same if what it concludes is. Prints

- per quantizer: the overall verdict and each criterion's status, before and after;
- the recommendation (quantizer, overall);
- per (quantizer, attack): the pooled AUROC and the per-sample calibrated TPR at 1% FPR of both, and whether each
  after-value lies in the before-value's 95% bootstrap interval (and the reverse);

and the share of estimates inside the other's interval. Exits 1 if a verdict or the recommendation differs.
Under no change at all, about 95% of the after-values fall in the before-intervals; fewer (far fewer than 95% on
many estimates) says the audit moved by more than its noise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def verdicts(report: dict) -> dict[str, dict[str, str]]:
    """{quantizer: {"overall": status, criterion id: status}} from the report's checklist."""
    out = {}
    for q, entry in report["checklist"]["per_quantizer"].items():
        out[q] = {"overall": entry["overall"]} | {c["id"]: c["status"] for c in entry["criteria"]}
    return out


def estimates(report: dict) -> dict[tuple[str, str, str], tuple[float, list[float]]]:
    """{(quantizer, attack, measure): (value, [lo, hi])} for the pooled AUROC and the calibrated TPR at 1% FPR."""
    out = {}
    for q, block in report["result"]["attacks"]["quantizers"].items():
        for attack, entry in (block.get("attacks") or {}).items():
            naive = entry.get("pooled_naive") or {}
            ci = (naive.get("ci") or {}).get("auroc")
            if naive.get("auroc") is not None and ci:
                out[(q, attack, "auroc")] = (naive["auroc"], [ci["low"], ci["high"]])
            calibrated = entry.get("pooled_calibrated") or {}
            point = ((calibrated.get("tpr_at_fpr") or {}).get("0.01") or {}).get("tpr")
            ci = (((calibrated.get("ci") or {}).get("tpr_at_fpr") or {}).get("0.01") or {}).get("tpr")
            if point is not None and ci:
                out[(q, attack, "tpr@1%")] = (point, [ci["low"], ci["high"]])
    return out


def inside(value: float, interval: list[float]) -> bool:
    return interval[0] <= value <= interval[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    before, after = (json.loads(p.read_text(encoding="utf-8")) for p in (args.before, args.after))
    v_before, v_after = verdicts(before), verdicts(after)
    changed = 0
    for q in sorted(set(v_before) | set(v_after)):
        b, a = v_before.get(q, {}), v_after.get(q, {})
        same = b == a
        changed += not same
        print(f"{q:12s} {'same' if same else 'DIFFERS'}  before {b}" + ("" if same else f"\n{'':18s}after  {a}"))
    rec = [(r["recommendation"].get("quantizer"), r["recommendation"].get("overall")) for r in (before, after)]
    print(f"recommendation: before {rec[0]}, after {rec[1]}")
    changed += rec[0] != rec[1]
    e_before, e_after = estimates(before), estimates(after)
    common = sorted(set(e_before) & set(e_after))
    hits = {"after in before's interval": 0, "before in after's interval": 0}
    for key in common:
        (vb, cb), (va, ca) = e_before[key], e_after[key]
        hits["after in before's interval"] += inside(va, cb)
        hits["before in after's interval"] += inside(vb, ca)
        if not (inside(va, cb) and inside(vb, ca)):
            print(
                f"  outside: {key}: before {vb:.4f} {[round(x, 4) for x in cb]}, after {va:.4f} {[round(x, 4) for x in ca]}"
            )
    for name, n in hits.items():
        print(f"{name}: {n} of {len(common)} estimates ({100 * n / max(1, len(common)):.1f}%)")
    print(f"verdicts that differ: {changed}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
