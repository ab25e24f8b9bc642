"""The runtime side: the loss of one forward_backward request, with per-datum clip counts.

A Miles runtime serving Tinker's API receives a request of N datums and a loss name; its model
produces, for each datum, the current policy's log-probs of the target tokens. This module is the
loss side of that runtime (not a model): :func:`forward_backward_loss` takes the datums' inputs and
those log-prob tensors, computes each datum's loss with :mod:`cliptrack.adapters.losses.builtin`, and returns the
differentiable total loss plus the ``ForwardBackwardOutput`` the runtime sends back, whose
``loss_fn_outputs[i]`` carry ``logprobs`` and the datum's exact token counts (see
:mod:`cliptrack.adapters.miles.wire`).

All counts stay on the device until one stacked device-to-host transfer per request, where the
loss inputs' validity (``LossOutput.invalid``) is checked too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import formulas
from cliptrack.adapters.losses import worst as worst_rows
from cliptrack.adapters.losses.inputs import OLD
from cliptrack.adapters.losses.output import ForwardBackwardOutput
from cliptrack.adapters.shared.datums import datum_fields, datum_outputs, sum_datums
from cliptrack.adapters.shared.merge import aggregate_datums, measured_sums
from cliptrack.adapters.shared.stack import StackCall
from cliptrack.adapters.shared.wire import count_data, read_array
from cliptrack.core import keys, measures
from cliptrack.core.sums import MeasuredSums
from torch import Tensor

__all__ = [
    "OUTPUT_TYPE",
    "STACK",
    "MilesStack",
    "RequestResult",
    "datum_fields",
    "datum_outputs",
    "forward_backward_loss",
]

OUTPUT_TYPE = "ArrayRecord"
"""``loss_fn_output_type`` of the outputs built here (the class name Tinker's proto path reports)."""


@dataclass(frozen=True)
class RequestResult:
    """What :func:`forward_backward_loss` returns for one request.

    ``loss``: 0-dim sum over datums of each datum's ``loss:sum`` (sum of per-token losses over
    its eligible tokens); differentiable with respect to the log-prob tensors, for the runtime's
    ``backward()``. ``output``: the ``ForwardBackwardOutput`` to send back (host values only).
    """

    loss: Tensor
    output: ForwardBackwardOutput


def forward_backward_loss(
    datums: Sequence[object],
    logprobs: Sequence[Tensor],
    loss_fn: str,
    loss_fn_config: Mapping[str, float] | None = None,
    *,
    probe: bool = False,
    declaration: measures.Declaration = measures.DEFAULT,
) -> RequestResult:
    """Per-datum losses and counts of one forward_backward request of ``N = len(datums)`` datums.

    ``declaration``: what the loss measures (passed to it as ``declaration=`` when it is not the
    default one): every measure of it travels as a per-datum field and a metric.

    ``datums[i]``: a ``tinker.Datum``, its JSON dict (``{"loss_fn_inputs": {...}}``) or the
    ``loss_fn_inputs`` mapping itself; values are TensorData, their JSON dicts, arrays or tensors.
    Fields read (per token, the shape of ``logprobs[i]``):

    - ``ppo`` / ``cispo`` / ``importance_sampling`` / ``dro``: ``logprobs`` (the sampler's
      log-probs), ``advantages``; optional ``mask`` (else ``weights``) with 0/1 entries marking
      the eligible tokens (all tokens when neither is given);
    - ``cross_entropy``: ``weights``; optional ``mask``;
    - ``ppo`` / ``cispo``: optional ``clip_low_threshold`` / ``clip_high_threshold``, per token or
      one value (shape ``[]`` or ``[1]``), overriding ``loss_fn_config`` for that datum;
    - ``target_tokens`` is optional; when present its length must match ``logprobs[i]``.

    Those are the fields the loss's registry entry declares (:class:`cliptrack.adapters.losses.builtin.TensorInput`
    ``datum_fields``, :class:`cliptrack.adapters.losses.builtin.Option` ``per_datum``); a registered loss runs here
    with no other change.

    ``logprobs[i]``: the current policy's log-probs of datum i's target tokens (floating tensor,
    with grad; all on one device). ``loss_fn``: a registered loss name (:data:`cliptrack.adapters.losses.builtin.LOSSES`).
    ``loss_fn_config``: e.g. ``{"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}`` or
    ``{"beta": 0.1}`` for ``dro`` (required there).

    Returns :class:`RequestResult`. ``output.loss_fn_outputs[i]`` holds ``logprobs`` (float32, the
    shape of ``logprobs[i]``), ``loss_tokens`` and, for losses that clip, ``clipped_tokens``,
    ``clipped_low_tokens``, ``clipped_high_tokens`` (int64, shape ``[1]``, in tokens).
    ``output.metrics`` holds ``loss:sum``, ``loss_tokens:sum`` and, for losses that clip, the clip
    counts and ``clip_fraction:mean`` (when any token was eligible). Raises ValueError naming the
    datum and input for bad inputs (checked on device, raised at the one host transfer).

    ``probe=True`` (a paired probe, :func:`cliptrack.compare.probe.compare_outputs`): each datum's
    output also carries ``loss`` (its ``loss:sum``, a float32 ``[hi, lo]`` pair) and, for ``ppo``
    and ``cispo``, ``clip_sides`` (int64, the shape of its logprobs: -1 clipped below the band, +1
    above, 0 elsewhere; :data:`cliptrack.core.keys.DATUM_CLIP_SIDES`), in the same one transfer.
    """
    if loss_fn not in losses.LOSSES:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; the registered losses are {sorted(losses.LOSSES)}")
    spec = losses.loss_spec(loss_fn)
    assert spec is not None
    config = _check_config(spec, loss_fn_config)
    datums = list(datums)
    logprobs = list(logprobs)
    if len(datums) != len(logprobs):
        raise ValueError(
            f"got {len(datums)} datums but {len(logprobs)} logprobs tensors: one per datum is needed"
        )
    device = logprobs[0].device if logprobs else torch.device("cpu")
    outs, sides = _datum_losses(spec, datums, logprobs, config, device, probe, declaration)
    if not outs:
        return _no_datums_result(spec, device, declaration)

    ids = _datum_ids(spec, datums, logprobs, outs) if spec.gauge else None
    sums, flat_logprobs, flat_sides, worst_tokens = _host_sums(outs, logprobs, declaration, sides, ids)
    shapes = [tuple(lp.shape) for lp in logprobs]
    loss_fn_outputs = datum_outputs(shapes, sums, flat_logprobs, flat_sides, probe=probe)
    if ids is not None and worst_tokens is not None:
        _add_ids(loss_fn_outputs, sums, [datum_id for datum_id, _ in ids], worst_tokens)
    total = sum_datums([datum.counts for datum in sums], declaration=declaration)
    assert total is not None
    metrics = {keys.LOSS_SUM: math.fsum(datum.loss_sum for datum in sums), **total.to_metrics()}
    loss = torch.stack([o.loss for o in outs]).sum()
    return RequestResult(
        loss=loss,
        output=ForwardBackwardOutput(
            loss_fn_output_type=OUTPUT_TYPE, loss_fn_outputs=loss_fn_outputs, metrics=metrics
        ),
    )


def _datum_losses(
    spec: losses.LossSpec,
    datums: Sequence[object],
    logprobs: Sequence[Tensor],
    config: Mapping[str, float],
    device: torch.device,
    probe: bool = False,
    declaration: measures.Declaration = measures.DEFAULT,
) -> tuple[list[losses.LossOutput], list[Tensor] | None]:
    """Each datum's loss output, on device (no sync): its log-probs checked (a floating tensor on
    ``device``, that of ``logprobs[0]``), then its inputs read and its loss computed; an error names
    the datum. With ``probe`` and a loss of :data:`formulas.CLIP_SIDE_LOSSES`, each datum's per-token
    clip sides too (else ``None``)."""
    outs: list[losses.LossOutput] = []
    sides: list[Tensor] | None = [] if probe and spec.name in formulas.CLIP_SIDE_LOSSES else None
    for i, (datum, lp) in enumerate(zip(datums, logprobs, strict=True)):
        if not isinstance(lp, Tensor) or not lp.is_floating_point():
            raise TypeError(f"logprobs[{i}] must be a floating-point torch.Tensor, got {type(lp).__name__}")
        if lp.device != device:
            raise ValueError(f"logprobs[{i}] is on {lp.device} but logprobs[0] is on {device}")
        inputs = _loss_fn_inputs(datum, i)
        try:
            outs.append(_datum_loss(spec, inputs, lp, config, declaration))
            if sides is not None:
                sides.append(_datum_sides(spec, inputs, lp, config))
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"datum {i}: {exc}") from exc
    return outs, sides


