"""The typed contract of report.json: pydantic models of what the renderers read, from which report.json is
written (`dump_report`) and its JSON Schema generated (`llmaudit.report.schema`).

Reading: `as_report(report)` parses a report dict once (a fresh one or a report.json of any version); a key a
report.json lacks takes the field's default. The release decision of each grid row is the analysis' own model
(`llmaudit.analyze.decision.models.QuantizerDecision`). Writing: `dump_report(report)` validates the built report with
`current=True`: every field the current builder writes must be there (a renamed key fails loudly instead of
reading as None), then serializes it key for key, in the order it was built (`_Open` keeps the order it read).
Sections with open-ended keys (`extra="allow"`) keep the keys the model does not name.
Reading a report.json back from a store: `llmaudit.report.readback.read_report` (the schema and its consistency).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from llmaudit.analyze.decision.models import DecisionRule, QuantizerDecision, Verdict
from llmaudit.report.models_context import (
    Adapter,
    AttackSettings,
    BlindBaseline,
    DataSource,
    IndicatorAgreement,
    IndicatorProtocol,
    IndicatorsSummary,
    IndicatorStability,
    Membership,
    Memorization,
    ModelSource,
    Parameters,
    Provenance,
    Spearman,
    SpearmanVsRQ,
    Training,
    UtilitySummary,
    VulnerableSamples,
)
from llmaudit.report.models_risks import EpsilonSection, ExtractionSection, ReleaseSetEntry
from llmaudit.report.schema_base import CriterionStatus, Interval, Num, Stat, _Open, schema_required

__all__ = [
    "Adapter",
    "AttackSettings",
    "DataSource",
    "IndicatorProtocol",
    "Membership",
    "ModelSource",
    "Parameters",
    "Provenance",
    "Stat",
    "Training",
]

# ------------------------------------------------------------------------------------------ grid row


class TprAt(_Open):
    """An attack's TPR at one FPR under one evaluation, with its interval and reliability."""

    tpr: Num = None
    ci: Interval = None
    reliable: bool = False
    min_negatives: int | None = None
    n_negatives: int | None = None


class AttackEntry(_Open):
    """One attack on one quantizer: AUROC and TPR at low FPR, each with its interval."""

    definition: str | None = None
    auroc: Num = None
    auroc_ci: Interval = None
    auroc_calibrated: Num = None
    average_precision: Num = None
    n_positives: int | None = None
    n_negatives: int | None = None
    n_models: int | None = None
    n_nan_scores: int | None = None
    not_measured: dict[str, str] = {}
    low_fpr: dict[str, dict[str, TprAt]] = {}

    def tpr_at(self, evaluation: str, key: str) -> TprAt | None:
        """The TPR at one FPR under one evaluation.

        Args:
            evaluation: "pooled_naive", "pooled_calibrated" or "per_sample".
            key: the FPR ("0.01").

        Returns:
            The TPR with its interval, None where not measured.
        """
        return self.low_fpr.get(evaluation, {}).get(key)


class BestAttack(_Open):
    optional_keys = frozenset({"reliable"})
    name: str
    metric: str | None = None
    value: Num = None
    ci: Interval = None
    reliable: bool | None = None


class VsLoss(_Open):
    """The strongest attack against LOSS on one metric: both values and the gain (strongest minus LOSS)."""

    optional_keys = frozenset({"reliable"})
    attack: str
    value: Num = None
    loss: Num = None
    gain: Num = None
    reliable: bool | None = None


class StrongestVsLoss(_Open):
    optional_keys = frozenset({"tpr_at_1pct_calibrated", "auroc"})
    tpr_at_1pct_calibrated: VsLoss | None = None
    auroc: VsLoss | None = None


class Divergence(_Open):
    optional_keys = frozenset(
        {"n_runs", "kl_mean", "kl_median", "kl_99", "kl_max", "same_top"}
        | {"delta_p_mean", "delta_p_rms", "ln_ppl_ratio", "ppl_ratio"}
    )
    measured: bool = False
    reason: str | None = None
    n_runs: int | None = None
    kl_mean: Stat | None = None
    kl_median: Stat | None = None
    kl_99: Stat | None = None
    kl_max: Stat | None = None
    same_top: Stat | None = None
    delta_p_mean: Stat | None = None
    delta_p_rms: Stat | None = None
    ln_ppl_ratio: Stat | None = None
    ppl_ratio: Stat | None = None


class EstimateCI(_Open):
    """A value with its interval."""

    value: Num = None
    ci: Interval = None


