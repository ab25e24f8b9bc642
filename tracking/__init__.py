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
    from cliptrack.backends.load import load_runs
    from cliptrack.log.tracker import Tracker

__all__ = ["ClipCounts", "TokenCounts", "Tracker", "keys", "load_runs"]


def __getattr__(name: str) -> object:
    if name == "Tracker":  # imported on first use: ``import cliptrack`` stays light
        from cliptrack.log.tracker import Tracker

        return Tracker
    if name == "load_runs":  # the comparison's reader imports numpy and pandas: on first use only
        from cliptrack.backends.load import load_runs

        return load_runs
    raise AttributeError(f"module 'cliptrack' has no attribute {name!r}")
