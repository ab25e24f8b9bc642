"""The paired probe's statistics: one batch of datums through two stacks, compared per datum.

The unit is the datum (one sequence): tokens of a sequence share its prompt, its advantage and its
position in the batch, so they are not independent, and every interval here is **sequence-
clustered**. Each quantity is a ratio of sums over the datums, ``R = sum(num_i) / sum(den_i)``,
with the same denominator in both stacks (the same datums: the same eligible tokens), so the
paired difference of the two ratios is ``D = sum(num_b,i - num_a,i) / sum(den_i)``. Its variance
is the cluster (sandwich) estimate ``n / (n - 1) * sum(e_i^2) / sum(den_i)^2`` with
``e_i = (num_b,i - num_a,i) - D den_i``, and its interval ``D ± t_(n-1) se`` (datums independent:
the probe's datums are one batch of independent prompts).

The clip decisions are also compared token by token (McNemar's exact test): with ``n_ab`` tokens
clipped by stack a only and ``n_ba`` by stack b only, the difference of the clip fractions is
``(n_ba - n_ab) / tokens``, and under "no systematic difference" ``n_ba`` is binomial
``(n_ab + n_ba, 1/2)``. The exact conditional interval of ``pi = P(b only | discordant)``
(Clopper–Pearson) maps to an interval of the difference, ``(2 pi - 1) (n_ab + n_ba) / tokens``;
the verdict uses the hull of that interval and the clustered one (both must lie inside the margin
for ``equivalent``, either beyond it for ``different``).

Margins are of the form ``max(floor, relative * scale)``, the scale being the quantity's size in the
two stacks (``cliptrack.compare.quantities.Margin.near``); the verdict is TOST on the ``confidence`` interval, as the run
comparison's (``estimate.interval_verdict``). Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from cliptrack.compare.stats.estimate import (
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    interval_verdict,
)
from cliptrack.compare.stats.quantiles import t_critical

__all__ = [
    "MIN_DATUMS",
    "ClipTest",
    "PairedRatio",
    "clip_test",
    "hull_verdict",
    "mcnemar_exact",
    "paired_ratio",
    "upper_verdict",
]

MIN_DATUMS = 10
"""Fewest datums (sequences) for which a probe's quantity gets a verdict: the clustered interval's
t has ``n - 1`` degrees of freedom and its variance estimate needs several clusters."""


@dataclass(frozen=True)
class PairedRatio:
    """The paired difference of one ratio of sums over the datums, stack b minus stack a.

    ``value_a``/``value_b``: each stack's ratio ``sum(num) / sum(den)`` (the quantity's units: a
    fraction of tokens, nats per token, loss per token); ``difference`` = ``value_b - value_a`` with
    its sequence-clustered interval ``low``/``high`` (NaN when there is none) at ``confidence``;
    ``se``: its standard error; ``datums``: clusters used; ``denominator``: ``sum(den)`` (tokens);
    ``reason``: why there is no verdict ("" when there is one).
    """

    value_a: float
    value_b: float
    difference: float
    low: float
    high: float
    se: float
    datums: int
    denominator: float
    confidence: float
    reason: str = ""


@dataclass(frozen=True)
class ClipTest:
    """McNemar's exact test on the clip decisions of the same tokens in two stacks.

    ``a_only``/``b_only``: tokens clipped by one stack and not by the other (the discordant
    tokens); ``both``: clipped by both; ``tokens``: eligible tokens compared. ``p_value``: two-sided
    exact binomial p-value of ``b_only ~ Binomial(a_only + b_only, 1/2)`` (1 with no discordant
    token). ``low``/``high``: the exact conditional interval of the clip-fraction difference
    (b minus a, fraction of tokens) at ``confidence``.
    """

    a_only: int
    b_only: int
    both: int
    tokens: int
    p_value: float
    low: float
    high: float
    confidence: float

    @property
    def difference(self) -> float:
        """``(b_only - a_only) / tokens``: the clip-fraction difference, b minus a (0 with no token)."""
        return (self.b_only - self.a_only) / self.tokens if self.tokens else 0.0


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def paired_ratio(
    num_a: np.ndarray, num_b: np.ndarray, den: np.ndarray, confidence: float = 0.90
) -> PairedRatio:
    """The sequence-clustered paired difference of ``sum(num_b)/sum(den) - sum(num_a)/sum(den)``.

    ``num_a``, ``num_b``: per-datum numerators of stacks a and b (one entry per datum, in the same
    order); ``den``: the per-datum denominators both share (eligible tokens, >= 0). Fewer than
    :data:`MIN_DATUMS` datums, or a zero total denominator, give no interval and a ``reason``.
    ValueError when the arrays differ in length or hold non-finite values.
    """
    _check_confidence(confidence)
    a, b, d = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (num_a, num_b, den))
    if not (a.size == b.size == d.size):
        raise ValueError(
            f"num_a, num_b and den must have one entry per datum, got {a.size}, {b.size} and {d.size}"
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all() and np.isfinite(d).all()):
        raise ValueError("num_a, num_b and den must be finite")
    if (d < 0).any():
        raise ValueError("den must be >= 0 (tokens)")
    n = int(a.size)
    total = float(d.sum())
    nan = math.nan
    if total <= 0:
        return PairedRatio(nan, nan, nan, nan, nan, nan, n, total, confidence, "no eligible token")
    value_a = math.fsum(a) / total
    value_b = math.fsum(b) / total
    delta = b - a
    diff = math.fsum(delta) / total
    if n < MIN_DATUMS:
        reason = f"only {n} datum{'' if n == 1 else 's'} (minimum {MIN_DATUMS})"
        return PairedRatio(value_a, value_b, diff, nan, nan, nan, n, total, confidence, reason)
    residual = delta - diff * d
    se = math.sqrt(n / (n - 1) * float(np.dot(residual, residual))) / total
    half = t_critical(confidence, n - 1) * se
    return PairedRatio(value_a, value_b, diff, diff - half, diff + half, se, n, total, confidence)


def _binomial_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2), exactly enough (scipy's regularised beta)."""
    from scipy import special

    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return float(special.bdtr(k, n, 0.5))


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value: ``min(1, 2 P(X <= min(a_only, b_only)))``,
    ``X ~ Binomial(a_only + b_only, 1/2)``; 1 when no token is discordant."""
    for name, value in (("a_only", a_only), ("b_only", b_only)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a token count (int >= 0), got {value!r}")
    m = int(a_only) + int(b_only)
    if m == 0:
        return 1.0
    return min(1.0, 2.0 * _binomial_cdf(min(int(a_only), int(b_only)), m))


def _clopper_pearson(k: int, m: int, confidence: float) -> tuple[float, float]:
    """Exact two-sided ``confidence`` interval of a binomial proportion, ``k`` of ``m``."""
    from scipy import special

    alpha = 1.0 - confidence
    low = 0.0 if k == 0 else float(special.betaincinv(k, m - k + 1, alpha / 2))
    high = 1.0 if k == m else float(special.betaincinv(k + 1, m - k, 1 - alpha / 2))
    return low, high


def clip_test(a_only: int, b_only: int, both: int, tokens: int, confidence: float = 0.90) -> ClipTest:
    """McNemar's exact test and the exact conditional interval of the clip-fraction difference.

    ``a_only``/``b_only``/``both``: token counts (see :class:`ClipTest`); ``tokens``: the eligible
    tokens compared (>= the three together). With ``m = a_only + b_only`` discordant tokens the
    interval is ``(2 pi - 1) m / tokens`` over the Clopper–Pearson interval of ``pi`` (``b_only`` of
    ``m``); ``[0, 0]`` when ``m == 0``.
    """
    _check_confidence(confidence)
    p = mcnemar_exact(a_only, b_only)
    for name, value in (("both", both), ("tokens", tokens)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be a token count (int >= 0), got {value!r}")
    m = int(a_only) + int(b_only)
    if int(tokens) < m + int(both):
        raise ValueError(f"tokens = {tokens} is fewer than the clipped tokens counted ({m + int(both)})")
    if m == 0:
        return ClipTest(int(a_only), int(b_only), int(both), int(tokens), p, 0.0, 0.0, confidence)
    lo, hi = _clopper_pearson(int(b_only), m, confidence)
    share = m / int(tokens)
    return ClipTest(
        int(a_only),
        int(b_only),
        int(both),
        int(tokens),
        p,
        (2 * lo - 1) * share,
        (2 * hi - 1) * share,
        confidence,
    )


def hull_verdict(low: float, high: float, margin: float, reason: str = "") -> str:
    """TOST on an interval against ``±margin`` (``estimate.interval_verdict``); ``insufficient data``
    with a ``reason`` or without an interval."""
    if reason or not (math.isfinite(low) and math.isfinite(high)):
        return INSUFFICIENT
    return interval_verdict(low, high, margin)


def upper_verdict(low: float, high: float, margin: float, reason: str = "") -> str:
    """The verdict on a non-negative quantity whose value for equal stacks is 0 (a distance between
    them): ``equivalent`` when its whole interval lies below ``margin``, ``different`` when it lies
    wholly above, ``inconclusive`` otherwise; ``insufficient data`` as :func:`hull_verdict`."""
    if reason or not (math.isfinite(low) and math.isfinite(high)):
        return INSUFFICIENT
    if high < margin:
        return EQUIVALENT
    if low > margin:
        return DIFFERENT
    return INCONCLUSIVE
