"""benchmarks/bench_gguf_engines.py --quick on the built-in tiny model, so it cannot rot unseen: both engines timed
on both GGUF quantizers, their per-token differences and divergences reported (skipped without llama-cpp-python,
an error under LLMAUDIT_LLAMA_CPP_REQUIRED=1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmaudit.quantize import llama_cpp_lib

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gguf_engines.py"
if llama_cpp_lib.availability():
    if os.environ.get("LLMAUDIT_LLAMA_CPP_REQUIRED") == "1":
        raise RuntimeError(f"LLMAUDIT_LLAMA_CPP_REQUIRED=1 but {llama_cpp_lib.availability()}")
    pytest.skip(llama_cpp_lib.availability(), allow_module_level=True)


@pytest.mark.slow  # builds the built-in model once, quantizes it twice per engine
def test_bench_gguf_engines_quick_measures_both_engines(tmp_path):
    out = tmp_path / "engines.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json", str(out)], capture_output=True,
                          text=True, timeout=1200, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["quantizer"]) for r in rows] == [("demo", "gguf-q8_0"), ("demo", "gguf-q4_k_m")]
    for r in rows:
        assert r["threads"] == 1 and r["torch_tokens_per_s"] > 0 and r["llama_tokens_per_s"] > 0
        assert r["speed_ratio_llama_over_torch"] == pytest.approx(r["llama_tokens_per_s"] / r["torch_tokens_per_s"])
        assert 0 < r["dloss_mean"] <= r["dloss_p99"] < 0.5  # the same weights, another arithmetic
        assert 0 < r["kl_torch_llama_mean"] < r["kl_torch_llama_p99"]
    q8, q4 = rows
    assert q4["kl_fp32_torch_mean"] > 10 * q8["kl_fp32_torch_mean"]  # 4 bits move the model more than 8
    assert "ratio" in done.stdout and "gguf-q4_k_m" in done.stdout
