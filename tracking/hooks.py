"""Process-wide hooks of the tracker, in one place: the global rank, SIGTERM/SIGINT, ``sys.exit``
and ``atexit``.

- *Rank*: torch.distributed's when torch is imported and a group is initialised (torch is never
  imported here), else the ``RANK`` environment variable, else 0. A ``RANK`` that is not a
  non-negative integer is an error, not a silent "other rank".
- *Signals* (main thread only; previous handlers chained): every open tracker is closed KILLED
  within ``SIGNAL_CLOSE_S`` seconds (what a backend has not taken by then is left for
  ``cliptrack replay``), then the previous handler runs, or the process dies of the signal as it
  would have without cliptrack.
- *Exit*: at interpreter exit every tracker still open is closed: FAILED after an uncaught
  exception (``sys.last_value``, set by the interpreter before any ``sys.excepthook`` runs, so an
  application's own excepthook does not hide it) or a non-zero ``sys.exit(code)``; FINISHED
  otherwise.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

from tracking.records import FAILED, FINISHED, KILLED

LOG = logging.getLogger("cliptrack")

SIGNAL_CLOSE_S = 6.0
"""Seconds a signal gives the open trackers to drain before the process goes on dying (within
the 10 s a scheduler's grace period usually allows, whatever the state of the backends)."""

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Closable(Protocol):
    @property
    def run_id(self) -> str | None: ...

    def close(self, status: str | None = None, *, timeout_s: float | None = None) -> None: ...


def global_rank() -> int:
    """The process's global rank (see the module docstring); ValueError naming a bad ``RANK``."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    raw = os.environ.get("RANK")
    if raw is None or not raw.strip():
        return 0
    try:
        rank = int(raw.strip())
    except ValueError:
        rank = -1
    if rank < 0:
        raise ValueError(
            f"RANK={raw!r} is not a global rank (an integer >= 0): unset RANK for a single process, "
            "or set it to this process's rank in the job"
        )
    return rank


class _Hooks:
    """The one set of process-wide hooks, shared by every open tracker."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._open: list[Closable] = []
        self._signal_users: list[Closable] = []
        self._previous: dict[int, Any] = {}
        self._installed_exit = False
        self.exit_code: object = None
        self._last_value_at_start: object = None

    # ---- registration --------------------------------------------------------------------------
    def register(self, tracker: Closable, *, handle_signals: bool) -> None:
        with self._lock:
            if not self._installed_exit:
                self._install_exit()
            self._open.append(tracker)
            if handle_signals and threading.current_thread() is threading.main_thread():
                if not self._signal_users:
                    self._install_signals()
                self._signal_users.append(tracker)

    def unregister(self, tracker: Closable) -> None:
        with self._lock:
            if tracker in self._open:
                self._open.remove(tracker)
            if tracker in self._signal_users:
                self._signal_users.remove(tracker)
                if not self._signal_users:
                    self._restore_signals()

    # ---- signals -------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        for signum in HANDLED_SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        with self._lock:
            trackers = list(self._open)
        for tracker in trackers:
            LOG.warning(
                "%s received: marking run %s KILLED and draining (at most %.0f s)",
                signal.Signals(signum).name,
                tracker.run_id,
                SIGNAL_CLOSE_S,
            )
            tracker.close(
                KILLED, timeout_s=min(SIGNAL_CLOSE_S, getattr(tracker, "close_timeout_s", SIGNAL_CLOSE_S))
            )
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # default action: die by the same signal, as the process would have without us
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # ---- exit ----------------------------------------------------------------------------------
    def _install_exit(self) -> None:
        self._last_value_at_start = getattr(sys, "last_value", None)
        original: Callable[..., Any] = sys.exit
        hooks = self

        def exit(status: object = None) -> None:  # stands in for sys.exit
            hooks.exit_code = status
            original(status)

        exit.__wrapped__ = original  # type: ignore[attr-defined]
        exit.__doc__ = original.__doc__
        sys.exit = exit  # type: ignore[assignment]
        atexit.register(self._at_exit)
        self._installed_exit = True

    def exit_status(self) -> str:
        """The status a run still open at interpreter exit gets (see the module docstring)."""
        if getattr(sys, "last_value", None) is not self._last_value_at_start:
            return FAILED
        if self.exit_code not in (None, 0):
            return FAILED
        return FINISHED

    def _at_exit(self) -> None:
        with self._lock:
            trackers = list(self._open)
        status = self.exit_status()
        for tracker in trackers:
            tracker.close(status)


HOOKS = _Hooks()
