"""Tinker's wire form for per-datum outputs: TensorData values, JSON dicts and protobuf bytes.

A per-datum output (``ForwardBackwardOutput.loss_fn_outputs[i]``) maps a field name to a
TensorData: ``logprobs`` (float32, one entry per target token), the counts ``loss_tokens``,
``clipped_tokens``, ``clipped_low_tokens``, ``clipped_high_tokens`` and ``ratio_outside_tokens``
(int64, shape ``[1]``, in tokens) and the gauge's float measures of the datum's sequence
(``log_ratio``, ``abs_log_ratio``, ``kl_k3``, ``is_weight``, ``is_weight_sq``, ``log_ratio_max``,
``log_ratio_min``: float32 pairs ``[hi, lo]`` whose float64 sum is the value, :func:`float_data`;
fields: :data:`cliptrack.core.keys.DATUM_MEASURE_FIELDS`). The values are written and read by
:mod:`cliptrack.adapters.shared.wire`, shared by every stack (tinker's ``TensorData``, or its
stand-in :class:`~cliptrack.adapters.shared.wire.WireTensor` without tinker).

JSON form of one value (what a REST frontend returns, and what tinker's own pydantic
``TensorData`` model dumps): ``{"data": [3], "dtype": "int64", "shape": [1]}``.
Protobuf form: tinker's ``tinker_public.ForwardBackwardOutput`` (one ``ArrayRecord`` whose fields
are ``BatchedTensor`` columns), which tinker >= 0.38 clients require for this response type and
decode with ``tinker.proto.response_conv.deserialize_forward_backward_output``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from cliptrack.adapters._compat import tinker as tinker_compat
from cliptrack.adapters._compat.tinker import HAVE_TINKER
from cliptrack.adapters.shared.merge import ForwardBackwardOutput
from cliptrack.adapters.shared.wire import (
    FLOAT32_MAX,
    WIRE_DTYPES,
    WireTensor,
    count_data,
    float_data,
    read_array,
    read_count,
    read_float,
    tensor_data,
)
from cliptrack.core.outputs import read_output

__all__ = [
    "FLOAT32_MAX",
    "WIRE_DTYPES",
    "WireTensor",
    "count_data",
    "float_data",
    "output_from_json",
    "output_to_json",
    "output_to_proto",
    "read_array",
    "read_count",
    "read_float",
    "tensor_data",
    "tensor_to_json",
]
"""The value helpers live in :mod:`cliptrack.adapters.shared.wire` (every stack's); the output's
JSON and protobuf forms here."""


# ---- JSON ---------------------------------------------------------------------------------------
def tensor_to_json(value: object, where: str = "value") -> dict[str, Any]:
    """The JSON dict of one per-datum value: ``{"data": [...], "dtype": ..., "shape": [...]}``."""
    array, dtype = read_array(value, where)
    if dtype is None:
        dtype = "int64" if np.issubdtype(array.dtype, np.integer) else "float32"
    np_dtype = np.int64 if dtype == "int64" else np.float32
    array = np.asarray(array, dtype=np_dtype)
    return {"data": array.reshape(-1).tolist(), "dtype": dtype, "shape": list(array.shape)}


def output_to_json(output: object) -> dict[str, Any]:
    """A ForwardBackwardOutput (ours, tinker's, or already a dict) as a JSON-ready dict."""
    parts = read_output(output)
    return {
        "loss_fn_output_type": parts.loss_fn_output_type,
        "loss_fn_outputs": [
            {name: tensor_to_json(v, f"loss_fn_outputs[{i}][{name!r}]") for name, v in datum.items()}
            for i, datum in enumerate(parts.loss_fn_outputs)
        ],
        "metrics": {k: float(v) for k, v in parts.metrics.items()},
    }


def output_from_json(payload: Mapping[str, Any]) -> ForwardBackwardOutput:
    """Parse the JSON dict of a ForwardBackwardOutput into the typed form (TensorData values).

    With tinker installed each value is validated by tinker's own pydantic ``TensorData`` model
    (dtype literal, no unknown fields) before it becomes a ``tinker.types.TensorData``.
    """
    if not isinstance(payload, Mapping):
        raise ValueError(f"ForwardBackwardOutput JSON must be a dict, got {type(payload).__name__}")
    parts = read_output(payload, "ForwardBackwardOutput JSON")
    typed = []
    for i, datum in enumerate(parts.loss_fn_outputs):
        if not isinstance(datum, Mapping):
            raise ValueError(f"loss_fn_outputs[{i}] must be a dict of field -> TensorData JSON")
        typed.append(
            {name: _typed(value, f"loss_fn_outputs[{i}][{name!r}]") for name, value in datum.items()}
        )
    return ForwardBackwardOutput(
        loss_fn_output_type=parts.loss_fn_output_type,
        loss_fn_outputs=typed,
        metrics={k: float(v) for k, v in parts.metrics.items()},
    )


def _typed(value: object, where: str) -> Any:
    if HAVE_TINKER and isinstance(value, Mapping):
        try:
            model = tinker_compat.tensor_data_model().model_validate(dict(value))
        except ValueError as exc:
            raise ValueError(f"{where} is not valid TensorData JSON: {exc}") from exc
        return tensor_data(np.asarray(model.to_numpy()))
    array, dtype = read_array(value, where)
    return tensor_data(np.asarray(array, dtype=np.int64 if dtype == "int64" else np.float32))


# ---- protobuf (tinker >= 0.38 clients decode ForwardBackwardOutput only from proto) -------------
def output_to_proto(output: object) -> bytes:
    """Encode a ForwardBackwardOutput as tinker's ``tinker_public.ForwardBackwardOutput`` bytes.

    One ``ArrayRecord`` holds every datum; each field is a ``BatchedTensor`` column whose byte
    ``offsets`` (int64, ``len(datums) + 1`` entries) delimit the datums, with an empty trailing
    shape (each datum's value is 1-D). Every datum must carry the same fields. Needs tinker.
    """
    pb = _proto_module()
    document = output_to_json(output)
    datums: Sequence[Mapping[str, Any]] = document["loss_fn_outputs"]
    proto = pb.ForwardBackwardOutput(loss_fn_output_type=document["loss_fn_output_type"] or "ArrayRecord")
    for key, value in document["metrics"].items():
        proto.metrics[key] = value
    if datums:
        names = _record_fields(datums)
        record = proto.loss_fn_outputs.add(num_datums=len(datums), type_tag="ArrayRecord")
        for name in names:
            _fill_column(pb, record, name, datums)
    return bytes(proto.SerializeToString())


def _proto_module() -> Any:
    """tinker's protobuf module; ImportError saying tinker is needed when it is absent (an
    unsupported tinker version's error passes through as it is)."""
    try:
        return tinker_compat.proto_module()
    except ImportError as exc:  # pragma: no cover - exercised only where tinker is absent
        if isinstance(exc, tinker_compat.UnsupportedVersionError):
            raise
        raise ImportError("output_to_proto needs tinker (pip install 'cliptrack[tinker]')") from exc


def _record_fields(datums: Sequence[Mapping[str, Any]]) -> list[str]:
    """The field names of the one ArrayRecord (those of the first datum, in its order); ValueError
    naming the first datum whose fields differ."""
    names = list(datums[0])
    for i, datum in enumerate(datums):
        if set(datum) != set(names):
            raise ValueError(
                f"loss_fn_outputs[{i}] has fields {sorted(datum)} but loss_fn_outputs[0] has "
                f"{sorted(names)}: one ArrayRecord needs the same fields for every datum"
            )
    return names


def _fill_column(pb: Any, record: Any, name: str, datums: Sequence[Mapping[str, Any]]) -> None:
    """Write field ``name`` of every datum into the record's ``BatchedTensor`` column: the datums' values
    concatenated (int64 or float32 bytes) and their byte ``offsets`` (int64, ``len(datums) + 1``
    entries); ValueError when the datums' dtypes differ."""
    dtypes = {datum[name]["dtype"] for datum in datums}
    if len(dtypes) != 1:
        raise ValueError(f"field {name!r} has mixed dtypes {sorted(dtypes)} across datums")
    dtype = dtypes.pop()
    np_dtype = np.int64 if dtype == "int64" else np.float32
    arrays = [np.asarray(datum[name]["data"], dtype=np_dtype) for datum in datums]
    offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
    column = record.fields[name]
    column.data = b"".join(a.tobytes() for a in arrays)
    column.offsets = offsets.tobytes()
    column.dtype = pb.DTYPE_INT64 if dtype == "int64" else pb.DTYPE_FLOAT32
