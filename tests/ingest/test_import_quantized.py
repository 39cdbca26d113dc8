"""`llmaudit import --quantized NAME=PATH`: the user's own quantized model of a run's final checkpoint, scored as
given, digested like every checkpoint, refused in one line when it does not fit.

The user's .gguf is made here as a user makes it: the final checkpoint merged and saved, converted by llama.cpp's
converter, quantized by llama.cpp (tests/quantize/test_gguf_exact.py says where the converter comes from)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from llmaudit.common.io import file_digest
from llmaudit.models.loading import load_base_model, load_checkpoint_model
from llmaudit.quantize import llama_cpp_lib
from llmaudit.store.run_store import RunStore
from tests.conftest import run_cli
from tests.ingest.test_import import import_args, lora_run, model_cfg, records, refused  # noqa: F401

if llama_cpp_lib.availability() or not os.environ.get("LLMAUDIT_LLAMA_CPP_SRC"):
    if os.environ.get("LLMAUDIT_LLAMA_CPP_REQUIRED") == "1":
        raise RuntimeError("LLMAUDIT_LLAMA_CPP_REQUIRED=1 but llama.cpp or its source tree is missing")
    pytest.skip("needs llama-cpp-python and $LLMAUDIT_LLAMA_CPP_SRC (llama.cpp's converter)", allow_module_level=True)

from tests.quantize.test_gguf_exact import CONVERT  # noqa: E402


def users_gguf(model, root, name: str, ftype: int = 7):
    """The model converted and quantized by llama.cpp (ftype 7 = Q8_0)."""
    directory = root / f"{name}-hf"
    model.save_pretrained(directory)
    f32 = root / f"{name}-f32.gguf"
    done = subprocess.run(
        [sys.executable, "-c", CONVERT, os.environ["LLMAUDIT_LLAMA_CPP_SRC"], str(directory), str(f32)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = root / f"{name}.gguf"
    llama_cpp_lib.quantize_file(f32, out, ftype=ftype, imatrix=None, threads=2)
    return out


@pytest.mark.slow
def test_a_users_gguf_is_scored_as_given_and_equals_llmaudits_own(lora_run, model_cfg, tmp_path):  # noqa: F811
    base = load_base_model(model_cfg, torch.device("cpu"), dtype=torch.float32)
    final = load_checkpoint_model(base, lora_run["dir"] / "checkpoint-3", torch.device("cpu"))
    gguf = users_gguf(final, tmp_path, "fine-tune")
    args = import_args(lora_run["dir"], lora_run["train"], lora_run["heldout"], tmp_path / "given")
    args = [a if a != "score.quantizers=[fp32,uniform-4]" else "score.quantizers=[fp32,gguf-q8_0]" for a in args]
    code, stdout, err = run_cli([*args, "--quantized", f"gguf-q8_0={gguf}"])
    assert code == 0, err
    store = RunStore(tmp_path / "given")
    given = store.manifest()["imported"]["quantized"]
    assert [(g["run"], g["step"], g["quantizer"], g["kind"]) for g in given] == [(0, 3, "gguf-q8_0", "gguf")]
    assert given[0]["files"] == {gguf.name: file_digest(gguf)}
    code, _, err = run_cli(["score", tmp_path / "given", "--no-progress"])
    assert code == 0, err

    own_args = [a if a != "score.quantizers=[fp32,uniform-4]" else "score.quantizers=[fp32,gguf-q8_0]" for a in
                import_args(lora_run["dir"], lora_run["train"], lora_run["heldout"], tmp_path / "own")]  # fmt: skip
    assert run_cli(own_args)[0] == 0 and run_cli(["score", tmp_path / "own", "--no-progress"])[0] == 0
    mine = pd.read_parquet(store.unit_path(0, 3, "gguf-q8_0"))
    theirs = pd.read_parquet(RunStore(tmp_path / "own").unit_path(0, 3, "gguf-q8_0"))
    assert mine["loss"].tolist() == theirs["loss"].tolist()  # the user's file is llmaudit's own Q8_0 of it
    assert mine["point_id"].iloc[0] == theirs["point_id"].iloc[0]  # the same weights (their digest)

    # another model's file (same architecture, other widths) is refused at import, before anything is written
    import transformers

    other = transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**{**final.config.to_dict(), "intermediate_size": 96})
    )
    wrong = users_gguf(other, tmp_path, "other")
    code, _, err = run_cli([*import_args(lora_run["dir"], lora_run["train"], lora_run["heldout"], tmp_path / "wrong"),
                            "--quantized", f"gguf-q8_0={wrong}"])  # fmt: skip
    refused(code, err, "tensor blk.", "the checkpoint's")
    assert not (tmp_path / "wrong").exists()

    # a file changed after the import is refused before it is scored
    gguf.write_bytes(gguf.read_bytes()[:-1] + b"\0")
    (store.unit_path(0, 3, "gguf-q8_0")).unlink()
    code, _, err = run_cli(["score", tmp_path / "given", "--no-progress"])
    refused(code, err, "changed or is missing since `llmaudit import` recorded it")


def test_a_file_that_does_not_fit_is_refused_in_one_line(lora_run, tmp_path):  # noqa: F811
    args = import_args(lora_run["dir"], lora_run["train"], lora_run["heldout"], tmp_path / "bad")
    missing = tmp_path / "nothing.gguf"
    refused(*run_cli([*args, "--quantized", f"gguf-q8_0={missing}"])[::2], "does not exist")
    refused(*run_cli([*args, "--quantized", f"fp32={lora_run['train']}"])[::2], "is not a quantizer")
    refused(*run_cli([*args, "--quantized", f"gguf-q8_0={lora_run['train']}"])[::2], "takes a .gguf file")
    refused(*run_cli([*args, "--quantized", f"gptq-4={lora_run['dir']}"])[::2], "checkpoint directory with config.json")
    assert not (tmp_path / "bad").exists()


def test_manifest_record_is_json(tmp_path):
    from llmaudit.quantize.given import GivenFile

    record = GivenFile(0, 3, "gguf-q8_0", "/x.gguf", "gguf", {"x.gguf": "0" * 64})
    assert GivenFile.from_dict(json.loads(json.dumps(record.to_dict()))) == record
