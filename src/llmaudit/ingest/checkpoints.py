"""The checkpoints of a user's training output directory, as transformers.Trainer and TRL write them.

    OUTPUT_DIR/checkpoint-N/   adapter_model.safetensors + adapter_config.json   (a peft LoRA adapter)
                               or config.json + model.safetensors (or model-0000i-of-0000n.safetensors
                               shards with model.safetensors.index.json)           (the full model)
                               + trainer_state.json (global_step, log history)
                               + optimizer.pt, scheduler.pt, rng_state.pth, training_args.bin (pickles)
    OUTPUT_DIR/                the final weights (trainer.save_model), trainer_state.json (save_state)

Every checkpoint-N/ is a point of the trajectory (N from its name), and so are the final weights in the
directory itself: at trainer_state.json's global_step, or, without it, after the last checkpoint (skipped
when they are byte-identical to a checkpoint, as Trainer's final save usually is). Only JSON and the
safetensors files (their headers, and their bytes for the digests) are ever read: the pickles a trainer
leaves beside them (optimizer, scheduler, RNG state, training arguments) are never opened.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmaudit.common.bounded import parse_json
from llmaudit.common.errors import UserError
from llmaudit.common.io import read_json
from llmaudit.store.digests import DIGEST_SCOPE, PICKLED_WEIGHTS, number_files
from llmaudit.store.run_store import file_digest

CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
MAX_STEP = 10**9
"""The largest training step a checkpoint may have: a billion optimizer steps is beyond any fine-tune, and every
step fits the int32 and %06d-formatted places it is recorded in."""
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
SAVE_HINT = (
    "save with safe_serialization=True (safetensors: the default of transformers and peft), or convert the "
    "weights to safetensors"
)


class ImportInputError(UserError):
    """A training output directory or data file that `llmaudit import` cannot use; the message names it and the fix."""


@dataclass
class Checkpoint:
    """One point of a run's trajectory in the user's training output."""

    step: int
    path: Path
    kind: str
    """lora (a peft adapter) or full (the whole model)."""
    files: list[str]
    """The files that define the model (weights and their config), digested into the manifest."""
    digests: dict[str, str] = field(default_factory=dict)

    def digest(self) -> dict[str, str]:
        """sha256 of every defining file (computed once)."""
        for name in self.files:
            if name not in self.digests:
                self.digests[name] = file_digest(self.path / name)
        return dict(self.digests)

    def record(self) -> dict[str, Any]:
        """The manifest's entry: {step, path, format, files: {name: sha256}, digest_scope}: the defining files
        and every other file in the directory that can change a number (`store.digests.number_files`: a
        tokenizer saved with the checkpoint, a config beside an adapter), so that none can change unseen."""
        files = self.digest()
        for name in number_files(self.path):
            files.setdefault(name, file_digest(self.path / name))
        return {
            "step": self.step,
            "path": str(self.path),
            "format": self.kind,
            "files": files,
            "digest_scope": DIGEST_SCOPE,
        }


@dataclass
class TrainingOutput:
    """A training output directory: its checkpoints in trajectory order and what its trainer recorded."""

    source: Path
    checkpoints: list[Checkpoint]
    trainer: dict[str, Any]
    notes: list[str]


def checkpoint_kind(directory: Path) -> tuple[str, list[str]]:
    """("lora" | "full", the defining files) of a directory holding model weights; ImportInputError naming
    the directory when its weights are missing or only pickled."""
    names = {p.name for p in directory.iterdir() if p.is_file()}
    pickled = sorted(n for n in names if PICKLED_WEIGHTS.match(n))
    if "adapter_config.json" in names:
        if "adapter_model.safetensors" in names:
            return "lora", list(ADAPTER_FILES)
        raise ImportInputError(_no_weights(directory, pickled, "a LoRA adapter (adapter_config.json) without"))
    if "model.safetensors.index.json" in names:
        index = _read_json(directory / "model.safetensors.index.json")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ImportInputError(
                f"{directory / 'model.safetensors.index.json'} has no weight_map; restore the checkpoint's files."
            )
        shards = sorted({str(v) for v in weight_map.values()})
        missing = [s for s in shards if s not in names or "/" in s or not s.endswith(".safetensors")]
        if missing:
            raise ImportInputError(
                f"checkpoint {directory} is missing weight shard(s) {missing[:3]} listed in model.safetensors.index.json; "
                "restore them (an interrupted save leaves a checkpoint incomplete)."
            )
        return "full", _with_config(directory, names, ["model.safetensors.index.json", *shards])
    if "model.safetensors" in names:
        return "full", _with_config(directory, names, ["model.safetensors"])
    raise ImportInputError(_no_weights(directory, pickled, "no"))


def _with_config(directory: Path, names: set[str], weights: list[str]) -> list[str]:
    if "config.json" not in names:
        raise ImportInputError(
            f"checkpoint {directory} holds model weights but no config.json; save it with save_pretrained."
        )
    return ["config.json", *weights]


def _no_weights(directory: Path, pickled: list[str], what: str) -> str:
    if pickled:
        return (
            f"checkpoint {directory} holds {what} safetensors weights, only pickled {pickled}, which llmaudit never "
            f"loads (unpickling runs code); {SAVE_HINT}."
        )
    pickles = sorted(p.name for p in directory.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
    others = f" (beside trainer state {pickles}, which is never loaded)" if pickles else ""
    return (
        f"checkpoint {directory} holds {what} model weights: no adapter_model.safetensors "
        f"(+ adapter_config.json) or model.safetensors (+ config.json){others}; the weights are missing, "
        "perhaps an interrupted save: restore them or remove the directory."
    )


def has_weights(directory: Path) -> bool:
    """Whether a directory holds (or should hold) model weights, pickled or not."""
    names = {p.name for p in directory.iterdir() if p.is_file()}
    return bool(
        names
        & {"adapter_config.json", "adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json"}
        or any(PICKLED_WEIGHTS.match(n) for n in names)
    )


def find_checkpoints(training_dir: str | Path) -> TrainingOutput:
    """The checkpoints of a training output directory in trajectory order (see the module docstring)."""
    root = Path(training_dir).expanduser().resolve()
    if not root.is_dir():
        raise ImportInputError(f"training output directory {training_dir} does not exist (or is not a directory).")
    notes: list[str] = []
    found: dict[int, Checkpoint] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and CHECKPOINT_DIR.match(p.name)):
        step = _step_of(sub)
        kind, files = checkpoint_kind(sub)
        found[step] = Checkpoint(step, sub, kind, files)
    top_state = _trainer_state(root)
    if has_weights(root):
        try:
            kind, files = checkpoint_kind(root)
        except ImportInputError as exc:
            if not found:
                raise
            notes.append(f"{root}: final weights skipped ({exc}); the checkpoint-N directories are used")
        else:
            _add_final(root, Checkpoint(-1, root, kind, files), top_state, found, notes)
    if not found:
        raise ImportInputError(
            f"no checkpoint found in {root}: expected checkpoint-N/ subdirectories (transformers.Trainer / TRL "
            "with save_steps) or final weights in the directory itself (adapter_model.safetensors + "
            "adapter_config.json, or config.json + model.safetensors). Point to the trainer's output_dir."
        )
    checkpoints = [found[s] for s in sorted(found)]
    return TrainingOutput(root, checkpoints, trainer_summary(root, checkpoints, top_state), notes)


def _add_final(
    root: Path, final: Checkpoint, state: dict | None, found: dict[int, Checkpoint], notes: list[str]
) -> None:
    """The directory's own (final) weights as a checkpoint, unless a checkpoint-N holds the same point."""
    match = CHECKPOINT_DIR.match(root.name)
    step = _int(state.get("global_step")) if state else None
    if step is None and match:
        step = _step_of(root)
    if step is None:
        same = [c for c in found.values() if c.kind == final.kind and c.digest() == final.digest()]
        if same:
            notes.append(f"{root}: final weights are those of {same[0].path.name}")
            return
        step = max(found, default=0) + 1
        notes.append(
            f"{root}: final weights without trainer_state.json (step unknown): placed after the last checkpoint, "
            f"at step {step}"
        )
    if step in found:
        if found[step].kind != final.kind or found[step].digest() != final.digest():
            notes.append(
                f"{root}: final weights differ from {found[step].path.name} (same step {step}); that one is used"
            )
        return
    final.step = step
    found[step] = final


