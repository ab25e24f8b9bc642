"""``Tracker``: log the clip series (and any metric) to MLflow / W&B / JSONL without ever
blocking, dropping or killing training.

One tracker per run, opened once (context manager or ``close()``)::

    with Tracker("ppo-7b", backends=("mlflow", "wandb"), backend_label="megatron", config=cfg) as t:
        for step in range(steps):
            fbo = train_step(...)
            t.log_output(step, fbo, extra={keys.REWARD: reward})

Guarantees and choices (each point = one ``log`` call = step + wall time + metrics):

- The training thread only validates and enqueues (microseconds); a background writer appends
  to ``<spool_dir>/<run_id>/points.jsonl`` every ``flush_interval_s`` seconds (sooner once
  ``max_batch_points`` points wait) and feeds each remote sink from its own thread, in batches.
- A failing backend is isolated: one warning, retries with exponential backoff (1 s .. 30 s);
  what it has not acknowledged stays in points.jsonl and ``cliptrack replay`` pushes it later,
  without duplicates. A crash loses at most the last flush interval; SIGTERM/SIGINT and
  ``close()`` drain everything (remote sinks for up to ``close_timeout_s`` seconds, the rest is
  left for replay).
- Under torch.distributed only global rank 0 writes; other ranks get an inactive tracker whose
  methods return at once (``run_id`` is None there). The rank is torch.distributed's when it is
  imported and initialised, else the ``RANK`` environment variable, else 0.
- Run status: FINISHED on a clean exit, FAILED on an exception, KILLED on SIGTERM/SIGINT
  (MLflow RunStatus names; W&B exit code 0 / 1 / 143).

Validation at ``log`` time (errors are ValueError naming the step and key; nothing already
logged is affected):

- keys: ``str`` with exactly one colon (``name:reduction``), and acceptable to every chosen
  backend (MLflow's character rules and 250-character limit; W&B's reserved ``_`` prefix);
- values: real numbers (int, float, numpy scalars); ``bool``, strings, None, tensors refused.
  NaN and +/-inf are **logged as such** (a diverging loss must be visible): JSONL keeps them
  exactly, W&B too, MLflow stores NaN and clamps +/-inf to +/-1.797e308 (its sqlite schema);
- clip counts (``loss_tokens:sum``, ``clipped_tokens:sum``, low/high) must be whole, finite,
  non-negative token counts; ``clip_fraction:mean`` is recomputed from them whenever
  ``clipped_tokens:sum`` is present, and must lie in [0, 1] when given without counts;
- steps: non-negative ints. Decreasing or repeated steps are **allowed** and every point is
  kept (a resumed run re-logs steps): JSONL and MLflow store each point, W&B rows are keyed by
  the declared step metric ``trainer/step``, never by W&B's own monotonic step.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from tracking import keys
from tracking.counts import CLIP_VALUE_KEYS, exact_clip_metrics
from tracking.outputs import metrics_of
from tracking.sinks import FAILED, FINISHED, KILLED, Point, RunInfo, is_jsonl, jsonl_root, make_sink
from tracking.sinks.jsonl_sink import JsonlSink
from tracking.spool import RunDir
from tracking.validation import MAX_STEP as MAX_STEP  # re-exported: the tracker's bound
from tracking.validation import check_step, metric_value
from tracking.writer import LOG, BackgroundWriter, SinkLane


class TrackerClosed(ValueError):
    """``log`` on a tracker that was closed (explicitly, at exit or by a signal)."""


def global_rank() -> int:
    """Global rank: torch.distributed's when torch is imported and a group is initialised (torch
    is never imported here), else ``RANK`` from the environment, else 0."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    rank = os.environ.get("RANK")
    if rank is not None and rank.strip().lstrip("-").isdigit():
        return int(rank)
    return 0


def _ensure_log_handler() -> None:
    """Make the start/summary lines visible when the application has not configured logging."""
    if LOG.level == logging.NOTSET:
        LOG.setLevel(logging.INFO)
    if not LOG.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("cliptrack: %(message)s"))
        LOG.addHandler(handler)
        LOG.propagate = False


