"""Sizing before compute in the commands (docs/science.md section 12, "Sizing before compute"): `llmaudit score` on
a store that can reach no verdict says so before the first unit; `llmaudit plan RUN_DIR` sizes a run directory."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_cli


def test_score_says_before_any_unit_that_the_store_reaches_no_verdict(audited_tiny_store, tmp_path):
    store = tmp_path / "exp"
    shutil.copytree(audited_tiny_store, store)  # 3 runs x 16 pool records: 24 non-member scores in all
    code, out, err = run_cli(["score", store, "--no-progress"])
    assert code == 0, err
    assert "[score] sizing: FAIL out of reach: it needs at least 1000 non-member scores in all (here 24)" in out
    assert "[score] WARNING: this store cannot reach a release verdict" in out
    assert out.index("[score] WARNING") < out.index("unit(s) in the grid")  # said before the stage ran


@pytest.mark.slow  # the plan's few-second calibration and its analysis timing
def test_plan_accepts_a_run_directory_and_sizes_it(audited_tiny_store):
    code, out, err = run_cli(["plan", audited_tiny_store, "--device", "cpu", "--json"])
    assert code == 0, err
    sizing = json.loads(out)["sizing"]
    assert sizing["design"] == {"members": 8, "nonmembers": 8, "targets": 3, "attacks": sizing["design"]["attacks"]}
    assert sizing["verdict_reachable"] is False and sizing["nonmembers_for_fail"] == 1000
