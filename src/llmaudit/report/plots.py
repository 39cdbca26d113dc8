"""The report's figures, drawn from a built report (`llmaudit.report.build_report`) as PNG bytes.

Every function takes the report dict and returns the PNG as bytes, or None when the report holds no data
for that figure (e.g. no LiRA ROC curves). Figures are drawn with matplotlib's object API on an Agg canvas:
no pyplot global state, no display needed, nothing is written to disk here (the report module writes
the files atomically and embeds the same bytes in report.html).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from llmaudit.common.io import atomic_write_bytes
from llmaudit.report.models import BestAttack, GridRow, ReportJson, as_report
from llmaudit.report.utility import pareto_front

ReportLike = dict[str, Any] | ReportJson

DPI = 110

REFERENCE_COLOR = "black"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _png(fig: Figure) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    # metadata=None entries drop the matplotlib version/date so the same report gives the same bytes
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def quantizer_colors(report: ReportLike) -> dict[str, Any]:
    """One color per quantizer, the same in every figure; the full-precision reference is black."""
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    colors, i = {}, 0
    for row in as_report(report).grid:
        if row.is_reference:
            colors[row.quantizer] = REFERENCE_COLOR
        else:
            colors[row.quantizer] = cmap(i % 10)
            i += 1
    return colors


def _label_points(ax, points: list[tuple[float, float, str]]) -> None:
    """Annotate points with names, pushing a label down when it would overlap one already placed
    (display coordinates, so it works on log and symlog axes; call after the scales are set)."""
    placed: list[tuple[float, float]] = []
    for x, y, name in sorted(points, key=lambda p: (-p[1], p[0])):
        px, py = ax.transData.transform((x, y))
        dy = 4.0
        while any(abs(px - qx) < 45 and abs(py + dy - qy) < 10 for qx, qy in placed):
            dy -= 10.0
        placed.append((px, py + dy))
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, dy * 72 / ax.figure.dpi), fontsize=8)


def _yerr(value: float, ci: list | None) -> list[list[float]] | None:
    if not ci or not _finite(ci[0]) or not _finite(ci[1]):
        return None
    return [[max(value - ci[0], 0.0)], [max(ci[1] - value, 0.0)]]


def _positive_log_ok(values: list[float]) -> bool:
    vals = [v for v in values if _finite(v)]
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 20


def _r_q_panel(ax, rows: list[GridRow], key: str, colors: dict[str, Any]) -> list[tuple[float, float, str]]:
    """One panel of r_q_vs_attack: a point per quantizer with its intervals; returns the points to label."""
    xs, labels = [], []
    for r in rows:
        best = getattr(r, key) or BestAttack(name="")
        y = best.value
        if not _finite(y):
            continue
        x = r.r_q.mean
        xs.append(x)
        ax.errorbar(
            x,
            y,
            xerr=_yerr(x, r.r_q.ci),
            yerr=_yerr(y, best.ci),
            fmt="o",
            color=colors[r.quantizer],
            capsize=3,
            ms=6,
            mfc="white" if best.reliable is False else colors[r.quantizer],
        )
        labels.append((x, y, r.quantizer))
    if _positive_log_ok(xs):
        ax.set_xscale("log")
    return labels


def r_q_vs_attack(report: ReportLike) -> bytes | None:
    """r_Q (x, log scale when it spans decades) against the best attack's calibrated TPR at 1% FPR and
    the best AUROC, one point per quantizer with 95% intervals, Spearman rho in each title."""
    report = as_report(report)
    rows = [r for r in report.grid if _finite(r.r_q.mean)]
    if len(rows) < 2:
        return None
    colors = quantizer_colors(report)
    fig = Figure(figsize=(11, 4.4))
    panels = (
        ("best_attack", "tpr_at_1pct_calibrated", "best attack: TPR at 1% FPR (calibrated)"),
        ("best_attack_by_auroc", "auroc", "best attack: AUROC"),
    )
    thr = report.checklist.thresholds.max_tpr_at_1pct_fpr
    for i, (key, metric, ylabel) in enumerate(panels):
        ax = fig.add_subplot(1, 2, i + 1)
        labels = _r_q_panel(ax, rows, key, colors)
        if metric == "auroc":
            ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        elif _finite(thr):
            ax.axhline(thr, color="firebrick", lw=0.8, ls="--", label=f"checklist limit {thr:g}")
            ax.legend(loc="best", fontsize=8)
        sp = report.r_q_vs_best_attack.get(metric)
        rho = sp.rho if sp is not None else None
        ax.set_title(f"Spearman rho = {rho:.2f}" if _finite(rho) else "Spearman rho: n/a", fontsize=10)
        ax.set_xlabel("r_Q (higher = more secure), mean over runs, 95% CI")
        ax.set_ylabel(ylabel)
        _label_points(ax, labels)
        ax.grid(alpha=0.3)
    fig.suptitle("r_Q against attack success across quantizers (open marker: estimate flagged unreliable)", fontsize=10)
    return _png(fig)


def _lira_entry(result: dict[str, Any], quantizer: str) -> dict[str, Any] | None:
    """The result's offline LiRA block for one quantizer (its ROC curves), or None."""
    entry: Any = result
    for key in ("attacks", "quantizers", quantizer, "attacks", "lira_offline"):
        entry = entry.get(key) if isinstance(entry, dict) else None
    return entry or None


