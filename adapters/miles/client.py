"""The client side: per-datum measures summed exactly, per request and per training client.

Inputs are ForwardBackwardOutputs as a Miles runtime returns them (ours, tinker's own type, their
JSON dicts, or tinker's chunk merge of several), or bare lists of per-datum outputs. Each datum is
a sequence; its measured fields are read and summed exactly by the per-datum wire form every
stack shares (:mod:`cliptrack.adapters.shared.datums`) and merged by the shared host-side merge
(:mod:`cliptrack.adapters.shared.merge`: :func:`aggregate_datums`, :func:`worst_of_outputs`), so
chunks of any size arriving in any order give the same metrics as one unchunked request. This
module keeps those sums per training client and step (:class:`ClientAggregator`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace

from cliptrack.adapters.shared.datums import added, count_datums, datum_counts, datum_sequence, sum_datums
from cliptrack.adapters.shared.merge import (
    MAX_CHUNK_DATUMS,
    Chunk,
    ForwardBackwardOutput,
    aggregate_datums,
    read_chunk,
    step_metrics,
    worst_of_outputs,
)
from cliptrack.core import measures
from cliptrack.core.sums import MeasuredSums
from cliptrack.core.validation import check_step
from cliptrack.core.worst import DEFAULT_K, Worst, worst_of

__all__ = [
    "MAX_CHUNK_DATUMS",
    "ClientAggregator",
    "EmittedStep",
    "UnknownClientError",
    "aggregate_datums",
    "count_datums",
    "datum_counts",
    "datum_sequence",
    "sum_datums",
    "worst_of_outputs",
]


@dataclass
class _StepState:
    chunks: list[Chunk] = field(default_factory=list)
    total: MeasuredSums | None = None


@dataclass(frozen=True)
class EmittedStep:
    """A step emitted by :meth:`ClientAggregator.emit_step`: its ``output`` and its ``worst``
    sequences (``None`` when its datums carry no ids)."""

    output: ForwardBackwardOutput
    worst: Worst | None = None


class UnknownClientError(LookupError):
    """An output arrived for a training client that was never registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else super().__str__()


