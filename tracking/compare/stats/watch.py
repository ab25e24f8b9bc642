"""A live watch's statistics: the healthy band of a series and a robust CUSUM rule against it.

A watched series ``x_t`` (one value per logged point) is read on its watched scale ``z_t``: on the
"log" scale ``log(x + floor)`` (a positive quantity such as the mismatch KL, which falls by orders of
magnitude over training), with ``floor`` the quantity's floor near zero (the comparison's: 1e-5 nats
per token for the KL, ``cliptrack.compare.quantities``), so that values far below it — the KL of
a fresh sampler at 1e-12, or exactly 0 — read as the floor, not as a fall of ten orders of
magnitude whose noise would swamp every band; on the "value" scale ``x`` itself.

The **band** has a level, a scale and, for a reference run, a trajectory:

- from the run's own first ``window`` points: a line fitted to ``z`` (its level at the window's end),
  and the long-run sd of the residual around it;
- or from a reference run (the other stack's baseline): its smoothed trajectory (a centred moving
  median of ``z`` over ``window`` points), read at the watched point's step, and the long-run sd of
  its residual around that trajectory.

The long-run sd (``long_run_sd``) is the watch's own estimate: the residual is winsorised at
``CLIP`` robust sd (a spike in the window does not widen the band), then the equal-weighted cosine
estimate over ``0.4 n^(2/3)`` cosines (about 8 on 100 points, Lazarus, Lewis, Stock & Watson 2018)
is taken at the upper ``1 - SD_BOUND`` bound of its chi-square, never below the residual's own sd.
The comparison's ``lrv.long_run_variance`` is not used here: its persistence check compares batch
variances over as few as 4 batches, which on a 100-point window raises the estimate by up to 30
times by chance (the batch ratio ``v`` of about 2 degrees of freedom enters as ``v^2.5``).

Each new point is compared with its prediction — the band's level (own window), or the
trajectory plus an offset (reference) — and its residual is standardised by the current scale and
clipped at ``CLIP`` (one wild point adds at most ``CLIP - k``: a healthy spike that decays in a few
steps is not an episode), ``r = clip((z - prediction) / scale, -CLIP, CLIP)``. Two one-sided
CUSUMs accumulate it: ``S+ = max(0, S+ + r - k)``, ``S- = max(0, S- - r - k)``; a breach is
``S > h`` in a watched direction. Scaling by the long-run sd (not the point-to-point sd) is what
makes the sum of ``n`` autocorrelated residuals comparable to ``h``; independent z-scores of single
points (W&B's ``MetricZScoreFilter``) fire on every excursion of a persistent series.

While nothing is suspected (both CUSUMs below ``h / 2``), the band follows the run slowly:

- the **level** (own window) moves towards each point by ``alpha`` (half-life ``HALF_LIFE``
  points) of its residual, the residual limited to one scale in a watched direction (a drift is
  followed; a jump, whose points are all beyond the band, moves it by at most ``alpha`` scale a
  point, and is found long before it is absorbed); a fall in an "up" watch is followed at once;
- the **scale** is never below the band's and widens with the run's own noise: the running mean
  (half-life ``SCALE_HALF_LIFE``) of the squared clipped residuals, or where larger twice the
  running mean of those on the watched side (the semi-variance: above the prediction for an "up"
  watch, below for "down", the larger of the two for "both"), times the long-run factor of their
  lag-1 autocorrelation. Noise that is one-sided — a KL sitting at its floor, which can only
  burst upwards — is measured by the side the CUSUM sums: a run whose KL sinks to the floor and
  then shows healthy bursts back to its early level widens its band over those bursts instead of
  alarming on each cluster of them; on symmetric noise both estimates agree.

After a breach the next ``cooldown`` points raise none (one alert per episode): the CUSUMs restart
from 0 after them, and the band re-centres on the series: the level (own window) or the
trajectory's offset (reference) becomes the median of those points' ``z`` (their residuals from the
trajectory), so a lasting shift, above a reference run or above the run's own past, is alerted once
and is then the new level; a passing one is forgotten as the band follows again. Everything after
the band is pure Python, O(1) per point; the band itself is computed once (numpy).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cliptrack.compare.stats.quantiles import chi2_quantile

K = 0.5
"""CUSUM allowance, in long-run sd: shifts below ``2 K`` sd are not chased."""
H = 8.0
"""CUSUM decision threshold, in long-run sd (chosen by ``benchmarks/watch.py``)."""
CLIP = 2.0
"""Each standardised residual is clipped to ``[-CLIP, CLIP]`` before the CUSUM (and a reference
window's residual winsorised there before its long-run sd): one point adds at most ``CLIP - K``."""
WINDOW = 100
"""Default reference window, points."""
MIN_WINDOW = 20
"""Fewest points a band is estimated from."""
HALF_LIFE = 50.0
"""Half-life (points) of the level's updates of an own-window band."""
SCALE_HALF_LIFE = 200.0
"""Half-life (points) of the running mean of squared residuals that widens the scale."""
FALL = 2.0
"""A move away from the watched direction (a fall in an "up" watch) moves the level by up to this
many scales times ``alpha`` a point (a move towards it by one)."""
SCALE_CLIP = 5.0
"""Residuals widen the running scale up to this many scales each."""
RHO_MAX = 0.8
"""Highest lag-1 autocorrelation the running scale's long-run factor ``sqrt((1 + rho) / (1 - rho))``
uses (a factor of 3)."""
ABS_TO_SD = math.sqrt(math.pi / 2.0)
"""The sd of normal noise over its mean absolute value."""
COOLDOWN = 30
"""Points after a breach that raise none (one alert per episode); the band then re-centres on them."""
SD_BOUND = 0.25
"""The band's sd is the upper ``1 - SD_BOUND`` confidence bound of the long-run sd (its chi-square
with the estimate's degrees of freedom): a reference window of 100 points estimates it from about
8 cosines, and an sd estimated low by chance would alarm all run long."""
MIN_SD = 1e-3
"""Floor of the band's sd on the log scale (a 0.1 % wobble); on the value scale, this fraction of
the level's magnitude (plus 1e-12)."""
DIRECTIONS = ("up", "down", "both")
SCALES = ("log", "value")


@dataclass(frozen=True)
class Band:
    """The healthy band of one series on its watched scale (``scale``: "log" or "value").

    ``level``: the predicted ``z`` at the last reference point; ``slope``: the fitted line's slope
    per point (reported; predictions follow the run instead); ``sd``: the long-run standard deviation
    of the residual (watched-scale units); ``points``: reference points; ``ratio``: long-run over
    point sd of the residual (at least 1: widens the running scale); ``floor``: added to the value
    before the log; ``trajectory``: a reference run's smoothed ``(steps, z levels)``, read at each
    step, or empty for an own-window band."""

    level: float
    slope: float
    sd: float
    points: int
    scale: str = "log"
    ratio: float = 1.0
    floor: float = 0.0
    trajectory: tuple[tuple[int, ...], tuple[float, ...]] = field(default=((), ()), repr=False)

    def at(self, step: int) -> float:
        """The reference trajectory's level at ``step`` (held flat outside it; linear in between)."""
        steps, levels = self.trajectory
        if not steps:
            raise ValueError("this band has no reference trajectory")
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


def check_settings(
    *, scale: str, direction: str, window: int, k: float, h: float, floor: float = 0.0
) -> None:
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
    if not (math.isfinite(floor) and floor >= 0):
        raise ValueError(f"floor={floor!r}: expected a finite number >= 0 (the value's units)")


def watched(value: float, scale: str, floor: float = 0.0) -> float | None:
    """``value`` on the watched scale: ``log(value + floor)`` on the log scale, the value itself
    otherwise; None where it has none (not finite; ``value + floor <= 0`` or ``value < 0`` on the log
    scale)."""
    if not math.isfinite(value):
        return None
    if scale == "log":
        if value < 0 or value + floor <= 0:
            return None
        return math.log(value + floor)
    return value


def shown(z: float, scale: str, floor: float = 0.0) -> float:
    """A watched-scale number back on the value's own scale."""
    return max(math.exp(z) - floor, 0.0) if scale == "log" else z


def _floor_sd(sd: float, level: float, scale: str) -> float:
    if scale == "log":
        return max(sd, MIN_SD)
    return max(sd, MIN_SD * abs(level) + 1e-12)


def long_run_sd(residual: Sequence[float], degree: int) -> tuple[float, float]:
    """``(long-run sd, point sd)`` of a reference window's residual (around a polynomial trend of
    ``degree`` already removed; ``degree`` sets the cosines' correction): the residual winsorised at
    ``CLIP`` robust sd (1.4826 median absolute deviations), then the equal-weighted cosine estimate
    over ``0.4 n^(2/3)`` cosines (at least 4) at the upper ``1 - SD_BOUND`` bound of its chi-square,
    never below the winsorised residual's own sd."""
    import numpy as np
    from cliptrack.compare.stats.cosines import cosine_coefficients, polynomial_overlap

    e = np.asarray(residual, dtype=float)
    n = e.size
    centre = float(np.median(e))
    robust = 1.4826 * float(np.median(np.abs(e - centre)))
    if robust > 0:
        e = np.clip(e, centre - CLIP * robust, centre + CLIP * robust)
    e = e - e.mean()
    point = float(np.std(e))
    k = int(min(max(4, math.floor(0.4 * n ** (2.0 / 3.0))), n // 2 - degree - 1))
    if k < 1 or point == 0:
        return point, point
    coef = cosine_coefficients(e, k)
    b = polynomial_overlap(n, degree, k)  # the part of each cosine the trend took: tr(C) < k
    bb = b @ b.T
    tr = k - float(np.trace(bb))
    tr2 = k - 2.0 * float(np.trace(bb)) + float(np.sum(bb * bb))
    lrv, df = float(np.sum(coef * coef)) / tr, tr * tr / tr2
    lrv *= df / chi2_quantile(SD_BOUND, df)
    return max(math.sqrt(lrv), point), point


def own_band(z: Sequence[float], scale: str = "log", floor: float = 0.0) -> Band:
    """The band of a run's own reference window ``z`` (watched-scale values, in order): a line fitted
    by least squares, its level at the last point, and the long-run sd of the residual."""
    import numpy as np

    if len(z) < MIN_WINDOW:
        raise ValueError(f"a band needs at least {MIN_WINDOW} points, got {len(z)}")
    arr = np.asarray(z, dtype=float)
    n = arr.size
    t = np.arange(n, dtype=float)
    slope, intercept = np.polyfit(t, arr, 1)
    sd, point = long_run_sd(arr - (intercept + slope * t), degree=1)
    level = float(intercept + slope * (n - 1))
    ratio = sd / point if point > 0 else 1.0
    return Band(level, float(slope), _floor_sd(sd, level, scale), n, scale, ratio, floor)


def reference_band(
    steps: Sequence[int], z: Sequence[float], window: int = WINDOW, scale: str = "log", floor: float = 0.0
) -> Band:
    """The band of a reference run: its trajectory (a centred moving median of ``z`` over ``window``
    points, fewer at its ends, at each of its ``steps``) and the long-run sd of ``z`` around it."""
    import numpy as np

    if len(steps) != len(z):
        raise ValueError(f"reference steps ({len(steps)}) and values ({len(z)}) differ in length")
    if len(z) < MIN_WINDOW:
        raise ValueError(f"a reference run needs at least {MIN_WINDOW} watched points, got {len(z)}")
    order = np.argsort(np.asarray(steps), kind="stable")
    s = np.asarray(steps, dtype=np.int64)[order]
    arr = np.asarray(z, dtype=float)[order]
    half = max(1, min(window, arr.size) // 2)
    smooth = np.array(moving_median(arr.tolist(), half), dtype=float)
    residual = arr - smooth
    sd, point = long_run_sd(residual, degree=0)
    level = float(smooth[-1])
    ratio = sd / point if point > 0 else 1.0
    trajectory = (tuple(int(x) for x in s), tuple(float(x) for x in smooth))
    return Band(level, 0.0, _floor_sd(sd, level, scale), int(arr.size), scale, ratio, floor, trajectory)


MEDIAN_BLOCK_VALUES = 1 << 20
"""Values (8 MiB of float64) a block of full windows holds while ``moving_median`` takes their
medians at once."""
MEDIAN_HEAPS_ABOVE = 64
"""``moving_median`` takes a ``half`` above this through its heaps, at or below it by blocks."""


def moving_median(z: Sequence[float], half: int) -> list[float]:
    """The centred moving median of ``z``: at each ``i`` the median of ``z[max(0, i - half) : i +
    half + 1]`` (fewer points at the ends; the mean of the two middle values for an even count, as
    ``numpy.median``), bit for bit what ``numpy.median`` of each slice gives. Full windows are taken
    by blocks of ``MEDIAN_BLOCK_VALUES`` (``numpy.median`` along rows), or, for a ``half`` above
    ``MEDIAN_HEAPS_ABOVE``, every window by two heaps with lazy deletion (O(n log half)); a median
    per slice cost O(n half) Python calls: 89 s on 300,000 points at ``half`` 10,000."""
    import numpy as np

    n = len(z)
    if n == 0:
        return []
    if half > MEDIAN_HEAPS_ABOVE:
        return _heap_median(z, half)
    arr = np.asarray(z, dtype=float)
    width = 2 * half + 1
    out = np.empty(n)
    edges = [i for i in range(n) if i < half or i + half + 1 > n]
    for i in edges:
        out[i] = np.median(arr[max(0, i - half) : i + half + 1])
    if n >= width:
        windows = np.lib.stride_tricks.sliding_window_view(arr, width)  # row r is centred on r + half
        rows = max(1, MEDIAN_BLOCK_VALUES // width)
        for r in range(0, windows.shape[0], rows):
            block = windows[r : r + rows]
            out[r + half : r + half + block.shape[0]] = np.median(block, axis=1)
    return [float(x) for x in out]


def _heap_median(z: Sequence[float], half: int) -> list[float]:
    """``moving_median`` by ``_Halves``: the window grows on the right to ``i + half`` and leaves
    on the left below ``i - half``."""
    n = len(z)
    halves = _Halves(n)
    right = 0
    out: list[float] = []
    for i in range(n):
        while right < n and right <= i + half:
            halves.add(z[right], right)
            right += 1
        halves.leave(i - half)
        out.append(halves.median())
    return out


class _Halves:
    """A sliding window's lower half (a max-heap) and upper half (a min-heap) of ``(value, index)``
    entries; an entry that left the window (index below ``left``) is dropped when it reaches a top."""

    def __init__(self, n: int) -> None:
        self.lower: list[tuple[float, int]] = []  # (-value, index)
        self.upper: list[tuple[float, int]] = []  # (value, index)
        self.in_lower = bytearray(n)
        self.low = self.high = 0  # entries of the window in each half
        self.left = 0

    def _prune(self) -> None:
        import heapq

        lower, upper, left = self.lower, self.upper, self.left
        while lower and lower[0][1] < left:
            heapq.heappop(lower)
        while upper and upper[0][1] < left:
            heapq.heappop(upper)

    def add(self, x: float, index: int) -> None:
        import heapq

        self._prune()
        if self.lower and x <= -self.lower[0][0]:
            heapq.heappush(self.lower, (-x, index))
            self.in_lower[index] = 1
            self.low += 1
        else:
            heapq.heappush(self.upper, (x, index))
            self.high += 1

    def leave(self, left: int) -> None:
        """Entries below index ``left`` leave the window."""
        while self.left < left:
            if self.in_lower[self.left]:
                self.low -= 1
            else:
                self.high -= 1
            self.left += 1

    def median(self) -> float:
        import heapq

        self._prune()
        while self.low > self.high + 1 or self.low < self.high:
            if self.low > self.high:
                value, index = heapq.heappop(self.lower)
                heapq.heappush(self.upper, (-value, index))
                self.in_lower[index] = 0
                self.low, self.high = self.low - 1, self.high + 1
            else:
                value, index = heapq.heappop(self.upper)
                heapq.heappush(self.lower, (-value, index))
                self.in_lower[index] = 1
                self.low, self.high = self.low + 1, self.high - 1
            self._prune()
        if self.low > self.high:
            return -self.lower[0][0]
        return (-self.lower[0][0] + self.upper[0][0]) / 2.0


class Cusum:
    """The online rule for one series against ``band``: ``update(step, value)`` per point, O(1),
    returning a ``Breach`` or None. ``direction``: "up" (the mismatch KL rising), "down" or
    "both"; ``k``, ``h`` in long-run sd; ``half_life`` of the level's updates (points);
    ``cooldown``: points after a breach that raise none, over which the band re-centres."""

    def __init__(
        self,
        band: Band,
        *,
        direction: str = "up",
        k: float = K,
        h: float = H,
        half_life: float = HALF_LIFE,
        cooldown: int = COOLDOWN,
    ) -> None:
        check_settings(
            scale=band.scale,
            direction=direction,
            window=max(band.points, MIN_WINDOW),
            k=k,
            h=h,
            floor=band.floor,
        )
        self.band = band
        self.direction = direction
        self.k = k
        self.h = h
        self.alpha = 1.0 - 0.5 ** (1.0 / half_life)
        self.gamma = 1.0 - 0.5 ** (1.0 / SCALE_HALF_LIFE)
        self.cooldown = cooldown
        self.level = 0.0 if band.trajectory[0] else band.level
        """The own band's level, or the offset added to a reference trajectory."""
        self.sd = band.sd
        """The current scale (long-run sd, watched-scale units): never below ``band.sd``."""
        point = band.sd / band.ratio
        rho = (band.ratio**2 - 1.0) / (band.ratio**2 + 1.0)
        self._abs = point / ABS_TO_SD
        """Running mean of the clipped residuals' absolute values (watched-scale units)."""
        self._sq = point * point
        self._cross = min(rho, RHO_MAX) * point * point
        """Running means of the clipped residual's square and of its product with the previous one."""
        self._above = self._below = point * point
        """Running means of twice the clipped residual's square where it is above (below) the
        prediction, else 0: the upper (lower) semi-variance, times 2."""
        self._last = 0.0
        self.up = 0.0
        self.down = 0.0
        self.index = 0
        self.quiet = 0
        self._quiet: list[float] = []
        self.breaches = 0

    def expected(self, step: int) -> float:
        """The prediction for the point at ``step`` (watched scale)."""
        if self.band.trajectory[0]:
            return self.band.at(step) + self.level
        return self.level

    def update(self, step: int, value: float) -> Breach | None:
        """Take one logged point; a ``Breach`` when it completes one. A value without a watched-scale
        reading (NaN, inf, a negative value on the log scale) is skipped: it moves nothing."""
        z = watched(value, self.band.scale, self.band.floor)
        if z is None:
            return None
        index = self.index
        self.index += 1
        predicted = self.expected(step)
        if self.quiet:  # after a breach: no CUSUM; the band re-centres on these points
            self.quiet -= 1
            self._quiet.append(z - predicted + self.level)
            if not self.quiet:
                ordered = sorted(self._quiet)
                self.level = ordered[len(ordered) // 2]
                self._quiet = []
            return None
        r = (z - predicted) / self.sd
        clipped = max(-CLIP, min(CLIP, r))
        self.up = max(0.0, self.up + clipped - self.k)
        self.down = max(0.0, self.down - clipped - self.k)
        suspect = (self.direction != "down" and self.up >= 0.5 * self.h) or (
            self.direction != "up" and self.down >= 0.5 * self.h
        )
        if not suspect:
            self._follow(r)
        direction = self._crossed()
        if direction is None:
            return None
        statistic = self.up if direction == "up" else self.down
        self.breaches += 1
        self.up = self.down = 0.0
        self.quiet = self.cooldown
        self._quiet = []
        return Breach(
            index, step, value, shown(predicted, self.band.scale, self.band.floor), statistic, direction
        )

    def _follow(self, r: float) -> None:
        """Move the level (own band) towards a healthy point and widen the scale by its residual ``r``
        (standardised, unclipped)."""
        if not self.band.trajectory[0]:
            hi, lo = CLIP, -CLIP
            self.level += self.alpha * max(lo, min(hi, r)) * self.sd
        e = max(-SCALE_CLIP, min(SCALE_CLIP, r)) * self.sd
        g = self.gamma
        self._abs += g * (abs(e) - self._abs)
        self._sq += g * (e * e - self._sq)
        self._above += g * ((2.0 * e * e if e > 0 else 0.0) - self._above)
        self._below += g * ((2.0 * e * e if e < 0 else 0.0) - self._below)
        self._cross += g * (e * self._last - self._cross)
        self._last = e
        rho = min(max(self._cross / self._sq, 0.0), RHO_MAX) if self._sq > 0 else 0.0
        self.sd = max(self.band.sd, math.sqrt(self.variance() * (1.0 + rho) / (1.0 - rho)))

    def variance(self) -> float:
        """The running point variance the scale is made of (watched-scale units squared): the mean
        square of the residuals, or twice the semi-variance on the watched side where larger."""
        side = {"up": self._above, "down": self._below}.get(self.direction, max(self._above, self._below))
        return max(self._sq, side)

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
