"""The blocks of the typed analysis result (`llmaudit.analyze.result.AnalysisResult`): the attacks with their
estimates and intervals, r_Q, the candidate indicators, memorization, the blind baseline and utility.

Every block is a `llmaudit.analyze.result_base.ResultBlock`: written again, it holds exactly the keys it read.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from llmaudit.analyze.decision.models import ReleaseDecision
from llmaudit.analyze.result_base import Num, ResultBlock
from llmaudit.analyze.result_recorded import RecordedAttackSettings, RQProtocol, RQStability

# ------------------------------------------------------------------------------------------ attacks


class Bounds(ResultBlock):
    """The two ends of an interval."""

    low: Num = None
    high: Num = None


class TprPoint(ResultBlock):
    """An attack's TPR at one FPR: the value, its threshold, and whether enough non-members stand behind it."""

    tpr: Num = None
    reliable: bool | None = None
    min_negatives: Num = None
    n_negatives: Num = None


class TprInterval(Bounds):
    """The interval of a TPR at one FPR: its ends, or (calibrated and per-sample evaluations) its ends under `tpr`."""

    tpr: Bounds | None = None

    def interval(self) -> tuple[Num, Num]:
        """The interval's ends, whichever way they were recorded.

        Returns:
            (low, high).
        """
        inner = self.tpr if self.tpr is not None else self
        return inner.low, inner.high


class EvaluationCI(ResultBlock):
    """The bootstrap intervals of one evaluation."""

    auroc: Bounds | None = None
    tpr_at_fpr: dict[str, TprInterval] = {}


class Roc(ResultBlock):
    """The ROC summary of one evaluation."""

    auroc: Num = None


class TprEstimate(BaseModel):
    """An attack's TPR at one FPR under one evaluation with its interval: the one layout the report reads."""

    tpr: Num
    ci: tuple[Num, Num] | None
    reliable: bool
    min_negatives: Num = None
    n_negatives: Num = None


class Evaluation(ResultBlock):
    """One evaluation of one attack (pooled naive, pooled calibrated or per sample): AUROC and TPR at low FPR."""

    auroc: Num = None
    average_precision: Num = None
    n_positives: Num = None
    n_negatives: Num = None
    roc: Roc | None = None
    tpr_at_fpr: dict[str, TprPoint] = {}
    ci: EvaluationCI | None = None

    def tpr_estimate(self, key: str) -> TprEstimate | None:
        """The TPR at FPR `key` with its interval.

        Args:
            key: the FPR as `llmaudit.analyze.metrics.fpr_key` writes it ("0.01").

        Returns:
            The estimate, or None where this evaluation did not measure that FPR.
        """
        point = self.tpr_at_fpr.get(key)
        if point is None:
            return None
        bounds = self.ci.tpr_at_fpr.get(key) if self.ci is not None else None
        return TprEstimate(
            tpr=point.tpr,
            ci=None if bounds is None else bounds.interval(),
            reliable=bool(point.reliable),
            min_negatives=point.min_negatives,
            n_negatives=point.n_negatives,
        )


class SampleScore(ResultBlock):
    """One sample's attack score."""

    sample_id: Any = None
    score: Num = None


class RecordedSamples(ResultBlock):
    """A quantizer's most vulnerable samples recorded with the attack and the score's definition."""

    attack: str | None = None
    score_definition: str | None = None
    samples: list[SampleScore] | None = None


class AttackResult(ResultBlock):
    """One attack on one quantizer: its definition and its three evaluations."""

    definition: str | None = None
    n_nan_scores: Num = None
    pooled_naive: Evaluation | None = None
    pooled_calibrated: Evaluation | None = None
    per_sample: Evaluation | None = None
    not_measured: dict[str, str] = {}
    headline: dict[str, Num] = {}
    vulnerable_samples: list[SampleScore] | None = None


class QuantizerAttacks(ResultBlock):
    """Every attack on one quantizer's final checkpoints, and those skipped with the reason."""

    n_models: Num = None
    fpc: Num = None
    attacks: dict[str, AttackResult] = {}
    skipped: dict[str, str] = {}
    vulnerable_samples: list[SampleScore] | RecordedSamples | None = None


class SpearmanResult(ResultBlock):
    """A rank correlation across quantizers with its p-value, or why it was not computed."""

    rho: Num = None
    p_value: Num = None
    n_quantizers: Num = None
    reason: str | None = None


class SpearmanVsRQ(ResultBlock):
    """Spearman(r_Q, each attack's headline metrics) across quantizers."""

    quantizers: list[str] = []
    expected_sign: str | None = None
    attacks: dict[str, dict[str, SpearmanResult]] = {}


