"""What every stack integration shares, and what a stack is.

Megatron-Core (:mod:`cliptrack.adapters.megatron`), the Miles runtime (:mod:`cliptrack.adapters.miles`),
tinker clients (:mod:`cliptrack.adapters.tinker`) and the next stacks import these parts and never
one another:

- :mod:`~cliptrack.adapters.shared.packing`: a loss's sums as one float64 vector (``pack``,
  ``pack_rows``, ``combine_packed``, ``unpack``), the bad-input counts it carries;
- :mod:`~cliptrack.adapters.shared.collective`: the one collective (``merge_packed``, ``gather_vectors``);
- :mod:`~cliptrack.adapters.shared.wire`: Tinker's wire values (``tensor_data``, ``count_data``,
  ``float_data`` and their readers);
- :mod:`~cliptrack.adapters.shared.datums`: the per-datum wire form (``datum_outputs`` written,
  ``datum_counts`` / ``sum_datums`` read back exactly);
- :mod:`~cliptrack.adapters.shared.merge`: the host-side merge of ``ForwardBackwardOutput``s
  (``merge_outputs``, ``aggregate_datums``, ``measured_sums``);
- :mod:`~cliptrack.adapters.shared.stack`: the :class:`Stack` protocol (loss hook, reduction,
  read-back) and :func:`run_step`.

They stand on :mod:`cliptrack.core` and torch alone (and tinker's types, through the vendor seam
:mod:`cliptrack.adapters._compat.tinker`, which are the wire's); tests/test_layers.py checks it.
Every name here imports torch.
"""

from cliptrack.adapters.shared.collective import gather_vectors, merge_packed
from cliptrack.adapters.shared.datums import (
    count_datums,
    datum_counts,
    datum_fields,
    datum_outputs,
    sum_datums,
)
from cliptrack.adapters.shared.merge import (
    ForwardBackwardOutput,
    aggregate_datums,
    measured_sums,
    merge_metrics,
    merge_outputs,
    worst_of_outputs,
)
from cliptrack.adapters.shared.packing import (
    INPUT_CHECKS,
    PACKED_DTYPE,
    PackedSums,
    combine_packed,
    pack,
    pack_rows,
    raise_invalid,
    unpack,
)
from cliptrack.adapters.shared.stack import Stack, StackCall, StepResult, run_step
from cliptrack.adapters.shared.wire import count_data, float_data, read_count, read_float, tensor_data

__all__ = [
    "INPUT_CHECKS",
    "PACKED_DTYPE",
    "ForwardBackwardOutput",
    "PackedSums",
    "Stack",
    "StackCall",
    "StepResult",
    "aggregate_datums",
    "combine_packed",
    "count_data",
    "count_datums",
    "datum_counts",
    "datum_fields",
    "datum_outputs",
    "float_data",
    "gather_vectors",
    "measured_sums",
    "merge_metrics",
    "merge_outputs",
    "merge_packed",
    "pack",
    "pack_rows",
    "raise_invalid",
    "read_count",
    "read_float",
    "run_step",
    "sum_datums",
    "tensor_data",
    "unpack",
    "worst_of_outputs",
]
