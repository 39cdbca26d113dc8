"""What the report's figures share: one color per quantizer, PNG bytes from a matplotlib Figure, interval bars,
THE headline leakage of a quantizer as a point, and point labels placed so that no two overlap."""

from __future__ import annotations

import io
import math
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from llmaudit.report.answer import level, proportion_bounds
from llmaudit.report.models import GridRow, ReportJson, as_report
from llmaudit.report.release import headline_of

ReportLike = dict[str, Any] | ReportJson

DPI = 110

REFERENCE_COLOR = "black"

LABEL_GID = "point-label"
"""The gid of every point label (`label_points`): what the tests read to check that no two labels overlap."""


def finite(x: Any) -> bool:
    """Whether a value is a finite number (not a bool).

    Args:
        x: the value.

    Returns:
        True for a finite int or float.
    """
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def png(fig: Figure) -> bytes:
    """A figure as PNG bytes, the same bytes for the same figure (no version or date in the metadata).

    Args:
        fig: the figure.

    Returns:
        The PNG.
    """
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    # metadata=None entries drop the matplotlib version/date so the same report gives the same bytes
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return buf.getvalue()


def quantizer_colors(report: ReportLike) -> dict[str, Any]:
    """One color per quantizer, the same in every figure; the full-precision reference is black.

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        {quantizer: color}.
    """
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


def yerr(value: float, ci: list | None) -> list[list[float]] | None:
    """A point's error bar for matplotlib from its interval.

    Args:
        value: the point.
        ci: its interval [low, high], or None.

    Returns:
        [[below], [above]], or None without a finite interval.
    """
    if not ci or not finite(ci[0]) or not finite(ci[1]):
        return None
    return [[max(value - ci[0], 0.0)], [max(ci[1] - value, 0.0)]]


def positive_log_ok(values: list[float]) -> bool:
    """Whether values suit a log axis: all finite ones positive and spread over more than a factor of 20.

    Args:
        values: the values.

    Returns:
        True when a log axis shows them better.
    """
    vals = [v for v in values if finite(v)]
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) > 20


def headline_point(row: GridRow) -> tuple[float, list[float] | None] | None:
    """The headline leakage of a quantizer as a point.

    Args:
        row: the quantizer's grid row.

    Returns:
        (value, [low, high] or None); None where it was not measured.
    """
    e = headline_of(row)
    if e is None or not finite(e.value):
        return None
    low, high = proportion_bounds(e)
    return float(e.value), ([low, high] if finite(low) and finite(high) else None)


def headline_label(report: ReportJson, fpr: str = "1%") -> str:
    """The axis label of the headline leakage, with its interval's confidence as recorded.

    Args:
        report: the typed report.
        fpr: the false positive rate in words.

    Returns:
        The label, on two lines.
    """
    levels = sorted({level(e.confidence) for e in (headline_of(r) for r in report.grid) if e and e.confidence})
    ci = f", {'/'.join(levels)} interval" if levels else ""
    return f"leakage: strongest attack's TPR at {fpr} FPR\n(cross-fitted{ci})"


_DIRECTIONS = ((1, 0.3), (1, -1), (-1, 0.3), (-1, -1), (1, 1), (-1, 1), (0, 1), (0, -1))
"""Where a label may go around its point (x, y signs of the offset), tried in order at each distance."""

_DISTANCES = (5, 12, 20, 30, 42, 56, 72, 90)
"""Distances of a label from its point, in points, tried in order; from the third on a thin line joins them."""


def _renderer(fig: Figure) -> Any:
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    return canvas.get_renderer()


def _annotate(ax, name: str, xy: tuple[float, float], offset: tuple[float, float], far: bool) -> Any:
    dx, dy = offset
    return ax.annotate(
        name,
        xy,
        textcoords="offset points",
        xytext=(dx, dy),
        ha="left" if dx > 0 else "right" if dx < 0 else "center",
        va="bottom" if dy > 0 else "top" if dy < 0 else "center",
        fontsize=8,
        gid=LABEL_GID,
        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey", "shrinkA": 0, "shrinkB": 3} if far else None,
    )


def _text_box(ann: Any, renderer: Any) -> Any:
    """The display box of a label's text alone (an annotation's own extent includes its leader line)."""
    ann.update_positions(renderer)
    return Text.get_window_extent(ann, renderer)


def _clash(box: Any, area: Any, placed: list, markers: list) -> float:
    """How badly a label box sits: 0 when inside the axes, clear of the labels placed and of the other markers."""
    outside = max(0.0, area.x0 - box.x0) + max(0.0, box.x1 - area.x1) + max(0.0, area.y0 - box.y0)
    outside += max(0.0, box.y1 - area.y1)
    overlap = sum(
        max(0.0, min(box.x1, b.x1) - max(box.x0, b.x0)) * max(0.0, min(box.y1, b.y1) - max(box.y0, b.y0))
        for b in placed
    )
    covered = sum(1 for mx, my in markers if box.x0 - 3 <= mx <= box.x1 + 3 and box.y0 - 3 <= my <= box.y1 + 3)
    return 1000.0 * outside + overlap + 100.0 * covered


def label_points(ax, points: list[tuple[float, float, str]]) -> None:
    """Name each point at the first free place around it.

    The places are `_DIRECTIONS` at each of `_DISTANCES`; a place is free when the text box lies inside the axes,
    overlaps no label placed before it and covers no other point (display coordinates measured by the renderer, so it
    works on log and symlog axes; call after the scales and limits are set); where no place is free, the least crowded
    one. A label away from its point gets a thin line to it.

    Args:
        ax: the matplotlib axes.
        points: (x, y, name) of each point.
    """
    renderer = _renderer(ax.figure)
    ax.get_xlim(), ax.get_ylim()  # the limits autoscaled now: transData is stale until they are read
    area = ax.get_window_extent(renderer)
    shown = [(x, y, name, ax.transData.transform((x, y))) for x, y, name in points]
    placed: list = []
    for x, y, name, own in sorted(shown, key=lambda p: (-p[1], p[0])):
        markers = [m for *_, m in shown if abs(m[0] - own[0]) + abs(m[1] - own[1]) > 0.5]
        best = None
        for r in _DISTANCES:
            for sx, sy in _DIRECTIONS:
                ann = _annotate(ax, name, (x, y), (sx * r, sy * r), r >= 20)
                box = _text_box(ann, renderer).expanded(1.04, 1.08)
                score = _clash(box, area, placed, markers)
                if best is None or score < best[0]:
                    if best is not None:
                        best[1].remove()
                    best = (score, ann, box)
                else:
                    ann.remove()
                if score == 0:
                    break
            if best[0] == 0:
                break
        placed.append(best[2])


def label_boxes(fig: Figure) -> list[Any]:
    """The display boxes of every point label of a figure (`label_points`), as drawn.

    Args:
        fig: the figure.

    Returns:
        The boxes.
    """
    renderer = _renderer(fig)
    fig.draw_without_rendering()
    return [_text_box(t, renderer) for ax in fig.axes for t in ax.texts if t.get_gid() == LABEL_GID]
