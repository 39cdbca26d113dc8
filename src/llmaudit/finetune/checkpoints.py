"""Checkpoints of a fine-tuning run, in formats that hold data only: safetensors and JSON.

A checkpoint directory holds the LoRA adapter (`adapter_model.safetensors` + `adapter_config.json`, as
peft writes them), `checkpoint.json` (run, step, epoch, training loss, the adapter's sha256) and, for the
newest checkpoint of an unfinished run only, the state needed to resume: `trainer_state.safetensors`
(the optimizer's tensors and torch's RNG state) with `trainer_state.json` (the step, the optimizer's
hyper-parameters and its non-tensor state). Nothing is pickled: a received run directory cannot run
code when a run resumes (earlier versions wrote `trainer_state.pt`, which is refused, never loaded).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from llmaudit.common.io import atomic_write_json, read_json
from llmaudit.store.digests import DIGEST_SCOPE, record_digests
from llmaudit.store.run_store import StoreError, file_digest

ADAPTER_FILE = "adapter_model.safetensors"
STATE_TENSORS = "trainer_state.safetensors"
STATE_JSON = "trainer_state.json"
PICKLED_STATE = "trainer_state.pt"


def write_checkpoint(directory: Path, model: Any, *, run: int, step: int, epoch: int, train_loss: float) -> str:
    """Save the adapter (safetensors) and checkpoint.json into `directory`; returns the adapter's sha256.

    checkpoint.json records the sha256 of every file that changes the model (`store.digests`: the adapter's
    weights and its adapter_config.json), which DONE.json then carries for the run's whole trajectory."""
    model.save_pretrained(directory, safe_serialization=True)
    digest = file_digest(directory / ADAPTER_FILE)
    atomic_write_json(
        directory / "checkpoint.json",
        {
            "run": run,
            "step": step,
            "epoch": epoch,
            "train_loss": train_loss,
            "adapter_sha256": digest,
            "files": record_digests(directory),
            "digest_scope": DIGEST_SCOPE,
        },
    )
    return digest


def save_trainer_state(directory: Path, step: int, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer and RNG state of `step` as safetensors (tensors) + JSON (everything else)."""
    from safetensors.torch import save_file

    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {"torch_rng": torch.get_rng_state()}
    plain: dict[str, dict[str, Any]] = {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().to("cpu").contiguous()
            else:
                plain.setdefault(str(index), {})[key] = value
    save_file(tensors, str(directory / STATE_TENSORS))
    atomic_write_json(
        directory / STATE_JSON, {"step": int(step), "param_groups": state["param_groups"], "plain_state": plain}
    )


def load_trainer_state(directory: Path, device: torch.device) -> dict[str, Any] | None:
    """{"step", "optimizer" (a state_dict), "torch_rng"} saved by `save_trainer_state`, or None when the
    checkpoint holds none. A pickled trainer_state.pt is refused with the fix, never unpickled."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not (directory / STATE_JSON).exists():
        if (directory / PICKLED_STATE).exists():
            raise StoreError(
                f"{directory / PICKLED_STATE} is a pickle, which llmaudit never loads (it could run code). Delete "
                f"it to retrain this run from its start, or delete {directory} to resume from the previous checkpoint."
            )
        return None
    meta = read_json(
        directory / STATE_JSON, what="trainer state", fix=f"delete {directory} to resume from the previous checkpoint."
    )
    try:
        tensors = load_file(str(directory / STATE_TENSORS), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:
        raise StoreError(
            f"{directory / STATE_TENSORS} is unreadable ({exc}); delete {directory} to resume from the previous checkpoint."
        ) from None
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("state."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for index, entry in (meta.get("plain_state") or {}).items():
        state.setdefault(int(index), {}).update(entry)
    groups = json.loads(json.dumps(meta["param_groups"]))
    for group in groups:
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
    return {
        "step": int(meta["step"]),
        "optimizer": {"state": state, "param_groups": groups},
        "torch_rng": tensors["torch_rng"].to("cpu", torch.uint8),
    }


def drop_trainer_state(directory: Path) -> None:
    """Remove the resume state of a checkpoint that is no longer the newest (it is large on real models)."""
    for name in (STATE_TENSORS, STATE_JSON):
        (directory / name).unlink(missing_ok=True)


def load_adapter_weights(directory: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """The adapter's tensors from safetensors (never from a pickled adapter_model.bin)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = directory / ADAPTER_FILE
    if not path.exists():
        why = (
            "only a pickled adapter_model.bin, which llmaudit never loads"
            if (directory / "adapter_model.bin").exists()
            else "no adapter"
        )
        raise StoreError(f"{directory} holds {why}; delete it to resume from the previous checkpoint.")
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:
        raise StoreError(
            f"{path} is unreadable ({exc}); delete {directory} to resume from the previous checkpoint."
        ) from None
