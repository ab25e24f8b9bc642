"""A live watch's statistics: the healthy band of a series and a CUSUM rule scaled by its long-run sd.

A watched series ``x_t`` (one value per logged point) is read on its watched scale ``z_t`` (the
natural log of the value for a positive quantity such as the mismatch KL, which falls by orders of
magnitude over training; the value itself otherwise). The **band** comes from a reference window:

- the run's own first ``window`` points: a straight line fitted to ``z`` over them (level at the
  window's end, slope per point), and the long-run standard deviation ``sd`` of the residual around
  it (``cliptrack.compare.stats.lrv``: the equal-weighted cosine estimate, taken at the upper
  ``1 - SD_BOUND`` bound of its chi-square, and never below the residual's own sd). Its persistence
  and long-memory widening are left off here: on a 100-point window they multiply the sd by up to
  10 on short-memory noise, and the simulated long memory (``d = 0.4``) stays under the rate
  without them;
- or a reference run (the other stack's baseline): its smoothed trajectory (a centred moving mean of
  ``z`` over ``window`` points), read at the watched point's step, and the long-run sd of its
  residual around that trajectory.

Each new point is predicted — from the trajectory, or from the run's own band carried forward by
Holt's linear smoothing (level and slope updated with ``alpha`` and ``beta`` while nothing is
suspected, so that a healthy drift, KL falling tenfold, moves the prediction along) — and its
residual is standardised, ``r = (z - prediction) / sd``. Two one-sided CUSUMs accumulate it:
``S+ = max(0, S+ + r - k)``, ``S- = max(0, S- - r - k)``; a breach is ``S > h`` in a watched
direction. Scaling by the long-run sd (not the point-to-point sd) is what makes the sum of ``n``
autocorrelated residuals comparable to ``h`` (its variance is about ``n sd^2``); independent
z-scores of single points (W&B's ``MetricZScoreFilter``) fire on every excursion of a persistent
series. ``k`` and ``h`` were chosen by simulation (``benchmarks/watch.py``, docs/TRACKING.md "A live
watch"): at most 1 false alarm per 1,000 healthy steps under AR(1) noise up to ``phi = 0.9``, long
memory up to ``d = 0.4``, and drift, and a doubling of the mismatch KL found within a few steps.

After a breach the next ``cooldown`` points raise none (one alert per episode): the CUSUM restarts
from 0 after them, and an own-window band's level is their mean, so that a lasting shift becomes
the new level and a passing one is forgotten. Everything
after the band is pure Python, O(1) per point; the band itself is one long-run variance, computed
once (numpy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cliptrack.compare.stats.quantiles import chi2_quantile

K = 0.5
"""CUSUM allowance, in long-run sd: shifts below ``2 K`` sd are not chased."""
H = 8.0
"""CUSUM decision threshold, in long-run sd (chosen by ``benchmarks/watch.py``)."""
WINDOW = 100
"""Default reference window, points."""
MIN_WINDOW = 20
"""Fewest points a band is estimated from."""
HALF_LIFE = 50.0
"""Half-life (points) of the level and slope updates of an own-window band."""
COOLDOWN = 30
"""Points after a breach that raise none (one alert per episode): the CUSUM stays at 0 and an
own-window band's level is the mean of these points after them, so a lasting shift is the new
level, and a passing one is forgotten. A shift that starts within them is part of that episode."""
SD_BOUND = 0.25
"""The band's sd is the upper ``1 - SD_BOUND`` confidence bound of the long-run sd (its chi-square
with the estimate's degrees of freedom): a reference window of 100 points estimates it from a few
cosines, and an sd estimated low by chance would alarm all run long."""
MAX_SD_RATIO = 5.0
"""Cap of the band's sd, in residual sd: the long-run sd of AR(1) noise with ``phi = 0.92``; a few
cosines of a 100-point window can estimate 30 times more by chance, which would blind the watch."""
MIN_SD = 1e-3
"""Floor of the band's sd on the log scale (a 0.1 % wobble); on the value scale, this fraction of
the level's magnitude (plus 1e-12)."""
DIRECTIONS = ("up", "down", "both")
SCALES = ("log", "value")


@dataclass(frozen=True)
class Band:
    """The healthy band of one series on its watched scale (``scale``: "log" or "value").

    ``level``: the predicted ``z`` at the last reference point; ``slope``: per point; ``sd``: the
    long-run standard deviation of the residual (watched-scale units); ``points``: reference points;
    ``long_memory``: the long-run variance found persistence at the window's scale (and widened for
    it); ``trajectory``: a reference run's smoothed ``(steps, z levels)``, read at each step, or
    empty for an own-window band (carried forward by Holt's smoothing)."""

    level: float
    slope: float
    sd: float
    points: int
    scale: str = "log"
    long_memory: bool = False
    trajectory: tuple[tuple[int, ...], tuple[float, ...]] = field(default=((), ()), repr=False)

    def at(self, step: int) -> float:
        """The reference trajectory's level at ``step`` (held flat outside it; linear in between)."""
        steps, levels = self.trajectory
        if not steps:
            raise ValueError("this band has no reference trajectory")
        import bisect

        i = bisect.bisect_left(steps, step)
        if i <= 0:
            return levels[0]
        if i >= len(steps):
            return levels[-1]
        s0, s1 = steps[i - 1], steps[i]
        if s1 == s0:
            return levels[i]
        w = (step - s0) / (s1 - s0)
        return levels[i - 1] * (1.0 - w) + levels[i] * w