def lira_roc(report: ReportLike) -> bytes | None:
    """Offline LiRA ROC on log-log axes, one curve per quantizer (per-sample calibrated, pooled)."""
    report = as_report(report)
    colors = quantizer_colors(report)
    curves = []
    for row in report.grid:
        entry = _lira_entry(report.result, row.quantizer)
        if not entry:
            continue
        rc = entry.get("roc_curve")
        curve = rc and (rc.get("pooled_calibrated") or rc.get("pooled_naive"))
        if curve and curve.get("fpr"):
            curves.append((row, curve))
    if not curves:
        return None
    fig = Figure(figsize=(5.6, 5.2))
    ax = fig.add_subplot(1, 1, 1)
    floor = 1e-4
    for row, curve in curves:
        fpr = np.asarray([v if _finite(v) else np.nan for v in curve["fpr"]], dtype=float)
        tpr = np.asarray([v if _finite(v) else np.nan for v in curve["tpr"]], dtype=float)
        lira = row.attacks.get("lira_offline")
        auroc = lira.auroc if lira is not None else None
        label = f"{row.quantizer} (AUROC {auroc:.2f})" if _finite(auroc) else row.quantizer
        ax.plot(
            np.maximum(fpr, floor),
            np.maximum(tpr, floor),
            color=colors[row.quantizer],
            lw=2.2 if row.is_reference else 1.3,
            label=label,
        )
    grid = np.logspace(-4, 0, 50)
    ax.plot(grid, grid, color="grey", lw=0.8, ls=":", label="chance")
    ax.axvline(0.01, color="grey", lw=0.6, ls="--")
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(floor, 1),
        ylim=(floor, 1.05),
        xlabel="false positive rate",
        ylabel="true positive rate",
    )
    ax.set_title("Offline LiRA ROC per quantizer (log-log, calibrated)", fontsize=10)
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return _png(fig)


