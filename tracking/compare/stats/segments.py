"""Equivalence throughout the window: segments, an episode scan and the intersection–union verdict.

The window is split into ``k = min(MAX_SEGMENTS, n // min_units)`` equal segments
(``segment_bounds``); on top, an **episode scan** looks for the short run of units where the two
runs differ most beyond the margin (windows of ``EPISODE_MIN_UNITS`` units up to a quarter of the
window, at every quarter-width offset). When that episode is significant at a family-wise level
(Bonferroni over the windows scanned), it becomes a segment of its own, cutting the equal segments
around it, so that a short burst is neither diluted in its segment nor split in two.

Every segment's difference is the exact difference of the two runs' ratios of sums over the
segment. Its interval uses the long-run variance of the whole window's paired series around its
trend (with the episode's level removed when there is one, whose effective sample size then also
gates the segments; the noise level is taken to be the same along the window), and the t critical
value with that estimate's degrees of freedom. Its long-memory correction applies only where long
memory is significant (``memory.GATE``), not wherever ``d_hat > 0`` as for the window's own
interval: the correction is the window's variance of the mean over the cosines' expectation, and a
segment's mean, over a quarter of the window or less, reaches frequencies where that factor is
smaller (the variance of a mean of ``L`` units grows like ``L^(2d - 1)``); applied to every
segment at ``d_hat + WIDEN se`` for white noise with ``d_hat > 0`` by chance, it cost the
throughout test a fifth of its power on stationary runs (AR 0.5, 1,000 steps: 88 % to 77 %).
The window's own test, which every "equivalent" also needs, keeps the size.

Verdicts (``throughout_verdict``): **equivalent** only if the whole window and every segment are
equivalent (an intersection–union test: each part is a level-5 % test of "outside the margin", so
the conjunction is too, without multiplicity correction); **different** if the whole window is, or
if a segment's interval at the Bonferroni-corrected level (or the episode at the scan's level) lies
beyond the margin; otherwise **inconclusive**, naming the segments not shown within the margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cliptrack.compare.stats import memory
from cliptrack.compare.stats.estimate import (
    ABSOLUTE,
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    MIN_ESS,
    MIN_SEGMENT_UNITS,
    MIN_UNITS,
    SCALES,
    Estimate,
    equivalence_verdict,
    interval_verdict,
)
from cliptrack.compare.stats.intervals import as_arrays, difference_series, nan_estimate
from cliptrack.compare.stats.lrv import LongRunVariance, long_run_variance
from cliptrack.compare.stats.quantiles import t_critical, t_quantile
from cliptrack.compare.stats.windows import scan_windows

MAX_SEGMENTS = 8
"""Most equal segments of a window."""
EPISODE_MIN_UNITS = 10
"""Shortest episode the scan looks for (units)."""


@dataclass(frozen=True)
class Segment:
    """A stretch of paired units ``[start, stop)`` (indices into the paired units, half-open), the
    difference over it and its verdict; ``episode``: found by the episode scan."""

    start: int
    stop: int
    estimate: Estimate
    verdict: str
    episode: bool = False


@dataclass(frozen=True)
class Throughout:
    """The verdict over the whole window and all its segments; ``differing``: the ``(start, stop)``
    unit ranges not shown within the margin; ``reason``: why, in words ("" when equivalent)."""

    verdict: str
    differing: tuple[tuple[int, int], ...]
    reason: str


def segment_bounds(n_units: int, *, min_units: int = MIN_SEGMENT_UNITS) -> list[tuple[int, int]]:
    """``k = clamp(n_units // min_units, 1, MAX_SEGMENTS)`` equal half-open ranges covering ``0..n_units``."""
    if n_units < 0:
        raise ValueError(f"n_units must be >= 0, got {n_units}")
    if min_units < 1:
        raise ValueError(f"min_units must be >= 1, got {min_units}")
    if n_units == 0:
        return []
    k = max(1, min(MAX_SEGMENTS, n_units // min_units))
    cuts = [round(i * n_units / k) for i in range(k + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class _Sums:
    """Running totals of the four series, for any segment's exact difference in O(1)."""

    def __init__(self, arrays: list[np.ndarray], scale: str) -> None:
        self.c = [np.concatenate([[0.0], np.cumsum(a)]) for a in arrays]
        self.scale = scale

    def difference(self, start: np.ndarray, stop: np.ndarray) -> np.ndarray:
        na, da, nb, db = (c[stop] - c[start] for c in self.c)
        with np.errstate(divide="ignore", invalid="ignore"):
            ra, rb = na / da, nb / db
            if self.scale == ABSOLUTE:
                return rb - ra
            sign = np.where(ra > 0, 1.0, -1.0)
            ok = (ra != 0) & (rb != 0) & ((ra > 0) == (rb > 0))
            return np.where(ok, sign * np.log(np.abs(rb) / np.abs(np.where(ok, ra, 1.0))), np.nan)


def _episode(
    z: np.ndarray, sums: _Sums, tolerance: float, v: LongRunVariance
) -> tuple[int, int, LongRunVariance, float] | None:
    """The most significant window beyond the margin, with the variance refitted around it and its
    standardised excess, or None when no window is significant at the family-wise 5 % level."""
    n = z.size
    start, stop = scan_windows(n, max(EPISODE_MIN_UNITS, n // 200), n // 4)
    if start.size == 0 or not v.lrv[0] > 0:
        return None
    d = sums.difference(start, stop)
    score = (np.abs(np.nan_to_num(d)) - tolerance) * np.sqrt(stop - start)
    best = int(np.argmax(score))
    if not score[best] > 0:
        return None
    s, e = int(start[best]), int(stop[best])
    indicator = np.zeros((n, 1))
    indicator[s:e, 0] = 1.0
    refit = long_run_variance(z, extra=indicator, floor=False)
    excess = score[best] / math.sqrt(float(refit.lrv[0]))
    family = 2 * int(np.sum(np.ceil(n / np.unique(stop - start))))  # disjoint windows per width, two sides
    if excess > t_quantile(1.0 - 0.05 / family, float(refit.df[0])):
        return s, e, refit, float(excess)
    return None


def _kept(c: int, n: int, episode: tuple[int, int], shortest: int) -> bool:
    """Whether cut ``c`` stays: an end of the window or of the episode, or a quarter of the shortest
    equal segment away from both ends of the episode."""
    s0, e0 = episode
    return c in (0, n, s0, e0) or (abs(c - s0) >= shortest / 4 and abs(c - e0) >= shortest / 4)


def _cut(
    n: int, bounds: list[tuple[int, int]], episode: tuple[int, int] | None
) -> list[tuple[int, int, bool]]:
    """Segment bounds with the episode as a segment of its own (fragments under a quarter of the
    shortest equal segment merged into their neighbour)."""
    if episode is None:
        return [(s, e, False) for s, e in bounds]
    s0, e0 = episode
    shortest = min(e - s for s, e in bounds)
    outside = {b for pair in bounds for b in pair if not s0 < b < e0}
    cuts = [c for c in sorted(outside | {s0, e0}) if _kept(c, n, episode, shortest)]
    return [(s, e, (s, e) == (s0, e0)) for s, e in zip(cuts[:-1], cuts[1:], strict=True)]


def _segment_estimate(value: float, s: int, e: int, v: LongRunVariance, confidence: float) -> Estimate:
    length = e - s
    lrv, df = float(v.lrv[0]), float(v.df[0])
    half = t_critical(confidence, df) * math.sqrt(lrv / length)
    ess = min(float(length), length * float(v.gamma0[0]) / lrv) if lrv > 0 else float(length)
    return Estimate(
        value,
        value - half,
        value + half,
        length,
        float(v.lag1[0]),
        ess,
        length / max(int(v.terms[0]), 1),
        confidence,
        lrv=lrv,
        df=df,
        trend_terms=int(v.trend_terms[0]),
        long_memory=bool(v.long_memory[0]),
        memory=float(v.memory[0]),
        memory_tested=bool(v.memory_tested[0]),
    )


def _segment_verdict(est: Estimate, tolerance: float, k: int, episode: bool, gated: bool) -> str:
    if gated or not est.has_interval or (not episode and not est.ess >= MIN_ESS):
        return INSUFFICIENT
    if episode:
        return DIFFERENT
    plain = interval_verdict(est.low, est.high, tolerance)
    if plain != DIFFERENT or k == 1:
        return plain
    # "different" for one of k segments: Bonferroni-corrected interval, so no segment is called
    # different by chance among k
    wider = t_critical(1.0 - (1.0 - est.confidence) / k, est.df) / t_critical(est.confidence, est.df)
    half = (est.high - est.low) / 2.0 * wider
    return interval_verdict(est.value - half, est.value + half, tolerance)


def _check_settings(scale: str, tolerance: float) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} is not one of {SCALES}")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")


def segment_differences(
    num_a: np.ndarray,
    den_a: np.ndarray,
    num_b: np.ndarray,
    den_b: np.ndarray,
    *,
    scale: str = ABSOLUTE,
    confidence: float = 0.90,
    tolerance: float,
    min_units: int = MIN_SEGMENT_UNITS,
) -> list[Segment]:
    """Run b minus run a over each segment of the paired units (``segment_bounds`` plus a detected
    episode, see the module docstring), each with its interval and verdict against ``±tolerance``
    (on ``scale``'s units: log-ratio units for ``"log-ratio"``)."""
    _check_settings(scale, tolerance)
    arrays = as_arrays("segment_differences", num_a, den_a, num_b, den_b)
    n = arrays[0].size
    bounds = segment_bounds(n, min_units=min_units)
    if not bounds:
        return []
    value, z = difference_series(arrays[0], arrays[1], arrays[2], arrays[3], scale)
    if not (math.isfinite(value) and np.all(np.isfinite(z))) or n < 2:
        return [Segment(s, e, nan_estimate(float("nan"), e - s, confidence), INSUFFICIENT) for s, e in bounds]
    return _estimated(arrays, z, bounds, scale, confidence, tolerance)


def _estimated(
    arrays: list[np.ndarray],
    z: np.ndarray,
    bounds: list[tuple[int, int]],
    scale: str,
    confidence: float,
    tolerance: float,
) -> list[Segment]:
    """The segments (the equal ones, cut around an episode if the scan finds one) with their
    differences, intervals and verdicts, for finite linearised differences ``z``."""
    n = z.size
    sums = _Sums(arrays, scale)
    v = long_run_variance(z, memory_gate=memory.GATE)  # see the module docstring: long memory
    found = _episode(z, sums, tolerance, v)
    pieces = _cut(n, bounds, None if found is None else found[:2])
    noise = v if found is None else found[2]
    gated = n < MIN_UNITS or not float(noise.ess[0]) >= MIN_ESS
    values = sums.difference(np.array([p[0] for p in pieces]), np.array([p[1] for p in pieces]))
    out = []
    for (s, e, episode), val in zip(pieces, values, strict=True):
        est = _segment_estimate(float(val), s, e, noise, confidence)
        out.append(Segment(s, e, est, _segment_verdict(est, tolerance, len(bounds), episode, gated), episode))
    return out


def _ranges(segments: Sequence[Segment], verdicts: tuple[str, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((s.start, s.stop) for s in segments if s.verdict in verdicts)


def _named(ranges: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"units {s}-{e - 1}" for s, e in ranges)


def throughout_verdict(overall: Estimate, segments: Sequence[Segment], tolerance: float) -> Throughout:
    """``equivalent`` only if ``overall`` and every segment are equivalent; ``different`` if the whole
    window or a segment is different; ``insufficient data`` if the whole window has too little data;
    otherwise ``inconclusive``. ``differing`` names the segments not shown within the margin."""
    whole = equivalence_verdict(overall, tolerance)
    if whole == INSUFFICIENT:
        return Throughout(INSUFFICIENT, (), overall.insufficiency())
    different = _ranges(segments, (DIFFERENT,))
    unclear = _ranges(segments, (INCONCLUSIVE, INSUFFICIENT))
    differing = _ranges(segments, (DIFFERENT, INCONCLUSIVE, INSUFFICIENT))
    if whole == DIFFERENT:
        return Throughout(DIFFERENT, differing, "the whole window differs beyond the margin")
    if different:
        return Throughout(
            DIFFERENT,
            differing,
            f"the runs differ beyond the margin during {_named(different)}"
            + (" (the whole window is within it)" if whole == EQUIVALENT else ""),
        )
    if whole == EQUIVALENT and not unclear:
        return Throughout(EQUIVALENT, (), "")
    if whole == EQUIVALENT:
        return Throughout(
            INCONCLUSIVE,
            differing,
            f"the whole window is within the margin but {_named(unclear)} are not shown to be",
        )
    return Throughout(INCONCLUSIVE, differing, "the whole window is not shown within the margin")
