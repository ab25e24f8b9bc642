"""Tinker's wire form for per-datum outputs: TensorData values, JSON dicts and protobuf bytes.

A per-datum output (``ForwardBackwardOutput.loss_fn_outputs[i]``) maps a field name to a
TensorData: ``logprobs`` (float32, one entry per target token), the counts ``loss_tokens``,
``clipped_tokens``, ``clipped_low_tokens``, ``clipped_high_tokens`` and ``ratio_outside_tokens``
(int64, shape ``[1]``, in tokens) and the gauge's float measures of the datum's sequence
(``log_ratio``, ``abs_log_ratio``, ``kl_k3``, ``is_weight``, ``is_weight_sq``, ``log_ratio_max``,
``log_ratio_min``: float32 pairs ``[hi, lo]`` whose float64 sum is the value, :func:`float_data`;
fields: :data:`cliptrack.core.keys.DATUM_MEASURE_FIELDS`). With tinker installed these are ``tinker.types.TensorData``; without it, the
:class:`WireTensor` dataclass with the same ``data`` / ``dtype`` / ``shape`` fields.

JSON form of one value (what a REST frontend returns, and what tinker's own pydantic
``TensorData`` model dumps): ``{"data": [3], "dtype": "int64", "shape": [1]}``.
Protobuf form: tinker's ``tinker_public.ForwardBackwardOutput`` (one ``ArrayRecord`` whose fields
are ``BatchedTensor`` columns), which tinker >= 0.38 clients require for this response type and
decode with ``tinker.proto.response_conv.deserialize_forward_backward_output``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cliptrack.adapters._compat import tinker as tinker_compat
from cliptrack.adapters._compat.tinker import HAVE_TINKER
from cliptrack.adapters._compat.tinker import TensorData as _TinkerTensorData
from cliptrack.adapters.losses.output import ForwardBackwardOutput
from cliptrack.core.outputs import read_output
from cliptrack.core.sums import as_count

WIRE_DTYPES = ("int64", "float32")
"""The dtypes of Tinker's public wire (``TensorDtype``)."""


@dataclass(frozen=True)
class WireTensor:
    """Stand-in for ``tinker.types.TensorData`` where tinker is not installed.

    ``data``: flattened values; ``dtype``: "int64" or "float32"; ``shape``: dimensions.
    """

    data: list[Any]
    dtype: str
    shape: list[int] = field(default_factory=list)

    def to_numpy(self) -> np.ndarray:
        return np.asarray(self.data, dtype=np.int64 if self.dtype == "int64" else np.float32).reshape(
            self.shape
        )


def tensor_data(array: np.ndarray) -> Any:
    """Wrap a host array as tinker's TensorData (or :class:`WireTensor` without tinker).

    ``array`` must be int64 or float32 (the wire's dtypes); its shape is kept.
    """
    if array.dtype == np.int64:
        dtype = "int64"
    elif array.dtype == np.float32:
        dtype = "float32"
    else:
        raise TypeError(f"wire arrays are int64 or float32, got {array.dtype}")
    if _TinkerTensorData is not None:
        return _TinkerTensorData(data=array, dtype=dtype, shape=list(array.shape))
    return WireTensor(data=array.reshape(-1).tolist(), dtype=dtype, shape=list(array.shape))


def count_data(count: int) -> Any:
    """A token count as an int64 TensorData of shape ``[1]``."""
    return tensor_data(np.asarray([count], dtype=np.int64))


FLOAT32_MAX = float(np.finfo(np.float32).max)
"""Largest finite float32: a measured float beyond it cannot travel on the wire."""


def float_data(value: float, where: str = "value") -> Any:
    """A measured float (float64 on the host) as a float32 TensorData pair ``[hi, lo]``, shape ``[2]``.

    The wire carries only int64 and float32; ``hi`` is the float32 rounding of ``value`` and ``lo``
    the float32 rounding of the rest, so ``hi + lo`` (added in float64, :func:`read_float`) is
    ``value`` to within 2**-48 of its magnitude, and ``hi`` alone is its float32 value. ValueError,
    naming ``where``, for a non-finite value or one beyond float32's range (a sequence whose
    ``is_weight_sq`` exceeds 3.4e38 holds a token with a ratio above e**44: a bad input).
    """
    number = float(value)
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        raise ValueError(f"{where} = {number!r} cannot travel as float32 (finite, |x| <= {FLOAT32_MAX:.3e})")
    hi = np.float32(number)
    lo = np.float32(number - float(hi))
    return tensor_data(np.asarray([hi, lo], dtype=np.float32))