@dataclass(frozen=True)
class Breach:
    """A point where the watched series left its band: ``index`` (0-based point number), ``step``,
    ``value`` (as logged), ``expected`` (the prediction, on the value's own scale), ``statistic`` (the
    CUSUM, long-run sd), ``direction`` ("up" or "down")."""

    index: int
    step: int
    value: float
    expected: float
    statistic: float
    direction: str


def check_settings(*, scale: str, direction: str, window: int, k: float, h: float) -> None:
    """ValueError naming the setting that is out of range."""
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r}: expected one of {SCALES}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}: expected one of {DIRECTIONS}")
    if isinstance(window, bool) or not isinstance(window, int) or window < MIN_WINDOW:
        raise ValueError(f"window={window!r}: expected an integer >= {MIN_WINDOW} (points)")
    if not (math.isfinite(k) and k >= 0):
        raise ValueError(f"k={k!r}: expected a finite number >= 0 (long-run sd)")
    if not (math.isfinite(h) and h > 0):
        raise ValueError(f"h={h!r}: expected a finite number > 0 (long-run sd)")


def watched(value: float, scale: str) -> float | None:
    """``value`` on the watched scale; None where it has none (not finite; <= 0 on the log scale)."""
    if not math.isfinite(value):
        return None
    if scale == "log":
        return math.log(value) if value > 0 else None
    return value


def shown(z: float, scale: str) -> float:
    """A watched-scale number back on the value's own scale."""
    return math.exp(z) if scale == "log" else z


def _floor(sd: float, level: float, scale: str) -> float:
    if scale == "log":
        return max(sd, MIN_SD)
    return max(sd, MIN_SD * abs(level) + 1e-12)


def _upper_sd(lrv: object, fallback: float) -> tuple[float, bool]:
    """The upper confidence bound (``SD_BOUND``) of the long-run sd of one row's ``LongRunVariance``,
    at least ``fallback`` (the residual's own sd: many degrees of freedom, and below the long-run sd
    of a positively correlated series) and at most ``MAX_SD_RATIO`` times it, and whether it found
    long memory."""
    value, df = float(lrv.lrv[0]), float(lrv.df[0])  # type: ignore[attr-defined]
    if not (math.isfinite(value) and value >= 0):
        return fallback, False
    if math.isfinite(df) and df > 0:
        value *= df / chi2_quantile(SD_BOUND, df)
    sd = min(max(math.sqrt(value), fallback), MAX_SD_RATIO * fallback) if fallback > 0 else math.sqrt(value)
    return sd, bool(lrv.long_memory[0])  # type: ignore[attr-defined]


def own_band(z: Sequence[float], scale: str = "log") -> Band:
    """The band of a run's own reference window ``z`` (watched-scale values, in order): a line fitted
    by least squares, its level at the last point, and the long-run sd of the residual."""
    import numpy as np
    from cliptrack.compare.stats.lrv import long_run_variance

    if len(z) < MIN_WINDOW:
        raise ValueError(f"a band needs at least {MIN_WINDOW} points, got {len(z)}")
    arr = np.asarray(z, dtype=float)
    n = arr.size
    t = np.arange(n, dtype=float)
    slope, intercept = np.polyfit(t, arr, 1)
    sd, memory = _upper_sd(
        long_run_variance(arr, degree=1, floor=False), float(np.std(arr - (intercept + slope * t)))
    )
    level = float(intercept + slope * (n - 1))
    return Band(level, float(slope), _floor(sd, level, scale), n, scale, memory)


