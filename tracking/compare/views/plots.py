"""What each panel of ``panels.PANELS`` draws, in data units and independent of any plotting library.

``panel_figures(runset, result)`` returns one :class:`PanelFigure` per panel: its traces (lines,
markers, bands, shaded x spans, horizontal lines), axis titles and the x range shared by every
panel (so every panel has the same x ticks). The dashboard turns these into plotly figures and
``draw_matplotlib`` into matplotlib axes (the MLflow figures, the notebook), so every rendering
draws the same thing.

- Series panels: each run's per-step series (``series.run_series``). When the comparison has seed
  groups, each group is drawn as its mean over seeds at each step, thick, with a band of ± one
  standard deviation across its seeds at that step (the spread the verdict's interval includes),
  and every seed thin and faint in the group's colour; without groups each run is drawn as itself
  (the clip fraction with its rolling 90 % band and the per-step points).
- Difference panels ("difference over training"): for every compared run (or group) against the
  reference, the difference per segment of the window as a step line with its interval as a band,
  the whole window's difference as a dotted line, the ± margin as dashed lines, no difference, and
  the segments whose verdict is *different* shaded in the run's colour. A difference on the
  log-ratio scale is drawn as the ratio ``run / reference`` on a log axis (``PanelFigure.ratio``:
  ×2 is twice as much, the margin ±25 % the lines at ×1.25 and ×0.8). A difference judged over
  the whole window alone (a pair without segments, a group comparison too short for segments
  across seeds) is drawn as one segment spanning the window and marked ``segmented=False``: the
  dashboard leaves such a panel out (its numbers are in the differences table) rather than call a
  flat line "over training".

Lines longer than ``downsample.MAX_POINTS`` are downsampled (min and max per bucket) for drawing;
the result's tables keep the exact numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from cliptrack.compare.findings import DifferenceSegment, GroupSegment
from cliptrack.compare.result import ComparisonResult, Difference, GroupDifference
from cliptrack.compare.stats import DIFFERENT, LOG_RATIO
from cliptrack.compare.views import downsample
from cliptrack.compare.views.panels import PANELS, Panel
from cliptrack.compare.views.series import AXIS_TITLES, run_series
from cliptrack.compare.worst import WorstSequences
from cliptrack.core.worst import CRITERIA
from cliptrack.store.frame import RunSet

PALETTE = ("#1f77b4", "#9467bd", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#393b79")
"""Colours of the runs (or seed groups), in the comparison's order: none of them the verdicts'
green, red or orange, so a stack's colour never reads as a verdict."""

LINE, MARKERS, BAND, SPAN, HLINE = "line", "markers", "band", "span", "hline"
"""Trace kinds: ``band`` fills between ``y2`` (lower) and ``y`` (upper); ``span`` shades the x
range ``x[0]..x[1]`` over the full height; ``hline`` is a horizontal line at ``y[0]``."""


@dataclass(frozen=True)
class Trace:
    """One drawn element of a panel. ``name``: legend label (empty: not in the legend);
    ``group``: legend group (the run or seed group it belongs to); ``width`` in pixels."""

    kind: str
    x: np.ndarray
    y: np.ndarray
    color: str
    name: str = ""
    group: str = ""
    y2: np.ndarray | None = None
    dash: str = "solid"
    width: float = 1.5
    opacity: float = 1.0


@dataclass(frozen=True)
class PanelFigure:
    """One panel as drawn: its traces, axis titles, y format, and the x range shared by all panels.

    ``title``: the panel's title as drawn (its own, or for a difference panel without segments,
    one saying it is the whole window's); ``ratio``: the y values are ratios ``run / reference``,
    drawn on a log axis; ``segmented``: a difference panel with more than one segment for some
    compared run or group (always True for a series panel)."""

    panel: Panel
    traces: list[Trace]
    x_title: str
    y_title: str
    percent: bool
    x_range: tuple[float, float]
    notes: list[str] = field(default_factory=list)
    title: str = ""
    ratio: bool = False
    segmented: bool = True


class Spread(NamedTuple):
    """Points of a per-sequence spread: ``step``, ``value`` and ``datum`` of each sequence listed."""

    step: list[int]
    value: list[float]
    datum: list[int]


def _arr(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=float)


