"""The worst sequences of a step on device: per-sequence gauge rows, their top ``k``, exact merges.

Rows hold :data:`cliptrack.core.worst.COLUMNS` in float64 (``[datum, tokens, log_ratio,
abs_log_ratio, kl_k3, max_abs_log_ratio, worst_token]``; counts, ids and positions are whole
numbers, exact below 2**53). :func:`sequence_rows` forms one row per sequence of a loss call's
``[sequences, tokens]`` inputs; :func:`top_rows` keeps, per criterion
(:data:`cliptrack.core.worst.CRITERIA`), the ``k`` rows that rank highest in the one total order of
:mod:`cliptrack.core.worst` (value descending, then datum ascending; rows without an eligible token
last), as a fixed-size ``[criteria, k, columns]`` block, padded with empty rows; :func:`merge_top`
merges such blocks (micro-batches, ranks) exactly; :func:`worst_from_block` reads one on the host.
Everything is detached tensor work on the input's device: no host synchronisation until the
caller's one read (the sums' ``tolist``).
"""

from __future__ import annotations

import math

import torch
from cliptrack.core.worst import COLUMNS, CRITERIA, SequenceGauge, Worst
from torch import Tensor

__all__ = ["WIDTH", "merge_top", "sequence_rows", "top_rows", "worst_from_block", "worst_token"]

WIDTH = len(COLUMNS)
"""Values per row."""
_COLUMN = {name: i for i, name in enumerate(COLUMNS)}
_TOKENS = _COLUMN["tokens"]
_DATUM = _COLUMN["datum"]
MAX_ID = 2**53 - 1
"""The largest datum id a row takes (float64 holds every integer up to it exactly)."""


