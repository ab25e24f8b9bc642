"""A pair's verdict: the whole-window interval decides (``stats.equivalence_verdict``: a direction
is trusted even at a small effective sample, equivalence is not); the segments and the episode scan
(``stats.segment_differences``) only name the stretches that differ beyond the margin (a note, never
a verdict: one run's spike is not a difference of the runs, and more steps never make the answer
worse); a ``different`` that rests on single units (``stats.influential_units``, run only when a
cheap first-order screen says one could) becomes ``inconclusive``; the reason for the verdict as
data (``reasons``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cliptrack.compare import reasons as r
from cliptrack.compare import stats as st
from cliptrack.compare.findings import DifferenceSegment
from cliptrack.compare.stats import DIFFERENT, INCONCLUSIVE, INSUFFICIENT, Estimate, equivalence_verdict
from cliptrack.compare.stats.estimate import MIN_ESS, MIN_UNITS
from cliptrack.compare.stats.influence import ROBUST_Z
from cliptrack.compare.stats.intervals import difference_series


@dataclass(frozen=True)
class PairedUnits:
    """The units two runs both logged validly for one quantity: each run's numerator and denominator
    sums per unit (``num_a``/``den_a`` the reference's) and the units' ``x`` on the alignment axis."""

    num_a: np.ndarray
    den_a: np.ndarray
    num_b: np.ndarray
    den_b: np.ndarray
    x: np.ndarray

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.num_a, self.den_a, self.num_b, self.den_b


@dataclass(frozen=True)
class Judged:
    """A pair's verdict throughout the window and what decided it. ``why`` is None for
    ``insufficient data`` (the pair's own account of the missing data says why)."""

    verdict: str
    why: r.VerdictReason | None
    average: str
    segments: tuple[DifferenceSegment, ...]
    differing: tuple[DifferenceSegment, ...]
    influential: tuple[float, ...]


def whole_window(est: Estimate, verdict: str, tested: str) -> r.WholeWindow:
    """Why the whole-window interval ``est`` gives ``verdict``."""
    return r.WholeWindow(verdict, bool(est.low > 0 or est.high < 0), tested)


def _segments(pair: PairedUnits, found: Sequence[st.Segment]) -> list[DifferenceSegment]:
    """The stats' segments (unit ranges of the paired units) with their x ranges."""
    return [
        DifferenceSegment(
            float(pair.x[s.start]),
            float(pair.x[s.stop - 1]),
            int(s.start),
            int(s.stop),
            s.estimate,
            s.verdict,
            bool(s.episode),
        )
        for s in found
        if s.stop > s.start
    ]


HINGE_SAFETY = 3.0
"""Safety factor of the screen that skips the exact leave-one-out check (``could_hinge``)."""


def _hinges(drop: np.ndarray, n: int, gamma0: float, est: Estimate, distance: float) -> bool:
    k = drop.size
    if k == 0 or k > n // 10:
        return False
    spread = float(np.sum(drop * drop)) / (n * gamma0)
    effect = float(drop.sum()) / (n - k) + (est.high - est.low) / 2.0 * spread
    return HINGE_SAFETY * effect >= distance or est.ess * (1 - HINGE_SAFETY * spread) < MIN_ESS


def _near_a_gate(n: int, est: Estimate) -> bool:
    """Whether leaving out a unit could cross the unit or ESS gate (or there is no interval)."""
    return not est.has_interval or n - 1 < MIN_UNITS * 1.1 or not est.ess >= MIN_ESS * 1.5


def _robust_scores(z: np.ndarray) -> np.ndarray:
    """``|z - median| / (1.4826 MAD)``: the robust score of ``stats.influential_units``."""
    from_median = np.abs(z - np.median(z))
    mad = 1.4826 * float(np.median(from_median))
    return from_median / mad if mad > 0 else np.where(from_median > 0, np.inf, 0.0)


def could_hinge(pair: PairedUnits, est: Estimate, scale: str, tolerance: float) -> bool:
    """Whether leaving out one unit (or all robust outliers together) could change the whole-window
    verdict, by a first-order bound: the shift of the value, ``sum |z_i - mean| / (n - k)``, plus
    the change of the half-width, ``half * sum (z_i - mean)^2 / (n gamma0)``, times
    ``HINGE_SAFETY``, against the distance of the interval's bounds from ``±tolerance``; or the
    unit or ESS gates being near. Only when it could is the exact check
    (``stats.influential_units``, which refits the long-run variance per candidate unit) run."""
    n = pair.x.size
    if _near_a_gate(n, est):
        return True
    _, z = difference_series(*pair.arrays, scale)
    if not np.all(np.isfinite(z)):
        return False
    dev = np.abs(z - z.mean())
    gamma0 = float(np.mean(dev * dev))
    if not gamma0 > 0:
        return False
    robust = _robust_scores(z)
    distance = min(abs(b - t) for b in (est.low, est.high) for t in (-tolerance, tolerance))
    return any(
        _hinges(drop, n, gamma0, est, distance) for drop in (np.array([dev.max()]), dev[robust > ROBUST_Z])
    )


def judge(
    pair: PairedUnits,
    est: Estimate,
    scale: str,
    tolerance: float,
    confidence: float,
    align: str,
    influence: bool,
) -> Judged:
    """The pair's verdict (the whole window's), its reason, the segments, the stretches that differ
    beyond the margin (``differing``: named, not a verdict) and the deciding steps (for a quantity
    with a verdict, ``influence``; a diagnostic one gets its whole-window verdict only)."""
    average = equivalence_verdict(est, tolerance)
    if average == INSUFFICIENT:
        return Judged(INSUFFICIENT, None, average, (), (), ())
    if not influence:  # a diagnostic quantity (no verdict of its own): the whole window only
        return Judged(average, whole_window(est, average, r.WINDOW), average, (), (), ())
    found = st.segment_differences(*pair.arrays, scale=scale, confidence=confidence, tolerance=tolerance)
    segments = _segments(pair, found)
    differing = (
        tuple(s for s in segments if s.verdict == DIFFERENT)
        if len(segments) > 1 or any(s.episode for s in segments)
        else ()
    )
    why: r.VerdictReason = whole_window(est, average, r.WINDOW)
    units: list[int] = []
    if could_hinge(pair, est, scale, tolerance):
        units = st.influential_units(*pair.arrays, scale=scale, confidence=confidence, tolerance=tolerance)
    influential = tuple(float(pair.x[i]) for i in units)
    verdict = average
    # a spike decides it (not a unit that only moves the ESS across its gate: near the gate the
    # direction interval is already robust, GATED_SPREADS spreads of the series wide)
    if average == DIFFERENT and influential and not _near_a_gate(pair.x.size, est):
        verdict, why = INCONCLUSIVE, r.RestsOnUnits(influential, align == "step")
    return Judged(verdict, why, average, tuple(segments), differing, influential)
