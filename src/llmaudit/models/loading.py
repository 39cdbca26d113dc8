"""Base model and tokenizer: hub ids and local paths through `from_pretrained`, or the built-in tiny model."""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import Any, Literal

import torch

from llmaudit.common.errors import UserError
from llmaudit.common.runtime import resolve_dtype
from llmaudit.config import ModelConfig
from llmaudit.models.builtin import BUILTIN_NAMES, BUILTIN_PREFIX, builtin_dir

log = logging.getLogger(__name__)


ModelRoute = Literal["builtin", "local", "hub"]


class ModelError(UserError):
    """The model cannot be loaded; the message names the fix."""


def resolve_model_route(name: str) -> ModelRoute:
    """builtin:NAME, an existing local directory, or a hub id (`org/name`)."""
    if name.startswith(BUILTIN_PREFIX):
        short = name[len(BUILTIN_PREFIX) :]
        if short not in BUILTIN_NAMES:
            raise ModelError(
                f"unknown built-in model {name!r}; available: {[BUILTIN_PREFIX + n for n in BUILTIN_NAMES]}"
            )
        return "builtin"
    if Path(name).expanduser().is_dir():
        return "local"
    if name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1):
        raise ModelError(f"model path {name!r} does not exist (a local model is a directory with config.json).")
    return "hub"


def import_gptqmodel_quietly() -> None:
    """Import gptqmodel (when installed) with its start-up banner, environment notices and ASCII art
    captured instead of printed. peft imports it whenever it wraps a model in LoRA layers, so without this
    every fine-tuning and scoring job opens with a screen of text about GPU kernels. LLMAUDIT_LOG set: the
    banner is shown. An import that fails still raises, with its output attached."""
    import contextlib
    import importlib.util
    import io
    import sys

    if "gptqmodel" in sys.modules or os.environ.get("LLMAUDIT_LOG") or importlib.util.find_spec("gptqmodel") is None:
        return
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            import gptqmodel  # noqa: F401
    except Exception as exc:
        raise ImportError(f"importing gptqmodel failed ({exc}); its output:\n{captured.getvalue()[-2000:]}") from exc
    log.debug("gptqmodel import output:\n%s", captured.getvalue())


def load_tokenizer(cfg: ModelConfig) -> Any:
    route = resolve_model_route(cfg.name)
    if route == "builtin":
        return builtin_dir(cfg, pretrain=False)[1]
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(cfg.name, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise _load_error(cfg.name, exc) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_base_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """The base model before fine-tuning, in eval mode on `device`."""
    from transformers import AutoModelForCausalLM

    dtype = dtype or resolve_dtype(cfg.dtype, device)
    route = resolve_model_route(cfg.name)
    source = str(builtin_dir(cfg, pretrain=True)[0]) if route == "builtin" else cfg.name
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            revision=None if route == "builtin" else cfg.revision,
            trust_remote_code=cfg.trust_remote_code,
            dtype=dtype,
            use_safetensors=None if route == "hub" else True,
        )
    except (OSError, ValueError) as exc:
        raise _load_error(cfg.name, exc) from None
    return model.to(device).eval()


def load_checkpoint_model(base: Any, directory: Path, device: torch.device) -> Any:
    """The fine-tuned model a checkpoint directory holds, in eval mode: the base with a LoRA adapter
    merged (adapter_config.json + adapter_model.safetensors), or a full model (config.json +
    model*.safetensors). Safetensors only: pickled *.bin weights are refused, never loaded."""
    directory = Path(directory)
    if (directory / "adapter_config.json").exists():
        return _merged_adapter(base, directory)
    weights = sorted(directory.glob("model*.safetensors"))
    if (directory / "config.json").exists() and weights:
        return _full_checkpoint(base, directory, device)
    pickled = sorted(p.name for p in directory.glob("*.bin"))
    why = (
        f"only pickled weights {pickled}, which llmaudit never loads (convert them to safetensors)"
        if pickled
        else "neither a LoRA adapter nor model weights"
    )
    raise ModelError(f"checkpoint {directory} holds {why}.")


def _merged_adapter(base: Any, directory: Path) -> Any:
    from peft import PeftModel

    if not (directory / "adapter_model.safetensors").exists():
        raise ModelError(
            f"checkpoint {directory} has no adapter_model.safetensors (a pickled adapter_model.bin is never loaded); "
            "save the adapter with safe_serialization=True."
        )
    try:
        adapter = PeftModel.from_pretrained(copy.deepcopy(base), str(directory), is_trainable=False)
    except Exception as exc:  # size mismatch, corrupt file, unknown modules: all say the same to the user
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"the LoRA adapter in {directory} does not load onto the base model {type(base).__name__} ({first}); "
            "check that --base / model.name is the model the adapter was trained from."
        ) from None
    return adapter.merge_and_unload().eval()


def _full_checkpoint(base: Any, directory: Path, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM

    dtype = next(base.parameters()).dtype
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), use_safetensors=True, dtype=dtype, trust_remote_code=False
        )
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"the model checkpoint in {directory} does not load ({first}).") from None
    shapes = {n: tuple(p.shape) for n, p in base.named_parameters()}
    mine = {n: tuple(p.shape) for n, p in model.named_parameters()}
    if shapes != mine:
        diff = sorted(set(shapes.items()) ^ set(mine.items()))[:3]
        raise ModelError(
            f"the model checkpoint in {directory} does not have the base model's architecture (e.g. {diff}); "
            "check that --base / model.name is the model it was fine-tuned from."
        )
    return model.to(device).eval()


def _load_error(name: str, exc: Exception) -> ModelError:
    """A loading failure as a one-line ModelError with the fix: custom code refused, no safetensors, offline."""
    text = str(exc)
    if "trust_remote_code" in text or "custom code" in text:
        return ModelError(
            f"model {name!r} ships its own Python code, which llmaudit runs only when you pass --trust-remote-code "
            "(or set model.trust_remote_code: true in your own recipe); a run directory can never turn it on."
        )
    if "safetensors" in text.lower() and "bin" in text.lower():
        return ModelError(
            f"model {name!r} has only pickled *.bin weights, which llmaudit never loads; convert them to safetensors."
        )
    return _hub_error(name, exc)


def _hub_error(name: str, exc: Exception) -> ModelError:
    return ModelError(
        f"could not load {name!r} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
        "If the machine is offline, download the model once elsewhere and set model.name to its local "
        "directory; or use model.name=builtin:tiny-qwen2 for the CPU demo."
    )
