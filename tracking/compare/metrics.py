"""What is compared: each quantity as a ratio of per-step sums, with its equivalence margin.

Every quantity is ``sum(numerator) / sum(denominator)`` over the paired units of a window, so the
clip fraction is token-weighted (``clipped_tokens:sum / loss_tokens:sum``, never a mean of per-step
fractions); a per-step mean such as reward uses a denominator of 1 per step that logged it.

Margins, all symmetric (comparing A with B mirrors comparing B with A):

- clip fraction and its low/high split: **±0.02 absolute** (two percentage points of tokens);
- throughput: **±5 % on the log-ratio scale**, ``|log(B / A)| < log(1.05)``; computed as
  ``sum(loss_tokens) / sum(step time)`` when every run logs ``step_time_s:mean``;
- reward: the margin is the larger of **5 %** (log-ratio scale) and **0.02 reward units**
  (absolute): relative only when both runs' rewards are clearly away from zero — both intervals
  on one side of zero and the smaller ``|reward|`` at least ``0.02 / 5 % = 0.4`` — otherwise
  absolute, with a note saying so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tracking import keys
from tracking.compare.options import CLIP_TOLERANCE, RELATIVE_TOLERANCE, REWARD_ABS_TOLERANCE
from tracking.compare.stats import ABSOLUTE, LOG_RATIO

AUTO = "auto"
"""Scale chosen per comparison: log-ratio when both runs are clearly away from zero, else absolute."""


@dataclass(frozen=True)
class MetricSpec:
    """One compared quantity.

    ``numerator``/``denominator`` are metric keys summed over steps (``denominator=None``: count
    the steps that logged the numerator). ``scale`` is ``"absolute"`` (``tolerance`` in the
    quantity's units), ``"log-ratio"`` (``tolerance`` a relative margin: ±5 % is 0.05) or
    ``"auto"`` (relative ``tolerance`` when clearly away from zero, else ``abs_tolerance``).
    ``verdict=False`` marks quantities shown for diagnosis only (the low/high split).
    """

    name: str
    numerator: str
    denominator: str | None
    tolerance: float
    scale: str
    unit: str
    verdict: bool = True
    abs_tolerance: float = float("nan")

    def with_tolerance(self, tolerance: float) -> MetricSpec:
        if not tolerance > 0:
            raise ValueError(f"tolerance for {self.name} must be > 0, got {tolerance!r}")
        return replace(self, tolerance=float(tolerance))

    def with_abs_tolerance(self, tolerance: float) -> MetricSpec:
        if not tolerance > 0:
            raise ValueError(f"absolute tolerance for {self.name} must be > 0, got {tolerance!r}")
        return replace(self, abs_tolerance=float(tolerance))

    @property
    def is_fraction(self) -> bool:
        return self.unit.startswith("fraction")

    def relative_floor(self) -> float:
        """For ``scale="auto"``: the smallest ``|value|`` at which the relative margin applies."""
        return self.abs_tolerance / self.tolerance


def log_margin(relative: float) -> float:
    """The log-ratio margin of a relative tolerance: ``log(1 + relative)``."""
    return math.log1p(relative)


CLIP = MetricSpec(
    "clip_fraction",
    keys.CLIPPED_TOKENS,
    keys.LOSS_TOKENS,
    CLIP_TOLERANCE,
    ABSOLUTE,
    "fraction of loss tokens",
)
CLIP_LOW = MetricSpec(
    "clip_low_fraction",
    keys.CLIPPED_LOW_TOKENS,
    keys.LOSS_TOKENS,
    CLIP_TOLERANCE,
    ABSOLUTE,
    "fraction of loss tokens",
    verdict=False,
)
CLIP_HIGH = MetricSpec(
    "clip_high_fraction",
    keys.CLIPPED_HIGH_TOKENS,
    keys.LOSS_TOKENS,
    CLIP_TOLERANCE,
    ABSOLUTE,
    "fraction of loss tokens",
    verdict=False,
)
REWARD = MetricSpec(
    "reward", keys.REWARD, None, RELATIVE_TOLERANCE, AUTO, "reward", abs_tolerance=REWARD_ABS_TOLERANCE
)
THROUGHPUT = MetricSpec("throughput", keys.THROUGHPUT, None, RELATIVE_TOLERANCE, LOG_RATIO, "tokens/s")
THROUGHPUT_FROM_TIME = MetricSpec(
    "throughput", keys.LOSS_TOKENS, keys.STEP_TIME, RELATIVE_TOLERANCE, LOG_RATIO, "tokens/s"
)
"""Throughput as total loss tokens / total step time, used when every run logs ``step_time_s:mean``."""

DEFAULT_SPECS = (CLIP, CLIP_LOW, CLIP_HIGH, REWARD, THROUGHPUT)
