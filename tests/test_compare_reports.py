"""benchmarks/compare_reports.py: two report.json files equal apart from when and how fast they were made."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compare_reports", ROOT / "benchmarks" / "compare_reports.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

REPORT = {
    "generated_utc": "2026-12-02T21:00:00Z",
    "result": {"wall_s": 12.5, "auroc": 0.61, "ci": [0.5, math.nan], "plots": ["/a/run1/roc.png"]},
}


def test_time_stamps_durations_and_plot_directories_are_not_differences(tmp_path):
    after = json.loads(json.dumps(REPORT))
    after["generated_utc"] = "2026-12-03T08:00:00Z"
    after["result"]["wall_s"] = 99.0
    after["result"]["plots"] = ["/b/run2/roc.png"]
    assert compare.differences(REPORT, after) == []
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(REPORT))
    b.write_text(json.dumps(after))
    assert compare.main([str(a), str(b)]) == 0


def test_a_changed_number_a_missing_key_and_a_changed_type_are(tmp_path):
    after = json.loads(json.dumps(REPORT))
    after["result"]["auroc"] = 0.6100000000000001  # one ulp
    after["result"]["ci"] = [0.5, 0.7]
    del after["result"]["plots"]
    after["extra"] = 1
    found = {path for path, _, _ in compare.differences(REPORT, after)}
    assert found == {"/result/auroc", "/result/ci[1]", "/result/plots", "/extra"}
    assert compare.differences({"n": 1}, {"n": 1.0}) == [("/n", 1, 1.0)]
