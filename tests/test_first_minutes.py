"""A new user's first ten minutes: help shows the brackets to type, `--version` answers, `score` without a target
refuses instead of guessing, progress bars stay off logs that are not terminals, and output files honour the
umask (a team on a shared cluster can read them)."""

from __future__ import annotations

import io
import os
import stat

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
