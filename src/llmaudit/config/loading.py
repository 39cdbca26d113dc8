"""Recipes from YAML files and `key=value` overrides, and their validation errors in one line per key (the key,
the value, what is allowed, and whether the command line gave it)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from llmaudit.common.bounded import MAX_YAML_BYTES, InputLimitError, check_file, load_yaml
from llmaudit.common.errors import did_you_mean
from llmaudit.config.fields import (
    DEMO_RECIPE,
    RECEIVED,
    RECIPE_DIR,
    SETS_FOLLOW_QUANTIZERS,
    UPPER_BOUND_WHY,
    RecipeError,
)
from llmaudit.config.sections import (
    ATTACK_NAMES,
    ExperimentConfig,
)


def _field_of(model: type[BaseModel], loc: tuple) -> Any:
    """The pydantic FieldInfo of the key at `loc` (None when `loc` does not name a config field)."""
    cls, field = model, None
    for part in loc:
        field = cls.model_fields.get(str(part)) if cls is not None else None
        if field is None:
            return None
        annotation = field.annotation
        cls = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return field


def _bound_reason(model: type[BaseModel], loc: tuple) -> str:
    field = _field_of(model, loc)
    extra = getattr(field, "json_schema_extra", None)
    return f" ({extra[UPPER_BOUND_WHY]})" if isinstance(extra, dict) and UPPER_BOUND_WHY in extra else ""


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str] | None:
    """The field names of the section that holds the key at `loc` (None when it is not a config section)."""
    cls = model
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        cls = annotation
    return sorted(cls.model_fields)


def _override_of(loc: tuple, overrides: list[str]) -> str | None:
    """The command-line override (the last one) that set the key at `loc`, a section above it or a key below it."""
    dotted = ".".join(str(p) for p in loc) + "."
    keys = [(o, o.split("=", 1)[0].strip() + ".") for o in overrides if "=" in o]
    hits = [o for o, key in keys if dotted.startswith(key) or key.startswith(dotted)]
    return hits[-1] if hits else None


def _problem(err: Any, model: type[BaseModel], overrides: list[str]) -> tuple[str, bool]:
    """One invalid key in words, and whether a command-line override gave it."""
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, tuple(err["loc"]))
        hint = did_you_mean(err["loc"][-1], allowed or [])
        msg = f"unknown key{hint or ' (check the spelling)'}" + (f"; allowed here: {allowed}" if allowed else "")
    elif err["type"] == "less_than_equal":
        msg += _bound_reason(model, tuple(err["loc"]))
    override = _override_of(tuple(err["loc"]), overrides)
    if override is not None:
        written = override.split("=", 1)[1]
        msg += f" (from the command line: {override!r})"
        if err["type"] == "list_type" and not written.strip().startswith("["):
            msg += f"; a list is written {key}='[{written.strip()}]' (quoted for the shell)"
    if isinstance(err.get("input"), dict) and err["type"] == "value_error":  # a whole section's rule
        return f"{key}: {msg}", override is not None
    value = repr(err.get("input"))
    if len(value) > 200:  # a hostile value is shown in part: the message stays one readable line
        value = value[:200] + f"... ({len(value):,} characters)"
    return f"{key} = {value}: {msg}", override is not None


def format_validation_error(
    exc: ValidationError,
    source: str,
    *,
    what: str = "recipe",
    model: type[BaseModel] | None = None,
    overrides: list[str] | None = None,
) -> str:
    """One line per invalid key: the dotted key, the value given and what is allowed (for an unknown
    key, the keys its section allows, and the closest one); a key a command-line override set says so."""
    found = [_problem(err, model or ExperimentConfig, overrides or []) for err in exc.errors()]
    problems = [text for text, _ in found]
    if all(from_command_line for _, from_command_line in found):
        return "invalid command-line override: " + "; ".join(problems)
    return f"invalid {what} {source}: " + "; ".join(problems)


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise RecipeError(f"override {text!r} is not of the form key=value (e.g. train.epochs=3)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise RecipeError(f"override {text!r} has an empty key")
    try:
        value = load_yaml(raw, f"override {key}") if raw.strip() else None
    except yaml.YAMLError as exc:
        raise RecipeError(f"override {text!r}: value is not valid YAML ({' '.join(str(exc).split())})") from None
    except InputLimitError as exc:
        raise RecipeError(str(exc)) from None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    raw = json.loads(json.dumps(raw))  # deep copy of plain data
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RecipeError(f"override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return raw


def resolve_recipe_path(recipe: str | Path | None) -> Path:
    """A path to a YAML file, or the name of a shipped recipe (`demo-cpu`, `qwen2.5-0.5b-smolinstruct`)."""
    if recipe is None:
        recipe = DEMO_RECIPE
    path = Path(recipe)
    if path.is_file():
        return path
    name = str(recipe)
    if "/" not in name and os.sep not in name:
        for candidate in (name, name.removesuffix(".yaml").removesuffix(".yml")):
            shipped = RECIPE_DIR / f"{candidate}.yaml"
            if shipped.is_file():
                return shipped
    available = sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))
    raise RecipeError(
        f"recipe {recipe!s} not found{did_you_mean(recipe, available)}: pass a YAML file or one of the shipped "
        f"recipes {available}."
    )


def read_recipe_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a recipe file (keys = config field names)."""
    try:
        check_file(path, limit=MAX_YAML_BYTES, what="recipe")
        raw = load_yaml(path.read_text(encoding="utf-8"), f"recipe {path}") or {}
    except yaml.YAMLError as exc:
        raise RecipeError(f"recipe {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    except UnicodeDecodeError:
        raise RecipeError(f"recipe {path} is not UTF-8 text; pass a YAML file.") from None
    except InputLimitError as exc:
        raise RecipeError(str(exc)) from None
    if not isinstance(raw, dict):
        raise RecipeError(f"recipe {path} must be a mapping of keys to values (sections: model, data, train, ...)")
    return raw


def load_recipe(
    recipe: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    attack_names: tuple[str, ...] | None = None,
) -> ExperimentConfig:
    path = resolve_recipe_path(recipe)
    raw = apply_overrides(read_recipe_yaml(path), overrides or [])
    return config_from_dict(raw, source=str(path), overrides=overrides, attack_names=attack_names)


def config_from_dict(
    raw: dict[str, Any],
    source: str = "(dict)",
    *,
    overrides: list[str] | None = None,
    attack_names: tuple[str, ...] | None = None,
    received: bool = False,
) -> ExperimentConfig:
    """The validated config; `overrides`: the command-line key=value pairs applied to `raw` (named in an error);
    `attack_names`: the registered attacks, which `attack.attacks` must name (unchecked without them); `received`:
    `raw` is a run directory's recorded config (`fields.RECEIVED`: the runner's settings may still be missing)."""
    context: dict[str, Any] = {} if attack_names is None else {ATTACK_NAMES: tuple(attack_names)}
    if received:
        context[RECEIVED] = True
    given = {o.split("=", 1)[0].strip() for o in overrides or []}
    if given & {"score", "score.quantizers"} and not given & {"report", "report.release_sets"}:
        context[SETS_FOLLOW_QUANTIZERS] = True
    try:
        return ExperimentConfig.model_validate(raw, context=context or None)
    except ValidationError as exc:
        raise RecipeError(format_validation_error(exc, source, overrides=overrides)) from None


def dump_config(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
