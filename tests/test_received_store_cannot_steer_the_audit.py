"""Received run stores: a store cannot steer what is read, run or judged; the release gate verifies;
escape codes from data never reach the terminal; every structure a store holds is parsed by a schema; two reports
on one store leave a whole set.

Every case works on a copy of one tiny real store (tests/conftest.py: `audited_tiny_store`) inside a sandbox with
files no command may open (`outside/`: an audit hook records every open below it), and asserts the outcome: exit 2
with one line naming the file or key and the fix (or the gate's 3), never 0 where the input is at fault, never 1.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from llmaudit.planning.targets import config_from_run_dir
from tests import test_received_store_links_bounds_and_disk as round_two
from tests.conftest import run_cli
from tests.test_received_store_links_bounds_and_disk import Received
from tests.test_untrusted_inputs import Payload, refused

received = round_two.received  # the fixture: a copy of the tiny store beside files no command may open

HOSTILE_NAME = "x\x1b]0;TITLE\x07\x1b]8;;mailto:x@e.vil\x07link\x1b]8;;\x07\x1b[2K\x1b[1A\rall units verified"
"""OSC 0 (window title), OSC 8 (hyperlink), CSI (erase line, cursor up) and CR (paint over the line)."""


TERMINAL_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""What a terminal obeys instead of showing (line breaks aside)."""


def no_controls(text: str) -> bool:
    return TERMINAL_CONTROLS.search(text) is None


def gate(received: Received, quantizer: str, *extra: str) -> tuple[int, str, str]:
    return received.cli(["report", str(received.root), "--gate", "--release", quantizer, *extra])


# ------------------------------------------------------------------------------------------ what a store decides


def test_a_store_never_names_the_calibration_file_a_command_reads(received):
    """A forged manifest (digest recomputed) adds a quantizer calibrated on a file outside the store: `score` does
    not open it; it asks the runner for the file."""
    elsewhere = received.sandbox / "elsewhere"
    elsewhere.mkdir()
    corpus = elsewhere / "corpus.txt"
    corpus.write_text("secret calibration text\n\nmore of it\n")
    manifest = received.manifest()
    score = manifest["config"]["score"]
    score["quantizers"].append("gptq-4")
    score["quantizer_options"] = {"gptq-4": {"group_size": 32, "calibration_samples": 4}}
    score.update(calibration_source="file", calibration_file=str(corpus))
    received.write_manifest(manifest)
    with round_two.nothing_opened_in(elsewhere):
        code, _, err = run_cli(["score", str(received.root), "--no-progress"])
    refused(code, err, "score.calibration_file=PATH on the command line")
    assert not received.store.quantizer_info_path("gptq-4").exists()
    given = config_from_run_dir(received.root, [f"score.calibration_file={received.sandbox / 'mine.txt'}"])
    assert given.score.calibration_file == str(received.sandbox / "mine.txt")  # the runner names it


RUNNER_VALUES = {
    "model.trust_remote_code": True,
    "train.device": "cuda",
    "train.token_budget": 64,
    "train.processes": 256,
    "score.device": "cuda",
    "score.token_budget": 64,
    "score.head_chunk": 1,
    "score.cpu_workers": 1024,
    "score.processes": 256,
    "score.calibration_file": "/etc/passwd",
    "report.processes": 256,
}


def test_every_runner_setting_is_probed():
    from llmaudit.config import RUNNER_SETTINGS

    assert sorted(RUNNER_VALUES) == sorted(f"{s}.{k}" for s, keys in RUNNER_SETTINGS.items() for k in keys)


@pytest.mark.parametrize("key", sorted(RUNNER_VALUES))
def test_how_much_runs_and_what_is_read_are_the_runners(received, key):
    """Processes, threads, devices, batch sizes and the calibration file of a manifest (digest recomputed) are never
    taken from it: the defaults stand unless the command line sets them."""
    section, name = key.split(".")
    manifest = received.manifest()
    manifest["config"][section][name] = RUNNER_VALUES[key]
    received.write_manifest(manifest)
    cfg = config_from_run_dir(received.root, [])
    default = type(getattr(cfg, section)).model_fields[name].default
    assert getattr(getattr(cfg, section), name) == default
    if key == "score.processes":
        assert config_from_run_dir(received.root, ["score.processes=2"]).score.processes == 2


def test_pickled_weights_in_a_store_are_refused_even_beside_safetensors(received):
    """A checkpoint that holds adapter_model.bin beside its safetensors weights is refused by every command; the
    pickle never runs."""
    marker = received.sandbox / "payload-ran"
    directory = received.final_dir(2)
    with open(directory / "adapter_model.bin", "wb") as handle:
        pickle.dump(Payload(marker), handle)
    received.unit(2).unlink()
    refused(*received.cli(["score", str(received.root), "--no-progress"])[::2], str(directory), "adapter_model.bin")
    refused(*received.cli(["report", str(received.root)])[::2], "adapter_model.bin", "never loads a pickle")
    assert not marker.exists()