def _no_datums_result(
    spec: losses.LossSpec, device: torch.device, declaration: measures.Declaration
) -> RequestResult:
    """The result of a request of no datum: a zero loss on ``device``, no per-datum output, the
    metrics of no token for ``spec``'s loss (``loss:sum`` 0, zero counts in tokens)."""
    metrics = {keys.LOSS_SUM: 0.0, **_no_tokens(spec, declaration).to_metrics()}
    return RequestResult(
        loss=torch.zeros((), device=device),
        output=ForwardBackwardOutput(loss_fn_output_type=OUTPUT_TYPE, loss_fn_outputs=[], metrics=metrics),
    )


def _host_sums(
    outs: list[losses.LossOutput],
    logprobs: list[Tensor],
    declaration: measures.Declaration,
    sides: list[Tensor] | None = None,
    ids: list[tuple[int, Tensor]] | None = None,
) -> tuple[list[losses.PackedSums], np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The one device-to-host transfer of a request: each datum's unpacked sums (the inputs'
    validity checked, ValueError naming the datum), every datum's log-probs, flat, float32,
    (given ``sides``) every datum's clip sides, flat, int64, and (given ``ids``) each datum's worst
    token position."""
    positions = None if ids is None else [position for _, position in ids]
    host = _to_host(outs, logprobs, sides, positions)
    n = len(outs)
    width = len(declaration.packed_fields)
    rows = host[: n * width].reshape(n, width)
    sums = [losses.unpack(row.tolist(), f"datum {i}", declaration) for i, row in enumerate(rows)]
    _raise_invalid(sums, outs)
    tokens = sum(lp.numel() for lp in logprobs)
    end = n * width + tokens
    flat_logprobs = host[n * width : end].astype(np.float32)
    flat_sides = None
    if sides is not None:
        flat_sides = host[end : end + tokens].astype(np.int64)
        end += tokens
    worst_tokens = None if ids is None else host[end : end + n].astype(np.int64)
    return sums, flat_logprobs, flat_sides, worst_tokens


def _no_tokens(spec: losses.LossSpec, declaration: measures.Declaration) -> MeasuredSums:
    """The measured sums of no token for ``spec``'s loss: zero counts, zero gauge sums, no extreme."""
    groups = {measures.EVERY}
    groups |= {measures.CLIP} if spec.clips else set()
    groups |= {measures.SPLIT} if spec.splits else set()
    groups |= {measures.GAUGE} if spec.gauge else set()
    zeros = {m.key: 0 for m in measures.DATUM_MEASURES if m.group in groups and m.reduction == measures.SUM}
    return MeasuredSums(zeros, declaration=declaration)


