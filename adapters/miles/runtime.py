"""The runtime side: the loss of one forward_backward request, with per-datum clip counts.

A Miles runtime serving Tinker's API receives a request of N datums and a loss name; its model
produces, for each datum, the current policy's log-probs of the target tokens. This module is the
loss side of that runtime (not a model): :func:`forward_backward_loss` takes the datums' inputs and
those log-prob tensors, computes each datum's loss with :mod:`adapters.losses`, and returns the
differentiable total loss plus the ``ForwardBackwardOutput`` the runtime sends back, whose
``loss_fn_outputs[i]`` carry ``logprobs`` and the datum's exact token counts (see
:mod:`adapters.miles.wire`).

All counts stay on the device until one stacked device-to-host transfer per request, where the
loss inputs' validity (``LossOutput.invalid``) is checked too.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor

from adapters import losses
from adapters.miles.wire import count_data, read_array, tensor_data
from adapters.output import ForwardBackwardOutput
from tracking import keys
from tracking.counts import ClipCounts, token_metrics

THRESHOLD_FIELDS = ("clip_low_threshold", "clip_high_threshold")
"""Per-datum ``loss_fn_inputs`` (and ``loss_fn_config`` keys) holding absolute ratio bounds."""

REQUIRED = inspect.Parameter.empty
"""The default of an option that ``loss_fn_config`` must give."""


def _keyword_options(loss_fn: str) -> dict[str, Any]:
    """The keyword-only parameters of loss ``loss_fn`` -> their defaults (``REQUIRED`` when none)."""
    fn = cast(Callable[..., losses.LossOutput], losses.LOSSES[loss_fn])
    return {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


CONFIG_OPTIONS: dict[str, dict[str, Any]] = {name: _keyword_options(name) for name in losses.LOSSES}
"""The ``loss_fn_config`` keys each loss accepts (its keyword-only parameters) -> their defaults."""

CONFIG_KEYS: dict[str, tuple[str, ...]] = {name: tuple(options) for name, options in CONFIG_OPTIONS.items()}
"""The ``loss_fn_config`` keys each loss accepts."""

DEFAULT_THRESHOLDS: dict[str, tuple[float, float]] = {
    name: (CONFIG_OPTIONS[name][THRESHOLD_FIELDS[0]], CONFIG_OPTIONS[name][THRESHOLD_FIELDS[1]])
    for name in losses.LOSSES
    if name in losses.CLIPPING_LOSSES
}
"""Tinker's default ``(clip_low_threshold, clip_high_threshold)`` of each clipping loss (its signature's)."""

OUTPUT_TYPE = "ArrayRecord"
"""``loss_fn_output_type`` of the outputs built here (the class name Tinker's proto path reports)."""

_STATS = 5  # loss, loss_tokens, clipped, clipped_low, clipped_high (then the invalid vector)


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
) -> RequestResult:
    """Per-datum losses and counts of one forward_backward request of ``N = len(datums)`` datums.

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

    ``logprobs[i]``: the current policy's log-probs of datum i's target tokens (floating tensor,
    with grad; all on one device). ``loss_fn``: a Tinker loss name (:data:`adapters.losses.LOSSES`).
    ``loss_fn_config``: e.g. ``{"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}`` or
    ``{"beta": 0.1}`` for ``dro`` (required there).

    Returns :class:`RequestResult`. ``output.loss_fn_outputs[i]`` holds ``logprobs`` (float32, the
    shape of ``logprobs[i]``), ``loss_tokens`` and, for losses that clip, ``clipped_tokens``,
    ``clipped_low_tokens``, ``clipped_high_tokens`` (int64, shape ``[1]``, in tokens).
    ``output.metrics`` holds ``loss:sum``, ``loss_tokens:sum`` and, for losses that clip, the clip
    counts and ``clip_fraction:mean`` (when any token was eligible). Raises ValueError naming the
    datum and input for bad inputs (checked on device, raised at the one host transfer).
    """
    if loss_fn not in losses.LOSSES:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; Tinker's built-in losses are {sorted(losses.LOSSES)}")
    config = _check_config(loss_fn, loss_fn_config)
    datums = list(datums)
    logprobs = list(logprobs)
    if len(datums) != len(logprobs):
        raise ValueError(
            f"got {len(datums)} datums but {len(logprobs)} logprobs tensors: one per datum is needed"
        )
    outs = []
    device = logprobs[0].device if logprobs else torch.device("cpu")
    for i, (datum, lp) in enumerate(zip(datums, logprobs, strict=True)):
        if not isinstance(lp, Tensor) or not lp.is_floating_point():
            raise TypeError(f"logprobs[{i}] must be a floating-point torch.Tensor, got {type(lp).__name__}")
        if lp.device != device:
            raise ValueError(f"logprobs[{i}] is on {lp.device} but logprobs[0] is on {device}")
        inputs = _loss_fn_inputs(datum, i)
        try:
            outs.append(_datum_loss(loss_fn, inputs, lp, config))
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"datum {i}: {exc}") from exc

    clips = loss_fn in losses.CLIPPING_LOSSES
    if not outs:
        metrics = {keys.LOSS_SUM: 0.0, **token_metrics(0, ClipCounts(0, 0, 0, 0) if clips else None)}
        return RequestResult(
            loss=torch.zeros((), device=device),
            output=ForwardBackwardOutput(loss_fn_output_type=OUTPUT_TYPE, loss_fn_outputs=[], metrics=metrics),
        )

    host = _to_host(outs, logprobs)
    n = len(outs)
    width = _STATS + len(losses.INPUT_CHECKS)
    stats = host[: n * width].reshape(n, width)
    _raise_invalid(stats[:, _STATS:], outs)
    flat_logprobs = host[n * width :].astype(np.float32)

    loss_fn_outputs: list[dict[str, Any]] = []
    total = ClipCounts(0, 0, 0, 0)
    loss_tokens = 0
    offset = 0
    for lp, row in zip(logprobs, stats, strict=True):
        size = lp.numel()
        datum_out: dict[str, Any] = {
            keys.DATUM_LOGPROBS: tensor_data(flat_logprobs[offset : offset + size].reshape(lp.shape)),
            keys.DATUM_LOSS_TOKENS: count_data(int(row[1])),
        }
        offset += size
        loss_tokens += int(row[1])
        if clips:
            counts = ClipCounts(int(row[1]), int(row[2]), int(row[3]), int(row[4]))
            total = total + counts
            datum_out[keys.DATUM_CLIPPED_TOKENS] = count_data(counts.clipped_tokens)
            datum_out[keys.DATUM_CLIPPED_LOW_TOKENS] = count_data(counts.clipped_low_tokens)
            datum_out[keys.DATUM_CLIPPED_HIGH_TOKENS] = count_data(counts.clipped_high_tokens)
        loss_fn_outputs.append(datum_out)

    metrics = {keys.LOSS_SUM: math.fsum(float(row[0]) for row in stats)}
    metrics.update(token_metrics(loss_tokens, total if clips else None))
    loss = torch.stack([o.loss for o in outs]).sum()
    return RequestResult(
        loss=loss,
        output=ForwardBackwardOutput(
            loss_fn_output_type=OUTPUT_TYPE, loss_fn_outputs=loss_fn_outputs, metrics=metrics
        ),
    )


