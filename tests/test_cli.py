import json
import math
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from llmaudit.cli import app

from .conftest import TINY_OVERRIDES


def _run_cli(*args, cwd=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "llmaudit.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_audit_end_to_end_then_rerun_does_no_work(tmp_path):
    out = tmp_path / "exp"
    runner = CliRunner()
    res = runner.invoke(app, ["audit", "demo-cpu", *TINY_OVERRIDES, "--out", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report" / "report.json").read_text())
    grid = {row["quantizer"]: row for row in report["grid"]}
    assert set(grid) == {"fp32", "uniform-4", "sign"}
    for row in grid.values():
        assert math.isfinite(row["utility"]["val_loss"])
        assert row["r_q"]["n_runs"] == 3
        # (LiRA with 3 runs has at most one balanced reference for most samples: its skip is tested in test_attacks)
        assert "loss" in row["attacks"]
    assert grid["fp32"]["utility"]["relative_change"] == 0
    # sign without a scale wrecks a language model: the report must show the utility cost
    assert grid["sign"]["utility"]["relative_change"] > 0.1
    assert (out / "report" / "report.md").read_text().startswith("# llmaudit report")
    assert (out / "report" / "report.html").exists()
    n_units = len(list((out / "scores").rglob("*.parquet")))
    assert n_units == 1 + 3 * 2 * 3  # base + runs x checkpoints x quantizers

    res = runner.invoke(app, ["score", str(out), "--no-progress"])
    assert res.exit_code == 0 and "0 to do" in res.output
    # adding a quantizer to an existing experiment scores only the new units
    res = runner.invoke(app, ["score", str(out), "score.quantizers=[fp32,uniform-4,sign,uniform-2]", "--no-progress"])
    assert res.exit_code == 0 and "6 to do" in res.output, res.output

    # the loss tables are a public format: the indicator command reads them back
    res = runner.invoke(app, ["indicator", str(out / "scores"), "--out", str(tmp_path / "ind.json")])
    assert res.exit_code == 0, res.output
    ind = json.loads((tmp_path / "ind.json").read_text())
    assert set(ind["per_quantizer"]) == {"fp32", "uniform-4", "sign", "uniform-2"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["finetune", "demo-cpu", "train.epoch=3"], "train.epoch"),
        (["finetune", "demo-cpu", "data.source=local", "data.path=/no/such/file.jsonl"], "does not exist"),
        (["score", "demo-cpu", "score.quantizers=[fp32,int3]"], "unknown quantizer 'int3'"),
        (["score", "demo-cpu", "score.quantizers=[fp32,hqq-4]", "score.device=cuda"], "cuda"),
        (["report", "/no/such/run"], "no manifest.json"),
    ],
)
def test_bad_input_fails_fast_with_the_fix(args, message, tmp_path):
    res = _run_cli(*args, cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert message in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "llmaudit-out").exists() or "score" in args  # nothing half-made


def test_malformed_record_is_named(tmp_path):
    bad = tmp_path / "recs.jsonl"
    bad.write_text('{"input": "x", "output": "y", "task": "molecule_captioning"}\n{"input": 3}\n')
    res = _run_cli("finetune", "demo-cpu", "data.source=local", f"data.path={bad}", cwd=tmp_path)
    assert res.returncode == 2 and "recs.jsonl:2: malformed record" in res.stderr


def test_help_is_useful():
    res = CliRunner().invoke(app, ["--help"])
    for cmd in (
        "audit",
        "finetune",
        "score",
        "report",
        "indicator",
        "attack",
        "memorization",
        "validate",
        "quantizers",
    ):
        assert cmd in res.output
    res = CliRunner().invoke(app, ["finetune", "--help"])
    assert "--shard" in res.output and "key=value" in res.output


def test_third_party_import_notices_are_quiet_unless_asked(monkeypatch):
    """torchao / bitsandbytes / torch pytree notices about kernels llmaudit does not use are hidden by
    default and shown again with LLMAUDIT_LOG."""
    import logging

    from llmaudit.commands import base as cli

    levels = {name: logging.getLogger(name).level for name in cli.QUIET_LOGGERS}
    try:
        monkeypatch.delenv("LLMAUDIT_LOG", raising=False)
        cli.setup()
        assert all(logging.getLogger(name).level == logging.ERROR for name in cli.QUIET_LOGGERS)
        for name in cli.QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
        monkeypatch.setenv("LLMAUDIT_LOG", "WARNING")
        cli.setup()
        assert all(logging.getLogger(name).level == logging.NOTSET for name in cli.QUIET_LOGGERS)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def test_logging_set_up_by_an_in_process_command_follows_the_current_stderr(monkeypatch, capsys):
    """A command run in-process with stderr redirected (a test runner, a notebook) must not leave the root logger
    writing to that stream once it is closed: a later warning goes to the stderr of the moment."""
    import contextlib
    import io
    import logging

    from llmaudit.commands import base as cli

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    redirected = io.StringIO()
    with contextlib.redirect_stderr(redirected):
        cli.setup()
    redirected.close()
    logging.getLogger("llmaudit.test").warning("after the command")
    assert "WARNING llmaudit.test: after the command" in capsys.readouterr().err
