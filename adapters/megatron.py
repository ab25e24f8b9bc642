"""Clip counts through a Megatron-Core ``forward_backward_func`` schedule.

Two pieces, one per side of Megatron's schedule:

* :func:`make_loss_func` builds the per-micro-batch loss function a ``forward_step_func`` returns.
  It runs one of :mod:`cliptrack.adapters.losses.builtin` and returns Megatron's 3-tuple ``(loss, num_tokens, report)``:
  ``loss`` is the micro-batch's **sum** of per-token losses (Tinker's ``loss:sum``), ``num_tokens``
  its eligible tokens (``mask != 0``), and ``report`` a dict of 0-dim device tensors under the
  metric keys of :mod:`cliptrack.core.keys` (plus :data:`REPORT_INVALID`). Nothing synchronises with the
  host. Every measure travels under its own metric key, as the declaration names it
  (:mod:`cliptrack.core.measures`).
* :func:`reduce_losses` takes what ``forward_backward_func`` returned (one report per micro-batch on
  the last pipeline stage), combines the micro-batches on device, merges across the data-parallel x
  context-parallel group in **one** collective for all keys (sums and the gauge's extremes alike:
  every rank receives every rank's packed vector and combines them locally, sums added and
  extremes by max, :func:`cliptrack.adapters.shared.packing.combine_packed`), and builds the step's
  :class:`~cliptrack.adapters.losses.output.ForwardBackwardOutput`. A step costs one collective and one host read.

Loss scaling (what Megatron-Core 0.16.1 does with the 3-tuple, ``forward_step_calc_loss``):

* ``calculate_per_token_loss=True``: Megatron back-propagates the summed loss as returned and adds
  ``num_tokens`` over micro-batches; ``finalize_model_grads`` all-reduces that total over DP x CP and
  divides the gradients by it. The gradient is that of the **token mean over the global batch**.
* ``calculate_per_token_loss=False``: Megatron divides each micro-batch's loss, in place, by
  ``max(num_tokens, 1)`` and by the number of micro-batches, and data-parallel gradient averaging
  does the rest: the gradient is that of the **mean over micro-batches (and DP x CP ranks) of each
  micro-batch's token mean**. A micro-batch whose mask is all zero contributes a zero loss.

Under context parallelism each CP rank's ``num_tokens`` and counts cover its own slice of the
sequences; the DP x CP merge (and ``finalize_model_grads``' token total) adds the slices.

In both modes the report's ``loss:sum`` is a copy taken before Megatron's in-place scaling, so the
metrics carry the unscaled sum of per-token losses, and counting leaves the loss value and every
gradient exactly as the same loss without counting would.

Megatron-Core is optional: it is imported only when :func:`reduce_losses` or
:func:`broadcast_from_last_stage` look up process groups in ``parallel_state``. Users who run their
own schedule pass a list of reports and a process group (or ``None`` for one process).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from cliptrack.adapters._compat import megatron as megatron_compat
from cliptrack.adapters.losses import formulas
from cliptrack.adapters.losses import worst as worst_rows
from cliptrack.adapters.losses.inputs import OLD
from cliptrack.adapters.losses.objectives import CISPO_CLIP_HIGH, CISPO_CLIP_LOW, PPO_CLIP_HIGH, PPO_CLIP_LOW
from cliptrack.adapters.losses.output import LossOutput
from cliptrack.adapters.losses.registry import LossSpec, loss_spec
from cliptrack.adapters.shared.collective import gather_vectors, merge_packed
from cliptrack.adapters.shared.datums import datum_outputs
from cliptrack.adapters.shared.merge import ForwardBackwardOutput, measured_sums
from cliptrack.adapters.shared.packing import (
    INPUT_CHECKS,
    PACKED_DTYPE,
    combine_packed,
    pack,
    pack_rows,
    raise_invalid,
    unpack,
)
from cliptrack.adapters.shared.stack import StackCall
from cliptrack.core import keys, measures
from cliptrack.core.sums import MeasuredSums
from cliptrack.core.worst import COLUMNS, CRITERIA, DEFAULT_K, Worst
from torch import Tensor

__all__ = ["broadcast_from_last_stage", "make_loss_func", "reduce_losses"]

REPORT_INVALID = "cliptrack/invalid"
"""Private report key: int64 vector of bad-input counts (``cliptrack.adapters.shared.packing.INPUT_CHECKS`` order)."""
REPORT_DATUMS = "cliptrack/datums"
"""Private report key (``datum_outputs``): ``[sequences, len(PACKED_FIELDS)]`` packed sums, one row per datum."""
REPORT_DATUM_LOGPROBS = "cliptrack/datum_logprobs"
"""Private report key (``datum_outputs``): the micro-batch's log-probs, ``[sequences, tokens]``, detached."""
REPORT_PROBE = "cliptrack/probe"
"""Private report key (``probe``): present when the per-datum outputs carry the probe's fields."""
REPORT_CLIP_SIDES = "cliptrack/clip_sides"
"""Private report key (``probe``, ppo/cispo): per-token clip sides, ``[sequences, tokens]`` int8."""
REPORT_SEQUENCES = "cliptrack/sequences"
"""Private report key (``sequences``): one gauge row per sequence, ``[sequences, WIDTH]`` float64
(:func:`cliptrack.adapters.losses.worst.sequence_rows`)."""
REPORT_POSITIONS = "cliptrack/positions"
"""Private report key (``sequences`` with ``token_positions``): present when the rows' worst-token
positions are positions in the whole sequence (needed under context parallelism)."""

