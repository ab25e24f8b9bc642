"""Backend-neutral clip series: key names, exact counts, logging and comparison.

Importing this package never imports torch.
"""

from tracking import keys
from tracking.counts import ClipCounts

__all__ = ["ClipCounts", "keys"]
