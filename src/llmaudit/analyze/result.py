"""The typed analysis result (`AnalysisResult`): what `llmaudit.analyze.store_analysis.analyze` returns, what
results/result.json holds (`AnalysisResult.to_json`), and the only thing the report layer reads (`as_result`).

Per quantizer it holds the attacks (`attacks.quantizers`, each estimate with its interval), the release decision
with its comparison with full precision (`attacks.decision`, the analysis' own pydantic objects), r_Q (`r_q`), the
candidate indicators (`candidate_indicators`), memorization, utility, divergence and task metrics, and for the whole
store the extraction risk, the release sets, the epsilon lower bound, the blind baseline and the experiment.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llmaudit.analyze.result_blocks import (
    AttackResults,
    BlindBaselineResult,
    CandidateIndicators,
    MemorizationResult,
    Num,
    ResultBlock,
    RQIndicator,
)
from llmaudit.analyze.result_recorded import RecordedThresholds
from llmaudit.analyze.result_risks import EpsilonBlock, ExtractionBlock, ReleaseSetEntry


class DriftStat(ResultBlock):
    """A divergence statistic over runs: mean, interval and token-level standard error."""

    mean: Num = None
    ci: list[Num] | None = None
    token_se: Num = None


class DivergenceSummary(ResultBlock):
    """One quantizer's divergence from full precision (llama.cpp's statistics), or why it was not measured."""

    measured: bool | None = None
    reason: str | None = None
    n_runs: Num = None

    def stat(self, key: str) -> DriftStat | None:
        """One statistic of the summary.

        Args:
            key: its name (`llmaudit.analyze.fidelity.SUMMARY_KEYS`).

        Returns:
            The statistic, None where not recorded.
        """
        raw = (self.model_extra or {}).get(key)
        return None if raw is None else DriftStat.model_validate(raw)


class Drop(ResultBlock):
    """A task metric's drop below the reference, with its interval."""

    value: Num = None
    ci: list[Num] | None = None


class TaskMetricResult(ResultBlock):
    """One task metric of one quantizer over runs, and its drop below the reference."""

    value: Num = None
    ci: list[Num] | None = None
    higher_is_better: bool | None = None
    n_runs: Num = None
    drop_vs_reference: Drop | None = None


class UtilityEntry(ResultBlock):
    """One quantizer's utility: validation loss and its change vs the reference, divergence and task metrics."""

    confidence: Num = None
    val_loss: Num = None
    val_loss_ci: list[Num] | None = None
    relative_change: Num = None
    relative_change_ci: list[Num] | None = None
    n_runs: Num = None
    relative_change_pooled: Num = None
    relative_change_ci_samples: list[Num] | None = None
    n_val_samples: Num = None
    task_metrics: dict[str, TaskMetricResult] = {}
    divergence: DivergenceSummary | None = None


class DivergenceResult(ResultBlock):
    """How the divergence from full precision was measured, per run in `per_quantizer`."""

    definition: str | None = None
    reference_quantizer: str | None = None


class Generation(ResultBlock):
    """The generation settings the task metrics were measured with."""

    sample_ids: list[Any] | None = None
    max_new_tokens: Num = None
    decoding: Any = None


class TaskSettings(ResultBlock):
    """The recorded utility settings."""

    generation: Generation | None = None


class TaskMetricsResult(ResultBlock):
    """The task metrics: measured or why not, the metrics, those not measured with the fix, the settings."""

    measured: bool | None = None
    reason: str | None = None
    metrics: dict[str, Any] = {}
    not_measured: dict[str, Any] = {}
    n_samples: Num = None
    settings: TaskSettings | None = None


class QuantizerInfo(ResultBlock):
    """A quantizer as its record describes it: family, bits, size, options, calibration."""

    family: str | None = None
    bits: Num = None
    effective_bits: Num = None
    model_size_bytes: Num = None
    options: dict[str, Any] | None = None
    calibration: Any = None


class Experiment(ResultBlock):
    """The experiment the store holds: its identity, model, adapter, training, data, membership, versions."""

    name: str | None = None
    run_dir: str | None = None
    identity_hash: str | None = None
    origin: str | None = None
    model: str | None = None
    model_source: Any = None
    lora: Any = None
    train: Any = None
    data: Any = None
    membership: Any = None
    parameters: Any = None
    versions: Any = None
    seeds: Any = None
    left_out_quantizers: dict[str, str] = {}


class AnalysisResult(ResultBlock):
    """Everything the analysis of a run store found (module docstring); results/result.json is this object."""

    schema_version: Num = None
    llmaudit_version: str | None = None
    experiment: Experiment = Experiment()
    reference_quantizer: str | None = None
    quantizers: list[str] = []
    not_scored: dict[str, Any] = {}
    quantizer_info: dict[str, QuantizerInfo] = {}
    utility: dict[str, UtilityEntry] = {}
    divergence: DivergenceResult | None = None
    task_metrics: TaskMetricsResult | None = None
    trajectory: Any = None
    r_q: RQIndicator | None = Field(default=None, alias="indicator")
    """The r_Q indicator (written as "indicator")."""
    attacks: AttackResults = AttackResults()
    memorization: MemorizationResult | None = None
    blind_baseline: BlindBaselineResult | None = None
    candidate_indicators: CandidateIndicators | None = Field(default=None, alias="indicators")
    """Every candidate indicator (written as "indicators")."""
    extraction: ExtractionBlock | None = None
    release_sets: list[ReleaseSetEntry] | None = None
    epsilon: EpsilonBlock | None = None
    thresholds: RecordedThresholds = RecordedThresholds()
    """The release checklist's thresholds (the recipe's report section as recorded)."""

    def to_json(self) -> dict[str, Any]:
        """The result as results/result.json holds it.

        Returns:
            The JSON content (NaN kept where the analysis found a value undefined).
        """
        return self.model_dump(mode="json", by_alias=True)


def as_result(result: AnalysisResult | dict[str, Any]) -> AnalysisResult:
    """The typed result: `result` itself when already typed, else parsed once (results/result.json of any version).

    Args:
        result: the analysis result, typed or as read from results/result.json.

    Returns:
        The typed result.

    Raises:
        pydantic.ValidationError: `result` is not an analysis result.
    """
    return result if isinstance(result, AnalysisResult) else AnalysisResult.model_validate(result)
