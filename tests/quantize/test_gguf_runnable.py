"""The whole model as a GGUF llama.cpp runs (``quantize.gguf_runnable``, what the llama.cpp scoring engine quantizes):
every tensor and hyper-parameter equal to llama.cpp's own converter's float32 file, and llama.cpp's logits from it
those of the torch model to the precision of llama.cpp's arithmetic (16-bit key/value cache).

The converter comes from $LLMAUDIT_LLAMA_CPP_SRC as in tests/quantize/test_gguf_exact.py; without it (or without
llama-cpp-python) the tests that need it are skipped with the reason, unless LLMAUDIT_LLAMA_CPP_REQUIRED=1 (CI).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from llmaudit.quantize import QuantizationError, llama_cpp_lib
from llmaudit.quantize.gguf_runnable import write_runnable_gguf
from tests.tiny_models import tiny_causal_lm

REQUIRED = os.environ.get("LLMAUDIT_LLAMA_CPP_REQUIRED") == "1"
SRC = os.environ.get("LLMAUDIT_LLAMA_CPP_SRC", "")


def _skip_or_fail(reason: str | None) -> None:
    if reason and REQUIRED:
        raise RuntimeError(f"LLMAUDIT_LLAMA_CPP_REQUIRED=1 but {reason}")
    if reason:
        pytest.skip(reason)


CONVERT = """
import sys
sys.path.insert(0, sys.argv[1])
import convert_hf_to_gguf as convert
from conversion.llama import LlamaModel
from conversion.qwen import Qwen2Model
for cls in (LlamaModel, Qwen2Model):
    cls.set_vocab = lambda self: None
sys.argv = ["convert_hf_to_gguf.py", sys.argv[2], "--outtype", "f32", "--outfile", sys.argv[3]]
convert.main()
"""

LLAMA3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}  # fmt: skip
MODELS = {
    "llama": dict(arch="llama", tie_word_embeddings=True),
    "qwen2": dict(arch="qwen2", tie_word_embeddings=False),
    "llama3-rope": dict(arch="llama", rope_parameters=LLAMA3, max_position_embeddings=256),
}


def _model(kind: str):
    spec = dict(MODELS[kind])
    return tiny_causal_lm(spec.pop("arch"), seed=2, initializer_range=0.1, **spec)


def _read(path: Path) -> tuple[dict, dict]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith(("GGUF.", "general."))}
    tensors = {t.name: np.array(t.data, copy=True) for t in reader.tensors}
    return fields, tensors


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_tensor_and_key_equals_llama_cpps_converter(kind, tmp_path):
    _skip_or_fail(None if (Path(SRC) / "convert_hf_to_gguf.py").is_file() else
                  "LLMAUDIT_LLAMA_CPP_SRC does not name llama.cpp's source tree (convert_hf_to_gguf.py)")  # fmt: skip
    model = _model(kind)
    model.save_pretrained(tmp_path / "hf")
    converted = tmp_path / "converter.gguf"
    result = subprocess.run([sys.executable, "-c", CONVERT, SRC, str(tmp_path / "hf"), str(converted)],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    theirs_fields, theirs = _read(converted)
    mine_fields, mine = _read(write_runnable_gguf(model, tmp_path / "mine.gguf"))
    assert set(mine) == set(theirs)
    for name, values in theirs.items():
        assert np.array_equal(mine[name], values), name
    for key, value in theirs_fields.items():  # every hyper-parameter the converter wrote (no vocabulary here)
        assert key in mine_fields and mine_fields[key] == pytest.approx(value), key
    assert mine_fields["tokenizer.ggml.model"] == "none"


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_llama_cpp_computes_the_torch_models_logits(kind, tmp_path):
    _skip_or_fail(llama_cpp_lib.availability())
    from llmaudit.quantize.gguf_runtime import LlamaCppModel

    model = _model(kind)
    path = write_runnable_gguf(model, tmp_path / "model.gguf")
    tokens = torch.randint(0, 512, (90,), generator=torch.Generator().manual_seed(0)).tolist()  # past 64: llama3
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits[0].numpy()
    with LlamaCppModel(path, threads=1) as runtime:
        assert runtime.n_vocab == 512
        logits = runtime.logits([tokens], [[True] * len(tokens)])[0]
    assert np.abs(logits - expected).max() < 0.02 * np.abs(expected).max()  # 16-bit K/V cache, not the layout
    assert (logits.argmax(1) == expected.argmax(1)).mean() > 0.95


def test_a_rotary_scaling_llmaudit_does_not_write_is_refused(tmp_path):
    model = tiny_causal_lm("llama", rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                                     "original_max_position_embeddings": 64})  # fmt: skip
    with pytest.raises(QuantizationError, match="score.engine=torch"):
        write_runnable_gguf(model, tmp_path / "m.gguf")