def stacks(result: ComparisonResult) -> dict[str, list[str]]:
    """The drawn stacks: each seed group with its runs when the result has groups (``groups``:
    group name to run labels), else each run as its own stack."""
    if result.groups:
        return {name: list(members) for name, members in result.groups.items()}
    return {label: [label] for label in result.runs}


def _colors(names: Sequence[str]) -> dict[str, str]:
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def _stack_name(result: ComparisonResult, stack: str, members: list[str]) -> str:
    if members == [stack]:
        return f"{stack} [{result.backends.get(stack, '')}]"
    return f"{stack} ({len(members)} seeds)"


def _line(x: np.ndarray, y: np.ndarray, color: str, **kw: Any) -> Trace:
    dx, dy = downsample.line(x, y)
    return Trace(LINE, dx, dy, color, **kw)


def _band(x: np.ndarray, low: np.ndarray, high: np.ndarray, color: str, group: str) -> Trace:
    dx, lo, hi = downsample.band(x, low, high)
    return Trace(BAND, dx, hi, color, group=group, y2=lo, opacity=0.18)


def _single_run(panel: Panel, s: pd.DataFrame, color: str, name: str) -> list[Trace]:
    x = _arr(s["x"])
    out = []
    if panel.band:
        out.append(_band(x, _arr(s["band_low"]), _arr(s["band_high"]), color, name))
        mx, my = downsample.line(x, _arr(s["clip_fraction"]))
        out.append(Trace(MARKERS, mx, my, color, group=name, width=4, opacity=0.45))
    for line in panel.lines:
        label = f"{name} {line.label}".strip()
        width = 2.0 if panel.band else 1.5
        out.append(_line(x, _arr(s[line.column]), color, name=label, group=name, dash=line.dash, width=width))
    return out


def _sd(values: np.ndarray, axis: int = 1) -> np.ndarray:
    """Row-wise sample standard deviation over the finite values (0 where a row has one)."""
    finite = np.isfinite(values)
    n = finite.sum(axis=axis)
    filled = np.where(finite, values, 0.0)
    mean = filled.sum(axis=axis) / np.maximum(n, 1)
    squares = (np.where(finite, values - mean[:, None], 0.0) ** 2).sum(axis=axis)
    return np.sqrt(squares / np.maximum(n - 1, 1))