def reference_band(
    steps: Sequence[int], z: Sequence[float], window: int = WINDOW, scale: str = "log"
) -> Band:
    """The band of a reference run: its trajectory (a centred moving mean of ``z`` over ``window``
    points, at each of its ``steps``) and the long-run sd of ``z`` around it."""
    import numpy as np
    from cliptrack.compare.stats.lrv import long_run_variance

    if len(steps) != len(z):
        raise ValueError(f"reference steps ({len(steps)}) and values ({len(z)}) differ in length")
    if len(z) < MIN_WINDOW:
        raise ValueError(f"a reference run needs at least {MIN_WINDOW} watched points, got {len(z)}")
    order = np.argsort(np.asarray(steps), kind="stable")
    s = np.asarray(steps, dtype=np.int64)[order]
    arr = np.asarray(z, dtype=float)[order]
    half = max(1, min(window, arr.size) // 2)
    padded = np.pad(arr, half, mode="edge")
    kernel = np.ones(2 * half + 1) / (2 * half + 1)
    smooth = np.convolve(padded, kernel, mode="valid")
    residual = arr - smooth
    sd, memory = _upper_sd(long_run_variance(residual, degree=0, floor=False), float(np.std(residual)))
    level = float(smooth[-1])
    trajectory = (tuple(int(x) for x in s), tuple(float(x) for x in smooth))
    return Band(level, 0.0, _floor(sd, level, scale), int(arr.size), scale, memory, trajectory)


class Cusum:
    """The online rule for one series against ``band``: ``update(step, value)`` per point, O(1),
    returning a ``Breach`` or None. ``direction``: "up" (the mismatch KL rising), "down" or
    "both"; ``k``, ``h`` in long-run sd; ``half_life`` of the level/slope updates (points)."""

    def __init__(
        self,
        band: Band,
        *,
        direction: str = "up",
        k: float = K,
        h: float = H,
        half_life: float = HALF_LIFE,
        cooldown: int = COOLDOWN,
        trend: bool = False,
    ) -> None:
        check_settings(scale=band.scale, direction=direction, window=max(band.points, MIN_WINDOW), k=k, h=h)
        self.band = band
        self.direction = direction
        self.k = k
        self.h = h
        self.alpha = 1.0 - 0.5 ** (1.0 / half_life)
        self.beta = self.alpha if trend else 0.0
        self.cooldown = cooldown
        self.level = band.level
        self.slope = band.slope if trend else 0.0
        self.up = 0.0
        self.down = 0.0
        self.index = 0
        self.quiet = 0
        self._quiet_sum, self._quiet_n = 0.0, 0
        self.breaches = 0

    def expected(self, step: int) -> float:
        """The prediction for the next point (watched scale)."""
        if self.band.trajectory[0]:
            return self.band.at(step)
        return self.level + self.slope

    def update(self, step: int, value: float) -> Breach | None:
        """Take one logged point; a ``Breach`` when it completes one. A value without a watched-scale
        reading (NaN, inf, <= 0 on the log scale) is skipped: it moves nothing."""
        z = watched(value, self.band.scale)
        if z is None:
            return None
        index = self.index
        self.index += 1
        own = not self.band.trajectory[0]
        if self.quiet:  # after a breach: no CUSUM; the level is then the mean of these points
            self.quiet -= 1
            self._quiet_sum += z
            self._quiet_n += 1
            if own:
                self.level = self._quiet_sum / self._quiet_n
            return None
        predicted = self.expected(step)
        r = (z - predicted) / self.band.sd
        self.up = max(0.0, self.up + r - self.k)
        self.down = max(0.0, self.down - r - self.k)
        suspect = (self.direction != "down" and self.up >= 0.5 * self.h) or (
            self.direction != "up" and self.down >= 0.5 * self.h
        )
        if own and not suspect:
            level = self.level + self.slope
            new_level = level + self.alpha * (z - level)
            self.slope += self.beta * (new_level - self.level - self.slope)
            self.level = new_level
        elif own:
            self.level += self.slope  # suspect: carried along its line, not pulled by the points
        direction = self._crossed()
        if direction is None:
            return None
        statistic = self.up if direction == "up" else self.down
        self.breaches += 1
        self.up = self.down = 0.0
        self.quiet = self.cooldown
        self._quiet_sum, self._quiet_n = 0.0, 0
        return Breach(index, step, value, shown(predicted, self.band.scale), statistic, direction)

    def _crossed(self) -> str | None:
        """The watched direction whose CUSUM is past ``h``, if any."""
        if self.direction in ("up", "both") and self.up > self.h:
            return "up"
        if self.direction in ("down", "both") and self.down > self.h:
            return "down"
        return None


@dataclass
class ZScoreFilter:
    """W&B's ``MetricZScoreFilter`` at its defaults, evaluated on the logged values: a point fires
    when ``|x - mean| / std >= threshold`` (``change_dir=ANY``; W&B evaluates the inclusive operator)
    with the mean and standard deviation of the ``window`` points before it (W&B's docs say "the
    window to calculate the metric mean and standard deviation over"; the point itself is left out
    here, which only makes the filter more sensitive). ``update`` returns True on the first point of
    a firing episode (a point firing right after a firing point is the same episode)."""

    window: int = 30
    threshold: float = 3.0
    values: list[float] = field(default_factory=list)
    firing: bool = False

    def update(self, value: float) -> bool:
        past = self.values[-self.window :]
        fired = False
        if len(past) == self.window:
            mean = math.fsum(past) / self.window
            var = math.fsum((v - mean) ** 2 for v in past) / (self.window - 1)
            std = math.sqrt(var)
            fired = std > 0 and abs(value - mean) / std >= self.threshold
        self.values.append(value)
        if len(self.values) > 4 * self.window:
            del self.values[: -self.window]
        first = fired and not self.firing
        self.firing = fired
        return first
