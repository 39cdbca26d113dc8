"""Check a of benchmarks/gpu_check.py: `pytest -m gpu -q` in a subprocess, on the test files that hold GPU tests;
every test's outcome is logged as it finishes (pytest_plugin, loaded into that pytest), so a timeout keeps the
counts."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from .common import GPTQ_BACKEND_ENV, PYTEST_LOG_ENV, ROOT, SCRIPT, Result

PLUGIN = "gpu_checks.pytest_plugin"  # importable from benchmarks/ (SCRIPT.parent, put on PYTHONPATH)


def check_gpu_tests(args: argparse.Namespace, result: Result) -> None:
    log = Path(args.work) / "pytest-outcomes.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, PYTEST_LOG_ENV: str(log)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPT.parent), env.get("PYTHONPATH")]))
    if args.device == "cuda":
        env[GPTQ_BACKEND_ENV] = args.gptq_backend
    # only the files that hold GPU tests are collected: faster, and a test module that needs a package the box
    # lacks (matplotlib, say) cannot stop the GPU tests (--continue-on-collection-errors for the rest)
    files = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in path.read_text(errors="replace")
    )
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-p", PLUGIN]
    cmd += ["--continue-on-collection-errors", *(files or ["tests"])]
    result.detail(command=" ".join(cmd[1:]))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:  # type: ignore[union-attr]
        print(line, end="")
        tail = (tail + [line.rstrip()])[-40:]
        _pytest_counts(log, result)
    rc = proc.wait()
    counts = _pytest_counts(log, result)
    figure = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped"))
    failed = counts["failed"] + counts["error"]
    if rc == 5 or not sum(counts.values()):
        result.set(status="fail", figure=figure, error=f"pytest collected no GPU test (exit {rc})")
    elif failed or rc not in (0, 5):
        names = result["details"].get("failures", [])[:5]
        result.set(status="fail", figure=figure, error=f"pytest exit {rc}; failed: {names} | " + " | ".join(tail[-3:]))
    elif args.device != "cuda":
        result.set(
            status="skip", figure=figure, reason=f"no CUDA device: the {counts['skipped']} GPU-marked tests are skipped"
        )
    elif counts["passed"] == 0:
        result.set(status="fail", figure=figure, error="no GPU test passed (all skipped: is CUDA visible to pytest?)")
    else:
        result.set(status="pass", figure=figure)


def _pytest_counts(log: Path, result: Result) -> Counter:
    counts: Counter = Counter({"passed": 0, "failed": 0, "error": 0, "skipped": 0})
    failures, slowest = [], []
    with contextlib.suppress(OSError):
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                counts[rec["outcome"]] += 1
                if rec["outcome"] in ("failed", "error"):
                    failures.append(rec["nodeid"])
                slowest.append((rec["duration"], rec["nodeid"]))
    slowest.sort(reverse=True)
    result.detail(counts=dict(counts), failures=failures, slowest=[f"{d:.1f} s {n}" for d, n in slowest[:5]])
    return counts
