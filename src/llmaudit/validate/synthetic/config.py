"""The synthetic validation's configuration (a recipe, `key=value` overrides) and its names."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from llmaudit.config import (
    RecipeError,
    apply_overrides,
    format_validation_error,
    read_recipe_yaml,
    resolve_recipe_path,
    size_field,
)

QUANTIZER_NAMES = (
    "sign",
    "ternary-33",
    "ternary-50",
    "ternary-90",
    "uniform-2",
    "uniform-3",
    "uniform-4",
    "uniform-5",
)
"""The 8 simple quantizers of the synthetic validation, in the order of the tables."""

VARIANT_NAMES = ("converged", "train-loss", "perturbed", "reciprocal", "unquantized-bias")
"""r_Q variants investigated beside the published estimator (see `SyntheticConfig.variants`)."""


SYNTHETIC_WHY = (
    "the paper's protocol is 300 runs of 128 samples in R^128; sizes this large only exhaust memory and time"
)


class SyntheticConfigError(ValueError):
    """A recipe or override is invalid; the message names the key, the value and what is allowed."""


class SyntheticConfig(BaseModel):
    """Everything that defines the synthetic validation. YAML keys equal these field names."""

    model_config = ConfigDict(
        extra="forbid", use_attribute_docstrings=True, validate_assignment=True, allow_inf_nan=False
    )

    # data
    k_modes: list[int] = Field(default_factory=lambda: [6, 8, 16], max_length=64)
    """Numbers of mixture components (one data set per k_modes x sigma)."""
    sigmas: list[float] = Field(default_factory=lambda: [1.5, 2.0, 3.0], max_length=64)
    """Standard deviations of the isotropic mixture components."""
    dim: int = size_field(128, ge=2, le=65536, why=SYNTHETIC_WHY)
    """Input dimension (the paper: R^128)."""
    n_train: int = size_field(128, ge=2, le=1_000_000, why=SYNTHETIC_WHY)
    """Training samples per run (= members); as many fresh non-members are drawn for the MIS baseline."""
    n_val: int = size_field(1000, ge=2, le=1_000_000, why=SYNTHETIC_WHY)
    """Fresh validation points (one set per data set, shared by the runs) on which r_Q is computed."""
    n_runs: int = size_field(300, ge=5, le=100_000, why=SYNTHETIC_WHY)
    """Independent training runs per data set (the paper: k = 300)."""
    seed: int = 0
    """Master seed; every random draw is derived from it, the data set index and a purpose tag."""
    # classifier training
    lr: float = Field(1e-4, gt=0)
    """Adam learning rate of the classifiers (the paper: 1e-4)."""
    epochs: int = size_field(30, ge=2, le=10_000, why=SYNTHETIC_WHY)
    """Training epochs; one trajectory checkpoint after each (the paper: 30)."""
    batch_size: int = size_field(1, ge=1, le=1_000_000, why=SYNTHETIC_WHY)
    """Mini-batch size of the classifier training (not stated in the paper; must divide n_train)."""
    # quantization and r_Q
    quantizers: list[str] = Field(default_factory=lambda: list(QUANTIZER_NAMES))
    """Quantizers to compare (subset of the 8 simple ones)."""
    quantize_bias: bool = True
    """Quantize the bias vector too (per tensor, same rule). True keeps the quantized parameter set
    finite, as the theory assumes; False leaves the bias in full precision."""
    rq_first_epoch: int = Field(1, ge=0)
    """First epoch whose checkpoint enters r_Q (0 = the initialisation; published: 1..epochs)."""
    rq_loss_split: Literal["val", "train"] = "val"
    """Samples on which r_Q's per-sample losses are computed: the validation set (Algorithm 2) or the
    run's own training set."""
    rq_ddof: int = Field(1, ge=0, le=1)
    """Variance convention of sigma_k^2 (1 = unbiased, as llmaudit.indicator.r_q)."""
    # baseline MIS discriminator
    disc_hidden: int = size_field(256, ge=1, le=65536, why=SYNTHETIC_WHY)
    """Hidden width of the MIS discriminator (388 -> hidden -> 1, ReLU)."""
    disc_epochs: int = size_field(8, ge=1, le=10_000, why=SYNTHETIC_WHY)
    """Training epochs of the discriminator."""
    disc_lr: float = Field(1e-3, gt=0)
    """Adam learning rate of the discriminator."""
    disc_batch_size: int = size_field(256, ge=1, le=1_000_000, why=SYNTHETIC_WHY)
    """Mini-batch size of the discriminator."""
    disc_train_fraction: float = Field(0.8, gt=0, lt=1)
    """Fraction of the runs whose rows train the discriminator; the other runs' rows test it."""
    disc_dtype: Literal["float32", "bfloat16"] = "float32"
    """Matmul precision of the discriminator (bfloat16 autocast is slower than float32 on a CPU without bf16
    instructions)."""
    # comparison, stability and variants
    stability_k_runs: list[int] | None = Field(None, max_length=64)
    """Subsample sizes of the stability study (each in 2..n_runs); null = 5, 10, 15, 30, 50, 100, 150
    and n_runs, those <= n_runs."""
    stability_resamples: int = size_field(20, ge=1, le=100_000, why=SYNTHETIC_WHY)
    """Random subsamples per size for the r_Q stability curve (cheap)."""
    stability_mis_resamples: int = size_field(1, ge=0, le=10_000, why=SYNTHETIC_WHY)
    """Random subsamples per size for the MIS stability curve (each retrains the discriminators; 0 = skip)."""
    n_boot: int = size_field(1000, ge=10, le=100_000, why=SYNTHETIC_WHY)
    """Bootstrap resamples for confidence intervals and the spread of Spearman's rho."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Confidence level of the intervals."""
    variants: list[str] = Field(default_factory=lambda: list(VARIANT_NAMES))
    """Labelled r_Q variants computed beside the published estimator (never replacing it)."""
    converged_from_epoch: int = Field(21, ge=0)
    """Variant "converged": only checkpoints from this epoch on enter r_Q."""
    perturb_scale: float = Field(0.1, gt=0)
    """Variant "perturbed": noise std, relative to the RMS of each final parameter tensor."""
    perturb_points: int = size_field(30, ge=2, le=10_000, why=SYNTHETIC_WHY)
    """Variant "perturbed": number of perturbed copies of the final parameters (plus the final point)."""
    plots: bool = True
    """Write the PNG plots."""
    threads: int = size_field(0, ge=0, le=4096, why="more threads than any machine's cores")
    """torch intra-op threads (0 = leave torch's default)."""

    @field_validator("quantizers")
    @classmethod
    def _known_quantizers(cls, v: list[str]) -> list[str]:
        bad = [q for q in v if q not in QUANTIZER_NAMES]
        if bad:
            raise ValueError(f"unknown quantizer(s) {bad}; allowed: {list(QUANTIZER_NAMES)}")
        if len(set(v)) != len(v) or len(v) < 2:
            raise ValueError("need at least 2 distinct quantizers to compare rankings")
        return v

    @field_validator("variants")
    @classmethod
    def _known_variants(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if x not in VARIANT_NAMES]
        if bad:
            raise ValueError(f"unknown variant(s) {bad}; allowed: {list(VARIANT_NAMES)}")
        return v

    @field_validator("k_modes")
    @classmethod
    def _k_modes_ok(cls, v: list[int]) -> list[int]:
        if not v or any(k < 2 for k in v):
            raise ValueError("k_modes must be a non-empty list of integers >= 2 (both labels must occur)")
        return v

    @field_validator("sigmas")
    @classmethod
    def _sigmas_ok(cls, v: list[float]) -> list[float]:
        if not v or any(not s > 0 for s in v):
            raise ValueError("sigmas must be a non-empty list of positive numbers")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> SyntheticConfig:
        cells = self.n_runs * max(self.n_train, self.n_val) * self.dim
        if cells > 10**9:
            raise ValueError(
                f"n_runs x max(n_train, n_val) x dim = {cells:,} values is above 10^9: every run's data is held at "
                "once (4 GB per 10^9 values); lower n_runs, the sample counts or dim"
            )
        if self.n_train % self.batch_size:
            raise ValueError(f"batch_size={self.batch_size} must divide n_train={self.n_train}")
        if self.rq_first_epoch > self.epochs - 1:
            raise ValueError(
                f"rq_first_epoch={self.rq_first_epoch} leaves fewer than 2 checkpoints (epochs={self.epochs})"
            )
        if self.converged_from_epoch > self.epochs - 1:
            raise ValueError(
                f"converged_from_epoch={self.converged_from_epoch} must be <= epochs - 1 = {self.epochs - 1}"
            )
        if self.stability_k_runs is None:
            grid = [k for k in (5, 10, 15, 30, 50, 100, 150) if k < self.n_runs] + [self.n_runs]
            object.__setattr__(self, "stability_k_runs", grid)
        bad = [k for k in self.stability_k_runs if not 2 <= k <= self.n_runs]
        if bad:
            raise ValueError(f"stability_k_runs {bad} outside 2..n_runs={self.n_runs}")
        return self


def load_config(recipe: Path | str | None = None, overrides: Sequence[str] = ()) -> SyntheticConfig:
    """Defaults <- recipe YAML (keys = field names) <- `key=value` overrides (values parsed as YAML).

    Recipe lookup and override parsing are llmaudit.config's, shared with the audit recipes."""

    raw: dict[str, Any] = {}
    source = "(defaults)"
    try:
        if recipe is not None:
            path = resolve_recipe_path(recipe)
            raw = read_recipe_yaml(path)
            source = str(path)
        raw = apply_overrides(raw, list(overrides))
    except RecipeError as exc:
        raise SyntheticConfigError(str(exc)) from None
    try:
        return SyntheticConfig.model_validate(raw)
    except ValidationError as exc:
        raise SyntheticConfigError(
            format_validation_error(exc, source, what="synthetic-validation config", model=SyntheticConfig)
        ) from None