REPORT_DEFAULT_IDS = "cliptrack/default_ids"
"""Private report key (``sequences`` without ``datum_ids``): present when the rows' ids are the
micro-batch's row indices ``0, 1, ...``, unique only in a step of one micro-batch on one rank."""

_SUMMED = "summed over micro-batches and ranks"
_THRESHOLDS = {"ppo": (PPO_CLIP_LOW, PPO_CLIP_HIGH), "cispo": (CISPO_CLIP_LOW, CISPO_CLIP_HIGH)}
"""The default clip thresholds of the losses whose clip sides a probe writes."""


PACKED_FIELDS: tuple[str, ...] = measures.PACKED_FIELDS
"""The layout of the merged vector under the default declaration (:data:`cliptrack.core.measures.PACKED_FIELDS`;
another declaration's: its ``packed_fields``)."""

LossFunc = Callable[[Tensor], tuple[Tensor, Tensor, dict[str, Tensor]]]
"""What Megatron-Core calls with the model's output tensor: ``(loss, num_tokens, report)``."""


class _Auto:
    def __repr__(self) -> str:
        return "AUTO"


AUTO: Any = _Auto()
"""Default ``group``: Megatron's ``parallel_state`` groups when initialised, else one process."""


# ---------------------------------------------------------------------------------------------
# Loss side: one call per micro-batch, inside Megatron's schedule.
# ---------------------------------------------------------------------------------------------


