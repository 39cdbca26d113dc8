"""A run directory travels: every input is untrusted. Each case tampers with a copy of a tiny real store
(or passes a bad input) and asserts the exit code (2), the one-line message (naming the file and the fix),
that no file outside the output directory changed, that nothing finished was lost, and that no payload
ran. Cases that repair the store check that the repaired report equals the truth.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from llmaudit.config import config_from_dict
from llmaudit.report.build import build_report
from llmaudit.report.markdown import render_markdown
from llmaudit.store.run_store import RunStore, content_digest
from llmaudit.store.worklog import read_work
from tests.conftest import TINY_OVERRIDES, run_cli

QUANTIZERS = ["fp32", "uniform-4", "sign"]


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def base_store(audited_tiny_store):
    """One tiny experiment, fine-tuned, scored and reported once per session (tests/conftest.py); every case
    works on a copy."""
    return audited_tiny_store


@pytest.fixture
def work(base_store, tmp_path):
    """A copy of the base store inside a sandbox directory, with a sentinel tree beside it."""
    sandbox = tmp_path / "sandbox"
    outside = sandbox / "outside"
    outside.mkdir(parents=True)
    (outside / "keep.json").write_text('{"a": 1}')
    (outside / "secret.json").write_text('{"secret": "do not read me"}')
    root = sandbox / "exp"
    shutil.copytree(base_store, root, ignore=shutil.ignore_patterns("locks"))
    before_out = tree_digest(outside)
    before_units = unit_digests(root)
    yield Work(root, outside)
    # Whatever the case did: nothing outside the run directory changed.
    assert tree_digest(outside) == before_out, "a file outside the output directory changed"
    assert set(os.listdir(sandbox)) <= {
        "exp",
        "outside",
        "payload-ran",
        "evil-model",
        "table.parquet",
        "x",
        "recipe.yaml",
    }
    del before_units


class Work:
    def __init__(self, root: Path, outside: Path):
        self.root, self.outside = root, outside
        self.store = RunStore(root)
        self.sandbox = root.parent

    def manifest(self) -> dict:
        return json.loads((self.root / "manifest.json").read_text())

    def write_manifest(self, manifest: dict, *, redigest: bool) -> None:
        if redigest:
            manifest["content_digest"] = content_digest(manifest)
        (self.root / "manifest.json").write_text(json.dumps(manifest))

    def unit(self, run: int = 0, step: int | None = None, quantizer: str = "fp32") -> Path:
        step = step if step is not None else self.store.checkpoints(run)[-1]
        return self.store.unit_path(run, step, quantizer)


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def unit_digests(root: Path) -> dict[str, str]:
    return tree_digest(root / "scores") if (root / "scores").is_dir() else {}


def refused(code: int, err: str, *fragments: str) -> None:
    """Exit code 2, one line on stderr starting with 'error:', no traceback, naming every fragment."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2, f"exit code {code}, stderr: {err}"
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    print(lines[0])  # `pytest -rP` lists every case's message
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in: {lines[0]}"


def report_json(root: Path) -> dict:
    return json.loads((root / "report" / "report.json").read_text())


def grid_numbers(report: dict) -> dict:
    return {
        r["quantizer"]: (r["utility"]["val_loss"], r["r_q"]["mean"], (r.get("best_attack_by_auroc") or {}).get("value"))
        for r in report["grid"]
    }