def sequence_rows(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    mask: Tensor | None = None,
    *,
    datum_ids: Tensor | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """One row per sequence, ``[sequences, WIDTH]`` float64 on the inputs' device.

    ``logprobs`` / ``sampling_logprobs`` / ``mask``: ``[sequences, tokens]`` (a 1-D input is one
    sequence); ``l = logprobs - sampling_logprobs`` as the loss forms it (in the inputs' dtype),
    then summed in float64 over the eligible tokens (``mask != 0``; all without a mask): ``l``,
    ``|l|`` and the k3 term ``expm1(l) - l``; the largest ``|l|`` and its token's position (the
    first such; from ``positions``, ``[sequences, tokens]``, when the sequence's tokens are a slice
    of it, as under context parallelism; else the index in the row). ``datum_ids``:
    ``[sequences]`` integer ids (default ``0, 1, ...``). A sequence without an eligible token has
    zeros and position ``-1``. Detached, no host sync.
    """
    with torch.no_grad():
        log_ratio = logprobs.detach() - sampling_logprobs.detach()
        if log_ratio.dim() == 1:
            log_ratio = log_ratio.reshape(1, -1)
        l64 = log_ratio.to(torch.float64)
        on = (
            torch.ones_like(l64, dtype=torch.bool)
            if mask is None
            else (mask.detach().reshape(l64.shape) != 0)
        )
        zero = torch.zeros((), dtype=torch.float64, device=l64.device)
        size = l64.abs()
        k3 = torch.expm1(l64).sub_(l64).clamp_min_(0.0)
        tokens = on.sum(dim=1, dtype=torch.int64).to(torch.float64)
        scored = torch.where(on, size, -1.0)
        where = scored.argmax(dim=1, keepdim=True)  # the first largest |l|
        largest = scored.gather(1, where)[:, 0].clamp_min(0.0)
        if positions is not None:
            where = positions.detach().reshape(l64.shape).to(torch.int64).gather(1, where)
        position = torch.where(tokens > 0, where[:, 0].to(torch.float64), -1.0)
        if datum_ids is None:
            ids = torch.arange(l64.shape[0], dtype=torch.float64, device=l64.device)
        else:
            ids = _ids(datum_ids, l64.device)
            if ids.numel() != l64.shape[0]:
                raise ValueError(f"datum_ids has {ids.numel()} entries for {l64.shape[0]} sequences")
        return torch.stack(
            [
                ids,
                tokens,
                torch.where(on, l64, zero).sum(dim=1),
                torch.where(on, size, zero).sum(dim=1),
                torch.where(on, k3, zero).sum(dim=1),
                largest,
                position,
            ],
            dim=1,
        )


def _ids(datum_ids: Tensor, device: torch.device) -> Tensor:
    """``datum_ids`` as the rows' float64 column: an id outside ``0 .. MAX_ID`` (not exact in
    float64, or negative like the empty rows' ``-1``) becomes NaN, refused by
    :func:`worst_from_block` if it ranks. No sync."""
    raw = datum_ids.detach().reshape(-1).to(device)
    ids = raw.to(torch.float64)
    if raw.is_floating_point():
        bad = ~((ids >= 0) & (ids <= MAX_ID) & (ids == ids.floor()))
    else:
        wide = raw.to(torch.int64)
        bad = (wide < 0) | (wide > MAX_ID)
    return torch.where(bad, math.nan, ids)


def worst_token(logprobs: Tensor, sampling_logprobs: Tensor, mask: Tensor | None = None) -> Tensor:
    """The position of one sequence's eligible token with the largest ``|l|`` (the first such), a
    1-element int64 tensor (0 when no token is eligible: the caller knows from its count); the
    ``worst_token`` of :func:`sequence_rows` in four ops. Detached, no sync."""
    with torch.no_grad():
        size = (logprobs.detach() - sampling_logprobs.detach()).abs().reshape(-1)
        if mask is not None:
            size = torch.where(mask.detach().reshape(-1) != 0, size, -1.0)
        return size.argmax().reshape(1)


def _key(rows: Tensor, criterion: str) -> Tensor:
    """Each row's value under ``criterion``, ``-inf`` for a row without an eligible token."""
    return torch.where(rows[:, _TOKENS] > 0, rows[:, _COLUMN[criterion]], -math.inf)


def _order(rows: Tensor, criterion: str) -> Tensor:
    """Indices of ``rows`` in the total order under ``criterion``: value descending, datum
    ascending, rows without a token last (two stable sorts; no sync)."""
    by_datum = torch.argsort(rows[:, _DATUM], stable=True)
    key = _key(rows[by_datum], criterion)
    return by_datum[torch.argsort(key, descending=True, stable=True)]


def _best_passes(rows: Tensor, criterion: str) -> Tensor:
    """``rows`` with each datum's other passes emptied: a datum seen in several rows (PPO epochs,
    or several micro-batches) keeps only its best under ``criterion``, the largest value, ties by
    the rest of the row (largest), as :func:`cliptrack.core.worst.worst_of` chooses. Stable sorts,
    least significant key first; no sync."""
    order = torch.arange(rows.shape[0], device=rows.device)
    for column in reversed(range(_TOKENS, WIDTH)):
        order = order[torch.argsort(rows[order, column], descending=True, stable=True)]
    order = order[torch.argsort(_key(rows[order], criterion), descending=True, stable=True)]
    order = order[torch.argsort(rows[order, _DATUM], stable=True)]
    datum = rows[order, _DATUM]
    repeat = torch.cat([datum.new_zeros(1, dtype=torch.bool), datum[1:] == datum[:-1]])
    emptied = torch.zeros_like(repeat).scatter(0, order, repeat)  # by row, without a mask index (a sync)
    return torch.where(emptied[:, None], _empty_rows(1, rows), rows)


def _empty_rows(k: int, like: Tensor) -> Tensor:
    """``k`` rows of no sequence: datum ``-1``, no token, position ``-1``."""
    rows = torch.zeros((k, WIDTH), dtype=torch.float64, device=like.device)
    rows[:, _DATUM] = -1.0
    rows[:, _COLUMN["worst_token"]] = -1.0
    return rows


def top_rows(rows: Tensor, k: int) -> Tensor:
    """The ``k`` highest-ranking rows per criterion, ``[len(CRITERIA), k, WIDTH]`` (padded with
    empty rows when there are fewer). No sync."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if rows.dim() != 2 or rows.shape[1] != WIDTH:
        raise ValueError(f"rows must have shape [n, {WIDTH}], got {tuple(rows.shape)}")
    padded = torch.cat([rows.to(torch.float64), _empty_rows(k, rows)])
    out = []
    for c in CRITERIA:
        distinct = _best_passes(padded, c)
        out.append(distinct[_order(distinct, c)[:k]])
    return torch.stack(out)


def merge_top(blocks: Tensor, k: int) -> Tensor:
    """Merge ``[parts, len(CRITERIA), k', WIDTH]`` blocks (each a :func:`top_rows` of disjoint
    sequences, ``k' >= k``) into one ``[len(CRITERIA), k, WIDTH]`` block: per criterion the top ``k``
    of the parts' rows, which is the top ``k`` of all their sequences. No sync."""
    if blocks.dim() != 4 or blocks.shape[1] != len(CRITERIA) or blocks.shape[3] != WIDTH:
        raise ValueError(
            f"blocks must have shape [parts, {len(CRITERIA)}, k, {WIDTH}], got {tuple(blocks.shape)}"
        )
    out = []
    for i, c in enumerate(CRITERIA):
        rows = _best_passes(torch.cat([blocks[:, i].reshape(-1, WIDTH), _empty_rows(k, blocks)]), c)
        out.append(rows[_order(rows, c)[:k]])
    return torch.stack(out)


def worst_from_block(values: list, step: int, k: int) -> Worst:
    """A ``[len(CRITERIA), k, WIDTH]`` block read on the host (``block.tolist()``) as a
    :class:`~cliptrack.core.worst.Worst`; empty rows left out."""
    for i in range(len(CRITERIA)):
        for row in values[i][:k]:
            if row[_TOKENS] > 0 and math.isnan(row[_DATUM]):
                raise ValueError(
                    f"step {step}: datum_ids hold an id outside 0 .. 2**53 - 1 (the ids travel as "
                    "float64, exact only there)"
                )
            if row[_TOKENS] > 0 and row[_COLUMN["worst_token"]] < 0:
                raise ValueError(
                    f"step {step}: token_positions hold a negative position "
                    f"({int(row[_COLUMN['worst_token']])}, datum {row[_DATUM]:.0f})"
                )
    by = {
        c: tuple(SequenceGauge.from_row(row) for row in values[i][:k] if row[_TOKENS] > 0)
        for i, c in enumerate(CRITERIA)
    }
    return Worst(step, k, by)
