"""Base model and tokenizer through `from_pretrained`, for every spelling of `model.name`
(`llmaudit.models.sources`), and the fine-tuned models that checkpoints hold."""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, Literal

import torch

from llmaudit.common.runtime import resolve_dtype
from llmaudit.config import ModelConfig
from llmaudit.models.builtin import BUILTIN_NAMES, BUILTIN_PREFIX, builtin_dir
from llmaudit.models.sources import ModelError, ModelSource, materialize_gguf, resolve_model_source

log = logging.getLogger(__name__)


ModelRoute = Literal["builtin", "local", "hub", "gguf"]


def resolve_model_route(name: str) -> ModelRoute:
    """builtin:NAME, an existing local directory, a GGUF file (or package:MODULE/file.gguf), or a hub id."""
    if name.startswith(BUILTIN_PREFIX):
        short = name[len(BUILTIN_PREFIX) :]
        if short not in BUILTIN_NAMES:
            raise ModelError(
                f"unknown built-in model {name!r}; available: {[BUILTIN_PREFIX + n for n in BUILTIN_NAMES]}"
            )
        return "builtin"
    return resolve_model_source(name, builtin_prefix=BUILTIN_PREFIX).kind  # type: ignore[return-value]


def model_source(cfg: ModelConfig, *, echo=None) -> ModelSource:
    """Where `cfg`'s weights and tokenizer load from; a GGUF model is converted (once) to a cached
    full-precision directory here."""
    route = resolve_model_route(cfg.name)
    if route == "builtin":
        return ModelSource(cfg.name, "builtin", path=str(builtin_dir(cfg, pretrain=True)[0]))
    source = resolve_model_source(cfg.name, builtin_prefix=BUILTIN_PREFIX)
    return materialize_gguf(source, echo=echo) if source.kind == "gguf" else source


def import_gptqmodel_quietly() -> None:
    """Import gptqmodel (when installed) with its start-up banner, environment notices and ASCII art
    captured instead of printed. peft imports it whenever it wraps a model in LoRA layers, so without this
    every fine-tuning and scoring job opens with a screen of text about GPU kernels. LLMAUDIT_LOG set: the
    banner is shown. An import that fails still raises, with its output attached.

    The import runs in a thread of its own: gptqmodel keeps an exception's traceback from its import, which holds
    every frame that was on the stack then, with their locals, for the life of the process (imported inside the
    first LoRA wrap of a fine-tuning job, it held that caller's model for good; docs/results.md, "The verdict
    audit's memory and time, process by process")."""
    if "gptqmodel" in sys.modules or os.environ.get("LLMAUDIT_LOG") or importlib.util.find_spec("gptqmodel") is None:
        return
    captured = io.StringIO()
    failures: list[Exception] = []

    def run() -> None:
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                import gptqmodel  # noqa: F401
        except Exception as exc:  # raised again in the caller's thread below
            failures.append(exc)

    thread = threading.Thread(target=run, name="llmaudit-import-gptqmodel")
    thread.start()
    thread.join()
    if failures:
        exc = failures[0]
        raise ImportError(f"importing gptqmodel failed ({exc}); its output:\n{captured.getvalue()[-2000:]}") from exc
    log.debug("gptqmodel import output:\n%s", captured.getvalue())


def load_tokenizer(cfg: ModelConfig) -> Any:
    """The model's tokenizer with its chat template; pad = eos when the model has no pad token."""
    source = model_source(cfg)
    if source.kind == "builtin":
        return builtin_dir(cfg, pretrain=False)[1]
    from transformers import AutoTokenizer

    location = source.path or cfg.name
    try:
        tok = AutoTokenizer.from_pretrained(
            location, revision=cfg.revision if source.kind == "hub" else None, trust_remote_code=cfg.trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise _load_error(cfg.name, exc) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_base_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """The base model before fine-tuning, in eval mode on `device` (safetensors weights only, from the hub too)."""
    from transformers import AutoModelForCausalLM

    dtype = dtype or resolve_dtype(cfg.dtype, device)
    source = model_source(cfg)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source.path or cfg.name,
            revision=cfg.revision if source.kind == "hub" else None,
            trust_remote_code=cfg.trust_remote_code,
            dtype=dtype,
            use_safetensors=True,  # a hub id or a directory a store names: never pickled *.bin weights
        )
    except (OSError, ValueError) as exc:
        raise _load_error(cfg.name, exc) from None
    return model.to(device).eval()


def load_checkpoint_model(base: Any, directory: Path, device: torch.device, *, consume: bool = False) -> Any:
    """The fine-tuned model a checkpoint directory holds, in eval mode: the base with a LoRA adapter
    merged (adapter_config.json + adapter_model.safetensors), or a full model (config.json +
    model*.safetensors). Safetensors only: pickled *.bin weights are refused, never loaded.
    consume: the adapter is merged into `base` itself (no copy; the caller never uses `base` again)."""
    directory = Path(directory)
    if (directory / "adapter_config.json").exists():
        return _merged_adapter(base if consume else copy.deepcopy(base), directory)
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
    """`base` (modified: the caller passes a model of its own) with the adapter of `directory` merged."""
    from peft import PeftModel

    if not (directory / "adapter_model.safetensors").exists():
        raise ModelError(
            f"checkpoint {directory} has no adapter_model.safetensors (a pickled adapter_model.bin is never loaded); "
            "save the adapter with safe_serialization=True."
        )
    try:
        adapter = PeftModel.from_pretrained(base, str(directory), is_trainable=False)
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
