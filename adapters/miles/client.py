"""The client side: per-datum measures summed exactly, per request and per training client.

Inputs are ForwardBackwardOutputs as a Miles runtime returns them (ours, tinker's own type, their
JSON dicts, or tinker's chunk merge of several), or bare lists of per-datum outputs. Each datum is
a sequence; its measured fields (:data:`cliptrack.core.keys.DATUM_MEASURE_FIELDS`: ``loss_tokens``, the
clip counts, and the on-policy gauge's per-sequence sums and extremes) are read, summed (counts as
Python ints, float sums with ``math.fsum``, extremes by max / min: :class:`cliptrack.core.sums.MeasuredSums`)
and the fraction and means are formed once from the sums, so chunks of any size arriving in any
order give the same metrics as one unchunked request.

The low/high split is optional per datum (the seed runtimes return ``loss_tokens`` and
``clipped_tokens`` alone); a sum carries it only when every datum does. So are the gauge's
extremes (a sum keeps them only when every datum with tokens has them).

Mixed losses: the counts of PPO and CISPO mean the same thing (eligible tokens whose update
clipping changed), so outputs of either sum together. A loss that never clips carries no clip
fields, a loss without sampling log-probs (cross entropy) no gauge; mixing such outputs with
others within one request or step leaves a fraction or mean with no meaning, so it is refused
with the one mixing error (:func:`cliptrack.core.measures.mixed_groups_error`).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cliptrack.adapters.losses.output import ForwardBackwardOutput, merge_metrics
from cliptrack.adapters.miles.wire import read_array, read_count, read_float
from cliptrack.core import keys, measures
from cliptrack.core.outputs import is_output, read_output
from cliptrack.core.sums import MeasuredSums
from cliptrack.core.validation import check_metrics, check_step
from cliptrack.core.worst import DEFAULT_K, SequenceGauge, Worst, worst_of


def _from_datums() -> tuple[str, ...]:
    """Metric keys always formed from the per-datum sums (never from a chunk's own metrics)."""
    return tuple(k for k in (*keys.MEASURED_KEYS, *keys.MEAN_KEYS) if k != keys.LOSS_SUM)


MAX_CHUNK_DATUMS = 1024
"""Most datums in one chunk of a Tinker forward_backward request."""


@dataclass(frozen=True)
class _Chunk:
    """One validated output: its datums' summed measures (``None`` without datums), each datum's
    float sums (``terms``: key -> one value per datum, for the exact sum), its number of datums,
    its checked metrics, its per-datum outputs (kept on request) and output type."""

    counts: MeasuredSums | None
    terms: dict[str, list[float]]
    datums: int
    metrics: dict[str, float]
    datum_outputs: list[Any]
    output_type: str
    sequences: tuple[SequenceGauge, ...] = ()
    """The gauge of each datum that carries an id (:func:`datum_sequence`), for the worst sequences."""


def datum_counts(datum: object, where: str = "datum") -> MeasuredSums:
    """The measured sums of one per-datum output (one sequence), validated.

    ``loss_tokens`` is required; ``clipped_tokens`` marks a loss that clips; the low/high split
    (``clipped_low_tokens``, ``clipped_high_tokens``) is optional and comes as a pair. The gauge's
    fields (:data:`cliptrack.core.keys.DATUM_GAUGE_FIELDS`) mark a loss with sampling log-probs: its sums
    come together, its extremes are optional (and ignored for a datum with no eligible token, which
    has none). Counts are int64, float measures float32 ``[hi, lo]`` pairs or single floats.
    """
    if not isinstance(datum, Mapping):
        raise TypeError(f"{where} must be a dict of field -> TensorData, got {type(datum).__name__}")
    if keys.DATUM_LOSS_TOKENS not in datum:
        raise ValueError(
            f"{where} has no {keys.DATUM_LOSS_TOKENS!r} field (fields: {sorted(datum)}); the runtime must "
            "return per-datum token counts"
        )
    present = [name for name in keys.DATUM_CLIP_FIELDS if name in datum]
    split = [
        name for name in (keys.DATUM_CLIPPED_LOW_TOKENS, keys.DATUM_CLIPPED_HIGH_TOKENS) if name in datum
    ]
    if (present and keys.DATUM_CLIPPED_TOKENS not in datum) or len(split) == 1:
        absent = [name for name in keys.DATUM_CLIP_FIELDS if name not in datum]
        raise ValueError(f"{where} carries {present} but not {absent}: the clip counts come together")
    loss_tokens = read_count(datum[keys.DATUM_LOSS_TOKENS], f"{where}[{keys.DATUM_LOSS_TOKENS!r}]")
    values: dict[str, float | int] = {keys.LOSS_TOKENS: loss_tokens}
    for group in measures.declared().groups:
        values.update(_datum_group(datum, where, loss_tokens, group.name))
    try:
        return MeasuredSums(values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _datum_group(
    datum: Mapping[str, Any], where: str, loss_tokens: int, group: str
) -> dict[str, float | int]:
    """The fields of ``group``'s measures one datum carries, under their metric keys (none: {});
    its sums come together, its extremes are optional and ignored over no eligible token (the
    wire's placeholder)."""
    members = [m for m in measures.group_measures(group) if m.key not in (keys.LOSS_SUM, keys.LOSS_TOKENS)]
    fields = [m for m in members if m.field in datum]
    if not fields:
        return {}
    _check_group_sums(datum, where, group, members, fields)
    return _read_group_fields(datum, where, loss_tokens, fields)


def _check_group_sums(
    datum: Mapping[str, Any],
    where: str,
    group: str,
    members: Sequence[measures.Measure],
    fields: Sequence[measures.Measure],
) -> None:
    """ValueError when a datum carries some of ``group``'s fields (``fields``) but not all its sums
    (the clip counts and their split are checked by :func:`datum_counts`, in their own words)."""
    missing = [m.field for m in members if m.reduction == measures.SUM and m.field not in datum]
    if missing and group not in (measures.CLIP, measures.SPLIT):  # checked above, in their words
        what = "the gauge's sums" if group == measures.GAUGE else f"the {group} measures"
        raise ValueError(
            f"{where} carries {[m.field for m in fields]} but not {missing}: {what} come together"
        )


def _read_group_fields(
    datum: Mapping[str, Any], where: str, loss_tokens: int, fields: Sequence[measures.Measure]
) -> dict[str, float | int]:
    """Each of ``fields`` read from the datum, under its metric key: counts as exact ints (tokens),
    float measures as floats. Every field is read (and checked); an extreme over no eligible token
    (``loss_tokens == 0``) is then dropped."""
    values: dict[str, float | int] = {}
    for m in fields:
        name = f"{where}[{m.field!r}]"
        value = read_count(datum[m.field], name) if m.exact else read_float(datum[m.field], name)
        if m.reduction != measures.SUM and loss_tokens == 0:
            continue  # no eligible token, no extreme: the wire's placeholder is ignored
        values[m.key] = value
    return values


def count_datums(datums: Iterable[object], where: str = "loss_fn_outputs") -> MeasuredSums | None:
    """Exact sums over per-datum outputs (``None`` when there are none); ValueError if datums of
    losses that measure different things mix (a clipping loss and one that never clips, a loss with
    the gauge and one without). Float sums are the correctly rounded sum of every datum's value."""
    total, terms = _count_datums(datums, where)
    return _exact(total, terms)


def _float_sums() -> tuple[str, ...]:
    """The float sums (the gauge's, a registered one's): summed once over every datum's value
    (``math.fsum`` of all of them), so no chunking or order of arrival changes a bit of the result."""
    return tuple(m.key for m in measures.DATUM_MEASURES if m.reduction == measures.SUM and not m.exact)


def _count_datums(datums: Iterable[object], where: str) -> tuple[MeasuredSums | None, dict[str, list[float]]]:
    """``(total, terms)``: the datums' sum by addition, and each datum's float sums."""
    return _total_and_terms([datum_counts(d, f"{where}[{i}]") for i, d in enumerate(datums)], where)


def _total_and_terms(
    per_datum: Sequence[MeasuredSums], where: str
) -> tuple[MeasuredSums | None, dict[str, list[float]]]:
    total: MeasuredSums | None = None
    terms: dict[str, list[float]] = {key: [] for key in _float_sums()}
    for i, counts in enumerate(per_datum):
        total = _added(total, counts, f"{where}[{i}]: ")
        for key, values in terms.items():
            if key in counts:
                values.append(float(counts[key]))
    return total, terms


def sum_datums(per_datum: Sequence[MeasuredSums], where: str = "datums") -> MeasuredSums | None:
    """The exact sum of datums' measured sums (``None`` for none): counts as ints, extremes by
    max / min, float sums by one ``math.fsum`` over every datum (independent of order)."""
    return _exact(*_total_and_terms(per_datum, where))


def _exact(total: MeasuredSums | None, terms: Mapping[str, Sequence[float]]) -> MeasuredSums | None:
    """``total`` with its float sums replaced by ``math.fsum`` of every term at once (addition
    rounds at each step, so its result depends on the grouping; one fsum does not)."""
    if total is None:
        return total
    exact = {key: math.fsum(terms[key]) for key in _float_sums() if key in total}
    return MeasuredSums({**total.values, **exact}) if exact else total


def aggregate_datums(outputs: object) -> dict[str, float]:
    """The step's metrics from per-datum outputs, with counts summed exactly.

    ``outputs``: one ForwardBackwardOutput (ours or tinker's, including tinker's
    ``combine_fwd_bwd_output_results`` of chunks) or its JSON dict; a sequence of those (chunks, in
    any order); or a sequence of per-datum outputs (``{field: TensorData}``). Other metrics of the
    outputs are merged with Tinker's reductions (a key missing from any output that holds datums is
    dropped, as in Tinker, rather than summed over part of the step); ``loss_tokens:sum``, the clip
    counts and ``clip_fraction:mean`` always come from the per-datum sums (a loss that never clips
    yields no clip keys; the low/high split only when every datum carries it). Raises ValueError for
    bad or inconsistent counts and for mixed loss kinds.
    """
    chunks = [_read_output(o, f"outputs[{i}]") for i, o in enumerate(_as_outputs(outputs))]
    total: MeasuredSums | None = None
    for i, chunk in enumerate(chunks):
        total = _added(total, chunk.counts, f"outputs[{i}]: ")
    return _step_metrics(chunks, total)


def _as_outputs(outputs: object) -> list[object]:
    if is_output(outputs):
        return [outputs]
    if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Iterable):
        raise TypeError(
            f"expected a ForwardBackwardOutput, its JSON dict, or a list of them or of per-datum "
            f"outputs; got {type(outputs).__name__}"
        )
    items = list(outputs)
    kinds = {is_output(item) for item in items}
    if kinds == {True}:
        return items
    if kinds == {False}:  # bare per-datum outputs: one request without metrics
        return [ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=items, metrics={})]
    if not items:
        return []
    raise TypeError("outputs mixes ForwardBackwardOutputs with bare per-datum outputs")


