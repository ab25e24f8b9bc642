"""The paired probe's inputs: each output's per-datum fields read into arrays and checked.

:func:`read_datums` takes one ``ForwardBackwardOutput`` (any of the forms
:func:`cliptrack.core.outputs.read_output` reads) or the path of its JSON file, and returns its
datums' columns (:class:`Datums`). Every value is checked against what it measures, and a bad one
is refused with a ValueError naming the output (the file), the datum and the field:

- ``logprobs``: finite, one per token of the datum (its length is the datum's token count);
- ``loss_tokens``, ``clipped_tokens``: one whole number >= 0 each (``as_count``), at most the
  datum's tokens and at most its eligible tokens (``loss_tokens``) respectively;
- ``clip_sides``: one entry per token (``logprobs``' length), as many nonzero as the datum's
  ``clipped_tokens``;
- the gauge's sums (``kl_k3``, ``abs_log_ratio``: sums of non-negative terms) >= 0, one value or a
  ``[hi, lo]`` pair; where the datum carries them, ``|log_ratio| <= abs_log_ratio`` and
  ``max(|log_ratio_max|, |log_ratio_min|) <= abs_log_ratio`` (a sum of ``|l|`` holds its largest
  term), within :data:`GAUGE_ROUNDING` of the sum (float32 sums carried as ``[hi, lo]``);
- ``loss``: finite, one value or a pair.

Memory, linear in the input: a file is parsed, read into arrays and its JSON tree freed datum by
datum, one file at a time. A probe of two files peaks at about 3.5 bytes per byte of the larger
file (its text and its JSON tree of Python numbers while it is parsed) plus 9 bytes per token of
both outputs (a float64 log-prob and a clip mark) plus about 1 KB per datum, above the
interpreter's ~30 MB. Measured (peak RSS, ``cliptrack probe``): two files of 38 MB (1.5 M tokens
each) 184 MB, two of 152 MB (6 M tokens each) 651 MB (975 MB when both trees were held at once).
Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableSequence, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from cliptrack.core import keys
from cliptrack.core.outputs import read_output
from cliptrack.core.sums import as_count

__all__ = ["GAUGE_ROUNDING", "Datums", "read_datums"]

KL_K3 = "kl_k3"
ABS_LOG_RATIO = "abs_log_ratio"
LOG_RATIO = "log_ratio"
LOG_RATIO_EXTREMES = ("log_ratio_max", "log_ratio_min")
COUNT_FIELDS = (keys.DATUM_LOSS_TOKENS, keys.DATUM_CLIPPED_TOKENS)
"""Per-datum token counts the probe reads: one whole number >= 0 each."""
FLOAT_FIELDS = (KL_K3, ABS_LOG_RATIO, keys.DATUM_LOSS)
"""Per-datum float sums the probe reads: one value or a ``[hi, lo]`` pair."""
NONNEGATIVE_FIELDS = (KL_K3, ABS_LOG_RATIO)
"""Sums of non-negative terms (k3 terms, ``|l|``): refused below 0."""
GAUGE_ROUNDING = 2.0**-20
"""Relative slack of ``|log_ratio| <= abs_log_ratio`` and ``max |l| <= abs_log_ratio``: the sums
travel as float32 ``[hi, lo]`` pairs of float64 sums and the extremes as float32 values, so the
two sides of an exact inequality may differ by their rounding (far below 2**-20 of the sum)."""


@dataclass(frozen=True)
class Datums:
    """The per-datum columns of one output, each a list with one entry per datum: ``logprobs``
    (float64), ``fields`` by name (a count or float field as a float64 array of its one or two
    values; ``None`` when no datum carries the field), ``clipped`` (per token, whether
    ``clip_sides`` marks it clipped; ``None`` without ``clip_sides``). ``where`` names the output
    in errors (its label, or its file)."""

    where: str
    logprobs: list[np.ndarray]
    fields: dict[str, list[np.ndarray] | None]
    clipped: list[np.ndarray] | None


def read_datums(output: object, where: str) -> Datums:
    """The datums of ``output`` (a ``ForwardBackwardOutput`` in any form, or the path of its JSON
    file: ``str`` or ``os.PathLike``), read and checked (module docstring). ``where`` names the
    output in errors; a file is named by its path. ValueError on bad input."""
    if isinstance(output, (str, os.PathLike)):
        path = os.fspath(output)
        return _read(_load(path), path, owned=True)
    return _read(output, where, owned=False)


def _load(path: str) -> object:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{path}: no such file (a ForwardBackwardOutput as JSON is expected)")
    try:
        text = file.read_text(encoding="utf-8")
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from exc
    except RecursionError:
        raise ValueError(f"{path} is nested too deeply to be a ForwardBackwardOutput") from None


def _read(output: object, where: str, owned: bool) -> Datums:
    """``owned``: the JSON tree is this module's (read from a file): each datum's part of it is
    dropped once read, so the tree and the arrays are never both whole in memory."""
    parts = read_output(output, where)
    datums = parts.loss_fn_outputs
    if not datums:
        raise ValueError(
            f"{where} has no per-datum outputs (loss_fn_outputs is empty): a probe compares datums; run "
            "the Miles runtime with forward_backward_loss(..., probe=True) or build the Megatron loss "
            "with make_loss_func(..., probe=True)"
        )
    names = _present(datums, where)
    logprobs: list[np.ndarray] = []
    fields: dict[str, list[np.ndarray]] = {
        name: [] for name in names if name in (*COUNT_FIELDS, *FLOAT_FIELDS)
    }
    clipped: list[np.ndarray] | None = [] if keys.DATUM_CLIP_SIDES in names else None
    for i in range(len(datums)):
        datum = _datum(datums[i], f"{where}.loss_fn_outputs[{i}]")
        lp, values, marks = _read_datum(datum, names, f"{where}.loss_fn_outputs[{i}]")
        logprobs.append(lp)
        for name, value in values.items():
            fields[name].append(value)
        if clipped is not None and marks is not None:
            clipped.append(marks)
        if owned and isinstance(datums, MutableSequence):
            datums[i] = None  # this datum's JSON is read: freed now
    if keys.DATUM_LOSS_TOKENS not in fields:
        raise ValueError(
            f"{where}'s per-datum outputs carry no {keys.DATUM_LOSS_TOKENS!r}: not cliptrack's datum outputs"
        )
    known: dict[str, list[np.ndarray] | None] = {name: None for name in (*COUNT_FIELDS, *FLOAT_FIELDS)}
    return Datums(where, logprobs, {**known, **fields}, clipped)


_READ_FIELDS = (*COUNT_FIELDS, *FLOAT_FIELDS, keys.DATUM_CLIP_SIDES)
_CHECK_FIELDS = (LOG_RATIO, *LOG_RATIO_EXTREMES)
"""Fields read only to check the gauge's ranges."""


