"""The report's figures, drawn from a built report (`llmaudit.report.build_report`).

Every figure function takes the report and returns a matplotlib Figure, or None when the report holds no data
for it (e.g. no LiRA ROC curves); `render_all` turns them into PNG bytes. Figures are drawn with matplotlib's
object API on an Agg canvas: no pyplot global state, no display needed, nothing is written to disk here (the
report module writes the files atomically and embeds the same bytes in report.html). Wherever a figure shows
the leakage of a quantizer it is THE headline (`llmaudit.report.release.headline_of`) with its interval; every
other attack number is labelled a diagnostic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from llmaudit.common.stats import spearman
from llmaudit.report.answer import recommendation_of
from llmaudit.report.models import GridRow, ReportJson, as_report
from llmaudit.report.plot_base import (
    ReportLike,
    finite,
    headline_label,
    headline_point,
    label_points,
    png,
    positive_log_ok,
    quantizer_colors,
    yerr,
)
from llmaudit.report.plot_roc import plot_roc_loglog
from llmaudit.report.utility import pareto_front

__all__ = ["FIGURES", "WIDE_FIGURES", "plot_roc_loglog", "quantizer_colors", "render_all"]


def _limit_line(ax, report: ReportJson) -> None:
    thr = report.checklist.thresholds.max_tpr_at_1pct_fpr
    if finite(thr):
        ax.axhline(thr, color="firebrick", lw=0.8, ls="--", label=f"limit {thr:g}")


def _headline_panel(ax, report: ReportJson, rows: list[GridRow], colors: dict[str, Any]) -> list:
    """r_Q (x) against the headline leakage (y), one point per quantizer with its intervals; the points to label."""
    labels = []
    for r in rows:
        point = headline_point(r)
        if point is None:
            continue
        y, ci = point
        x = r.r_q.mean
        ax.errorbar(x, y, xerr=yerr(x, r.r_q.ci), yerr=yerr(y, ci), fmt="o", color=colors[r.quantizer], capsize=3)
        labels.append((x, y, r.quantizer))
    _limit_line(ax, report)
    ax.set_ylabel(headline_label(report))
    return labels


def _auroc_panel(ax, rows: list[GridRow], colors: dict[str, Any]) -> list:
    """r_Q (x) against the highest AUROC over the attacks (a diagnostic, in-sample), one point per quantizer."""
    labels = []
    for r in rows:
        best = r.best_attack_by_auroc
        if best is None or not finite(best.value):
            continue
        x = r.r_q.mean
        ax.errorbar(
            x, best.value, xerr=yerr(x, r.r_q.ci), yerr=yerr(best.value, best.ci), fmt="o", color=colors[r.quantizer]
        )
        labels.append((x, best.value, r.quantizer))
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("diagnostic: highest AUROC over the attacks\n(in-sample, selection-biased)")
    return labels


def r_q_vs_attack(report: ReportLike) -> Figure | None:
    """r_Q against the headline leakage and, as a diagnostic, the highest AUROC, one point per quantizer.

    r_Q's axis is logarithmic when it spans decades; each point carries its intervals; each title Spearman's rho.

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        The figure, or None with fewer than two quantizers of finite r_Q.
    """
    report = as_report(report)
    rows = [r for r in report.grid if finite(r.r_q.mean)]
    if len(rows) < 2:
        return None
    colors = quantizer_colors(report)
    fig = Figure(figsize=(11, 4.6))
    fig.subplots_adjust(wspace=0.32)
    for i, metric in enumerate(("tpr_at_1pct_calibrated", "auroc")):
        ax = fig.add_subplot(1, 2, i + 1)
        labels = _headline_panel(ax, report, rows, colors) if i == 0 else _auroc_panel(ax, rows, colors)
        if positive_log_ok([r.r_q.mean for r in rows]):
            ax.set_xscale("log")
        if i == 0:  # the rank correlation of what this panel plots: r_Q against the headline
            rho = spearman([x for x, _, _ in labels], [y for _, y, _ in labels], p_value=False).rho
        else:
            sp = report.r_q_vs_best_attack.get(metric)
            rho = sp.rho if sp is not None else None
        what = "the headline leakage" if i == 0 else "the highest AUROC"
        ax.set_title(f"Spearman rho with {what} = {rho:.2f}" if finite(rho) else "Spearman rho: n/a", fontsize=9)
        ax.set_xlabel("r_Q (higher = more secure), mean over runs")
        ax.grid(alpha=0.3)
        if i == 0 and ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        label_points(ax, labels)
    fig.suptitle("r_Q against attack success across quantizers", fontsize=10)
    return fig


def _lira_entry(result: dict[str, Any], quantizer: str) -> dict[str, Any] | None:
    """The result's offline LiRA block for one quantizer (its ROC curves), or None."""
    entry: Any = result
    for key in ("attacks", "quantizers", quantizer, "attacks", "lira_offline"):
        entry = entry.get(key) if isinstance(entry, dict) else None
    return entry or None