def _read_output(output: object, where: str) -> _Chunk:
    """Validate one output completely (nothing is summed anywhere until this returns)."""
    parts = read_output(output, where)
    datums_where = f"{where}.loss_fn_outputs"
    per_datum = [datum_counts(d, f"{datums_where}[{i}]") for i, d in enumerate(parts.loss_fn_outputs)]
    total, terms = _total_and_terms(per_datum, datums_where)
    counts = _exact(total, terms)
    try:
        checked = check_metrics(parts.metrics) if parts.metrics else {}
    except ValueError as exc:
        raise ValueError(f"{where}.metrics: {exc}") from exc
    _check_metrics_agree(checked, counts, where)
    return _Chunk(
        counts,
        terms,
        len(parts.loss_fn_outputs),
        checked,
        list(parts.loss_fn_outputs),
        parts.loss_fn_output_type,
        _sequences(parts.loss_fn_outputs, per_datum, datums_where),
    )


def _sequences(
    datums: Sequence[object], counts: Sequence[MeasuredSums], where: str
) -> tuple[SequenceGauge, ...]:
    """The datums' sequence gauges (those with ids). A datum whose ranking fields are bad (an id
    without ``worst_token`` or the gauge, a bad id) leaves the chunk's sequences out, with a warning
    naming it: a diagnostic never costs the chunk's counts, which are already checked."""
    try:
        return tuple(
            s
            for i, (d, c) in enumerate(zip(datums, counts, strict=True))
            if (s := datum_sequence(d, f"{where}[{i}]", c)) is not None
        )
    except ValueError as exc:
        warnings.warn(
            f"{exc}: the chunk's worst sequences are left out, its counts kept", RuntimeWarning, stacklevel=3
        )
        return ()


