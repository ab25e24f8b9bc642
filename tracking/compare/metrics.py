"""What is compared: each quantity as a ratio of per-step sums, with its equivalence tolerance.

Every quantity is ``sum(numerator) / sum(denominator)`` over the steps of a window, so the clip
fraction is token-weighted (``clipped_tokens:sum / loss_tokens:sum``, never a mean of per-step
fractions); a per-step mean such as reward uses a denominator of 1 per step that logged it.

Default tolerances (the equivalence margin of the verdict):

- clip fraction and its low/high split: **0.02 absolute** (two percentage points of tokens);
- reward and throughput: **5 % relative** to the reference run (the first run compared).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tracking import keys


@dataclass(frozen=True)
class MetricSpec:
    """One compared quantity.

    ``numerator``/``denominator`` are metric keys summed over steps (``denominator=None``: count
    the steps that logged the numerator). ``tolerance`` is absolute in the metric's units, or a
    fraction of the reference run's value when ``relative``. ``verdict=False`` marks quantities
    shown for diagnosis only (the low/high split).
    """

    name: str
    numerator: str
    denominator: str | None
    tolerance: float
    relative: bool
    unit: str
    verdict: bool = True

    def with_tolerance(self, tolerance: float) -> MetricSpec:
        if not tolerance > 0:
            raise ValueError(f"tolerance for {self.name} must be > 0, got {tolerance!r}")
        return replace(self, tolerance=float(tolerance))


CLIP_TOLERANCE = 0.02
"""Default absolute tolerance on the clip-fraction difference (fraction of tokens)."""
RELATIVE_TOLERANCE = 0.05
"""Default relative tolerance on reward and throughput differences (fraction of the reference)."""

CLIP = MetricSpec("clip_fraction", keys.CLIPPED_TOKENS, keys.LOSS_TOKENS, CLIP_TOLERANCE, False,
                  "fraction of loss tokens")
CLIP_LOW = MetricSpec("clip_low_fraction", keys.CLIPPED_LOW_TOKENS, keys.LOSS_TOKENS, CLIP_TOLERANCE, False,
                      "fraction of loss tokens", verdict=False)
CLIP_HIGH = MetricSpec("clip_high_fraction", keys.CLIPPED_HIGH_TOKENS, keys.LOSS_TOKENS, CLIP_TOLERANCE, False,
                       "fraction of loss tokens", verdict=False)
REWARD = MetricSpec("reward", keys.REWARD, None, RELATIVE_TOLERANCE, True, "reward")
THROUGHPUT = MetricSpec("throughput", keys.THROUGHPUT, None, RELATIVE_TOLERANCE, True, "tokens/s")
THROUGHPUT_FROM_TIME = MetricSpec("throughput", keys.LOSS_TOKENS, keys.STEP_TIME, RELATIVE_TOLERANCE, True,
                                  "tokens/s")
"""Throughput as total loss tokens / total step time, used when every run logs ``step_time_s:mean``."""

DEFAULT_SPECS = (CLIP, CLIP_LOW, CLIP_HIGH, REWARD, THROUGHPUT)