def test_an_edited_limit_is_caught_by_the_manifests_digest(received):
    """What is judged is recorded with the store and covered by its digest: a limit raised to clear everything is
    refused, as an edited pool size is."""
    manifest = received.manifest()
    manifest["config"]["report"]["max_tpr_at_1pct_fpr"] = 1.0
    (received.root / "manifest.json").write_text(json.dumps(manifest))
    refused(*gate(received, "sign")[::2], "modified after llmaudit wrote it")


# ------------------------------------------------------------------------------------------ the release gate


def _keep_time(path, write) -> None:
    stat = path.stat()
    write()
    os.utime(path, (stat.st_atime, stat.st_mtime))


def test_an_edited_report_never_clears_the_gate(received):
    """report.json edited to PASS (and still newer than every loss table): the gate analyses the loss tables again
    and blocks; `--release` alone refuses the report that is not its analysis's."""
    path = received.root / "report" / "report.json"
    report = json.loads(path.read_text())
    assert report["checklist"]["per_quantizer"]["sign"]["overall"] != "PASS"
    report["checklist"]["per_quantizer"]["sign"]["overall"] = "PASS"
    report["recommendation"].update(quantizer="sign", overall="PASS", cleared_for_release=True)
    path.write_text(json.dumps(report))
    code, _, err = gate(received, "sign")
    assert code == 3 and "BLOCKED" in err, err
    path.write_text(json.dumps(report))
    refused(*received.cli(["report", str(received.root), "--release", "sign"])[::2], str(path), "disagrees")


def test_a_replaced_loss_table_with_its_time_put_back_never_clears_the_gate(received):
    """A loss table replaced by garbage, its modification time put back: report.json still looks up to date, but
    neither the gate nor `--release` answers from it."""
    report = received.root / "report" / "report.json"
    data = json.loads(report.read_text())
    data["checklist"]["per_quantizer"]["sign"]["overall"] = "PASS"
    _keep_time(report, lambda: report.write_text(json.dumps(data)))
    unit = received.unit(1, "sign")
    _keep_time(unit, lambda: unit.write_bytes(b"PAR1 garbage" * 100))
    code, _, err = gate(received, "sign")
    assert code == 2 and str(unit) in err, err
    code, _, err = received.cli(["report", str(received.root), "--release", "sign"])
    refused(code, err, str(unit))


def test_the_card_of_a_verified_report_is_written_from_it(received):
    code, out, err = received.cli(["report", str(received.root), "--release", "uniform-4"])
    assert code == 0 and "the report is up to date" in out, err
    assert "uniform-4" in (received.root / "report" / "model_card.md").read_text()


# ------------------------------------------------------------------------------------------ the terminal


def test_status_shows_a_hostile_file_name_escaped(received):
    (received.root / "results" / f"{HOSTILE_NAME}.json").write_text("{}")
    code, out, err = received.cli(["status", str(received.root)])
    assert code == 0, err
    assert no_controls(out + err), repr(out)
    assert "\\x1b]0;TITLE\\x07" in out and "\\rall units verified" in out


def test_the_refusal_line_shows_a_hostile_file_name_escaped(received):
    (received.root / "data" / HOSTILE_NAME).symlink_to(received.outside / "keep.json")
    code, out, err = received.cli(["report", str(received.root)])
    refused(code, err, "is a symbolic link", "\\x1b]8;;mailto:x@e.vil\\x07")
    assert no_controls(err) and "\x1b" not in out + err


# ------------------------------------------------------------------------------------------ schemas


REPORT_EDITS = {
    "a grid row the checklist lacks": (
        lambda r: (r["grid"].append(dict(r["grid"][0], quantizer="hqq-4")), r["quantizers"].append("hqq-4")),
        "grid row hqq-4 has no checklist.per_quantizer.hqq-4",
    ),
    "criteria without attack_tpr": (
        lambda r: [
            q.update(criteria=[c for c in q["criteria"] if c["id"] != "attack_tpr"])
            for q in r["checklist"]["per_quantizer"].values()
        ],
        "criteria lacks attack_tpr",
    ),
    "a decision rule missing fields": (lambda r: r.update(decision_rule={"limit": 0.05}), "decision_rule.fpr"),
    "a rule of the wrong kind": (lambda r: r.update(decision_rule=[1, 2]), "decision_rule"),
    "a checklist of the wrong kind": (lambda r: r["checklist"].update(per_quantizer=3), "checklist.per_quantizer"),
    "a recommendation of no row": (lambda r: r["recommendation"].update(quantizer="hqq-9"), "recommendation.quantizer"),
    "Infinity": (lambda r: r["grid"][0]["r_q"].update(mean=float("inf")), "NaN or Infinity"),
}


