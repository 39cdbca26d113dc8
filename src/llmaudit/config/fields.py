"""The bounds every recipe size obeys (with the reason printed beside a refusal), the shipped recipes' place,
and the base of every config section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from llmaudit.common.errors import UserError

DEFAULT_TASKS = ("molecule_captioning", "molecule_generation")

ALL_TASKS = (
    "forward_synthesis",
    "retrosynthesis",
    "molecule_captioning",
    "molecule_generation",
    "name_conversion-i2f",
    "name_conversion-i2s",
    "name_conversion-s2f",
    "name_conversion-s2i",
    "property_prediction-esol",
    "property_prediction-lipo",
    "property_prediction-bbbp",
    "property_prediction-clintox",
    "property_prediction-hiv",
    "property_prediction-sider",
)

RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes"

DEMO_RECIPE = "demo-cpu"

FULL_PLACEHOLDER = "full"
"""In score.quantizers: the full-precision reference of the store's compute dtype, named bf16, fp32 or fp16 once the
store is known (ScoreConfig.with_reference)."""


MAX_RUNS = 1024
MAX_POOL = 1_000_000
MAX_MASK_CELLS = 50_000_000
MAX_QUANTIZERS = 128
RUNS_WHY = (
    "each run is a complete fine-tune scored with every quantizer; 1,024 runs is 50x the paper's 20, far beyond "
    "what offline LiRA needs"
)
POOL_WHY = (
    "every sample is scored at every run's final checkpoint with every quantizer; a million is 50x the paper's pool"
)
CHECKPOINTS_WHY = "every checkpoint is scored with every quantizer; at most 10,000 checkpoints per run are planned"
MEMORY_WHY = "a batch's activations grow with it: larger values only exhaust the device's memory"
CORES_WHY = "one per core is the most that helps"
NODE_WHY = "more than any cluster node offers"
SHARDS_WHY = "each shard is one array task; a SLURM array of more tasks is refused by the scheduler"
BUILTIN_WHY = (
    "the built-in model is a tiny CPU model for demos and tests; for a larger one set model.name to a real model"
)
UPPER_BOUND_WHY = "upper_bound_why"

RUNNER_SETTINGS: dict[str, tuple[str, ...]] = {
    "model": ("trust_remote_code",),
    "train": ("device", "token_budget", "processes"),
    "score": ("device", "token_budget", "head_chunk", "cpu_workers", "processes", "calibration_file"),
    "report": ("processes",),
}
"""Settings that belong to whoever runs a command, never to a run directory: what may run (remote code), where and
how much runs on this machine (devices, batch sizes, processes, threads) and which file outside the store is read
(the calibration text). A store records them for reference; reading its config gives the defaults in their place,
and the runner's command line sets them (`without_runner_settings`). The whole `cluster` section and `output_dir`
are the runner's too. Everything else a store's config holds (the experiment's identity, what is scored, attacked
and judged) is covered by the manifest's digest (docs/security.md, "What a run directory decides")."""
RUNNER_SECTIONS = ("cluster",)
RECEIVED = "received"
SETS_FOLLOW_QUANTIZERS = "sets_follow_quantizers"
"""Validation context key: score.quantizers was given on the command line and report.release_sets was not, so a
recipe's release set naming a quantizer the command line leaves out is dropped rather than refused."""
"""Validation-context key: the config is read from a run directory (`config_from_dict(..., received=True)`), so
settings the runner supplies (the calibration file) may be absent until the command that needs them."""


def without_runner_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of a recorded config (plain data) without the settings that belong to whoever runs a command
    (`RUNNER_SETTINGS`, the `cluster` section, `output_dir`): what a run directory may decide."""
    out = {k: v for k, v in raw.items() if k not in (*RUNNER_SECTIONS, "output_dir")}
    for section, keys in RUNNER_SETTINGS.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return out


def size_field(default: Any, *, ge: int, le: int, why: str) -> Any:
    """A size field: at least `ge`, at most `le`; `why` is printed with a value above the bound (every size in a
    recipe has one, so that an absurd value is refused before it allocates anything)."""
    return Field(default, ge=ge, le=le, json_schema_extra={UPPER_BOUND_WHY: why})


class RecipeError(UserError):
    """A recipe (or an override) is invalid. The message names the key, the value and the fix."""


class RecipeSection(BaseModel):
    """The base of a recipe's sections (model, data, train, ...): unknown keys refused, assignments and defaults
    validated, every float finite (NaN and +-inf are refused when the recipe, an override or a store's recorded
    config loads: a limit of inf would disable a criterion, a learning rate of inf trains to NaN, and JSON cannot
    write either back)."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        validate_default=True,
        protected_namespaces=(),
        allow_inf_nan=False,
    )
