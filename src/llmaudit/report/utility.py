"""The utility columns of a report beside the privacy ones: each quantizer's divergence from full precision and
task metrics (from the result's utility block), what the checklist's utility criterion judges when
`report.utility_metric` is not the loss, and the Pareto front of the privacy-utility figure.

Pure functions over the typed result and the report's grid rows (no rendering): the grid, the policy, the view and the figures
all read them.
"""

from __future__ import annotations

import math
from typing import Any

from llmaudit.analyze.fidelity import SUMMARY_KEYS
from llmaudit.analyze.result import (
    AnalysisResult,
    DivergenceResult,
    DivergenceSummary,
    DriftStat,
    Drop,
    Generation,
    TaskMetricResult,
    TaskMetricsResult,
)
from llmaudit.common.formatting import finite_or_none, interval_or_none
from llmaudit.report.models import Divergence, EstimateCI, GridRow, TaskMetric
from llmaudit.report.models_context import UtilitySummary
from llmaudit.report.schema_base import Stat

DIVERGENCE_KEYS = SUMMARY_KEYS
"""The divergence statistics of each quantizer's row: the per-run statistics the analysis averages over runs."""

DEFAULT_LIMITS = {"kl": 0.05, "same_top": 0.90}
"""report.utility_limit when unset: mean KL per token at most 0.05 nats; the most likely token agrees on at least
90% of the held-out tokens; any task metric at most 0.05 below full precision (TASK_DEFAULT_LIMIT)."""
TASK_DEFAULT_LIMIT = 0.05

METRIC_LABELS = {
    "kl": "mean KL(p_ref || p_q) per validation token (nats)",
    "same_top": "share of validation tokens whose most likely next token agrees with full precision",
}


def divergence_row(entry: DivergenceSummary | None) -> Divergence:
    """A quantizer's divergence summary for its grid row.

    Args:
        entry: the quantizer's divergence summary in the result, None where not recorded.

    Returns:
        Every statistic's mean over runs, interval and token error, or not measured with the reason.
    """
    if entry is None or not entry.measured:
        return Divergence(measured=False, reason=(entry.reason if entry is not None else None) or "not measured")
    stats: dict[str, Stat] = {}
    for key in DIVERGENCE_KEYS:
        stat = entry.stat(key) or DriftStat()
        stats[key] = Stat(
            mean=finite_or_none(stat.mean),
            ci=interval_or_none(*(stat.ci or [None, None])),
            token_se=finite_or_none(stat.token_se),
        )
    return Divergence(measured=True, reason=None, n_runs=entry.n_runs, **stats)


def task_metric_row(m: TaskMetricResult) -> TaskMetric:
    """One task metric of one quantizer for its grid row.

    Args:
        m: the metric in the quantizer's utility entry.

    Returns:
        Its value, interval and drop below the reference.
    """
    drop = m.drop_vs_reference or Drop()
    return TaskMetric(
        value=finite_or_none(m.value),
        ci=interval_or_none(*(m.ci or [None, None])),
        higher_is_better=True if m.higher_is_better is None else m.higher_is_better,
        n_runs=m.n_runs,
        drop=EstimateCI(value=finite_or_none(drop.value), ci=interval_or_none(*(drop.ci or [None, None]))),
    )


def metric_estimate(row: GridRow, metric: str, limit: float | None) -> dict[str, Any]:
    """What the utility criterion judges for a non-loss `metric` on one grid row.

    Args:
        row: the grid row (`llmaudit.report.grid.grid_rows`).
        metric: "kl", "same_top" or a task metric's name.
        limit: report.utility_limit (None: the metric's default).

    Returns:
        Value, interval, the direction ("max": value <= limit, "min": value >= limit), the limit, runs behind it, and
        why it is missing (or None).
    """
    u = row.utility
    if metric in ("kl", "same_top"):
        d = u.divergence
        stat = (d.kl_mean if metric == "kl" else d.same_top) or Stat()
        return {
            "value": stat.mean,
            "ci": stat.ci,
            "kind": "max" if metric == "kl" else "min",
            "limit": DEFAULT_LIMITS[metric] if limit is None else float(limit),
            "n_runs": d.n_runs or 0,
            "missing": None if d.measured else f"divergence not measured: {d.reason}",
            "description": f"{METRIC_LABELS[metric]} {'<=' if metric == 'kl' else '>='} limit",
        }
    m = u.task_metrics.get(metric)
    drop = m.drop if m is not None else EstimateCI()
    return {
        "value": drop.value,
        "ci": drop.ci,
        "kind": "max",
        "limit": TASK_DEFAULT_LIMIT if limit is None else float(limit),
        "n_runs": (m.n_runs if m is not None else None) or 0,
        "missing": None if m is not None else f"task metric {metric} not measured",
        "description": f"drop of {metric} below full precision (reference - quantizer, paired by run) <= limit",
    }


def pareto_front(points: list[tuple[float, float]], *, lower_x_is_better: bool) -> list[bool]:
    """Which points are on the Pareto front: a point is on it unless another is at least as good in both
    coordinates and better in one.

    Args:
        points: [(x, y)], lower y better.
        lower_x_is_better: x is better lower (KL) or higher (a task metric).

    Returns:
        Per point, whether it is on the front.
    """

    def _better_or_equal(a, b):
        ax, bx = (a[0], b[0]) if lower_x_is_better else (-a[0], -b[0])
        return ax <= bx and a[1] <= b[1]

    out = []
    for i, p in enumerate(points):
        dominated = any(_better_or_equal(q, p) and q != p for j, q in enumerate(points) if j != i)
        out.append(not dominated)
    return out


def indistinguishable_by_kl(grid: list[GridRow]) -> list[list[str]]:
    """Groups of quantizers whose mean KL intervals overlap a neighbour's: KL does not order them.

    Args:
        grid: the report's grid rows.

    Returns:
        The groups (two quantizers or more each, in KL order).
    """
    rows = []
    for r in grid:
        kl = r.utility.divergence.kl_mean or Stat()
        if kl.mean is not None and kl.ci:
            rows.append((kl.mean, kl.ci, r.quantizer))
    rows.sort(key=lambda t: t[0])
    groups: list[list[str]] = []
    current: list[str] = []
    top = -math.inf
    for _, ci, name in rows:
        if current and ci[0] <= top:
            current.append(name)
        else:
            if len(current) > 1:
                groups.append(current)
            current = [name]
            top = -math.inf
        top = max(top, ci[1])
    if len(current) > 1:
        groups.append(current)
    return groups


def utility_summary(result: AnalysisResult) -> UtilitySummary:
    """The report's block on how utility beyond the loss was measured.

    Args:
        result: the typed analysis result.

    Returns:
        The divergence's definition, and the task metrics' settings, metrics, and what was not measured with the fix.
    """
    divergence = result.divergence or DivergenceResult()
    tasks = result.task_metrics or TaskMetricsResult()
    generation = (tasks.settings.generation if tasks.settings is not None else None) or Generation()
    return UtilitySummary(
        divergence_definition=divergence.definition,
        divergence_reference=divergence.reference_quantizer,
        tasks_measured=bool(tasks.measured),
        tasks_reason=tasks.reason,
        task_metrics=dict(tasks.metrics),
        tasks_not_measured=dict(tasks.not_measured),
        generation_samples=tasks.n_samples or len(generation.sample_ids or []) or None,
        generation_max_new_tokens=generation.max_new_tokens,
        generation_decoding=generation.decoding,
    )
