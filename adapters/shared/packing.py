"""The packing: a loss's measured sums as one float64 vector, for every host transfer and the one
collective of every stack.

A packed vector holds ``loss:sum``, every sum measure, the call counters and the bad-input counts
of :data:`INPUT_CHECKS` (all added), then the extremes (combined by max); its layout is the
declaration's (:data:`cliptrack.core.measures.PACKED_FIELDS`). Packing and combining stay on the
vectors' device (no host sync); :func:`unpack` reads one on the host, exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from cliptrack.core import keys, measures
from cliptrack.core.sums import MeasuredSums, as_count, check_sums
from torch import Tensor

INPUT_CHECKS = (
    "non-finite values (NaN or inf) in logprobs, sampling_logprobs, advantages, weights, old_logprobs, "
    "importance_weights or weight_lag, or a negative weight_lag, in {n} loss call(s)",
    "mask has {n} entries that are neither 0 nor 1",
    "clip thresholds have {n} entries that are negative, non-finite or with low > high",
)
"""Messages for the entries of ``LossOutput.invalid``, in order; ``{n}`` is the entry's value."""


_NONFINITE, _MASK, _THRESHOLDS = range(len(INPUT_CHECKS))
assert len(INPUT_CHECKS) == measures.INVALID_SLOTS

Sources = tuple[dict[str, Tensor], ...]
"""Detached inputs of each loss call, by argument name, kept to name bad entries precisely."""


def raise_invalid(invalid: Tensor | list[int], sources: Sources = ()) -> None:
    """Raise ValueError describing bad loss inputs flagged in an ``invalid`` vector.

    With ``sources`` (the inputs of the loss calls), the message names each bad tensor and its
    number of bad entries; without, it says which check failed and in how many calls.
    """
    counts = invalid.tolist() if isinstance(invalid, Tensor) else list(invalid)
    if not any(counts):
        return
    problems = [INPUT_CHECKS[i].format(n=int(n)) for i, n in enumerate(counts) if n]
    if sources:
        precise = _diagnose(sources)
        if counts[_THRESHOLDS]:
            precise.append(INPUT_CHECKS[_THRESHOLDS].format(n=int(counts[_THRESHOLDS])))
        if precise:
            problems = precise
        elif counts[_NONFINITE]:
            problems = [
                "the loss, logprobs - sampling_logprobs or its importance weight exp(logprobs - "
                "sampling_logprobs) overflows to inf although the inputs are finite"
            ]
    raise ValueError("invalid loss input: " + "; ".join(problems))


def _diagnose(sources: Sources) -> list[str]:
    """Per-tensor counts of bad entries over all loss calls (host side, only on error)."""
    nonfinite: dict[str, int] = {}
    bad_mask = negative_lag = 0
    for source in sources:
        for name, tensor in source.items():
            if name == "mask":
                if tensor.dtype != torch.bool:
                    bad_mask += int(((tensor != 0) & (tensor != 1)).sum())
                continue
            if tensor.is_floating_point():
                nonfinite[name] = nonfinite.get(name, 0) + int((~torch.isfinite(tensor)).sum())
            if name == "weight_lag":
                negative_lag += int((tensor < 0).sum())
    problems = [f"{name} has {n} non-finite entries (NaN or inf)" for name, n in nonfinite.items() if n]
    if negative_lag:
        problems.append(
            f"weight_lag has {negative_lag} negative entries (a lag is the training weights' version "
            "minus the version that sampled, >= 0)"
        )
    if bad_mask:
        problems.append(f"mask has {bad_mask} entries that are neither 0 nor 1")
    return problems


PACKED_DTYPE = torch.float64
"""The one dtype of a packed vector: every count stays exact below 2**53 tokens (checked on the
host by :func:`unpack`), so a step's vectors combine on device and cross ranks in one collective.

The layout is the declaration's (:attr:`cliptrack.core.measures.Declaration.packed_fields`;
:data:`PACKED_FIELDS` for the default one): ``loss:sum`` and every sum measure (0 where absent), the call counters, the bad-input
counts of :data:`INPUT_CHECKS`, all added; then the extremes (``log_ratio:max``,
``-log_ratio:min``; ``-inf`` where absent or over no token), combined by max (:func:`combine_packed`).
"""


PACKED_FIELDS: tuple[str, ...] = measures.PACKED_FIELDS
"""Layout of a packed :class:`LossOutput` under the default declaration
(:data:`cliptrack.core.measures.PACKED_FIELDS`)."""


