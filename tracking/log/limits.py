"""The tracker's bounds in one dataclass, checked once: time, points, values and bytes.

Together they make the memory bound of ``cliptrack.log._pipeline.writer.MEMORY_BOUND_BYTES`` (256 MB at the
defaults, one remote sink; ``cliptrack.log._pipeline.writer.memory_bound``): the inbox (``max_queued_points``
points and ``max_queued_values`` values as Python objects, about 340 and 60 bytes each), each
lane's buffer (``max_buffered_bytes`` of encoded points) and, while the local
disk refuses writes, the held tail (``max_held_bytes`` of encoded points). The point bounds stay
for the crash window and the batch size; the byte and value bounds hold whatever the number of
metrics per point.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from cliptrack.log._pipeline.held import MAX_HELD_BYTES
from cliptrack.log._pipeline.lane import MAX_BUFFERED_BYTES
from cliptrack.log._pipeline.writer import MAX_QUEUED_VALUES


@dataclass(frozen=True)
class Limits:
    """Bounds of one tracker (see the module docstring); ValueError naming a bad one."""

    flush_interval_s: float = 1.0
    """Seconds between writes of queued points (the most a crash can lose, plus 0.5 s under overload)."""
    max_batch_points: int = 2000
    """Points per batch; the writer also wakes when this many are queued."""
    max_queued_points: int = 20_000
    """Points ``log`` may queue ahead of the writer before it waits."""
    max_queued_values: int = MAX_QUEUED_VALUES
    """Metric values ``log`` may queue ahead of the writer before it waits."""
    max_buffered_points: int = 50_000
    """Points a lagging sink may hold in memory before reading back from the journal."""
    max_buffered_bytes: int = MAX_BUFFERED_BYTES
    """Bytes of encoded points a lagging sink may hold in memory before reading back."""
    max_held_bytes: int = MAX_HELD_BYTES
    """Bytes of encoded points held while the local disk refuses them."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{item.name} must be a number, got {value!r}")
        if self.flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0 seconds, got {self.flush_interval_s!r}")
        if self.max_batch_points < 1:
            raise ValueError(f"max_batch_points must be >= 1, got {self.max_batch_points!r}")
        for name in ("max_queued_points", "max_buffered_points"):
            if getattr(self, name) < self.max_batch_points:
                raise ValueError(
                    f"{name}={getattr(self, name)} must be >= max_batch_points={self.max_batch_points}"
                )
        if self.max_queued_values < 1:
            raise ValueError(f"max_queued_values must be >= 1, got {self.max_queued_values!r}")
        for name in ("max_buffered_bytes", "max_held_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 bytes, got {getattr(self, name)!r}")
