"""Tinker's wire values for per-datum outputs: TensorData of counts (int64) and measured floats
(float32 ``[hi, lo]`` pairs), written and read alike by every stack.

With tinker installed the values are ``tinker.types.TensorData``; without it, the
:class:`WireTensor` dataclass with the same ``data`` / ``dtype`` / ``shape`` fields. JSON form of
one value (what a REST frontend returns, and what tinker's own pydantic ``TensorData`` model
dumps): ``{"data": [3], "dtype": "int64", "shape": [1]}``. The output-level JSON and protobuf
forms are the Miles runtime's (:mod:`cliptrack.adapters.miles.wire`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cliptrack.adapters._compat import tinker as tinker_compat
from cliptrack.adapters._compat.tinker import HAVE_TINKER
from cliptrack.adapters._compat.tinker import TensorData as _TinkerTensorData
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
