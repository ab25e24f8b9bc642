"""The estimate with its interval and diagnostics, the verdict names and the equivalence rule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cliptrack.compare.stats.quantiles import _special

MIN_UNITS = 100
"""Fewest paired units (steps, or bins) for which a verdict is given."""
MIN_ESS = 10.0
"""Smallest effective sample size (units) for which a verdict is given."""
DIRECTION_CONFIDENCE = 0.995
"""Two-sided level of the interval a ``different`` verdict needs (0.25 % per side): the 90 % interval
lets a true difference equal to the margin pass as ``different`` in 6-17 % of windows under strong
persistence or long memory over 100-300 steps, a 99 % one in 5.5 % under ARFIMA d = 0.4 over 300
steps (2,000 replicates; 4.0 % at this level; docs/STATISTICS.md, "One pair of runs")."""
GATED_SPREADS = 4.0
"""Below ``MIN_ESS`` the interval a ``different`` verdict needs is at least this many standard
deviations of the paired unit series around its mean wide on each side: the difference must clear
the margin by far more than the runs' own step-to-step spread (it persists), since the long-run
variance of so persistent a window is not to be trusted."""
MIN_SEGMENT_UNITS = 250
"""Fewest units per segment of the throughout-the-window test (``segments.segment_bounds``)."""

EQUIVALENT = "equivalent"
DIFFERENT = "different"
INCONCLUSIVE = "inconclusive"
INSUFFICIENT = "insufficient data"
VERDICTS = (EQUIVALENT, DIFFERENT, INCONCLUSIVE, INSUFFICIENT)

ABSOLUTE = "absolute"
LOG_RATIO = "log-ratio"
SCALES = (ABSOLUTE, LOG_RATIO)
"""How a difference is measured: ``R_b - R_a``, or ``log(R_b / R_a)`` (signed so that a positive
value means run b is larger when both ratios are negative too)."""

METHOD = (
    "equal-weighted cosine (EWC) long-run variance of the linearised ratio of sums around each run's "
    "smooth trend, t critical values with its degrees of freedom, corrected for long memory (ARFIMA "
    "fit of its cosines)"
)
"""The interval method in one sentence, shown in every rendering."""

_NAN = float("nan")


@dataclass(frozen=True)
class Estimate:
    """A point estimate with its interval and the dependence diagnostics behind it.

    ``value``/``low``/``high``: in the quantity's units (log-ratio units for a log-ratio difference);
    bounds are NaN when there is no interval. ``n_units``: units used; ``lag1``: lag-1
    autocorrelation of the linearised series after its trend is removed; ``ess``: effective sample
    size in units, ``n * gamma0 / lrv`` from the same long-run variance as the interval, capped at
    ``n``; ``bandwidth``: units per cosine term of the EWC estimate (``n / K``); ``confidence``:
    two-sided level of the interval. ``lrv``: long-run variance of the linearised series (its units
    squared, per unit); ``df``: degrees of freedom of the t critical value; ``trend_terms``: smooth
    trend terms removed before the variance (beyond the mean); ``long_memory``: persistence at the
    scale of the window was found (the interval was widened); ``memory``: the long-memory parameter
    ``d`` behind that widening (0 when the batch check alone found it, or none was found);
    ``memory_tested``: the window had enough units for the long-memory test (about 470 for a flat
    series; below that the interval assumes short memory, see docs/STATISTICS.md);
    ``reason``: why there is no trustworthy interval ("" when fine); ``direction_low`` /
    ``direction_high``: the interval a ``different`` verdict needs (``direction``; NaN when not
    computed, e.g. a run's own estimate).
    """

    value: float
    low: float
    high: float
    n_units: int
    lag1: float
    ess: float
    bandwidth: float
    confidence: float
    lrv: float = _NAN
    df: float = math.inf
    trend_terms: int = 0
    long_memory: bool = False
    memory: float = 0.0
    memory_tested: bool = False
    reason: str = ""
    direction_low: float = _NAN
    direction_high: float = _NAN

    @property
    def direction(self) -> tuple[float, float]:
        """The interval a ``different`` verdict needs (``DIRECTION_CONFIDENCE``, and below ``MIN_ESS``
        at least ``GATED_SPREADS`` spreads wide); the interval itself where none was computed."""
        if math.isfinite(self.direction_low) and math.isfinite(self.direction_high):
            return self.direction_low, self.direction_high
        return self.low, self.high

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    @property
    def enough_data(self) -> bool:
        """At least ``MIN_UNITS`` units, ``MIN_ESS`` effective units, and no stated reason against."""
        return self.n_units >= MIN_UNITS and bool(self.ess >= MIN_ESS) and not self.reason

    def insufficiency(self) -> str:
        """Why there is too little data for a verdict ("" when there is enough)."""
        if self.reason:
            return self.reason
        if self.n_units < MIN_UNITS:
            return f"only {counted(self.n_units, 'paired unit')} (minimum {MIN_UNITS})"
        if not self.ess >= MIN_ESS:
            return ess_reason(
                self.ess, self.lag1, self.n_units, self.trend_terms, self.long_memory, self.memory
            )
        return ""


def counted(count: int, word: str) -> str:
    """``"1 step"``, ``"2 steps"``: a count with its noun in the right number."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def ess_reason(
    ess: float, lag1: float, n: int, trend_terms: int, long_memory: bool, memory: float = 0.0
) -> str:
    """The text of the effective-sample-size gate (true of the data it describes)."""
    trend = f" after removing a smooth trend of {trend_terms} terms" if trend_terms else ""
    if memory > 0:
        memory_text = (
            f"; long memory: the lowest frequencies carry power rising like frequency^-{2 * memory:.2f} "
            f"(memory parameter d = {memory:.2f})"
        )
    elif long_memory:
        memory_text = (
            "; the variance of batch means keeps growing with the batch size (persistence at the "
            "scale of the window)"
        )
    else:
        memory_text = ""
    return (
        f"effective sample size {ess:.1f} < {MIN_ESS:g}: the steps are too persistent for the interval "
        f"to be trusted (lag-1 autocorrelation {lag1:.2f}{trend} over {n} units{memory_text})"
    )


