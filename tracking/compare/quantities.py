"""The one registry of compared quantities: what each estimates, on which scale, within which margin,
and how it is shown. the engine, the command line and ``report`` (and the plot series and panels) read it;
a new quantity is one entry of :data:`QUANTITIES`.

Every quantity is a ratio of per-step sums over the paired units of a window,
``sum(numerator) / sum(denominator)`` (an :class:`Estimand`), so the clip fraction is
token-weighted (``clipped_tokens:sum / loss_tokens:sum``, never a mean of per-step fractions); a
per-step mean such as reward has ``denominator=None``: one per step that logged it.

Margins, all symmetric (comparing A with B mirrors comparing B with A). The gauge quantities fall by
orders of magnitude over training (a clip fraction from 2 % to 0.03 %), so no absolute margin fits
them: their margins are **relative, ±25 % on the log-ratio scale** (``|log(B / A)| < log(1.25)``),
with an **absolute floor** that applies near zero, where a relative margin would demand a precision
no run has (docs/STATISTICS.md, "Margins near zero", chose the floors by simulation):

- clip fraction and its low/high split, tokens with the ratio outside [1/2, 2]: ±25 %, floor
  **±0.0001** (0.01 pp of tokens), so relative from ``0.0001 / 25 % = 0.04 %`` of tokens up;
- mismatch KL (``kl_k3:sum / loss_tokens:sum``): ±25 %, floor **±1e-5 nats per token**;
- mean ``|log ratio|``: ±25 %, floor **±0.001 nats per token**;
- throughput: **±5 %** on the log-ratio scale, ``|log(B / A)| < log(1.05)``; computed as
  ``sum(loss_tokens) / sum(step time)`` when every run logs ``step_time_s:mean``;
- reward: ±5 %, floor **±0.02 reward units**;
- the mismatch KL's engine and drift parts (``engine_kl_k3``, ``drift_kl_k3``; for diagnosis, no
  verdict of their own): the mismatch KL's margin; the mean weight lag: ±25 %, floor **±0.1
  versions**.

A relative margin with a floor (scale ``auto``) is used on the log-ratio scale when both runs are
clearly away from zero (both intervals on one side of 0 and the smaller ``|value|`` at least
``floor / relative``), otherwise on the absolute scale with the floor, with a note saying so. A
20-fold difference is therefore never within the margin unless both values are below about the
floor. Margins are given per quantity as :func:`relative` or :func:`absolute` (:class:`Margin`);
an absolute margin is used on the absolute scale at every level.

"Equally on-policy" is judged on every quantity marked ``on_policy`` that the runs log (the clip
fraction always; a mismatch KL once it is logged), each against its own margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from cliptrack.compare import formatting
from cliptrack.compare.stats.estimate import ABSOLUTE, LOG_RATIO
from cliptrack.core import keys

AUTO = "auto"
"""Scale chosen per comparison: log-ratio when both runs are clearly away from zero, else absolute."""
SCALES = (ABSOLUTE, LOG_RATIO, AUTO)

FRACTION = (0.0, 1.0)
"""Bounds of a fraction of tokens: its intervals are kept within [0, 1]."""
NONNEGATIVE = (0.0, math.inf)
"""Bounds of a quantity that cannot be negative (a KL, a mean ``|log ratio|``, a throughput): its
intervals are formed on the log scale and stay at or above 0."""


@dataclass(frozen=True)
class Margin:
    """A margin as given for one quantity: ``relative`` (``value`` = 0.25 is ±25 % on the log-ratio
    scale, ``|log(B / A)| < log(1.25)``; near zero the absolute ``floor``, default the quantity's
    own) or absolute (``value`` in the quantity's units, at every level). Make one with
    :func:`relative` or :func:`absolute`."""

    value: float
    is_relative: bool
    floor: float | None = None

    def __post_init__(self) -> None:
        _check_margin("a margin", self.value)
        if self.floor is not None:
            _check_margin("a margin", self.floor, "floor")
            if not self.is_relative:
                raise ValueError("an absolute margin has no floor (the floor belongs to a relative margin)")

    def near(self, size: float, floor: float | None = None) -> float:
        """This margin as an absolute tolerance (the quantity's units) for a quantity of size
        ``size`` (>= 0, the quantity's units): an absolute margin's value; a relative one's
        ``value * size``, never below its floor (``floor`` when it has none of its own)."""
        if not (math.isfinite(size) and size >= 0):
            raise ValueError(f"the size a margin is taken of must be finite and >= 0, got {size!r}")
        if not self.is_relative:
            return self.value
        own = self.floor if self.floor is not None else floor
        return max(own or 0.0, self.value * size)

    def __str__(self) -> str:
        if not self.is_relative:
            return f"{self.value:g}"
        return f"{self.value * 100:g}%" + ("" if self.floor is None else f" (floor {self.floor:g})")


def relative(value: float, floor: float | None = None) -> Margin:
    """A relative margin: ``relative(0.25)`` is ±25 % on the log-ratio scale; ``floor``: the absolute
    margin near zero (default: the quantity's own floor, where it has one)."""
    return Margin(float(value), True, None if floor is None else float(floor))


def absolute(value: float) -> Margin:
    """An absolute margin in the quantity's units (``absolute(0.002)`` on a clip fraction: ±0.2 pp),
    used at every level."""
    return Margin(float(value), False)


@dataclass(frozen=True)
class Estimand:
    """``sum(numerator) / sum(denominator)`` over units; ``denominator=None``: one per step that
    logged the numerator (a mean over steps). ``counts``: both keys hold exact integer token
    counts, so each step must have ``0 <= numerator <= denominator`` in whole tokens."""

    numerator: str
    denominator: str | None = None
    counts: bool = False

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.numerator,) if self.denominator is None else (self.numerator, self.denominator)

    def __str__(self) -> str:
        return self.numerator if self.denominator is None else f"{self.numerator} / {self.denominator}"


@dataclass(frozen=True)
class Quantity:
    """One compared quantity.

    ``estimands``: ways to form it, in order of preference; a comparison uses the first one every
    compared run logs (else the last). ``scale``: ``absolute`` (``margin`` in the quantity's
    units), ``log-ratio`` (``margin`` relative: 0.05 = ±5 %) or ``auto`` (relative ``margin``
    when clearly away from zero, else the floor ``abs_margin``). ``bounds``: the range the
    quantity lives in (intervals are kept inside it: ``FRACTION``, or ``NONNEGATIVE``, whose
    intervals are formed on the log scale). ``percent``: shown in percent, differences in percentage
    points. ``verdict``: its pair verdict is shown and gated on (False: shown for diagnosis only,
    the low/high split). ``on_policy``: part of the "equally on-policy" answer. ``optional``:
    its absence is no warning (compared only when logged). ``approximate_key``: another
    tracker's mean of means a run may have logged instead (``frameworks.ALIASES``): used for that run,
    marked approximate. ``margin_of``: takes the margin given for that quantity when none is
    given for this one. ``lead_lag``: check whether one run's curve lags the other's.
    ``plural``: what the headline calls several of it ("clip fractions"; default: ``label`` + "s").
    """

    name: str
    label: str
    unit: str
    estimands: tuple[Estimand, ...]
    scale: str
    margin: float
    abs_margin: float = float("nan")
    bounds: tuple[float, float] | None = None
    percent: bool = False
    verdict: bool = True
    on_policy: bool = False
    optional: bool = False
    approximate_key: str | None = None
    margin_of: str | None = None
    lead_lag: bool = False
    plural: str = ""

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ValueError(f"quantity {self.name!r}: scale {self.scale!r} is not one of {SCALES}")
        if not self.estimands:
            raise ValueError(f"quantity {self.name!r} has no estimand")
        _check_margin(self.name, self.margin)

    @property
    def estimand(self) -> Estimand:
        """The estimand in use (the first one; :meth:`using` picks it for a comparison)."""
        return self.estimands[0]

    @property
    def numerator(self) -> str:
        return self.estimand.numerator

    @property
    def denominator(self) -> str | None:
        return self.estimand.denominator

    def using(self, estimand: Estimand) -> Quantity:
        """This quantity formed from ``estimand`` alone."""
        return replace(self, estimands=(estimand,))

    def with_margin(self, margin: float) -> Quantity:
        _check_margin(self.name, margin)
        return replace(self, margin=float(margin))

    def with_abs_margin(self, margin: float) -> Quantity:
        _check_margin(self.name, margin, "absolute tolerance")
        return replace(self, abs_margin=float(margin))

    def with_given(self, margin: Margin) -> Quantity:
        """This quantity within ``margin``: an absolute one at every level (scale ``absolute``); a
        relative one on the log-ratio scale, near zero on its floor (``auto``) when it has one."""
        if not margin.is_relative:
            return replace(self, scale=ABSOLUTE, margin=margin.value, abs_margin=float("nan"))
        floor = self.abs_margin if margin.floor is None else margin.floor
        scale = AUTO if math.isfinite(floor) else LOG_RATIO
        return replace(self, scale=scale, margin=margin.value, abs_margin=floor)

    @property
    def default_margin(self) -> Margin:
        """This entry's margin as a :class:`Margin`."""
        if self.scale == ABSOLUTE:
            return absolute(self.margin)
        return relative(self.margin, self.abs_margin if math.isfinite(self.abs_margin) else None)

    def margin_text(self) -> str:
        """The margin in words: ``±25% (±0.01 pp near zero)``, ``±5%``, ``±2 pp``, ``±0.002``."""
        if self.scale == ABSOLUTE:
            return self.absolute_text(self.margin)
        text = formatting.margin(self.margin, LOG_RATIO, self.percent)
        if self.scale == AUTO:
            text += f" ({self.absolute_text(self.abs_margin)} near zero)"
        return text

    def absolute_text(self, margin: float) -> str:
        """An absolute margin of this quantity in words: ``±0.01 pp`` (percent), ``±0.002``."""
        return formatting.margin(margin, ABSOLUTE, self.percent)

    @property
    def plural_label(self) -> str:
        """The quantity in the plural, as the headline names it."""
        return self.plural or f"{self.label}s"

    def relative_floor(self) -> float:
        """For ``scale="auto"``: the smallest ``|value|`` at which the relative margin applies
        (``floor / relative``: there the two margins are about the same width)."""
        return self.abs_margin / self.margin


def _check_margin(name: str, margin: float, what: str = "tolerance") -> None:
    if not (isinstance(margin, int | float) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"{what} for {name} must be > 0 (a finite margin), got {margin!r}")


def log_margin(relative: float) -> float:
    """The log-ratio margin of a relative margin: ``log(1 + relative)``."""
    return math.log1p(relative)


GAUGE_MARGIN = 0.25
"""Default relative margin of the gauge quantities (clip fractions, mismatch KL, mean ``|log
ratio|``, ratio outside): ±25 % on the log-ratio scale, ``|log(B / A)| < log(1.25)``. Runs of one
recipe that differ only by seed land well within it; a 20-fold difference (2 against 4 PPO epochs
of the demo: 0.05 % against 1.0 % of tokens clipped) is far outside it."""
CLIP_FLOOR = 1e-4
"""Default absolute floor of token fractions (clip fractions, ratio outside): ±0.01 pp of tokens,
used below ``CLIP_FLOOR / GAUGE_MARGIN`` = 0.04 % of tokens (chosen by simulation,
docs/STATISTICS.md, "Margins near zero")."""
KL_FLOOR = 1e-5
"""Default absolute floor of the mismatch KL (nats per token): 1 % of a healthy bf16 stack's 1e-3,
below which two runs are both on-policy to every practical purpose."""
ABS_LOG_RATIO_FLOOR = 1e-3
"""Default absolute floor of the mean ``|log ratio|`` (nats per token)."""
CLIP_MARGIN = GAUGE_MARGIN
"""Default margin of the clip fraction (relative; ``CLIP_FLOOR`` near zero)."""
KL_MARGIN = GAUGE_MARGIN
"""Default margin of the mismatch KL (relative; ``KL_FLOOR`` near zero). Sampler–trainer KL of a
healthy bf16 stack sits around 1e-3 and a visibly off-policy one at 1e-2 (the demo: 0.003 on-policy
against 0.015 two steps stale), and it falls over training with the clip fraction."""
WEIGHT_LAG_FLOOR = 0.1
"""Default absolute floor of the mean weight lag (versions per token): a tenth of a version."""
RELATIVE_MARGIN = 0.05
"""Default relative margin of reward and throughput (±5 %, on the log-ratio scale)."""
REWARD_ABS_MARGIN = 0.02
"""Default absolute reward margin (reward units), used when the rewards are near zero."""

_TOKENS = "fraction of loss tokens"


def _mismatch_part(part: str, total: str, mean: str) -> Quantity:
    """The mismatch KL's ``part`` (``drift`` or ``engine``: ``total`` summed over the loss tokens,
    ``mean`` another tracker's mean of it), compared for diagnosis within the mismatch KL's margin."""
    return Quantity(
        f"{part}_kl_k3",
        f"mismatch KL, {part} part",
        "nats per loss token",
        (Estimand(total, keys.LOSS_TOKENS),),
        AUTO,
        KL_MARGIN,
        abs_margin=KL_FLOOR,
        bounds=NONNEGATIVE,
        verdict=False,
        optional=True,
        approximate_key=mean,
        margin_of="kl_k3",
    )


QUANTITIES: tuple[Quantity, ...] = (
    Quantity(
        "clip_fraction",
        "clip fraction (token-weighted)",
        _TOKENS,
        (Estimand(keys.CLIPPED_TOKENS, keys.LOSS_TOKENS, counts=True),),
        AUTO,
        GAUGE_MARGIN,
        abs_margin=CLIP_FLOOR,
        bounds=FRACTION,
        percent=True,
        on_policy=True,
        approximate_key=keys.CLIP_FRACTION,
        plural="clip fractions",
    ),
    Quantity(
        "clip_low_fraction",
        "clip fraction, low side",
        _TOKENS,
        (Estimand(keys.CLIPPED_LOW_TOKENS, keys.LOSS_TOKENS, counts=True),),
        AUTO,
        GAUGE_MARGIN,
        abs_margin=CLIP_FLOOR,
        bounds=FRACTION,
        percent=True,
        verdict=False,
        optional=True,
        margin_of="clip_fraction",
    ),
    Quantity(
        "clip_high_fraction",
        "clip fraction, high side",
        _TOKENS,
        (Estimand(keys.CLIPPED_HIGH_TOKENS, keys.LOSS_TOKENS, counts=True),),
        AUTO,
        GAUGE_MARGIN,
        abs_margin=CLIP_FLOOR,
        bounds=FRACTION,
        percent=True,
        verdict=False,
        optional=True,
        margin_of="clip_fraction",
    ),
    Quantity(
        "kl_k3",
        "mismatch KL (k3)",
        "nats per loss token",
        (Estimand(keys.KL_K3_SUM, keys.LOSS_TOKENS),),
        AUTO,
        KL_MARGIN,
        abs_margin=KL_FLOOR,
        bounds=NONNEGATIVE,
        on_policy=True,
        optional=True,
        approximate_key=keys.KL_K3_MEAN,
        plural="mismatch KLs",
    ),
    Quantity(
        "abs_log_ratio",
        "mean |log ratio| (token-weighted)",
        "nats per loss token",
        (Estimand(keys.ABS_LOG_RATIO_SUM, keys.LOSS_TOKENS),),
        AUTO,
        GAUGE_MARGIN,
        abs_margin=ABS_LOG_RATIO_FLOOR,
        bounds=NONNEGATIVE,
        optional=True,
        approximate_key=keys.ABS_LOG_RATIO_MEAN,
    ),
    Quantity(
        "ratio_outside_fraction",
        "tokens with ratio outside [1/2, 2]",
        _TOKENS,
        (Estimand(keys.RATIO_OUTSIDE_TOKENS, keys.LOSS_TOKENS, counts=True),),
        AUTO,
        GAUGE_MARGIN,
        abs_margin=CLIP_FLOOR,
        bounds=FRACTION,
        percent=True,
        optional=True,
    ),
    _mismatch_part("drift", keys.DRIFT_KL_K3_SUM, keys.DRIFT_KL_K3_MEAN),
    _mismatch_part("engine", keys.ENGINE_KL_K3_SUM, keys.ENGINE_KL_K3_MEAN),
    Quantity(
        "weight_lag",
        "mean weight lag",
        "versions per loss token",
        (Estimand(keys.WEIGHT_LAG_SUM, keys.LOSS_TOKENS),),
        AUTO,
        GAUGE_MARGIN,
        abs_margin=WEIGHT_LAG_FLOOR,
        bounds=NONNEGATIVE,
        verdict=False,
        optional=True,
        approximate_key=keys.WEIGHT_LAG_MEAN,
    ),
    Quantity(
        "reward",
        "mean reward",
        "reward",
        (Estimand(keys.REWARD),),
        AUTO,
        RELATIVE_MARGIN,
        abs_margin=REWARD_ABS_MARGIN,
        lead_lag=True,
    ),
    Quantity(
        "throughput",
        "throughput",
        "tokens/s",
        (Estimand(keys.LOSS_TOKENS, keys.STEP_TIME), Estimand(keys.THROUGHPUT)),
        LOG_RATIO,
        RELATIVE_MARGIN,
        bounds=NONNEGATIVE,
    ),
)
"""Every compared quantity, in display order."""

DEFAULT_MARGINS: dict[str, Margin] = {q.name: q.default_margin for q in QUANTITIES}
"""Default margin by quantity name (:class:`Margin`: relative with its floor, or absolute)."""


def quantity(name: str) -> Quantity:
    """The registry entry called ``name``; KeyError listing the known names otherwise."""
    for q in QUANTITIES:
        if q.name == name:
            return q
    raise KeyError(f"no quantity {name!r}; known: {[q.name for q in QUANTITIES]}")


def as_margin(q: Quantity, given: Margin | float) -> Margin:
    """``given`` as a :class:`Margin` for ``q``: a plain number is absolute (in ``q``'s units)."""
    if isinstance(given, Margin):
        return given
    if isinstance(given, bool) or not isinstance(given, int | float):
        raise ValueError(
            f"margin for {q.name} must be relative(...), absolute(...) or a number, got {given!r}"
        )
    _check_margin(q.name, given)
    return absolute(given)


def margin_from_text(name: str, text: str, plain: Callable[[float], Margin] = absolute) -> Margin:
    """A margin as written on the command line for the quantity ``name``: ``25%`` relative,
    ``25%,0.0001`` (or ``0.25,0.0001``) relative with its absolute floor, a plain number what
    ``plain`` makes of it (absolute by default). ValueError naming ``name`` when it is none of these."""
    text = text.strip()
    first, comma, floor_text = text.partition(",")
    first = first.strip()
    try:
        share = float(first[:-1]) / 100.0 if first.endswith("%") else float(first)
        floor = float(floor_text) if comma else None
    except ValueError:
        raise ValueError(
            f"margin {text!r} for {name} must be a percentage (25%), a number, or RELATIVE,FLOOR (25%,0.0001)"
        ) from None
    _check_margin(name, share)
    if floor is not None:
        return relative(share, floor)
    return relative(share) if first.endswith("%") else plain(share)


def parse_margin(q: Quantity, text: str) -> Margin:
    """A margin of ``q`` as written on the command line (:func:`margin_from_text`): ``25%`` is
    relative, a plain number absolute in ``q``'s units, for every quantity."""
    return margin_from_text(q.name, text)


def with_margins(
    quantities: tuple[Quantity, ...] | list[Quantity],
    margins: Mapping[str, Margin | float],
    abs_margins: Mapping[str, float] | None = None,
) -> list[Quantity]:
    """``quantities`` within the margins given by name (:class:`Margin`, or a plain number:
    absolute; ``margin_of`` followed), and the floors ``abs_margins`` by name; ValueError naming an
    unknown quantity or a margin that is not a finite number > 0."""
    names = [q.name for q in quantities]
    unknown = sorted(set(margins) - set(names)) + sorted(set(abs_margins or {}) - set(names))
    if unknown:
        raise ValueError(f"margin given for unknown quantities {unknown}; known: {names}")
    out = []
    for q in quantities:
        if q.name in margins:
            q = q.with_given(as_margin(q, margins[q.name]))
        elif q.margin_of is not None and q.margin_of in margins:
            q = q.with_given(as_margin(q, margins[q.margin_of]))
        if abs_margins and q.name in abs_margins:
            q = q.with_abs_margin(abs_margins[q.name])
            if q.scale == LOG_RATIO:
                q = replace(q, scale=AUTO)
        out.append(q)
    return out