def datum_sequence(
    datum: object, where: str = "datum", counts: MeasuredSums | None = None
) -> SequenceGauge | None:
    """One datum's sequence gauge (:class:`cliptrack.core.worst.SequenceGauge`) from its output
    fields, when it carries an id (``datum_id``, with ``worst_token``) and the gauge; else ``None``.
    Its largest ``|l|`` is the larger of ``|log_ratio_max|`` and ``|log_ratio_min|``. ``counts``:
    the datum's :func:`datum_counts`, when already read."""
    if not isinstance(datum, Mapping) or keys.DATUM_ID not in datum:
        return None
    if counts is None:
        counts = datum_counts(datum, where)
    if not counts.has_gauge or keys.DATUM_WORST_TOKEN not in datum:
        raise ValueError(
            f"{where} has a {keys.DATUM_ID!r} but no gauge and {keys.DATUM_WORST_TOKEN!r} to rank it by"
        )
    tokens = counts.loss_tokens
    largest = (
        max(abs(float(counts[keys.LOG_RATIO_MAX])), abs(float(counts[keys.LOG_RATIO_MIN]))) if tokens else 0.0
    )
    return SequenceGauge(
        datum=read_count(datum[keys.DATUM_ID], f"{where}[{keys.DATUM_ID!r}]"),
        tokens=tokens,
        log_ratio=float(counts[keys.LOG_RATIO_SUM]),
        abs_log_ratio=float(counts[keys.ABS_LOG_RATIO_SUM]),
        kl_k3=float(counts[keys.KL_K3_SUM]),
        max_abs_log_ratio=largest,
        worst_token=_position(datum[keys.DATUM_WORST_TOKEN], f"{where}[{keys.DATUM_WORST_TOKEN!r}]"),
    )