def _present(datums: Sequence[Any], where: str) -> tuple[str, ...]:
    """The fields the datums carry (every datum, or none of them: ValueError naming the first
    datum that lacks one the others carry)."""
    out = []
    for name in (*_READ_FIELDS, *_CHECK_FIELDS):
        present = [isinstance(d, Mapping) and name in d for d in datums]
        if any(present):
            if not all(present):
                i = present.index(False)
                if not isinstance(datums[i], Mapping):
                    _datum(datums[i], f"{where}.loss_fn_outputs[{i}]")
                raise ValueError(f"{where}.loss_fn_outputs[{i}] lacks {name!r}, which other datums carry")
            out.append(name)
    return tuple(out)


def _datum(datum: object, where: str) -> Mapping[str, Any]:
    if not isinstance(datum, Mapping):
        raise ValueError(f"{where} must be a mapping of fields, got {type(datum).__name__}")
    if keys.DATUM_LOGPROBS not in datum:
        raise ValueError(f"{where} has no {keys.DATUM_LOGPROBS!r} (fields: {sorted(map(str, datum))})")
    return datum


def _read_datum(
    datum: Mapping[str, Any], names: Sequence[str], where: str
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
    """One datum's log-probs, fields (by name) and clip marks, checked (module docstring)."""
    logprobs = _finite(_array(datum[keys.DATUM_LOGPROBS], f"{where}.logprobs"), f"{where}.logprobs").reshape(
        -1
    )
    tokens = logprobs.size
    values = {name: _finite(_array(datum[name], f"{where}.{name}"), f"{where}.{name}") for name in names}
    sides = values.pop(keys.DATUM_CLIP_SIDES, None)
    loss_tokens = _count(values, keys.DATUM_LOSS_TOKENS, tokens, "the datum's tokens (its logprobs)", where)
    clipped = _count(values, keys.DATUM_CLIPPED_TOKENS, loss_tokens, "its loss_tokens", where)
    for name in (*FLOAT_FIELDS, *_CHECK_FIELDS):
        if name in values and values[name].size not in (1, 2):
            raise ValueError(
                f"{where}.{name} holds {values[name].size} values: one or a [hi, lo] pair is expected"
            )
    _check_gauge(values, loss_tokens, where)
    marks = None
    if sides is not None:
        marks = sides.reshape(-1) != 0
        if marks.size != tokens:
            raise ValueError(
                f"{where}.clip_sides holds {marks.size} entries but the datum has {tokens} tokens "
                "(its logprobs): one entry per token"
            )
        if clipped is not None and int(marks.sum()) != clipped:
            raise ValueError(
                f"{where}.clip_sides mark {int(marks.sum())} clipped tokens but its clipped_tokens is {clipped}"
            )
    for name in _CHECK_FIELDS:
        values.pop(name, None)
    return logprobs, values, marks


def _count(
    values: Mapping[str, np.ndarray], name: str, bound: int | None, bounded_by: str, where: str
) -> int | None:
    """Field ``name`` as a token count: one whole number >= 0, at most ``bound``; None when absent."""
    if name not in values:
        return None
    value = values[name]
    if value.size != 1:
        raise ValueError(f"{where}.{name} holds {value.size} values: one token count is expected")
    count = as_count(f"{where}.{name}", float(value.reshape(-1)[0]))
    if bound is not None and count > bound:
        raise ValueError(f"{where}.{name} = {count} exceeds {bounded_by} ({bound})")
    return count


def _check_gauge(values: Mapping[str, np.ndarray], loss_tokens: int | None, where: str) -> None:
    """The gauge's sums in their ranges: ``kl_k3``, ``abs_log_ratio`` >= 0; ``|log_ratio|`` and the
    largest ``|l|`` at most ``abs_log_ratio`` (within :data:`GAUGE_ROUNDING`)."""
    sums = {name: float(v.sum()) for name, v in values.items() if name != keys.DATUM_LOSS}
    for name in NONNEGATIVE_FIELDS:
        if name in sums and sums[name] < 0:
            raise ValueError(f"{where}.{name} = {sums[name]!r} is below 0: a sum of non-negative terms")
    if ABS_LOG_RATIO not in sums:
        return
    bound = sums[ABS_LOG_RATIO] * (1 + GAUGE_ROUNDING)
    if LOG_RATIO in sums and abs(sums[LOG_RATIO]) > bound:
        raise ValueError(
            f"{where}.log_ratio = {sums[LOG_RATIO]!r} exceeds abs_log_ratio = {sums[ABS_LOG_RATIO]!r} in size: "
            "|sum of l| <= sum of |l|"
        )
    if loss_tokens == 0:
        return  # no eligible token, no extreme: the wire's placeholder
    for name in LOG_RATIO_EXTREMES:
        if name in sums and abs(sums[name]) > bound:
            raise ValueError(
                f"{where}.{name} = {sums[name]!r} exceeds abs_log_ratio = {sums[ABS_LOG_RATIO]!r} in size: "
                "a sum of |l| holds its largest term"
            )


def _finite(array: np.ndarray, where: str) -> np.ndarray:
    if not np.isfinite(array).all():
        raise ValueError(f"{where} holds a non-finite value")
    return array


def _array(value: object, where: str) -> np.ndarray:
    """A per-datum value as a float64 numpy array: TensorData (tinker's, its stand-in), its JSON dict
    ``{"data", "dtype", "shape"}``, an array, a tensor, a list or a number."""
    if isinstance(value, Mapping) and "data" not in value:
        raise ValueError(
            f"{where} is a dict without 'data': expected TensorData JSON {{'data', 'dtype', 'shape'}}"
        )
    try:
        if isinstance(value, Mapping):
            array = np.asarray(value["data"], dtype=np.float64)
            shape = value.get("shape")
            return array.reshape(shape) if shape is not None else array
        if hasattr(value, "to_numpy"):
            return np.asarray(value.to_numpy(), dtype=np.float64)
        if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch.Tensor, without importing torch
            return np.asarray(value.detach().cpu().numpy(), dtype=np.float64)
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise ValueError(
            f"{where} must be a TensorData, its JSON dict, an array or a number: {exc}"
        ) from None
