"""The built-in model is built once per cache, under a file lock: processes that need it together build it once,
and a build killed with SIGKILL leaves no temporary directory behind once the next build has run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from llmaudit.common.io import atomic_dir
from llmaudit.config import ModelConfig
from llmaudit.models import builtin

KILLED_BUILD = """
import sys, time
from llmaudit.common.io import atomic_dir
from llmaudit.config import ModelConfig
from llmaudit.models import builtin

def build(cfg, root):
    with atomic_dir(root) as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        print("building", flush=True)
        time.sleep(600)

builtin.build_builtin_model = build
builtin.builtin_dir(ModelConfig(), pretrain=True)
"""


@pytest.fixture
def fake_build(monkeypatch, tmp_path):
    """A cache in tmp_path, a build that takes a moment and counts itself, and a tokenizer that is not read."""
    monkeypatch.setenv("LLMAUDIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("transformers.PreTrainedTokenizerFast.from_pretrained", lambda path: path)
    builds = []

    def build(cfg, root):
        builds.append(root)
        with atomic_dir(root) as tmp:
            time.sleep(0.3)
            (tmp / "DONE").write_text(json.dumps({"version": "test"}))
        return root

    monkeypatch.setattr(builtin, "build_builtin_model", build)
    return builds


def test_processes_that_need_the_model_together_build_it_once(fake_build):
    roots = []
    threads = [
        threading.Thread(target=lambda: roots.append(builtin.builtin_dir(ModelConfig(), pretrain=True)[0]))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fake_build) == 1 and len(set(roots)) == 1 and (roots[0] / "DONE").exists()


def test_a_killed_build_leaves_no_temporary_directory(fake_build, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "building"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    parent = tmp_path / "cache" / "builtin"
    assert [p for p in parent.iterdir() if p.name.endswith(".tmp")]  # what SIGKILL leaves
    root, _ = builtin.builtin_dir(ModelConfig(), pretrain=True)
    assert (root / "DONE").exists() and len(fake_build) == 1
    assert sorted(p.name for p in parent.iterdir() if not p.name.endswith(".lock")) == [root.name]