def _check_config(loss_fn: str, config: Mapping[str, float] | None) -> dict[str, float]:
    config = dict(config or {})
    unknown = sorted(set(config) - set(CONFIG_KEYS[loss_fn]))
    if unknown:
        raise ValueError(
            f"loss_fn_config keys {unknown} are not used by {loss_fn!r} "
            f"(it accepts {list(CONFIG_KEYS[loss_fn]) or 'none'})"
        )
    for key, value in config.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")
    missing = [key for key, default in CONFIG_OPTIONS[loss_fn].items() if default is REQUIRED and key not in config]
    if missing:
        raise ValueError(f"loss_fn {loss_fn!r} needs " + " and ".join(f"loss_fn_config[{key!r}]" for key in missing))
    return {k: float(v) for k, v in config.items()}


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


def _input(inputs: Mapping[str, object], name: str, like: Tensor) -> Tensor:
    """Input ``name`` as a detached tensor in ``like``'s dtype and device."""
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
    return tensor.to(device=like.device, dtype=like.dtype)


def _datum_loss(
    loss_fn: str, inputs: Mapping[str, object], lp: Tensor, config: Mapping[str, float]
) -> losses.LossOutput:
    required = ("weights",) if loss_fn == "cross_entropy" else ("logprobs", "advantages")
    missing = [name for name in required if name not in inputs]
    if missing:
        raise ValueError(
            f"loss_fn_inputs lacks {missing}, needed by {loss_fn!r} (it has {sorted(inputs)})"
        )
    if "target_tokens" in inputs:
        targets = inputs["target_tokens"]
        size = targets.numel() if isinstance(targets, Tensor) else read_array(targets, "target_tokens")[0].size
        if size != lp.numel():
            raise ValueError(
                f"target_tokens has {size} entries but the policy's logprobs tensor has "
                f"{lp.numel()}: one log-prob per target token is needed"
            )
    mask_name = "mask" if "mask" in inputs else ("weights" if loss_fn != "cross_entropy" else None)
    mask = _input(inputs, mask_name, lp) if mask_name and mask_name in inputs else None
    if loss_fn == "cross_entropy":
        return losses.cross_entropy(lp, _input(inputs, "weights", lp), mask)
    sampling = _input(inputs, "logprobs", lp)
    advantages = _input(inputs, "advantages", lp)
    if loss_fn == "importance_sampling":
        return losses.importance_sampling(lp, sampling, advantages, mask)
    if loss_fn == "dro":
        return losses.dro(lp, sampling, advantages, mask, beta=config["beta"])
    low, high = _thresholds(loss_fn, inputs, lp, config)
    fn = losses.ppo if loss_fn == "ppo" else losses.cispo
    return fn(lp, sampling, advantages, mask, clip_low_threshold=low, clip_high_threshold=high)