class TaskMetric(_Open):
    value: Num = None
    ci: Interval = None
    higher_is_better: bool = True
    n_runs: int | None = None
    drop: EstimateCI = EstimateCI()


class UtilityRow(_Open):
    """A quantizer's utility: validation loss and its change vs the reference (intervals at `confidence`),
    divergence, tasks."""

    optional_keys = frozenset({"confidence"})
    confidence: Num = None
    val_loss: Num = None
    val_loss_ci: Interval = None
    relative_change: Num = None
    relative_change_ci: Interval = None
    n_runs: int | None = None
    relative_change_pooled: Num = None
    relative_change_ci_samples: Interval = None
    n_val_samples: int | None = None
    task_metrics: dict[str, TaskMetric] = {}
    divergence: Divergence = Divergence(reason="not measured")


class RQ(_Open):
    optional_keys = frozenset({"confidence"})
    confidence: Num = None
    mean: Num = None
    ci: Interval = None
    std: Num = None
    median: Num = None
    rank: Num = None
    n_runs: int | None = None
    n_finite: int | None = None
    n_undefined: int | None = None
    n_infinite: int | None = None


class PrimaryIndicator(_Open):
    name: str | None = None
    mean: Num = None
    ci: Interval = None
    confidence: Num = None
    n_finite: int | None = None
    status: str | None = None


class GridRow(_Open):
    """One quantizer: size, utility, r_Q, every attack, the strongest, the release rule's decision."""

    quantizer: str
    is_reference: bool = False
    family: str | None = None
    calibration: str | None = None
    engine: str | None = None
    """The scoring engine of a GGUF quantizer's units (torch or llama.cpp); None for the other quantizers."""
    bits: Num = None
    effective_bits: Num = None
    model_size_bytes: Num = None
    size_vs_reference: Num = None
    utility: UtilityRow = UtilityRow()
    r_q: RQ = RQ()
    r_q_status: str = "not validated"
    indicator: PrimaryIndicator | None = None
    n_models: int | None = None
    attacks: dict[str, AttackEntry] = {}
    skipped_attacks: dict[str, str] = {}
    best_attack: BestAttack | None = None
    best_attack_by_auroc: BestAttack | None = None
    strongest_vs_loss: StrongestVsLoss | None = None
    decision: QuantizerDecision | None = None
    """The release rule's decision (with the paired comparison); None in a report.json without the rule."""


# ------------------------------------------------------------------------------------------ checklist


class InSampleMax(_Open):
    attack: str | None = None
    value: Num = None


class AttackVerdict(_Open):
    """One attack under the attack criterion: the release rule's simultaneous upper bound (judged), or, in a
    result without the rule, its own verdict (status)."""

    optional_keys = frozenset({"upper_bound", "judged", "realised_fpr", "status", "ci", "reliable"})
    value: Num = None
    upper_bound: Num = None
    judged: bool | None = None
    reason: str | None = None
    realised_fpr: Num = None
    status: CriterionStatus | None = None
    ci: Interval = None
    reliable: bool | None = None


class Criterion(_Open):
    """One criterion of one quantizer: its estimate and interval against its limit, the status and why."""

    optional_keys = frozenset(
        {"metric", "attack", "confidence", "mode", "in_sample_max", "per_attack", "size_needed"}
        | {"run_to_run_covered", "skipped_attacks", "interval_over", "reliable"}
    )
    id: Literal["attack_tpr", "r_q", "indicator", "utility"]
    description: str
    metric: str | None = None
    threshold: Num = None
    comparison: Literal["<=", ">="]
    attack: str | None = None
    value: Num = None
    ci: Interval = None
    confidence: Num = None
    reliable: bool | None = None
    interval_over: str | None = None
    status: CriterionStatus
    reason: str
    mode: str | None = None
    in_sample_max: InSampleMax | None = None
    per_attack: dict[str, AttackVerdict] = {}
    size_needed: dict[str, Any] | None = None
    run_to_run_covered: bool | None = None
    skipped_attacks: dict[str, str] = {}


class QuantizerChecklist(_Open):
    overall: Verdict
    criteria: list[Criterion] = Field(min_length=3)

    def criterion(self, cid: str) -> Criterion:
        """One criterion of the quantizer.

        Args:
            cid: its id ("attack_tpr", "r_q", "indicator", "utility").

        Returns:
            The criterion.
        """
        return next(c for c in self.criteria if c.id == cid)


class Thresholds(_Open):
    optional_keys = frozenset({"min_indicator", "utility_metric", "utility_limit"})
    max_tpr_at_1pct_fpr: float
    min_r_q: float
    max_utility_loss: float
    min_runs: int
    min_indicator: Num = None
    utility_metric: str | None = "loss"
    utility_limit: Num = None