def lira_roc(report: ReportLike) -> Figure | None:
    """Diagnostic: offline LiRA's ROC on log-log axes, one curve per quantizer (per-sample calibrated, pooled).

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        The figure, or None when no quantizer has LiRA's curves.
    """
    report = as_report(report)
    colors = quantizer_colors(report)
    curves = []
    for row in report.grid:
        entry = _lira_entry(report.result, row.quantizer)
        rc = entry.get("roc_curve") if entry else None
        curve = rc and (rc.get("pooled_calibrated") or rc.get("pooled_naive"))
        if curve and curve.get("fpr"):
            curves.append((row, curve))
    if not curves:
        return None
    fig = Figure(figsize=(5.6, 5.2))
    ax = fig.add_subplot(1, 1, 1)
    floor = 1e-4
    for row, curve in curves:
        fpr = np.asarray([v if finite(v) else np.nan for v in curve["fpr"]], dtype=float)
        tpr = np.asarray([v if finite(v) else np.nan for v in curve["tpr"]], dtype=float)
        lira = row.attacks.get("lira_offline")
        auroc = lira.auroc if lira is not None else None
        label = f"{row.quantizer} (AUROC {auroc:.2f})" if finite(auroc) else row.quantizer
        lw = 2.2 if row.is_reference else 1.3
        ax.plot(np.maximum(fpr, floor), np.maximum(tpr, floor), color=colors[row.quantizer], lw=lw, label=label)
    grid = np.logspace(-4, 0, 50)
    ax.plot(grid, grid, color="grey", lw=0.8, ls=":", label="chance")
    ax.axvline(0.01, color="grey", lw=0.6, ls="--")
    ax.set(xscale="log", yscale="log", xlim=(floor, 1), ylim=(floor, 1.05))
    ax.set(xlabel="false positive rate", ylabel="true positive rate")
    ax.set_title("Diagnostic: offline LiRA's ROC per quantizer (log-log, calibrated)", fontsize=9)
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return fig


