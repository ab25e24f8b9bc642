"""Exact clip counts and gauge sums from Miles' own train-step log dict, when it carries them.

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
``max(., 1)`` above. The ready loss :mod:`cliptrack.adapters.miles.custom_loss` adds them scaled, with
:data:`COUNT_SCALE`, so they read back exactly from every form of the log, including the dict
``aggregate_train_losses`` returns and the ``train/*`` values Miles' tracker logs.

The same loss adds the on-policy gauge's sums (:data:`GAUGE_ENTRIES`, scaled alike);
:func:`read_train_log` returns them in the result's ``gauge`` (no extremes: Miles adds its log
values over micro-batches and ranks, which a max or min does not survive). A stock log's own
mismatch metrics (``train_rollout_logprob_abs_diff``, ``train_rollout_kl``) compare the trainer's
pre-update log-probs with the rollout's and are per-sample means in the default mode: they are
not read as the gauge (the comparison's aliases load them as approximate means).

Without those entries (a stock Miles log) ``loss_tokens`` is ``count / cp_size``: every sample
whose loss mask is all zero adds one token there (and lowers the fraction); :func:`read_train_log`
warns, and subtracts them exactly when given the step's loss masks.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cliptrack.adapters.miles import keys as miles_keys
from cliptrack.adapters.miles.keys import COUNT_ENTRIES, COUNT_SCALE, ENTRIES, GAUGE_ENTRIES, TRACKER_PREFIX
from cliptrack.core import keys, measures
from cliptrack.core.sums import MeasuredSums, as_count

PER_TOKEN_FLAG = "--calculate-per-token-loss"
"""The Miles flag (``args.calculate_per_token_loss``) under which the log dict's sums are token sums."""

FLOAT32_EXACT = 2**24
"""Largest count a float32 log value carries exactly."""

EXACT_BELOW = {"float32": FLOAT32_EXACT, "float16": 2**11, "bfloat16": 2**8}
"""Largest whole number each reduced-precision dtype carries exactly (every smaller one is exact too)."""

_EXACT_SCALED = 2**53
"""Largest scaled entry (tokens x samples of the step) float64 carries exactly."""


class MilesCountWarning(UserWarning):
    """A stock Miles log's ``loss_tokens`` counts one token for every all-masked sample."""


_COUNT_ENTRIES = (
    miles_keys.PG_CLIPFRAC,
    COUNT_SCALE,
    *(entry for key, entry in ENTRIES.items() if measures.by_key(key).exact),
)
"""Entries of a Miles log dict that hold counts (checked exact in the log's dtype)."""
_GAUGE_ENTRIES = {key: ENTRIES[key] for key in miles_keys.GAUGE_KEYS}
__all__ = [
    "COUNT_ENTRIES",
    "COUNT_SCALE",
    "GAUGE_ENTRIES",
    "TRACKER_PREFIX",
    "MilesCountWarning",
    "log_entries",
    "read_train_log",
    "sum_train_logs",
]


def log_entries(out: Any) -> dict[str, Any]:
    """Entries a Miles loss adds to its reported dict for exact counts (device tensors, no sync).

    ``out``: an :class:`cliptrack.adapters.losses.builtin.LossOutput` of a clipping loss over the micro-batch's
    (CP-local) tokens. Values are float64 0-dim tensors, exact below 2**53 tokens.
    """
    if not out.clips:
        raise ValueError("log_entries needs the output of a clipping loss (ppo or cispo)")
    return {entry: out.measured[key].double() for key, entry in ENTRIES.items() if key in out.measured}


def _values(log: Mapping[str, Any], where: str) -> tuple[list[str], list[float]]:
    """``(keys, values)`` of a log dict, checking its shape and that its counts are exact in its dtype."""
    if not isinstance(log, Mapping) or "keys" not in log or "values" not in log:
        raise ValueError(f"{where} must be a Miles log dict {{'keys': [...], 'values': [count, *sums]}}")
    names = list(log["keys"])
    dtype, values = _raw_values(log["values"])
    if len(values) != len(names) + 1:
        raise ValueError(
            f"{where} has {len(names)} keys but {len(values)} values; expected [count, *one sum per key]"
        )
    if not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{where}['keys'] must be distinct strings, got {names!r}")
    _check_exact_counts(names, values, dtype, where)
    return names, values


