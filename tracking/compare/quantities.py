"""The one registry of compared quantities: what each estimates, on which scale, within which margin,
and how it is shown. the engine, the command line and ``report`` (and the plot series and panels) read it;
a new quantity is one entry of :data:`QUANTITIES`.

Every quantity is a ratio of per-step sums over the paired units of a window,
``sum(numerator) / sum(denominator)`` (an :class:`Estimand`), so the clip fraction is
token-weighted (``clipped_tokens:sum / loss_tokens:sum``, never a mean of per-step fractions); a
per-step mean such as reward has ``denominator=None``: one per step that logged it.

Margins, all symmetric (comparing A with B mirrors comparing B with A):

- clip fraction and its low/high split: **±0.02 absolute** (two percentage points of tokens);
- mismatch KL (``kl_k3:sum / loss_tokens:sum``): **±0.002 nats per token**; mean ``|log ratio|``:
  **±0.02 nats**; tokens with the ratio outside [1/2, 2]: **±0.01 absolute** (compared when logged);
- throughput: **±5 % on the log-ratio scale**, ``|log(B / A)| < log(1.05)``; computed as
  ``sum(loss_tokens) / sum(step time)`` when every run logs ``step_time_s:mean``;
- reward: the margin is the larger of **5 %** (log-ratio scale) and **0.02 reward units**
  (absolute): relative only when both runs' rewards are clearly away from zero — both intervals
  on one side of zero and the smaller ``|reward|`` at least ``0.02 / 5 % = 0.4`` — otherwise
  absolute, with a note saying so.

"Equally on-policy" is judged on every quantity marked ``on_policy`` that the runs log (the clip
fraction always; a mismatch KL once it is logged), each against its own margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from cliptrack.compare.stats.estimate import ABSOLUTE, LOG_RATIO
from cliptrack.core import keys

AUTO = "auto"
"""Scale chosen per comparison: log-ratio when both runs are clearly away from zero, else absolute."""
SCALES = (ABSOLUTE, LOG_RATIO, AUTO)

FRACTION = (0.0, 1.0)
"""Bounds of a fraction of tokens: its intervals are kept within [0, 1]."""


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
    when clearly away from zero, else ``abs_margin``). ``bounds``: the range the quantity lives
    in (intervals are kept inside it). ``percent``: shown in percent, differences in percentage
    points. ``verdict``: its pair verdict is shown and gated on (False: shown for diagnosis only,
    the low/high split). ``on_policy``: part of the "equally on-policy" answer. ``optional``:
    its absence is no warning (compared only when logged). ``approximate_key``: another
    tracker's mean of means a run may have logged instead (``keys.ALIASES``): used for that run,
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

    @property
    def plural_label(self) -> str:
        """The quantity in the plural, as the headline names it."""
        return self.plural or f"{self.label}s"

    def relative_floor(self) -> float:
        """For ``scale="auto"``: the smallest ``|value|`` at which the relative margin applies."""
        return self.abs_margin / self.margin


def _check_margin(name: str, margin: float, what: str = "tolerance") -> None:
    if not (isinstance(margin, int | float) and math.isfinite(margin) and margin > 0):
        raise ValueError(f"{what} for {name} must be > 0 (a finite margin), got {margin!r}")


def log_margin(relative: float) -> float:
    """The log-ratio margin of a relative margin: ``log(1 + relative)``."""
    return math.log1p(relative)


CLIP_MARGIN = 0.02
"""Default absolute margin on the clip-fraction difference (fraction of tokens)."""
RELATIVE_MARGIN = 0.05
"""Default relative margin of reward and throughput (±5 %, on the log-ratio scale)."""
REWARD_ABS_MARGIN = 0.02
"""Default absolute reward margin (reward units), used when the rewards are near zero."""
KL_MARGIN = 0.002
"""Default absolute margin on the mismatch KL (``kl_k3:sum / loss_tokens:sum``, nats per token).
Sampler–trainer KL of a healthy bf16 stack sits around 1e-3 and a visibly off-policy one at 1e-2
(the demo: 0.003 on-policy against 0.015 two steps stale); 0.002 tells those apart and is about
the on-policy level itself."""
ABS_LOG_RATIO_MARGIN = 0.02
"""Default absolute margin on the mean ``|logprobs - sampling_logprobs|`` (nats per token)."""
OUTSIDE_MARGIN = 0.01
"""Default absolute margin on the fraction of tokens whose ratio leaves [1/2, 2] (one point)."""

_TOKENS = "fraction of loss tokens"

QUANTITIES: tuple[Quantity, ...] = (
    Quantity(
        "clip_fraction",
        "clip fraction (token-weighted)",
        _TOKENS,
        (Estimand(keys.CLIPPED_TOKENS, keys.LOSS_TOKENS, counts=True),),
        ABSOLUTE,
        CLIP_MARGIN,
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
        ABSOLUTE,
        CLIP_MARGIN,
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
        ABSOLUTE,
        CLIP_MARGIN,
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
        ABSOLUTE,
        KL_MARGIN,
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
        ABSOLUTE,
        ABS_LOG_RATIO_MARGIN,
        optional=True,
        approximate_key=keys.ABS_LOG_RATIO_MEAN,
    ),
    Quantity(
        "ratio_outside_fraction",
        "tokens with ratio outside [1/2, 2]",
        _TOKENS,
        (Estimand(keys.RATIO_OUTSIDE_TOKENS, keys.LOSS_TOKENS, counts=True),),
        ABSOLUTE,
        OUTSIDE_MARGIN,
        bounds=FRACTION,
        percent=True,
        optional=True,
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
    ),
)
"""Every compared quantity, in display order."""

DEFAULT_MARGINS: dict[str, float] = {q.name: q.margin for q in QUANTITIES}
"""Default margin by quantity name (absolute, or relative for log-ratio scales)."""


def quantity(name: str) -> Quantity:
    """The registry entry called ``name``; KeyError listing the known names otherwise."""
    for q in QUANTITIES:
        if q.name == name:
            return q
    raise KeyError(f"no quantity {name!r}; known: {[q.name for q in QUANTITIES]}")


def with_margins(
    quantities: tuple[Quantity, ...] | list[Quantity],
    margins: Mapping[str, float],
    abs_margins: Mapping[str, float] | None = None,
) -> list[Quantity]:
    """``quantities`` with the margins given by name (``margin_of`` followed); ValueError naming an
    unknown quantity or a margin that is not a finite number > 0."""
    names = [q.name for q in quantities]
    unknown = sorted(set(margins) - set(names)) + sorted(set(abs_margins or {}) - set(names))
    if unknown:
        raise ValueError(f"margin given for unknown quantities {unknown}; known: {names}")
    out = []
    for q in quantities:
        if q.name in margins:
            q = q.with_margin(margins[q.name])
        elif q.margin_of is not None and q.margin_of in margins:
            q = q.with_margin(margins[q.margin_of])
        if abs_margins and q.name in abs_margins:
            q = q.with_abs_margin(abs_margins[q.name])
        out.append(q)
    return out