def make_loss_func(
    loss_fn: str | LossSpec | Callable[..., LossOutput],
    loss_fn_inputs: Mapping[str, Tensor],
    loss_fn_config: Mapping[str, Any] | None = None,
    *,
    output_to_logprobs: Callable[[Tensor], Tensor] | None = None,
    datum_outputs: bool = False,
    probe: bool = False,
    sequences: bool = False,
    datum_ids: Tensor | None = None,
    token_positions: Tensor | None = None,
    declaration: measures.Declaration = measures.DEFAULT,
) -> LossFunc:
    """Build the loss function of one micro-batch for a Megatron-Core ``forward_step_func``.

    ``loss_fn``: a registered loss (:func:`cliptrack.adapters.losses.builtin.register_loss`): its name (``"ppo"``,
    ``"cispo"``, ...), its :class:`~cliptrack.adapters.losses.builtin.LossSpec` or its function; or an unregistered
    function with the same convention returning a :class:`~cliptrack.adapters.losses.builtin.LossOutput` (its
    arguments are then checked only when it runs).
    ``loss_fn_inputs``: the micro-batch's per-token tensors other than the policy log-probs, named
    as the loss function's parameters (``sampling_logprobs``, ``advantages``, ``mask``, or
    ``weights`` for cross entropy). ``loss_fn_config``: the loss's keyword options
    (``clip_low_threshold``, ``clip_high_threshold``, ``beta``). ``output_to_logprobs`` maps the
    model's output tensor to per-token log-probs of the shape of the inputs (default: the output
    is the log-probs; for a Megatron ``GPTModel`` called with ``labels``, which returns per-token
    cross entropy, pass ``torch.neg``).

    Returns ``loss_func(output_tensor) -> (loss, num_tokens, report)``: ``loss`` is the summed
    per-token loss, ``num_tokens`` the int64 count of eligible tokens, ``report`` the 0-dim tensors
    ``loss:sum`` (detached copy, unaffected by Megatron's in-place scaling) and every measure the
    loss emits under its metric key (``loss_tokens:sum``; for clipping losses the clip counts and
    their split; for losses with sampling log-probs the gauge's sums and extremes; the measures of
    ``declaration``, passed to the loss as ``declaration=`` when it is not the default one), plus
    the bad-input vector under :data:`REPORT_INVALID`. Unknown or
    missing input and option names are raised here, shapes and Python-number options when the loss
    runs; bad tensor values (NaN, masks not 0/1) are counted on device and raised by
    :func:`reduce_losses` after its collective.

    ``datum_outputs=True``: the output of :func:`reduce_losses` also carries per-datum outputs in
    the per-datum wire form every stack shares (:func:`cliptrack.adapters.shared.datums.datum_outputs`): one per row
    of the micro-batch's ``[sequences, tokens]`` log-probs, with its ``logprobs`` (the whole row)
    and its measured fields. ``probe=True`` (implies it) adds each datum's ``loss`` and, for
    ``ppo``/``cispo``, its per-token ``clip_sides`` (a paired probe's fields,
    :func:`cliptrack.compare.probe.compare_outputs`). Each datum costs one more loss call on
    detached tensors, so both are off by default; the loss, its gradient and the metrics are the same.

    ``sequences=True`` (a loss with sampling log-probs, ``[sequences, tokens]`` inputs): the report
    also carries one gauge row per sequence (:func:`cliptrack.adapters.losses.worst.sequence_rows`,
    detached, on device, no sync), from which :func:`reduce_step` finds the step's worst sequences.
    ``datum_ids``: ``[sequences]`` integer tensor, the ids (0 to 2**53 - 1) of the micro-batch's
    sequences, unique in the step's pass (e.g. each sample's index in the global batch; a datum in
    several passes ranks once, by its best); default ``0, 1, ...``, which only a step of one
    micro-batch on one rank keeps unique (:func:`reduce_step` refuses it otherwise).
    ``token_positions``: ``[sequences, tokens]`` integer positions of the tokens in their whole
    sequence (Megatron's ``position_ids``), needed under context parallelism, where a rank holds
    slices of each sequence. Their types and shapes are checked here (TypeError / ValueError naming
    them).
    """
    spec = loss_spec(loss_fn)
    if spec is None and not callable(loss_fn):
        raise TypeError(
            f"loss_fn must be a loss name, a LossSpec or a callable, got {type(loss_fn).__name__}"
        )
    fn: Callable[..., LossOutput] = spec.fn if spec is not None else loss_fn  # type: ignore[assignment]
    name = spec.name if spec is not None else getattr(fn, "__name__", repr(fn))
    inputs = dict(loss_fn_inputs)
    config = dict(loss_fn_config or {})
    if spec is not None:
        spec.check_arguments(inputs, config)
    if output_to_logprobs is not None and not callable(output_to_logprobs):
        raise TypeError(f"output_to_logprobs must be callable, got {type(output_to_logprobs).__name__}")
    _check_sequences(spec, name, sequences, datum_ids, token_positions)
    _check_sequence_tensors(inputs.get("sampling_logprobs"), datum_ids, token_positions)
    extra = {} if declaration is measures.DEFAULT else {"declaration": declaration}

    def loss_func(output_tensor: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        logprobs = output_tensor if output_to_logprobs is None else output_to_logprobs(output_tensor)
        out = fn(logprobs, **inputs, **config, **extra)
        if spec is not None:
            out = spec.check_output(out)
        elif not isinstance(out, LossOutput):
            raise TypeError(f"loss function {name} returned {type(out).__name__}, expected LossOutput")
        report = report_of(out)
        if datum_outputs or probe:
            report.update(_datum_report(fn, name, logprobs, inputs, {**config, **extra}, probe))
        if sequences:
            report.update(_sequence_report(logprobs, inputs, datum_ids, token_positions))
        return out.loss, out.loss_tokens, report

    loss_func.__name__ = f"{name}_loss_func"
    return loss_func


def _check_sequences(
    spec: LossSpec | None,
    name: str,
    sequences: bool,
    datum_ids: Tensor | None,
    token_positions: Tensor | None,
) -> None:
    """ValueError when ``sequences=True`` is asked of a loss without sampling log-probs, or the
    sequences' ids or positions come without it."""
    if sequences and (spec is None or not spec.gauge):
        raise ValueError(
            f"sequences=True needs a loss with sampling log-probs (ppo, cispo, importance_sampling, dro), not {name}"
        )
    if not sequences and (datum_ids is not None or token_positions is not None):
        raise ValueError(
            "datum_ids and token_positions describe the sequences: pass sequences=True with them"
        )


def _check_sequence_tensors(like: object, datum_ids: object, token_positions: object) -> None:
    """TypeError / ValueError naming ``datum_ids`` or ``token_positions`` when either is not an
    integer tensor of the micro-batch's shape (``like``: its sampling log-probs): ``[sequences]``
    ids, ``[sequences, tokens]`` positions. Host-side (dtypes and shapes only: no sync)."""
    for label, value in (("datum_ids", datum_ids), ("token_positions", token_positions)):
        if value is not None:
            _check_integer_tensor(label, value)
    if not isinstance(like, Tensor):
        return
    shape = tuple(like.shape)
    rows = shape[0] if len(shape) == 2 else 1
    if isinstance(datum_ids, Tensor) and (datum_ids.dim() > 1 or datum_ids.numel() != rows):
        raise ValueError(
            f"datum_ids has shape {tuple(datum_ids.shape)} for {rows} sequences (sampling_logprobs "
            f"{shape}): one id per sequence, shape [{rows}]"
        )
    if isinstance(token_positions, Tensor) and tuple(token_positions.shape) != shape:
        raise ValueError(
            f"token_positions has shape {tuple(token_positions.shape)} but sampling_logprobs has shape "
            f"{shape}: one position per token"
        )


def _check_integer_tensor(label: str, value: object) -> None:
    """TypeError naming ``label`` unless ``value`` is a tensor of integers (not bool)."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{label} must be a torch.Tensor of integers, got {type(value).__name__}")
    if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
        raise TypeError(f"{label} must be an integer tensor (int64), got dtype {value.dtype}")


def _sequence_report(
    logprobs: Tensor, inputs: Mapping[str, Tensor], datum_ids: Tensor | None, token_positions: Tensor | None
) -> dict[str, Tensor]:
    """The report's sequence rows (and the positions flag; the default-ids flag without
    ``datum_ids``), on device, no sync."""
    report = {
        REPORT_SEQUENCES: worst_rows.sequence_rows(
            logprobs,
            inputs["sampling_logprobs"],
            inputs.get("mask"),
            datum_ids=datum_ids,
            positions=token_positions,
        )
    }
    if token_positions is not None:
        report[REPORT_POSITIONS] = torch.ones((), dtype=torch.int64, device=logprobs.device)
    if datum_ids is None:
        report[REPORT_DEFAULT_IDS] = torch.ones((), dtype=torch.int64, device=logprobs.device)
    return report


def _row(value: Any, index: int, rows: int, like: Tensor) -> Any:
    """Row ``index`` of a per-token input or tensor option of shape ``like``'s (a tensor of another
    shape or a number broadcasts, so it is the same for every row)."""
    if isinstance(value, Tensor) and value.dim() == like.dim() and value.shape[0] == rows:
        return value[index]
    return value


def _datum_report(
    fn: Callable[..., LossOutput],
    name: str,
    logprobs: Tensor,
    inputs: Mapping[str, Tensor],
    config: Mapping[str, Any],
    probe: bool,
) -> dict[str, Tensor]:
    """The per-datum part of a micro-batch's report: one loss call per row of ``logprobs``
    (``[sequences, tokens]``, detached) packed, the rows' log-probs and, with ``probe`` for
    ppo/cispo, their clip sides. No host sync."""
    if logprobs.dim() != 2:
        raise ValueError(
            f"datum_outputs needs the micro-batch's log-probs as [sequences, tokens], got shape "
            f"{tuple(logprobs.shape)}"
        )
    rows = logprobs.shape[0]
    detached = logprobs.detach()
    with torch.no_grad():
        packed = [
            pack(
                fn(
                    detached[i],
                    **{k: _row(v, i, rows, detached) for k, v in inputs.items()},
                    **{k: _row(v, i, rows, detached) for k, v in config.items()},
                )
            )
            for i in range(rows)
        ]
    report = {
        REPORT_DATUMS: torch.stack(packed) if packed else _empty(detached.device)[None, :0],
        REPORT_DATUM_LOGPROBS: detached,
    }
    if probe:
        report[REPORT_PROBE] = torch.ones((), dtype=torch.int64, device=detached.device)
    if probe and name in formulas.CLIP_SIDE_LOSSES:
        report[REPORT_CLIP_SIDES] = formulas.clip_sides(
            name,
            detached,
            inputs["old_logprobs"] if config.get("clip_reference") == OLD else inputs["sampling_logprobs"],
            inputs["advantages"],
            inputs.get("mask"),
            config.get("clip_low_threshold", _THRESHOLDS[name][0]),
            config.get("clip_high_threshold", _THRESHOLDS[name][1]),
        )
    return report


def report_of(out: LossOutput) -> dict[str, Tensor]:
    """The Megatron report of one micro-batch's :class:`LossOutput` (0-dim device tensors, no sync):
    ``loss:sum``, every measured value by its metric key, the bad-input vector."""
    return {
        keys.LOSS_SUM: out.loss.detach().clone(),  # Megatron divides the loss in place
        **{key: value.detach() for key, value in out.measured.items()},
        REPORT_INVALID: out.invalid.detach(),
    }


# ---------------------------------------------------------------------------------------------
# Reduction side: once per step, after forward_backward_func.
# ---------------------------------------------------------------------------------------------


def sum_reports(
    losses_reduced: Sequence[Mapping[str, Tensor]],
    device: torch.device | str | None = None,
    declaration: measures.Declaration = measures.DEFAULT,
) -> Tensor:
    """Sum micro-batch reports on device into one vector laid out as ``declaration.packed_fields``
    (:data:`PACKED_FIELDS` for the default declaration).

    No host synchronisation. An empty list gives zeros on ``device`` (default: CPU). Raises
    ValueError naming the micro-batch and key when a report is malformed.
    """
    if not isinstance(losses_reduced, Sequence) or isinstance(losses_reduced, (str, bytes, Mapping)):
        raise TypeError(
            f"losses_reduced must be the list forward_backward_func returned, got {type(losses_reduced).__name__}"
        )
    layouts = [_report_layout(i, report, declaration) for i, report in enumerate(losses_reduced)]
    if not layouts:
        return _empty(device, declaration)
    target = torch.device(device) if device is not None else layouts[0][0]
    if len(set(layouts)) == 1:  # the usual step: one loss, one device: a few stacked ops in all
        return combine_packed(_packed_rows(losses_reduced, layouts[0], declaration).to(target), declaration)
    rows = [
        _packed_rows([report], layout, declaration).to(target)
        for report, layout in zip(losses_reduced, layouts, strict=True)
    ]
    return combine_packed(torch.cat(rows), declaration)


def _empty(device: torch.device | str | None, declaration: measures.Declaration = measures.DEFAULT) -> Tensor:
    """The packed vector of no loss call (zeros, the extremes ``-inf``) on ``device``."""
    zero = torch.zeros(1, dtype=PACKED_DTYPE, device=device)
    checks = torch.zeros(1, len(INPUT_CHECKS), dtype=PACKED_DTYPE, device=device)
    return pack_rows(zero, {keys.LOSS_TOKENS: zero}, checks, 0, declaration)[0]


_Layout = tuple[torch.device, tuple[str, ...]]
"""A report's device and the measured keys it holds (declaration order)."""