def _trainer_state(directory: Path) -> dict | None:
    path = directory / "trainer_state.json"
    if not path.is_file():
        return None
    state = _read_json(path)
    return state if isinstance(state, dict) else None


def _read_json(path: Path) -> Any:
    """A JSON file of the training output, within the bounds of `common.bounded` (size, depth)."""
    return read_json(path, what="training output file", fix="Restore it from the training run.")


def _int(value: Any) -> int | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_STEP
    return int(value) if ok else None


def _step_of(directory: Path) -> int:
    """N of a checkpoint-N directory, refused above MAX_STEP (one line naming the directory)."""
    digits = CHECKPOINT_DIR.match(directory.name).group(1)  # type: ignore[union-attr]
    if len(digits) > 10 or int(digits) > MAX_STEP:
        raise ImportInputError(
            f"{directory}: step {digits[:20]}{'...' if len(digits) > 20 else ''} is above {MAX_STEP:,} (no fine-tune "
            "runs that many steps); rename the directory to the step it was saved at."
        )
    return int(digits)


def trainer_summary(root: Path, checkpoints: list[Checkpoint], top_state: dict | None = None) -> dict[str, Any]:
    """What the trainer recorded (trainer_state.json of the directory, else of the last checkpoint; the last
    adapter's adapter_config.json): steps, epochs, batch size, learning rates, LoRA settings."""
    state = top_state
    if state is None:
        for ckpt in reversed(checkpoints):
            state = _trainer_state(ckpt.path)
            if state is not None:
                break
    out: dict[str, Any] = {"kinds": sorted({c.kind for c in checkpoints}), "steps": [c.step for c in checkpoints]}
    if state:
        for key in ("global_step", "max_steps", "num_train_epochs", "epoch", "train_batch_size", "save_steps"):
            value = state.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[key] = value
        history = state.get("log_history") if isinstance(state.get("log_history"), list) else []
        rates = [e["learning_rate"] for e in history if isinstance(e, dict) and _number(e.get("learning_rate"))]
        if rates:
            out["learning_rate"] = {"first": rates[0], "max": max(rates), "last": rates[-1]}
        losses = [e["loss"] for e in history if isinstance(e, dict) and _number(e.get("loss"))]
        if losses:
            out["train_loss_last"] = losses[-1]
    adapters = [c for c in checkpoints if c.kind == "lora"]
    if adapters:
        config = _read_json(adapters[-1].path / "adapter_config.json")
        if isinstance(config, dict):
            lora = {
                k: config.get(k)
                for k in (
                    "peft_type",
                    "r",
                    "lora_alpha",
                    "lora_dropout",
                    "target_modules",
                    "use_dora",
                    "use_rslora",
                    "base_model_name_or_path",
                )
                if k in config
            }
            out["adapter"] = json.loads(json.dumps(lora, default=str))
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors file's header alone (no tensor is read)."""
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ImportInputError(f"{path} is not a safetensors file (too short); restore it from the training run.")
        (size,) = struct.unpack("<Q", head)
        if size > 100 * 1024 * 1024:
            raise ImportInputError(f"{path} is not a safetensors file (header of {size} bytes).")
        try:
            header = parse_json(handle.read(size), f"the safetensors header of {path}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ImportInputError(f"{path} is not a safetensors file (unreadable header).") from None
    if not isinstance(header, dict):
        raise ImportInputError(f"{path} is not a safetensors file (unreadable header).")
    shapes = {k: v.get("shape", []) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
    for name, shape in shapes.items():
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise ImportInputError(
                f"{path} is not a safetensors file: the shape of tensor {name[:100]!r} is {str(shape)[:100]}, not a "
                "list of whole numbers; restore the file from the training run."
            )
    return {k: tuple(v) for k, v in shapes.items()}


def weight_shapes(checkpoint: Checkpoint) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of every weight file of a checkpoint (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name in checkpoint.files:
        if name.endswith(".safetensors"):
            shapes.update(safetensors_shapes(checkpoint.path / name))
    return shapes
