"""``cliptrack replay``: push spooled points to the backends that did not take them.

For every run directory under the given roots (default ``.cliptrack``), and every remote sink
recorded in its run.json, the points of points.jsonl past that sink's acknowledged offset are
sent, in order, in batches, and the sink's run is marked with the run's final status. Nothing is
duplicated: progress is acknowledged batch by batch, and a batch re-sent after an ambiguous
failure is merged by MLflow (identical key, value, timestamp, step). W&B runs are resumed by id
(``resume="allow"``), and start from what the run's ``.wandb`` transaction log really holds
(``W&B`` after a crash: rows accepted but never written are sent, rows written but not yet
acknowledged are not sent again). A run whose training process is still alive (its lock is
held) is skipped; a run whose process died without closing (status RUNNING) is marked FAILED.
A damaged journal line is reported and skipped; a run that cannot be replayed at all is reported
and replay goes on with the next runs.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any

from cliptrack.backends import Sink, sink_from_state, sink_names
from cliptrack.backends.options import add_target_arguments, target_arguments
from cliptrack.core.secrets import redact_value
from cliptrack.core.text import printable
from cliptrack.log._pipeline.lane import LOG, SinkLane
from cliptrack.log.tracker import _ensure_log_handler
from cliptrack.store.params import ParamBook
from cliptrack.store.records import FAILED, RUNNING, RunInfo
from cliptrack.store.spool import Ack, DamagedLine, RunDir, check_unique_ids, run_dirs

LOCK_WAIT_S = 30.0
"""Seconds replay waits for a sink's lock held by a tracker that was closed while a (bounded)
request was still in flight, before reporting the sink as being written by another process."""


@dataclass
class ReplayResult:
    """What replay did for one sink of one run; ``pushed`` counts points (log calls)."""

    run_id: str
    sink: str
    pushed: int
    left: int
    status: str
    outcome: str  # "up to date" | "replayed" | "failed" | "skipped: ..."
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in ("up to date", "replayed") or self.outcome.startswith("skipped")

    def line(self) -> str:
        text = f"run {self.run_id} {self.sink}: {self.outcome}"
        if self.outcome == "replayed" or self.pushed:
            text += f", {self.pushed} points pushed"
        if self.left:
            text += f", {self.left} still pending"
        if self.outcome in ("replayed", "up to date"):
            text += f", status {self.status}"
        if self.error:
            text += f" ({self.error})"
        return text


def replay_run(
    run_dir: RunDir,
    *,
    sinks: set[str] | None = None,
    tracking_uri: str | None = None,
    timeout_s: float = 120.0,
    dry_run: bool = False,
    targets: dict[str, dict[str, Any]] | None = None,
) -> list[ReplayResult]:
    """Replay one run directory; see the module docstring. ``targets``: per sink name, options
    that re-target it (``{"wandb": {"project": ...}}``); ``tracking_uri`` is MLflow's."""
    meta = run_dir.read_meta()
    if not run_dir.lock_sink("jsonl"):
        return [
            ReplayResult(
                run_dir.run_id,
                "*",
                0,
                0,
                str(meta.get("status")),
                "skipped: the run is still being logged by a live process",
            )
        ]
    targets = {name: dict(options) for name, options in (targets or {}).items()}
    if tracking_uri:
        targets.setdefault("mlflow", {})["tracking_uri"] = tracking_uri
    try:
        run_dir.check_journal()  # reported; each sink's acknowledgement is checked by read_ack
        run = run_dir.read_run()
        if run.status == RUNNING:  # the process died without closing: neither finished nor killed cleanly
            run.status = FAILED
            if not dry_run:
                run_dir.update_meta(status=run.status)
        end = run_dir.journal_end()
        results = []
        for name, state in run_dir.sink_states().items():
            if sinks is not None and name not in sinks:
                continue
            target = Target(name, state, targets.get(name) or {})
            results.append(_replay_sink(run_dir, run, target, end, timeout_s, dry_run))
        return results
    finally:
        run_dir.unlock_sink("jsonl")


@dataclass
class Target:
    """Where replay sends one sink's points: its recorded replay ``state`` and the ``options`` given
    on the command line (each backend's ``TARGET_OPTIONS``: MLflow ``tracking_uri``; W&B
    ``project``, ``entity``, ``mode``, ``dir``; CSV ``dir``)."""

    name: str
    state: dict[str, Any]
    options: dict[str, Any]

    def sink(self) -> Sink:
        return sink_from_state(self.name, self.state, **self.options)

    @staticmethod
    def moved(recorded: dict[str, Any], sink: Sink) -> bool:
        """True when ``sink`` is set to another store than the recorded one (re-targeted). Compared
        redacted: run.json records a URI without its password, and the same URI with it (given to
        reach the store) names the same store."""
        settings = sink.settings()
        return any(
            key in recorded and redact_value(recorded[key]) != redact_value(value)
            for key, value in settings.items()
        )


UP_TO_DATE = "up to date"
DRY_RUN = "skipped: dry run"


