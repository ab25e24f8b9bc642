"""The Miles path: per-datum clip counts and on-policy gauge, summed exactly per training client.

In the shape every stack integration has (docs/ARCHITECTURE.md, "Three stack integrations in one
shape"):

- Loss hook: the runtime's :func:`forward_backward_loss` (:mod:`cliptrack.adapters.miles.runtime`) computes
  each datum's loss of one forward_backward request and returns the per-datum outputs in Tinker's
  wire form; in Miles' own training loop, :mod:`cliptrack.adapters.miles.custom_loss` (``--loss-type
  custom_loss``) adds exact count and gauge entries to Miles' log dict.
- Reduction to an output: :func:`aggregate_datums` turns per-datum outputs into the step's
  metrics; :class:`ClientAggregator` keeps the sums per client and step
  (:mod:`cliptrack.adapters.miles.client`).
- Read-back of the stack's own log: :func:`read_train_log` (:mod:`cliptrack.adapters.miles.train_log`).

Wire forms (:mod:`cliptrack.adapters.miles.wire`): TensorData, JSON dicts, tinker's protobuf.
"""

from cliptrack.adapters.miles.client import (
    MAX_CHUNK_DATUMS,
    ClientAggregator,
    UnknownClientError,
    aggregate_datums,
    count_datums,
    datum_counts,
)
from cliptrack.adapters.miles.runtime import RequestResult, forward_backward_loss
from cliptrack.adapters.miles.train_log import MilesCountWarning, log_entries, read_train_log, sum_train_logs
from cliptrack.adapters.miles.wire import output_from_json, output_to_json, output_to_proto

__all__ = [
    "MAX_CHUNK_DATUMS",
    "ClientAggregator",
    "MilesCountWarning",
    "RequestResult",
    "UnknownClientError",
    "aggregate_datums",
    "count_datums",
    "datum_counts",
    "forward_backward_loss",
    "log_entries",
    "output_from_json",
    "output_to_json",
    "output_to_proto",
    "read_train_log",
    "sum_train_logs",
]