def _thresholds(
    loss_fn: str, inputs: Mapping[str, object], lp: Tensor, config: Mapping[str, float]
) -> tuple[float | Tensor, float | Tensor]:
    """Per-datum thresholds override the request's config, which overrides Tinker's defaults."""
    values: list[float | Tensor] = []
    for name, default in zip(THRESHOLD_FIELDS, DEFAULT_THRESHOLDS[loss_fn], strict=True):
        if name in inputs:
            tensor = _input(inputs, name, lp)
            if tensor.dim() > 0 and tuple(tensor.shape) != (1,) and tensor.shape != lp.shape:
                raise ValueError(
                    f"{name} has shape {tuple(tensor.shape)}; per-datum thresholds are one value "
                    f"(shape [] or [1]) or one per token {tuple(lp.shape)}"
                )
            values.append(tensor)
        else:
            values.append(config.get(name, default))
    low, high = values
    if isinstance(low, Tensor) != isinstance(high, Tensor):  # torch.clamp needs both or neither
        low, high = (torch.as_tensor(v, dtype=lp.dtype, device=lp.device) for v in (low, high))
    return low, high


def _to_host(outs: list[losses.LossOutput], logprobs: list[Tensor]) -> np.ndarray:
    """Every datum's loss, counts and invalid vector, then every log-prob: ONE device-to-host copy.

    Values travel as float64: counts are exact below 2**53 tokens, float32 log-probs exactly.
    """
    zero = torch.zeros((), dtype=torch.int64, device=outs[0].loss_tokens.device)
    rows = []
    for out in outs:
        counts = torch.stack(
            [
                out.loss_tokens,
                out.clipped_tokens if out.clipped_tokens is not None else zero,
                out.clipped_low_tokens if out.clipped_low_tokens is not None else zero,
                out.clipped_high_tokens if out.clipped_high_tokens is not None else zero,
            ]
        )
        rows.append(torch.cat([out.loss.detach().double().reshape(1), counts.double(), out.invalid.double()]))
    flat = [torch.stack(rows).reshape(-1)] + [lp.detach().reshape(-1).double() for lp in logprobs]
    return torch.cat(flat).cpu().numpy()


def _raise_invalid(invalid: np.ndarray, outs: list[losses.LossOutput]) -> None:
    """Raise ValueError naming each datum whose loss inputs were flagged on device."""
    problems = []
    for i, (row, out) in enumerate(zip(invalid, outs, strict=True)):
        if row.any():
            sources = getattr(out, "sources", ())
            try:
                if sources:
                    losses.raise_invalid([int(v) for v in row], sources)
                else:
                    losses.raise_invalid([int(v) for v in row])
            except ValueError as exc:
                problems.append(f"datum {i}: {exc}")
    if problems:
        raise ValueError("; ".join(problems))