def _replay_sink(
    run_dir: RunDir, run: RunInfo, target: Target, end: Ack, timeout_s: float, dry_run: bool
) -> ReplayResult:
    """Send sink ``target`` of the run what it has not acknowledged up to ``end`` (points, then the
    close with the run's status), or say why nothing was sent."""
    status, name, state = run.status, target.name, target.state
    ack = run_dir.read_ack(name)
    left = max(0, end.points - ack.points)
    caught_up = ack.offset >= end.offset and bool(state.get("closed")) and state.get("status") == status
    if dry_run and not target.options and not caught_up:
        return ReplayResult(run.run_id, name, 0, left, status, DRY_RUN)
    try:
        sink = target.sink()
    except Exception as exc:  # noqa: BLE001
        return ReplayResult(run.run_id, name, 0, left, status, "failed", f"{type(exc).__name__}: {exc}")
    resume, outcome = _resume_state(run_dir, run, target, sink, caught_up, dry_run)
    if resume is None:
        return ReplayResult(run.run_id, name, 0, 0 if outcome == UP_TO_DATE else left, status, outcome)
    return _push(run_dir, run, name, sink, resume, end, timeout_s)


def _resume_state(
    run_dir: RunDir, run: RunInfo, target: Target, sink: Sink, caught_up: bool, dry_run: bool
) -> tuple[dict[str, Any] | None, str]:
    """The state the sink resumes from (re-targeted first when the options name another store), or
    None with why there is nothing to send (up to date, or a dry run)."""
    current = caught_up and not ParamBook(target.name, run_dir).pending(sink.attributes(run))
    if current and not target.options:
        return None, UP_TO_DATE
    if dry_run and not target.options:
        return None, DRY_RUN
    state = target.state
    resume = {k: v for k, v in state.items() if k not in ("closed", "status", "refused", "previous")}
    moved = Target.moved(resume, sink)
    if current and not moved:  # the options name the recorded target
        return None, UP_TO_DATE
    if dry_run:
        return None, DRY_RUN
    return (_retarget(run_dir, target.name, state, sink) if moved else resume), ""


def _push(
    run_dir: RunDir,
    run: RunInfo,
    name: str,
    sink: Sink,
    resume: dict[str, Any],
    end: Ack,
    timeout_s: float,
) -> ReplayResult:
    """Run one lane of ``sink`` from ``resume`` to the journal's ``end`` and close it with the run's
    status, within ``timeout_s`` seconds."""
    lane = SinkLane(
        sink,
        run_dir,
        run,
        max_buffered_points=2000,
        max_batch_points=2000,
        backoff_initial_s=0.5,
        backoff_max_s=5.0,
        state=resume,
        journal_end=end,
        lock_wait_s=LOCK_WAIT_S,
    )
    deadline = time.monotonic() + timeout_s
    lane.start()
    lane.stop(run.status, deadline)
    lane.join(timeout_s + 5.0)
    done = lane.acked
    remaining = max(0, end.points - done.points)
    refused = ", ".join(part for part in (lane.refusals.summary(), lane.params_summary()) if part)
    if lane.closed_cleanly and done.offset >= end.offset:
        return ReplayResult(run.run_id, name, lane.sent_points, 0, run.status, "replayed", refused or None)
    return ReplayResult(
        run.run_id, name, lane.sent_points, remaining, run.status, "failed", lane.error or "timed out"
    )


def _retarget(run_dir: RunDir, name: str, state: dict[str, Any], sink: Sink) -> dict[str, Any]:
    """Point sink ``name`` of the run at a new store: the old target is kept in run.json under
    ``sinks.<name>.previous`` (the mapping), its acknowledgement starts over (the new store holds
    nothing of the run; a point it does hold is merged, not stored twice)."""
    old = {k: v for k, v in state.items() if k not in ("previous", "refused")}
    previous = [*state.get("previous", []), old]
    settings = sink.settings()
    run_dir.update_meta(sinks={name: {**settings, "previous": previous, "closed": False}})
    run_dir.write_ack(name, Ack())
    ParamBook(name, run_dir).reset()  # nor any of its params and tags
    LOG.info("replay sends %s of run %s to a new target: %s", name, run_dir.run_id, printable(sink.location))
    return settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "roots",
        nargs="*",
        default=[".cliptrack"],
        help="spool directories (or run directories) to replay; default .cliptrack",
    )
    parser.add_argument(
        "--run", action="append", dest="runs", metavar="RUN_ID", help="only this run (repeatable)"
    )
    parser.add_argument(
        "--sink",
        action="append",
        dest="sinks",
        metavar="NAME",
        help=f"only this sink: {', '.join(sink_names())} (repeatable)",
    )
    add_target_arguments(parser)  # each backend's re-target flags: --tracking-uri, --wandb-project, ...
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per sink before giving up")
    parser.add_argument("--dry-run", action="store_true", help="only say what is pending")


def run(args: argparse.Namespace) -> int:
    _ensure_log_handler()
    found = check_unique_ids(rd for root in args.roots for rd in run_dirs(os.path.expanduser(root)))
    if args.runs:
        found = [rd for rd in found if rd.run_id in set(args.runs)]
    if not found:
        print(f"cliptrack replay: no runs under {', '.join(args.roots)}")
        return 0
    ok = True
    for run_dir in found:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DamagedLine)
            try:
                results = replay_run(
                    run_dir,
                    sinks=set(args.sinks) if args.sinks else None,
                    timeout_s=args.timeout,
                    dry_run=args.dry_run,
                    targets=target_arguments(args),
                )
            except Exception as exc:  # noqa: BLE001 - one bad run never stops the others
                results = [
                    ReplayResult(run_dir.run_id, "*", 0, 0, "?", "failed", f"{type(exc).__name__}: {exc}")
                ]
        for warning in caught:
            print(f"run {run_dir.run_id}: {printable(warning.message)}")
        for result in results:
            print(printable(result.line()))
            ok = ok and result.ok
    return 0 if ok else 1
