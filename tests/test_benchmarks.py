"""The scoring benchmark runs end to end on a toy size, and its engine rows agree with its naive loop."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scoring.py"
TOY = [
    "--samples",
    "6",
    "--min-len",
    "8",
    "--max-len",
    "40",
    "--vocab",
    "700",
    "--hidden",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--repeats",
    "1",
    "--peak-n",
    "256",
    "--token-budget",
    "64",
    "--head-chunk",
    "16",
]
ROW = re.compile(r"^(naive|engine vocab_stats=o(?:n|ff))\s+(.*)$")


def _run(*extra: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *TOY, *extra], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows: dict[str, list[list[str]]] = {}
    for line in done.stdout.splitlines():
        match = ROW.match(line)
        if match:
            rows.setdefault(match.group(1), []).append(match.group(2).split())
    assert set(rows) == {"naive", "engine vocab_stats=off", "engine vocab_stats=on"}, done.stdout
    return rows


def _check(rows: dict[str, list[list[str]]]) -> None:
    for name in ("engine vocab_stats=off", "engine vocab_stats=on"):
        timing = rows[name][0]
        assert float(timing[-2]) <= 1e-5 and float(timing[-1]) <= 1e-4  # max |dloss|, max |dtoken| vs naive
        assert float(timing[2]) > 0 and float(timing[3]) > 0  # tokens/s, ratio (wall s may print as 0.00)


@pytest.mark.slow  # ten processes (the benchmark and its nine memory probes): about 100 s on a 2-core CPU
def test_bench_scoring_toy_cpu():
    rows = _run("--device", "cpu")
    _check(rows)
    # the scaling table: live MiB / RSS MiB per cell, three cells per method
    for name, lines in rows.items():
        cells = re.findall(r"(\d+) / (\d+)", " ".join(lines[1]))
        assert len(cells) == 3, (name, lines)


@pytest.mark.gpu
def test_bench_scoring_toy_gpu():
    assert torch.cuda.is_available()
    _check(_run("--device", "cuda", "--no-scaling"))