def mean_and_spread(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row (a step) of ``values`` (one column per seed): the mean over the seeds that logged
    a finite value and their sample standard deviation (0 with one seed; NaN with none)."""
    mean = _nan_reduce(values, np.nanmean)
    sd = _nan_reduce(values, _sd)
    return mean, sd


def _seed_group(panel: Panel, seeds: list[pd.DataFrame], color: str, name: str) -> list[Trace]:
    """Per line: the band of ± one standard deviation across seeds at each step, every seed thin
    and faint, the mean over seeds thick (a fraction's band kept at or above 0)."""
    steps = seeds[0].index
    for s in seeds[1:]:
        steps = steps.union(s.index)
    aligned = [s.reindex(steps) for s in seeds]
    x = _nan_reduce(np.column_stack([_arr(s["x"]) for s in aligned]), np.nanmean)
    out = []
    for line in panel.lines:
        mean, sd = mean_and_spread(np.column_stack([_arr(s[line.column]) for s in aligned]))
        low = np.maximum(mean - sd, 0.0) if panel.percent else mean - sd
        out.append(_band(x, low, mean + sd, color, name))
        for s in aligned:
            out.append(
                _line(x, _arr(s[line.column]), color, group=name, dash=line.dash, width=0.8, opacity=0.35)
            )
        label = f"{name} {line.label}".strip() + ": mean ± sd over seeds"
        out.append(_line(x, mean, color, name=label, group=name, dash=line.dash, width=2.2))
    return out


def _nan_reduce(values: np.ndarray, fn: Any) -> np.ndarray:
    """Row-wise ``fn`` ignoring NaN; NaN where a row has no finite value."""
    finite = np.isfinite(values).any(axis=1)
    out = np.full(values.shape[0], np.nan)
    if finite.any():
        out[finite] = fn(values[finite], axis=1)
    return out


def _series_traces(
    panel: Panel, result: ComparisonResult, series: dict[str, pd.DataFrame], colors: dict[str, str]
) -> list[Trace]:
    out: list[Trace] = []
    for stack, members in stacks(result).items():
        name = _stack_name(result, stack, members)
        frames = [series[m] for m in members if m in series]
        if len(frames) == 1:
            out.extend(_single_run(panel, frames[0], colors[stack], name))
        elif frames:
            out.extend(_seed_group(panel, frames, colors[stack], name))
    return out


@dataclass(frozen=True)
class SegmentView:
    """One segment of a difference as drawn: x range, the difference with its interval, verdict."""

    start: float
    stop: float
    value: float
    low: float
    high: float
    verdict: str


def segment_views(d: Difference | GroupDifference, x_range: tuple[float, float]) -> list[SegmentView]:
    """The difference's segments in x order (each from ``start`` to ``end`` on the alignment axis;
    episodes found by the scan are segments of their own; a group's are across seeds); without
    segments, the whole window as one segment spanning ``x_range``."""
    segments: Sequence[DifferenceSegment | GroupSegment] = d.segments
    if not segments:
        e = d.estimate
        return [SegmentView(x_range[0], x_range[1], e.value, e.low, e.high, d.verdict)]
    return [
        SegmentView(seg.start, seg.end, seg.estimate.value, seg.estimate.low, seg.estimate.high, seg.verdict)
        for seg in sorted(segments, key=lambda seg: (seg.start, seg.end))
    ]


def _tiled(views: list[SegmentView]) -> list[SegmentView]:
    """Segments drawn edge to edge: each held until the next one starts (a segment's last step
    lasts until the next step), so no gap shows between consecutive segments."""
    out = []
    for view, following in zip(views, views[1:] + [None], strict=True):
        stop = following.start if following is not None and following.start > view.stop else view.stop
        out.append(replace(view, stop=stop))
    return out


def _steps(views: list[SegmentView], attr: str) -> tuple[np.ndarray, np.ndarray]:
    """A step line through the segments: each segment's value held over its x range."""
    x = np.array([v for seg in views for v in (seg.start, seg.stop)], dtype=float)
    y = np.array([getattr(seg, attr) for seg in views for _ in (0, 1)], dtype=float)
    return x, y


def _pair_traces(
    d: Difference | GroupDifference, color: str, x_range: tuple[float, float], name: str = ""
) -> list[Trace]:
    """One pair's (or group's) difference: differing segments and episodes shaded, the
    per-segment step line with its band, the whole window's difference dotted."""
    name = name or f"{d.run if isinstance(d, Difference) else d.group} − {d.reference}"
    views = _tiled(segment_views(d, x_range))
    shaded = [v for v in views if v.verdict == DIFFERENT]
    out = [Trace(SPAN, _arr([v.start, v.stop]), _arr([0.0]), color, group=name, opacity=0.12) for v in shaded]
    x, low = _steps(views, "low")
    _, high = _steps(views, "high")
    out.append(Trace(BAND, x, high, color, group=name, y2=low, opacity=0.2))
    x, value = _steps(views, "value")
    out.append(Trace(LINE, x, value, color, name=f"{name} per segment", group=name, width=2))
    whole = _arr([d.estimate.value, d.estimate.value])
    edges = _arr(x_range)
    out.append(Trace(LINE, edges, whole, color, name=f"{name} whole window", group=name, dash="dot"))
    return out


def _group_traces(d: GroupDifference, color: str, x_range: tuple[float, float]) -> list[Trace]:
    """One group's difference over seeds (its interval includes the between-seed variation): per
    segment across seeds like a pair's when it has two or more, else the whole window's band and
    value, dashed."""
    name = f"{d.group} − {d.reference} (over seeds)"
    if len(d.segments) > 1:
        return _pair_traces(d, color, x_range, name)
    edges = _arr(x_range)
    e = d.estimate
    return [
        Trace(BAND, edges, _arr([e.high, e.high]), color, group=name, y2=_arr([e.low, e.low]), opacity=0.12),
        Trace(LINE, edges, _arr([e.value, e.value]), color, name=name, group=name, dash="dash", width=2),
    ]


def _difference_traces(
    panel: Panel, result: ComparisonResult, colors: dict[str, str], x_range: tuple[float, float]
) -> list[Trace]:
    out: list[Trace] = []
    tolerances: set[tuple[float, str]] = set()
    if result.groups:
        for g in result.group_differences:
            if g.metric == panel.quantity:
                out += _group_traces(g, colors.get(g.group, PALETTE[1]), x_range)
                tolerances.add((g.tolerance, g.scale))
    else:
        for d in result.differences:
            if d.metric == panel.quantity:
                out += _pair_traces(d, colors.get(d.run, PALETTE[1]), x_range)
                tolerances.add((d.tolerance, d.scale))
    return out + _margin_lines(tolerances, x_range, panel.percent)


def _margin_label(tolerance: float, scale: str, percent: bool) -> str:
    """The legend of a margin line, in the panel's units: ``± margin 25 %`` on the log-ratio scale
    (drawn as ratios: the lines at ×1.25 and ×0.8), ``± margin 2 pp`` for a fraction, else the number."""
    if scale == LOG_RATIO:
        return f"± margin {math.expm1(tolerance) * 100:.3g} %"
    return f"± margin {tolerance * 100:.3g} pp" if percent else f"± margin {tolerance:.3g}"


def _margin_lines(
    tolerances: set[tuple[float, str]], x_range: tuple[float, float], percent: bool
) -> list[Trace]:
    """The ± margin lines of every finite tolerance (with the scale it is on), and the zero line."""
    out: list[Trace] = []
    edges = _arr(x_range)
    for tol, scale in sorted(t for t in tolerances if math.isfinite(t[0])):
        for sign in (-1.0, 1.0):
            label = _margin_label(tol, scale, percent) if sign > 0 else ""
            out.append(Trace(HLINE, edges, _arr([sign * tol]), "#555555", name=label, dash="dash", width=1))
    out.append(Trace(HLINE, edges, _arr([0.0]), "#999999", width=0.8))
    return out


RATIO_TITLE = "run / reference (log scale)"
"""The y title of a difference on the log-ratio scale, drawn as the ratio on a log axis."""


def _as_ratio(t: Trace) -> Trace:
    """A log-ratio trace as ratios (``exp``): what a reader reads (×2 is twice as much)."""
    if t.kind == SPAN:
        return t
    return replace(t, y=np.exp(t.y), y2=None if t.y2 is None else np.exp(t.y2))


def segmented(result: ComparisonResult, quantity: str) -> bool:
    """Whether some compared run (or group) has two or more segments on ``quantity``: only then is
    its difference drawn "over training"."""
    rows: list[Any] = result.group_differences if result.groups else result.differences
    return any(len(d.segments) > 1 for d in rows if d.metric == quantity)


def _difference_title(panel: Panel, ratio: bool, is_segmented: bool) -> str:
    """A difference panel's title: over training (per segment) or the whole window's alone."""
    label = panel.title.split(":")[0]
    what = "run / reference" if ratio else "difference"
    if is_segmented:
        return f"{label}: {what} over training (per segment, 90% band, ± margin)"
    return f"{label}: {what}, whole window (90% band, ± margin)"


def _difference_y_title(result: ComparisonResult, panel: Panel) -> str:
    rows: list[Any] = result.group_differences if result.groups else result.differences
    scales = {d.scale for d in rows if d.metric == panel.quantity}
    if scales == {LOG_RATIO}:
        return RATIO_TITLE
    return "run − reference (percentage points)" if panel.percent else "run − reference"


def _audit_traces(
    panel: Panel,
    runset: RunSet,
    result: ComparisonResult,
    series: dict[str, pd.DataFrame],
    colors: dict[str, str],
) -> list[Trace]:
    """On a series panel of a quantity a run also logged in a framework's own reduction
    (``result.audits``), that number per step, dashed, beside the exact line."""
    shown = {line.key for line in panel.lines}
    stack_of = {m: stack for stack, members in stacks(result).items() for m in members}
    out = []
    for a in result.audits:
        if result.quantity(a.metric).approximate_key not in shown or a.run not in series:
            continue
        s = series[a.run]
        wide = runset.wide(a.run)
        y = wide[a.name].reindex(s.index) if a.name in wide else pd.Series(np.nan, index=s.index)
        name = f"{a.run}: {a.framework}'s {a.name}"
        out.append(
            _line(
                _arr(s["x"]), _arr(y), colors[stack_of[a.run]], name=name, group=name, dash="dash", width=1.5
            )
        )
    return out


def x_range_of(series: dict[str, pd.DataFrame]) -> tuple[float, float]:
    """The x range every panel shares: from the lowest to the highest finite x of any drawn run."""
    lows, highs = [], []
    for s in series.values():
        x = _arr(s["x"])
        x = x[np.isfinite(x)]
        if len(x):
            lows.append(x.min())
            highs.append(x.max())
    if not lows:
        return (0.0, 1.0)
    lo, hi = min(lows), max(highs)
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def plot_series(runset: RunSet, result: ComparisonResult) -> dict[str, pd.DataFrame]:
    """``series.run_series`` of every drawn run (the compared runs, or every seed of every group)."""
    labels = [m for members in stacks(result).values() for m in members]
    return {label: run_series(runset, label, result.align, result.window) for label in labels}


def panel_figures(
    runset: RunSet, result: ComparisonResult, panels: Sequence[Panel] = PANELS
) -> list[PanelFigure]:
    """What every panel draws, in ``panels`` order (see the module docstring)."""
    series = plot_series(runset, result)
    colors = _colors(list(stacks(result)))
    x_range = x_range_of(series)
    x_title = AXIS_TITLES[result.align]
    out = []
    for panel in panels:
        if panel.quantity:
            traces = _difference_traces(panel, result, colors, x_range)
            y_title = _difference_y_title(result, panel)
            notes = [] if traces[:-1] else ["not compared: no run pair logged this quantity"]
            ratio, is_segmented = y_title == RATIO_TITLE, segmented(result, panel.quantity)
            if ratio:
                traces = [_as_ratio(t) for t in traces]
            title = _difference_title(panel, ratio, is_segmented)
        else:
            traces, y_title = _series_traces(panel, result, series, colors), panel.y_title
            traces += _audit_traces(panel, runset, result, series, colors)
            drawn = [t for t in traces if t.kind in (LINE, MARKERS) and np.isfinite(t.y).any()]
            notes = [] if drawn else ["not logged by the compared runs"]
            ratio, is_segmented, title = False, True, panel.title
            if result.groups and panel.band:  # a stack's band is its seeds' spread, not the rolling interval
                title = panel.title.replace("with 90% band", "mean over seeds ± sd")
        # a ratio is a plain number (its ticks are not percentages of anything)
        percent = panel.percent and not ratio
        out.append(
            PanelFigure(panel, traces, x_title, y_title, percent, x_range, notes, title, ratio, is_segmented)
        )
    return out


def nice_ticks(lo: float, hi: float, target: int = 8) -> tuple[float, float]:
    """``(first tick, tick spacing)`` for about ``target`` ticks over ``[lo, hi]``: spacing 1, 2 or
    5 times a power of ten; the first tick the first multiple of the spacing at or above ``lo``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        raise ValueError(f"x range must be finite and increasing, got [{lo}, {hi}]")
    raw = (hi - lo) / max(1, target)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step) * step
    if first < lo:  # lo / step underflowed (a subnormal lo) or rounded down
        first += step
    return first, step


RATIO_TICKS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 0.8, 1.0, 1.25, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
"""Candidate ticks of a ratio axis (log scale)."""


def ratio_label(r: float) -> str:
    """A ratio axis' tick label: ``×2`` from 2-fold either way, else the change (``+25 %``, ``−20 %``,
    ``×1`` at no difference)."""
    if r >= 2 or r <= 0.5:
        return f"×{r:g}"
    if r == 1:
        return "×1"
    change = (r - 1) * 100
    return f"{'+' if change > 0 else '−'}{abs(change):.3g} %"


def ratio_ticks(values: np.ndarray) -> list[tuple[float, str]]:
    """The ticks of a ratio axis spanning ``values`` (ratios; non-finite and non-positive ignored):
    the candidates of ``RATIO_TICKS`` within the span widened to the next candidate either side."""
    finite = values[np.isfinite(values) & (values > 0)]
    lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (1.0, 1.0)
    below = [t for t in RATIO_TICKS if t <= lo] or [RATIO_TICKS[0]]
    above = [t for t in RATIO_TICKS if t >= hi] or [RATIO_TICKS[-1]]
    return [(t, ratio_label(t)) for t in RATIO_TICKS if below[-1] <= t <= above[0]]


def worst_spread(worst: WorstSequences, criterion: str = CRITERIA[0]) -> dict[str, Spread]:
    """The per-sequence spread of each run's worst sequences by ``criterion``: per run, the step,
    the value under the criterion (nats) and the datum id of every sequence its tables list."""
    out = {}
    for run, tables in worst.tables.items():
        rows = [(w.step, s.value(criterion), s.datum) for w in tables for s in w.by.get(criterion, ())]
        out[run] = Spread([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    return out
