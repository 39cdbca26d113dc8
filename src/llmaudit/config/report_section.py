"""The report section of a recipe: the release checklist's limits, the decision's error rates and resamples, the
files published together, and how the report stage runs; each field documented where it is declared."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from llmaudit.config.fields import CORES_WHY, MAX_QUANTIZERS, MAX_RUNS, RUNS_WHY, RecipeSection, size_field
from llmaudit.config.release_sets import MAX_SETS, check_set_shapes

UTILITY_METRICS = (
    "loss",
    "kl",
    "same_top",
    "smiles_exact_match",
    "smiles_validity",
    "smiles_tanimoto",
    "caption_bleu2",
    "caption_bleu4",
    "caption_rouge_l",
    "text_exact_match",
    "text_rouge_l",
)
"""Values of report.utility_metric: the validation-loss ratio, the divergence from full precision, a task metric."""


class ReportConfig(RecipeSection):
    """Release checklist thresholds, and how the report stage runs."""

    processes: int | None = size_field(None, ge=1, le=256, why=CORES_WHY)
    """Worker processes that attack the quantizers, one quantizer each at a time (null: this machine's cores, at most
    one per quantizer). The numbers do not depend on it."""

    max_tpr_at_1pct_fpr: float = Field(0.05, ge=0, le=1)
    """Criterion: the best attack's TPR at 1% FPR must stay below this."""
    min_r_q: float = Field(0.0, ge=0)
    """Criterion: r_Q must be at least this (0 disables)."""
    max_utility_loss: float = Field(0.10, ge=0)
    """Criterion (utility_metric = loss): relative increase of validation loss vs full precision must stay below this."""
    utility_metric: Literal[UTILITY_METRICS] = "loss"  # type: ignore[valid-type]
    """What the checklist's utility criterion judges (docs/science.md section 11): loss = the relative increase
    of validation loss (limit max_utility_loss); kl = mean KL(p_ref || p_q) per validation token in nats, at most
    utility_limit (default 0.05); same_top = the share of validation tokens whose most likely next token agrees
    with full precision, at least utility_limit (default 0.9); a task metric (smiles_exact_match,
    smiles_validity, smiles_tanimoto, caption_bleu2, caption_bleu4, caption_rouge_l, text_exact_match,
    text_rouge_l) = its drop below full precision (reference - quantizer, paired by run) at most utility_limit
    (default 0.05). Every one is a mean over runs judged on its 95% bootstrap interval."""
    utility_limit: float | None = Field(None, ge=0, le=1000)
    """The limit of utility_metric in its own unit (see there); null = that metric's default. Unused for loss."""
    indicator: str = "gap_std_final"
    """The candidate attack-free indicator shown beside the published r_Q (docs/science.md section 8)."""
    min_indicator: float | None = None
    """Criterion on that indicator (higher = more secure), applied only when the indicator passed its
    validation; None disables it."""
    min_runs: int = size_field(5, ge=1, le=MAX_RUNS, why=RUNS_WHY)
    """A criterion that needs several fine-tuning runs (r_Q, the indicator, utility intervals over runs) is NOT
    MEASURED with fewer runs than this. The attack criterion judges stores with at least this many runs (and at
    least 2) on per-sample calibrated scores, and stores with fewer (one imported fine-tune) on each run's own
    held-out non-members with an empirical threshold (docs/science.md section 12)."""
    alpha: float = Field(0.05, gt=0, le=0.2)
    """One-sided error rate of every release decision (docs/science.md section 12): a false FAIL, a false PASS, a
    false "leaks more / less / the same as full precision" each have probability at most alpha."""
    equivalence_margin: float = Field(0.01, ge=0, le=0.5)
    """A quantizer "leaks the same" as full precision when every judged attack's paired difference of TPR at 1% FPR
    lies within +-margin (two one-sided tests per attack, intersection-union). Default 0.01: a change below the FPR level itself is a change
    the evaluation at 1% FPR does not resolve (an attack at chance has TPR 0.01)."""
    selection_folds: int = size_field(
        5, ge=2, le=100, why="each fold must hold enough targets or samples to measure an attack on it"
    )
    """Cross-fitting folds: the strongest attack is chosen on the other folds and measured on each (folds of target
    models; of samples with fewer than min_runs runs)."""
    decision_resamples: int = size_field(
        1000, ge=100, le=100_000, why="bounds from the bootstrap's variance settle within a few thousand resamples"
    )
    """Bootstrap resamples of samples behind every bound of the release decision and the paired comparisons."""
    release_sets: Annotated[
        list[Annotated[list[str], Field(max_length=MAX_QUANTIZERS)]], AfterValidator(check_set_shapes)
    ] = Field(default_factory=list, max_length=MAX_SETS)
    """Files published together, each set judged as one release and compared with its best single file, e.g.
    [[bf16, gguf-q4_k_m], [gguf-q8_0, gguf-q6_k, gguf-q4_k_m]] (docs/science.md section 14). Every name must be
    among score.quantizers; where score.quantizers is given on the command line (and release_sets is not), a
    recipe's set naming a quantizer it leaves out is dropped."""