def _check_config(spec: losses.LossSpec, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request's ``loss_fn_config`` checked against the loss's declared options: a number, or
    one of a word-valued option's choices (``clip_reference``)."""
    config = dict(config or {})
    defaults = spec.option_defaults
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise ValueError(
            f"loss_fn_config keys {unknown} are not used by {spec.name!r} "
            f"(it accepts {list(defaults) or 'none'})"
        )
    choices = {option.name: option.choices for option in spec.options if option.choices}
    for key, value in config.items():
        _check_option_value(key, value, choices.get(key, ()))
    missing = [key for key, default in defaults.items() if default is losses.REQUIRED and key not in config]
    if missing:
        raise ValueError(
            f"loss_fn {spec.name!r} needs " + " and ".join(f"loss_fn_config[{key!r}]" for key in missing)
        )
    return {k: v if k in choices else float(v) for k, v in config.items()}


def _check_option_value(key: str, value: object, choices: tuple[str, ...]) -> None:
    """ValueError naming ``loss_fn_config[key]`` unless it is one of ``choices`` (a word-valued
    option) or, without choices, a finite number."""
    if choices:
        if value not in choices:
            raise ValueError(f"loss_fn_config[{key!r}] must be one of {choices}, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")


def _loss_fn_inputs(datum: object, i: int) -> Mapping[str, object]:
    inputs = getattr(datum, "loss_fn_inputs", None)
    if inputs is None and isinstance(datum, Mapping):
        inputs = datum.get("loss_fn_inputs", datum)
    if not isinstance(inputs, Mapping):
        raise TypeError(
            f"datum {i} must be a tinker Datum, its JSON dict or a loss_fn_inputs mapping; "
            f"got {type(datum).__name__}"
        )
    return inputs


def _input(inputs: Mapping[str, object], name: str, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Input ``name`` as a detached tensor on ``like``'s device, in ``dtype`` (default: ``like``'s)."""
    value = inputs[name]
    if isinstance(value, Tensor):
        tensor = value.detach()
    else:
        where = f"loss_fn_inputs[{name!r}]"
        array, _ = read_array(value, where)
        try:
            numbers = np.asarray(array, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where} must hold numbers: {exc}") from exc
        tensor = torch.from_numpy(numbers)
    return tensor.to(device=like.device, dtype=like.dtype if dtype is None else dtype)


def _datum_loss(
    spec: losses.LossSpec,
    inputs: Mapping[str, object],
    lp: Tensor,
    config: Mapping[str, float],
    declaration: measures.Declaration = measures.DEFAULT,
) -> losses.LossOutput:
    """One datum's loss: the spec's tensor inputs read from their datum fields, its options from
    the datum (per-datum ones), else the request's config, else their defaults."""
    tensors = _datum_tensors(spec, inputs, lp)
    _check_target_tokens(inputs, lp)
    options = _datum_options(spec, inputs, lp, config)
    extra = {} if declaration is measures.DEFAULT else {"declaration": declaration}
    return spec.check_output(spec.fn(lp, **tensors, **options, **extra))


def _datum_sides(
    spec: losses.LossSpec, inputs: Mapping[str, object], lp: Tensor, config: Mapping[str, float]
) -> Tensor:
    """One datum's per-token clip sides (:func:`formulas.clip_sides`) from the inputs and options its
    loss read (thresholds per datum, else the request's, else the defaults)."""
    tensors = _datum_tensors(spec, inputs, lp)
    options = _datum_options(spec, inputs, lp, config)
    reference = (
        tensors["old_logprobs"] if options.get("clip_reference") == OLD else tensors["sampling_logprobs"]
    )
    return formulas.clip_sides(
        spec.name,
        lp,
        reference,
        tensors["advantages"],
        tensors.get("mask"),
        options["clip_low_threshold"],
        options["clip_high_threshold"],
    )


def _datum_tensors(spec: losses.LossSpec, inputs: Mapping[str, object], lp: Tensor) -> dict[str, Tensor]:
    """The spec's tensor inputs, each read from the first of its fields the datum has; ValueError
    naming every required input the datum lacks."""
    tensors: dict[str, Tensor] = {}
    missing = []
    for tensor_input in spec.inputs:
        name = next((f for f in tensor_input.fields if f in inputs), None)
        if name is not None:
            tensor = _input(inputs, name, lp, torch.float64 if tensor_input.exact else None)
            if tensor_input.per_datum and tensor.numel() == 1 and lp.numel() != 1:
                tensor = tensor.reshape(()).expand(lp.shape)  # one value for the datum's tokens
            tensors[tensor_input.name] = tensor
        elif tensor_input.required:
            missing.append(tensor_input.fields[0])
    if missing:
        raise ValueError(f"loss_fn_inputs lacks {missing}, needed by {spec.name!r} (it has {sorted(inputs)})")
    return tensors


def _check_target_tokens(inputs: Mapping[str, object], lp: Tensor) -> None:
    """ValueError unless the datum's ``target_tokens`` (when given) has one entry per log-prob."""
    if "target_tokens" not in inputs:
        return
    targets = inputs["target_tokens"]
    size = targets.numel() if isinstance(targets, Tensor) else read_array(targets, "target_tokens")[0].size
    if size != lp.numel():
        raise ValueError(
            f"target_tokens has {size} entries but the policy's logprobs tensor has "
            f"{lp.numel()}: one log-prob per target token is needed"
        )


def _datum_options(
    spec: losses.LossSpec, inputs: Mapping[str, object], lp: Tensor, config: Mapping[str, float]
) -> dict[str, float | Tensor]:
    """The spec's options: per-datum values from the datum, else the request's config, else the
    option's default (an option with none of these is left out)."""
    options: dict[str, float | Tensor] = {}
    for option in spec.options:
        if option.per_datum and option.name in inputs:
            options[option.name] = _per_datum_option(inputs, option.name, lp)
        elif option.name in config:
            options[option.name] = config[option.name]
        elif option.default is not losses.REQUIRED:
            options[option.name] = option.default
    return options


def _per_datum_option(inputs: Mapping[str, object], name: str, lp: Tensor) -> Tensor:
    """A per-datum option value: one value (shape ``[]`` or ``[1]``) or one per token."""
    tensor = _input(inputs, name, lp)
    if tensor.dim() > 0 and tuple(tensor.shape) != (1,) and tensor.shape != lp.shape:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}; per-datum values are one value "
            f"(shape [] or [1]) or one per token {tuple(lp.shape)}"
        )
    return tensor


