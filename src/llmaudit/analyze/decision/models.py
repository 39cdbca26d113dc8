"""The typed results of the release decision (docs/science.md section 12): what the analysis hands the report.

Every estimate carries its interval and what the interval means; every decision carries the rule that made it.
The analysis result holds them as they are (`llmaudit.analyze.result.AnalysisResult`); report.json holds them as
JSON (`model_dump`), and its typed model reads them back as these models (`llmaudit.report.models.GridRow`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE", "NOT MEASURED"]
"""The release rule's verdict on a quantizer (and a quantizer's overall checklist status)."""
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
    """One attack on one quantizer at the decision's FPR: its (in-sample) TPR at the threshold the PASS rule reads
    with the simultaneous upper bound, the counts behind it, its TPR at the threshold the headline is measured at
    (`measured`), and why it is not judged where it is not."""

    attack: str
    tpr: Estimate
    upper_bound: float | None
    realised_fpr: float | None
    members: float
    nonmembers: float
    judged: bool
    reason: str = ""
    measured: Estimate | None = None
    """The TPR at the empirical threshold of all the non-members (in-sample: FPR <= the decision's FPR on them), the
    kind of threshold the rule's headline is measured at, with its two-sided 1 - 2 alpha interval (each end a
    one-sided 1 - alpha bound): the attack as an auditor who fixed it beforehand would report it."""
    measured_fpr: float | None = None
    """The realised FPR of the non-member rows at that threshold."""


class StrongestAttack(_Model):
    """The rule's headline: the strongest attack as an auditor would pick it, estimated honestly: per fold chosen on
    other rows at the threshold it is measured at and measured on the fold (cross-fitting), pooled over the folds;
    or, on few non-members, the exact test's reading (`route`). `tpr` is THE headline TPR at the decision's FPR with
    its interval (`confidence` is the coverage of [low, high]; each end is a one-sided bound at 1 - alpha)."""

    tpr: Estimate
    realised_fpr: float | None
    selected: list[str | None]
    folds: int
    fold_kind: Literal["target models", "samples"]
    selection_stability: dict[str, float]
    """The share of the folds that chose each attack."""
    members: float
    nonmembers: float
    route: Literal["cross-fitted", "exact"] = "cross-fitted"
    """cross-fitted: chosen on the other folds, measured on each, the interval conditional on the observed choices;
    exact: few non-members (one target): chosen on a selection split, measured on the rest against an order
    statistic of its non-members, a one-sided exact lower bound (docs/science.md section 12)."""
    excess: Estimate | None = None
    """Leakage beyond chance: the TPR minus the realised FPR of the same rows at the same thresholds (what the
    comparison with full precision reads), with its two-sided 1 - 2 alpha percentile interval."""


class Difference(_Model):
    """A paired difference quantizer minus the reference, with its two-sided interval. excess_tpr: of the leakage
    beyond chance (TPR minus realised FPR), what SAME reads; tpr and auroc: diagnostics."""

    attack: str
    metric: Literal["tpr", "excess_tpr", "auroc"]
    estimate: Estimate


class Comparison(_Model):
    """Does the quantizer leak more, the same, or less than the reference (full precision)? MORE / LESS: the paired
    difference of the two rules' leakage beyond chance (TPR minus realised FPR, each measured as its headline);
    SAME: every attack's paired difference of leakage beyond chance within the margin
    (`llmaudit.analyze.decision.compare.compare`). Per attack the differences with their intervals."""

    reference: str
    direction: Direction
    difference: Estimate
    margin: float
    equivalent: bool
    sentence: str
    per_attack: list[Difference] = Field(default_factory=list)
    statistic: str = "difference of the strongest attacks' TPR at the decision's FPR"
    """What `difference` is a difference of."""


class SizeNeeded(_Model):
    """What would decide an INCONCLUSIVE (or NOT MEASURED) verdict: the factor on the number of audited samples,
    from the observed variance, assuming the estimates stay where they are."""

    factor: float | None
    towards: Literal["PASS", "FAIL", "MEASURED"] | None
    sentence: str
    attack: str | None = None
    """The attack whose estimate and interval the factor rests on (None: the rule's headline or every attack)."""


class VerdictTest(_Model):
    """One test of the three-way rule as it was read: its statistic's value against the limit, and whether it held
    (FAIL: a lower bound above the limit; PASS: the highest simultaneous upper bound below it; MEASURED: enough
    non-members for the rule to read a TPR at the FPR)."""

    test: Literal["FAIL", "PASS", "MEASURED"]
    statistic: str
    value: float | None
    relation: Literal[">", "<", ">="]
    limit: float
    held: bool


class QuantizerDecision(_Model):
    """The attack criterion of one quantizer under the release rule, with its comparison with full precision."""

    quantizer: str
    mode: Mode
    status: Verdict
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
    tests: list[VerdictTest] = Field(default_factory=list)
    """The tests the status was read from, in the rule's order (FAIL, then PASS; or MEASURED): the deciding one is
    the first that held; an INCONCLUSIVE lists both that did not."""


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
