"""A command's arguments, checked before the command imports its work: the target (a recipe or a run
directory) and its `key=value` overrides.

Nothing here imports torch, transformers or the analysis, so that an argument error answers at once with exit
code 2 (tests/test_first_minutes.py); the checks that need the registries or the store's content follow in
`planning.targets` when the command runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from llmaudit.common.errors import UserError, did_you_mean
from llmaudit.config import load_recipe
from llmaudit.store.manifest import no_manifest

MANIFEST_NAME = "manifest.json"
"""The file that makes a directory a run directory (`store.run_store.RunStore.manifest_path`)."""


GPU_BF16_PEAK = {"h100": 989e12, "h200": 989e12, "a100": 312e12, "l40s": 362e12, "a6000": 155e12}
"""Published dense bf16 tensor-core peaks in FLOP/s (NVIDIA data sheets; SXM parts for H100/H200/A100)."""


def check_device(device: str) -> str:
    """Refuse a `--device` that `llmaudit plan` cannot price, before any work is imported.

    Args:
        device: auto, cpu or cuda (measured here), or a GPU of `GPU_BF16_PEAK` (priced from its peak).

    Returns:
        The device name in lower case.

    Raises:
        UserError: an unknown device (with the closest name).
    """
    devices = ("auto", "cpu", "cuda", *GPU_BF16_PEAK)
    if device.lower() not in devices:
        raise UserError(
            f"--device {device!r} is not known{did_you_mean(device.lower(), devices)}: use auto, cpu or cuda "
            f"(measured here) or a GPU whose published peak prices the plan: {', '.join(GPU_BF16_PEAK)}"
        )
    return device.lower()


def is_run_dir(target: str | Path | None) -> bool:
    """Whether a command's target is a run directory (a directory with a manifest.json), not a recipe.

    Args:
        target: the command's first argument, or None.

    Returns:
        True when `target` is a directory holding a manifest.json.
    """
    return bool(target) and Path(target).is_dir() and (Path(target) / MANIFEST_NAME).exists()


def split_recipe_args(args: list[str]) -> tuple[str | None, list[str]]:
    """A command's arguments as its target and its overrides.

    Args:
        args: the positional arguments; the first is a recipe (or run directory) unless it looks like key=value.

    Returns:
        (the target or None, the key=value overrides).
    """
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def require_target(target: str | None, command: str) -> str:
    """The target of a command that never guesses one (`llmaudit score`: never silently the demo's store).

    Args:
        target: the command's target, or None when none was given.
        command: the command's name, for the message.

    Returns:
        `target`.

    Raises:
        UserError: no target was given.
    """
    if target is None:
        raise UserError(
            f"llmaudit {command} needs a target: a run directory (llmaudit {command} llmaudit-out/NAME) or a "
            f"recipe (llmaudit {command} demo-cpu), then key=value overrides"
        )
    return target


def check_run_dir(run_dir: str | Path) -> Path:
    """A run directory as given on the command line, refused when it holds no manifest.json.

    Args:
        run_dir: the directory a command reads (`llmaudit report`, `llmaudit status`).

    Returns:
        `run_dir` as a Path.

    Raises:
        StoreError: no manifest.json (not even a link) is there.
    """
    path = Path(run_dir)
    if not os.path.lexists(path / MANIFEST_NAME):  # a link is the store's own check to refuse, with its reason
        raise no_manifest(path)
    return path


def check_target(target: str | None, overrides: list[str]) -> None:
    """A recipe target and its overrides parsed as the recipe loader reads them (a run directory is left to the
    store's checks).

    The attack names are checked later, with the attack registry (`planning.targets.config_from_recipe`).

    Args:
        target: a recipe (shipped name or YAML file), a run directory, or None (the default recipe).
        overrides: the key=value overrides.

    Raises:
        RecipeError: the recipe is not found, is not valid YAML, or an override or a value is refused.
    """
    if not is_run_dir(target):
        load_recipe(target, overrides)