def _to_host(
    outs: list[losses.LossOutput],
    logprobs: list[Tensor],
    sides: list[Tensor] | None = None,
    positions: list[Tensor] | None = None,
) -> np.ndarray:
    """Every datum's packed output (:data:`cliptrack.adapters.losses.builtin.PACKED_FIELDS`), then every log-prob,
    then (given) every datum's clip sides, then (given) every datum's worst token position: ONE
    device-to-host copy.

    Values travel as float64: counts are exact below 2**53 tokens, float32 log-probs exactly.
    """
    rows = torch.stack([losses.pack(out) for out in outs])
    flat = [rows.reshape(-1)] + [lp.detach().reshape(-1).to(losses.PACKED_DTYPE) for lp in logprobs]
    flat += [side.reshape(-1).to(losses.PACKED_DTYPE) for side in sides or ()]
    flat += [p.reshape(-1).to(losses.PACKED_DTYPE) for p in positions or ()]
    return torch.cat(flat).cpu().numpy()


def _add_ids(
    loss_fn_outputs: list[dict[str, Any]],
    sums: Sequence[losses.PackedSums],
    ids: Sequence[int],
    worst_tokens: np.ndarray,
) -> None:
    """Each datum's ``datum_id`` and ``worst_token`` fields (``-1`` without an eligible token)."""
    for out, datum, datum_id, position in zip(loss_fn_outputs, sums, ids, worst_tokens, strict=True):
        out[keys.DATUM_ID] = count_data(datum_id)
        out[keys.DATUM_WORST_TOKEN] = count_data(int(position) if datum.counts.loss_tokens else -1)


