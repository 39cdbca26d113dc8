"""What `llmaudit import` reads from a training directory is bounded and typed: a checkpoint-N with an absurd N and
a safetensors header whose shape is not a list of whole numbers are refused in one line naming the file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from llmaudit.ingest.checkpoints import ImportInputError, find_checkpoints, safetensors_shapes


def adapter(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 4, "target_modules": "all-linear"}')
    (directory / "adapter_model.safetensors").write_bytes(b"a")


@pytest.mark.parametrize("step", ["99999999999999999999999", "1000000001"])
def test_an_absurd_checkpoint_step_is_refused_naming_the_directory(step, tmp_path):
    adapter(tmp_path / "checkpoint-5")
    adapter(tmp_path / f"checkpoint-{step}")
    with pytest.raises(ImportInputError, match=f"checkpoint-{step}: step .* is above 1,000,000,000"):
        find_checkpoints(tmp_path)


def test_an_absurd_global_step_is_not_taken_as_the_step(tmp_path):
    adapter(tmp_path / "checkpoint-5")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"b")
    (tmp_path / "adapter_config.json").write_text('{"r": 2}')
    (tmp_path / "trainer_state.json").write_text('{"global_step": 1e300}')
    assert [c.step for c in find_checkpoints(tmp_path).checkpoints] == [5, 6]  # unknown step: after the last


def _safetensors(path: Path, header: dict) -> Path:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * 16)
    return path


@pytest.mark.parametrize("shape", ["abc", [2.5, 2], [True, 2], None, {"a": 1}, [[2], 2]])
def test_a_safetensors_shape_that_is_not_a_list_of_whole_numbers(shape, tmp_path):
    path = _safetensors(tmp_path / "w.safetensors", {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 16]}})
    with pytest.raises(ImportInputError, match=r"w\.safetensors is not a safetensors file: the shape of tensor 'w'"):
        safetensors_shapes(path)
    good = _safetensors(tmp_path / "g.safetensors", {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})
    assert safetensors_shapes(good) == {"w": (2, 2)}
