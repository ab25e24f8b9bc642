"""Exact clip counts from Miles' own train-step log dict, when it carries them.

What Miles produces (``miles/backends/megatron_utils/loss.py``, ``model.py``): the loss function
handed to Megatron returns, per micro-batch, ``{"keys": [k1, k2, ...], "values": tensor([count,
v1, v2, ...])}``. Each ``v`` is a reported metric reduced by Miles' ``sum_of_sample_mean``:

- ``--calculate-per-token-loss`` on: ``v = sum over eligible tokens of x`` and
  ``count = sum over samples of max(loss_mask.sum(), 1)`` (tokens; a sample with no eligible token
  counts 1). For ``pg_clipfrac``, ``x`` is 1 where PPO clipping bites
  (``-clamp(r, 1-eps_clip, 1+eps_clip_high)*A > -r*A``, the rule of docs/CONTRACT.md), so ``v`` is the
  clipped-token count.
- off (Miles' default): ``v = sum over samples of (sum over the sample's eligible tokens of x) /
  max(loss_mask.sum(), 1)`` and ``count`` is the number of samples. A sum of per-sample fractions
  cannot be turned back into a token count, so nothing exact can be read.

``train_one_step`` concatenates the micro-batches' values and sums them over the DP x CP group
before dividing by the summed count; each context-parallel rank counts its samples' full masks in
``count`` but only its own slice of the tokens in ``v`` (Miles multiplies the result by the CP size
to compensate). This module reads the summed dict, before that division.

A cliptrack-aware Miles loss can add exact entries with :func:`log_entries` (``loss_tokens``,
``clipped_tokens``, ``clipped_low_tokens``, ``clipped_high_tokens``, token sums on the rank's own
slice); with them the low/high split is known and ``loss_tokens`` does not depend on the
``max(., 1)`` above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from tracking import keys
from tracking.counts import TokenCounts, as_count

PER_TOKEN_FLAG = "--calculate-per-token-loss"
"""The Miles flag (``args.calculate_per_token_loss``) under which the log dict's sums are token sums."""

FLOAT32_EXACT = 2**24
"""Largest count a float32 log value carries exactly."""

EXACT_BELOW = {"float32": FLOAT32_EXACT, "float16": 2**11, "bfloat16": 2**8}
"""Largest whole number each reduced-precision dtype carries exactly (every smaller one is exact too)."""

_COUNT_ENTRIES = (
    keys.MILES_PG_CLIPFRAC,
    keys.DATUM_LOSS_TOKENS,
    keys.DATUM_CLIPPED_TOKENS,
    keys.DATUM_CLIPPED_LOW_TOKENS,
    keys.DATUM_CLIPPED_HIGH_TOKENS,
)


def log_entries(out: Any) -> dict[str, Any]:
    """Entries a Miles loss adds to its reported dict for exact counts (device tensors, no sync).

    ``out``: an :class:`adapters.losses.LossOutput` of a clipping loss over the micro-batch's
    (CP-local) tokens. Values are float64 0-dim tensors, exact below 2**53 tokens.
    """
    if out.clipped_tokens is None:
        raise ValueError("log_entries needs the output of a clipping loss (ppo or cispo)")
    entries = {
        keys.DATUM_LOSS_TOKENS: out.loss_tokens.double(),
        keys.DATUM_CLIPPED_TOKENS: out.clipped_tokens.double(),
    }
    if out.clipped_low_tokens is not None and out.clipped_high_tokens is not None:
        entries[keys.DATUM_CLIPPED_LOW_TOKENS] = out.clipped_low_tokens.double()
        entries[keys.DATUM_CLIPPED_HIGH_TOKENS] = out.clipped_high_tokens.double()
    return entries


def _values(log: Mapping[str, Any], where: str) -> tuple[list[str], list[float]]:
    """``(keys, values)`` of a log dict, checking its shape and that its counts are exact in its dtype."""
    if not isinstance(log, Mapping) or "keys" not in log or "values" not in log:
        raise ValueError(f"{where} must be a Miles log dict {{'keys': [...], 'values': [count, *sums]}}")
    names = list(log["keys"])
    raw = log["values"]
    dtype = ""
    if hasattr(raw, "detach"):  # torch tensor
        dtype = str(raw.dtype).removeprefix("torch.")
        raw = raw.detach().cpu().reshape(-1).tolist()
    elif hasattr(raw, "dtype") and hasattr(raw, "tolist"):  # numpy array
        dtype = str(raw.dtype)
        raw = raw.reshape(-1).tolist()
    values = [float(v) for v in raw]
    if len(values) != len(names) + 1:
        raise ValueError(
            f"{where} has {len(names)} keys but {len(values)} values; expected [count, *one sum per key]"
        )
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{where}['keys'] must be distinct strings, got {names!r}")
    limit = EXACT_BELOW.get(dtype)
    if limit is not None:
        counted = [("count", values[0])] + [(n, v) for n, v in zip(names, values[1:], strict=True) if n in _COUNT_ENTRIES]
        for name, value in counted:
            if abs(value) > limit:
                raise ValueError(
                    f"{where} value {name!r} = {value:.0f} is beyond {limit} in {dtype} and no longer an exact "
                    "count; log the counts as float64 (adapters.miles.log_entries does)"
                )
    return names, values