def _report_layout(index: int, report: object, declaration: measures.Declaration) -> _Layout:
    """Check one micro-batch report (ValueError / TypeError naming the micro-batch and key); its layout."""
    if not isinstance(report, Mapping):
        raise TypeError(
            f"micro-batch {index}: report is a {type(report).__name__}, expected the dict returned by a "
            "loss function of cliptrack.adapters.megatron.make_loss_func"
        )
    required = (keys.LOSS_SUM, keys.LOSS_TOKENS, REPORT_INVALID)
    missing = [k for k in required if k not in report]
    if missing:
        raise ValueError(f"micro-batch {index}: report lacks {missing} (has {sorted(report)})")
    measured = tuple(m.key for m in declaration.measures if m.key in report)
    _check_report_groups(index, report, declaration)
    for key in (*measured, REPORT_INVALID):
        if not isinstance(report[key], Tensor):
            raise TypeError(
                f"micro-batch {index}: report[{key!r}] is a {type(report[key]).__name__}, expected a tensor"
            )
    for key in measured:
        if report[key].numel() != 1:
            raise ValueError(
                f"micro-batch {index}: report[{key!r}] has shape {tuple(report[key].shape)}, expected one value"
            )
    invalid = report[REPORT_INVALID]
    if invalid.shape != (len(INPUT_CHECKS),):
        raise ValueError(
            f"micro-batch {index}: report[{REPORT_INVALID!r}] has shape {tuple(invalid.shape)}, "
            f"expected ({len(INPUT_CHECKS)},)"
        )
    return report[keys.LOSS_SUM].device, measured


