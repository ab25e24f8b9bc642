"""What every sink is: the ``Sink`` base class and its errors.

A sink receives points (``cliptrack.store.records.Point``) in the order they were logged, in batches, on
its own background thread; never on the training thread. The on-disk spool is not a sink: it is
the journal every sink is fed from (``cliptrack.store.spool``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cliptrack.core.worst import Worst
from cliptrack.store.records import (
    EXIT_CODES,
    FAILED,
    FINISHED,
    KILLED,
    RUNNING,
    STATUSES,
    Point,
    RunInfo,
)

__all__ = [
    "ALERT_LEVELS",
    "EXIT_CODES",
    "FAILED",
    "FINISHED",
    "KILLED",
    "RUNNING",
    "STATUSES",
    "Alert",
    "PartialWrite",
    "Point",
    "RunInfo",
    "Sink",
    "SinkError",
    "SinkRejected",
]


ALERT_LEVELS = ("INFO", "WARN", "ERROR")
"""An alert's levels (W&B's ``AlertLevel`` names)."""


@dataclass(frozen=True)
class Alert:
    """A live watch's breach, as every sink receives it (``cliptrack.log.watch``).

    ``key``: the watched metric; ``step``: the trainer step of the point that completed the breach;
    ``value``: that point's value (as logged); ``expected``: the band's prediction there (the
    metric's own units); ``statistic``: the CUSUM, in long-run standard deviations; ``threshold``:
    the CUSUM's limit; ``direction``: "up" or "down"; ``reference``: where the band came from;
    ``title`` / ``text``: the sentence a sink shows; ``level``: one of ``ALERT_LEVELS``."""

    run_id: str
    key: str
    step: int
    value: float
    expected: float
    statistic: float
    threshold: float
    direction: str
    reference: str
    title: str
    text: str
    level: str = "WARN"


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


class Sink(ABC):
    """A tracking backend, as a small class.

    Lifecycle: ``open`` once (or again after a failure), then ``write`` batches in order, then
    ``close`` with a terminal status. ``write`` is called with points already validated by the
    tracker and must either take the whole batch, raise ``PartialWrite`` saying how many of its
    leading points were taken, or raise.

    Required: ``name``, ``location``, ``open``, ``write``, ``close``; ``from_state`` for replay.
    Vendor options are the class's constructor arguments (``MlflowSink(tracking_uri=...)``); a
    ready object can be handed to ``Tracker(sinks=[...])``. Optional (no-ops here):
    ``check_key`` (refuse a key at ``log`` time), ``settings`` (what replay needs to reach the
    backend before the run was ever opened), ``log_config`` (config added mid-run),
    ``attributes`` / ``send_attributes`` (params and tags, sent until acknowledged),
    ``alert`` (a live watch's breach, through the backend's own mechanism), ``log_worst`` (a step's
    worst sequences as a table), ``delivered`` (what the backend really holds, read back after a crash).
    """

    name: str = ""
    """Short name, unique per tracker and the key of the sink registry: "mlflow", "wandb"."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the run is logged, for humans: URI, run id, mode."""

    @abstractmethod
    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Create (or, given a previous ``state``, reattach to) the run; return the replay state.

        The returned dict is JSON-serialisable and is stored in the run's ``run.json`` under
        ``sinks.<name>`` so that ``cliptrack replay`` (or a resumed process) reopens the same run.
        """

    @abstractmethod
    def write(self, points: Sequence[Point]) -> None:
        """Send ``points`` (in order) to the backend."""

    @abstractmethod
    def close(self, status: str) -> None:
        """Mark the run ended with ``status`` (one of FINISHED, FAILED, KILLED) and release it."""

    def check_key(self, key: str) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Raise ValueError naming ``key`` if this backend would refuse it. Called once per new key."""

    def settings(self) -> dict[str, Any]:
        """What replay needs to reach the backend before any run was opened (JSON-serialisable)."""
        return {}

    def log_config(self, config: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """Add ``config`` to the run's configuration; failures only warn."""

    def alert(self, alert: Alert) -> None:  # noqa: B027 - optional hook
        """Raise ``alert`` (a live watch's breach) through the backend's own mechanism (W&B:
        ``run.alert``; MLflow: a tag and a metric). Called on the sink's lane thread while the run is
        open; a failure only warns. Default: nothing (the stderr line is the tracker's)."""

    def log_worst(self, worst: Worst) -> None:  # noqa: B027 - optional hook
        """Log a step's worst sequences (``cliptrack.core.worst.Worst``) as a table of
        ``cliptrack.store.worst.TABLE_COLUMNS`` at ``worst.step`` (W&B: a ``wandb.Table``; MLflow: a
        JSON artifact). Called on the sink's lane thread while the run is open; a failure is retried
        with the lane's next work and at close, then reported (``worst.jsonl`` keeps every table).
        Default: nothing (the run directory's ``worst.jsonl`` is the tracker's)."""

    def attributes(self, run: RunInfo) -> dict[str, str]:
        """The params and tags this backend should hold for ``run`` beside its points: name ->
        value, names spelled ``param:<key>`` / ``tag:<key>`` (``cliptrack.store.params``). The lane sends
        what is not acknowledged with ``send_attributes`` after every open and config update.
        Default ``{}``: the sink takes its config some other way (``open``, ``log_config``)."""
        return {}

    def send_attributes(self, attributes: Mapping[str, str]) -> dict[str, str]:
        """Send ``attributes`` (a part of ``attributes(run)``) to the open run; return those the
        backend refuses, name -> a short reason (each refused on its own: the others are taken).
        Raise ``SinkError`` when it cannot take them now (they are sent again later)."""
        return {}

    def delivered(self, run: RunInfo, journal: Iterable[tuple[Point, int]]) -> int | None:
        """The journal offset (bytes) just past the last point this backend holds for ``run``, read
        back from the backend itself; ``None`` when it cannot tell (the acknowledgements are then
        trusted). ``journal`` yields ``(point, end offset)`` in logging order."""
        return None

    @classmethod
    def from_spec(cls, argument: str | None, options: Mapping[str, Any]) -> Sink:
        """The sink a backend spec names: ``"<name>"`` (``argument`` None) or ``"<name>:<argument>"``
        (for a URI scheme among a backend's ``schemes``, the whole URI). ``options`` are the
        tracker's vendor options (``tracking_uri``, ``experiment``, ``wandb_project``, ...): a sink
        reads its own and ignores the rest. Default: ``cls()``, or ``cls(argument)``."""
        return cls() if argument is None else cls(argument)  # type: ignore[call-arg]

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **overrides: Any) -> Sink:
        """The sink a recorded replay ``state`` describes (``overrides``: options given on the
        replay command line, such as ``tracking_uri``)."""
        raise NotImplementedError(f"{cls.__name__} cannot be rebuilt for replay")


def exit_code(status: str) -> int:
    """The process-style exit code of a terminal status (1 for anything unknown)."""
    return EXIT_CODES.get(status, 1)