def _datum_ids(
    spec: losses.LossSpec,
    datums: Sequence[object],
    logprobs: Sequence[Tensor],
    outs: Sequence[losses.LossOutput],
) -> list[tuple[int, Tensor]] | None:
    """Each datum's id (its ``datum_id`` input) and the position of its worst token, a 1-element
    device tensor (:func:`cliptrack.adapters.losses.worst.worst_token` of the inputs its loss read,
    kept in its output's ``sources``, read again only for a loss that keeps none; no sync); ``None``
    when no datum has an id. ValueError naming the datum when only some have one, or one is not an
    integer."""
    inputs = [_loss_fn_inputs(datum, i) for i, datum in enumerate(datums)]
    given = [keys.DATUM_ID in i for i in inputs]
    if not any(given):
        return None
    if not all(given):
        missing = [i for i, has in enumerate(given) if not has][:5]
        raise ValueError(
            f"datums {missing} have no {keys.DATUM_ID!r} while others do: give every datum its id"
        )
    out = []
    for i, (datum_inputs, lp, loss) in enumerate(zip(inputs, logprobs, outs, strict=True)):
        kept = loss.sources[0] if len(loss.sources) == 1 else {}
        read = kept if "sampling_logprobs" in kept else _datum_tensors(spec, datum_inputs, lp)
        position = worst_rows.worst_token(lp, read["sampling_logprobs"], read.get("mask"))
        out.append((_datum_id(datum_inputs[keys.DATUM_ID], i), position))
    return out