PACKED_ADDED: int = len(measures.PACKED_ADDED)
"""Number of leading packed fields that add under the default declaration; the rest combine by max."""


@functools.lru_cache(maxsize=256)
def _constants(device: torch.device, calls: int, groups: tuple[bool, ...]) -> tuple[Tensor, Tensor, Tensor]:
    """The call counters ``[calls, per-group calls...]``, a 0 and a ``-inf`` on ``device``, made
    once per combination (fills, never a host-to-device copy); only ever read. ``groups``: whether
    each optional group of the declaration is carried."""
    values = (float(calls), *(float(calls if present else 0) for present in groups))
    counters = torch.empty(len(values), dtype=PACKED_DTYPE, device=device)
    for i, value in enumerate(values):
        counters[i].fill_(value)
    zero = torch.zeros((), dtype=PACKED_DTYPE, device=device)
    return counters, zero, torch.full((), -math.inf, dtype=PACKED_DTYPE, device=device)


def present_groups(
    measured: Mapping[str, object], declaration: measures.Declaration = measures.DEFAULT
) -> tuple[str, ...]:
    """The optional groups of ``declaration`` that ``measured`` carries whole (every sum of the
    group present, and the group it refines too), in declaration order."""
    present: list[str] = []
    for group in declaration.groups:
        if not group.optional:
            continue
        sums = [m.key for m in declaration.members[group.name] if m.reduction == measures.SUM]
        if sums and all(k in measured for k in sums) and (group.within is None or group.within in present):
            present.append(group.name)
    return tuple(present)


def pack_rows(
    loss: Tensor,
    measured: Mapping[str, Tensor],
    invalid: Tensor,
    calls: int = 1,
    declaration: measures.Declaration = measures.DEFAULT,
) -> Tensor:
    """``[n, len(declaration.packed_fields)]`` rows of ``n`` loss outputs of one layout, each field given for
    all of them at once: ``loss`` ``[n]``, ``measured`` metric key -> ``[n]`` (a key absent: the
    measure is absent in every output; only groups carried whole are packed), ``invalid``
    ``[n, len(INPUT_CHECKS)]``; ``calls`` per row. A few stacked ops whatever ``n``, on ``loss``'s
    device. No sync."""
    device = loss.device
    n = loss.shape[0]
    groups = present_groups(measured, declaration)
    optional = declaration.optional_groups
    counters, zero, minus_inf = _constants(device, calls, tuple(g in groups for g in optional))
    carried = {measures.EVERY, *groups}

    def column(measure: measures.Measure) -> Tensor:
        value = measured.get(measure.key) if measure.group in carried else None
        if value is None:
            return (zero if measure.reduction == measures.SUM else minus_inf).expand(n)
        value = value.to(device=device, dtype=PACKED_DTYPE)
        return -value if measure.reduction == measures.MIN else value

    head = torch.stack(
        [loss.to(device=device, dtype=PACKED_DTYPE), *(column(m) for m in declaration.sum_measures[1:])],
        dim=1,
    )
    parts = [head, counters.expand(n, -1), invalid.to(device=device, dtype=PACKED_DTYPE)]
    if declaration.extreme_measures:
        parts.append(torch.stack([column(m) for m in declaration.extreme_measures], dim=1))
    return torch.cat(parts, dim=1)


class Packable(Protocol):
    """What :func:`pack` reads of a loss's output (:class:`cliptrack.adapters.losses.output.LossOutput`
    is one): the loss sum, the measured values by metric key, the bad-input counts, the calls and
    the declaration of its measures."""

    @property
    def loss(self) -> Tensor: ...

    @property
    def measured(self) -> Mapping[str, Tensor]: ...

    @property
    def invalid(self) -> Tensor: ...

    @property
    def calls(self) -> int: ...

    @property
    def declaration(self) -> measures.Declaration: ...


def pack(out: Packable) -> Tensor:
    """``out`` as one vector laid out as its declaration's packed fields, on its device (no host sync)."""
    measured = {key: value.detach().reshape(1) for key, value in out.measured.items()}
    loss, invalid = out.loss.detach().reshape(1), out.invalid.detach().reshape(1, -1)
    return pack_rows(loss, measured, invalid, out.calls, out.declaration)[0]


