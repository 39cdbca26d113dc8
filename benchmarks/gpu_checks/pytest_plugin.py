"""The pytest plugin of check a (loaded with -p gpu_checks.pytest_plugin): every test's outcome to a JSON lines
file as it finishes, and the pinned GPTQ kernel backend."""

from __future__ import annotations

import json
import os
from typing import Any

from .common import GPTQ_BACKEND_ENV, PYTEST_LOG_ENV
from .models import pin_gptq_backend


def pytest_configure(config: Any) -> None:
    pin_gptq_backend(os.environ.get(GPTQ_BACKEND_ENV))


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _log_outcome(report.nodeid or "(collection)", "error", 0.0)


def pytest_runtest_logreport(report: Any) -> None:
    outcome = None
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if report.when == "setup" and report.outcome == "failed":
            outcome = "error"
    elif report.when == "teardown" and report.outcome == "failed":
        outcome = "error"
    if outcome is not None:
        _log_outcome(report.nodeid, outcome, report.duration)


def _log_outcome(nodeid: str, outcome: str, duration: float) -> None:
    path = os.environ.get(PYTEST_LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"nodeid": nodeid, "outcome": outcome, "duration": duration}) + "\n")