def _datum_id(value: object, i: int) -> int:
    """A datum's ``datum_id`` input as an int (a number, or a one-element array / TensorData)."""
    where = f"datum {i}: loss_fn_inputs[{keys.DATUM_ID!r}]"
    if isinstance(value, Tensor):
        values = value.reshape(-1).tolist()
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        values = [int(value)]
    else:
        array, _ = read_array(value, where)
        values = np.asarray(array).reshape(-1).tolist()
    if len(values) != 1 or isinstance(values[0], bool) or not _whole(values[0]):
        raise ValueError(f"{where} must be one integer, got {value!r}")
    if int(values[0]) < 0:
        raise ValueError(
            f"{where} must be an integer >= 0 (e.g. the sample's index in the batch), got {value!r}"
        )
    return int(values[0])


def _whole(number: object) -> bool:
    """Whether ``number`` is an integer, or a float without a fraction (below 2**53: exact)."""
    if isinstance(number, int):
        return True
    return isinstance(number, float) and number.is_integer() and abs(number) < 2**53


def _raise_invalid(sums: list[losses.PackedSums], outs: list[losses.LossOutput]) -> None:
    """Raise ValueError naming each datum whose loss inputs were flagged on device."""
    problems = []
    for i, (datum, out) in enumerate(zip(sums, outs, strict=True)):
        try:
            datum.check(out.sources)
        except ValueError as exc:
            problems.append(f"datum {i}: {exc}")
    if problems:
        raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class MilesStack:
    """The Miles runtime as a :class:`cliptrack.adapters.shared.stack.Stack`: the loss hook is
    :func:`forward_backward_loss` on one request (each row of ``[sequences, tokens]`` inputs a
    datum, the sampler's log-probs as its ``logprobs`` field), the reduction the client's exact
    per-datum sums (:func:`cliptrack.adapters.shared.merge.aggregate_datums`), the read-back the
    output's measured sums; the measures: ``declaration``'s."""

    name: str = "miles"
    declaration: measures.Declaration = measures.DEFAULT

    def loss_hook(
        self, loss_fn: str, logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]
    ) -> StackCall:
        rows = logprobs.reshape(1, -1) if logprobs.dim() == 1 else logprobs
        fields = {
            ("logprobs" if name == "sampling_logprobs" else name): value for name, value in inputs.items()
        }
        datums = [
            {name: value.reshape(rows.shape)[i].detach() for name, value in fields.items()}
            for i in range(rows.shape[0])
        ]
        result = forward_backward_loss(
            datums, list(rows.unbind(0)), loss_fn, dict(config), declaration=self.declaration
        )
        return StackCall(result.loss, result.output)

    def reduce(self, reports: Sequence[Any]) -> ForwardBackwardOutput:
        return ForwardBackwardOutput(
            loss_fn_output_type=OUTPUT_TYPE,
            loss_fn_outputs=[],
            metrics=aggregate_datums(list(reports), self.declaration),
        )

    def read_back(self, output: object) -> MeasuredSums | None:
        return measured_sums(output, self.declaration)


STACK = MilesStack()
"""The Miles runtime as a stack (:class:`MilesStack`)."""
