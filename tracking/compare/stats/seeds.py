"""Stacks compared over seeds: group estimates whose intervals include the between-seed variation.

Each seed (run) of a group gives its window's ratio of sums ``R_i``. A group's value is the
**mean over seeds** of ``R_i`` (every seed weighs the same, so one long or token-heavy seed does not
stand for the stack; the stack-level question is "what does a seed of this stack do"). The
difference of two groups is ``mean_b - mean_a`` (or ``s log(mean_b / mean_a)`` on the log-ratio
scale, delta method), with the standard error from the seeds' own spread,
``sqrt(s_a^2 / m_a + s_b^2 / m_b)``: that spread contains both the seed-to-seed variation and each
seed's sampling noise, so the interval covers both. Critical values are t with Welch–Satterthwaite
degrees of freedom. Two or more seeds per group are needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cliptrack.compare.stats.estimate import ABSOLUTE, SCALES
from cliptrack.compare.stats.quantiles import t_critical, t_quantile


@dataclass(frozen=True)
class GroupEstimate:
    """Group b minus group a over seeds. ``value``/``low``/``high``: on the scale's units (NaN bounds
    when there is no interval, with ``reason``); ``seeds_a``/``seeds_b``: seeds per group;
    ``between_sd_a``/``between_sd_b``: standard deviation of the seeds' ratios per group (the
    quantity's units); ``df``: Welch degrees of freedom."""

    value: float
    low: float
    high: float
    confidence: float
    seeds_a: int
    seeds_b: int
    between_sd_a: float
    between_sd_b: float
    df: float
    reason: str = ""

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def _seed_ratios(runs: Sequence[tuple[np.ndarray, np.ndarray]], group: str) -> np.ndarray:
    out = []
    for i, (num, den) in enumerate(runs):
        num, den = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
        if num.shape != den.shape:
            raise ValueError(f"group {group}, seed {i}: numerator and denominator differ in length")
        total = float(den.sum())
        if total == 0 or not math.isfinite(total) or not np.all(np.isfinite(num)):
            raise ValueError(
                f"group {group}, seed {i}: the ratio of sums is undefined (denominator total {total})"
            )
        out.append(float(num.sum()) / total)
    return np.array(out)


def _sd(ratios: np.ndarray) -> float:
    """The seeds' sample standard deviation (NaN below 2 seeds)."""
    return float(ratios.std(ddof=1)) if ratios.size > 1 else float("nan")


def _mean(ratios: np.ndarray) -> float:
    return float(ratios.mean()) if ratios.size else float("nan")


def _on_scale(mean_a: float, mean_b: float, scale: str) -> tuple[float, float, float] | None:
    """``(value, ga, gb)``: the difference of the group means on ``scale`` and the derivatives that carry
    each group's standard error onto it; None when a log-ratio is undefined (zero or opposite signs)."""
    if scale == ABSOLUTE:
        return mean_b - mean_a, 1.0, 1.0
    if mean_a != 0 and mean_b != 0 and (mean_a > 0) == (mean_b > 0):
        sign = 1.0 if mean_a > 0 else -1.0
        return sign * math.log(mean_b / mean_a), 1.0 / abs(mean_a), 1.0 / abs(mean_b)
    return None


def group_difference(
    runs_a: Sequence[tuple[np.ndarray, np.ndarray]],
    runs_b: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    scale: str = ABSOLUTE,
    confidence: float = 0.90,
) -> GroupEstimate:
    """Group b minus group a, each run given as ``(num, den)`` unit arrays (see the module docstring)."""
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} is not one of {SCALES}")
    ra, rb = _seed_ratios(runs_a, "a"), _seed_ratios(runs_b, "b")
    ma, mb = ra.size, rb.size
    nan = float("nan")
    sd_a, sd_b = _sd(ra), _sd(rb)
    found = _on_scale(_mean(ra), _mean(rb), scale)
    if found is None:
        reason = "log-ratio undefined: group means of zero or opposite signs"
        return GroupEstimate(nan, nan, nan, confidence, ma, mb, sd_a, sd_b, nan, reason)
    value, ga, gb = found
    if ma < 2 or mb < 2:
        reason = f"needs 2 or more seeds per group (a has {ma}, b has {mb}): between-seed variation cannot be measured"
        return GroupEstimate(value, nan, nan, confidence, ma, mb, sd_a, sd_b, nan, reason)
    va, vb = (ga * sd_a) ** 2 / ma, (gb * sd_b) ** 2 / mb
    se = math.sqrt(va + vb)
    if se == 0:
        return GroupEstimate(value, value, value, confidence, ma, mb, sd_a, sd_b, math.inf)
    df = (va + vb) ** 2 / (va * va / (ma - 1) + vb * vb / (mb - 1))
    half = t_critical(confidence, df) * se
    return GroupEstimate(value, value - half, value + half, confidence, ma, mb, sd_a, sd_b, df)


def _check_seed_inputs(between_sd: float, within_se: float, margin: float, power: float) -> None:
    for name, x in (("between_sd", between_sd), ("within_se", within_se)):
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {x}")
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a finite number > 0, got {margin}")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")


MAX_SEEDS = 10_000
"""Most seeds per group ``seeds_needed`` looks at."""


def seeds_needed(
    between_sd: float, within_se: float, margin: float, *, confidence: float = 0.90, power: float = 0.8
) -> int:
    """Seeds per group for the group difference's interval to fall within ``±margin`` with
    probability ``power`` when the stacks are equal: the smallest ``m >= 2`` with
    ``margin / se >= t_{df}((1 + confidence) / 2) + z((1 + power) / 2)``, ``se = sqrt(2 v / m)``,
    ``v = between_sd^2 + within_se^2`` (one seed's variance around the stack's value, in the
    quantity's units squared), ``df = 2 m - 2``. Raises ValueError when no number up to 10,000 does."""
    _check_seed_inputs(between_sd, within_se, margin, power)
    v = between_sd**2 + within_se**2
    if v == 0:
        return 2
    z = t_quantile(0.5 + power / 2.0, math.inf)

    def enough(m: int) -> bool:
        return margin / math.sqrt(2.0 * v / m) >= t_critical(confidence, 2 * m - 2) + z

    lo, hi = 1, 2  # enough(hi) is sought; the rule is monotone in m
    while hi <= MAX_SEEDS and not enough(hi):
        lo, hi = hi, hi * 2
    if hi > MAX_SEEDS and not enough(MAX_SEEDS):
        raise ValueError(
            f"margin {margin:g} is too small for seed sd {math.sqrt(v):g}: more than 10,000 seeds per group needed"
        )
    hi = min(hi, MAX_SEEDS)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return max(2, hi)