def sum_train_logs(logs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Element-wise sum of Miles log dicts (micro-batches, DP x CP ranks), as Miles reduces them.

    Every dict must carry the same keys in the same order. Values are summed with ``math.fsum``;
    the result's ``values`` are Python floats (each input's counts are checked exact in its dtype).
    """
    logs = list(logs)
    if not logs:
        raise ValueError("sum_train_logs needs at least one log dict")
    names, total_columns = None, None
    for i, log in enumerate(logs):
        these, values = _values(log, f"logs[{i}]")
        if names is None:
            names, total_columns = these, [[v] for v in values]
            continue
        if these != names:
            raise ValueError(f"logs[{i}] has keys {these!r} but logs[0] has {names!r}")
        assert total_columns is not None
        for column, v in zip(total_columns, values, strict=True):
            column.append(v)
    assert total_columns is not None
    return {"keys": names, "values": [math.fsum(c) for c in total_columns]}


def read_train_log(
    log: Mapping[str, Any], *, calculate_per_token_loss: bool, context_parallel_size: int = 1
) -> TokenCounts:
    """Exact token counts from a Miles log dict summed over micro-batches and DP x CP ranks.

    Returns the counts of a clipping loss; the low/high split only when the log carries
    :func:`log_entries`' split entries (``.to_metrics()`` gives the step's clip metrics either way).

    ``calculate_per_token_loss``: the Miles run's ``args.calculate_per_token_loss`` (the log dict
    itself does not say). ``context_parallel_size``: Miles' CP size (``count`` counts every token
    once per CP rank). Clipped tokens come from ``clipped_tokens`` when present, else Miles'
    ``pg_clipfrac``; ``loss_tokens`` from the ``loss_tokens`` entry when present, else
    ``count / context_parallel_size`` (exact only when every sample has an eligible token).

    Raises ValueError in per-sample-mean mode (exact token counts cannot be recovered), for counts
    beyond what their dtype carries exactly (float32 2**24, float16 2**11, bfloat16 2**8), and for
    counts that are not whole, negative or inconsistent.
    """
    if not isinstance(calculate_per_token_loss, bool):
        raise TypeError(f"calculate_per_token_loss must be a bool, got {calculate_per_token_loss!r}")
    if isinstance(context_parallel_size, bool) or not isinstance(context_parallel_size, int) or context_parallel_size < 1:
        raise ValueError(f"context_parallel_size must be an int >= 1, got {context_parallel_size!r}")
    names, values = _values(log, "log")
    if not calculate_per_token_loss:
        raise ValueError(
            "this Miles log was produced in per-sample-mean mode (calculate_per_token_loss=False): its "
            "values are sums of per-sample means and its count is a number of samples, so exact token "
            f"counts cannot be recovered from it. Run Miles with {PER_TOKEN_FLAG}, or take the counts "
            "per datum (adapters.miles.forward_backward_loss / aggregate_datums)"
        )
    entries = dict(zip(names, values[1:], strict=True))

    def count(name: str, value: float) -> int:
        return as_count(f"log value {name!r}", value)

    if keys.DATUM_CLIPPED_TOKENS in entries:
        clipped = count(keys.DATUM_CLIPPED_TOKENS, entries[keys.DATUM_CLIPPED_TOKENS])
        if keys.MILES_PG_CLIPFRAC in entries:
            miles = count(keys.MILES_PG_CLIPFRAC, entries[keys.MILES_PG_CLIPFRAC])
            if miles != clipped:
                raise ValueError(
                    f"log value {keys.MILES_PG_CLIPFRAC!r} = {miles} disagrees with "
                    f"{keys.DATUM_CLIPPED_TOKENS!r} = {clipped}: both count the tokens where clipping bites"
                )
    elif keys.MILES_PG_CLIPFRAC in entries:
        clipped = count(keys.MILES_PG_CLIPFRAC, entries[keys.MILES_PG_CLIPFRAC])
    else:
        raise ValueError(
            f"this Miles log has neither {keys.MILES_PG_CLIPFRAC!r} nor {keys.DATUM_CLIPPED_TOKENS!r} "
            f"(keys: {names}): its loss does not clip, so there is no clip count to read"
        )

    total = count("count", values[0])
    if total % context_parallel_size:
        raise ValueError(
            f"log count {total} is not a multiple of context_parallel_size={context_parallel_size}: "
            "every CP rank counts the same samples"
        )
    if keys.DATUM_LOSS_TOKENS in entries:
        loss_tokens = count(keys.DATUM_LOSS_TOKENS, entries[keys.DATUM_LOSS_TOKENS])
        if loss_tokens > total // context_parallel_size:
            raise ValueError(
                f"log value {keys.DATUM_LOSS_TOKENS!r} = {loss_tokens} exceeds count / CP size = "
                f"{total // context_parallel_size}; was context_parallel_size right?"
            )
    else:
        loss_tokens = total // context_parallel_size

    low = high = None
    has_low, has_high = keys.DATUM_CLIPPED_LOW_TOKENS in entries, keys.DATUM_CLIPPED_HIGH_TOKENS in entries
    if has_low != has_high:
        raise ValueError("the log carries one side of the low/high split without the other")
    if has_low:
        low = count(keys.DATUM_CLIPPED_LOW_TOKENS, entries[keys.DATUM_CLIPPED_LOW_TOKENS])
        high = count(keys.DATUM_CLIPPED_HIGH_TOKENS, entries[keys.DATUM_CLIPPED_HIGH_TOKENS])
    try:  # checks clipped <= loss_tokens and low + high == clipped
        return TokenCounts(loss_tokens, clipped, low, high)
    except ValueError as exc:
        raise ValueError(f"this Miles log: {exc}") from exc
