"""Backend-neutral clip series: key names, exact counts, logging and comparison.

Importing this package never imports torch.
"""

import logging
from typing import TYPE_CHECKING

from cliptrack.core import keys, secrets
from cliptrack.core.sums import ClipCounts, TokenCounts

# every log line of cliptrack ("cliptrack" logger) is redacted, whichever handler prints it
secrets.install_filter(logging.getLogger("cliptrack"))

if TYPE_CHECKING:
    from cliptrack.log.tracker import Tracker

__all__ = ["ClipCounts", "TokenCounts", "Tracker", "keys"]


def __getattr__(name: str) -> object:
    if name == "Tracker":  # imported on first use: ``import cliptrack`` stays light
        from cliptrack.log.tracker import Tracker

        return Tracker
    raise AttributeError(f"module 'cliptrack' has no attribute {name!r}")