class AttackResults(ResultBlock):
    """The attacks of the analysis: their definitions and settings, per quantizer every attack, the correlation with
    r_Q, and the release decision."""

    attack_definitions: dict[str, str] | None = None
    """{attack: its versioned definition} (`llmaudit.analyze.attacks.registry.attack_definitions`)."""
    settings: RecordedAttackSettings | None = None
    reference_quantizer: str | None = None
    quantizers: dict[str, QuantizerAttacks] = {}
    spearman_vs_r_q: SpearmanVsRQ | None = None
    decision: ReleaseDecision | None = None


# ------------------------------------------------------------------------------------------ r_Q and candidates


class RQStat(ResultBlock):
    """r_Q of one quantizer over runs: mean, interval, spread and the counts of undefined and infinite runs."""

    mean: Num = None
    ci_low: Num = None
    ci_high: Num = None
    std: Num = None
    median: Num = None
    confidence: Num = None
    n_runs: Num = None
    n_finite: Num = None
    n_undefined: Num = None
    n_infinite: Num = None


class RQEntry(ResultBlock):
    """One quantizer's r_Q and its rank among the quantizers."""

    r_q: RQStat = RQStat()
    rank: Num = None


class RQIndicator(ResultBlock):
    """The r_Q indicator (docs/science.md section 2): per quantizer over runs, its protocol and stability."""

    per_quantizer: dict[str, RQEntry] = {}
    protocol: RQProtocol | None = None
    stability: RQStability | None = None


class CandidateAggregate(ResultBlock):
    """A candidate indicator of one quantizer over runs: mean and interval."""

    mean: Num = None
    ci_low: Num = None
    ci_high: Num = None
    confidence: Num = None
    n_finite: Num = None


class BeyondDamage(ResultBlock):
    """Whether the indicator tracks the attacks beyond what the quantization damage explains."""

    answer: str | None = None


class SyntheticCheck(ResultBlock):
    """The indicator's agreement with the attacks on synthetic grids."""

    mean_spearman: Num = None


class Validation(ResultBlock):
    """An indicator's recorded validation."""

    status: str | None = None
    beyond_damage: BeyondDamage | None = None
    synthetic: SyntheticCheck | None = None


class Candidate(ResultBlock):
    """One candidate indicator: its definition, whether it is computable, its validation, per quantizer."""

    version: Any = None
    family: str | None = None
    formula: str | None = None
    computable: bool | None = None
    reason: str | None = None
    validation: Validation | None = None
    per_quantizer: dict[str, CandidateAggregate] = {}

    def status(self) -> str:
        """The indicator's validation status.

        Returns:
            The recorded status, "not validated" without one.
        """
        return (self.validation.status if self.validation is not None else None) or "not validated"


class CandidateIndicators(ResultBlock):
    """Every candidate indicator and the one the checklist reads (`primary`)."""

    primary: str | None = None
    reference_quantizer: str | None = None
    candidates: dict[str, Candidate] = {}


# ------------------------------------------------------------------------------------------ memorization, blind


class StatBounds(ResultBlock):
    """An estimate over runs with the ends of its interval."""

    mean: Num = None
    low: Num = None
    high: Num = None


class MemorizationEntry(ResultBlock):
    """One quantizer's memorization over runs (bits), each statistic with its interval."""

    runs: list[Any] | None = None
    member_mean_bits: StatBounds | None = None
    nonmember_mean_bits: StatBounds | None = None
    mean_difference_bits: StatBounds | None = None
    excess_member_bits: StatBounds | None = None
    member_bits_per_adapter_param: StatBounds | None = None
    member_bits_per_model_param: StatBounds | None = None


class CapacityRun(ResultBlock):
    """One run's information in its members against the capacity of the adapter and of the model."""

    adapter_capacity_over_information: Num = None


class Capacity(ResultBlock):
    """The capacity of the adapter and of the model (bits) against the members' information."""

    adapter_capacity_bits: Num = None
    model_capacity_bits: Num = None
    note: str | None = None
    per_run: list[CapacityRun] = []


class MemorizationResult(ResultBlock):
    """Memorization (docs/science.md): per quantizer over runs, and the capacity it is compared with."""

    definition: str | None = None
    reference: Any = None
    interval: Any = None
    per_quantizer: dict[str, MemorizationEntry] = {}
    capacity: Capacity | None = None
    notes: list[str] | None = None


class BlindRun(ResultBlock):
    """The blind baseline on one run: AUROC and its interval."""

    run: Any = None
    auroc: Num = None
    ci_low: Num = None
    ci_high: Num = None


class BlindBaselineResult(ResultBlock):
    """The blind baseline (a text-only classifier of members): per run, the mean, and why it may not hold."""

    per_run: list[BlindRun] | None = None
    mean_auroc: Num = None
    warning: str | None = None
    reason: str | None = None
    method: str | None = None
