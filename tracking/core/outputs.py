"""The three forms of a ``ForwardBackwardOutput``, read one way.

An output arrives as cliptrack's dataclass, as tinker's own ``tinker.types.ForwardBackwardOutput``
(same fields), or as the JSON dict of either (what a REST frontend returns). :func:`read_output`
is the one place that tells them apart; every boundary (the tracker, the merge, the Miles client,
the wire encoders) calls it. Rules, the same everywhere:

- a dict is an output when it has a ``metrics`` or a ``loss_fn_outputs`` field; an object when it
  has ``metrics`` and ``loss_fn_outputs`` attributes;
- a missing (or ``None``) ``metrics`` is an empty mapping, a missing ``loss_fn_outputs`` an empty
  list and a missing ``loss_fn_output_type`` the empty string (JSON encoders drop empty fields);
- ``metrics`` must be a mapping and ``loss_fn_outputs`` a list (or tuple), else ValueError.

Nothing here imports torch or tinker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["OutputParts", "is_output", "metrics_of", "read_output"]

_FIELDS = ("loss_fn_output_type", "loss_fn_outputs", "metrics")


@dataclass(frozen=True)
class OutputParts:
    """The fields of one output, whatever its form: ``metrics`` maps ``name:reduction`` to a
    number (not yet validated), ``loss_fn_outputs`` holds the per-datum outputs as given."""

    loss_fn_output_type: str
    loss_fn_outputs: Sequence[Any]
    metrics: Mapping[str, Any]


def is_output(value: object) -> bool:
    """Whether ``value`` is a ForwardBackwardOutput in one of its three forms."""
    if isinstance(value, Mapping):
        return "metrics" in value or "loss_fn_outputs" in value
    return hasattr(value, "loss_fn_outputs") and hasattr(value, "metrics")


def read_output(output: object, where: str = "output") -> OutputParts:
    """The fields of ``output`` (ours, tinker's, or its JSON dict); ValueError naming ``where`` and
    what is wrong when it is none of them or a field has the wrong type."""
    if isinstance(output, Mapping):
        if not is_output(output):
            raise ValueError(
                f"{where} is a dict without 'metrics' or 'loss_fn_outputs' (fields: {sorted(map(str, output))}); "
                "expected a ForwardBackwardOutput or its JSON dict"
            )
        output_type, datums, metrics = (output.get(name) for name in _FIELDS)
    elif is_output(output):
        output_type, datums, metrics = (getattr(output, name, None) for name in _FIELDS)
    else:
        raise ValueError(
            f"{where} must be a ForwardBackwardOutput (cliptrack's or tinker's) or its JSON dict with a "
            f"'metrics' mapping, got {type(output).__name__}"
        )
    if metrics is None:
        metrics = {}
    if not isinstance(metrics, Mapping):
        raise ValueError(
            f"{where}.metrics must be a mapping of 'name:reduction' -> number, got {type(metrics).__name__}"
        )
    if datums is None:
        datums = []
    if not isinstance(datums, Sequence) or isinstance(datums, (str, bytes)):
        raise ValueError(f"{where}.loss_fn_outputs must be a list, got {type(datums).__name__}")
    return OutputParts(str(output_type or ""), datums, metrics)


def metrics_of(output: object) -> Mapping[str, Any]:
    """The metrics mapping of an output in any of its three forms (see :func:`read_output`)."""
    return read_output(output).metrics
