"""Clip counts through a Megatron-Core ``forward_backward_func`` schedule.

Two pieces, one per side of Megatron's schedule:

* :func:`make_loss_func` builds the per-micro-batch loss function a ``forward_step_func`` returns.
  It runs one of :mod:`adapters.losses` and returns Megatron's 3-tuple ``(loss, num_tokens, report)``:
  ``loss`` is the micro-batch's **sum** of per-token losses (Tinker's ``loss:sum``), ``num_tokens``
  its eligible tokens (``mask != 0``), and ``report`` a dict of 0-dim device tensors under the
  metric keys of :mod:`tracking.keys` (plus :data:`REPORT_INVALID`). Nothing synchronises with the
  host.
* :func:`reduce_losses` takes what ``forward_backward_func`` returned (one report per micro-batch on
  the last pipeline stage), sums the micro-batches on device, merges across the data-parallel x
  context-parallel group in **one** collective for all keys, and builds the step's
  :class:`~adapters.output.ForwardBackwardOutput`.

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

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from adapters.losses import INPUT_CHECKS, LOSSES, LossOutput, raise_invalid
from adapters.output import ForwardBackwardOutput
from tracking import keys
from tracking.counts import ClipCounts, as_count, token_metrics

__all__ = [
    "AUTO",
    "PACKED_FIELDS",
    "REPORT_INVALID",
    "LossFunc",
    "broadcast_from_last_stage",
    "make_loss_func",
    "merge_packed",
    "merged_sums",
    "output_from_sums",
    "reduce_losses",
    "report_of",
    "sum_reports",
]

REPORT_INVALID = "cliptrack/invalid"
"""Private report key: int64 vector of bad-input counts (``adapters.losses.INPUT_CHECKS`` order)."""

_COUNT_KEYS = keys.TOKEN_COUNT_KEYS
_N_REPORTS = "reports"
_N_CLIP_REPORTS = "clip_reports"
PACKED_FIELDS: tuple[str, ...] = (
    keys.LOSS_SUM,
    *_COUNT_KEYS,
    _N_REPORTS,
    _N_CLIP_REPORTS,
    *(f"invalid[{i}]" for i in range(len(INPUT_CHECKS))),
)
"""Layout of the one float64 vector merged across ranks per step.

