"""Backend-neutral clip series: key names, exact counts, logging and comparison.

Importing this package never imports torch.
"""

import logging
from typing import TYPE_CHECKING

from cliptrack.core import keys, secrets
from cliptrack.core.sums import MeasuredSums

# every log line of cliptrack ("cliptrack" logger) is redacted, whichever handler prints it
secrets.install_filter(logging.getLogger("cliptrack"))

if TYPE_CHECKING:
    from cliptrack.backends.load import load_runs, load_worst
    from cliptrack.log.limits import Limits
    from cliptrack.log.tracker import Tracker
    from cliptrack.log.watch import Watch

__all__ = ["Limits", "MeasuredSums", "Tracker", "Watch", "keys", "load_runs", "load_worst"]


def __getattr__(name: str) -> object:
    if name == "Tracker":  # imported on first use: ``import cliptrack`` stays light
        from cliptrack.log.tracker import Tracker

        return Tracker
    if name == "Limits":  # the tracker's bounds (cliptrack.log.limits), with the tracker
        from cliptrack.log.limits import Limits

        return Limits
    if name == "Watch":  # the live watch's settings (cliptrack.log.watch), with the tracker
        from cliptrack.log.watch import Watch

        return Watch
    if name == "load_runs":  # the comparison's reader imports numpy and pandas: on first use only
        from cliptrack.backends.load import load_runs

        return load_runs
    if name == "load_worst":  # the runs' worst-sequence tables, read like load_runs (on first use)
        from cliptrack.backends.load import load_worst

        return load_worst
    raise AttributeError(f"module 'cliptrack' has no attribute {name!r}")
