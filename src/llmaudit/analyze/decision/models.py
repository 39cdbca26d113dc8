"""The typed results of the release decision (docs/science.md section 12): what the analysis hands the report.

Every estimate carries its interval and what the interval means; every decision carries the rule that made it.
report.json holds them as plain JSON (`model_dump`); the report reads them back with `model_validate`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["PASS", "FAIL", "INCONCLUSIVE", "NOT MEASURED"]
Direction = Literal["MORE", "SAME", "LESS", "CANNOT TELL", "NOT MEASURED"]
Mode = Literal["calibrated", "empirical"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Estimate(_Model):
    """A proportion or a difference with its interval. `low`/`high` are None where the side is not bounded
    (a one-sided bound) or not computable; `confidence` is the coverage of [low, high] (one-sided where one
    side is None)."""

    value: float | None
    low: float | None = None
    high: float | None = None
    confidence: float | None = None
    method: str = ""


class AttackJudgement(_Model):
    """One attack on one quantizer at the decision's FPR: its (in-sample) TPR, the simultaneous upper bound
    the PASS rule reads, the counts behind it, and why it is not judged where it is not."""

    attack: str
    tpr: Estimate
    upper_bound: float | None
    realised_fpr: float | None
    members: float
    nonmembers: float
    judged: bool
    reason: str = ""


class StrongestAttack(_Model):
    """The strongest attack as an auditor would pick it, estimated honestly: chosen on some folds, measured on
    the others (cross-fitting), pooled over the held-out folds."""

    tpr: Estimate
    realised_fpr: float | None
    selected: list[str | None]
    folds: int
    fold_kind: Literal["target models", "samples"]
    selection_stability: dict[str, float]
    members: float
    nonmembers: float


class Difference(_Model):
    """A paired difference quantizer minus the reference, with its two-sided interval."""

    attack: str
    metric: Literal["tpr", "auroc"]
    estimate: Estimate


class Comparison(_Model):
    """Does the quantizer leak more, the same, or less than the reference (full precision)? MORE / LESS: the
    strongest-attack TPR difference (both sides cross-fitted on the same folds and resamples); SAME: every attack's
    paired TPR difference within the margin (`llmaudit.analyze.decision.rule.compare`). Per attack the TPR and
    AUROC differences with their intervals."""

    reference: str
    direction: Direction
    difference: Estimate
    margin: float
    equivalent: bool
    sentence: str
    per_attack: list[Difference] = Field(default_factory=list)


class SizeNeeded(_Model):
    """What would decide an INCONCLUSIVE (or NOT MEASURED) verdict: the factor on the number of audited samples,
    from the observed variance, assuming the estimates stay where they are."""

    factor: float | None
    towards: Literal["PASS", "FAIL", "MEASURED"] | None
    sentence: str


class QuantizerDecision(_Model):
    """The attack criterion of one quantizer under the release rule, with its comparison with full precision."""

    quantizer: str
    mode: Mode
    status: Status
    reason: str
    limit: float
    fpr: float
    strongest: StrongestAttack | None
    in_sample_max: Estimate | None
    in_sample_max_attack: str | None
    attacks: list[AttackJudgement]
    comparison: Comparison | None
    size_needed: SizeNeeded | None
    run_to_run_covered: bool
    n_targets: int
    loss_gap: Estimate | None = None
    """Mean loss of non-members minus members (nats per token, pooled over the targets, 95% interval over samples):
    how large the difference behind the TPR is, so that a TPR from a microscopic difference can be judged."""


class DecisionRule(_Model):
    """The rule and what it controls, recorded with every decision."""

    limit: float
    fpr: float
    alpha: float
    margin: float
    folds: int
    resamples: int
    seed: int
    mode: Mode
    min_runs: int
    statements: list[str]


class ReleaseDecision(_Model):
    """The decision block of a result: the rule, and one decision per quantizer."""

    rule: DecisionRule
    reference: str | None
    per_quantizer: dict[str, QuantizerDecision]