def r_q_intervals(report: ReportLike) -> bytes | None:
    """r_Q per quantizer: mean over runs with the 95% bootstrap interval, sorted by r_Q."""
    report = as_report(report)
    rows = [r for r in report.grid if _finite(r.r_q.mean)]
    if not rows:
        return None
    rows.sort(key=lambda r: r.r_q.mean)
    colors = quantizer_colors(report)
    fig = Figure(figsize=(6.4, 0.45 * len(rows) + 1.4))
    ax = fig.add_subplot(1, 1, 1)
    for i, r in enumerate(rows):
        m = r.r_q.mean
        ax.errorbar(m, i, xerr=_yerr(m, r.r_q.ci), fmt="o", color=colors[r.quantizer], capsize=3)
    ax.set_yticks(range(len(rows)), [r.quantizer + (" (ref)" if r.is_reference else "") for r in rows])
    if _positive_log_ok([r.r_q.mean for r in rows] + [r.r_q.ci[0] for r in rows]):
        ax.set_xscale("log")
    thr = report.checklist.thresholds.min_r_q
    if _finite(thr) and thr > 0:
        ax.axvline(thr, color="firebrick", lw=0.8, ls="--", label=f"checklist minimum {thr:g}")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("r_Q (higher = more secure): mean over runs, 95% bootstrap CI")
    ax.set_title("Attack-free indicator r_Q per quantizer", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    return _png(fig)


def _budget_and_limit(ax, th: Any, left: float) -> None:
    """The utility budget (shaded) and the TPR limit (dashed) of utility_vs_privacy."""
    if _finite(th.max_utility_loss):
        ax.axvspan(
            left,
            100 * th.max_utility_loss,
            color="green",
            alpha=0.07,
            label=f"utility budget (+{100 * th.max_utility_loss:g}% loss)",
        )
    if _finite(th.max_tpr_at_1pct_fpr):
        limit = th.max_tpr_at_1pct_fpr
        ax.axhline(limit, color="firebrick", lw=0.8, ls="--", label=f"TPR limit {limit:g}")


def utility_vs_privacy(report: ReportLike) -> bytes | None:
    """Relative validation-loss change vs full precision (x) against the best attack's calibrated TPR at
    1% FPR (y); the utility budget and the TPR limit drawn, the recommended quantizer circled."""
    report = as_report(report)
    rows = [
        r
        for r in report.grid
        if _finite(r.utility.relative_change) and r.best_attack is not None and _finite(r.best_attack.value)
    ]
    if not rows:
        return None
    colors = quantizer_colors(report)
    rec = report.recommendation.quantizer
    fig = Figure(figsize=(6.4, 4.6))
    ax = fig.add_subplot(1, 1, 1)
    xs = [100 * r.utility.relative_change for r in rows]
    for r, x in zip(rows, xs):
        best, ci = r.best_attack, r.utility.relative_change_ci
        xci = [100 * ci[0], 100 * ci[1]] if ci and _finite(ci[0]) and _finite(ci[1]) else None
        color = colors[r.quantizer]
        mfc = "white" if best.reliable is False else color
        ax.errorbar(
            x, best.value, xerr=_yerr(x, xci), yerr=_yerr(best.value, best.ci), fmt="o", color=color, capsize=3, mfc=mfc
        )
        if r.quantizer == rec:
            ax.plot(x, best.value, "o", ms=16, mfc="none", mec="green", mew=1.5, label="recommended")
    left = min(min(xs), 0.0) - 1.0
    _budget_and_limit(ax, report.checklist.thresholds, left)
    if max(xs) > 50 and min(xs) >= 0:
        ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(left=left)
    _label_points(ax, [(x, r.best_attack.value, r.quantizer) for r, x in zip(rows, xs)])
    ax.set_xlabel("validation loss change vs full precision (%)")
    ax.set_ylabel("best attack: TPR at 1% FPR (calibrated)")
    ax.set_title("Utility against privacy (lower left is better; open marker: unreliable)", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    return _png(fig)


def trajectory(report: ReportLike) -> bytes | None:
    """Mean validation loss along the training trajectory (checkpoint step), one line per quantizer."""
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
        y = [v if _finite(v) else np.nan for v in curve["val_loss"]]
        all_y += [v for v in y if _finite(v)]
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
    return _png(fig)


PRIMARY_TASK_METRICS = (
    "smiles_exact_match",
    "caption_rouge_l",
    "text_rouge_l",
    "smiles_tanimoto",
    "caption_bleu4",
    "text_exact_match",
)
"""The task metric the privacy-utility figure shows when report.utility_metric is not one: the first measured."""


def _privacy_axis(rows: list[GridRow]) -> tuple[str, str]:
    """(grid key, label) of the figure's privacy axis: the best attack's calibrated TPR at 1% FPR when every
    quantizer's is reliable, else the best attack's AUROC (small experiments: too few non-members for 1%)."""
    if rows and all(r.best_attack is not None and r.best_attack.reliable for r in rows):
        return "best_attack", "best attack: TPR at 1% FPR (calibrated)"
    return "best_attack_by_auroc", "best attack: AUROC"


def _task_axis(report: ReportJson) -> str | None:
    """report.utility_metric when it is a measured task metric, else the first of PRIMARY_TASK_METRICS that
    differs between quantizers (a metric at 0 for all of them says nothing), else the first measured."""
    values: dict[str, set] = {}
    for r in report.grid:
        for n, m in r.utility.task_metrics.items():
            if _finite(m.value):
                values.setdefault(n, set()).add(round(m.value, 9))
    chosen = report.checklist.thresholds.utility_metric
    if chosen in values:
        return chosen
    ordered = [n for n in PRIMARY_TASK_METRICS if n in values] + sorted(set(values) - set(PRIMARY_TASK_METRICS))
    return next((n for n in ordered if len(values[n]) > 1), ordered[0] if ordered else None)


def _utility_panel(ax, rows, colors, xs, xcis, ykey, *, lower_x_is_better: bool) -> None:
    """One panel: a point per quantizer with interval bars, the Pareto front joined and ringed."""
    points = []
    for r, x, xci in zip(rows, xs, xcis):
        best = getattr(r, ykey)
        ax.errorbar(
            x,
            best.value,
            xerr=_yerr(x, xci),
            yerr=_yerr(best.value, best.ci),
            fmt="o",
            color=colors[r.quantizer],
            capsize=3,
            ms=6,
        )
        points.append((x, best.value))
    front = [p for p, on in zip(points, pareto_front(points, lower_x_is_better=lower_x_is_better)) if on]
    front.sort(key=lambda p: p[0], reverse=not lower_x_is_better)
    ax.plot([p[0] for p in front], [p[1] for p in front], "--", color="green", lw=1.0, drawstyle="steps-post")
    ax.plot(
        [p[0] for p in front], [p[1] for p in front], "o", ms=13, mfc="none", mec="green", mew=1.3, label="Pareto front"
    )
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)


def _y(r: GridRow, ykey: str) -> float | None:
    best = getattr(r, ykey)
    return None if best is None else best.value


def privacy_utility(report: ReportLike) -> bytes | None:
    """Privacy against utility, one point per quantizer with 95% intervals: the best attack (y, lower = more
    private) against the mean KL from full precision (left, lower = closer) and against a task metric (right,
    higher = better); the Pareto front (no other quantizer is both more private and more useful) marked."""
    report = as_report(report)
    grid = report.grid
    kl_rows = [
        r for r in grid if r.utility.divergence.kl_mean is not None and _finite(r.utility.divergence.kl_mean.mean)
    ]
    task = _task_axis(report)
    task_rows = [
        r for r in grid if task and task in r.utility.task_metrics and _finite(r.utility.task_metrics[task].value)
    ]
    ykey, ylabel = _privacy_axis(kl_rows or task_rows)
    kl_rows = [r for r in kl_rows if _finite(_y(r, ykey))]
    task_rows = [r for r in task_rows if _finite(_y(r, ykey))]
    if len(kl_rows) < 2 and len(task_rows) < 2:
        return None
    colors = quantizer_colors(report)
    fig = Figure(figsize=(11, 4.6))
    if len(kl_rows) >= 2:
        ax = fig.add_subplot(1, 2, 1)
        stats = [r.utility.divergence.kl_mean for r in kl_rows]
        xs = [s.mean for s in stats]
        _utility_panel(ax, kl_rows, colors, xs, [s.ci for s in stats], ykey, lower_x_is_better=True)
        positive = [x for x in xs if x > 0]
        if positive:
            ax.set_xscale("symlog", linthresh=10 ** math.floor(math.log10(min(positive))))
        ax.set_xlabel("mean KL(p_ref || p_q) per validation token (nats), 95% CI over runs")
        ax.set_ylabel(ylabel)
        ax.set_title("against the divergence from full precision", fontsize=10)
        _label_points(ax, [(x, _y(r, ykey), r.quantizer) for r, x in zip(kl_rows, xs)])
    if len(task_rows) >= 2:
        ax = fig.add_subplot(1, 2, 2)
        ms = [r.utility.task_metrics[task] for r in task_rows]
        xs = [m.value for m in ms]
        _utility_panel(ax, task_rows, colors, xs, [m.ci for m in ms], ykey, lower_x_is_better=False)
        ax.set_xlabel(f"{task} (higher = better), mean over runs, 95% CI")
        ax.set_ylabel(ylabel)
        ax.set_title(f"against the task metric {task}", fontsize=10)
        _label_points(ax, [(x, _y(r, ykey), r.quantizer) for r, x in zip(task_rows, xs)])
    fig.suptitle("Privacy against utility across quantizers (lower = more private)", fontsize=10)
    return _png(fig)


FIGURES: dict[str, tuple[Callable[[ReportLike], bytes | None], str]] = {
    "r_q_vs_attack": (r_q_vs_attack, "r_Q against the best attack across quantizers"),
    "lira_roc": (lira_roc, "Offline LiRA ROC per quantizer (log-log)"),
    "r_q_intervals": (r_q_intervals, "r_Q per quantizer with 95% intervals"),
    "utility_vs_privacy": (utility_vs_privacy, "Utility against privacy"),
    "privacy_utility": (privacy_utility, "Privacy against KL divergence and a task metric, Pareto front marked"),
    "trajectory": (trajectory, "Validation loss along the training trajectory"),
}

WIDE_FIGURES = ("r_q_vs_attack", "privacy_utility")
"""Figures drawn with two panels: the HTML gives them the full page width."""


def render_all(report: ReportLike) -> dict[str, bytes]:
    """{figure name: PNG bytes} for every figure the report has data for, in FIGURES order."""
    report = as_report(report)
    out = {}
    for name, (fn, _caption) in FIGURES.items():
        png = fn(report)
        if png is not None:
            out[name] = png
    return out


def plot_roc_loglog(results: Mapping, path: str | Path) -> list[Path]:
    """One log-log ROC PNG per quantizer: offline LiRA (calibrated) and the best other attack (naive and
    calibrated), with the chance line. Files: PATH_STEM_<quantizer>.png next to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    written = []
    grid = np.logspace(-4, 0, 50)
    for q, block in results["quantizers"].items():
        fig, ax = plt.subplots(figsize=(5, 5))
        curves = []
        if "lira_offline" in block["attacks"]:
            curves.append(("LiRA offline", block["attacks"]["lira_offline"]["roc_curve"].get("pooled_calibrated"), "-"))
        best = block.get("best_attack")
        if best:
            rc = block["attacks"][best]["roc_curve"]
            curves.append((f"{best} (pooled naive)", rc.get("pooled_naive"), "--"))
            curves.append((f"{best} (calibrated)", rc.get("pooled_calibrated"), ":"))
        for label, curve, style in curves:
            if curve:
                ax.plot(curve["fpr"], np.maximum(curve["tpr"], 1e-5), style, label=label)
        ax.plot(grid, grid, color="grey", lw=0.8, label="chance")
        ax.set(
            xscale="log",
            yscale="log",
            xlim=(1e-4, 1),
            ylim=(1e-4, 1.05),
            xlabel="false positive rate",
            ylabel="true positive rate",
            title=f"ROC, quantizer {q}",
        )
        ax.legend(loc="lower right", fontsize=8)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(q))
        written.append(atomic_write_bytes(path.parent / f"{path.stem}_{safe}.png", buf.getvalue()))
    return written
