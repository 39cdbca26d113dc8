"""Which files of a checkpoint can change a number, their recorded sha256 digests, and the check of a
checkpoint directory against its record.

A checkpoint's numbers come from more than its weights: a LoRA adapter's `adapter_config.json` holds its
scaling (`lora_alpha`, `r`: doubling alpha doubles the update), a full checkpoint's `config.json` its
architecture, and tokenizer files (where a checkpoint carries them) its tokens. Every such file
(`number_files`) is recorded with its sha256 when the checkpoint is written (`llmaudit finetune`: the run's
DONE.json; `llmaudit import`: the manifest) and checked whenever the store is verified or the checkpoint is
loaded (`check_digests`): the files must match, and none may have been added since (an adapter dropped into a
full checkpoint's directory would be loaded instead of it).

Records without these digests (llmaudit 0.2's DONE.json with `adapter_sha256` only; imports without the
tokenizer files) are checked as far as they go, and `legacy_files` names what they leave uncovered, so that
`llmaudit status` and `llmaudit report` can say so; a record carrying `DIGEST_SCOPE` covers everything.
"""

from __future__ import annotations

import re
from pathlib import Path

from llmaudit.common.errors import UserError
from llmaudit.common.io import file_digest

DIGEST_SCOPE = "number-files-1"
"""Marks a checkpoint record that covers every file of `number_files` (DONE.json's and an imported entry's
`digest_scope`)."""

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")
MODEL_SHARD = re.compile(r"^model-\d+-of-\d+\.safetensors$")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
PICKLED_WEIGHTS = re.compile(r"^(adapter_model|pytorch_model|model)(-\d+-of-\d+)?\.(bin|pt|pth|ckpt)$")
"""Model or adapter weights a loader would unpickle: never loaded, and a checkpoint that holds them is refused."""
LEGACY_UNRECORDED = ("adapter_config.json", *TOKENIZER_FILES)
"""Files an older record never held: accepted unrecorded in such a record (and named by `legacy_files`)."""

ALWAYS_READ_BYTES = 2**20
"""Recorded files up to this size (configs, most tokenizer files) are re-digested on every verification;
larger ones (weights, a big tokenizer.json) when the checkpoint is loaded or a deep check asks for them."""


def is_number_file(name: object) -> bool:
    """Whether `name` is the name of a file that can change a checkpoint's numbers (never a path)."""
    return isinstance(name, str) and (
        name in {*ADAPTER_FILES, *MODEL_FILES, *TOKENIZER_FILES} or bool(MODEL_SHARD.match(name))
    )


def number_files(directory: Path) -> list[str]:
    """The names of the files in `directory` whose content can change a number: adapter and model weights and
    configurations, and tokenizer files."""
    return sorted(p.name for p in directory.iterdir() if is_number_file(p.name) and p.is_file())


def parse_record(files: object, where: str) -> dict[str, str]:
    """A recorded {name: sha256} checked as data: every name a checkpoint file's (never a path, so a record cannot
    send a digest outside the checkpoint), every digest 64 hex characters. ValueError naming `where`."""
    if not isinstance(files, dict):
        raise UserError(f"{where}: the recorded checkpoint files are not a mapping of names to sha256 digests")
    for name, digest in files.items():
        if not is_number_file(name) or not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
            raise UserError(f"{where}: recorded file {str(name)[:80]!r} is not a checkpoint file with a sha256 digest")
    return dict(files)


def record_digests(directory: Path) -> dict[str, str]:
    """{name: sha256} of every file of `number_files(directory)`: a checkpoint's record."""
    return {name: file_digest(directory / name) for name in number_files(directory)}


def check_digests(directory: Path, recorded: dict[str, str], *, complete: bool, deep: bool) -> str | None:
    """Why the checkpoint in `directory` no longer is the one recorded, or None.

    Every recorded file must exist and match its digest (those over ALWAYS_READ_BYTES only when `deep`); a
    `complete` record (DIGEST_SCOPE) must also name every file of `number_files` present, an older one every
    such file but those in LEGACY_UNRECORDED."""
    for name, digest in recorded.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if (deep or path.stat().st_size <= ALWAYS_READ_BYTES) and file_digest(path) != digest:
            return f"{name} changed since it was recorded (sha256 differs)"
    added = [n for n in number_files(directory) if n not in recorded and (complete or n not in LEGACY_UNRECORDED)]
    if added:
        return (
            f"{added[0]} is in the checkpoint but not among its recorded digests: a file that changes the model "
            "was added after the checkpoint was recorded"
        )
    return None


def legacy_files(directory: Path, recorded: dict[str, str]) -> list[str]:
    """The files of `number_files(directory)` an older record leaves without a digest."""
    if not directory.is_dir():
        return []
    return [n for n in number_files(directory) if n not in recorded]
