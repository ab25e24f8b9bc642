"""What every sink speaks: a point, the run it belongs to, the ``Sink`` protocol and its errors.

A *point* is one ``Tracker.log`` call: the trainer's step, the wall time of the call (unix
seconds) and the metric values (``name:reduction`` -> float). Sinks receive points in the order
they were logged, in batches, on a background thread; never on the training thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

RUNNING = "RUNNING"
FINISHED = "FINISHED"
FAILED = "FAILED"
KILLED = "KILLED"
STATUSES = (RUNNING, FINISHED, FAILED, KILLED)
"""Run statuses, spelled as MLflow's ``RunStatus`` names; W&B gets an exit code from them."""

EXIT_CODES = {FINISHED: 0, FAILED: 1, KILLED: 143}
"""Process-style exit code per terminal status (W&B ``finish(exit_code=...)``); 143 = 128 + SIGTERM."""


@dataclass(frozen=True, slots=True)
class Point:
    """One ``log`` call: ``step`` (trainer steps, >= 0), ``wall_time`` (unix seconds), ``metrics``."""

    step: int
    wall_time: float
    metrics: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        """The JSONL line form: ``{"step": int, "wall_time": float, "metrics": {key: float}}``."""
        return {"step": self.step, "wall_time": self.wall_time, "metrics": dict(self.metrics)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Point:
        return cls(int(obj["step"]), float(obj["wall_time"]), {k: float(v) for k, v in obj["metrics"].items()})


@dataclass
class RunInfo:
    """The run every sink writes: one per training job, whatever the number of sinks or ranks.

    ``run_id`` is cliptrack's own id (32 hex digits); sinks that mint their own ids (MLflow) record
    them in their replay state. ``started`` is unix seconds. ``backend_label`` names the training
    stack (stored under ``keys.TAG_BACKEND``).
    """

    run_id: str
    run_name: str
    backend_label: str | None
    config: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    experiment: str = "cliptrack"


class SinkError(Exception):
    """A sink could not take a batch now; the points stay spooled and are retried with backoff."""


class SinkRejected(SinkError):
    """The backend refused the data itself (not a transient failure): retrying would not help.

    The points stay in the run's JSONL spool; fix the cause and run ``cliptrack replay``.
    """


class PartialWrite(SinkError):
    """Only the first ``written`` points of the batch reached the backend before ``cause`` struck."""

    def __init__(self, written: int, cause: BaseException) -> None:
        super().__init__(f"{written} points written before: {cause}")
        self.written = written
        self.cause = cause


@runtime_checkable
class Sink(Protocol):
    """A tracking backend, as a small class.

    Lifecycle: ``open`` once (or again after a failure), then ``write`` batches in order, then
    ``close`` with a terminal status. ``write`` is called with points already validated by the
    tracker and must either take the whole batch, raise ``PartialWrite`` saying how many of its
    leading points were taken, or raise. Re-sending a batch after an ambiguous failure must not
    duplicate points where the backend allows it (MLflow does: identical metric rows are merged).

    Optional methods: ``settings() -> dict`` (what replay needs to reach the backend before the
    run was ever opened; recorded in run.json at start) and ``log_config(config)`` (config added
    mid-run; failures there only warn).
    """

    name: str
    """Short name, unique per tracker: "mlflow", "wandb", "jsonl"."""

    @property
    def location(self) -> str:
        """Where the run is logged, for humans: URI, run id, mode."""
        ...

    def check_key(self, key: str) -> None:
        """Raise ValueError naming ``key`` if this backend would refuse it. Called once per new key."""
        ...

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Create (or, given a previous ``state``, reattach to) the run; return the replay state.

        The returned dict is JSON-serialisable and is stored in the run's ``run.json`` under
        ``sinks.<name>`` so that ``cliptrack replay`` can reopen the same run later.
        """
        ...

    def write(self, points: Sequence[Point]) -> None:
        """Send ``points`` (in order) to the backend."""
        ...

    def close(self, status: str) -> None:
        """Mark the run ended with ``status`` (one of FINISHED, FAILED, KILLED) and release it."""
        ...
