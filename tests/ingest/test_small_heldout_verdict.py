"""An imported fine-tune with 400 held-out non-members (docs/science.md section 12, "A FAIL on few non-members"; the
held-out file gives 256 more records to validation): too few for a PASS at 1% FPR, enough for the exact FAIL test. `import` says so before anything is scored; a leak
planted with known truth in one target's losses FAILs by that test; records the run never saw are NOT MEASURED. `plan RUN_DIR` sizes
the store the same way."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from llmaudit.config import ExperimentConfig
from llmaudit.data.chem import generate_records
from llmaudit.store.losstable import validate_loss_table
from tests.conftest import run_cli, write_store_from_table
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


def _planted_table(rng, membership, shift):
    """One run's final unit and the base model's: members of the run lose `shift` nats (a leak planted with known
    truth), every other record only noise."""
    n_pool, rows = membership.size, []
    for run, step in ((-1, 0), (0, 4)):
        for split, n in (("pool", n_pool), ("val", N_VALIDATION)):
            difficulty = np.random.default_rng(7 if split == "pool" else 8).uniform(1.0, 2.0, n)
            for j in range(n):
                member = run == 0 and split == "pool" and bool(membership[j])
                tl = np.abs(rng.normal(difficulty[j] - shift * member + rng.normal(0, 0.3), 0.2, 6))
                rows.append(
                    dict(run=run, checkpoint=step, quantizer="fp32", sample_id=f"synthetic/{split}/{j:04d}",
                         split=split, member=member, loss=float(tl.mean()), n_tokens=6, token_losses=tl,
                         zlib_bytes=40 + j % 7)
                )  # fmt: skip
    return validate_loss_table(pd.DataFrame(rows))


def test_a_planted_leak_on_400_non_members_fails_by_the_exact_test(tmp_path):
    """One target, 300 members and 400 non-members (too few for the pooled rule's 1 / FPR x 10): members lose 1
    nat, so the exact FAIL test's lower bound clears the limit and the verdict is FAIL by the exact route."""
    root = tmp_path / "run"
    cfg = ExperimentConfig(
        name="small-heldout", output_dir=str(root), train={"runs": 1},
        score={"quantizers": ["fp32"]}, attack={"attacks": ["loss", "zlib", "ref"], "n_boot": 20},
        report={"decision_resamples": 100},
    )  # fmt: skip
    membership = np.zeros(N_MEMBERS + N_NONMEMBERS, bool)
    membership[np.random.default_rng(0).permutation(membership.size)[:N_MEMBERS]] = True
    pool = [_record("pool", j) for j in range(membership.size)]
    val = [_record("val", j) for j in range(N_VALIDATION)]
    table = _planted_table(np.random.default_rng(1), membership, shift=1.0)
    write_store_from_table(root, cfg, pool, val, membership[None, :], table)
    code, _, err = run_cli(["report", root])
    assert code == 0, err
    d = _attack_decision(json.loads((root / "report" / "report.json").read_text()))
    assert d["status"] == "FAIL" and d["strongest"]["route"] == "exact", d["reason"]
    assert d["strongest"]["tpr"]["low"] > d["limit"] and d["tests"][0]["test"] == "FAIL" and d["tests"][0]["held"]


def _record(split: str, j: int) -> dict:
    return {"sample_id": f"synthetic/{split}/{j:04d}", "task": "molecule_captioning", "split": split,
            "input": f"Describe molecule number {j}", "output": f"Molecule {j} is a compound."}  # fmt: skip


@pytest.mark.slow
def test_records_the_run_never_saw_are_not_measured_and_plan_sizes_the_store(tmp_path, model_cfg):
    records = generate_records(TASKS, 16 + N_MEMBERS + N_NONMEMBERS + N_VALIDATION, seed=22)
    trained, declared, heldout = records[:16], records[16 : 16 + N_MEMBERS], records[16 + N_MEMBERS :]
    run_dir = trainer_finetune(model_cfg, as_messages(trained), tmp_path / "trainer-out", steps=2)
    stdout, report = _import_score_report(tmp_path, run_dir, declared, heldout)
    assert "[import] sizing: PASS out of reach" in stdout and "[import] sizing: FAIL within reach" in stdout
    assert "[import] WARNING: a PASS is out of reach" in stdout
    assert f"{N_NONMEMBERS} of the {N_NONMEMBERS + N_VALIDATION} held-out records are the non-members" in stdout
    assert report["provenance"]["membership"]["pool_size"] == N_MEMBERS + N_NONMEMBERS
    d = _attack_decision(report)
    assert d["status"] == "NOT MEASURED" and "exact FAIL test" in d["reason"]
    assert [t["test"] for t in d["tests"]] == ["FAIL", "MEASURED"]
    code, stdout, err = run_cli(["plan", tmp_path / "audit", "--device", "cpu"])
    assert code == 0, err
    assert "PASS out of reach: it needs at least 1000 non-member scores (here 400)" in stdout