def _raw_values(raw: Any) -> tuple[str, list[float]]:
    """``(dtype, values)`` of a log dict's ``values``: a torch tensor or numpy array flattened (its
    dtype name, e.g. ``"float32"``), else a sequence (dtype ``""``); each value as a Python float."""
    dtype = ""
    if hasattr(raw, "detach"):  # torch tensor
        dtype = str(raw.dtype).removeprefix("torch.")
        raw = raw.detach().cpu().reshape(-1).tolist()
    elif hasattr(raw, "dtype") and hasattr(raw, "tolist"):  # numpy array
        dtype = str(raw.dtype)
        raw = raw.reshape(-1).tolist()
    return dtype, [float(v) for v in raw]


def _check_exact_counts(names: Sequence[str], values: Sequence[float], dtype: str, where: str) -> None:
    """ValueError when the count (``values[0]``) or a count entry (:data:`_COUNT_ENTRIES`) is beyond
    what ``dtype`` carries exactly (:data:`EXACT_BELOW`, in tokens); no check for float64 or an
    unknown dtype."""
    limit = EXACT_BELOW.get(dtype)
    if limit is None:
        return
    counted = [("count", values[0])] + [
        (n, v) for n, v in zip(names, values[1:], strict=True) if n in _COUNT_ENTRIES
    ]
    for name, value in counted:
        if abs(value) > limit:
            raise ValueError(
                f"{where} value {name!r} = {value:.0f} is beyond {limit} in {dtype} and no longer an exact "
                "count; log the counts as float64 (cliptrack.adapters.miles.log_entries does)"
            )


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


def _scaled_counts(entries: Mapping[str, float], where: str) -> MeasuredSums:
    """Counts from :data:`COUNT_ENTRIES` scaled by :data:`COUNT_SCALE` (``cliptrack.adapters.miles.custom_loss``),
    and the gauge's sums from :data:`GAUGE_ENTRIES` when the log has them."""
    missing = [name for name in COUNT_ENTRIES if name not in entries]
    if missing:
        raise ValueError(
            f"{where} has {COUNT_SCALE!r} but not {missing}: it was not written by cliptrack.adapters.miles.custom_loss"
        )
    scale = entries[COUNT_SCALE]
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{where} value {COUNT_SCALE!r} = {scale!r} must be > 0 (the samples of the step)")
    counts = {key: _scaled_count(entries, ENTRIES[key], scale, where) for key in miles_keys.COUNT_KEYS}
    try:  # checks clipped <= loss_tokens, low + high == clipped and the gauge's rules
        return MeasuredSums({**counts, **(_scaled_gauge(entries, scale, where) or {})})
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _scaled_count(entries: Mapping[str, float], name: str, scale: float, where: str) -> int:
    """One scaled count entry over the scale, rounded to the token (ValueError unless whole)."""
    value = entries[name]
    if not math.isfinite(value) or abs(value) >= _EXACT_SCALED:
        raise ValueError(f"{where} value {name!r} = {value!r} is not an exact scaled count (beyond 2**53)")
    # value = tokens * s and scale = s for one s (Miles' division by its count applies to both):
    # the quotient is the token count up to a few float64 roundings, so it rounds exactly.
    tokens = value / scale
    nearest = round(tokens)
    if abs(tokens - nearest) > 1e-6 * max(1.0, abs(tokens)):
        raise ValueError(
            f"{where} value {name!r} / {COUNT_SCALE!r} = {tokens!r} is not a whole number of tokens; "
            "were the entries summed over every micro-batch and DP x CP rank of the step?"
        )
    return as_count(f"log value {name!r}", float(nearest))