def r_q_intervals(report: ReportLike) -> Figure | None:
    """r_Q per quantizer: mean over runs with its bootstrap interval, sorted by r_Q.

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        The figure, or None without a finite r_Q.
    """
    report = as_report(report)
    rows = [r for r in report.grid if finite(r.r_q.mean)]
    if not rows:
        return None
    rows.sort(key=lambda r: r.r_q.mean)
    colors = quantizer_colors(report)
    fig = Figure(figsize=(6.4, 0.45 * len(rows) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    for i, r in enumerate(rows):
        m = r.r_q.mean
        ax.errorbar(m, i, xerr=yerr(m, r.r_q.ci), fmt="o", color=colors[r.quantizer], capsize=3)
    ax.set_yticks(range(len(rows)), [r.quantizer + (" (ref)" if r.is_reference else "") for r in rows])
    if positive_log_ok([r.r_q.mean for r in rows] + [r.r_q.ci[0] for r in rows if r.r_q.ci]):
        ax.set_xscale("log")
    thr = report.checklist.thresholds.min_r_q
    if finite(thr) and thr > 0:
        ax.axvline(thr, color="firebrick", lw=0.8, ls="--", label=f"checklist minimum {thr:g}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("r_Q (higher = more secure): mean over runs, bootstrap interval")
    ax.set_title("Attack-free indicator r_Q per quantizer", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    return fig


def _budget(ax, report: ReportJson, left: float) -> None:
    """The utility budget (shaded) and the leakage limit (dashed) of utility_vs_privacy."""
    budget = report.checklist.thresholds.max_utility_loss
    if finite(budget):
        label = f"utility budget (+{100 * budget:g}% loss)"
        ax.axvspan(left, 100 * budget, color="green", alpha=0.07, label=label)
    _limit_line(ax, report)


def utility_vs_privacy(report: ReportLike) -> Figure | None:
    """Relative validation-loss change against full precision (x) and the headline leakage (y), with their intervals.

    The utility budget and the leakage limit are drawn, the first-ranked quantizer circled ("recommended" only when
    it is cleared).

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        The figure, or None without a quantizer measured on both axes.
    """
    report = as_report(report)
    rows = [(r, headline_point(r)) for r in report.grid if finite(r.utility.relative_change)]
    rows = [(r, p) for r, p in rows if p is not None]
    if not rows:
        return None
    colors = quantizer_colors(report)
    recommendation = recommendation_of(report)
    rec = recommendation.quantizer
    circled = "recommended" if recommendation.cleared_for_release else "ranks first (not cleared)"
    fig = Figure(figsize=(6.6, 4.8))
    ax = fig.add_subplot(1, 1, 1)
    xs = [100 * r.utility.relative_change for r, _ in rows]
    for (r, (y, ci)), x in zip(rows, xs):
        uci = r.utility.relative_change_ci
        xci = [100 * uci[0], 100 * uci[1]] if uci and finite(uci[0]) and finite(uci[1]) else None
        ax.errorbar(x, y, xerr=yerr(x, xci), yerr=yerr(y, ci), fmt="o", color=colors[r.quantizer], capsize=3)
        if r.quantizer == rec:
            ax.plot(x, y, "o", ms=16, mfc="none", mec="green", mew=1.5, label=circled)
    left = min(min(xs), 0.0) - 1.0
    _budget(ax, report, left)
    if max(xs) > 50 and min(xs) >= 0:
        ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(left=left)
    label_points(ax, [(x, p[0], r.quantizer) for (r, p), x in zip(rows, xs)])
    ax.set_xlabel("validation loss change vs full precision (%)")
    ax.set_ylabel(headline_label(report))
    ax.set_title("Utility against privacy (lower left is better)", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return fig


def trajectory(report: ReportLike) -> Figure | None:
    """Mean validation loss along the training trajectory (checkpoint step), one line per quantizer.

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        The figure, or None without a trajectory in the result.
    """
    report = as_report(report)
    traj = report.result.get("trajectory")
    if not traj:
        return None
    colors = quantizer_colors(report)
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot(1, 1, 1)
    all_y = []
    for row in report.grid:
        curve = traj.get(row.quantizer)
        if not curve:
            continue
        y = [v if finite(v) else np.nan for v in curve["val_loss"]]
        all_y += [v for v in y if finite(v)]
        ax.plot(
            curve["checkpoint"],
            y,
            marker=".",
            color=colors[row.quantizer],
            lw=2.2 if row.is_reference else 1.3,
            label=row.quantizer,
        )
    if all_y and min(all_y) > 0 and max(all_y) / min(all_y) > 3:
        from matplotlib.ticker import ScalarFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_xlabel("checkpoint (optimizer step)")
    ax.set_ylabel("validation loss (nats/token), mean over runs")
    ax.set_title("Validation loss along the training trajectory", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, fontsize=8, frameon=False)
    ax.grid(alpha=0.3, which="both")
    return fig


PRIMARY_TASK_METRICS = (
    "smiles_exact_match",
    "caption_rouge_l",
    "text_rouge_l",
    "smiles_tanimoto",
    "caption_bleu4",
    "text_exact_match",
)
"""The task metric the privacy-utility figure shows when report.utility_metric is not one: the first measured."""


def _task_axis(report: ReportJson) -> str | None:
    """report.utility_metric when it is a measured task metric, else the first of PRIMARY_TASK_METRICS that
    differs between quantizers (a metric at 0 for all of them says nothing), else the first measured."""
    values: dict[str, set] = {}
    for r in report.grid:
        for n, m in r.utility.task_metrics.items():
            if finite(m.value):
                values.setdefault(n, set()).add(round(m.value, 9))
    chosen = report.checklist.thresholds.utility_metric
    if chosen in values:
        return chosen
    ordered = [n for n in PRIMARY_TASK_METRICS if n in values] + sorted(set(values) - set(PRIMARY_TASK_METRICS))
    return next((n for n in ordered if len(values[n]) > 1), ordered[0] if ordered else None)


def _utility_panel(ax, points: list[tuple[GridRow, float, list | None, float, list | None]], colors, lower_x) -> None:
    """One panel: a point per quantizer (x, its interval, the headline leakage, its interval), the Pareto front
    (no other quantizer both more private and more useful) joined and ringed, the points labelled."""
    for r, x, xci, y, yci in points:
        ax.errorbar(x, y, xerr=yerr(x, xci), yerr=yerr(y, yci), fmt="o", color=colors[r.quantizer], capsize=3, ms=6)
    xy = [(x, y) for _, x, _, y, _ in points]
    front = sorted((p for p, on in zip(xy, pareto_front(xy, lower_x_is_better=lower_x)) if on), reverse=not lower_x)
    ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="green", lw=1.0, drawstyle="steps-post")
    ax.plot(
        [p[0] for p in front], [p[1] for p in front], "o", ms=13, mfc="none", mec="green", mew=1.3, label="Pareto front"
    )
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)


def _kl_points(report: ReportJson) -> list:
    out = []
    for r in report.grid:
        kl, point = r.utility.divergence.kl_mean, headline_point(r)
        if kl is not None and finite(kl.mean) and point is not None:
            out.append((r, kl.mean, kl.ci, *point))
    return out


def _task_points(report: ReportJson, task: str | None) -> list:
    out = []
    for r in report.grid:
        m, point = r.utility.task_metrics.get(task) if task else None, headline_point(r)
        if m is not None and finite(m.value) and point is not None:
            out.append((r, m.value, m.ci, *point))
    return out


def privacy_utility(report: ReportLike) -> Figure | None:
    """The headline leakage of every quantizer against the mean KL from full precision and against a task metric.

    Lower leakage is more private, lower KL closer to full precision, a higher task metric better; each point carries
    its interval, and the Pareto front is marked.

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        The figure, or None with fewer than two quantizers on either panel.
    """
    report = as_report(report)
    task = _task_axis(report)
    kl_points, task_points = _kl_points(report), _task_points(report, task)
    if len(kl_points) < 2 and len(task_points) < 2:
        return None
    colors = quantizer_colors(report)
    fig = Figure(figsize=(11, 4.8))
    fig.subplots_adjust(wspace=0.32)
    if len(kl_points) >= 2:
        ax = fig.add_subplot(1, 2, 1)
        _utility_panel(ax, kl_points, colors, True)
        positive = [p[1] for p in kl_points if p[1] > 0]
        if positive:
            ax.set_xscale("symlog", linthresh=10 ** math.floor(math.log10(min(positive))))
        ax.set_xlabel("mean KL(p_ref || p_q) per validation token (nats)")
        ax.set_title("against the divergence from full precision", fontsize=10)
        ax.set_ylabel(headline_label(report))
        label_points(ax, [(p[1], p[3], p[0].quantizer) for p in kl_points])
    if len(task_points) >= 2:
        ax = fig.add_subplot(1, 2, 2)
        _utility_panel(ax, task_points, colors, False)
        ax.set_xlabel(f"{task} (higher = better), mean over runs")
        ax.set_title(f"against the task metric {task}", fontsize=10)
        ax.set_ylabel(headline_label(report))
        label_points(ax, [(p[1], p[3], p[0].quantizer) for p in task_points])
    fig.suptitle("Privacy against utility across quantizers (lower = more private)", fontsize=10)
    return fig


FIGURES: dict[str, tuple[Callable[[ReportLike], Figure | None], str]] = {
    "utility_vs_privacy": (utility_vs_privacy, "Utility against privacy: the headline leakage of every quantizer"),
    "trajectory": (trajectory, "Validation loss along the training trajectory"),
    "privacy_utility": (privacy_utility, "The headline leakage against KL divergence and a task metric, Pareto front"),
    "r_q_vs_attack": (r_q_vs_attack, "r_Q against the headline leakage and, as a diagnostic, the highest AUROC"),
    "r_q_intervals": (r_q_intervals, "r_Q per quantizer with its intervals"),
    "lira_roc": (lira_roc, "Diagnostic: offline LiRA's ROC per quantizer (log-log)"),
}
"""Every figure with its caption, in the order of the page: the two single figures of a row side by side."""

WIDE_FIGURES = ("r_q_vs_attack", "privacy_utility")
"""Figures drawn with two panels: the HTML gives them the full page width."""


def render_all(report: ReportLike) -> dict[str, bytes]:
    """Every figure the report has data for, in FIGURES order.

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        {figure name: PNG bytes}.
    """
    report = as_report(report)
    out = {}
    for name, (fn, _caption) in FIGURES.items():
        fig = fn(report)
        if fig is not None:
            out[name] = png(fig)
    return out