_UNHANDLED: list[BaseException] = []


def _record_unhandled(hook: Any) -> Any:
    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        _UNHANDLED.append(value)
        hook(kind, value, tb)

    excepthook._cliptrack = True  # type: ignore[attr-defined]
    return excepthook


class Tracker:
    """One run, logged to every backend in ``backends``; see the module docstring for guarantees.

    Args:
        run_name: display name (default ``<backend_label or "run">-<run id prefix>``).
        backends: names or URIs, see ``tracking.sinks`` ("mlflow", "wandb", "jsonl",
            "sqlite:///x.db", "http://127.0.0.1:5000", "wandb:project", "jsonl:/dir", or Sink
            objects). The JSONL run directory is always written: it is the spool.
        backend_label: the training stack ("megatron", "miles"), stored as ``keys.TAG_BACKEND``.
        config: run configuration (nested dicts allowed): MLflow params, W&B config, run.json.
        tracking_uri: MLflow tracking URI for the "mlflow" backend (default
            ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db`` in the working directory).
        experiment: MLflow experiment name.
        spool_dir: where run directories live (unless a "jsonl:/dir" backend names another).
        flush_interval_s: seconds between writes of queued points (the most a crash can lose).
        max_batch_points: points per batch; the writer also wakes when this many are queued.
        max_buffered_points: points a lagging sink may hold in memory before reading back from disk.
        wandb_project, wandb_mode, wandb_dir: W&B project, mode (default: online with
            credentials, else offline) and directory.
        open_timeout_s: how long the constructor waits for backends to open (they keep trying
            in the background after that).
        close_timeout_s: how long ``close`` (and a signal) waits for remote backends to drain.
        handle_signals: install SIGTERM/SIGINT handlers (main thread only; previous handlers
            are chained) that mark the run KILLED and drain before the process goes on dying.
        run_id: cliptrack run id to use (32 hex digits by default, fresh per run).
    """

    def __init__(
        self,
        run_name: str | None = None,
        backends: Iterable[Any] | str = ("mlflow",),
        *,
        backend_label: str | None = None,
        config: Mapping[str, Any] | None = None,
        tracking_uri: str | None = None,
        experiment: str = "cliptrack",
        spool_dir: str | os.PathLike[str] = ".cliptrack",
        flush_interval_s: float = 1.0,
        max_batch_points: int = 2000,
        max_buffered_points: int = 50_000,
        wandb_project: str | None = None,
        wandb_mode: str | None = None,
        wandb_dir: str | os.PathLike[str] | None = None,
        open_timeout_s: float = 15.0,
        close_timeout_s: float = 30.0,
        handle_signals: bool = True,
        run_id: str | None = None,
    ) -> None:
        self.rank = global_rank()
        self.active = self.rank == 0
        self.run_id: str | None = None
        self.run_name: str | None = None
        self.status: str | None = None
        self.points_logged = 0
        self._closed = False
        self._lanes: list[SinkLane] = []
        self._known_keys: set[str] = set()
        self.sinks: list[Any] = []
        if not self.active:
            return
        if isinstance(backends, str):
            backends = (backends,)
        backends = list(backends)
        if max_buffered_points < max_batch_points:
            raise ValueError(
                f"max_buffered_points={max_buffered_points} must be >= max_batch_points={max_batch_points}"
            )
        self.close_timeout_s = close_timeout_s
        root: str | os.PathLike[str] = spool_dir
        remote = []
        for spec in backends:
            if is_jsonl(spec):
                root = jsonl_root(spec) or spool_dir
            else:
                remote.append(
                    make_sink(
                        spec, tracking_uri=tracking_uri, experiment=experiment,
                        wandb_project=wandb_project, wandb_mode=wandb_mode, wandb_dir=wandb_dir,
                    )
                )
        names = [sink.name for sink in remote]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"backends {backends!r} name the sink(s) {duplicates} more than once")
        self.sinks = remote
        self.run_id = run_id or uuid.uuid4().hex
        self.run_name = run_name or f"{backend_label or 'run'}-{self.run_id[:8]}"
        self.run = RunInfo(
            run_id=self.run_id,
            run_name=self.run_name,
            backend_label=backend_label,
            config=dict(config or {}),
            started=time.time(),
            experiment=experiment,
        )
        _ensure_log_handler()
        self.journal = JsonlSink(Path(root))
        self.journal.open(self.run)
        assert self.journal.run_dir is not None
        self.run_dir: RunDir = self.journal.run_dir  # one instance: its lock serialises run.json updates
        self.run_dir.lock_sink("jsonl")  # tells `cliptrack replay` that this run is live
        self._lanes = [
            SinkLane(
                sink, self.run_dir, self.run,
                max_buffered_points=max_buffered_points, max_batch_points=max_batch_points,
            )
            for sink in remote
        ]
        self._writer = BackgroundWriter(
            self.journal, self._lanes, flush_interval_s=flush_interval_s, max_batch_points=max_batch_points
        )
        self._writer.start()
        deadline = time.monotonic() + open_timeout_s
        for lane in self._lanes:
            lane.opened.wait(max(0.0, deadline - time.monotonic()))
        LOG.info("%s", self._start_line())
        self._previous_handlers: dict[int, Any] = {}
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous_handlers[signum] = signal.getsignal(signum)
                signal.signal(signum, self._on_signal)
        if not getattr(sys.excepthook, "_cliptrack", False):
            sys.excepthook = _record_unhandled(sys.excepthook)
        atexit.register(self._at_exit)

    # ---- human lines ---------------------------------------------------------------------------
    def locations(self) -> dict[str, str]:
        """Where this run is logged, per sink, for humans (URI, run id, W&B mode, directory)."""
        if not self.active:
            return {}
        out = {"jsonl": f"jsonl {self.run_dir.path}"}
        for lane in self._lanes:
            where = lane.sink.location
            if lane.state in ("failing", "rejected", "opening"):
                where += f" [{lane.state}{': ' + lane.error if lane.error else ''}]"
            out[lane.name] = where
        return out

    def _start_line(self) -> str:
        label = f" backend={self.run.backend_label}" if self.run.backend_label else ""
        places = "; ".join(f"{where}" for where in self.locations().values() if where)
        return f"run {self.run_id} {self.run_name!r}{label} -> {places}"

    # ---- logging -------------------------------------------------------------------------------
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` (``name:reduction`` -> number) at the trainer's ``step``.

        Validates on the calling thread (ValueError naming step and key), stamps the wall time
        (unix seconds) and enqueues; never waits on a backend.
        """
        if not self.active:
            return
        if self._closed:
            raise TrackerClosed(
                f"tracker for run {self.run_id} is closed ({self.status}); step {step!r} was not logged"
            )
        step = self._check_step(step)
        values = self._check_metrics(step, metrics)
        self._writer.submit(Point(step, time.time(), values))
        self.points_logged += 1

    def log_output(self, step: int, output: object, extra: Mapping[str, Any] | None = None) -> None:
        """Log a ForwardBackwardOutput's metrics (its clip series: ``clip_fraction:mean`` recomputed
        from the summed counts; a loss that never clips logs no clip keys) plus ``extra``."""
        if not self.active:
            return
        try:
            metrics = dict(metrics_of(output))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"step {step!r}: {exc}") from None
        if extra:
            clash = sorted(set(extra) & set(metrics))
            if clash:
                raise ValueError(f"step {step!r}: extra metrics {clash} are already in the output's metrics")
            metrics.update(extra)
        self.log(step, metrics)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Add to the run's config: run.json, MLflow params (flattened), W&B config."""
        if not self.active:
            return
        if self._closed:
            raise TrackerClosed(f"tracker for run {self.run_id} is closed ({self.status})")
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a mapping, got {type(config).__name__}")
        config = dict(config)
        self.run.config.update(config)
        self.run_dir.update_meta(config=self.run.config)
        for lane in self._lanes:
            lane.offer_config(config)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Write every point logged so far to disk, then wait up to ``timeout_s`` seconds (default
        ``close_timeout_s``) for the healthy backends to take them. True when every backend has;
        False when one is failing (its points are safe on disk, retried in the background) or when
        the local disk itself refuses the points (they are held in memory and retried)."""
        if not self.active or self._closed:
            return True
        return self._writer.flush(self.close_timeout_s if timeout_s is None else timeout_s)

    # ---- closing -------------------------------------------------------------------------------
    def close(self, status: str | None = None, *, timeout_s: float | None = None) -> None:
        """End the run with ``status`` (FINISHED by default): drain to disk, give remote backends
        up to ``timeout_s`` seconds (default ``close_timeout_s``), mark the run, print a summary.
        Idempotent; anything a backend could not take stays spooled for ``cliptrack replay``."""
        if not self.active or self._closed:
            return
        self._closed = True
        self.status = status or FINISHED
        timeout = self.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        self._writer.stop()
        for lane in self._lanes:
            lane.stop(self.status, deadline)
        for lane in self._lanes:
            lane.join(max(0.0, deadline - time.monotonic()) + 1.0)
        self.journal.close(self.status)
        self.run_dir.unlock_sink("jsonl")
        self._restore_signals()
        atexit.unregister(self._at_exit)
        LOG.info("%s", self.summary())

    def summary(self) -> str:
        """One line: status, points and values written, and per backend what is still pending."""
        if not self.active:
            return f"rank {self.rank}: inactive (only global rank 0 logs)"
        parts = [
            f"run {self.run_id} {self.status or 'RUNNING'}: {self._writer.points_journaled} points "
            f"({self._writer.values_journaled} values) in {self.run_dir.path}"
        ]
        behind = False
        for lane in self._lanes:
            pending = lane.pending_points()
            if pending == 0 and lane.state in ("ok", "closed"):
                parts.append(f"{lane.name}: all written ({lane.sink.location})")
            else:
                behind = True
                parts.append(f"{lane.name}: {pending} points pending ({lane.state}: {lane.error or 'not drained'})")
        if behind:
            parts.append(f"push them with `cliptrack replay {self.run_dir.root}`")
        return "; ".join(parts)

    def pending(self) -> dict[str, int]:
        """Points each remote backend has not acknowledged yet."""
        return {lane.name: lane.pending_points() for lane in self._lanes}

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self.close(FINISHED)
        elif issubclass(kind, KeyboardInterrupt):
            self.close(KILLED)
        elif isinstance(value, SystemExit) and value.code in (None, 0):
            self.close(FINISHED)
        else:
            self.close(FAILED)

    def _at_exit(self) -> None:
        self.close(FAILED if _UNHANDLED else FINISHED)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous_handlers.get(signum)
        if not self._closed:
            LOG.warning("%s received: marking run %s KILLED and draining", signal.Signals(signum).name, self.run_id)
            self.close(KILLED)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # default action: die by the same signal, as the process would have without us
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous_handlers.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    # ---- validation (training thread; cheap: new keys are checked once) -------------------------
    @staticmethod
    def _check_step(step: Any) -> int:
        return check_step(step)

    def _check_metrics(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        if not isinstance(metrics, Mapping):
            raise ValueError(f"step {step}: metrics must be a mapping of 'name:reduction' -> number, "
                             f"got {type(metrics).__name__}")
        if not metrics:
            raise ValueError(f"step {step}: no metrics to log")
        out: dict[str, float] = {}
        known = self._known_keys
        for key, value in metrics.items():
            if key not in known:
                self._check_new_key(step, key)
            try:
                out[key] = value if type(value) is float else metric_value(key, value)
            except ValueError as exc:
                raise ValueError(f"step {step}: {exc}") from None
        if not CLIP_VALUE_KEYS.isdisjoint(out):
            try:
                out = exact_clip_metrics(out)
            except ValueError as exc:
                raise ValueError(f"step {step}: {exc}") from None
        return out

    def _check_new_key(self, step: int, key: Any) -> None:
        try:
            keys.split_key(key)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"step {step}: {exc}") from None
        for sink in self.sinks:
            try:
                sink.check_key(key)
            except ValueError as exc:
                raise ValueError(f"step {step}: {exc}") from None
        self._known_keys.add(key)
