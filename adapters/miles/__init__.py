"""The Miles-runtime path: per-datum clip counts, summed exactly per training client.

- Runtime side (:mod:`adapters.miles.runtime`): :func:`forward_backward_loss` computes each datum's
  loss of one forward_backward request and returns the per-datum outputs in Tinker's wire form.
- Client side (:mod:`adapters.miles.client`): :func:`aggregate_datums` turns per-datum outputs
  into the step's metrics; :class:`ClientAggregator` keeps the sums per client and step.
- Miles' own log dict (:mod:`adapters.miles.train_log`): :func:`read_train_log`.
- Wire forms (:mod:`adapters.miles.wire`): TensorData, JSON dicts, tinker's protobuf.
"""

from adapters.miles.client import (
    MAX_CHUNK_DATUMS,
    ClientAggregator,
    UnknownClientError,
    aggregate_datums,
    count_datums,
    datum_counts,
)
from adapters.miles.runtime import RequestResult, forward_backward_loss
from adapters.miles.train_log import log_entries, read_train_log, sum_train_logs
from adapters.miles.wire import output_from_json, output_to_json, output_to_proto

__all__ = [
    "MAX_CHUNK_DATUMS",
    "ClientAggregator",
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