class Checklist(_Open):
    thresholds: Thresholds
    rules: list[str] = []
    per_quantizer: dict[str, QuantizerChecklist]


class RunnerUp(_Open):
    quantizer: str
    lost_on: str


class Recommendation(_Open):
    optional_keys = frozenset({"comparison", "candidates", "ranking", "runner_up"})
    quantizer: str | None = None
    rule: str = ""
    overall: Verdict | None = None
    cleared_for_release: bool = False
    reason: str = ""
    comparison: str | None = None
    candidates: list[str] = []
    ranking: list[str] = []
    runner_up: RunnerUp | None = None
    explanation: str | None = None


REPORT_SCHEMA_VERSION = 4
"""The version of report.json this llmaudit writes."""


def _report_schema(schema: dict[str, Any], cls: type[_Open]) -> None:
    """ReportJson's JSON Schema beyond its fields' own: the required keys, the version this llmaudit writes, and the
    privacy of the report itself (a report without include_samples carries no sample text)."""
    schema_required(schema, cls)
    schema["properties"]["report_schema_version"] = {"const": REPORT_SCHEMA_VERSION}
    schema["if"] = {"properties": {"include_samples": {"const": False}}}
    schema["then"] = {
        "properties": {"vulnerable_samples": {"properties": {"samples": {"items": {"not": {"required": ["text"]}}}}}}
    }


class ReportJson(_Open):
    """report.json: everything every rendering shows (`llmaudit.report.build.build_report`)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_report_schema, populate_by_name=True)
    report_schema_version: int
    """The version of report.json (any version parses; the schema is this llmaudit's)."""
    llmaudit_version: str | None = None
    generated_utc: str | None = None
    include_samples: bool = False
    non_finite_policy: str | None = None
    provenance: Provenance
    decision_rule: DecisionRule | None = None
    reference_quantizer: str | None = None
    quantizers: list[str] = Field(min_length=1)
    grid: list[GridRow] = Field(min_length=1)
    checklist: Checklist
    recommendation: Recommendation
    r_q_vs_best_attack: dict[str, Spearman] = {}
    indicator_agreement: IndicatorAgreement | None = None
    spearman_r_q_vs_attacks: SpearmanVsRQ | None = None
    indicator_stability: IndicatorStability | None = None
    memorization: Memorization | None = None
    not_scored: dict[str, Any] = {}
    blind_baseline: BlindBaseline | None = None
    indicators: IndicatorsSummary | None = None
    utility: UtilitySummary | None = None
    vulnerable_samples: VulnerableSamples
    extraction: ExtractionSection | None = None
    release_sets: list[ReleaseSetEntry] = []
    epsilon: EpsilonSection | None = None
    plots: dict[str, str] = {}
    result: dict[str, Any] = {}

    def row(self, quantizer: str) -> GridRow:
        """The grid row of one quantizer.

        Args:
            quantizer: its name.

        Returns:
            The row.
        """
        return next(r for r in self.grid if r.quantizer == quantizer)

    def criteria(self, quantizer: str) -> dict[str, Criterion]:
        """The checklist's criteria of one quantizer.

        Args:
            quantizer: its name.

        Returns:
            {criterion id: criterion}.
        """
        return {c.id: c for c in self.checklist.per_quantizer[quantizer].criteria}


def as_report(report: dict[str, Any] | ReportJson) -> ReportJson:
    """The typed report: `report` itself when already parsed, else parsed once (any report.json version).

    Args:
        report: report.json's content, or the typed report.

    Returns:
        The typed report.
    """
    return report if isinstance(report, ReportJson) else ReportJson.model_validate(report)


def read_built(report: dict[str, Any]) -> ReportJson:
    """The report just built, typed, with every key the current builder writes required, so that a renamed key
    fails here, not as a None.

    Args:
        report: the built report (`llmaudit.report.build.build_report`).

    Returns:
        The typed report.

    Raises:
        pydantic.ValidationError: naming the section and the key.
    """
    return ReportJson.model_validate(report, context={"current": True})


def dump_report(report: dict[str, Any] | ReportJson) -> dict[str, Any]:
    """report.json's content: the built report typed (`read_built`), serialized key for key as it was built.

    Args:
        report: the built report, or the typed one.

    Returns:
        The JSON content.
    """
    model = report if isinstance(report, ReportJson) else read_built(report)
    return model.model_dump(mode="json", exclude_unset=True, by_alias=True)