def _check_report_groups(index: int, report: Mapping[str, object], declaration: measures.Declaration) -> None:
    """ValueError naming the micro-batch when a group's sums are partly present, or a refining
    group (the split) is present without the group it refines."""
    for group in declaration.groups:
        present = _present_members(report, declaration, group)
        if not present:
            continue
        absent = _absent_for_group(report, declaration, group)
        if absent:
            raise ValueError(f"micro-batch {index}: report has {present} but not {absent}")


def _present_members(
    report: Mapping[str, object], declaration: measures.Declaration, group: measures.Group
) -> list[str]:
    """The metric keys of ``group``'s measures the report holds (``loss:sum`` excepted), declaration order."""
    members = [m.key for m in declaration.members[group.name] if m.key != keys.LOSS_SUM]
    return [k for k in members if k in report]


def _absent_for_group(
    report: Mapping[str, object], declaration: measures.Declaration, group: measures.Group
) -> list[str]:
    """What a report holding part of ``group`` lacks: its sums not in the report (``loss:sum``
    excepted), then the first key of the group it refines (``group.within``) not in the report."""
    sums = [m.key for m in declaration.members[group.name] if m.reduction == measures.SUM]
    absent = [k for k in sums if k not in report and k != keys.LOSS_SUM]
    base = [] if group.within is None else [m.key for m in declaration.members[group.within]]
    absent += [k for k in base if k not in report][:1]
    return absent


def _packed_rows(
    reports: Sequence[Mapping[str, Tensor]], layout: _Layout, declaration: measures.Declaration
) -> Tensor:
    """The packed rows of checked reports of one layout, ``[len(reports), len(declaration.packed_fields)]``:
    one stack per field, whatever the number of micro-batches (no sync)."""
    _, measured = layout
    return pack_rows(
        torch.stack([r[keys.LOSS_SUM].detach().reshape(()) for r in reports]),
        {key: torch.stack([r[key].detach().reshape(()) for r in reports]) for key in measured},
        torch.stack([r[REPORT_INVALID].detach() for r in reports]),
        declaration=declaration,
    )


def merged_sums(
    losses_reduced: Sequence[Mapping[str, Tensor]],
    group: Any = None,
    device: torch.device | str | None = None,
    declaration: measures.Declaration = measures.DEFAULT,
) -> Tensor:
    """Sum the reports on device, then merge them over ``group`` in one collective.

    ``group``: a ``torch.distributed`` process group (every rank of it must call), or ``None`` for
    one process (no collective). Returns the vector of ``declaration.packed_fields``, on device.
    See :func:`merge_packed` for the collective.
    """
    if device is None and not losses_reduced and group is not None:
        device = _collective_device(group)
    packed = sum_reports(losses_reduced, device=device, declaration=declaration)
    return packed if group is None else merge_packed(packed, group, declaration)


def reduce_losses(
    losses_reduced: Sequence[Mapping[str, Tensor]],
    *,
    group: Any = AUTO,
    loss_fn_output_type: str = "ArrayRecord",
    device: torch.device | str | None = None,
    declaration: measures.Declaration = measures.DEFAULT,
) -> ForwardBackwardOutput | None:
    """The step's :class:`ForwardBackwardOutput` from ``forward_backward_func``'s return value.

    ``losses_reduced``: the list of micro-batch reports (from :func:`make_loss_func`'s loss).
    ``group``: where the sums are merged.

    * ``AUTO`` (default): with Megatron's ``parallel_state`` initialised, the data-parallel x
      context-parallel group of this rank (tensor-parallel ranks, which hold the same tokens, are
      not in it, so they are not counted twice; context-parallel slices are summed). Ranks that
      are not on the last pipeline stage hold no reports and return ``None`` without communicating
      (see :func:`broadcast_from_last_stage`). Without ``parallel_state``: one process.
    * a process group: every rank of it must call, ``[]`` allowed (it contributes zeros).
    * ``None``: this process alone, no collective.

    All keys are merged in **one** collective on one vector (:data:`cliptrack.adapters.shared.packing.PACKED_FIELDS`; see
    :func:`merge_packed`), then
    synchronised with the host once. Bad loss inputs counted on any rank raise ValueError after that
    collective, on every rank alike, rather than yield a wrong number. Metrics: ``loss:sum``,
    ``loss_tokens:sum`` and, for a clipping loss, ``clipped_tokens:sum``, the low/high split when
    every micro-batch reported it, and ``clip_fraction:mean`` (formed from the merged sums; absent
    when no token was eligible); for a loss with sampling log-probs the gauge's sums, extremes and
    means (docs/CONTRACT.md, "The on-policy gauge"). A loss that never clips emits no clip keys,
    cross entropy no gauge. ``declaration``: the measures the reports carry (that of the loss
    functions, :func:`make_loss_func`; every rank must pass the same).
    """
    return reduce_step(
        losses_reduced,
        group=group,
        loss_fn_output_type=loss_fn_output_type,
        device=device,
        worst_k=0,
        declaration=declaration,
    ).output


