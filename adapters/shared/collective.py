"""The one collective of every stack: a packed vector (:mod:`cliptrack.adapters.shared.packing`)
merged over the ranks of a process group, sums added and extremes by max, in one exchange."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from cliptrack.adapters.shared.packing import combine_packed
from cliptrack.core import measures
from torch import Tensor


def merge_packed(packed: Tensor, group: Any, declaration: measures.Declaration = measures.DEFAULT) -> Tensor:
    """Combine a packed vector (:data:`cliptrack.adapters.shared.packing.PACKED_FIELDS`) over the ranks of ``group``
    with exactly one collective: its added part summed, its extremes by max.

    Every rank receives every rank's vector (:func:`gather_vectors`) and combines the ``world``
    rows locally, in rank order (:func:`cliptrack.adapters.shared.packing.combine_packed`), so one
    collective carries the sums and the gauge's extremes alike, with a bit-identical result on
    every rank. Exact for integer counts in float64.
    """
    return combine_packed(gather_vectors(packed, group), declaration)


def gather_vectors(vector: Tensor, group: Any) -> Tensor:
    """Every rank's ``vector`` (1-D, the same length on every rank) as the rows of a ``[world,
    length]`` tensor, in rank order, on every rank: **one** collective. A CPU tensor on a gloo group
    goes through one ``all_to_all_single`` (gloo's ring ``all_reduce`` and ``all_gather`` need
    ``world - 1`` or more dependent rounds, the all-to-all one: ``benchmarks/merge.py``); any other
    tensor/backend (NCCL on GPU) through one ``all_gather_into_tensor``; one rank: a no-op sum, so
    every layout communicates alike."""
    if vector.dim() != 1:
        raise ValueError(f"packed must be a 1-D vector, got shape {tuple(vector.shape)}")
    world = dist.get_world_size(group)
    if world == 1:
        dist.all_reduce(vector, op=dist.ReduceOp.SUM, group=group)
        return vector.reshape(1, -1)
    gathered = torch.empty(world * vector.numel(), dtype=vector.dtype, device=vector.device)
    if vector.device.type == "cpu" and "gloo" in str(dist.get_backend(group)).lower():
        dist.all_to_all_single(gathered, vector.repeat(world), group=group)
    else:
        dist.all_gather_into_tensor(gathered, vector.contiguous(), group=group)
    return gathered.view(world, vector.numel())