@pytest.mark.parametrize("case", sorted(REPORT_EDITS))
def test_a_malformed_report_json_is_refused_naming_the_field(received, case):
    edit, fragment = REPORT_EDITS[case]
    path = received.root / "report" / "report.json"
    report = json.loads(path.read_text())
    edit(report)
    path.write_text(json.dumps(report))
    refused(*received.cli(["report", str(received.root), "--release", "fp32"])[::2], str(path), fragment)


IMPORTED = {
    "empty": ({}, "imported.runs is missing"),
    "a count": (3, "imported"),
    "a step written as text": (
        {"runs": [{"checkpoints": [{"step": "1e3", "path": "/x", "files": {}}]}] * 3},
        "imported.runs.0.checkpoints.0.step",
    ),
    "a quantized file name that climbs": (
        {
            "runs": [{"checkpoints": [{"step": 4, "path": "/x", "files": {}}]}] * 3,
            "quantized": [
                {
                    "run": 0,
                    "step": 4,
                    "quantizer": "gguf-q4_k_m",
                    "path": "/x/m.gguf",
                    "kind": "gguf",
                    "files": {"../../../x": "0" * 64},
                }
            ],
        },
        "imported.quantized.0.files",
    ),
}


@pytest.mark.parametrize("case", sorted(IMPORTED))
@pytest.mark.parametrize("command", ["status", "report"])
def test_a_malformed_imported_block_is_refused_naming_the_field(received, case, command):
    block, fragment = IMPORTED[case]
    manifest = received.manifest()
    manifest["imported"] = block
    received.write_manifest(manifest)
    refused(*received.cli([command, str(received.root)])[::2], str(received.root / "manifest.json"), fragment)


@pytest.mark.parametrize(
    "marker, fragment",
    [([1, 2], "RUNNING"), ({"host": "HOST", "pid": 1e20}, "pid"), ({"host": "HOST", "pid": "12"}, "pid")],
)
def test_a_malformed_running_marker_is_refused_naming_the_field(received, marker, fragment):
    unit = received.unit(0, "sign")
    unit.unlink()
    path = unit.with_name("sign.RUNNING.json")
    if isinstance(marker, dict):
        marker = dict(marker, host=socket.gethostname())
    path.write_text(json.dumps(marker))
    refused(*received.cli(["status", str(received.root)])[::2], str(path), fragment)


def test_a_done_record_with_a_step_written_as_text_is_refused(received):
    path = received.store.run_done_path(1)
    record = json.loads(path.read_text())
    record["steps"][-1] = "1e3"
    path.write_text(json.dumps(record))
    refused(*received.cli(["report", str(received.root)])[::2], str(path), "steps")


@pytest.mark.parametrize(
    "record, fragment",
    [([1, 2], "(top level)"), ({"name": "sign", "effective_bits": "many"}, "effective_bits")],
)
def test_a_malformed_quantizer_record_is_refused_naming_the_field(received, record, fragment):
    path = received.store.quantizer_info_path("sign")
    path.write_text(json.dumps(record))
    refused(*received.cli(["report", str(received.root)])[::2], str(path), fragment)


# ------------------------------------------------------------------------------------------ two reports at once

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import llmaudit.common.io as io
    barrier, replace, write = Path(sys.argv[1]), io.replace_directory, io._write_new_file
    state = {"first": False}
    def replace_directory(path, files):
        # both processes reach the write of the report set (at most 120 s apart); the first then writes its files
        # slowly, the second starts a moment later and writes fast: without a lock their writes overlap
        (barrier / str(os.getpid())).touch()
        state["first"] = len(list(barrier.iterdir())) == 1
        deadline = time.time() + 120
        while len(list(barrier.iterdir())) < 2 and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(0 if state["first"] else 1.0)
        return replace(path, files)
    def slow_write(target, data, *, shown):
        write(target, data, shown=shown)
        time.sleep(0.2 if state["first"] else 0)
    io.replace_directory, io._write_new_file = replace_directory, slow_write
    from llmaudit import cli
    sys.argv = ["llmaudit", "report", sys.argv[2]]
    cli.main()
    """
)


@pytest.mark.slow  # two report processes (the analysis and the figures each): about a minute on a 2-core CPU
def test_two_reports_at_once_leave_one_whole_set(received):
    """Two `llmaudit report` processes on one store, their writes of the report set made to overlap: each leaves a
    whole set, every plot report.json lists is there, and no temporary directory is left behind."""
    barrier = received.sandbox / "barrier"
    barrier.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), LLMAUDIT_THREADS="1")
    command = [sys.executable, "-c", DRIVER, str(barrier), str(received.root)]
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert len(list(barrier.iterdir())) == 2  # both reached the write
    out = received.root / "report"
    report = json.loads((out / "report.json").read_text())
    assert report["plots"] and all((out / p).is_file() for p in report["plots"].values())
    assert {"report.md", "report.html", "model_card.md"} <= {p.name for p in out.iterdir()}
    assert not [p for p in received.root.iterdir() if p.name.endswith(".tmp")]
    assert run_cli(["report", str(received.root), "--release", "fp32"])[0] == 0  # the set verifies
