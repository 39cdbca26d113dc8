"""What a command works on: a recipe (the user's own: it may allow remote code) or a run directory
(data from anywhere: it never may, unless the command line says so), plus `key=value` overrides.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from llmaudit.analyze.attacks.registry import registered_attacks
from llmaudit.common.errors import did_you_mean
from llmaudit.common.runtime import configure_threads
from llmaudit.config import (
    FULL_PLACEHOLDER,
    ExperimentConfig,
    RecipeError,
    apply_overrides,
    config_from_dict,
    load_recipe,
)
from llmaudit.models.builtin import is_builtin
from llmaudit.planning.arguments import is_run_dir
from llmaudit.quantize import QUANTIZER_NAMES, QuantizationError, get_quantizer, missing_reference
from llmaudit.store.run_store import RunStore

log = logging.getLogger(__name__)


def check_quantizer_requests(cfg: ExperimentConfig, overrides: list[str], scored: list[str] | None = None) -> None:
    """Every quantizer name and its options as the registry allows them, when the recipe loads (before any training).

    Refused: an unknown name (with the closest one), an option a quantizer does not have or a value it does not
    support (bits, group sizes), options for a name that is no quantizer, options given on the command line for a
    quantizer that is not in score.quantizers (a recipe's options for quantizers left out are kept unused), and a
    grid without a full-precision reference among its quantizers and the store's `scored` ones. What needs the
    model's layers (a group size that divides them) is checked before the first unit is scored.

    Args:
        cfg: the loaded config.
        overrides: the command line's key=value overrides.
        scored: the quantizers the store already holds, or None.

    Raises:
        RecipeError: the first request refused, with its key and the fix.
    """
    missing = missing_reference([*cfg.score.quantizers, *(scored or [])])
    if missing:
        raise RecipeError(missing)
    names = [q for q in cfg.score.quantizers if q != FULL_PLACEHOLDER]
    _check_names("score.if_available", cfg.score.if_available)
    for name in names:
        if name not in QUANTIZER_NAMES:
            raise RecipeError(
                f"score.quantizers: unknown quantizer {name!r}{did_you_mean(name, QUANTIZER_NAMES)}; allowed: "
                f"{', '.join(QUANTIZER_NAMES)}, full (`llmaudit quantizers` says which can run here)"
            )
        try:
            get_quantizer(name, **cfg.score.quantizer_options.get(name, {}))
        except QuantizationError as exc:
            raise RecipeError(f"score.quantizer_options.{name}: {exc}") from None
    given = {o.split("=", 1)[0].strip() for o in overrides}
    for name in cfg.score.quantizer_options:
        on_command_line = given & {"score", "score.quantizer_options", f"score.quantizer_options.{name}"}
        if name not in cfg.score.quantizers and (name not in QUANTIZER_NAMES or on_command_line):
            raise RecipeError(
                f"score.quantizer_options has options for {name!r}{did_you_mean(name, names)}, which is not in "
                f"score.quantizers {cfg.score.quantizers}: add it there or remove its options"
            )


def _check_names(key: str, names: list[str]) -> None:
    for name in names:
        if name not in QUANTIZER_NAMES:
            raise RecipeError(
                f"{key}: unknown quantizer {name!r}{did_you_mean(name, QUANTIZER_NAMES)}; allowed: "
                f"{', '.join(QUANTIZER_NAMES)}"
            )


def with_available(cfg: ExperimentConfig) -> tuple[ExperimentConfig, dict[str, str]]:
    """The config with every quantizer of score.if_available that can run here added to score.quantizers.

    Args:
        cfg: the loaded config.

    Returns:
        (the config, {name: why not} for the quantizers left out; the report says so: `left_out_quantizers`).

    Raises:
        RecipeError: an unknown name (with the closest one).
    """
    _check_names("score.if_available", cfg.score.if_available)
    add, left = [], {}
    for name in cfg.score.if_available:
        why = get_quantizer(name).availability()
        if why is None:
            add.append(name)
        else:
            left[name] = why
    names = list(dict.fromkeys([*cfg.score.quantizers, *add]))
    return cfg.model_copy(update={"score": cfg.score.model_copy(update={"quantizers": names})}), left


def _scored(store: RunStore) -> list[str] | None:
    """The quantizers a store holds, for the reference check; None where there is no store or its manifest cannot
    say (the store's verification refuses such a store with its own reason)."""
    if not store.exists():
        return None
    try:
        return [str(q) for q in store.scored_quantizers()]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def config_from_recipe(recipe: str | None, overrides: list[str], out: Path | None = None) -> ExperimentConfig:
    """A recipe with its overrides, checked against the registries; sets this process's CPU threads.

    Args:
        recipe: a shipped recipe's name, a YAML file, or None (the default recipe).
        overrides: key=value overrides.
        out: replaces the recipe's output_dir, or None.

    Returns:
        The config.

    Raises:
        RecipeError: the recipe, an override or a quantizer request is refused.
    """
    cfg, left = with_available(load_recipe(recipe, overrides, attack_names=registered_attacks()))
    for name, why in left.items():
        log.warning("score.if_available: %s is left out on this machine: %s", name, why)
    if out is not None:
        cfg = cfg.model_copy(update={"output_dir": str(out)})
    check_quantizer_requests(cfg, overrides, _scored(RunStore(cfg.resolved_output_dir())))
    configure_threads(is_builtin(cfg.model))
    return cfg


def config_from_run_dir(
    run_dir: str | Path, overrides: list[str], *, trust_remote_code: bool = False
) -> ExperimentConfig:
    """The run directory's recorded config plus overrides.

    `model.trust_remote_code` comes from the command line only (the flag, or an explicit
    `model.trust_remote_code=true` override), never from the manifest, and so does the whole cluster section
    (`RunStore.config`: a received manifest cannot write a batch script).

    Args:
        run_dir: the run directory.
        overrides: key=value overrides.
        trust_remote_code: the command line's --trust-remote-code.

    Returns:
        The config, its output_dir the run directory.

    Raises:
        StoreError: the directory is not a run store or its manifest is refused.
        RecipeError: an override or a quantizer request is refused.
    """
    store = RunStore(run_dir)
    raw = json.loads(store.config(trust_remote_code=trust_remote_code).model_dump_json())
    raw = apply_overrides(raw, overrides)
    raw["output_dir"] = str(Path(run_dir))
    cfg = config_from_dict(
        raw,
        source=f"{store.manifest_path} + command-line overrides",
        overrides=overrides,
        attack_names=registered_attacks(),
        received=True,
    )
    check_quantizer_requests(cfg, overrides, _scored(store))
    configure_threads(is_builtin(cfg.model))
    return cfg


def resolve_target(
    target: str | None, overrides: list[str], out: Path | None = None, *, trust_remote_code: bool = False
) -> tuple[ExperimentConfig, RunStore]:
    """The config and the store of a run directory or a recipe.

    A recipe's store must hold the same experiment (checked when the stage touches it: a different model, data or
    training is refused).

    Args:
        target: a run directory, a recipe, or None (the default recipe).
        overrides: key=value overrides.
        out: a recipe's output directory instead of its output_dir, or None.
        trust_remote_code: the command line's --trust-remote-code.

    Returns:
        (config, store).

    Raises:
        StoreError: a run directory is refused.
        RecipeError: the recipe, an override or a quantizer request is refused.
    """
    if is_run_dir(target):
        return config_from_run_dir(target, overrides, trust_remote_code=trust_remote_code), RunStore(target)
    cfg = config_from_recipe(target, overrides, out)
    if trust_remote_code:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"trust_remote_code": True})})
    return cfg, RunStore(cfg.resolved_output_dir())
