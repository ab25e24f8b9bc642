"""What the tracker does to the process it runs in, in one place: which process owns a run
(fork), the global rank (launchers), SIGTERM/SIGINT (chained), and interpreter exit.

- *Ownership*: a run belongs to the process that opened it (``Owner`` records its pid). A child
  forked from it (a ``multiprocessing`` worker, a DataLoader worker, a helper) inherits the
  tracker object but never touches the run: it does not write, close, truncate, re-mark or unlock
  it, whether it ends by ``sys.exit``, at interpreter exit, by ``Pool.terminate()``'s SIGTERM or by
  a signal. A child that calls ``log()`` gets one warning naming the run and its owner, and the
  point is not logged (the child's points belong in a tracker of its own, or in the parent).
  ``os.register_at_fork`` drops, in the child, every hook the parent installed: the child's
  signal handlers are what they were before cliptrack, and no run is closed at its exit.
- *Rank* (``global_rank``): ``CLIPTRACK_RANK`` (a forced rank); torch.distributed's rank once a
  process group is initialised (torch is never imported here); then ``RANK`` (torchrun),
  ``SLURM_PROCID`` (srun), ``PMI_RANK`` (MPICH / Intel MPI), ``OMPI_COMM_WORLD_RANK`` (Open MPI),
  and ``LOCAL_RANK`` only when the world is one node (``LOCAL_WORLD_SIZE == WORLD_SIZE``);
  else 0. A value that is not a non-negative integer is an error naming the variable. A process
  whose rank is not 0 gets an inactive stand-in (``rank_zero_only``): every public method and
  property of the real class, found by introspection, replaced by one that does nothing.
- *Signals* (main thread only, and only with ``handle_signals=True``): the handler never closes
  the run nor takes a lock. With an application handler installed before the tracker (or
  ``SIG_IGN``), that handler alone decides: the run goes on (``log()`` keeps working) and is closed
  when the process really exits. SIGINT keeps Python's default (``KeyboardInterrupt``). A SIGTERM
  whose action was to end the process raises ``Terminated`` in the main thread instead: the stack
  unwinds, the run is closed KILLED at exit (within ``SIGNAL_CLOSE_S`` seconds), and the process
  then dies of SIGTERM as it would have without cliptrack. A close interrupted by a second Ctrl-C
  saves the status KILLED before the interrupt goes on.
- *Exit*: at interpreter exit every run still open in its owner process is closed: KILLED after a
  ``KeyboardInterrupt`` or a ``Terminated``, FAILED after another uncaught exception
  (``sys.last_value``, set by the interpreter before any ``sys.excepthook`` runs), FINISHED
  otherwise; once the process has received SIGTERM / SIGINT (whoever handled it), an unclean end
  is KILLED rather than FAILED. ``sys.exit(code)`` is only seen by a ``with Tracker(...)`` block, or process-wide when
  the application opts in with ``Tracker(..., patch_sys_exit=True)`` (``sys.exit`` is then
  wrapped to record the code: non-zero means FAILED).
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, Protocol, TypeVar

from cliptrack.store.records import FAILED, FINISHED, KILLED

LOG = logging.getLogger("cliptrack")

SIGNAL_CLOSE_S = 6.0
"""Seconds a run closed because of a signal gives its backends before the process goes on dying
(within the 10 s a scheduler's grace period usually allows, whatever the state of the backends)."""

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)

RANK_ENV = "CLIPTRACK_RANK"
"""Set to force this process's rank (0: this process logs the job's run)."""

LAUNCHER_RANKS = ("RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK")
"""Global-rank variables of torchrun, srun, MPICH / Intel MPI and Open MPI, in the order read."""


class Terminated(SystemExit):
    """Raised in the main thread by a SIGTERM whose action was to end the process: the stack
    unwinds (``finally`` blocks, context managers run), the run is closed KILLED at exit, then the
    process dies of SIGTERM. ``except Exception`` does not catch it (a ``SystemExit``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class Closable(Protocol):
    @property
    def run_id(self) -> str | None: ...

    def close(self, status: str | None = None, *, timeout_s: float | None = None) -> None: ...


class Owner:
    """The process a run belongs to: the one that opened it. ``is_current()`` is False in a
    forked child (a different pid), where the run must be left alone."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid = os.getpid()

    def is_current(self) -> bool:
        return os.getpid() == self.pid


