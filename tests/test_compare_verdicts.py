"""benchmarks/compare_verdicts.py: two audits compared within their noise (verdicts equal, estimates in intervals)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compare_verdicts", ROOT / "benchmarks" / "compare_verdicts.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def _attack(auroc: float, lo: float, hi: float, tpr: float) -> dict:
    return {
        "pooled_naive": {"auroc": auroc, "ci": {"auroc": {"low": lo, "high": hi}}},
        "pooled_calibrated": {
            "tpr_at_fpr": {"0.01": {"tpr": tpr}},
            "ci": {"tpr_at_fpr": {"0.01": {"tpr": {"low": tpr - 0.01, "high": tpr + 0.02}}}},
        },
    }


REPORT = {
    "checklist": {
        "per_quantizer": {
            "bf16": {"overall": "INCONCLUSIVE", "criteria": [{"id": "attack_tpr", "status": "INCONCLUSIVE"}]},
            "hqq-2": {"overall": "FAIL", "criteria": [{"id": "utility", "status": "FAIL"}]},
        }
    },
    "recommendation": {"quantizer": "bf16", "overall": "INCONCLUSIVE"},
    "result": {
        "attacks": {
            "quantizers": {
                "bf16": {"attacks": {"loss": _attack(0.70, 0.68, 0.72, 0.03)}},
                "hqq-2": {"attacks": {"loss": _attack(0.55, 0.52, 0.58, 0.011), "wbc": {"pooled_naive": {}}}},
            }
        }
    },
}


def _run(tmp_path, before: dict, after: dict, capsys) -> tuple[int, str]:
    a, b = tmp_path / "before.json", tmp_path / "after.json"
    a.write_text(json.dumps(before))
    b.write_text(json.dumps(after))
    code = compare.main([str(a), str(b)])
    return code, capsys.readouterr().out


def test_the_same_audit_agrees_with_itself(tmp_path, capsys):
    code, out = _run(tmp_path, REPORT, REPORT, capsys)
    assert code == 0
    assert "after in before's interval: 4 of 4 estimates (100.0%)" in out  # wbc without values is not counted
    assert "verdicts that differ: 0" in out


def test_an_estimate_outside_the_interval_is_named_and_a_changed_verdict_fails(tmp_path, capsys):
    after = copy.deepcopy(REPORT)
    after["result"]["attacks"]["quantizers"]["bf16"]["attacks"]["loss"]["pooled_naive"]["auroc"] = 0.75
    code, out = _run(tmp_path, REPORT, after, capsys)
    assert code == 0  # an estimate that moved is reported, not a failure
    assert "outside: ('bf16', 'loss', 'auroc'): before 0.7000" in out
    assert "after in before's interval: 3 of 4" in out
    after["checklist"]["per_quantizer"]["bf16"]["overall"] = "PASS"
    code, out = _run(tmp_path, REPORT, after, capsys)
    assert code == 1 and "bf16         DIFFERS" in out and "verdicts that differ: 1" in out
