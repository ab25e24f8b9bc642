"""Draw a ``plots.PanelFigure`` on a matplotlib axes: what the MLflow figures and the notebook use,
so they draw what the dashboard draws (the same traces, x range and ticks).

``draw(ax, figure)`` draws one panel; ``draw_all(runset, result)`` returns one matplotlib figure
per panel of ``panels.PANELS``, keyed by panel id (the caller saves or shows them).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from cliptrack.compare.result import ComparisonResult
from cliptrack.compare.views.plots import (
    BAND,
    HLINE,
    LINE,
    MARKERS,
    SPAN,
    PanelFigure,
    nice_ticks,
    panel_figures,
    ratio_ticks,
)
from cliptrack.store.frame import RunSet

STYLES = {"solid": "-", "dot": ":", "dash": "--"}
"""Matplotlib line styles of the traces' dash names."""


def _trace(ax: Any, t: Any) -> None:
    """Draw one trace on ``ax`` by its kind."""
    if t.kind == SPAN:
        ax.axvspan(t.x[0], t.x[1], color=t.color, alpha=t.opacity, linewidth=0)
    elif t.kind == BAND:
        ax.fill_between(t.x, t.y2, t.y, color=t.color, alpha=t.opacity, linewidth=0)
    elif t.kind == MARKERS:
        ax.plot(t.x, t.y, ".", color=t.color, alpha=t.opacity, markersize=t.width * 0.75)
    elif t.kind in (LINE, HLINE):
        y = t.y if t.kind == LINE else np.repeat(t.y[:1], len(t.x))
        style = STYLES.get(t.dash, "-")
        ax.plot(t.x, y, style, color=t.color, alpha=t.opacity, linewidth=t.width, label=t.name or None)


def draw(ax: Any, figure: PanelFigure) -> None:
    """Draw ``figure``'s traces, titles, y format and the shared x range and ticks on ``ax``."""
    from matplotlib.ticker import MultipleLocator, PercentFormatter

    for t in figure.traces:
        _trace(ax, t)
    lo, hi = figure.x_range
    first, step = nice_ticks(lo, hi)
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(MultipleLocator(step, offset=first % step))
    if figure.percent:
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    if figure.ratio:
        _ratio_axis(ax, figure)
    for note in figure.notes:
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", color="#666666")
    ax.set_title(figure.title or figure.panel.title, fontsize=10, loc="left")
    ax.set_xlabel(figure.x_title)
    ax.set_ylabel(figure.y_title)
    ax.grid(alpha=0.3)
    if any(t.name for t in figure.traces):
        ax.legend(fontsize=7)


def _ratio_axis(ax: Any, figure: PanelFigure) -> None:
    """A ratio panel's y axis: log scale, ticks labelled as ratios (``×2``) or changes (``+25 %``)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    values = [v for t in figure.traces for v in (t.y, t.y2) if v is not None and t.kind != SPAN]
    ticks = ratio_ticks(
        np.concatenate([np.asarray(v, dtype=float) for v in values]) if values else np.ones(1)
    )
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator([t for t, _ in ticks]))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticklabels([label for _, label in ticks])


def draw_all(
    runset: RunSet, result: ComparisonResult, size: tuple[float, float] = (8, 4.2)
) -> dict[str, Any]:
    """One matplotlib figure per panel (keyed by panel id), drawn with ``draw``."""
    import matplotlib.pyplot as plt

    out = {}
    for figure in panel_figures(runset, result):
        fig, ax = plt.subplots(figsize=size, dpi=100)
        draw(ax, figure)
        fig.tight_layout()
        out[figure.panel.id] = fig
    return out
