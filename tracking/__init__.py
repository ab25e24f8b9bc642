"""Backend-neutral clip series: key names, exact counts, logging and comparison.

Importing this package never imports torch.
"""

import logging
from typing import TYPE_CHECKING

from tracking import keys, secrets
from tracking.counts import ClipCounts, TokenCounts

# every log line of cliptrack ("cliptrack" logger) is redacted, whichever handler prints it
secrets.install_filter(logging.getLogger("cliptrack"))

if TYPE_CHECKING:
    from tracking.tracker import Tracker

__all__ = ["ClipCounts", "TokenCounts", "Tracker", "keys"]


def __getattr__(name: str) -> object:
    if name == "Tracker":  # imported on first use: ``import tracking`` stays light
        from tracking.tracker import Tracker

        return Tracker
    raise AttributeError(f"module 'tracking' has no attribute {name!r}")