@dataclass(frozen=True)
class ReducedStep:
    """A step reduced by :func:`reduce_step`: its ``output`` (``None`` off the last pipeline stage)
    and its ``worst`` sequences (``None`` unless asked for and carried by the reports)."""

    output: ForwardBackwardOutput | None
    worst: Worst | None = None


def reduce_step(
    losses_reduced: Sequence[Mapping[str, Tensor]],
    *,
    step: int = 0,
    worst_k: int = DEFAULT_K,
    group: Any = AUTO,
    loss_fn_output_type: str = "ArrayRecord",
    device: torch.device | str | None = None,
    declaration: measures.Declaration = measures.DEFAULT,
) -> ReducedStep:
    """:func:`reduce_losses`, and the step's worst sequences found on the way.

    With reports from loss functions built with ``sequences=True`` and ``worst_k >= 1``: this rank's
    sequence rows are reduced on device to their top ``worst_k`` per criterion
    (:func:`cliptrack.adapters.losses.worst.top_rows`), the block rides in the sums' **one**
    collective (appended to the packed vector), every rank merges the ranks' blocks exactly
    (:func:`cliptrack.adapters.losses.worst.merge_top`) and reads them with the sums in the step's
    one host read: ``worst`` is a :class:`cliptrack.core.worst.Worst` of ``step``, equal to a sort
    of every sequence of the step. Under context parallelism (``group=AUTO`` with a CP size above 1)
    a rank holds slices of each sequence: their rows are first gathered over the CP group (one more
    collective, only then) and combined, which needs ``token_positions`` in the loss functions; with
    an explicit ``group`` each rank must hold whole sequences. ``worst_k=0``: no worst sequences, the
    rows are ignored. Every rank of the group must pass the same ``worst_k``; a rank without
    reports, or with reports without rows, contributes an empty block (``worst`` is then ``None``
    where the reports carry no rows).
    """
    group, state = _step_group(losses_reduced, group)
    if group is _OFF_STAGE:
        return ReducedStep(None, None)
    if isinstance(worst_k, bool) or not isinstance(worst_k, int) or worst_k < 0:
        raise ValueError(f"worst_k must be an integer >= 0, got {worst_k!r}")
    if device is None and not losses_reduced and group is not None:
        device = _collective_device(group)
    packed = sum_reports(losses_reduced, device=device, declaration=declaration)  # checks the reports first
    carried = _carry_sequences(losses_reduced)
    if carried and worst_k:
        _check_default_ids(losses_reduced, group)
    # every rank appends a block of the same size (empty without rows), so the one collective matches
    values, worst_values = _merged(
        losses_reduced if carried else [], packed, worst_k, group, state, declaration
    )
    output = output_from_sums(values, loss_fn_output_type=loss_fn_output_type, declaration=declaration)
    worst = None
    if worst_values is not None and (carried or not losses_reduced):
        nested = torch.tensor(worst_values, dtype=PACKED_DTYPE).reshape(len(CRITERIA), worst_k, -1).tolist()
        worst = worst_rows.worst_from_block(nested, step, worst_k)
    datums = _datum_outputs(losses_reduced, declaration)
    if datums is not None:
        output = ForwardBackwardOutput(
            loss_fn_output_type=output.loss_fn_output_type, loss_fn_outputs=datums, metrics=output.metrics
        )
    return ReducedStep(output, worst)


def _merged(
    losses_reduced: Sequence[Mapping[str, Tensor]],
    packed: Tensor,
    k: int,
    group: Any,
    state: Any,
    declaration: measures.Declaration,
) -> tuple[list[float], list[float] | None]:
    """The step's merged sums and (``k`` >= 1) its merged worst-sequence block, host values: this
    rank's top ``k`` block appended to the packed vector, **one** collective over ``group`` (none
    for ``None``), the ranks' sums combined and blocks merged on device, one host read."""
    width = packed.numel()
    if k:
        block = _worst_block(losses_reduced, k, state if group is not None else None, packed.device)
        packed = torch.cat([packed, block.reshape(-1)])
    rows = packed.reshape(1, -1) if group is None else gather_vectors(packed, group)
    merged = combine_packed(rows[:, :width], declaration)
    if k:
        parts = rows[:, width:].reshape(rows.shape[0], len(CRITERIA), k, worst_rows.WIDTH)
        merged = torch.cat([merged, worst_rows.merge_top(parts, k).reshape(-1)])
    values = merged.tolist()  # the step's one host read
    return values[:width], (values[width:] if k else None)


class _OffStage:
    def __repr__(self) -> str:
        return "OFF_STAGE"


_OFF_STAGE: Any = _OffStage()


def _step_group(losses_reduced: Sequence[Mapping[str, Tensor]], group: Any) -> tuple[Any, Any]:
    """The group a step merges over and Megatron's ``parallel_state`` (``None`` when not used):
    ``_OFF_STAGE`` for a rank off the last pipeline stage (it holds no reports)."""
    if group is not AUTO:
        return group, None
    state = megatron_compat.parallel_state()
    if state is None:
        return _default_group(), None
    if not megatron_compat.is_last_pipeline_stage(state):
        if losses_reduced:
            raise ValueError(
                f"losses_reduced has {len(losses_reduced)} reports on a rank that is not on the "
                "last pipeline stage; Megatron returns [] there"
            )
        return _OFF_STAGE, state
    return megatron_compat.data_parallel_group(state), state