class Payload:
    """Unpickling this creates a file: the proof that a pickle was (or was not) loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


# ------------------------------------------------------------------------------------------ manifest


def test_missing_manifest_is_refused_with_the_fix(work):
    (work.root / "manifest.json").unlink()
    refused(*run_cli(["report", str(work.root)])[::2], "manifest.json", "llmaudit finetune")


def test_corrupt_manifest_json_names_the_file(work):
    (work.root / "manifest.json").write_text("{not json")
    refused(*run_cli(["status", str(work.root)])[::2], str(work.root / "manifest.json"), "not valid JSON")


def test_manifest_missing_a_key(work):
    manifest = work.manifest()
    del manifest["membership"]
    work.write_manifest(manifest, redigest=False)
    refused(*run_cli(["score", str(work.root)])[::2], "manifest.json", "lacks the key", "membership")


def test_edited_pool_size_is_detected_by_the_digest(work):
    manifest = work.manifest()
    manifest["membership"]["pool_size"] += 100
    work.write_manifest(manifest, redigest=False)
    refused(*run_cli(["report", str(work.root)])[::2], "modified after llmaudit wrote it")


def test_edited_pool_size_with_a_forged_digest_contradicts_the_masks(work):
    manifest = work.manifest()
    manifest["membership"]["pool_size"] += 100
    work.write_manifest(manifest, redigest=True)
    refused(*run_cli(["report", str(work.root)])[::2], "membership contradicts itself", "pool_size")


def test_flipped_membership_with_a_forged_manifest_is_caught_by_the_loss_tables(work):
    manifest = work.manifest()
    mask = list(manifest["membership"]["masks"][0])
    one, zero = mask.index("1"), mask.index("0")
    mask[one], mask[zero] = "0", "1"  # same count: every self-check of the manifest still passes
    manifest["membership"]["masks"][0] = "".join(mask)
    work.write_manifest(manifest, redigest=True)
    code, _, err = run_cli(["report", str(work.root)])
    refused(code, err, "inconsistent", "member flags contradict")


def test_config_edited_apart_from_the_identity(work):
    manifest = work.manifest()
    manifest["config"]["data"]["pool_size"] = 999
    work.write_manifest(manifest, redigest=True)
    refused(*run_cli(["report", str(work.root)])[::2], "no longer matches the experiment's identity")


def test_trust_remote_code_is_never_taken_from_a_run_directory(work):
    """A manifest that points to a model shipping code (auto_map) and allows it: the code never runs."""
    evil = work.sandbox / "evil-model"
    evil.mkdir()
    marker = work.sandbox / "payload-ran"
    (evil / "config.json").write_text(
        json.dumps(
            {
                "model_type": "evil",
                "auto_map": {
                    "AutoConfig": "evil.EvilConfig",
                    "AutoModelForCausalLM": "evil.EvilModel",
                    "AutoTokenizer": ["evil.EvilTokenizer", None],
                },
            }
        )
    )
    (evil / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]}})
    )
    (evil / "evil.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('pwned')\n")
    manifest = work.manifest()
    manifest["config"]["model"].update(name=str(evil), trust_remote_code=True)
    manifest["identity"]["model"]["name"] = str(evil)
    manifest["identity_hash"] = config_from_dict(manifest["config"]).identity_hash()
    work.write_manifest(manifest, redigest=True)
    code, _, err = run_cli(["score", str(work.root), "score.quantizers=[uniform-3]", "--no-progress"])
    refused(code, err, "--trust-remote-code")
    assert not marker.exists(), "code from the run directory's model ran"


def test_experiment_name_that_climbs_out_is_refused(work):
    refused(*run_cli(["finetune", "demo-cpu", "name=../x"])[::2], "name", "directory name")
    assert not (work.sandbox.parent / "x").exists()


def test_absolute_experiment_name_is_refused(work, tmp_path):
    target = tmp_path / "elsewhere"
    refused(*run_cli(["finetune", "demo-cpu", f"name={target}"])[::2], "name")
    assert not target.exists()


def test_quantizer_name_that_is_a_path_in_the_manifest(work):
    manifest = work.manifest()
    manifest["quantizers"].append("../../outside/secret")
    work.write_manifest(manifest, redigest=True)
    code, out, err = run_cli(["report", str(work.root)])
    refused(code, err, "not allowed")
    assert "do not read me" not in out + err


def test_quantizer_name_that_is_a_path_in_a_loss_table(work):
    table = pq.read_table(work.unit()).to_pandas()
    table["quantizer"] = "../outside/secret"
    path = work.sandbox / "table.parquet"
    table.to_parquet(path)
    refused(*run_cli(["attack", str(path), "--out", str(work.root / "a.json")])[::2], str(path), "not allowed")


# ------------------------------------------------------------------------------------------ runs and checkpoints


def test_deleted_final_checkpoint_is_reported_never_replaced_by_an_earlier_one(work):
    steps = work.store.checkpoints(0)
    shutil.rmtree(work.store.checkpoint_dir(0, steps[-1]))
    code, out, _ = run_cli(["status", str(work.root)])
    assert code == 0 and "problem:" in out and f"step {steps[-1]} of run 0 is missing" in out and "incomplete" in out
    refused(*run_cli(["report", str(work.root)])[::2], "is missing", "llmaudit finetune")
    before = grid_numbers(report_json(work.root))
    # The repair the message names: retraining is deterministic, so every earlier result stands.
    assert (
        run_cli(
            [
                "finetune",
                "--out",
                str(work.root),
                "demo-cpu",
                *TINY_OVERRIDES,
                f"output_dir={work.root}",
                "--no-progress",
            ]
        )[0]
        == 0
    )
    assert work.store.checkpoints(0) == steps
    code, _, err = run_cli(["report", str(work.root)])
    assert code == 0, err
    assert grid_numbers(report_json(work.root)) == before


def test_corrupt_adapter_is_refused_when_its_unit_is_scored(work):
    unit = work.unit(1)
    unit.unlink()
    kept = unit_digests(work.root)
    adapter = work.store.checkpoint_dir(1, work.store.checkpoints(1)[-1]) / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])
    code, _, err = run_cli(["score", str(work.root), "--no-progress"])
    refused(code, err, str(adapter.parent), "sha256")
    assert unit_digests(work.root).items() >= kept.items()  # every finished unit is kept


def test_pickled_adapter_is_never_loaded(work):
    marker = work.sandbox / "payload-ran"
    directory = work.store.checkpoint_dir(2, work.store.checkpoints(2)[-1])
    (directory / "adapter_model.safetensors").unlink()
    with open(directory / "adapter_model.bin", "wb") as handle:
        pickle.dump(Payload(marker), handle)
    work.unit(2).unlink()
    code, _, err = run_cli(["score", str(work.root), "--no-progress"])
    refused(code, err, "pickled", str(directory))
    assert not marker.exists()


def test_pickled_trainer_state_is_never_loaded(work):
    """An interrupted run whose newest checkpoint carries a pickle payload instead of the safetensors state."""
    marker = work.sandbox / "payload-ran"
    steps = work.store.checkpoints(0)
    shutil.rmtree(work.store.checkpoint_dir(0, steps[-1]))
    work.store.run_done_path(0).unlink()
    newest = work.store.checkpoint_dir(0, steps[-2] if len(steps) > 1 else steps[0])
    for name in ("trainer_state.safetensors", "trainer_state.json"):
        (newest / name).unlink(missing_ok=True)
    with open(newest / "trainer_state.pt", "wb") as handle:
        pickle.dump({"step": 1, "optimizer": Payload(marker)}, handle)
    code, _, err = run_cli(["finetune", "demo-cpu", *TINY_OVERRIDES, f"output_dir={work.root}", "--no-progress"])
    refused(code, err, "trainer_state.pt", "pickle")
    assert not marker.exists()


def test_corrupt_done_record_names_the_file(work):
    work.store.run_done_path(1).write_text("[1, 2")
    code, out, err = run_cli(["report", str(work.root)])
    refused(code, err, "DONE.json")


# ------------------------------------------------------------------------------------------ data files


def test_corrupt_data_line_names_file_and_line(work):
    path = work.root / "data" / "pool.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = "{broken"
    path.write_text("\n".join(lines) + "\n")
    refused(*run_cli(["report", str(work.root)])[::2], "pool.jsonl:4")


def test_edited_record_text_changes_the_fingerprint(work):
    path = work.root / "data" / "val.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["output"] += " (edited)"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    refused(*run_cli(["report", str(work.root)])[::2], "fingerprint")


def test_corrupt_quantizer_record_names_the_file(work):
    path = work.root / "scores" / "quantizers" / "fp32.json"
    path.write_text("{")
    refused(*run_cli(["report", str(work.root)])[::2], str(path))


# ------------------------------------------------------------------------------------------ loss tables


def test_nan_inside_token_losses_is_refused_then_repaired(work):
    path = work.unit(1, quantizer="uniform-4")
    table = pq.read_table(path).to_pandas()
    tl = list(table.at[0, "token_losses"])
    tl[0] = float("nan")
    table.at[0, "token_losses"] = tl
    table.to_parquet(path)
    truth = grid_numbers(report_json(work.root))
    refused(*run_cli(["report", str(work.root)])[::2], str(path), "--deep-verify")
    code, out, err = run_cli(["score", str(work.root), "--deep-verify", "--no-progress"])
    assert code == 0, err
    assert "moved to" in out and "scored 1 unit(s)" in out
    assert len(list((work.root / "scores" / "quarantine").rglob("*.invalid"))) == 1  # kept, not deleted
    assert run_cli(["report", str(work.root)])[0] == 0
    assert grid_numbers(report_json(work.root)) == truth


def test_truncated_unit_is_not_done_forever(work):
    path = work.unit(2, quantizer="sign")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    code, out, _ = run_cli(["status", str(work.root)])
    assert code == 0 and "1 invalid" in out and "incomplete" in out
    code, out, err = run_cli(["score", str(work.root), "--no-progress"])
    assert code == 0 and "scored 1 unit(s)" in out, err
    assert not run_status(work.root)["score"]["invalid"]


def test_unit_copied_from_another_checkpoint_is_invalid(work):
    steps = work.store.checkpoints(0)
    shutil.copy(work.unit(0, steps[0]), work.unit(0, steps[-1]))
    code, out, _ = run_cli(["status", str(work.root)])
    assert "invalid" in out and ("samples" in out or "do not match its path" in out)
    refused(*run_cli(["report", str(work.root)])[::2], str(work.unit(0, steps[-1])))


def test_unit_with_flipped_member_flags_is_invalid(work):
    path = work.unit(0, quantizer="sign")
    table = pq.read_table(path).to_pandas()
    pool = table["split"] == "pool"
    table.loc[pool, "member"] = ~table.loc[pool, "member"]
    table.to_parquet(path)
    refused(*run_cli(["report", str(work.root)])[::2], "member flags contradict")


def test_unit_missing_samples_is_invalid(work):
    path = work.unit(1)
    table = pq.read_table(path).to_pandas().iloc[:-2]
    table.to_parquet(path)
    refused(*run_cli(["report", str(work.root)])[::2], "expected the")


def test_loss_table_file_that_is_not_parquet(work):
    path = work.sandbox / "table.parquet"
    path.write_text("run,checkpoint\n1,2\n")
    refused(*run_cli(["indicator", str(path), "--out", str(work.root / "i.json")])[::2], str(path), "parquet")


def test_missing_loss_table(work):
    path = work.sandbox / "x" / "missing.parquet"
    refused(*run_cli(["indicator", str(path), "--out", str(work.root / "i.json")])[::2], str(path), "does not exist")


def test_loss_table_with_a_nonfinite_loss(work):
    table = pq.read_table(work.unit()).to_pandas()
    table.loc[0, "loss"] = np.inf
    path = work.sandbox / "table.parquet"
    table.to_parquet(path)
    refused(*run_cli(["attack", str(path), "--out", str(work.root / "a.json")])[::2], str(path))


# ------------------------------------------------------------------------------------------ add-only state


def test_scoring_a_subset_never_drops_quantizers_from_the_report(work):
    before = set(report_json(work.root)["quantizers"])
    assert before == set(QUANTIZERS)
    code, out, err = run_cli(["score", str(work.root), "score.quantizers=[fp32]", "--no-progress"])
    assert code == 0, err
    assert work.store.scored_quantizers() == QUANTIZERS
    assert run_cli(["report", str(work.root)])[0] == 0
    assert set(report_json(work.root)["quantizers"]) == before
    # Explicit removal from a report is the user's choice, and says so.
    assert run_cli(["report", str(work.root), "--quantizers", "fp32,sign"])[0] == 0
    assert report_json(work.root)["quantizers"] == ["fp32", "sign"]


# ------------------------------------------------------------------------------------------ bad requests


def test_missing_recipe_file(work):
    refused(*run_cli(["finetune", str(work.sandbox / "x" / "nope.yaml")])[::2], "nope.yaml", "not found")


def test_invalid_recipe_yaml_names_the_file(work):
    path = work.sandbox / "recipe.yaml"
    path.write_text("train: [unclosed\n")
    refused(*run_cli(["finetune", str(path)])[::2], str(path), "not valid YAML")


def test_unsupported_bits_are_rejected_before_any_work(work):
    before = unit_digests(work.root)
    refused(*run_cli(["score", str(work.root), "score.quantizers=[bnb-3]"])[::2], "bnb-3", "allowed")
    assert unit_digests(work.root) == before


def test_gpu_backend_without_a_gpu(work):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    refused(*run_cli(["score", str(work.root), "score.device=cuda"])[::2], "cuda", "device=auto or cpu")


def test_group_size_that_does_not_divide_a_layer(work):
    refused(
        *run_cli(
            [
                "score",
                str(work.root),
                "score.quantizers=[hqq-4]",
                "score.quantizer_options={hqq-4: {group_size: 24}}",
                "--no-progress",
            ]
        )[::2],
        "group_size",
    )


def test_bad_thread_count_in_the_environment(work):
    refused(*run_cli(["status", str(work.root)], env={"LLMAUDIT_THREADS": "many"})[::2], "LLMAUDIT_THREADS")


def test_debug_shows_the_traceback(work):
    (work.root / "manifest.json").write_text("{")
    with pytest.raises(Exception, match="not valid JSON"):
        run_cli(["status", str(work.root)], env={"LLMAUDIT_DEBUG": "1"})


# ------------------------------------------------------------------------------------------ rendering


def test_report_markdown_escapes_text_from_the_data(work):
    result = json.loads((work.root / "results" / "result.json").read_text())
    hostile = "<script>alert(1)</script> | **x** [link](http://e.vil) `tick`"
    result["experiment"]["model"] = hostile
    result["experiment"]["data"]["fingerprint"] = hostile
    result["attacks"]["quantizers"]["fp32"]["skipped"]["zlib"] = hostile  # shown in prose, not in a code span
    report = build_report(result)
    report["plots"] = {}
    md = render_markdown(report)
    # What a reader sees: the Markdown rendered by a CommonMark parser holds no tag and no link from the data.
    from markdown_it import MarkdownIt

    rendered = MarkdownIt("commonmark", {"html": True}).render(md)
    assert "<script>" not in rendered and "&lt;script&gt;" in rendered
    assert 'href="http://e.vil"' not in rendered
    assert "\\<script\\>" in md  # in prose it is backslash-escaped, in code spans it is literal text
    from llmaudit.report.html import render_html

    page = render_html(report, {})
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_report_numbers_match_report_json(work):
    """Every grid number the Markdown and HTML show is the one report.json holds."""
    from llmaudit.common.formatting import fmt_num

    report = report_json(work.root)
    md = (work.root / "report" / "report.md").read_text()
    page = (work.root / "report" / "report.html").read_text()
    for row in report["grid"]:
        for value in (row["utility"]["val_loss"], row["r_q"]["mean"]):
            if value is not None:
                text = fmt_num(value, 4 if value == row["r_q"]["mean"] else 3)
                assert text in md and text in page, (row["quantizer"], text)
        for name, attack in row["attacks"].items():
            if attack["auroc"] is not None:
                assert fmt_num(attack["auroc"]) in md, (row["quantizer"], name)


# ------------------------------------------------------------------------------------------ concurrency


def test_two_concurrent_score_processes_score_every_unit_exactly_once(work):
    """Both processes score new quantizers on one store at once; the work log counts who scored what.
    HQQ units take long enough (about a second each) that both processes are at work together."""
    import subprocess

    hqq = ["hqq-2", "hqq-3", "hqq-4", "hqq-8"]
    options = "{" + ", ".join(f"{q}: {{group_size: 32}}" for q in hqq) + "}"
    args = [
        "score",
        str(work.root),
        f"score.quantizers=[{','.join(hqq)}]",
        f"score.quantizer_options={options}",
        "--no-progress",
    ]
    expected = {(r, s, q) for r in range(3) for s in work.store.checkpoints(r) for q in hqq}
    env = dict(os.environ, LLMAUDIT_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "llmaudit.cli", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    log = [w for w in read_work(work.root / "scores" / "worklog.jsonl") if w["quantizer"] in hqq]
    done = [(w["run"], w["step"], w["quantizer"]) for w in log]
    assert sorted(done) == sorted(expected), "a unit was scored twice or not at all"
    assert len({w["pid"] for w in log}) == 2, f"one process did all the work: {outputs}"
    status = run_status(work.root)
    assert not status["score"]["missing"] and not status["score"]["invalid"]
    assert work.store.scored_quantizers() == QUANTIZERS + hqq


def run_status(root: Path) -> dict:
    code, out, err = run_cli(["status", str(root), "--json"])
    assert code == 0, err
    return json.loads(out)


def test_a_crashed_holder_does_not_block_a_unit(work):
    """A lock left by a dead process is free: the OS released it with the process."""
    import subprocess

    path = work.unit(1, quantizer="sign")
    path.unlink()
    lock = work.store.lock_path("units", *path.relative_to(work.root / "scores").with_suffix("").parts)
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from filelock import FileLock; l = FileLock({str(lock)!r}); l.acquire(); import os; os._exit(9)",
        ],
        check=False,
    )
    assert holder.returncode == 9 and lock.exists()
    code, out, err = run_cli(["score", str(work.root), "--no-progress"])
    assert code == 0 and "scored 1 unit(s)" in out, err
