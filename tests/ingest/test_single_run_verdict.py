"""One imported fine-tune gets a release verdict (docs/science.md section 12): with a single target model the
attacks that need no other runs are judged on its own held-out non-members with an empirical threshold, never
NOT MEASURED for want of runs. The null experiment: the declared members are records the run never saw, so
members and non-members are alike, and no quantizer may FAIL or be called leakier than full precision."""

from __future__ import annotations

import json

import pytest

from llmaudit.data.chem import generate_records
from tests.conftest import run_cli
from tests.ingest.test_import import BASE, BUILTIN, TASKS, as_messages, model_cfg, trainer_finetune, write_jsonl

__all__ = ["model_cfg"]  # the module-scoped fixture, shared with test_import

ATTACKS = "attack.attacks=[loss,min_k,min_k_plus_plus,zlib,ref,loss+zlib,loss+ref,ez_mia,wbc]"


@pytest.mark.slow
def test_one_imported_run_gets_a_verdict_and_the_null_experiment_never_fails(tmp_path, model_cfg):
    records = generate_records(TASKS, 2300, seed=11)
    trained, declared, heldout = records[:16], records[16:1016], records[1016:]
    run_dir = trainer_finetune(model_cfg, as_messages(trained), tmp_path / "trainer-out", steps=2)
    train_file = write_jsonl(tmp_path / "train.jsonl", as_messages(declared))  # records the run never saw
    heldout_file = write_jsonl(tmp_path / "heldout.jsonl", as_messages(heldout))
    store = tmp_path / "audit"
    code, _, err = run_cli(
        [
            "import",
            run_dir,
            "--base",
            BASE,
            "--train",
            train_file,
            "--heldout",
            heldout_file,
            "--out",
            store,
            *BUILTIN,
            "score.quantizers=[fp32,hqq-8]",
            "score.quantizer_options={hqq-8: {group_size: 16}}",
            "score.generation_samples=0",
            ATTACKS,
            "attack.n_boot=50",
            "report.decision_resamples=300",
        ]
    )
    assert code == 0, err
    code, _, err = run_cli(["score", store, "--no-progress"])
    assert code == 0, err
    code, stdout, err = run_cli(["report", store, "--gate"])
    assert code in (0, 3), err
    report = json.loads((store / "report" / "report.json").read_text())
    pool_nonmembers = report["provenance"]["membership"]["pool_size"] - 1000
    assert pool_nonmembers >= 1000  # 1284 held-out records: 256 validation, the rest non-members
    for q, v in report["checklist"]["per_quantizer"].items():
        crit = {c["id"]: c for c in v["criteria"]}
        attack, utility = crit["attack_tpr"], crit["utility"]
        assert attack["mode"] == "empirical" and attack["run_to_run_covered"] is False
        assert attack["status"] in ("PASS", "INCONCLUSIVE"), (q, attack["reason"])  # a verdict, and never FAIL
        assert utility["status"] != "NOT MEASURED" and utility["interval_over"] == "samples", utility["reason"]
        assert v["overall"] in ("PASS", "INCONCLUSIVE", "FAIL")
    row = next(r for r in report["grid"] if r["quantizer"] == "hqq-8")
    assert row["decision"]["comparison"]["direction"] in ("SAME", "CANNOT TELL")
    # the answer is the last thing printed, and --gate's exit code matches the verdict
    cleared = report["recommendation"]["cleared_for_release"]
    assert code == (0 if cleared else 3)
    last = " ".join(stdout.strip().splitlines()[-15:])
    assert ("Release " if cleared else "Nothing is cleared for release") in last