def _carry_sequences(losses_reduced: Sequence[Mapping[str, Tensor]]) -> bool:
    """Whether the reports carry sequence rows: all or none (ValueError when only some do)."""
    return _all_or_none(losses_reduced, REPORT_SEQUENCES, "sequence rows", "sequences=")


def _check_default_ids(losses_reduced: Sequence[Mapping[str, Tensor]], group: Any) -> None:
    """ValueError when sequence rows numbered by default (no ``datum_ids``) come from more than one
    micro-batch or rank: their ids repeat, and the worst sequences would name sequences that are
    not the ones ranked. Every rank holds as many micro-batches, so all ranks raise alike (before
    the collective)."""
    if not any(REPORT_DEFAULT_IDS in report for report in losses_reduced):
        return
    ranks = 1 if group is None else dist.get_world_size(group)
    if len(losses_reduced) > 1 or ranks > 1:
        raise ValueError(
            f"make_loss_func(sequences=True) without datum_ids numbers each micro-batch's sequences "
            f"0, 1, ...: over {len(losses_reduced)} micro-batches and {ranks} rank(s) those ids repeat; "
            "pass datum_ids (e.g. each sample's index in the global batch)"
        )


def _worst_block(
    losses_reduced: Sequence[Mapping[str, Tensor]], k: int, state: Any, device: torch.device
) -> Tensor:
    """This rank's top ``k`` block (``[len(CRITERIA), k, WIDTH]``); under context parallelism the
    CP ranks' slices of each sequence combined first (one all-gather over the CP group) and only
    CP rank 0's block kept (the others' are empty, so no sequence counts twice)."""
    if losses_reduced:
        rows = torch.cat([report[REPORT_SEQUENCES].to(device) for report in losses_reduced])
    else:
        rows = torch.zeros((0, worst_rows.WIDTH), dtype=PACKED_DTYPE, device=device)
    cp_group, cp_size, cp_rank = (None, 1, 0) if state is None else megatron_compat.context_parallel(state)
    if cp_size > 1:
        if not all(REPORT_POSITIONS in report for report in losses_reduced):
            raise ValueError(
                "under context parallelism the worst sequences need token_positions in make_loss_func "
                "(each token's position in its whole sequence, e.g. Megatron's position_ids)"
            )
        rows = _combine_slices(
            gather_vectors(rows.reshape(-1), cp_group).reshape(cp_size, -1, worst_rows.WIDTH)
        )
        if cp_rank != 0:
            rows = rows[:0]
    return worst_rows.top_rows(rows, k)


def _combine_slices(slices: Tensor) -> Tensor:
    """Rows of the same sequences from ``[cp, n, WIDTH]`` CP slices as whole sequences: counts and
    sums added, the largest ``|l|`` and its position from the slice holding it (the smallest
    position on a tie)."""
    col = {name: i for i, name in enumerate(COLUMNS)}
    out = slices[0].clone()
    for name in ("tokens", "log_ratio", "abs_log_ratio", "kl_k3"):
        out[:, col[name]] = slices[:, :, col[name]].sum(dim=0)
    largest = slices[:, :, col["max_abs_log_ratio"]]
    top = largest.max(dim=0).values
    holds = (largest == top) & (slices[:, :, col["tokens"]] > 0)
    position = torch.where(holds, slices[:, :, col["worst_token"]], torch.inf).min(dim=0).values
    out[:, col["max_abs_log_ratio"]] = top
    out[:, col["worst_token"]] = torch.where(out[:, col["tokens"]] > 0, position, -1.0)
    return out


def _carry_datums(losses_reduced: Sequence[Mapping[str, Tensor]]) -> bool:
    """Whether the micro-batch reports carry per-datum outputs: all or none; ValueError when only
    some do (loss functions built with different ``datum_outputs``)."""
    return _all_or_none(losses_reduced, REPORT_DATUMS, "per-datum outputs", "datum_outputs")


def _all_or_none(losses_reduced: Sequence[Mapping[str, Tensor]], key: str, what: str, option: str) -> bool:
    """Whether the reports carry ``key`` (``what``, in words): all or none; ValueError when only some
    do (loss functions built with different ``option``)."""
    carried = [key in report for report in losses_reduced]
    if any(carried) and not all(carried):
        raise ValueError(
            f"some micro-batch reports carry {what} and others do not: build every loss function "
            f"with the same {option}"
        )
    return any(carried)