def combine_packed(rows: Tensor, declaration: measures.Declaration = measures.DEFAULT) -> Tensor:
    """Combine packed vectors (the rows of ``rows``, ``[n, len(declaration.packed_fields)]``) into
    one: the added part summed, the extremes by max (the merge rules of
    :mod:`cliptrack.core.measures`). No sync."""
    width, added = len(declaration.packed_fields), len(declaration.packed_added)
    if rows.dim() != 2 or rows.shape[1] != width:
        raise ValueError(f"rows must have shape [n, {width}], got {tuple(rows.shape)}")
    return torch.cat([rows[:, :added].sum(dim=0), rows[:, added:].amax(dim=0)])


@dataclass(frozen=True)
class PackedSums:
    """Host values of a packed vector: ``loss_sum`` (sum of per-token losses), the exact measured
    sums ``counts`` (the gauge included), the number of loss ``calls`` and the bad-input counts
    ``invalid``."""

    loss_sum: float
    counts: MeasuredSums
    calls: int
    invalid: list[int] = field(default_factory=list)

    def check(self, sources: Sources = ()) -> None:
        """Raise ValueError describing bad loss inputs (naming tensors when ``sources`` are given)."""
        raise_invalid(self.invalid, sources)


def _mixed_calls(group: str, present: int, calls: int) -> ValueError:
    what = {measures.CLIP: "a clipping loss", measures.GAUGE: "a loss with the on-policy gauge"}.get(
        group, f"a loss with the {group} measures"
    )
    rest = {
        measures.CLIP: "a loss that never clips",
        measures.GAUGE: "a loss without it (cross_entropy)",
    }.get(group, "a loss without them")
    return ValueError(
        f"{present} of {calls} loss calls come from {what} and the rest from {rest}; one step must use "
        "one kind of loss (PPO and CISPO sum together)"
    )


def _carried_groups(
    values: Sequence[float], slot: Mapping[str, int], calls: int, declaration: measures.Declaration
) -> set[str]:
    """The groups every call of a packed vector carried (by their call counters); ValueError for
    a group that refuses mixing carried by some calls only."""
    present = {measures.EVERY}
    for group in declaration.groups:
        if not group.optional:
            continue
        carrying = int(values[slot[group.counter]])
        if carrying == 0 or (group.within is not None and group.within not in present):
            continue
        if carrying != calls:
            if group.dropped_when_mixed:
                continue
            raise _mixed_calls(group.name, carrying, calls)
        present.add(group.name)
    return present


def unpack(
    values: Sequence[float], where: str = "", declaration: measures.Declaration = measures.DEFAULT
) -> PackedSums:
    """Read a packed vector of ``declaration`` brought to the host (one combination of packed outputs).

    Counts are checked whole, non-negative and exact (below 2**53), every value as
    :func:`cliptrack.core.sums.check_sums` checks it; ``where`` is appended to the name of a bad
    value. Raises ValueError when the combination mixes calls with and without a group that
    refuses mixing (a clipping and a non-clipping loss, losses with and without the gauge). A group
    ``dropped_when_mixed`` (the split) is kept only when every call carried it. Bad inputs are
    left in ``invalid`` (see :meth:`PackedSums.check`); with any, a group with float values is not
    read (its values are then not meaningful).
    """
    fields = declaration.packed_fields
    if len(values) != len(fields):
        raise ValueError(f"expected {len(fields)} packed values ({fields}), got {len(values)}")
    slot = declaration.slot
    invalid = [int(values[slot[f"invalid[{i}]"]]) for i in range(measures.INVALID_SLOTS)]
    calls = int(values[slot["calls"]])
    present = _carried_groups(values, slot, calls, declaration)
    if any(invalid):
        present -= {m.group for m in declaration.datum_measures if not m.exact}
    suffix = f" ({where})" if where else ""
    tokens = as_count(f"{keys.LOSS_TOKENS}{suffix}", values[slot[keys.LOSS_TOKENS]])
    sums: dict[str, float | int] = {}
    for measure in declaration.datum_measures:
        if measure.group not in present:
            continue
        value = float(values[slot[measure.key]])
        if measure.reduction == measures.SUM:
            sums[measure.key] = as_count(f"{measure.key}{suffix}", value) if measure.exact else value
        elif tokens:  # an extreme over no token is none
            sums[measure.key] = -value if measure.reduction == measures.MIN else value
    sums[keys.LOSS_TOKENS] = tokens
    return PackedSums(
        float(values[slot[keys.LOSS_SUM]]),
        MeasuredSums(check_sums(sums, suffix, declaration), declaration=declaration),
        calls,
        invalid,
    )
