"""Segments, the episode scan and the throughout verdict (``cliptrack.compare.stats.segments``), on
synthetic counts whose truth is known; expected values from plain sums over the segments."""

from __future__ import annotations

import numpy as np
import pytest
from cliptrack.compare.stats import (
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    LOG_RATIO,
    MIN_SEGMENT_UNITS,
    Estimate,
    Segment,
    paired_difference,
    segment_bounds,
    segment_differences,
    throughout_verdict,
)
from cliptrack.compare.stats.segments import MAX_SEGMENTS
from hypothesis import given, settings
from hypothesis import strategies as st


def _runs(seed: int, n: int, *, phi: float = 0.5, shift: np.ndarray | float = 0.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for extra in (0.0, shift):
        x = np.zeros(n)
        for i in range(n):
            x[i] = (phi * x[i - 1] if i else 0.0) + rng.normal(0, 0.02 * np.sqrt(1 - phi * phi))
        tokens = rng.integers(5_000, 50_000, n).astype(float)
        p = np.clip(0.1 + x + extra, 0.001, 0.999)
        out += [rng.binomial(tokens.astype(int), p).astype(float), tokens]
    return out


@given(n=st.integers(0, 5000), min_units=st.integers(1, 600))
def test_segment_bounds_cover_the_window_in_equal_parts(n, min_units):
    bounds = segment_bounds(n, min_units=min_units)
    if n == 0:
        assert bounds == []
        return
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert len(bounds) == max(1, min(MAX_SEGMENTS, n // min_units))
    sizes = [e - s for s, e in bounds]
    assert max(sizes) - min(sizes) <= 1
    if len(bounds) > 1:
        assert min(sizes) >= min_units


def test_segment_bounds_refuse_bad_input():
    with pytest.raises(ValueError, match="n_units must be >= 0"):
        segment_bounds(-1)
    with pytest.raises(ValueError, match="min_units must be >= 1"):
        segment_bounds(10, min_units=0)


def test_segment_values_are_the_segments_ratio_of_sums_differences():
    ca, ta, cb, tb = _runs(1, 1000)
    segments = segment_differences(ca, ta, cb, tb, tolerance=0.02)
    assert [(s.start, s.stop) for s in segments] == segment_bounds(1000)
    for s in segments:
        sl = slice(s.start, s.stop)
        expected = cb[sl].sum() / tb[sl].sum() - ca[sl].sum() / ta[sl].sum()
        assert s.estimate.value == pytest.approx(expected, abs=1e-12)
        assert s.estimate.low < s.estimate.value < s.estimate.high
        assert s.verdict == EQUIVALENT and not s.episode


def test_equal_runs_are_equivalent_throughout():
    ca, ta, cb, tb = _runs(2, 1000)
    overall = paired_difference(ca, ta, cb, tb)
    t = throughout_verdict(overall, segment_differences(ca, ta, cb, tb, tolerance=0.02), 0.02)
    assert t.verdict == EQUIVALENT and t.differing == () and t.reason == ""


def test_an_episode_becomes_its_own_segment_and_is_named():
    n = 1000
    bump = np.zeros(n)
    bump[430:480] = 0.10  # +10 pp during 5 % of the steps
    ca, ta, cb, tb = _runs(3, n, shift=bump)
    overall = paired_difference(ca, ta, cb, tb)
    assert abs(overall.value) < 0.02  # the average alone is within the margin
    segments = segment_differences(ca, ta, cb, tb, tolerance=0.02)
    [episode] = [s for s in segments if s.episode]
    assert episode.verdict == DIFFERENT
    assert abs(episode.start - 430) <= 15 and abs(episode.stop - 480) <= 15
    assert segments[0].start == 0 and segments[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(segments, segments[1:], strict=False))
    t = throughout_verdict(overall, segments, 0.02)
    assert t.verdict == DIFFERENT
    assert (episode.start, episode.stop) in t.differing
    assert f"units {episode.start}-{episode.stop - 1}" in t.reason


def test_a_run_drifting_against_a_flat_one_differs_at_the_ends():
    n = 2000
    rng = np.random.default_rng(4)
    tokens = rng.integers(5_000, 50_000, (2, n)).astype(float)
    drift = np.linspace(0.15, 0.05, n)
    ca = rng.binomial(tokens[0].astype(int), drift).astype(float)
    cb = rng.binomial(tokens[1].astype(int), np.full(n, 0.10)).astype(float)
    overall = paired_difference(ca, tokens[0], cb, tokens[1])
    segments = segment_differences(ca, tokens[0], cb, tokens[1], tolerance=0.02)
    t = throughout_verdict(overall, segments, 0.02)
    assert t.verdict == DIFFERENT
    assert segments[0].verdict == DIFFERENT and segments[-1].verdict == DIFFERENT
    assert segments[0].estimate.value < -0.03 and segments[-1].estimate.value > 0.03


def _seg(start, stop, verdict):
    return Segment(start, stop, Estimate(0.0, -0.01, 0.01, stop - start, 0.1, 100.0, 10.0, 0.9), verdict)


def _overall(low, high, n=1000, ess=500.0):
    return Estimate(0.0, low, high, n, 0.1, ess, 10.0, 0.9)


@pytest.mark.parametrize(
    "overall,verdicts,expected",
    [
        (_overall(-0.01, 0.01), [EQUIVALENT, EQUIVALENT], EQUIVALENT),
        (_overall(-0.01, 0.01), [EQUIVALENT, INCONCLUSIVE], INCONCLUSIVE),
        (_overall(-0.01, 0.01), [EQUIVALENT, DIFFERENT], DIFFERENT),
        (_overall(-0.01, 0.03), [EQUIVALENT, EQUIVALENT], INCONCLUSIVE),
        (_overall(0.03, 0.05), [EQUIVALENT, EQUIVALENT], DIFFERENT),
        (_overall(-0.01, 0.01, ess=5.0), [EQUIVALENT, EQUIVALENT], INSUFFICIENT),
        (_overall(-0.01, 0.01), [EQUIVALENT, INSUFFICIENT], INCONCLUSIVE),
    ],
)
def test_throughout_rules(overall, verdicts, expected):
    segments = [_seg(0, 500, verdicts[0]), _seg(500, 1000, verdicts[1])]
    t = throughout_verdict(overall, segments, 0.02)
    assert t.verdict == expected
    named = tuple((s.start, s.stop) for s in segments if s.verdict != EQUIVALENT)
    assert t.differing == (named if expected != INSUFFICIENT else ())
    assert (t.reason == "") == (expected == EQUIVALENT)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(100, 1500), log=st.booleans())
def test_swapping_the_runs_mirrors_every_segment(seed, n, log):
    ca, ta, cb, tb = _runs(seed, n, shift=0.01)
    scale = LOG_RATIO if log else "absolute"
    tol = 0.2 if log else 0.02
    ab = segment_differences(ca, ta, cb, tb, scale=scale, tolerance=tol)
    ba = segment_differences(cb, tb, ca, ta, scale=scale, tolerance=tol)
    assert [(s.start, s.stop, s.verdict, s.episode) for s in ab] == [
        (s.start, s.stop, s.verdict, s.episode) for s in ba
    ]
    for x, y in zip(ab, ba, strict=True):
        assert x.estimate.value == pytest.approx(-y.estimate.value, abs=1e-12)
        assert x.estimate.low == pytest.approx(-y.estimate.high, abs=1e-12)


def test_self_comparison_is_equivalent_in_every_segment():
    ca, ta, _, _ = _runs(5, 1200)
    segments = segment_differences(ca, ta, ca, ta, tolerance=0.02)
    assert all(s.verdict == EQUIVALENT and s.estimate.value == 0 for s in segments)
    assert throughout_verdict(paired_difference(ca, ta, ca, ta), segments, 0.02).verdict == EQUIVALENT


def test_bad_input_is_named():
    ca, ta, cb, tb = _runs(6, 300)
    with pytest.raises(ValueError, match="tolerance must be > 0"):
        segment_differences(ca, ta, cb, tb, tolerance=0)
    with pytest.raises(ValueError, match="scale 'relative' is not one of"):
        segment_differences(ca, ta, cb, tb, scale="relative", tolerance=0.02)
    with pytest.raises(ValueError, match="one entry per unit"):
        segment_differences(ca[:-1], ta, cb, tb, tolerance=0.02)


def test_undefined_differences_give_insufficient_segments():
    ca, ta, cb, tb = _runs(7, 600)
    segments = segment_differences(ca, np.zeros(600), cb, tb, tolerance=0.02)
    assert segments and all(s.verdict == INSUFFICIENT and not s.estimate.has_interval for s in segments)
    assert MIN_SEGMENT_UNITS > 0 and INCONCLUSIVE