# ---- ranks -------------------------------------------------------------------------------------
def _env_rank(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        rank = int(raw.strip())
    except ValueError:
        rank = -1
    if rank < 0:
        raise ValueError(
            f"{name}={raw!r} is not a global rank (an integer >= 0): unset {name} for a single "
            "process, or set it to this process's rank in the job"
        )
    return rank


def _one_node_local_rank() -> int | None:
    """``LOCAL_RANK`` when it is also the global rank: the world is one node."""
    local = _env_rank("LOCAL_RANK")
    if local is None:
        return None
    world, local_world = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if world is not None and world.strip() and world.strip() == (local_world or "").strip():
        return local
    return None


def global_rank() -> int:
    """This process's global rank in its job (see the module docstring for the order); ValueError
    naming a variable that is not a non-negative integer."""
    forced = _env_rank(RANK_ENV)
    if forced is not None:
        return forced
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    for name in LAUNCHER_RANKS:
        rank = _env_rank(name)
        if rank is not None:
            return rank
    local = _one_node_local_rank()
    return 0 if local is None else local


CONTEXT_METHODS = ("__enter__", "__exit__")
"""The dunder methods that belong to a class's public API: a stand-in still works in ``with``."""

_Class = TypeVar("_Class", bound=type)


def public_api(cls: type) -> dict[str, object]:
    """``cls``'s public methods and properties (names without a leading ``_``, plus
    ``CONTEXT_METHODS``), inherited ones included, as found on the class (functions, properties)."""
    return {
        name: inspect.getattr_static(cls, name)
        for name in dir(cls)
        if (not name.startswith("_") or name in CONTEXT_METHODS)
        and (callable(getattr(cls, name)) or isinstance(inspect.getattr_static(cls, name), property))
    }


def _returns_none(function: Callable[..., Any]) -> bool:
    """Whether ``function`` is annotated to return None (a string under postponed annotations)."""
    return inspect.signature(function).return_annotation in (None, "None")


def _stand_in(function: Callable[..., Any], answer: Callable[..., Any] | None) -> Callable[..., Any]:
    """A method that checks its arguments against ``function``'s signature (the TypeError a wrong
    call gets on every rank alike), does nothing else and returns ``answer(self, *args, **kwargs)``,
    or None without an answer."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def inactive(*args: Any, **kwargs: Any) -> Any:
        signature.bind(*args, **kwargs)
        return None if answer is None else answer(*args, **kwargs)

    return inactive


def rank_zero_only(real: type, answers: Mapping[str, Callable[..., Any]]) -> Callable[[_Class], _Class]:
    """A class decorator: the decorated subclass of ``real`` becomes ``real``'s stand-in on a rank
    other than 0. Every public method of ``real`` (``public_api``) is replaced by one that does
    nothing but check its arguments against ``real``'s signature and returns
    ``answers[name](self, *args, **kwargs)``, or None; every public property returns
    ``answers[name](self)``, or None. A method added to ``real`` is covered with no change here.

    TypeError, at import: an answer naming no public method or property of ``real``; a method or
    property not annotated to return None with no answer (a caller would get None where it
    expects a value); a public method the decorated class defines itself (its answer goes in
    ``answers``, the one place)."""

    def decorate(null: _Class) -> _Class:
        api = public_api(real)
        unknown = sorted(set(answers) - set(api))
        if unknown:
            raise TypeError(f"answers for {unknown}: not public methods or properties of {real.__name__}")
        own = sorted(set(api) & set(vars(null)))
        if own:
            raise TypeError(f"{null.__name__} defines {own} itself: give their answers to rank_zero_only")
        for name, member in api.items():
            answer = answers.get(name)
            kind: Callable[[Any], Any] | None = None  # how the stand-in is put on the class
            original: Any = member
            if isinstance(member, (property, staticmethod, classmethod)):
                kind = type(member)
                original = member.fget if isinstance(member, property) else member.__func__
            if answer is None and not _returns_none(original):
                raise TypeError(
                    f"{real.__name__}.{name} returns a value: give {null.__name__} an answer for it"
                )
            stand_in = _stand_in(original, answer)
            setattr(null, name, stand_in if kind is None else kind(stand_in))
        return null

    return decorate


# ---- the process's hooks -----------------------------------------------------------------------
class _Hooks:
    """The one set of process-wide hooks, shared by every open tracker of this process."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._open: list[Closable] = []
        self._signal_users: list[Closable] = []
        self._previous: dict[int, Any] = {}
        self._installed_exit = False
        self._patched_exit: Callable[..., Any] | None = None
        self.exit_code: object = None
        self.terminated: int | None = None
        """The signal that raised ``Terminated`` in this process, if any."""
        self.signalled: int | None = None
        """The last SIGTERM / SIGINT this process received (whoever handled it)."""
        self._last_value_at_start: object = None
        os.register_at_fork(after_in_child=self._after_fork_in_child)

    # ---- registration --------------------------------------------------------------------------
    def register(self, tracker: Closable, *, handle_signals: bool, patch_sys_exit: bool = False) -> None:
        with self._lock:
            if not self._installed_exit:
                self._last_value_at_start = getattr(sys, "last_value", None)
                atexit.register(self._at_exit)
                self._installed_exit = True
            if patch_sys_exit and self._patched_exit is None:
                self._patch_sys_exit()
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

    def _after_fork_in_child(self) -> None:
        """In a forked child: no run of the parent is this process's to close or to signal."""
        self._lock = threading.RLock()  # the parent's may have been held by another thread
        self._open = []
        self._signal_users = []
        try:
            self._restore_signals()
        except (ValueError, OSError):  # pragma: no cover - not the child's main thread
            pass

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
        """Takes no lock and closes nothing (the interrupted code may hold any lock): chains to
        the handler that was there before, or raises ``Terminated`` for a fatal SIGTERM."""
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.signalled = signum
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        elif signum == signal.SIGINT:  # SIG_DFL for SIGINT: Python's own behaviour
            signal.default_int_handler(signum, frame)
        else:
            self.terminated = signum
            raise Terminated(signum)

    # ---- exit ----------------------------------------------------------------------------------
    def _patch_sys_exit(self) -> None:
        original: Callable[..., Any] = sys.exit
        hooks = self

        def exit(status: object = None) -> None:  # stands in for sys.exit (opted in)
            hooks.exit_code = status
            original(status)

        exit.__wrapped__ = original  # type: ignore[attr-defined]
        exit.__doc__ = original.__doc__
        sys.exit = exit  # type: ignore[assignment]
        self._patched_exit = original

    def status_for(self, exc: BaseException | None) -> str:
        """The status of a run that ends with ``exc`` (None: a clean end): KILLED for a
        ``KeyboardInterrupt`` or ``Terminated``, FINISHED for a clean end or ``sys.exit(0)``; any
        other exception is FAILED, or KILLED once the process has received SIGTERM / SIGINT."""
        if isinstance(exc, (KeyboardInterrupt, Terminated)):
            return KILLED
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (None, 0)):
            return FINISHED
        return KILLED if self.signalled is not None else FAILED

    def exit_status(self) -> str:
        """The status a run still open at interpreter exit gets (see the module docstring)."""
        if self.terminated is not None:
            return KILLED
        last = getattr(sys, "last_value", None)
        if last is not self._last_value_at_start and isinstance(last, BaseException):
            return self.status_for(last)
        if self.exit_code not in (None, 0):
            return self.status_for(SystemExit(self.exit_code))
        return FINISHED

    def _at_exit(self) -> None:
        with self._lock:
            trackers = list(self._open)
        status = self.exit_status()
        for tracker in trackers:
            owner: Owner | None = getattr(tracker, "owner", None)
            if owner is not None and not owner.is_current():
                continue
            timeout = None
            if status == KILLED:
                timeout = min(SIGNAL_CLOSE_S, getattr(tracker, "close_timeout_s", SIGNAL_CLOSE_S))
            tracker.close(status, timeout_s=timeout)
        if self.terminated is not None:  # die of the signal, as the process would have without us
            signal.signal(self.terminated, signal.SIG_DFL)
            os.kill(os.getpid(), self.terminated)


HOOKS = _Hooks()
