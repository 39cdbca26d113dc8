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


def size_field(default: Any, *, ge: int, le: int, why: str) -> Any:
    """A size field: at least `ge`, at most `le`; `why` is printed with a value above the bound (every size in a
    recipe has one, so that an absurd value is refused before it allocates anything)."""
    return Field(default, ge=ge, le=le, json_schema_extra={UPPER_BOUND_WHY: why})


class RecipeError(UserError):
    """A recipe (or an override) is invalid. The message names the key, the value and the fix."""


class Section(BaseModel):
    """A config section: unknown keys refused, assignments and defaults validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True, protected_namespaces=())
