"""``Tracker``: log the clip series (and any metric) to MLflow / W&B / JSONL without ever
blocking, dropping or killing training.

One tracker per run, opened once (context manager or ``close()``)::

    with Tracker("ppo-7b", sinks=("mlflow", "wandb"), backend_label="megatron", config=cfg) as t:
        for step in range(steps):
            fbo = train_step(...)
            t.log_output(step, fbo, reward=reward)

Guarantees and choices (each point = one ``log`` call = step + wall time + metrics):

- The training thread only validates and enqueues (microseconds); a background writer appends
  to ``<spool_dir>/<run_id>/points.jsonl`` every ``limits.flush_interval_s`` seconds (sooner once
  ``limits.max_batch_points`` points wait), one atomic fsynced batch at a time, and feeds each remote
  sink from its own thread, in batches (``cliptrack.log._pipeline.writer``).
- Backpressure: ``log`` waits only while the writer is behind by more than the bound (more than
  ``limits.max_queued_points`` points or ``limits.max_queued_values`` values queued, or the oldest queued point
  older than ``flush_interval_s`` + 0.25 s) and warns once; so a crash (SIGKILL, power loss) loses
  at most the points of the last ``flush_interval_s`` + 0.5 s, at any load. Memory for points is
  bounded in bytes (``cliptrack.log.limits``; 256 MB at the defaults with one remote sink).
- A full or read-only spool disk: remote sinks keep receiving every point from memory (held at
  its journal offset, up to ``limits.max_held_bytes``), the journal catches up when space returns, and
  ``close`` counts what reached neither the disk nor any backend (``cliptrack.log._pipeline.held``).
- A key or value one sink refuses is reported once and left out for that sink only
  (``cliptrack.log._pipeline.delivery``). Each point is one row per sink: points of one step never share a
  millisecond stamp (``cliptrack.store.stamps``).
- A failing backend is isolated: one warning within seconds (MLflow requests from cliptrack are
  bounded: 2 retries, 5 s each), retries with exponential backoff (1 s .. 30 s); what it has not
  acknowledged stays in points.jsonl and ``cliptrack replay`` pushes it later, without
  duplicates. ``close()`` returns within ``timeout_s``: everything reaches disk, remote sinks
  get what they take in that time, the rest is left for replay. A signal that ends the process
  closes the run KILLED at exit within ``process.SIGNAL_CLOSE_S`` seconds; the application's own
  SIGTERM/SIGINT handlers are chained, never replaced (``cliptrack.log.process``).
- Resuming: a ``run_id`` whose directory exists continues that run (new points are appended;
  each backend goes on from its acknowledged journal offset, or from what it holds).
- One run per job: only global rank 0 writes (torch.distributed, torchrun, srun, MPI: see
  ``cliptrack.log.process.global_rank``; ``rank=`` or ``CLIPTRACK_RANK`` force it); other ranks get a
  ``NullTracker``: every public method and property of ``Tracker`` returns at once, writing nothing
  (``run_id`` is None there).
- A run belongs to the process that opened it: a forked child never writes, closes or unlocks
  it, and warns once if it calls ``log()`` (``cliptrack.log.process``).
- Run status: FINISHED on a clean exit, FAILED on an exception or a non-zero ``sys.exit``,
  KILLED on SIGTERM/SIGINT (MLflow RunStatus names; W&B exit code 0 / 1 / 143).

Validation at ``log`` time (errors are ValueError naming the step and key; nothing already
logged is affected):

- keys: ``str`` with exactly one colon (``name:reduction``), at most
  ``cliptrack.core.validation.MAX_KEY_CHARS`` (65,536) characters, and acceptable to every chosen
  backend (MLflow's character rules and 250-character limit; W&B's reserved ``_`` prefix); a
  point whose journal line could exceed ``cliptrack.store.journal.MAX_LINE_BYTES`` (16 MiB) is refused,
  so that every line written is read back;
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

import contextlib
import gc
import inspect
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from cliptrack.backends import BACKENDS, is_jsonl, jsonl_root, make_sink
from cliptrack.backends.base import Alert, Sink
from cliptrack.core import keys
from cliptrack.core.secrets import redact, redacted_errors
from cliptrack.core.sums import CLIP_VALUE_KEYS, exact_clip_metrics
from cliptrack.core.text import printable
from cliptrack.core.validation import MAX_STEP as MAX_STEP  # re-exported: the tracker's bound
from cliptrack.core.validation import check_key_size, check_step, metric_value
from cliptrack.log._pipeline.held import HeldTail
from cliptrack.log._pipeline.lane import LaneState, SinkLane
from cliptrack.log._pipeline.writer import LOG, BackgroundWriter, WriterClosed
from cliptrack.log.limits import Limits
from cliptrack.log.process import HOOKS, SIGNAL_CLOSE_S, Owner, Terminated, global_rank, rank_zero_only
from cliptrack.log.steps import AbstractContextManager, OpenStep, step_metrics, timed_step
from cliptrack.log.watch import Detector, Watch, Watcher, watches
from cliptrack.log.worst import WorstLog
from cliptrack.store import journal
from cliptrack.store import worst as worst_store
from cliptrack.store.records import FINISHED, KILLED, RUNNING, RunInfo, check_run_id
from cliptrack.store.spool import Ack, Journal, RunDir
from cliptrack.store.stamps import StepClock

DISK_DRAIN_S = 3.0
"""Seconds ``close`` gives the writer to put the last points on the local disk, even when its own
timeout is shorter (a healthy disk takes milliseconds; a refusing one gets one more try)."""
WATCH_CLOSE_SHARE = 0.25
"""The live watch's share of a close's timeout, at most ``DISK_DRAIN_S``: its queued points and their
last alerts within it, counted in the close's one deadline (1.5 s of the 6 s of a signal's close,
3 s of a plain one); an ``on_breach`` callback still running then (stuck) is left behind."""

__all__ = ["MAX_STEP", "NullTracker", "Tracker", "TrackerClosed", "global_rank"]


class TrackerClosed(ValueError):
    """``log`` on a tracker that was closed (explicitly, at exit or by a signal)."""


def _ensure_log_handler() -> None:
    """Make the start/summary lines visible when the application has not configured logging."""
    if LOG.level == logging.NOTSET:
        LOG.setLevel(logging.INFO)
    if not LOG.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("cliptrack: %(message)s"))
        LOG.addHandler(handler)
        LOG.propagate = False


class Tracker:
    """One run, logged to every sink in ``sinks``; see the module docstring for guarantees.

    On a global rank other than 0, ``Tracker(...)`` is a ``NullTracker`` (every method a no-op).

    Args:
        run_name: display name (default ``<backend_label or "run">-<run id prefix>``).
        sinks: where the run goes: names or URIs, see ``cliptrack.backends`` ("mlflow", "wandb",
            "jsonl", "sqlite:///x.db", "http://127.0.0.1:5000", "wandb:project", "jsonl:/dir", the
            name of any registered backend with a sink), or ready ``Sink`` objects with their vendor
            options (``[MlflowSink(tracking_uri=...), WandbSink(project=...)]``). The JSONL run
            directory is always written: it is the spool. Default ``("mlflow",)``.
        sink_options: per sink name, the vendor options of a sink named in ``sinks``: its
            constructor's arguments, e.g. ``{"mlflow": {"tracking_uri": ...}, "wandb": {"project":
            ..., "mode": ..., "dir": ..., "entity": ...}, "csv": {"dir": ...}}``. MLflow's default
            store is ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db`` in the working directory;
            W&B's mode is online with credentials, else offline, its directory ``WANDB_DIR``, else
            the working directory (recorded for replay).
        backend_label: the training stack ("megatron", "miles"), stored as ``keys.TAG_BACKEND``.
        config: run configuration (nested dicts allowed): MLflow params, W&B config, run.json.
        experiment: the run's experiment (run.json; MLflow's experiment unless
            ``sink_options["mlflow"]["experiment"]`` names another).
        spool_dir: where run directories live (unless a "jsonl:/dir" sink names another).
        limits: the tracker's bounds in seconds, points, values and bytes (``cliptrack.Limits``:
            ``flush_interval_s``, the most a crash can lose; the queue, buffer and held-tail sizes;
            see ``cliptrack.log.limits``). Default ``Limits()``.
        open_timeout_s: how long the constructor waits for backends to open (they keep trying
            in the background after that).
        close_timeout_s: how long ``close`` waits for remote backends to drain.
        handle_signals: on SIGTERM/SIGINT (main thread only), chain to the application's handler,
            or end the process and close the run KILLED at exit (``cliptrack.log.process``); False
            leaves the signal handlers alone.
        run_id: cliptrack run id (default: 32 fresh hex digits); letters, digits, ``_``, ``-``.
            An existing run's id resumes it.
        freeze_gc: opt in to ``gc.freeze()`` once the backends are imported: every object alive
            then (modules, clients, usually the model) is left out of later garbage collections,
            so a full collection no longer walks them during ``log`` (a 150 ms pause with MLflow
            imported). Process-wide: cyclic garbage among those objects is then never freed.
            Default False (the collector's default behaviour).
        patch_sys_exit: opt in to wrapping ``sys.exit`` process-wide, so that a run left open (no
            ``with`` block, no ``close()``) learns a non-zero exit code and is marked FAILED.
        rank: force this process's global rank (0 logs the job's run); default: detected, see
            ``cliptrack.log.process.global_rank``.
        watch: series to follow live against a band (``cliptrack.log.watch``): a ``Watch``
            (``Watch("kl_k3:mean", reference=..., on_breach=...)``), its string form
            (``"kl_k3:mean,window=100;abs_log_ratio:mean"``) or a list of either; default
            ``CLIPTRACK_WATCH``, else none. A breach is a stderr line, each sink's own alert (W&B
            ``run.alert``, an MLflow tag and metric), a line of the run's ``watch.jsonl`` and the
            watch's callback; ``log`` never waits on it (``breaches`` lists them). Reference runs are
            read here, before the run is opened: one that cannot be read is a ValueError naming
            the watch, and no run is left behind (a server's within ``watch.REFERENCE_TIMEOUT_S``).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Tracker:
        if cls is Tracker:
            rank = _rank(kwargs.get("rank"))
            if rank != 0:
                return object.__new__(NullTracker)
        return object.__new__(cls)

    @redacted_errors()  # no credential of a store or reference in an error it raises
    def __init__(
        self,
        run_name: str | None = None,
        sinks: Iterable[Any] | str | None = None,
        *,
        sink_options: Mapping[str, Mapping[str, Any]] | None = None,
        backend_label: str | None = None,
        config: Mapping[str, Any] | None = None,
        experiment: str = "cliptrack",
        spool_dir: str | os.PathLike[str] = ".cliptrack",
        limits: Limits | None = None,
        open_timeout_s: float = 5.0,
        close_timeout_s: float = 30.0,
        handle_signals: bool = True,
        run_id: str | None = None,
        freeze_gc: bool = False,
        patch_sys_exit: bool = False,
        rank: int | None = None,
        watch: Watch | str | Iterable[Watch | str] | None = None,
    ) -> None:
        self.owner = Owner()
        self._foreign_warned: int | None = None
        self.rank = 0
        self.active = True
        self.status: str | None = None
        self.points_logged = 0
        self._closed = False
        self.close_timeout_s = close_timeout_s
        limits = _limits(limits)
        chosen_sinks = ("mlflow",) if sinks is None else sinks
        root, self.sinks = _sinks(chosen_sinks, spool_dir, _sink_options(sink_options), experiment=experiment)
        self.run_id: str = check_run_id(run_id) if run_id is not None else uuid.uuid4().hex
        self.run_dir = RunDir(root, self.run_id)
        self._known_keys: dict[str, int] = {}
        """Keys checked so far -> their bytes in a journal line (``journal.encoded_key_bytes``)."""
        self._longest_key = 64
        """Bytes of the longest key checked so far (at least 64: keys ``exact_clip_metrics`` adds)."""
        self._clock = StepClock()
        chosen = watches(watch)  # bad watch settings or reference runs fail before the run is opened
        detector = Detector(chosen, self.run_id) if chosen else None  # reads the reference runs
        self._open(run_name, backend_label, config, experiment, limits, freeze_gc)
        self._watcher: Watcher | None = None
        self._worst_log: WorstLog | None = None
        if chosen:
            try:
                self._watcher = Watcher(chosen, self.run_dir, self._alert, detector)
            except BaseException:
                self.run_dir.unlock_sink("jsonl")
                raise
        if (
            freeze_gc
        ):  # the heap built so far (modules, backends' clients, the model) is left out of collections
            gc.freeze()
        self._writer.start()
        deadline = time.monotonic() + open_timeout_s
        for lane in self._lanes:
            lane.opened.wait(max(0.0, deadline - time.monotonic()))
        LOG.info("%s", self._start_line())
        HOOKS.register(self, handle_signals=handle_signals, patch_sys_exit=patch_sys_exit)

    def _open(
        self,
        run_name: str | None,
        backend_label: str | None,
        config: Mapping[str, Any] | None,
        experiment: str,
        limits: Limits,
        freeze_gc: bool,
    ) -> None:
        """Take the run's lock, open (or resume) the run and its journal, build a lane per sink
        and the writer; the lock is released again if any of it fails."""
        if not self.run_dir.lock_sink("jsonl"):  # also tells `cliptrack replay` that this run is live
            raise ValueError(
                f"run {self.run_id} in {printable(self.run_dir.root)} is being logged by another process"
            )
        try:
            self.run, states = self._open_run(run_name, backend_label, config, experiment)
            self.run_name: str = self.run.run_name
            _ensure_log_handler()
            self.journal = Journal(self.run_dir)
            self.journal.open()
            self.run_dir.check_journal()  # reported; each sink's acknowledgement is checked too
            held = HeldTail(self.journal, limits.max_held_bytes)
            self._lanes = [
                self._lane(sink, states.get(sink.name), held, limits, freeze_gc) for sink in self.sinks
            ]
            self._writer = BackgroundWriter(
                self.journal,
                self._lanes,
                flush_interval_s=limits.flush_interval_s,
                max_batch_points=limits.max_batch_points,
                max_queued_points=limits.max_queued_points,
                max_queued_values=limits.max_queued_values,
                held=held,
            )
        except BaseException:
            self.run_dir.unlock_sink("jsonl")
            raise

    def _lane(
        self, sink: Sink, state: dict[str, Any] | None, held: HeldTail, limits: Limits, freeze_gc: bool
    ) -> SinkLane:
        return SinkLane(
            sink,
            self.run_dir,
            self.run,
            max_buffered_points=limits.max_buffered_points,
            max_buffered_bytes=limits.max_buffered_bytes,
            max_batch_points=limits.max_batch_points,
            state=state,
            journal_end=Ack(self.journal.points, self.journal.offset),
            freeze_gc=freeze_gc,
            read_lines=held.read,
            durable=held.durable,
        )

    def _open_run(
        self,
        run_name: str | None,
        backend_label: str | None,
        config: Mapping[str, Any] | None,
        experiment: str,
    ) -> tuple[RunInfo, dict[str, dict[str, Any]]]:
        """The run to log: a new one, or the one run.json records for this id (resumed: its start
        time and config kept, the new config merged in); with the sinks' recorded replay states."""
        if config is not None and not isinstance(config, Mapping):
            raise ValueError(f"config must be a mapping, got {type(config).__name__}")
        meta = self.run_dir.read_meta()
        states: dict[str, dict[str, Any]] = {}
        if meta:
            run = RunInfo.from_meta(meta, self.run_id)
            run.config.update(dict(config or {}))
            run.run_name = run_name or run.run_name
            run.backend_label = backend_label if backend_label is not None else run.backend_label
            run.status, run.ended = RUNNING, None
            states = {
                name: {k: v for k, v in state.items() if k not in ("closed", "status", "refused", "previous")}
                for name, state in self.run_dir.sink_states().items()
            }
        else:
            run = RunInfo(
                run_id=self.run_id,
                run_name=run_name or f"{backend_label or 'run'}-{self.run_id[:8]}",
                backend_label=backend_label,
                config=dict(config or {}),
                started=time.time(),
                experiment=experiment,
            )
        fields = run.to_meta()
        if not meta:
            fields.pop("ended", None)
        self.run_dir.update_meta(**fields)
        return run, states

    # ---- human lines ---------------------------------------------------------------------------
    def locations(self) -> dict[str, str]:
        """Where this run is logged, per sink, for humans (URI, run id, W&B mode, directory), with
        no credential (``cliptrack.core.secrets``)."""
        out = {"jsonl": printable(f"jsonl {self.run_dir.path}")}
        for lane in self._lanes:
            where = lane.sink.location
            if lane.state in (LaneState.FAILING, LaneState.REJECTED, LaneState.OPENING):
                where += f" [{lane.state}{': ' + lane.error if lane.error else ''}]"
            out[lane.name] = printable(redact(where))
        return out

    def _start_line(self) -> str:
        label = f" backend={printable(self.run.backend_label)}" if self.run.backend_label else ""
        places = "; ".join(f"{where}" for where in self.locations().values() if where)
        return f"run {self.run_id} {printable(repr(self.run_name))}{label} -> {places}"

    # ---- logging -------------------------------------------------------------------------------
    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record ``metrics`` (``name:reduction`` -> number) at the trainer's ``step``.

        Validates on the calling thread (ValueError naming step and key), stamps the wall time
        (unix seconds) and enqueues; never waits on a backend (only, under overload, on the local
        writer: see the module docstring). A point ``log`` accepted is never lost by ``close``.
        """
        if self._closed:
            raise self._closed_error(step)
        if not self.owner.is_current():
            self._warn_foreign("log")
            return
        step = self._check_step(step)
        values = self._check_metrics(step, metrics)
        try:
            # a plain tuple (see records.RawPoint); the stamp keeps equal points distinct rows
            self._writer.submit(step, values, self._clock.stamp)
        except WriterClosed:
            raise self._closed_error(step) from None
        self.points_logged += 1
        if self._watcher is not None:
            self._watcher.offer(step, values)

    def log_worst(self, step: int, worst: Any) -> None:
        """Record ``worst``, a step's worst sequences (``cliptrack.core.worst.Worst`` of ``step``):
        a line of the run directory's ``worst.jsonl``, a W&B table (``worst_sequences`` at the step),
        an MLflow artifact (``worst_sequences/step_000012.json``); ``cliptrack.store.worst``.

        Checks on the calling thread (TypeError for anything but a ``Worst``, ValueError naming the
        step for a step mismatch or a bad value; nothing logged before is affected), then hands the
        table to a thread of its own (``cliptrack.log.worst``): never waits on the disk or a sink."""
        if self._closed:
            raise self._closed_error(step)
        if not self.owner.is_current():
            self._warn_foreign("log_worst")
            return
        step = self._check_step(step)
        table = worst_store.checked(step, worst)
        if self._worst_log is None:
            self._worst_log = WorstLog(self.run_dir, self._deliver_worst)
        self._worst_log.offer(table)

    def _deliver_worst(self, worst: Any) -> None:
        """A step's worst sequences to every remote sink (logged on its lane thread)."""
        for lane in self._lanes:
            lane.offer_worst(worst)

    def _alert(self, alert: Alert) -> None:
        """A watch's alert to every remote sink (raised on its lane thread)."""
        for lane in self._lanes:
            lane.offer_alert(alert)

    @property
    def breaches(self) -> list[Alert]:
        """The live watch's alerts so far (``cliptrack.backends.base.Alert``), oldest first."""
        return list(self._watcher.alerts) if self._watcher is not None else []

    def _warn_foreign(self, what: str) -> None:
        """Once per forked child: its ``log()`` calls are not logged (the run is the parent's)."""
        pid = os.getpid()
        if self._foreign_warned == pid:
            return
        self._foreign_warned = pid
        LOG.warning(
            "%s() in process %d, forked from process %d that owns run %s: not logged (a forked child "
            "never writes its parent's run; log from the parent, or open a tracker in the child)",
            what,
            pid,
            self.owner.pid,
            self.run_id,
        )

    def _closed_error(self, step: object) -> TrackerClosed:
        return TrackerClosed(
            f"tracker for run {self.run_id} is closed ({self.status}); step {step!r} was not logged"
        )

    def log_output(
        self,
        step: int,
        *outputs: object,
        reward: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """Log step ``step`` of the loss: ``outputs`` are ``ForwardBackwardOutput``s (or what
        ``cliptrack.adapters.losses.loss_metrics`` returns, or their dicts), their measured sums
        added exactly (token counts are integers; ``clip_fraction:mean`` is formed once, from the
        sums; a loss that never clips logs no clip keys); ``reward`` is the step's mean reward
        (``keys.REWARD``), ``extra`` any other ``name:reduction`` metrics. Inside
        ``with tracker.step(step):`` the point is logged when the block ends, with the step time
        (seconds) and the throughput (loss tokens per second); outside it, now."""
        if not outputs:
            raise ValueError(f"step {step!r}: log_output needs at least one output")
        open_step: OpenStep | None = getattr(self, "_open_step", None)
        if open_step is not None and open_step.step == step:
            open_step.add(outputs, reward, extra)
            return
        try:
            metrics = step_metrics(*outputs, reward=reward, extra=extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"step {step!r}: {exc}") from None
        self.log(step, metrics)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Add to the run's config: run.json, MLflow params (flattened), W&B config."""
        if self._closed:
            raise TrackerClosed(f"tracker for run {self.run_id} is closed ({self.status})")
        if not self.owner.is_current():
            self._warn_foreign("log_config")
            return
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a mapping, got {type(config).__name__}")
        config = dict(config)
        self.run.config.update(config)
        try:
            self.run_dir.update_meta(config=self.run.config)
        except OSError as exc:
            LOG.warning("cannot save the config to %s: %s", printable(self.run_dir.meta_path), printable(exc))
        for lane in self._lanes:
            lane.offer_config(config)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Write every point logged so far to disk, then wait up to ``timeout_s`` seconds (default
        ``close_timeout_s``) for the healthy backends to take them. True when every backend has;
        False when one is failing (its points are safe on disk, retried in the background) or when
        the local disk itself refuses the points (they are held in memory and retried)."""
        if self._closed:
            return True
        if not self.owner.is_current():
            return False
        return self._writer.flush(self.close_timeout_s if timeout_s is None else timeout_s)

    # ---- closing -------------------------------------------------------------------------------
    def close(self, status: str | None = None, *, timeout_s: float | None = None) -> None:
        """End the run with ``status`` (FINISHED by default): drain to disk, give remote backends
        until ``timeout_s`` seconds (default ``close_timeout_s``) have passed, mark the run, print a
        summary. Idempotent; never raises for a backend or disk failure (warned); anything a
        backend could not take stays spooled for ``cliptrack replay``. In a forked child it does
        nothing (the run is the parent's). Interrupted (a second Ctrl-C, a SIGTERM), it saves the
        status KILLED before the interrupt goes on. Called from a watch's ``on_breach`` callback
        it raises RuntimeError and closes nothing (the callback's error is reported on stderr; the
        training thread's ``close`` ends the run). The live watch takes at most
        ``WATCH_CLOSE_SHARE`` of ``timeout_s``, within it."""
        if self._closed or not self.owner.is_current():
            return
        if self._watcher is not None and self._watcher.on_watch_thread():
            raise RuntimeError(
                f"close() of run {self.run_id} from a watch's on_breach callback is refused: the "
                "callback runs on the watch's thread, which the close waits for; set a flag in the "
                "callback and let the training loop stop and close the run"
            )
        self._closed = True
        self.status = status or FINISHED
        timeout = self.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout  # one deadline for the watch, the writer and the lanes
        try:
            if self._watcher is not None:  # its last alerts reach the lanes before they stop
                self._watcher.stop(min(DISK_DRAIN_S, WATCH_CLOSE_SHARE * timeout))
            if self._worst_log is not None:  # its last tables too
                self._worst_log.stop(max(DISK_DRAIN_S, deadline - time.monotonic()))
            writing = self._drain(deadline, timeout)
            if not writing:
                self.journal.close()
            self._mark(self.status)
        except (KeyboardInterrupt, Terminated):
            self.status = KILLED
            self._mark(KILLED)
            raise
        finally:
            self.run_dir.unlock_sink("jsonl")
            HOOKS.unregister(self)
        LOG.info("%s", self.summary())

    def _drain(self, deadline: float, timeout: float) -> bool:
        """Drain the writer to disk (at least ``DISK_DRAIN_S`` seconds) and the lanes until
        ``deadline``; True when the journal is still being written."""
        writing = self._writer.stop(max(DISK_DRAIN_S, deadline - time.monotonic()))
        if writing:
            LOG.warning(
                "%s is still being written after %.0f s (a stalled disk?)",
                printable(self.journal.location),
                max(DISK_DRAIN_S, timeout),
            )
        elif self._writer.held or self._writer.not_journaled:
            LOG.warning(
                "%d points could not be written to %s (%s); they go to the remote backends from memory",
                self._writer.held.points + self._writer.not_journaled,
                printable(self.journal.location),
                printable(self._writer.journal_error),
            )
        for lane in self._lanes:
            lane.stop(self.status or FINISHED, deadline)
        for lane in self._lanes:
            lane.join(max(0.0, deadline - time.monotonic()))
        return writing

    def _mark(self, status: str) -> None:
        """Save the run's final ``status`` in run.json (warned, never raised, when the disk refuses)."""
        try:
            self.run.status, self.run.ended = status, time.time()
            end = self.journal.position()
            recorded = {"points": end.points, "offset": end.offset, "fingerprint": end.fingerprint}
            self.run_dir.update_meta(status=self.run.status, ended=self.run.ended, journal=recorded)
        except OSError as exc:
            LOG.warning(
                "cannot mark run %s %s in %s: %s; `cliptrack replay` will mark it FAILED",
                self.run_id,
                status,
                printable(self.run_dir.meta_path),
                printable(exc),
            )

    def summary(self) -> str:
        """One line: status, points and values written, what the local disk could not take and what
        reached no backend either, and per backend what is still pending or was refused."""
        writer = self._writer
        parts = [
            f"run {self.run_id} {self.status or RUNNING}: {writer.points_journaled} points "
            f"({writer.values_journaled} values) in {printable(self.run_dir.path)}"
        ]
        off_disk = writer.held.points + writer.not_journaled + writer.unwritten
        if off_disk:
            parts.append(
                f"{off_disk} points NOT in the journal (the disk refused them: "
                f"{printable(writer.journal_error or 'stalled')}), {writer.lost_points()} of them "
                "written nowhere (lost)"
            )
        if self._worst_log is not None and self._worst_log.unwritten:
            parts.append(
                f"{self._worst_log.unwritten} worst-sequence tables NOT in worst.jsonl (the disk refused them)"
            )
        behind = False
        for lane in self._lanes:
            parts.append(self._lane_summary(lane))
            behind = (
                behind
                or lane.pending_points() > 0
                or lane.params_due
                or lane.state not in (LaneState.OK, LaneState.CLOSED)
            )
        if behind:
            parts.append(f"push them with `cliptrack replay {printable(self.run_dir.root)}`")
        return redact("; ".join(parts))  # a sink's error may echo its URI or a server's SQL

    @staticmethod
    def _lane_summary(lane: SinkLane) -> str:
        """One sink's part of the summary: "all written" only when every point, param and tag is
        in the sink (refused keys and params are named after it)."""
        pending = lane.pending_points()
        refused = lane.refusals.summary()
        lost = f", {lane.lost_points} points in no journal missed" if lane.lost_points else ""
        params = lane.params_summary()
        tail = (f", {refused}" if refused else "") + lost + (f", {params}" if params else "")
        if lane.worst_pending:
            tail += f", {lane.worst_pending} worst-sequence tables not taken (they are in worst.jsonl)"
        healthy = lane.state in (LaneState.OK, LaneState.CLOSED)
        if pending == 0 and healthy and not lane.lost_points:
            if not params:
                return f"{lane.name}: all written ({printable(lane.sink.location)}){tail}"
            return f"{lane.name}: every point written ({printable(lane.sink.location)}){tail}"
        return f"{lane.name}: {pending} points pending ({lane.state}: {lane.error or 'not drained'}){tail}"

    def pending(self) -> dict[str, int]:
        """Points each remote backend has not acknowledged yet."""
        return {lane.name: lane.pending_points() for lane in self._lanes}

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        status = HOOKS.status_for(value)
        self.close(status, timeout_s=min(SIGNAL_CLOSE_S, self.close_timeout_s) if status == KILLED else None)

    # ---- validation (training thread; cheap: new keys are checked once) -------------------------
    @staticmethod
    def _check_step(step: Any) -> int:
        return check_step(step)

    def _check_metrics(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
        if not isinstance(metrics, Mapping):
            raise ValueError(
                f"step {step}: metrics must be a mapping of 'name:reduction' -> number, "
                f"got {type(metrics).__name__}"
            )
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
        if journal.line_bytes_bound(len(out), len(out) * self._longest_key) > journal.MAX_LINE_BYTES:
            self._check_line(step, out)  # O(1) above; the exact sum only for a point this large
        return out

    def _check_line(self, step: int, values: Mapping[str, float]) -> None:
        """ValueError when the journal line of ``values`` could exceed ``journal.MAX_LINE_BYTES``
        (what a reader takes back)."""
        known = self._known_keys
        key_bytes = sum(known.get(k) or journal.encoded_key_bytes(k) for k in values)
        size = journal.line_bytes_bound(len(values), key_bytes)
        if size > journal.MAX_LINE_BYTES:
            raise ValueError(
                f"step {step}: a point of {len(values)} values takes up to {size} bytes in the journal; "
                f"a journal line holds at most {journal.MAX_LINE_BYTES} (log fewer values per call)"
            )

    def _check_new_key(self, step: int, key: Any) -> None:
        try:
            keys.split_key(key)
            check_key_size(key)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"step {step}: {exc}") from None
        for sink in self.sinks:
            try:
                sink.check_key(key)
            except ValueError as exc:
                raise ValueError(f"step {step}: {exc}") from None
        size = journal.encoded_key_bytes(key)
        self._known_keys[key] = size
        self._longest_key = max(self._longest_key, size)

    # ---- a timed step (cliptrack.log.steps) ----------------------------------------------------
    def step(self, step: int) -> AbstractContextManager[OpenStep]:
        """Time the block as trainer step ``step``: on a normal exit, log what ``log_output`` gave
        inside it plus ``keys.STEP_TIME`` (seconds) and ``keys.THROUGHPUT`` (loss tokens/s)."""
        return timed_step(self, self._check_step(step))


_TRACKER_INIT = inspect.signature(Tracker.__init__)
"""What ``NullTracker(...)`` checks its arguments against: a wrong call fails on every rank alike."""


def _inactive_summary(tracker: NullTracker, *args: Any, **kwargs: Any) -> str:
    return f"rank {tracker.rank}: inactive (only global rank 0 logs)"


def _inactive_step(tracker: NullTracker, step: int) -> AbstractContextManager[OpenStep]:
    return contextlib.nullcontext(OpenStep(step))


NULL_ANSWERS: dict[str, Callable[..., Any]] = {
    "__enter__": lambda tracker: tracker,
    "flush": lambda tracker, *args, **kwargs: True,  # nothing is waiting on this rank
    "locations": lambda tracker: {},
    "pending": lambda tracker: {},
    "breaches": lambda tracker: [],
    "summary": _inactive_summary,
    "step": _inactive_step,
}
"""What ``NullTracker``'s stand-ins return where ``Tracker``'s methods return a value (the others
return None): ``rank_zero_only`` refuses a value-returning public method without an answer here."""


@rank_zero_only(Tracker, NULL_ANSWERS)
class NullTracker(Tracker):
    """The tracker of a process whose global rank is not 0: it accepts every call and does nothing
    (``run_id`` is None, ``active`` False). One run per job is written by rank 0. Every public
    method and property of ``Tracker`` is a stand-in (``cliptrack.log.process.rank_zero_only``): it
    checks its arguments against ``Tracker``'s signature, validates no value, writes nothing and
    returns ``NULL_ANSWERS[name]``'s answer or None (``with`` and ``step()`` blocks still work)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _TRACKER_INIT.bind(self, *args, **kwargs)
        self.rank = _rank(kwargs.get("rank"))
        self.active = False
        self.run_id = None  # type: ignore[assignment]
        self.run_name = None  # type: ignore[assignment]
        self.status = None
        self.points_logged = 0
        self.sinks = []
        self.close_timeout_s = 0.0


def _rank(forced: object) -> int:
    """The rank a ``rank=`` argument forces (a non-negative int), else the detected global rank."""
    if forced is None:
        return global_rank()
    if isinstance(forced, bool) or not isinstance(forced, int) or forced < 0:
        raise ValueError(f"rank={forced!r} is not a global rank (an integer >= 0)")
    return forced


def _limits(given: object) -> Limits:
    """``limits`` checked: a ``Limits`` (``Limits()`` when None)."""
    if given is None:
        return Limits()
    if not isinstance(given, Limits):
        raise ValueError(
            f"limits={given!r} must be a cliptrack.Limits, e.g. limits=Limits(flush_interval_s=0.5)"
        )
    return given


def _sink_options(given: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """``sink_options`` checked: a mapping of the names of backends with a sink to mappings."""
    if given is not None and not isinstance(given, Mapping):
        raise ValueError(f"sink_options={given!r} must map sink names to their options")
    names = sorted(name for name, found in BACKENDS.items() if found.sink is not None)
    options: dict[str, dict[str, Any]] = {}
    for name, own in (given or {}).items():
        if name not in names:
            raise ValueError(f"sink_options names {name!r}, which is no registered sink: {names}")
        if not isinstance(own, Mapping):
            raise ValueError(f"sink_options[{name!r}]={own!r} must be a mapping of option names to values")
        options[name] = dict(own)
    return options


def _sinks(
    sinks: Iterable[Any] | str,
    spool_dir: str | os.PathLike[str],
    options: Mapping[str, Mapping[str, Any]],
    **common: Any,
) -> tuple[Path, list[Sink]]:
    """The spool root and the remote sinks a ``sinks`` argument names (duplicates refused):
    ``options`` per sink name, ``common`` offered to every sink (``cliptrack.backends.make_sink``)."""
    if isinstance(sinks, str):
        sinks = (sinks,)
    sinks = list(sinks)
    root: str | os.PathLike[str] = spool_dir
    remote = []
    for spec in sinks:
        if is_jsonl(spec):
            root = jsonl_root(spec) or spool_dir
        else:
            remote.append(make_sink(spec, options, **common))
    names = [sink.name for sink in remote]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"sinks {sinks!r} name the sink(s) {duplicates} more than once")
    return Path(root), remote