class ClientAggregator:
    """Per-client, per-step exact sums of a runtime shared by several training clients.

    One training client is one run. For each ``(client, step)`` the aggregator sums the counts of
    every output :meth:`add`-ed (the chunks of a request, in any order, and several
    forward_backward calls of the step) and :meth:`emit` returns one ``ForwardBackwardOutput``
    for the step. Each output is validated completely before anything is summed, so a bad output
    raises and leaves the earlier sums exactly as they were. Thread-safe.

    ``keep_outputs``: keep the per-datum outputs and return them, in arrival order, in the emitted
    output's ``loss_fn_outputs`` (off by default: the metrics need only the counts).
    ``declaration``: the measures the outputs carry (:data:`cliptrack.core.measures.DEFAULT`
    unless given; that of the runtime's losses).
    """

    def __init__(
        self, *, keep_outputs: bool = False, declaration: measures.Declaration = measures.DEFAULT
    ) -> None:
        self.keep_outputs = keep_outputs
        self.declaration = declaration
        self._lock = threading.Lock()
        self._steps: dict[str, dict[int, _StepState]] = {}
        self._emitted: dict[str, set[int]] = {}

    def register(self, client_id: str) -> None:
        """Start accepting outputs for ``client_id`` (a run); ValueError if already registered."""
        if not isinstance(client_id, str) or not client_id:
            raise ValueError(f"client_id must be a non-empty string, got {client_id!r}")
        with self._lock:
            if client_id in self._steps:
                raise ValueError(f"client {client_id!r} is already registered")
            self._steps[client_id] = {}
            self._emitted[client_id] = set()

    @property
    def clients(self) -> tuple[str, ...]:
        """Registered client ids, in registration order."""
        with self._lock:
            return tuple(self._steps)

    def pending_steps(self, client_id: str) -> list[int]:
        """Steps of ``client_id`` with outputs added but not yet emitted, ascending."""
        with self._lock:
            return sorted(self._client(client_id))

    def add(self, client_id: str, step: int, output: object) -> MeasuredSums | None:
        """Add one output (a chunk, a whole request, or tinker's merge of chunks) to a step.

        Returns the output's own counts (``None`` when it holds no datums). Raises UnknownClientError for an unregistered client and
        ValueError for a bad step, bad counts, an already-emitted step, or a loss kind that does
        not match the step's earlier outputs; the sums are then unchanged.
        """
        step = _check_step(step)
        chunk = read_chunk(output, f"client {client_id!r} step {step} output", self.declaration)
        with self._lock:
            steps = self._client(client_id)
            if step in self._emitted[client_id]:
                raise ValueError(
                    f"client {client_id!r} step {step} was already emitted; an output arriving after "
                    "emit() would be lost"
                )
            state = steps.get(step) or _StepState()
            total = added(state.total, chunk.counts, f"client {client_id!r} step {step}: ")
            if not self.keep_outputs:
                chunk = replace(chunk, datum_outputs=[])
            state.chunks.append(chunk)
            state.total = total
            steps[step] = state
        return chunk.counts

    def emit(self, client_id: str, step: int) -> ForwardBackwardOutput:
        """The step's ``ForwardBackwardOutput`` for ``client_id``; the step is then closed.

        Metrics: the outputs' metrics merged with Tinker's reductions, with ``loss_tokens:sum``,
        the clip counts and ``clip_fraction:mean`` from the exact per-datum sums.
        """
        return self.emit_step(client_id, step, worst_k=0).output

    def emit_step(self, client_id: str, step: int, *, worst_k: int = DEFAULT_K) -> EmittedStep:
        """:meth:`emit`, and the step's worst ``worst_k`` sequences among its datums that carry an id
        (``datum_id``; ``None`` when none does, or ``worst_k=0``): exact whatever the chunking and
        order of arrival (:func:`cliptrack.core.worst.worst_of` over every such datum of the step)."""
        if isinstance(worst_k, bool) or not isinstance(worst_k, int) or worst_k < 0:
            raise ValueError(f"worst_k must be an integer >= 0, got {worst_k!r}")
        step = _check_step(step)
        with self._lock:
            steps = self._client(client_id)
            if step not in steps:
                done = " (it was already emitted)" if step in self._emitted[client_id] else ""
                raise ValueError(f"client {client_id!r} has no outputs for step {step}{done}")
            state = steps[step]
            metrics = step_metrics(state.chunks, state.total, self.declaration)
            output_type = next((c.output_type for c in state.chunks if c.output_type), "")
            datum_outputs = [d for c in state.chunks for d in c.datum_outputs]
            sequences = [s for c in state.chunks for s in c.sequences]
            worst = Worst(step, worst_k, worst_of(sequences, worst_k)) if sequences and worst_k else None
            del steps[step]
            self._emitted[client_id].add(step)
        output = ForwardBackwardOutput(
            loss_fn_output_type=output_type, loss_fn_outputs=datum_outputs, metrics=metrics
        )
        return EmittedStep(output, worst)

    def _client(self, client_id: str) -> dict[int, _StepState]:
        try:
            return self._steps[client_id]
        except KeyError:
            known = ", ".join(repr(c) for c in self._steps) or "none"
            raise UnknownClientError(
                f"unknown client {client_id!r}: register() it before adding outputs (registered: {known})"
            ) from None


def _check_step(step: object) -> int:
    """``step`` as an int (:func:`cliptrack.core.validation.check_step`), the message in the client's words."""
    try:
        return check_step(step)
    except ValueError as exc:
        if "signed 64-bit" in str(exc):
            raise
        raise ValueError(f"step must be an int >= 0 (the trainer's own step), got {step!r}") from None
