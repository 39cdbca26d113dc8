"""An imported fine-tune with 400 held-out non-members (docs/science.md section 12, "A FAIL on few non-members"; the
held-out file gives 256 more records to validation): too few for a PASS at 1% FPR, enough for the exact FAIL test. `import` says so before anything is scored; a leak
the run planted (its members memorised) FAILs; records the run never saw are NOT MEASURED. `plan RUN_DIR` sizes
the store the same way."""

from __future__ import annotations

import json

import pytest

from llmaudit.data.chem import generate_records
from tests.conftest import run_cli
from tests.ingest.test_import import BASE, BUILTIN, TASKS, as_messages, model_cfg, trainer_finetune, write_jsonl

__all__ = ["model_cfg"]  # the module-scoped fixture, shared with test_import

N_MEMBERS, N_NONMEMBERS, N_VALIDATION = 300, 400, 256  # import: validation = half the held-out, at most 256


def _import_score_report(tmp_path, run_dir, members, heldout) -> tuple[str, dict]:
    store = tmp_path / "audit"
    code, stdout, err = run_cli(
        [
            "import", run_dir, "--base", BASE,
            "--train", write_jsonl(tmp_path / "train.jsonl", as_messages(members)),
            "--heldout", write_jsonl(tmp_path / "heldout.jsonl", as_messages(heldout)),
            "--out", store, *BUILTIN,
            "score.quantizers=[fp32]",
            "score.generation_samples=0",
            "attack.attacks=[loss,min_k,zlib,ref,loss+ref]",
            "attack.n_boot=20",
            "report.decision_resamples=100",
        ]
    )  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli(["score", store, "--no-progress"])
    assert code == 0, err
    code, _, err = run_cli(["report", store])
    assert code == 0, err
    return stdout, json.loads((store / "report" / "report.json").read_text())


def _attack_decision(report: dict) -> dict:
    row = next(r for r in report["grid"] if r["quantizer"] == "fp32")
    return row["decision"]


@pytest.mark.slow
def test_a_planted_leak_fails_on_400_held_out_records_and_import_warned_before_scoring(tmp_path, model_cfg):
    records = generate_records(TASKS, N_MEMBERS + N_NONMEMBERS + N_VALIDATION, seed=21)
    members, heldout = records[:N_MEMBERS], records[N_MEMBERS:]
    run_dir = trainer_finetune(model_cfg, as_messages(members), tmp_path / "trainer-out", lora=False, steps=300)
    stdout, report = _import_score_report(tmp_path, run_dir, members, heldout)
    assert "[import] sizing: PASS out of reach" in stdout and "[import] sizing: FAIL within reach" in stdout
    assert "[import] WARNING: a PASS is out of reach" in stdout
    assert f"{N_NONMEMBERS} of the {N_NONMEMBERS + N_VALIDATION} held-out records are the non-members" in stdout
    d = _attack_decision(report)
    assert report["provenance"]["membership"]["pool_size"] == N_MEMBERS + N_NONMEMBERS
    assert d["status"] == "FAIL" and d["strongest"]["route"] == "exact", d["reason"]
    assert d["strongest"]["tpr"]["low"] > d["limit"] and d["tests"][0]["test"] == "FAIL" and d["tests"][0]["held"]
    assert d["loss_gap"]["low"] > 0


@pytest.mark.slow
def test_records_the_run_never_saw_are_not_measured_and_plan_sizes_the_store(tmp_path, model_cfg):
    records = generate_records(TASKS, 16 + N_MEMBERS + N_NONMEMBERS + N_VALIDATION, seed=22)
    trained, declared, heldout = records[:16], records[16 : 16 + N_MEMBERS], records[16 + N_MEMBERS :]
    run_dir = trainer_finetune(model_cfg, as_messages(trained), tmp_path / "trainer-out", steps=2)
    _, report = _import_score_report(tmp_path, run_dir, declared, heldout)
    d = _attack_decision(report)
    assert d["status"] == "NOT MEASURED" and "exact FAIL test" in d["reason"]
    assert [t["test"] for t in d["tests"]] == ["FAIL", "MEASURED"]
    code, stdout, err = run_cli(["plan", tmp_path / "audit", "--device", "cpu"])
    assert code == 0, err
    assert "PASS out of reach: it needs at least 1000 non-member scores (here 400)" in stdout
