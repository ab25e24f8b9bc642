"""The logging pipeline: the tracker on the training thread, and what keeps its promises.

- ``tracker``: ``Tracker`` (log points to MLflow / W&B / JSONL without blocking or dropping) and the
  null tracker of every rank but 0;
- ``steps``: one step of a custom loop as the keys cliptrack compares (``timed_step``);
- ``process``: the process the tracker runs in (rank from every launcher, fork, signals, exit);
- ``limits``: the tracker's bounds, in seconds, points, values and bytes (``Limits``);
- ``replay``: ``cliptrack replay``, spooled points pushed to the sinks that did not take them;
- ``_pipeline``: the writer's internals (private: import ``Tracker``, not these).
"""

from cliptrack.log.tracker import Tracker

__all__ = ["Tracker"]