``loss:sum``, the four token counts, the number of micro-batch reports and of those from a
clipping loss, then the bad-input counts. float64 because the loss sum is a float and every count
stays exact below 2**53 tokens (checked on the host after the reduction); one dtype means one
collective.
"""

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
    loss_fn: str | Callable[..., LossOutput],
    loss_fn_inputs: Mapping[str, Tensor],
    loss_fn_config: Mapping[str, Any] | None = None,
    *,
    output_to_logprobs: Callable[[Tensor], Tensor] | None = None,
) -> LossFunc:
    """Build the loss function of one micro-batch for a Megatron-Core ``forward_step_func``.

    ``loss_fn``: a name of :data:`adapters.losses.LOSSES` (``"ppo"``, ``"cispo"``, ...) or a
    function with the same convention returning a :class:`~adapters.losses.LossOutput`.
    ``loss_fn_inputs``: the micro-batch's per-token tensors other than the policy log-probs, named
    as the loss function's parameters (``sampling_logprobs``, ``advantages``, ``mask``, or
    ``weights`` for cross entropy). ``loss_fn_config``: the loss's keyword options
    (``clip_low_threshold``, ``clip_high_threshold``, ``beta``). ``output_to_logprobs`` maps the
    model's output tensor to per-token log-probs of the shape of the inputs (default: the output
    is the log-probs; for a Megatron ``GPTModel`` called with ``labels``, which returns per-token
    cross entropy, pass ``torch.neg``).

    Returns ``loss_func(output_tensor) -> (loss, num_tokens, report)``: ``loss`` is the summed
    per-token loss, ``num_tokens`` the int64 count of eligible tokens, ``report`` the 0-dim tensors
    ``loss:sum`` (detached copy, unaffected by Megatron's in-place scaling), ``loss_tokens:sum``
    and, for clipping losses, ``clipped_tokens:sum``, ``clipped_low_tokens:sum``,
    ``clipped_high_tokens:sum``, plus the bad-input vector under :data:`REPORT_INVALID`. Unknown or
    missing input and option names are raised here, shapes and Python-number options when the loss
    runs; bad tensor values (NaN, masks not 0/1) are counted on device and raised by
    :func:`reduce_losses` after its collective.
    """
    fn = _resolve_loss(loss_fn)
    name = getattr(fn, "__name__", repr(fn))
    inputs = dict(loss_fn_inputs)
    config = dict(loss_fn_config or {})
    _check_arguments(fn, name, inputs, config)
    if output_to_logprobs is not None and not callable(output_to_logprobs):
        raise TypeError(f"output_to_logprobs must be callable, got {type(output_to_logprobs).__name__}")

    def loss_func(output_tensor: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        logprobs = output_tensor if output_to_logprobs is None else output_to_logprobs(output_tensor)
        out = fn(logprobs, **inputs, **config)
        if not isinstance(out, LossOutput):
            raise TypeError(f"loss function {name} returned {type(out).__name__}, expected LossOutput")
        return out.loss, out.loss_tokens, report_of(out)

    loss_func.__name__ = f"{name}_loss_func"
    return loss_func


def report_of(out: LossOutput) -> dict[str, Tensor]:
    """The Megatron report of one micro-batch's :class:`LossOutput` (0-dim device tensors, no sync)."""
    report = {
        keys.LOSS_SUM: out.loss.detach().clone(),  # Megatron divides the loss in place
        keys.LOSS_TOKENS: out.loss_tokens.detach(),
        REPORT_INVALID: out.invalid.detach(),
    }
    if out.clips:
        assert out.clipped_tokens is not None
        assert out.clipped_low_tokens is not None and out.clipped_high_tokens is not None
        report[keys.CLIPPED_TOKENS] = out.clipped_tokens.detach()
        report[keys.CLIPPED_LOW_TOKENS] = out.clipped_low_tokens.detach()
        report[keys.CLIPPED_HIGH_TOKENS] = out.clipped_high_tokens.detach()
    return report


def _resolve_loss(loss_fn: str | Callable[..., LossOutput]) -> Callable[..., LossOutput]:
    if isinstance(loss_fn, str):
        if loss_fn not in LOSSES:
            raise ValueError(f"loss_fn {loss_fn!r} is not one of {sorted(LOSSES)}")
        return LOSSES[loss_fn]  # type: ignore[return-value]
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a loss name or a callable, got {type(loss_fn).__name__}")
    return loss_fn


def _check_arguments(fn: Callable[..., Any], name: str, inputs: dict[str, Any], config: dict[str, Any]) -> None:
    """Match inputs to the loss's tensor parameters and config to its keyword-only options."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # builtins / C callables: nothing to check
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    options = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    accepted = {p.name for p in positional}
    required = {p.name for p in positional if p.default is p.empty}
    for key, value in inputs.items():
        if key not in accepted:
            raise ValueError(
                f"loss_fn_inputs has {key!r}, which loss {name} does not take; it takes {sorted(accepted)} "
                "(the policy log-probs come from the model's output tensor)"
            )
        if not isinstance(value, Tensor):
            raise TypeError(f"loss_fn_inputs[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
    missing = sorted(required - set(inputs))
    if missing:
        raise ValueError(f"loss_fn_inputs lacks {missing} required by loss {name}")
    for key in config:
        if key not in options:
            raise ValueError(
                f"loss_fn_config has {key!r}, which loss {name} does not take; its options are {sorted(options)}"
            )
    missing_options = sorted(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty)
    missing_options = [k for k in missing_options if k not in config]
    if missing_options:
        raise ValueError(f"loss_fn_config lacks {missing_options} required by loss {name}")


# ---------------------------------------------------------------------------------------------
# Reduction side: once per step, after forward_backward_func.
# ---------------------------------------------------------------------------------------------


def sum_reports(losses_reduced: Sequence[Mapping[str, Tensor]], device: torch.device | str | None = None) -> Tensor:
    """Sum micro-batch reports on device into one float64 vector laid out as :data:`PACKED_FIELDS`.

    No host synchronisation. An empty list gives zeros on ``device`` (default: CPU). Raises
    ValueError naming the micro-batch and key when a report is malformed.
    """
    if not isinstance(losses_reduced, Sequence) or isinstance(losses_reduced, (str, bytes, Mapping)):
        raise TypeError(
            f"losses_reduced must be the list forward_backward_func returned, got {type(losses_reduced).__name__}"
        )
    rows = [_pack_report(i, report) for i, report in enumerate(losses_reduced)]
    if not rows:
        return torch.zeros(len(PACKED_FIELDS), dtype=torch.float64, device=device)
    target = torch.device(device) if device is not None else rows[0].device
    return torch.stack([row.to(target) for row in rows]).sum(dim=0)


def _pack_report(index: int, report: object) -> Tensor:
    if not isinstance(report, Mapping):
        raise TypeError(
            f"micro-batch {index}: report is a {type(report).__name__}, expected the dict returned by a "
            "loss function of adapters.megatron.make_loss_func"
        )
    required = (keys.LOSS_SUM, keys.LOSS_TOKENS, REPORT_INVALID)
    missing = [k for k in required if k not in report]
    if missing:
        raise ValueError(f"micro-batch {index}: report lacks {missing} (has {sorted(report)})")
    clip_present = [k for k in keys.CLIP_COUNT_KEYS if k in report]
    if clip_present and len(clip_present) != len(keys.CLIP_COUNT_KEYS):
        absent = [k for k in keys.CLIP_COUNT_KEYS if k not in report]
        raise ValueError(f"micro-batch {index}: report has {clip_present} but not {absent}")
    scalars = [keys.LOSS_SUM, keys.LOSS_TOKENS, *clip_present]
    for key in (*scalars, REPORT_INVALID):
        if not isinstance(report[key], Tensor):
            raise TypeError(f"micro-batch {index}: report[{key!r}] is a {type(report[key]).__name__}, expected a tensor")
    for key in scalars:
        if report[key].numel() != 1:
            raise ValueError(f"micro-batch {index}: report[{key!r}] has shape {tuple(report[key].shape)}, expected one value")
    invalid = report[REPORT_INVALID]
    if invalid.shape != (len(INPUT_CHECKS),):
        raise ValueError(
            f"micro-batch {index}: report[{REPORT_INVALID!r}] has shape {tuple(invalid.shape)}, "
            f"expected ({len(INPUT_CHECKS)},)"
        )
    device = report[keys.LOSS_SUM].device
    zero = torch.zeros((), dtype=torch.float64, device=device)
    one = torch.ones((), dtype=torch.float64, device=device)
    counts = [report[k].detach().reshape(()).to(device=device, dtype=torch.float64) if k in report else zero
              for k in _COUNT_KEYS]
    head = torch.stack(
        [report[keys.LOSS_SUM].detach().reshape(()).to(dtype=torch.float64), *counts, one,
         one if clip_present else zero]
    )
    return torch.cat([head, invalid.detach().to(device=device, dtype=torch.float64)])


def merged_sums(
    losses_reduced: Sequence[Mapping[str, Tensor]],
    group: Any = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Sum the reports on device, then merge them over ``group`` in one collective.

    ``group``: a ``torch.distributed`` process group (every rank of it must call), or ``None`` for
    one process (no collective). Returns the float64 vector of :data:`PACKED_FIELDS`, on device.
    See :func:`merge_packed` for the collective.
    """
    if device is None and not losses_reduced and group is not None:
        device = _collective_device(group)
    packed = sum_reports(losses_reduced, device=device)
    return packed if group is None else merge_packed(packed, group)


def merge_packed(packed: Tensor, group: Any) -> Tensor:
    """Sum a 1-D vector over the ranks of ``group`` with exactly one collective.

    A CPU tensor on a gloo group goes through one ``all_to_all_single``: every rank sends its vector
    to every rank and each adds the ``world`` vectors locally, in rank order. Gloo's ring
    ``all_reduce`` needs 2 x (world - 1) dependent rounds once the vector has more elements than
    about two (measured: a 13-element ``all_reduce`` over 4 ranks costs more than five 1-element
    ones), while the all-to-all is one round. Any other tensor/backend (NCCL on GPU) uses one
    ``all_reduce``. Both are exact for integer counts in float64; the all-to-all also gives a
    bit-identical ``loss:sum`` on every rank.
    """
    if packed.dim() != 1:
        raise ValueError(f"packed must be a 1-D vector, got shape {tuple(packed.shape)}")
    world = dist.get_world_size(group)
    if world == 1:
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
        return packed
    if packed.device.type == "cpu" and "gloo" in str(dist.get_backend(group)).lower():
        gathered = torch.empty(world * packed.numel(), dtype=packed.dtype, device=packed.device)
        dist.all_to_all_single(gathered, packed.repeat(world), group=group)
        return gathered.view(world, packed.numel()).sum(dim=0)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    return packed


def reduce_losses(
    losses_reduced: Sequence[Mapping[str, Tensor]],
    *,
    group: Any = AUTO,
    loss_fn_output_type: str = "ArrayRecord",
    device: torch.device | str | None = None,
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

    All keys are merged in **one** collective on a float64 vector (:data:`PACKED_FIELDS`; see
    :func:`merge_packed`), then
    synchronised with the host once. Bad loss inputs counted on any rank raise ValueError after that
    collective, on every rank alike, rather than yield a wrong number. Metrics: ``loss:sum``,
    ``loss_tokens:sum`` and, for a clipping loss, the clipped counts and ``clip_fraction:mean``
    (formed from the merged sums; absent when no token was eligible). A loss that never clips emits
    no clip keys.
    """
    if group is AUTO:
        state = _parallel_state()
        if state is not None:
            if not state.is_pipeline_last_stage(ignore_virtual=True):
                if losses_reduced:
                    raise ValueError(
                        f"losses_reduced has {len(losses_reduced)} reports on a rank that is not on the "
                        "last pipeline stage; Megatron returns [] there"
                    )
                return None
            group = state.get_data_parallel_group(with_context_parallel=True)
        else:
            group = _default_group()
    packed = merged_sums(losses_reduced, group=group, device=device)
    return output_from_sums(packed.tolist(), loss_fn_output_type=loss_fn_output_type)


def output_from_sums(values: Sequence[float], *, loss_fn_output_type: str = "ArrayRecord") -> ForwardBackwardOutput:
    """Build the output from the merged :data:`PACKED_FIELDS` values (host numbers)."""
    if len(values) != len(PACKED_FIELDS):
        raise ValueError(f"expected {len(PACKED_FIELDS)} merged values ({PACKED_FIELDS}), got {len(values)}")
    fields = dict(zip(PACKED_FIELDS, values, strict=True))
    raise_invalid([int(fields[f"invalid[{i}]"]) for i in range(len(INPUT_CHECKS))])
    n_reports, n_clip = int(fields[_N_REPORTS]), int(fields[_N_CLIP_REPORTS])
    if n_reports == 0:
        raise ValueError(
            "losses_reduced is empty on every rank: pass the list forward_backward_func returned on the "
            "last pipeline stage (one report per micro-batch)"
        )
    if n_clip not in (0, n_reports):
        raise ValueError(
            f"{n_clip} of {n_reports} micro-batch reports come from a clipping loss and the rest from a loss "
            "that never clips; one step must use one kind of loss"
        )
    # whole, non-negative token counts (a hand-written report may carry a float or negative count)
    counts = {key: as_count(f"{key} (summed over micro-batches and ranks)", fields[key]) for key in _COUNT_KEYS}
    loss_sum = fields[keys.LOSS_SUM]
    if not math.isfinite(loss_sum):
        raise ValueError(f"{keys.LOSS_SUM} is {loss_sum!r} after merging: a loss value was not finite")
    metrics: dict[str, float] = {keys.LOSS_SUM: float(loss_sum)}
    clip_counts = ClipCounts(*(counts[k] for k in _COUNT_KEYS)) if n_clip else None
    metrics.update(token_metrics(counts[keys.LOSS_TOKENS], clip_counts))
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
        state = _parallel_state()
        if state is None:
            if output is None:
                raise ValueError("output is None and there is no pipeline group to receive it from")
            return output
        group = state.get_pipeline_model_parallel_group()
        src = state.get_pipeline_model_parallel_last_rank()
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
    dist.broadcast_object_list(payload, src=src, group=group, device=torch.device(device) if device is not None else _collective_device(group))
    result = payload[0]
    if not isinstance(result, ForwardBackwardOutput):
        raise TypeError(f"received {type(result).__name__} from rank {src}, expected ForwardBackwardOutput")
    return result


def _parallel_state() -> Any:
    """Megatron's ``parallel_state`` when installed and initialised, else ``None`` (lazy import)."""
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    return parallel_state if parallel_state.model_parallel_is_initialized() else None


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
