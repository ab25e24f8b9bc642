"""Student t quantiles for real degrees of freedom, without scipy.

The t distribution function is written through the regularised incomplete beta function
(``P(|T| > t) = I_{df / (df + t^2)}(df / 2, 1 / 2)``), evaluated by its continued fraction (modified
Lentz), and inverted by bisection to full double precision. Used for the critical values of every
interval (degrees of freedom from the long-run variance, from Welch's formula, or from seeds).
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist

_EPS = 1e-15
_TINY = 1e-300


def _beta_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (converges for ``x < (a + 1) / (a + b + 2)``)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 400):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta function ``I_x(a, b)`` for ``a, b > 0`` and ``0 <= x <= 1``."""
    if not (a > 0 and b > 0):
        raise ValueError(f"incomplete beta needs a > 0 and b > 0, got a={a}, b={b}")
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_tail(t: float, df: float) -> float:
    """``P(|T| > t)`` for a t variable with ``df`` degrees of freedom (``t >= 0``)."""
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


@lru_cache(maxsize=4096)
def _t_quantile(p: float, df: float) -> float:
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    upper = p > 0.5
    tail = 2.0 * (1.0 - p if upper else p)  # two-sided tail probability of |T|
    lo, hi = 0.0, 1.0
    while t_two_sided_tail(hi, df) > tail:
        hi *= 2.0
        if hi > 1e300:
            break
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_two_sided_tail(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    q = 0.5 * (lo + hi)
    return q if upper else -q


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df > 0`` degrees of freedom (``df = inf``: normal)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t quantile: probability must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"t quantile: degrees of freedom must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    return _t_quantile(float(p), float(df))


def t_critical(confidence: float, df: float) -> float:
    """Two-sided critical value: the ``(1 + confidence) / 2`` quantile of t with ``df`` degrees of freedom."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return t_quantile(0.5 + confidence / 2.0, df)


@lru_cache(maxsize=1024)
def f_quantile(p: float, d1: float, d2: float) -> float:
    """The ``p`` quantile of the F distribution with ``(d1, d2)`` degrees of freedom (bisection on
    ``P(F <= x) = I_{d1 x / (d1 x + d2)}(d1 / 2, d2 / 2)``)."""
    if not 0.0 < p < 1.0 or not (d1 > 0 and d2 > 0):
        raise ValueError(f"F quantile needs 0 < p < 1 and positive degrees of freedom, got {p}, {d1}, {d2}")
    lo, hi = 0.0, 1.0
    while incomplete_beta(d1 / 2.0, d2 / 2.0, d1 * hi / (d1 * hi + d2)) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if incomplete_beta(d1 / 2.0, d2 / 2.0, d1 * mid / (d1 * mid + d2)) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)