def equivalence_verdict(difference: Estimate, tolerance: float) -> str:
    """TOST-style verdict on a difference interval against ``±tolerance``.

    ``different``: the direction interval (``Estimate.direction``: 99.5 %, and below ``MIN_ESS`` at
    least ``GATED_SPREADS`` spreads of the paired series wide) lies wholly outside
    ``[-tolerance, tolerance]`` over at least ``MIN_UNITS`` units: a direction is trusted even at a
    small effective sample size. ``insufficient data``: fewer than ``MIN_UNITS`` units, a stated
    reason, no interval, or (for anything but ``different``) an effective sample size below
    ``MIN_ESS``; ``equivalent``: the whole 90 % interval lies inside ``(-tolerance, tolerance)``;
    otherwise ``inconclusive``. Symmetric: negating the intervals (swapping the runs) gives the
    same verdict.
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    if not difference.has_interval or difference.n_units < MIN_UNITS or difference.reason:
        return INSUFFICIENT
    low, high = difference.direction
    if low > tolerance or high < -tolerance:
        return DIFFERENT
    if not difference.enough_data:
        return INSUFFICIENT
    verdict = interval_verdict(difference.low, difference.high, tolerance)
    return INCONCLUSIVE if verdict == DIFFERENT else verdict


def interval_verdict(low: float, high: float, tolerance: float) -> str:
    """The verdict of an interval against ``±tolerance``, given that it may be trusted."""
    if -tolerance < low and high < tolerance:
        return EQUIVALENT
    if low > tolerance or high < -tolerance:
        return DIFFERENT
    return INCONCLUSIVE


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
    se: float = float("nan")
    """Standard error of ``value`` (on the scale's units; NaN without an interval)."""

    @property
    def probability_greater(self) -> float:
        """P(group b's value > group a's): ``probability_greater(value, se, df)`` (NaN without an interval)."""
        return probability_greater(self.value, self.se, self.df)

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def probability_greater(value: float, se: float, df: float) -> float:
    """``P(b > a) = F_t(value / se; df)``: Student's t distribution function with ``df`` degrees of
    freedom at the standardised difference (see the module docstring); 1 or 0 (0.5 at 0) when
    ``se`` is 0; NaN when any input is undefined."""
    if not (math.isfinite(value) and math.isfinite(se) and se >= 0 and df > 0):
        return float("nan")
    if se == 0:
        return 1.0 if value > 0 else 0.0 if value < 0 else 0.5
    return float(_special().stdtr(float(df), value / se))