def _scaled_gauge(entries: Mapping[str, float], scale: float, where: str) -> dict[str, float | int] | None:
    """The gauge's sums from its scaled entries (``None`` without any): a count rounded to the
    token, a float sum ``entry / count_scale`` (float64, to a few roundings). No extreme: Miles sums
    its log values over micro-batches and ranks, which a max or min does not survive."""
    present = [entry for entry in _GAUGE_ENTRIES.values() if entry in entries]
    if not present:
        return None
    missing = [entry for entry in _GAUGE_ENTRIES.values() if entry not in entries]
    if missing:
        raise ValueError(f"{where} has the gauge entries {present} but not {missing}: they come together")
    gauge: dict[str, float | int] = {}
    for key, name in _GAUGE_ENTRIES.items():
        if measures.by_key(key).exact:
            gauge[key] = _scaled_count(entries, name, scale, where)
        elif not math.isfinite(entries[name]):
            raise ValueError(f"{where} value {name!r} = {entries[name]!r} must be finite")
        else:
            gauge[key] = entries[name] / scale
    return gauge


def _aggregated_entries(log: Mapping[str, Any]) -> dict[str, float]:
    """``{entry: value}`` of an aggregated Miles dict, ``train/`` prefixes (Miles' tracker) removed."""
    entries: dict[str, float] = {}
    for name, value in log.items():
        if not isinstance(name, str):
            continue
        bare = name.removeprefix(TRACKER_PREFIX)
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            entries[bare] = float(value)
    return entries