def _datum_outputs(
    losses_reduced: Sequence[Mapping[str, Tensor]], declaration: measures.Declaration
) -> list[dict[str, Any]] | None:
    """The per-datum outputs of this rank's micro-batches, in order (``None`` when the loss
    function was built without ``datum_outputs``): one host copy, built by the per-datum wire form
    every stack shares (:func:`cliptrack.adapters.shared.datums.datum_outputs`)."""
    if not _carry_datums(losses_reduced):
        return None
    probe = all(REPORT_PROBE in report for report in losses_reduced)
    sided = all(REPORT_CLIP_SIDES in report for report in losses_reduced)
    rows = torch.cat([report[REPORT_DATUMS] for report in losses_reduced])
    logprobs = [report[REPORT_DATUM_LOGPROBS] for report in losses_reduced]
    parts = [rows.reshape(-1)] + [lp.reshape(-1).to(PACKED_DTYPE) for lp in logprobs]
    if sided:
        parts += [report[REPORT_CLIP_SIDES].reshape(-1).to(PACKED_DTYPE) for report in losses_reduced]
    host = torch.cat([p.cpu() for p in parts]).numpy()
    n, width = rows.shape[0], rows.shape[1]
    sums = [
        unpack(row.tolist(), f"datum {i}", declaration)
        for i, row in enumerate(host[: n * width].reshape(n, width))
    ]
    shapes = [tuple(lp.shape[1:]) for lp in logprobs for _ in range(lp.shape[0])]
    tokens = sum(lp.numel() for lp in logprobs)
    flat_logprobs = host[n * width : n * width + tokens]
    flat_sides = host[n * width + tokens :].astype("int64") if sided else None
    return datum_outputs(shapes, sums, flat_logprobs, flat_sides, probe=probe)


def output_from_sums(
    values: Sequence[float],
    *,
    loss_fn_output_type: str = "ArrayRecord",
    declaration: measures.Declaration = measures.DEFAULT,
) -> ForwardBackwardOutput:
    """Build the output from the merged values of ``declaration.packed_fields`` (host numbers)."""
    fields = declaration.packed_fields
    if len(values) != len(fields):
        raise ValueError(f"expected {len(fields)} merged values ({fields}), got {len(values)}")
    first = fields.index("invalid[0]")
    invalid = [int(v) for v in values[first : first + len(INPUT_CHECKS)]]
    raise_invalid(invalid)  # bad inputs first: they explain any odd count
    sums = unpack(values, _SUMMED, declaration)
    if sums.calls == 0:
        raise ValueError(
            "losses_reduced is empty on every rank: pass the list forward_backward_func returned on the "
            "last pipeline stage (one report per micro-batch)"
        )
    if not math.isfinite(sums.loss_sum):
        raise ValueError(f"{keys.LOSS_SUM} is {sums.loss_sum!r} after merging: a loss value was not finite")
    metrics = {keys.LOSS_SUM: sums.loss_sum, **sums.counts.to_metrics()}
    return ForwardBackwardOutput(loss_fn_output_type=loss_fn_output_type, loss_fn_outputs=[], metrics=metrics)


def broadcast_from_last_stage(
    output: ForwardBackwardOutput | None,
    *,
    group: Any = AUTO,
    src: int | None = None,
    device: torch.device | str | None = None,
) -> ForwardBackwardOutput:
    """Hand the last pipeline stage's output to every rank of its pipeline group.

    Call on every rank of the pipeline-parallel group with what :func:`reduce_losses` returned
    there (``None`` off the last stage). ``group``/``src``: the pipeline group and the global rank
    of its last stage; ``AUTO`` takes both from Megatron's ``parallel_state``, or returns ``output``
    unchanged for one process. ``device``: where the object travels (CUDA for NCCL groups; default
    chosen from the group's backend).
    """
    if group is AUTO:
        state = megatron_compat.parallel_state()
        if state is None:
            if output is None:
                raise ValueError("output is None and there is no pipeline group to receive it from")
            return output
        group, src = megatron_compat.pipeline_group(state)
    if group is None:
        if output is None:
            raise ValueError("output is None and group is None: nothing to receive")
        return output
    if src is None:
        ranks = dist.get_process_group_ranks(group)
        src = ranks[-1]
    if dist.get_rank() == src and output is None:
        raise ValueError(f"rank {src} is the source of the broadcast but its output is None")
    payload: list[Any] = [output if dist.get_rank() == src else None]
    dist.broadcast_object_list(
        payload,
        src=src,
        group=group,
        device=torch.device(device) if device is not None else _collective_device(group),
    )
    result = payload[0]
    if not isinstance(result, ForwardBackwardOutput):
        raise TypeError(f"received {type(result).__name__} from rank {src}, expected ForwardBackwardOutput")
    return result


def _default_group() -> Any:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise ValueError(
            "torch.distributed runs on several ranks but Megatron's parallel_state is not initialised: "
            "pass group= (the data-parallel x context-parallel process group) or group=None for this rank alone"
        )
    return None


def _collective_device(group: Any) -> torch.device:
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass(frozen=True)
class MegatronStack:
    """Megatron-Core as a :class:`cliptrack.adapters.shared.stack.Stack`: the loss hook is
    :func:`make_loss_func`'s loss function (its report per micro-batch), the reduction
    :func:`reduce_losses` over ``group`` (``None``: this process alone), the read-back the
    output's measured sums, all of ``declaration``'s measures."""

    group: Any = None
    name: str = "megatron"
    declaration: measures.Declaration = measures.DEFAULT

    def loss_hook(
        self, loss_fn: str, logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]
    ) -> StackCall:
        loss, _, report = make_loss_func(loss_fn, inputs, config, declaration=self.declaration)(logprobs)
        return StackCall(loss, report)

    def reduce(self, reports: Sequence[Any]) -> ForwardBackwardOutput:
        output = reduce_losses(list(reports), group=self.group, declaration=self.declaration)
        if output is None:
            raise ValueError("this rank is off the last pipeline stage: it holds no step output")
        return output

    def read_back(self, output: object) -> MeasuredSums | None:
        return measured_sums(output, self.declaration)


STACK = MegatronStack()
"""Megatron-Core as a stack, on one process (:class:`MegatronStack`)."""
