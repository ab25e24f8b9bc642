"""One step of a custom training loop as the keys cliptrack compares.

``step_metrics`` turns what a loop has at the end of a step into one point: the loss's metrics
(what ``cliptrack.adapters.losses.output.loss_metrics`` returns, or a ``ForwardBackwardOutput`` / its dict), summed
exactly when there are several (token counts are integers; ``clip_fraction:mean`` is formed once,
from the sums), the mean reward (``keys.REWARD``) and, given the step's wall time, ``keys.STEP_TIME``
(seconds) and ``keys.THROUGHPUT`` (loss tokens per second). ``OpenStep`` is the state of
``with tracker.step(step):``: it times the block and gathers what ``log_output`` adds inside it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from cliptrack.core import keys
from cliptrack.core.outputs import is_output, metrics_of
from cliptrack.core.sums import MeasuredSums, sum_counts

__all__ = ["AbstractContextManager", "OpenStep", "step_metrics", "timed_step"]

COUNTED = frozenset({*keys.MEASURED_KEYS, *keys.MEAN_KEYS})
"""Keys combined across parts as the declaration of measures says (counts and gauge sums added,
extremes by max / min); the means (``clip_fraction:mean``, ``kl_k3:mean``, ...) are formed again
from the combined sums."""


def _metrics(part: object, index: int) -> Mapping[str, Any]:
    if isinstance(part, Mapping) and not is_output(part):
        return part
    try:
        return metrics_of(part)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"loss part {index}: {exc}") from None


def _other_keys(maps: list[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in maps:
        for key, value in m.items():
            if key in COUNTED:
                continue
            if key in out:
                raise ValueError(
                    f"two loss parts both give {key!r}; sum it yourself or pass it once in extra"
                )
            out[key] = value
    return out


def _timing(counts: MeasuredSums | None, step_time_s: float) -> dict[str, float]:
    if not step_time_s > 0:
        raise ValueError(f"step_time_s must be > 0 seconds, got {step_time_s!r}")
    out = {keys.STEP_TIME: float(step_time_s)}
    if counts is not None:
        out[keys.THROUGHPUT] = counts.loss_tokens / step_time_s
    return out


def step_metrics(
    *parts: object,
    reward: float | None = None,
    step_time_s: float | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One point's metrics: the parts' counts and ``loss:sum`` summed, any other key of a part kept
    (two parts giving the same other key is an error), ``reward`` as ``keys.REWARD``, and with
    ``step_time_s`` (seconds, > 0) the step time and the throughput in loss tokens per second."""
    maps = [_metrics(part, i) for i, part in enumerate(parts)]
    out = _other_keys(maps)
    counts = sum_counts(MeasuredSums.from_metrics(m) for m in maps)
    if counts is not None:
        out.update(counts.to_metrics())
    loss_sums = [m[keys.LOSS_SUM] for m in maps if keys.LOSS_SUM in m]
    if loss_sums:
        out[keys.LOSS_SUM] = float(sum(loss_sums))
    if reward is not None:
        out[keys.REWARD] = reward
    if step_time_s is not None:
        out.update(_timing(counts, step_time_s))
    for key, value in (extra or {}).items():
        if key in out:
            raise ValueError(f"extra metric {key!r} is already given by the losses or reward")
        out[key] = value
    return out


@dataclass
class OpenStep:
    """A step being timed by ``with tracker.step(step):``; ``started`` is ``time.perf_counter()``."""

    step: int
    started: float = field(default_factory=time.perf_counter)
    parts: list[object] = field(default_factory=list)
    reward: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, parts: tuple[object, ...], reward: float | None, extra: Mapping[str, Any] | None) -> None:
        """Gather a ``log_output`` call made inside the block (a second reward replaces the first)."""
        self.parts.extend(parts)
        if reward is not None:
            self.reward = reward
        self.extra.update(extra or {})

    def finish(self) -> dict[str, Any]:
        """The step's metrics, timed from ``started`` to now."""
        elapsed = time.perf_counter() - self.started
        return step_metrics(*self.parts, reward=self.reward, step_time_s=elapsed, extra=self.extra)


@contextlib.contextmanager
def timed_step(tracker: Any, step: int) -> Iterator[OpenStep]:
    """The block of ``tracker.step(step)``: ``tracker.log_output(step, ...)`` inside it is gathered;
    on a normal exit one point is logged, timed; an exception logs nothing for the step."""
    open_step = OpenStep(step)
    tracker._open_step = open_step
    try:
        yield open_step
    finally:
        tracker._open_step = None
    if not open_step.parts and open_step.reward is None and not open_step.extra:
        raise ValueError(
            f"step {step}: nothing was logged inside tracker.step(); call tracker.log_output there"
        )
    tracker.log(step, open_step.finish())