def read_train_log(
    log: Mapping[str, Any],
    *,
    calculate_per_token_loss: bool | None = None,
    context_parallel_size: int = 1,
    loss_masks: Sequence[Any] | None = None,
) -> MeasuredSums:
    """Exact token counts from a Miles log of one optimizer step, as a ``MeasuredSums`` of a clipping
    loss (``.to_metrics()`` gives the step's clip metrics; the low/high split when the log has it;
    with :mod:`cliptrack.adapters.miles.custom_loss`'s entries also the gauge's sums, in ``gauge``).

    ``log`` is one of:

    - the log dict summed over micro-batches and DP x CP ranks (``{"keys", "values": [count,
      *sums]}``, :func:`sum_train_logs`), before Miles' division;
    - with the entries of :mod:`cliptrack.adapters.miles.custom_loss`, also the ``{entry: value}`` dict
      ``aggregate_train_losses`` returns or the ``{"train/entry": value}`` dict Miles logs. These
      read back exactly whatever the mode and CP size; the arguments below are not needed.

    For a stock log (Miles' own entries only): ``calculate_per_token_loss``, the Miles run's
    ``args.calculate_per_token_loss`` (the log dict itself does not say), must be True;
    ``context_parallel_size``: Miles' CP size (``count`` counts every token once per CP rank).
    Clipped tokens come from ``clipped_tokens`` when present, else Miles' ``pg_clipfrac``;
    ``loss_tokens`` from the ``loss_tokens`` entry when present, else ``count /
    context_parallel_size``, which counts one token for every sample whose loss mask is all zero
    (Miles' ``max(mask.sum(), 1)``): a :class:`MilesCountWarning` says so, once per call.
    ``loss_masks``: the step's per-sample loss masks (e.g. Miles' ``rollout_data["loss_masks"]``
    of the step); with them those samples are counted, named in the warning and subtracted.

    Raises ValueError in per-sample-mean mode without cliptrack's entries (exact token counts
    cannot be recovered), for counts beyond what their dtype carries exactly (float32 2**24,
    float16 2**11, bfloat16 2**8), and for counts that are not whole, negative or inconsistent.
    """
    _check_log_arguments(calculate_per_token_loss, context_parallel_size)
    if isinstance(log, Mapping) and "keys" not in log and "values" not in log:
        return _read_aggregated_log(log)
    names, values = _values(log, "log")
    if COUNT_SCALE in names:
        return _scaled_counts(dict(zip(names, values[1:], strict=True)), "log")
    _require_per_token_mode(calculate_per_token_loss)
    entries = dict(zip(names, values[1:], strict=True))
    clipped = _clipped_tokens(entries, names)
    total = _log_count(values[0], context_parallel_size)
    if ENTRIES[keys.LOSS_TOKENS] in entries:
        loss_tokens = _logged_loss_tokens(entries, total // context_parallel_size)
    else:
        loss_tokens = total // context_parallel_size
        loss_tokens -= _warn_all_masked(loss_masks, loss_tokens)
    counts: dict[str, float | int] = {keys.LOSS_TOKENS: loss_tokens, keys.CLIPPED_TOKENS: clipped}
    low, high = _clipped_low_high(entries)
    if low is not None and high is not None:
        counts.update({keys.CLIPPED_LOW_TOKENS: low, keys.CLIPPED_HIGH_TOKENS: high})
    try:  # checks clipped <= loss_tokens and low + high == clipped
        return MeasuredSums(counts)
    except ValueError as exc:
        raise ValueError(f"this Miles log: {exc}") from exc


def _check_log_arguments(calculate_per_token_loss: object, context_parallel_size: object) -> None:
    """TypeError/ValueError naming a bad ``calculate_per_token_loss`` or ``context_parallel_size``."""
    if calculate_per_token_loss is not None and not isinstance(calculate_per_token_loss, bool):
        raise TypeError(f"calculate_per_token_loss must be a bool, got {calculate_per_token_loss!r}")
    if (
        isinstance(context_parallel_size, bool)
        or not isinstance(context_parallel_size, int)
        or context_parallel_size < 1
    ):
        raise ValueError(f"context_parallel_size must be an int >= 1, got {context_parallel_size!r}")


def _read_aggregated_log(log: Mapping[str, Any]) -> MeasuredSums:
    """Counts from a log already divided by Miles' count: only its cliptrack entries carry them."""
    entries = _aggregated_entries(log)
    if COUNT_SCALE in entries:
        return _scaled_counts(entries, "log")
    raise ValueError(
        "this Miles log is already divided by Miles' count (aggregate_train_losses' output or the "
        f"logged train/* values) and has no {COUNT_SCALE!r} entry: exact counts cannot be recovered "
        "from it. Use cliptrack.adapters.miles.custom_loss.policy_loss_with_clip_counts as the Miles loss, or "
        "read the summed log dict"
    )


def _require_per_token_mode(calculate_per_token_loss: bool | None) -> None:
    """ValueError unless a stock log is known to come from per-token mode (its count is tokens)."""
    if calculate_per_token_loss is None:
        raise ValueError(
            "calculate_per_token_loss is needed for a Miles log without cliptrack's count entries: "
            f"pass the run's args.calculate_per_token_loss ({PER_TOKEN_FLAG})"
        )
    if not calculate_per_token_loss:
        raise ValueError(
            "this Miles log was produced in per-sample-mean mode (calculate_per_token_loss=False): its "
            "values (pg_clipfrac, and train_rollout_logprob_abs_diff / train_rollout_kl for the "
            "mismatch) are sums of per-sample means and its count is a number of samples, so exact token "
            f"counts and gauge sums cannot be recovered from it. Run Miles with {PER_TOKEN_FLAG}, or take the counts "
            "per datum (cliptrack.adapters.miles.forward_backward_loss / aggregate_datums)"
        )


def _entry_count(entries: Mapping[str, float], name: str) -> int:
    """The summed log entry ``name`` as an exact token count (ValueError if not whole, negative, ...)."""
    return as_count(f"log value {name!r}", entries[name])


def _clipped_tokens(entries: Mapping[str, float], names: Sequence[str]) -> int:
    """Clipped tokens of a stock log: ``clipped_tokens`` when present (and equal to Miles'
    ``pg_clipfrac`` sum if both are), else the ``pg_clipfrac`` sum (per-token mode: a token count)."""
    if ENTRIES[keys.CLIPPED_TOKENS] in entries:
        clipped = _entry_count(entries, ENTRIES[keys.CLIPPED_TOKENS])
        if miles_keys.PG_CLIPFRAC in entries:
            miles = _entry_count(entries, miles_keys.PG_CLIPFRAC)
            if miles != clipped:
                raise ValueError(
                    f"log value {miles_keys.PG_CLIPFRAC!r} = {miles} disagrees with "
                    f"{ENTRIES[keys.CLIPPED_TOKENS]!r} = {clipped}: both count the tokens where clipping bites"
                )
        return clipped
    if miles_keys.PG_CLIPFRAC in entries:
        return _entry_count(entries, miles_keys.PG_CLIPFRAC)
    raise ValueError(
        f"this Miles log has neither {miles_keys.PG_CLIPFRAC!r} nor {ENTRIES[keys.CLIPPED_TOKENS]!r} "
        f"(keys: {names}): its loss does not clip, so there is no clip count to read"
    )


def _log_count(value: float, context_parallel_size: int) -> int:
    """The log's ``count`` (tokens, each counted once per CP rank) as an exact multiple of the CP size."""
    total = as_count("log value 'count'", value)
    if total % context_parallel_size:
        raise ValueError(
            f"log count {total} is not a multiple of context_parallel_size={context_parallel_size}: "
            "every CP rank counts the same samples"
        )
    return total


def _logged_loss_tokens(entries: Mapping[str, float], per_rank: int) -> int:
    """The ``loss_tokens`` entry, which cannot exceed ``per_rank`` (count / CP size)."""
    loss_tokens = _entry_count(entries, ENTRIES[keys.LOSS_TOKENS])
    if loss_tokens > per_rank:
        raise ValueError(
            f"log value {ENTRIES[keys.LOSS_TOKENS]!r} = {loss_tokens} exceeds count / CP size = "
            f"{per_rank}; was context_parallel_size right?"
        )
    return loss_tokens


def _clipped_low_high(entries: Mapping[str, float]) -> tuple[int | None, int | None]:
    """The low/high split of the clipped tokens, or ``(None, None)`` when the log has none."""
    has_low, has_high = (
        ENTRIES[keys.CLIPPED_LOW_TOKENS] in entries,
        ENTRIES[keys.CLIPPED_HIGH_TOKENS] in entries,
    )
    if has_low != has_high:
        raise ValueError("the log carries one side of the low/high split without the other")
    if not has_low:
        return None, None
    return (
        _entry_count(entries, ENTRIES[keys.CLIPPED_LOW_TOKENS]),
        _entry_count(entries, ENTRIES[keys.CLIPPED_HIGH_TOKENS]),
    )


def _warn_all_masked(loss_masks: Sequence[Any] | None, loss_tokens: int) -> int:
    """Warn (once) that all-masked samples inflate a stock log's ``loss_tokens``; return how many.

    Without ``loss_masks`` the number is unknown and 0 is returned (nothing subtracted).
    """
    fix = "use cliptrack.adapters.miles.custom_loss.policy_loss_with_clip_counts as the Miles loss for exact counts"
    if loss_masks is None:
        warnings.warn(
            "this Miles log has no loss_tokens entry: its count adds max(loss_mask.sum(), 1) per sample, "
            "so every sample whose loss mask is all zero adds one token to loss_tokens (and lowers the "
            f"clip fraction); pass loss_masks= to subtract them, or {fix}",
            MilesCountWarning,
            stacklevel=3,
        )
        return 0
    masked = sum(1 for mask in loss_masks if float(mask.sum() if hasattr(mask, "sum") else sum(mask)) == 0)
    if masked:
        if masked > loss_tokens:
            raise ValueError(
                f"loss_masks has {masked} all-masked samples but the log counts only {loss_tokens} tokens: "
                "are these the masks of this step?"
            )
        warnings.warn(
            f"{masked} of {len(loss_masks)} samples have an all-zero loss mask; Miles counted each as one "
            f"token, subtracted here ({loss_tokens} -> {loss_tokens - masked} loss tokens); {fix}",
            MilesCountWarning,
            stacklevel=3,
        )
    return masked
