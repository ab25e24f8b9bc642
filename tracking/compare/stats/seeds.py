"""Stacks compared over seeds: group estimates whose intervals include the between-seed variation.

Each seed (run) of a group gives its window's ratio of sums ``R_i``. A group's value is the
**mean over seeds** of ``R_i`` (every seed weighs the same, so one long or token-heavy seed does not
stand for the stack; the stack-level question is "what does a seed of this stack do"). The
difference of two groups is ``mean_b - mean_a`` (or ``s log(mean_b / mean_a)`` on the log-ratio
scale, delta method), with the standard error from the seeds' own spread,
``sqrt(s_a^2 / m_a + s_b^2 / m_b)``: that spread contains both the seed-to-seed variation and each
seed's sampling noise, so the interval covers both. Critical values are t with Welch–Satterthwaite
degrees of freedom. Two or more seeds per group are needed.

**Within-run uncertainty.** A seed's ratio is ``R_i = mu + b_i + e_i`` (stack value, seed effect,
the run's own sampling error), so ``Var(R_i) = sigma_b^2 + sigma_e^2``: the seeds' sample variance
already estimates the within-run part together with the between-seed part, and adding each run's
own standard error on top would count it twice. The simulation (``simulation.run_level``) checks
the coverage at 2-5 seeds with the seed spread from 0.5x to 3x the within-run spread.

**Probability that b exceeds a** (``probability_greater``): ``F_t(value / se; df)``, Student's t
distribution function at the standardised difference with the Welch degrees of freedom. It is the
posterior probability that group b's value is above group a's under a flat prior on the difference
and the t model the interval uses (equivalently, one minus the one-sided p-value of "b is not
above a"); at no true difference it is uniform on (0, 1), so it exceeds 95 % in 5 % of
comparisons.

**Segments across seeds** (``segment_verdict``, ``stack_verdict``): the same step range of every
seed, each seed's ratio of sums over it, the same Welch interval. A stack-level verdict is the
window's over seeds (the window average is the estimand, as for a pair); segments only name the
stretches shown to differ: the verdict is different when the window is, or when a segment's
Bonferroni-widened interval lies beyond the margin; an inconclusive or untestable segment does not
block "equivalent" (it says nothing against the window's interval, and the window's TOST keeps
"equivalent" at the margin at or below its 5 % size; a segment can only take "equivalent" away).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from cliptrack.compare.stats.estimate import (
    ABSOLUTE,
    DIFFERENT,
    INSUFFICIENT,
    SCALES,
    GroupEstimate,
    interval_verdict,
)
from cliptrack.compare.stats.quantiles import t_critical, t_quantile


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
        return GroupEstimate(value, value, value, confidence, ma, mb, sd_a, sd_b, math.inf, se=0.0)
    df = (va + vb) ** 2 / (va * va / (ma - 1) + vb * vb / (mb - 1))
    half = t_critical(confidence, df) * se
    return GroupEstimate(value, value - half, value + half, confidence, ma, mb, sd_a, sd_b, df, se=se)


def segment_verdict(est: GroupEstimate, tolerance: float, k: int) -> str:
    """One segment's verdict among ``k``: the plain interval's, except that "different" needs the
    interval widened to the Bonferroni level ``1 - (1 - confidence) / k`` to lie beyond the margin
    (so no segment is called different by chance among ``k``)."""
    if not est.has_interval:
        return INSUFFICIENT
    plain = interval_verdict(est.low, est.high, tolerance)
    if plain != DIFFERENT or k == 1 or not math.isfinite(est.df):
        return plain
    wider = t_critical(1.0 - (1.0 - est.confidence) / k, est.df) / t_critical(est.confidence, est.df)
    half = (est.high - est.low) / 2.0 * wider
    return interval_verdict(est.value - half, est.value + half, tolerance)


def stack_verdict(whole: str, segments: Sequence[str]) -> str:
    """A stack-level verdict: ``whole`` (the window's verdict over seeds), turned different when a
    segment is shown different (its verdict from :func:`segment_verdict`, at the Bonferroni level);
    insufficient when the window is. Inconclusive or insufficient segments change nothing."""
    if whole == INSUFFICIENT:
        return INSUFFICIENT
    if whole == DIFFERENT or DIFFERENT in segments:
        return DIFFERENT
    return whole


def _check_seed_inputs(between_sd: float, within_se: float, margin: float, power: float) -> None:
    for name, x in (("between_sd", between_sd), ("within_se", within_se)):
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {x}")
    if not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"margin must be a finite number > 0, got {margin}")
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")


def _needed_ratio(m: int, confidence: float, power: float) -> float:
    """The margin over the standard error that ``m`` seeds per group need (``seeds_needed``)."""
    return t_critical(confidence, m - 1) + t_quantile(0.5 + power / 2.0, 2 * m - 2)


MAX_SEEDS = 10_000
"""Most seeds per group ``seeds_needed`` looks at."""


def seeds_needed(
    between_sd: float, within_se: float, margin: float, *, confidence: float = 0.90, power: float = 0.8
) -> int:
    """Seeds per group for the group difference's interval to fall within ``±margin`` with
    probability ``power`` when the stacks are equal: the smallest ``m >= 2`` with
    ``margin / se >= t_{m - 1}((1 + confidence) / 2) + t_{2 m - 2}((1 + power) / 2)``,
    ``se = sqrt(2 v / m)``, ``v = between_sd^2 + within_se^2`` (one seed's variance around the
    stack's value, in the quantity's units squared). The critical value takes Welch's least degrees
    of freedom (``m - 1``) and the power term a t quantile, because at 2-5 seeds the estimated spread
    is itself uncertain: with the normal power term and ``2 m - 2`` degrees of freedom, 2 seeds
    reached 53-69 % instead of 80 % in simulation (``simulation.seeds_needed_check``). Raises
    ValueError when no number up to 10,000 does."""
    _check_seed_inputs(between_sd, within_se, margin, power)
    v = between_sd**2 + within_se**2
    if v == 0:
        return 2

    def enough(m: int) -> bool:
        return margin / math.sqrt(2.0 * v / m) >= _needed_ratio(m, confidence, power)

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


def steps_factor(
    between_sd: float,
    within_se: float,
    margin: float,
    seeds: int,
    *,
    confidence: float = 0.90,
    power: float = 0.8,
) -> float | None:
    """How many times the steps per seed would settle ``±margin`` at ``seeds`` seeds per group with
    the same power rule as ``seeds_needed``: more steps shrink only the within-run part
    (``within_se^2`` scales as 1 / steps), so the factor is ``within_se^2 / (V - between_sd^2)``
    with ``V = seeds margin^2 / (2 (t_{seeds - 1} + t_{2 seeds - 2})^2)`` the largest per-seed variance that
    settles it; 1 when the present steps already do; None when no number of steps can (the
    between-seed spread alone is too large, or there is no within-run spread to shrink)."""
    _check_seed_inputs(between_sd, within_se, margin, power)
    if seeds < 2:
        raise ValueError(f"seeds must be >= 2, got {seeds}")
    allowed = seeds * margin**2 / (2.0 * _needed_ratio(seeds, confidence, power) ** 2)
    if between_sd**2 + within_se**2 <= allowed:
        return 1.0
    if within_se == 0 or between_sd**2 >= allowed:
        return None
    return within_se**2 / (allowed - between_sd**2)
