"""Numbers as the report shows them: values, percents, differences, intervals, margins, effective
sample sizes, probabilities. No words: the sentences that hold these are written in ``notes``.

Every function takes plain numbers (or an ``Estimate``) and how to show them: ``percent`` (a
fraction of tokens, shown in % and its differences in percentage points, pp) and the ``scale`` a
difference is on (``LOG_RATIO``: shown as the relative change in %; otherwise in the quantity's own
units). ``NA`` stands for a value that is not finite.
"""

from __future__ import annotations

import math
from typing import Protocol

from cliptrack.compare.stats.estimate import LOG_RATIO

NA = "n/a"
"""A value that is not a finite number."""
APPROX = "≈"
"""The mark before a value that is approximate (a mean of means, not a ratio of token sums)."""


class Interval(Protocol):
    """What an interval is read for: ``Estimate`` and ``GroupEstimate`` both are one."""

    @property
    def value(self) -> float: ...

    @property
    def low(self) -> float: ...

    @property
    def high(self) -> float: ...

    @property
    def has_interval(self) -> bool: ...


def percent(x: float, digits: int = 3) -> str:
    """A fraction in percent: ``0.01234 -> "1.234%"``."""
    return f"{x * 100:.{digits}f}%"


def number(x: float, is_percent: bool) -> str:
    """One value in the quantity's units: percent for a fraction, else 4 significant digits."""
    if not math.isfinite(x):
        return NA
    return percent(x) if is_percent else f"{x:.4g}"


def value(e: Interval, is_percent: bool, ci: bool = True) -> str:
    """An estimate, with its interval in brackets when ``ci`` and it has one."""
    if not math.isfinite(e.value):
        return NA
    if not (ci and e.has_interval):
        return number(e.value, is_percent)
    if is_percent:
        return f"{percent(e.value)} [{e.low * 100:.3f}, {e.high * 100:.3f}]%"
    return f"{e.value:.4g} [{e.low:.4g}, {e.high:.4g}]"


def relative_change(log_ratio: float) -> float:
    """A log-ratio difference as a relative change: ``exp(d) - 1`` (NaN for a non-finite one)."""
    return math.expm1(log_ratio) if math.isfinite(log_ratio) else float("nan")


def difference(x: float, scale: str, is_percent: bool) -> str:
    """One value of a difference, signed: % (log-ratio), pp (fractions) or the quantity's units."""
    if scale == LOG_RATIO:
        return f"{relative_change(x) * 100:+.2f}%"
    if is_percent:
        return f"{x * 100:+.3f} pp"
    return f"{x:+.4g}"


def difference_interval(e: Interval, scale: str, is_percent: bool) -> str:
    """A difference and its interval in brackets, in :func:`difference`'s terms; ``[no interval]``
    when it has none."""
    if not math.isfinite(e.value):
        return NA
    text = difference(e.value, scale, is_percent)
    if not e.has_interval:
        return text + " [no interval]"
    if scale == LOG_RATIO:
        return text + f" [{relative_change(e.low) * 100:+.2f}, {relative_change(e.high) * 100:+.2f}]%"
    if is_percent:
        return text + f" [{e.low * 100:+.3f}, {e.high * 100:+.3f}] pp"
    return text + f" [{e.low:+.4g}, {e.high:+.4g}]"


def margin(size: float, scale: str, is_percent: bool) -> str:
    """A margin (or an interval's edge) as one number: ``±25%`` on the log-ratio scale (``size`` the
    relative margin, 0.25), ``±0.01 pp`` for a fraction (``size`` 0.0001), else ``±0.002``."""
    if scale == LOG_RATIO:
        return f"±{size * 100:.3g}%"
    return f"±{size * 100:.3g} pp" if is_percent else f"±{size:.4g}"


def tolerance(log_tolerance: float) -> str:
    """A log-ratio tolerance as the bound on ``|log ratio|``: ``|log ratio| < 0.2231``."""
    return f"|log ratio| < {log_tolerance:.4f}"


def ess(x: float) -> str:
    """An effective sample size, one decimal."""
    return NA if not math.isfinite(x) else f"{x:.1f}"


def lag1(x: float) -> str:
    """A lag-1 autocorrelation, two decimals."""
    return NA if not math.isfinite(x) else f"{x:.2f}"


def probability(p: float) -> str:
    """A probability in percent, one decimal; ``> 99.9%`` and ``< 0.1%`` at the ends."""
    if not math.isfinite(p):
        return NA
    if p > 0.999:
        return "> 99.9%"
    if p < 0.001:
        return "< 0.1%"
    return f"{p * 100:.1f}%"


def factor(x: float) -> str:
    """A multiple, one decimal: ``1.8×``."""
    return f"{x:.1f}×"


def axis_value(x: float) -> str:
    """A point on the alignment axis (a step, tokens, seconds): shortest form, ``1e+06``."""
    return f"{x:g}"