def read_float(value: object, where: str) -> float:
    """A measured float from a per-datum value: the sum (in float64) of its one or two elements
    (:func:`float_data`'s ``[hi, lo]``, or a single float from another producer)."""
    array, dtype = read_array(value, where)
    if dtype is not None and dtype != "float32":
        raise ValueError(f"{where} must be a float32 value, got dtype {dtype!r}")
    if array.size not in (1, 2):
        raise ValueError(f"{where} must hold one value or a [hi, lo] pair, got {array.size} values")
    try:
        parts = [float(v) for v in array.reshape(-1)]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} must hold numbers: {exc}") from exc
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def read_array(value: object, where: str) -> tuple[np.ndarray, str | None]:
    """Host array and wire dtype (``None`` when the value carries none) of a per-datum value.

    Accepts tinker's TensorData (dataclass or pydantic model), :class:`WireTensor`, the JSON dict
    form, numpy arrays, torch tensors, lists and plain numbers. ``where`` names the value in errors.
    """
    if isinstance(value, Mapping):
        return _read_json_tensor(value, where)
    if hasattr(value, "to_numpy") and hasattr(value, "dtype") and isinstance(value.dtype, str):
        if value.dtype not in WIRE_DTYPES:
            raise ValueError(f"{where} has dtype {value.dtype!r}; the wire carries only {WIRE_DTYPES}")
        return np.asarray(value.to_numpy()), value.dtype
    if isinstance(value, np.ndarray):
        return value, None
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor, without importing torch
        return value.detach().cpu().numpy(), None
    if isinstance(value, (list, tuple)):
        return np.asarray(value), None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return np.asarray([value]), None
    raise TypeError(
        f"{where} must be a TensorData, its JSON dict {{'data', 'dtype', 'shape'}}, an array or a "
        f"number; got {type(value).__name__}"
    )


def _read_json_tensor(value: Mapping[str, Any], where: str) -> tuple[np.ndarray, str | None]:
    missing = [k for k in ("data", "dtype") if k not in value]
    if missing:
        raise ValueError(
            f"{where} is a dict without {missing}: expected TensorData JSON {{'data', 'dtype', 'shape'}}"
        )
    dtype = value["dtype"]
    if dtype not in WIRE_DTYPES:
        raise ValueError(f"{where} has dtype {dtype!r}; the wire carries only {WIRE_DTYPES}")
    if value.get("sparse_crow_indices") is not None:
        if not HAVE_TINKER:
            raise ValueError(f"{where} is sparse CSR TensorData; reading it needs tinker installed")
        model = tinker_compat.tensor_data_model()
        return np.asarray(model.model_validate(dict(value)).to_numpy()), dtype
    data = value["data"]
    if not isinstance(data, list):
        raise ValueError(f"{where}['data'] must be a list of numbers, got {type(data).__name__}")
    array = np.asarray(data, dtype=object)
    shape = value.get("shape")
    if shape is not None:
        if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ValueError(f"{where} has shape {shape!r}; expected a list of dimensions (ints >= 0)")
        if math.prod(shape) != array.size:
            raise ValueError(f"{where} has {array.size} values but shape {shape}")
        array = array.reshape(shape)
    return array, dtype


def read_count(value: object, where: str) -> int:
    """An exact token count from a per-datum value (one element, int64 or a whole number)."""
    array, dtype = read_array(value, where)
    if dtype is not None and dtype != "int64":
        raise ValueError(f"{where} must be an int64 token count, got dtype {dtype!r}")
    if array.size != 1:
        raise ValueError(f"{where} must hold exactly one token count, got {array.size} values")
    item = array.reshape(-1)[0]
    if isinstance(item, np.generic):
        item = item.item()
    return as_count(where, item)


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
