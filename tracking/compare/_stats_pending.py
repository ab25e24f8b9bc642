"""Stand-ins for the statistics ``compute`` builds on, with their final names and signatures, used
until ``stats`` provides them (then this module goes away)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from tracking.compare.stats import (
    ABSOLUTE,
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    MIN_UNITS,
    Estimate,
    equivalence_verdict,
    paired_difference,
)
from tracking.compare.stats import ratio_estimate as _ratio

METHOD = "fixed-b HAC interval (Bartlett kernel, bandwidth 1 x units) on the linearised ratio of sums"


def _clamp(e: Estimate, bounds: tuple[float, float] | None) -> Estimate:
    if bounds is None or not e.has_interval:
        return e
    lo, hi = bounds
    return Estimate(
        e.value, max(lo, e.low), min(hi, e.high), e.n_units, e.lag1, e.ess, e.bandwidth, e.confidence
    )


def ratio_estimate(num, den, *, confidence=0.90, bounds=None):  # type: ignore[no-untyped-def]
    return _clamp(_ratio(num, den, confidence=confidence), bounds)


def step_weighted_estimate(num, den, *, confidence=0.90, bounds=None):  # type: ignore[no-untyped-def]
    num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num / den
    keep = np.isfinite(r)
    return _clamp(_ratio(r[keep], np.ones(int(keep.sum())), confidence=confidence), bounds)


@dataclass(frozen=True)
class Segment:
    start: int
    stop: int
    estimate: Estimate
    verdict: str


def segment_differences(num_a, den_a, num_b, den_b, *, scale=ABSOLUTE, confidence=0.90, tolerance):  # type: ignore[no-untyped-def]
    n = len(num_a)
    k = max(1, min(8, n // MIN_UNITS))
    edges = np.linspace(0, n, k + 1).astype(int)
    out = []
    for start, stop in zip(edges[:-1], edges[1:], strict=True):
        s = slice(int(start), int(stop))
        est = paired_difference(num_a[s], den_a[s], num_b[s], den_b[s], scale=scale, confidence=confidence)
        out.append(Segment(int(start), int(stop), est, equivalence_verdict(est, tolerance)))
    return out


@dataclass(frozen=True)
class Throughout:
    verdict: str
    differing: list[int]
    reason: str


def throughout_verdict(overall, segments, tolerance):  # type: ignore[no-untyped-def]
    verdict = equivalence_verdict(overall, tolerance)
    if verdict != EQUIVALENT:
        return Throughout(verdict, [], "")
    differing = [i for i, s in enumerate(segments) if s.verdict != EQUIVALENT]
    if not differing:
        return Throughout(EQUIVALENT, [], "every segment lies within the margin")
    worst = DIFFERENT if any(segments[i].verdict == DIFFERENT for i in differing) else INCONCLUSIVE
    return Throughout(worst, differing, "the average lies within the margin but a segment does not")


def influential_units(num_a, den_a, num_b, den_b, *, scale=ABSOLUTE, confidence=0.90, tolerance):  # type: ignore[no-untyped-def]
    arrays = [np.asarray(x, dtype=float) for x in (num_a, den_a, num_b, den_b)]
    n = arrays[0].size
    if n < MIN_UNITS:
        return []
    base = equivalence_verdict(paired_difference(*arrays, scale=scale, confidence=confidence), tolerance)
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.abs(arrays[2] / arrays[3] - arrays[0] / arrays[1])
    gap = np.where(np.isfinite(gap), gap, 0.0)
    out = []
    for i in np.argsort(-gap, kind="stable")[:5]:
        keep = np.ones(n, dtype=bool)
        keep[i] = False
        est = paired_difference(*(x[keep] for x in arrays), scale=scale, confidence=confidence)
        if equivalence_verdict(est, tolerance) != base:
            out.append(int(i))
    return sorted(out)


@dataclass(frozen=True)
class Lag:
    lag: int
    gain: float
    explained: float


def lead_lag(x_a, x_b):  # type: ignore[no-untyped-def]
    return None


@dataclass(frozen=True)
class GroupEstimate:
    value: float
    low: float
    high: float
    confidence: float
    seeds_a: int
    seeds_b: int
    between_sd_a: float
    between_sd_b: float
    df: float
    reason: str

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def group_difference(runs_a, runs_b, *, scale=ABSOLUTE, confidence=0.90):  # type: ignore[no-untyped-def]
    ra = np.array([float(np.sum(n)) / float(np.sum(d)) for n, d in runs_a])
    rb = np.array([float(np.sum(n)) / float(np.sum(d)) for n, d in runs_b])
    if scale != ABSOLUTE:
        ra, rb = np.log(ra), np.log(rb)
    value = float(rb.mean() - ra.mean())
    nan = float("nan")
    if len(ra) < 2 or len(rb) < 2:
        return GroupEstimate(
            value, nan, nan, confidence, len(ra), len(rb), nan, nan, nan, "fewer than 2 seeds"
        )
    sa, sb = float(ra.std(ddof=1)), float(rb.std(ddof=1))
    se = math.sqrt(sa * sa / len(ra) + sb * sb / len(rb))
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * se * 1.5
    df = float(len(ra) + len(rb) - 2)
    return GroupEstimate(value, value - half, value + half, confidence, len(ra), len(rb), sa, sb, df, "")


def group_verdict(estimate, tolerance):  # type: ignore[no-untyped-def]
    if not estimate.has_interval:
        return INSUFFICIENT
    if -tolerance < estimate.low and estimate.high < tolerance:
        return EQUIVALENT
    if estimate.low > tolerance or estimate.high < -tolerance:
        return DIFFERENT
    return INCONCLUSIVE


def seeds_needed(between_sd, within_se, margin):  # type: ignore[no-untyped-def]
    if not margin > 0 or not math.isfinite(between_sd):
        return 0
    z = 2 * 1.645
    return max(2, math.ceil(2 * (z * math.hypot(between_sd, within_se) / margin) ** 2))
