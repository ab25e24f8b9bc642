"""The tidy frame, the wide tables and the duplicate report against a plain-Python reference.

Runs are drawn with steps in and out of order, steps logged twice (with equal and with different
values), points without metrics, NaN values and token counts that start late, so that both the
in-order path and the general path of the build are compared with the same reference.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from cliptrack.compare import RunSet
from cliptrack.core import keys
from cliptrack.store.frame import LoadedRun, Point
from cliptrack.store.records import RunInfo
from hypothesis import given, settings
from hypothesis import strategies as st

NAMES = (keys.LOSS_TOKENS, keys.CLIPPED_TOKENS, keys.REWARD)
VALUES = st.one_of(st.integers(0, 9).map(float), st.just(math.nan))


@st.composite
def runs(draw: st.DrawFn) -> list[Point]:
    """Points of one run: steps in order or shuffled (a few negative or far apart, so that the keys
    are sometimes too sparse to count, anywhere in the int64 range, and sometimes both of its
    extremes in one run), some logged again, some without metrics."""
    step = st.one_of(
        st.integers(0, 29),
        st.integers(-3, -1),
        st.integers(10**9, 10**9 + 2),
        st.integers(-(2**63), 2**63 - 1),
        st.sampled_from([-(2**63), 2**63 - 1, 2**62]),
    )
    steps = draw(st.lists(step, min_size=1, max_size=40))
    if draw(st.booleans()):
        steps += [-(2**63), 2**63 - 1]
    if draw(st.booleans()):
        steps = sorted(steps)
    points = []
    for i, step in enumerate(steps):
        names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=3))
        metrics = {name: draw(VALUES) for name in names}
        points.append(Point(step=step, wall_time=1000.0 + draw(st.integers(0, 50)) + i, metrics=metrics))
    return points


def _reference(
    points: list[Point],
) -> tuple[list[tuple[int, str, float, float, float]], dict[str, list[int]]]:
    """Rows (step, metric, value, wall_time, tokens_seen) in the frame's order, and the duplicates.

    A step's rows come in the order of each key's last entry; the last value wins; a step's wall
    time is its latest entry's, and elapsed time counts from the earliest step's; tokens seen are the running sum of finite token counts, NaN before the first."""
    walls: dict[int, float] = {}
    last: dict[tuple[int, str], tuple[int, float]] = {}
    seen: dict[tuple[int, str], list[float]] = {}
    position = 0
    for point in points:
        walls[point.step] = max(walls.get(point.step, -math.inf), point.wall_time)
        for name, value in point.metrics.items():
            position += 1
            last[(point.step, name)] = (position, value)
            seen.setdefault((point.step, name), []).append(value)
    tokens = {s: v for (s, name), (_, v) in last.items() if name == keys.LOSS_TOKENS and math.isfinite(v)}
    running, cumulative = 0.0, {}
    for step in sorted(walls):
        running += tokens.get(step, 0.0)
        cumulative[step] = running if tokens and step >= min(tokens) else math.nan
    rows = []
    for (step, name), (_, value) in sorted(last.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        rows.append((step, name, value, walls[step], cumulative[step]))
    duplicates: dict[str, list[int]] = {}
    for (step, name), values in sorted(seen.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if len({"nan" if math.isnan(v) else v for v in values}) > 1:
            duplicates.setdefault(name, []).append(step)
    return rows, duplicates


@settings(max_examples=150, deadline=None)
@given(points=runs())
def test_frame_wide_table_and_duplicates_match_a_plain_reference(points):
    runset = RunSet.from_points([(LoadedRun(RunInfo("r", "r", "megatron"), "memory"), points)])
    rows, duplicates = _reference(points)
    frame = runset.frame
    got = list(
        zip(
            frame["step"].tolist(),
            frame["metric"].tolist(),
            frame["value"].tolist(),
            frame["wall_time"].tolist(),
            frame["tokens_seen"].tolist(),
            strict=True,
        )
    )
    assert len(got) == len(rows)
    for a, b in zip(got, rows, strict=True):
        assert a[:2] == b[:2]
        for x, y in zip(a[2:], b[2:], strict=True):
            assert (math.isnan(x) and math.isnan(y)) or x == y, (a, b)
    steps_walls = {p.step: max(q.wall_time for q in points if q.step == p.step) for p in points}
    first_wall = min(steps_walls.values())  # a step's time is its latest entry's
    assert np.array_equal(frame["elapsed_s"].to_numpy(), frame["wall_time"].to_numpy() - first_wall)
    assert {d.metric: list(d.steps) for d in runset.runs[0].duplicates} == duplicates

    wide = runset.wide("r")
    steps_with_metrics = sorted({s for s, *_ in rows})
    assert wide.index.tolist() == steps_with_metrics
    names = sorted({name for _, name, *_ in rows})
    assert list(wide.columns) == ["tokens_seen", "wall_time", "elapsed_s", *names]
    expected = pd.DataFrame(np.nan, index=wide.index, columns=names)
    for step, name, value, *_ in rows:
        expected.loc[step, name] = value
    pd.testing.assert_frame_equal(wide[names], expected, check_names=False, check_column_type=bool(names))
