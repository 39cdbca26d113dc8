"""The figures: every one that shows a quantizer's leakage plots THE headline (the release decision's strongest
attack, with its interval), and no two point labels overlap, nor leave their axes, however crowded the points
(label boxes measured with matplotlib's text extents after the figure is drawn)."""

from __future__ import annotations

import copy
import itertools

import pytest
from matplotlib.container import ErrorbarContainer

from llmaudit.report.models import as_report
from llmaudit.report.plot_base import label_boxes
from llmaudit.report.plots import FIGURES, privacy_utility, r_q_vs_attack, utility_vs_privacy
from llmaudit.report.release import headline_of
from tests.report.test_one_answer import outputs

__all__ = ["outputs"]


def _points(ax) -> list[tuple[float, float]]:
    """(x, y) of every point drawn with its interval bars."""
    out = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            line = c.lines[0]
            out += list(zip(line.get_xdata(), line.get_ydata()))
    return out


def _with_divergence(report: dict) -> dict:
    """The report with a KL from full precision planted per quantizer (the store scored none)."""
    report = copy.deepcopy(report)
    for i, row in enumerate(report["grid"]):
        mean = 0.0 if row["is_reference"] else 0.05 * i
        row["utility"]["divergence"] = {"measured": True, "kl_mean": {"mean": mean, "ci": [0.8 * mean, 1.2 * mean]}}
    return report


def test_every_leakage_figure_plots_the_headline(outputs):
    report = _with_divergence(outputs["report"])
    heads = sorted(headline_of(r).value for r in as_report(report).grid)
    assert len(set(heads)) == 3
    fig = utility_vs_privacy(report)
    assert sorted(y for _, y in _points(fig.axes[0])) == pytest.approx(heads)
    assert "leakage: strongest attack's TPR at 1% FPR" in fig.axes[0].get_ylabel()
    assert "90% interval" in fig.axes[0].get_ylabel()  # the confidence report.json records
    fig = privacy_utility(report)
    assert sorted(y for _, y in _points(fig.axes[0])) == pytest.approx(heads)
    fig = r_q_vs_attack(report)
    headline_panel, diagnostic = fig.axes
    assert sorted(y for _, y in _points(headline_panel)) == pytest.approx(heads)
    assert diagnostic.get_ylabel().startswith("diagnostic:")  # the only other attack number, labelled as such


def _crowded(report: dict) -> dict:
    """Nine quantizers whose points pile up: six destroy the model to within a few percent of each other with
    the same leakage, three keep it, one on top of full precision."""
    report = _with_divergence(report)
    template = next(r for r in report["grid"] if not r["is_reference"])
    rows = [r for r in report["grid"] if r["is_reference"]]
    spots = [(0.001, 0.11), (0.66, 0.012), (0.70, 0.013), (0.72, 0.011), (0.75, 0.012), (0.78, 0.012), (0.80, 0.01)]
    spots += [(0.02, 0.10), (0.2, 0.04)]
    for i, (change, tpr) in enumerate(spots):
        row = copy.deepcopy(template)
        row["quantizer"] = ["hqq-4", "uniform-2", "sign", "ternary-50", "uniform-3", "ternary-33", "hqq-1"][i % 7]
        row["quantizer"] += "" if i < 7 else f"-{i}"
        row["utility"]["relative_change"], row["utility"]["relative_change_ci"] = change * 1000, None
        row["utility"]["divergence"]["kl_mean"] = {"mean": 5 + change, "ci": None}
        row["decision"]["strongest"]["tpr"] |= {"value": tpr, "low": tpr * 0.5, "high": tpr * 1.5}
        row["r_q"] |= {"mean": 0.01 + 0.001 * i, "ci": None}
        rows.append(row)
    report["grid"] = rows
    report["quantizers"] = [r["quantizer"] for r in rows]
    report["checklist"]["per_quantizer"] = {
        r["quantizer"]: next(iter(report["checklist"]["per_quantizer"].values())) for r in rows
    }
    return report


@pytest.mark.parametrize("crowded", [False, True])
def test_no_two_point_labels_overlap_or_leave_their_axes(outputs, crowded):
    report = _crowded(outputs["report"]) if crowded else _with_divergence(outputs["report"])
    drawn = 0
    for name, (draw, _caption) in FIGURES.items():
        fig = draw(report)
        if fig is None:
            continue
        boxes = label_boxes(fig)
        drawn += len(boxes)
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b), (name, a, b)
        areas = [ax.get_window_extent() for ax in fig.axes]
        for box in boxes:
            assert any(area.contains(box.x0, box.y0) and area.contains(box.x1, box.y1) for area in areas), (name, box)
    assert drawn >= (3 * 10 if crowded else 3 * 3)  # three figures label every quantizer
