"""The settings the analysis result records beside its numbers: how the attacks ran (`RecordedAttackSettings`), the
r_Q estimator's protocol (`RQProtocol`), how stable the quantizer ranking is with the number of runs
(`RQStability`), and the release checklist's thresholds (`RecordedThresholds`, the recipe's report section)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import ConfigDict, Field

from llmaudit.analyze.result_base import Num, ResultBlock
from llmaudit.config.report_section import ReportConfig


class RecordedAttackSettings(ResultBlock):
    """How the attacks ran and were evaluated, as the result records them (`AttackRunSettings.as_dict`: every
    setting but the attacks, and the checkpoint and split the attacks read)."""

    fpc: str | Num = None
    n_boot: Num = None
    seed: Num = None
    n_pool: Num = None
    n_train: Num = None
    fprs: list[Num] | None = None
    k: Num = None
    ref_models: str | None = None
    statistic: str | None = None
    lira_variance: str | None = None
    t_cutoff: Num = None
    confidence: Num = None
    checkpoint: str | None = None
    split: str | None = None


class RQEdgeCases(ResultBlock):
    """What r_Q is where its formula is undefined or infinite."""

    equal_means: str | None = None
    all_sigma2_zero: str | None = None
    fewer_than_2_points: str | None = None


class RQProtocol(ResultBlock):
    """The r_Q estimator (docs/science.md section 2): its formula and conventions, and the parameters it ran with."""

    estimator: str | None = None
    formula: str | None = None
    split: str | None = None
    ddof: Num = None
    merge_rule: str | None = None
    merge_atol: Num = None
    sort: str | None = None
    edge_cases: RQEdgeCases | None = None
    aggregation: str | None = None
    rank_by: str | None = None
    reference_run_skipped: Num = None
    variants: list[str] | None = None
    n_boot: Num = None
    confidence: Num = None
    n_resamples: Num = None
    seed: Num = None


class StabilityAtSize(ResultBlock):
    """Spearman's rho between the ranking on random subsets of `k_runs` runs and the ranking on every run."""

    k_runs: Num = None
    n_resamples: Num = None
    n_nan: Num = None
    mean_rho: Num = None
    std_rho: Num = None
    q05_rho: Num = None
    q95_rho: Num = None


class RQStability(ResultBlock):
    """How fast the quantizer ranking by r_Q stabilises with the number of runs (`rq_aggregate.ranking_stability`)."""

    n_runs: Num = None
    full_mean: dict[str, Num] = {}
    full_ranking: dict[str, Num] = {}
    by_size: list[StabilityAtSize] = []
    seed: Num = None


class RecordedThresholds(ResultBlock, ReportConfig):
    """The release checklist's thresholds: the recipe's report section (`ReportConfig`) as the analysis recorded it,
    without how the report stage runs (`processes`). A key not recorded keeps `ReportConfig`'s default when read as
    an attribute, and is not written back; `dict(thresholds)` holds exactly the recorded keys."""

    model_config = ConfigDict(extra="allow", validate_assignment=False)
    processes: int | None = Field(None, exclude=True)
    """How the report stage runs: not a threshold, never recorded."""

    def __iter__(self) -> Iterator[tuple[str, Any]]:  # type: ignore[override]
        """The recorded thresholds key by key, in the order recorded (what `dict(thresholds)` gives).

        Returns:
            An iterator over (key, value).
        """
        return iter(self.model_dump().items())