def _position(value: object, where: str) -> int:
    """A worst token's position: a count, or -1 (no eligible token)."""
    try:
        return read_count(value, where)
    except ValueError:
        array, _ = read_array(value, where)
        if list(array) == [-1]:
            return -1
        raise


def worst_of_outputs(outputs: object, step: int, k: int = DEFAULT_K) -> Worst | None:
    """The worst sequences among the datums of ``outputs`` (one output, or several: a request's
    chunks, tinker's merge of them, a step's requests) that carry ids; ``None`` when none does.
    Exact in any chunking and order (:func:`cliptrack.core.worst.worst_of`)."""
    sequences = [
        s for i, o in enumerate(_as_outputs(outputs)) for s in _read_output(o, f"outputs[{i}]").sequences
    ]
    if not sequences:
        return None
    return Worst(step, k, worst_of(sequences, k))


def _check_metrics_agree(metrics: Mapping[str, float], counts: MeasuredSums | None, where: str) -> None:
    """Measured keys an output's metrics carry must agree with its per-datum sums: every count
    equal, and no clip or gauge key for datums without them (float sums and extremes are taken
    from the datums; the output's own are not compared, the wire rounds them)."""
    expected = counts.to_metrics() if counts is not None else {}
    for key in (m.key for m in measures.DATUM_MEASURES if m.exact):  # they must equal the datums' sums
        if key not in metrics:
            continue
        if counts is None:
            if metrics[key] != 0:
                raise ValueError(
                    f"{where}.metrics[{key!r}] = {metrics[key]:.0f} but the output has no per-datum "
                    "outputs to take exact counts from"
                )
            continue
        if key not in expected:
            raise ValueError(f"{where}.metrics carry {key!r} but its datums {_lacking(key, counts)}")
        if metrics[key] != expected[key]:
            raise ValueError(
                f"{where}.metrics[{key!r}] = {metrics[key]:.0f} but its datums sum to {expected[key]:.0f}"
            )
    if counts is not None and not counts.has_gauge:
        stray = [key for key in keys.GAUGE_KEYS if key in metrics]
        if stray:
            raise ValueError(f"{where}.metrics carry {stray} but its datums {_lacking(stray[0], counts)}")


def _lacking(key: str, counts: MeasuredSums) -> str:
    """What the datums lack that ``key`` needs, in words."""
    if key in keys.GAUGE_KEYS:
        return "carry no gauge: a loss without sampling log-probs must emit no gauge keys"
    if counts.clips:
        return "carry no low/high split"
    return "carry no clip counts: a loss that never clips must emit no clip keys"


def _added(total: MeasuredSums | None, counts: MeasuredSums | None, where: str) -> MeasuredSums | None:
    """``total + counts`` (``None`` is no datums); the one mixing error prefixed with ``where``."""
    if total is None or counts is None:
        return counts if total is None else total
    try:
        return total + counts
    except ValueError as exc:
        raise ValueError(f"{where}{exc}") from exc


def _step_metrics(chunks: Sequence[_Chunk], total: MeasuredSums | None) -> dict[str, float]:
    """The step's metrics: the chunks' metrics merged, the token metrics from ``total`` (their sum)."""
    # Tinker's rule: a key missing from any output that holds datums is dropped (an output without
    # metrics among ones with ``loss:sum`` would otherwise leave a sum over part of the step).
    with_metrics = [c for c in chunks if c.metrics or c.datums]
    merged = merge_metrics([c.metrics for c in with_metrics], [c.datums for c in with_metrics])
    for key in _from_datums():
        merged.pop(key, None)
    terms = {key: [v for c in chunks for v in c.terms.get(key, ())] for key in _float_sums()}
    merged.update((_exact(total, terms) or MeasuredSums({keys.LOSS_TOKENS: 0})).to_metrics())
    return merged


@dataclass
class _StepState:
    chunks: list[_Chunk] = field(default_factory=list)
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
    """

    def __init__(self, *, keep_outputs: bool = False) -> None:
        self.keep_outputs = keep_outputs
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
        chunk = _read_output(output, f"client {client_id!r} step {step} output")
        with self._lock:
            steps = self._client(client_id)
            if step in self._emitted[client_id]:
                raise ValueError(
                    f"client {client_id!r} step {step} was already emitted; an output arriving after "
                    "emit() would be lost"
                )
            state = steps.get(step) or _StepState()
            total = _added(state.total, chunk.counts, f"client {client_id!r} step {step}: ")
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
            metrics = _step_metrics(state.chunks, state.total)
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
