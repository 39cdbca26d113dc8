"""A new user's first ten minutes: help shows the brackets to type, `--version` answers, `--help` and argument
errors answer without importing torch or the analysis, `score` without a target refuses instead of guessing,
progress bars stay off logs that are not terminals, and output files honour the umask (a team on a shared cluster
can read them)."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys

import pytest

from llmaudit.commands import base as command_app
from llmaudit.common.io import atomic_write_text, replace_directory
from tests.conftest import run_cli


@pytest.mark.parametrize(
    "command, usage",
    [("audit", "[RECIPE]"), ("finetune", "[RECIPE]"), ("plan", "[RECIPE | RUN_DIR]")],
)
def test_help_keeps_the_square_brackets(command, usage):
    code, out, _ = run_cli([command, "--help"])
    assert code == 0
    flat = " ".join(out.split())
    assert f"{usage} [key=value ...]" in flat and "score.quantizers='[fp32,hqq-4]'" in flat


def test_version():
    from llmaudit import __version__

    code, out, _ = run_cli(["--version"])
    assert code == 0 and out.strip() == f"llmaudit {__version__}"


HEAVY = ("torch", "transformers", "pandas", "scipy", "matplotlib", "sklearn", "llmaudit.report.models")
"""What the command line's start must not import: the libraries of the work and the report's pydantic models."""

EVERY_HELP = """
import json, sys
import typer.main
from llmaudit import cli
group = typer.main.get_command(cli.app)
calls = [["--help"], ["--version"], []] + [[name, "--help"] for name in group.commands]
calls += [["validate", name, "--help"] for name in group.commands["validate"].commands]
calls += [["attack"], ["nosuchcommand"], ["attack", "x.parquet", "--n-boot", "-1"]]
codes = []
for args in calls:
    sys.argv = ["llmaudit", *args]
    try:
        cli.main()
    except SystemExit as exc:
        codes.append(exc.code)
print(json.dumps({"calls": calls, "codes": codes, "loaded": [m for m in HEAVY if m in sys.modules]}))
"""


def run_python(script: str, **env: str) -> str:
    """The last line `script` prints in a fresh interpreter (this one's path, stderr a pipe: not a terminal)."""
    environ = {k: v for k, v in os.environ.items() if k != "LLMAUDIT_THREADS"}
    environ.update(PYTHONPATH=os.pathsep.join(sys.path), **env)
    done = subprocess.run([sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{script}"], env=environ, capture_output=True,
                          text=True, timeout=300, check=True)  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def test_help_version_and_argument_errors_import_neither_torch_nor_the_analysis():
    """`llmaudit --help`, `--version`, every command's `--help` and a bad argument answer from the command
    definitions alone: the imports of the work are deferred to the command bodies that do it."""
    result = json.loads(run_python(EVERY_HELP))
    helps = [c for c in result["calls"] if c[-1:] in (["--help"], ["--version"])]
    assert len(helps) >= 18 and ["validate", "capacity", "--help"] in helps  # every command and subcommand
    codes = dict(zip(map(tuple, result["calls"]), result["codes"], strict=True))
    assert all(codes[tuple(c)] in (0, None) for c in helps), codes
    assert codes[()] == 2 and codes[("attack",)] == 2 and codes[("nosuchcommand",)] == 2  # usage errors
    assert codes[("attack", "x.parquet", "--n-boot", "-1")] == 2
    assert result["loaded"] == []


BAD_ARGUMENTS = """
import json, os, sys, tempfile
from llmaudit import cli
os.chdir(tempfile.mkdtemp())  # nothing may be written: a command that started its work would write here
calls = [
    ["score"], ["score", "--no-such-option"], ["score", "demo-cpu", "--shard", "abc"], ["score", "no-such-recipe"],
    ["score", "demo-cpu", "no.such.key=1"], ["finetune", "no-such-recipe"], ["finetune", "demo-cpu", "--shard", "3/2"],
    ["audit", "no-such-recipe"], ["audit", "no.such.key=1"], ["audit", "train.runs=abc"], ["plan", "no-such-recipe"],
    ["plan", "--jobs", "0"], ["plan", "--device", "nosuchdev"], ["submit"], ["submit", "no-such-stage"], ["submit", "all", "no-such-recipe"],
    ["report"], ["report", "no-such-dir"], ["status", "no-such-dir"], ["import", "x"], ["kld"], ["attack"],
]
result = []
for args in calls:
    sys.argv = ["llmaudit", *args]
    try:
        cli.main()
        code = None
    except SystemExit as exc:
        code = exc.code
    result.append([args, code, [m for m in HEAVY if m in sys.modules], os.listdir(".")])
print(json.dumps(result))
"""


def test_argument_errors_refuse_before_the_work_is_imported():
    """A missing target, an unknown option, a missing argument and a bad value (a recipe or run directory that is
    not there, an unknown key, a value of the wrong kind, a shard out of range, an unknown stage) exit with code 2,
    with neither torch nor transformers (nor the analysis) imported and nothing written."""
    result = json.loads(run_python(BAD_ARGUMENTS))
    assert len(result) == 22
    for args, code, loaded, written in result:
        assert code == 2, (args, code)
        assert loaded == [], (args, loaded)
        assert written == [], (args, written)


def test_the_deferred_imports_keep_the_settings_of_the_start():
    """With no torch at the start, $LLMAUDIT_THREADS still reaches torch, and transformers imported after the start
    (by a command) still shows no progress bars on a stderr that is not a terminal."""
    threads = "from llmaudit.commands.base import setup\nsetup()\nimport torch\nprint(torch.get_num_threads())"
    assert run_python(threads, LLMAUDIT_THREADS="3") == "3"
    bars = (
        "import sys\nfrom llmaudit.commands.base import setup\nsetup()\nbefore = 'transformers' in sys.modules\n"
        "from transformers.utils import logging\nprint(before, logging.is_progress_bar_enabled())"
    )
    assert run_python(bars) == "False False"


def test_score_without_a_target_refuses(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["score"])
    assert code == 2 and "llmaudit score needs a target" in err and len(err.strip().splitlines()) == 1
    assert os.listdir(tmp_path) == []


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_progress_frames_when_stderr_is_not_a_terminal(monkeypatch):
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr("sys.stderr", io.StringIO())
    try:
        assert command_app.progress(False) is False  # llmaudit's own bars (finetune, score, audit)
        enable_progress_bars()
        hf_logging.enable_progress_bar()
        command_app.setup()  # every command: the bars of huggingface_hub and transformers (downloads, weight loading)
        assert are_progress_bars_disabled() and not hf_logging.is_progress_bar_enabled()
        monkeypatch.setattr("sys.stderr", FakeTerminal())
        assert command_app.progress(False) is True and command_app.progress(True) is False
    finally:
        enable_progress_bars()
        hf_logging.enable_progress_bar()


@pytest.mark.parametrize(("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_output_files_honour_the_umask(umask, file_mode, dir_mode, tmp_path):
    old = os.umask(umask)
    try:
        path = atomic_write_text(tmp_path / "report.json", "{}")
        folder = replace_directory(tmp_path / "report", {"report.md": b"x", "plots/roc.png": b"y"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == file_mode
    assert stat.S_IMODE((folder / "plots" / "roc.png").stat().st_mode) == file_mode
    assert stat.S_IMODE(folder.stat().st_mode) == dir_mode
