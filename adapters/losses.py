"""Tinker's built-in losses over per-token tensors, counting the tokens where clipping bites.

Every loss takes per-token tensors of one shape (1-D packed ``[tokens]`` or ``[batch, seq]``) and
returns a :class:`LossOutput` whose ``loss`` is the **sum** of per-token losses over eligible tokens
(``mask != 0``), as Tinker's ``loss:sum``. Counting adds detached int64 0-dim tensors on the input's
device; it never changes the loss value or any gradient, and never synchronises with the host.

Input values are checked on the device too, in the same no-sync spirit: one cheap flag per call
for non-finite logprobs / sampling_logprobs / advantages / weights (NaN or inf propagate into the
loss or into the sum of ``logprobs - sampling_logprobs``), an exact count of mask entries that
are not 0/1, and a count of bad tensor-threshold entries. They are carried in
``LossOutput.invalid`` and raised as a ``ValueError`` the first time counts reach the host
(:meth:`LossOutput.check`, :func:`adapters.output.loss_metrics`, the backends' reductions). A
``LossOutput`` keeps its inputs (detached) so that error names each bad tensor and its number of
bad entries. Shapes, Python-number thresholds and ``beta`` are checked at once.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from adapters import fused as _fused
from tracking import keys, measures
from tracking.counts import (
    GAUGE_EXTREME_KEYS,
    GAUGE_SUM_KEYS,
    MeasuredSums,
    TokenCounts,
    as_count,
    check_gauge,
    mixed_kinds_error,
)

Threshold = float | Tensor
"""An absolute ratio bound: one number, or a tensor broadcasting to the token shape."""

PPO_CLIP_LOW = 0.8
"""Tinker's default absolute lower ratio bound for PPO."""
PPO_CLIP_HIGH = 1.2
"""Tinker's default absolute upper ratio bound for PPO."""
CISPO_CLIP_LOW = 0.0
"""Tinker's default absolute lower ratio bound for CISPO."""
CISPO_CLIP_HIGH = 4.0
"""Tinker's default absolute upper ratio bound for CISPO."""

INPUT_CHECKS = (
    "non-finite values (NaN or inf) in logprobs, sampling_logprobs, advantages or weights of {n} loss call(s)",
    "mask has {n} entries that are neither 0 nor 1",
    "clip thresholds have {n} entries that are negative, non-finite or with low > high",
)
"""Messages for the entries of ``LossOutput.invalid``, in order; ``{n}`` is the entry's value."""
_NONFINITE, _MASK, _THRESHOLDS = range(len(INPUT_CHECKS))
assert len(INPUT_CHECKS) == measures.INVALID_SLOTS

RATIO_OUTSIDE_LOW = measures.RATIO_OUTSIDE_LOW
"""Default lower ratio bound of ``ratio_outside_tokens:sum`` (keyword ``ratio_outside_low``)."""
RATIO_OUTSIDE_HIGH = measures.RATIO_OUTSIDE_HIGH
"""Default upper ratio bound of ``ratio_outside_tokens:sum`` (keyword ``ratio_outside_high``)."""

GAUGE_FIELDS: tuple[str, ...] = (*GAUGE_SUM_KEYS, *(measures.by_key(k).packed for k in GAUGE_EXTREME_KEYS))
"""Layout of ``LossOutput.gauge``: the gauge's sums, then its extremes as combined by max
(``log_ratio:max``, ``-log_ratio:min``); float64, the same order as in :data:`PACKED_FIELDS`."""
_GAUGE_SUMS = len(GAUGE_SUM_KEYS)

Sources = tuple[dict[str, Tensor], ...]
"""Detached inputs of each loss call, by argument name, kept to name bad entries precisely."""


@dataclass(frozen=True)
class LossOutput:
    """The loss of one micro-batch (or a sum of several) and its token counts.

    ``loss``: 0-dim, sum of per-token losses over eligible tokens (differentiable for one call;
    detached in a sum). Counts are detached int64 0-dim tensors on the loss's device, in tokens;
    the clip fields are ``None`` for losses that never clip, and the low/high pair may be ``None``
    for a clipping loss that does not split. ``invalid``: int64 vector, the number of bad entries
    per input of :data:`INPUT_CHECKS`. ``gauge``: the on-policy gauge of a loss with sampling
    log-probs, a detached float64 vector laid out as :data:`GAUGE_FIELDS` (:func:`gauge_of`),
    ``None`` otherwise. Moved to the host through one packing (:func:`pack`, :data:`PACKED_FIELDS`).
    """

    loss: Tensor
    loss_tokens: Tensor
    clipped_tokens: Tensor | None
    clipped_low_tokens: Tensor | None
    clipped_high_tokens: Tensor | None
    invalid: Tensor
    sources: Sources = ()
    calls: int = 1
    """Number of loss calls summed in this output."""
    gauge: Tensor | None = None

    @property
    def clips(self) -> bool:
        """Whether this loss clips (and so carries clip counts)."""
        return self.clipped_tokens is not None

    @property
    def has_gauge(self) -> bool:
        """Whether this loss measures the on-policy gauge (it has sampling log-probs)."""
        return self.gauge is not None

    def measured(self) -> dict[str, Tensor]:
        """Every measured value under its metric key, as 0-dim device tensors (views; no sync):
        ``loss:sum``, the counts present, the gauge when present (``log_ratio:min`` un-negated)."""
        out = {keys.LOSS_SUM: self.loss.detach(), keys.LOSS_TOKENS: self.loss_tokens}
        for key, value in zip(
            keys.CLIP_COUNT_KEYS,
            (self.clipped_tokens, self.clipped_low_tokens, self.clipped_high_tokens),
            strict=True,
        ):
            if value is not None:
                out[key] = value
        if self.gauge is not None:
            for i, key in enumerate((*GAUGE_SUM_KEYS, *GAUGE_EXTREME_KEYS)):
                value = self.gauge[i]
                out[key] = -value if measures.by_key(key).reduction == measures.MIN else value
        return out

    def __add__(self, other: LossOutput) -> LossOutput:
        """Sum two outputs on device (no host sync); the summed ``loss`` is detached."""
        if not isinstance(other, LossOutput):
            return NotImplemented
        if self.clips != other.clips:
            raise mixed_kinds_error(self.clips, other.clips, "this LossOutput")
        if self.has_gauge != other.has_gauge:
            raise measures.mixed_groups_error(
                measures.GAUGE, self.has_gauge, other.has_gauge, "this LossOutput"
            )

        def add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
            return None if a is None or b is None else a + b

        return LossOutput(
            loss=self.loss.detach() + other.loss.detach(),
            loss_tokens=self.loss_tokens + other.loss_tokens,
            clipped_tokens=add(self.clipped_tokens, other.clipped_tokens),
            clipped_low_tokens=add(self.clipped_low_tokens, other.clipped_low_tokens),
            clipped_high_tokens=add(self.clipped_high_tokens, other.clipped_high_tokens),
            invalid=self.invalid + other.invalid,
            sources=self.sources + other.sources,
            calls=self.calls + other.calls,
            gauge=None
            if self.gauge is None or other.gauge is None
            else combine_gauges(self.gauge, other.gauge),
        )

    def check(self) -> None:
        """Raise ValueError naming every input with bad entries. Synchronises with the host."""
        raise_invalid(self.invalid, self.sources)

    def token_counts(self) -> MeasuredSums:
        """Exact host-side measured sums, the gauge included (synchronises once); raises ValueError
        for invalid loss inputs."""
        sums = unpack(pack(self).tolist())
        sums.check(self.sources)
        return sums.counts

    def clip_counts(self) -> TokenCounts | None:
        """Exact host-side clip counts, without the gauge (synchronises once); ``None`` when the
        loss never clips."""
        counts = self.token_counts()
        return counts.without_gauge() if counts.clips else None


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


def combine_gauges(a: Tensor, b: Tensor) -> Tensor:
    """Two :data:`GAUGE_FIELDS` vectors of disjoint tokens as one: sums add, extremes by max (no sync)."""
    return torch.cat([a[:_GAUGE_SUMS] + b[:_GAUGE_SUMS], torch.maximum(a[_GAUGE_SUMS:], b[_GAUGE_SUMS:])])


K3_SERIES_BELOW = 0.5
"""``|l|`` below which ``kl_k3`` is the series; from it on ``w - 1 - l`` (no cancellation there)."""


def k3_terms(log_ratio: Tensor, weight: Tensor) -> Tensor:
    """Per-token ``exp(l) - 1 - l`` without cancellation, from ``l`` and ``w = exp(l)``; >= 0.

    Compiled (the fused kernel): for ``|l| < 1/2`` the Taylor series ``l**2/2! + ... + l**9/9!``
    by Horner in the dtype of ``l`` (truncation below ``3e-9`` relative there, a few ulps of
    rounding, where ``w - 1 - l`` would lose every digit to cancellation: float32 ``w`` near 1
    carries ``6e-8`` absolute, the k3 term of ``l = 1e-4`` is ``5e-9``), from ``1/2`` on
    ``w - 1 - l`` (the term is then at least ``0.1``); no second ``exp``, and no ``expm1``, which
    Inductor's CPU code writes as ``exp(x) - 1``. The coefficients and the bound are literals in
    this code: a float read from a module global becomes a runtime input of a graph compiled with
    dynamic shapes, loaded and converted once per vector of tokens (it made the fused PPO loss with
    the gauge about 1.6x slower). Eager: ``expm1(l) - l`` in float64 (three element-wise ops;
    ATen's ``expm1`` is exact to an ulp). Both agree with the float64 reference to float32
    rounding of the term (``tests/test_gauge.py``). Clamped at 0 against rounding (the term is >= 0).
    """
    if not torch.compiler.is_compiling():
        wide = log_ratio.to(torch.float64)
        return torch.expm1(wide).sub_(wide).clamp_min_(0.0)
    x = log_ratio
    poly = x * (1 / 362880) + 1 / 40320  # 1/9!, 1/8!
    poly = poly * x + 1 / 5040
    poly = poly * x + 1 / 720
    poly = poly * x + 1 / 120
    poly = poly * x + 1 / 24
    poly = poly * x + 1 / 6
    poly = poly * x + 1 / 2
    series = x * x * poly
    direct = weight - 1.0 - x
    return torch.clamp_min(torch.where(x.abs() < 0.5, series, direct), 0.0)  # 0.5: K3_SERIES_BELOW


def gauge_of(
    log_ratio: Tensor,
    ratio: Tensor,
    eligible: Tensor | None,
    low: float = RATIO_OUTSIDE_LOW,
    high: float = RATIO_OUTSIDE_HIGH,
    weight: Tensor | float | None = None,
) -> Tensor:
    """The on-policy gauge of one loss call: a float64 vector laid out as :data:`GAUGE_FIELDS`.

    ``log_ratio``: per token ``l = logprobs - sampling_logprobs`` as the loss computed it;
    ``ratio``: ``exp(l)`` as the loss computed it (the ratio its clip decision read);
    ``eligible``: bool tensor of eligible tokens, ``None`` for all; ``low`` / ``high``: the
    ``ratio_outside_tokens`` bounds; ``weight``: the eligibility as a 0/1 multiplier (the loss's
    mask in its dtype; formed from ``eligible`` when not given). Per-token terms are formed in
    float32 or float64 (a bfloat16 or float16 ``l`` is promoted and its ``w = exp(l)`` formed anew
    in float32): ``|l|``, the k3 term (:func:`k3_terms`), ``w`` and ``w**2`` (in float64, so it
    does not overflow before ``w``); sums accumulate in float64. The extremes are those of ``l`` over eligible tokens (``-inf``
    over none), the min stored negated. Detached, on the input's device, no host sync; the same
    function serves the eager and the fused pass (traced into the compiled kernel).

    Eager, a ``where`` against a number costs about seven multiplies: ``l`` of an ineligible token
    is zeroed by the multiply (a non-finite ``l`` is refused by the loss's own check whatever the
    mask), ``w`` by a ``where`` (an ineligible token's ``w`` may overflow where ``l`` does not).
    """
    with torch.no_grad():
        lr = log_ratio.detach()
        w = ratio.detach()
        if lr.dtype not in (torch.float32, torch.float64):
            lr = lr.float()
            w = torch.exp(lr)
        f64 = torch.float64
        if eligible is None:
            on = None
            lm, wm = lr, w
            outside = (w < low) | (w > high)
        else:
            on = eligible.to(lr.dtype) if not isinstance(weight, Tensor) else weight.to(lr.dtype)
            lm = lr * on
            wm = torch.where(eligible, w, 0.0)
            outside = ((w < low) | (w > high)) & eligible
        l64 = lm.to(f64)  # one copy, read by the sums of l and |l| (and the eager k3 term)
        w64 = wm.to(f64)
        kl = k3_terms(lm if torch.compiler.is_compiling() else l64, wm)  # ineligible: l = w = 0, term 0
        sums = [
            l64.sum(),
            l64.abs().sum(),
            kl.sum(dtype=f64),
            _count_true(outside).to(f64),
            w64.sum(),
            torch.dot(w64.reshape(-1), w64.reshape(-1)),
        ]
        return torch.stack([*sums, *_extremes(lr, lm, on)])


def _count_true(flags: Tensor) -> Tensor:
    """The number of true entries, exact, int64 0-dim: eager ``count_nonzero`` (no integer copy
    of the flags); compiled an int32 sum below 2**31 entries (Inductor's CPU code widens every lane
    to int64 otherwise, about 7 % of a fused PPO call)."""
    if not torch.compiler.is_compiling():
        return torch.count_nonzero(flags)
    return flags.sum(dtype=torch.int32 if flags.numel() < 2**31 else torch.int64).to(torch.int64)


def _extremes(lr: Tensor, lm: Tensor, on: Tensor | None) -> list[Tensor]:
    """``[max l, -min l]`` over eligible tokens in float64, ``-inf`` over none.

    ``on`` is the eligibility as 0/1 in ``lr``'s dtype and ``lm = lr * on``. An ineligible token
    is pushed to the bottom by the offset ``(on - 1) * max_float`` instead of a ``where``, which
    costs about seven multiplies eager: an eligible token's value is ``l + 0``, exactly ``l``.
    """
    f64 = torch.float64
    if lr.numel() == 0:
        return [torch.full((), -math.inf, dtype=f64, device=lr.device)] * 2
    if on is None:
        return [lr.amax().to(f64), lr.amin().neg().to(f64)]
    offset = (on - 1) * torch.finfo(lr.dtype).max
    none = on.amax() == 0  # a float max: cheaper than eligible.any() on CPU
    top, bottom = (lm + offset).amax(), (offset - lm).amax()
    return [torch.where(none, -math.inf, v).to(f64) for v in (top, bottom)]


def check_ratio_outside(low: object, high: object) -> tuple[float, float]:
    """The ``ratio_outside_low`` / ``ratio_outside_high`` options as floats: finite absolute ratio
    bounds with ``0 <= low <= high``, else ValueError naming the option (host-side, no sync)."""
    names = (measures.RATIO_OUTSIDE_LOW_OPTION, measures.RATIO_OUTSIDE_HIGH_OPTION)
    for name, value in zip(names, (low, high), strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a float (an absolute ratio bound), got {type(value).__name__}")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite ratio bound >= 0, got {value!r}")
    assert isinstance(low, (int, float)) and isinstance(high, (int, float))
    if low > high:
        raise ValueError(f"{names[0]}={low!r} is above {names[1]}={high!r}")
    return float(low), float(high)


def _diagnose(sources: Sources) -> list[str]:
    """Per-tensor counts of bad entries over all loss calls (host side, only on error)."""
    nonfinite: dict[str, int] = {}
    bad_mask = 0
    for source in sources:
        for name, tensor in source.items():
            if name == "mask":
                if tensor.dtype != torch.bool:
                    bad_mask += int(((tensor != 0) & (tensor != 1)).sum())
            elif tensor.is_floating_point():
                nonfinite[name] = nonfinite.get(name, 0) + int((~torch.isfinite(tensor)).sum())
    problems = [f"{name} has {n} non-finite entries (NaN or inf)" for name, n in nonfinite.items() if n]
    if bad_mask:
        problems.append(f"mask has {bad_mask} entries that are neither 0 nor 1")
    return problems


def ppo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    clip_low_threshold: Threshold = PPO_CLIP_LOW,
    clip_high_threshold: Threshold = PPO_CLIP_HIGH,
    ratio_outside_low: float = RATIO_OUTSIDE_LOW,
    ratio_outside_high: float = RATIO_OUTSIDE_HIGH,
) -> LossOutput:
    """Clipped PPO: per token ``-min(r*A, clamp(r, low, high)*A)``, ``r = exp(logprobs - sampling_logprobs)``.

    A token is clipped where clipping bites, ``clamp(r)*A < r*A``: low side ``A < 0, r < low``,
    high side ``A > 0, r > high``. Thresholds are absolute ratio bounds (floats, or tensors that
    broadcast to the token shape for per-datum thresholds). ``ratio_outside_low`` /
    ``ratio_outside_high``: the bounds of the gauge's ``ratio_outside_tokens:sum`` (:func:`gauge_of`).
    """
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    if _fused.wanted(logprobs) and (
        out := _fused.ppo(
            logprobs,
            sampling_logprobs,
            advantages,
            mask,
            clip_low_threshold=clip_low_threshold,
            clip_high_threshold=clip_high_threshold,
            ratio_outside=outside,
        )
    ):
        return out
    batch = LossInputs(logprobs, sampling_logprobs, advantages, mask)
    thresholds_bad = _check_thresholds(clip_low_threshold, clip_high_threshold, logprobs.device)
    log_ratio = logprobs - sampling_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = _clamp(ratio, clip_low_threshold, clip_high_threshold) * advantages
    loss = -(torch.minimum(unclipped, clipped) * batch.weight).sum()
    with torch.no_grad():
        bites = (clipped < unclipped) & batch.eligible
        n_clipped = torch.count_nonzero(bites)
        n_low = torch.count_nonzero(
            bites & (advantages < 0)
        )  # clipping bites on the low side exactly when A < 0
        gauge = gauge_of(log_ratio, ratio, batch.mask_eligible, *outside, weight=batch.weight)
    return batch.output(loss, log_ratio, n_clipped, n_low, n_clipped - n_low, thresholds_bad, gauge)


def cispo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    clip_low_threshold: Threshold = CISPO_CLIP_LOW,
    clip_high_threshold: Threshold = CISPO_CLIP_HIGH,
    ratio_outside_low: float = RATIO_OUTSIDE_LOW,
    ratio_outside_high: float = RATIO_OUTSIDE_HIGH,
) -> LossOutput:
    """CISPO: per token ``-(clamp(r, low, high).detach() * A * logprobs)``.

    A token is clipped where the coefficient departs from the ratio, ``clamp(r) != r``: low side
    ``r < low``, high side ``r > high``, whatever the sign of ``A``. The gauge as in :func:`ppo`.
    """
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    if _fused.wanted(logprobs) and (
        out := _fused.cispo(
            logprobs,
            sampling_logprobs,
            advantages,
            mask,
            clip_low_threshold=clip_low_threshold,
            clip_high_threshold=clip_high_threshold,
            ratio_outside=outside,
        )
    ):
        return out
    batch = LossInputs(logprobs, sampling_logprobs, advantages, mask)
    thresholds_bad = _check_thresholds(clip_low_threshold, clip_high_threshold, logprobs.device)
    log_ratio = (logprobs - sampling_logprobs).detach()
    ratio = torch.exp(log_ratio)
    coefficient = _clamp(ratio, clip_low_threshold, clip_high_threshold)
    loss = -(coefficient * advantages * logprobs * batch.weight).sum()
    with torch.no_grad():
        departs = (coefficient != ratio) & batch.eligible
        n_clipped = torch.count_nonzero(departs)
        n_low = torch.count_nonzero(departs & (ratio < coefficient))
        gauge = gauge_of(log_ratio, ratio, batch.mask_eligible, *outside, weight=batch.weight)
    return batch.output(loss, log_ratio, n_clipped, n_low, n_clipped - n_low, thresholds_bad, gauge)


def importance_sampling(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    ratio_outside_low: float = RATIO_OUTSIDE_LOW,
    ratio_outside_high: float = RATIO_OUTSIDE_HIGH,
) -> LossOutput:
    """Importance-sampled policy gradient: per token ``-(r * A)``. Never clips; the gauge as in :func:`ppo`."""
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    if _fused.wanted(logprobs) and (
        out := _fused.importance_sampling(
            logprobs, sampling_logprobs, advantages, mask, ratio_outside=outside
        )
    ):
        return out
    batch = LossInputs(logprobs, sampling_logprobs, advantages, mask)
    log_ratio = logprobs - sampling_logprobs
    ratio = torch.exp(log_ratio)
    loss = -(ratio * advantages * batch.weight).sum()
    gauge = gauge_of(log_ratio, ratio, batch.mask_eligible, *outside, weight=batch.weight)
    return batch.output(loss, log_ratio, gauge=gauge)


def dro(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    beta: float,
    ratio_outside_low: float = RATIO_OUTSIDE_LOW,
    ratio_outside_high: float = RATIO_OUTSIDE_HIGH,
) -> LossOutput:
    """DRO: per token ``-(logprobs*A - beta/2 * (logprobs - sampling_logprobs)**2)``. Never clips;
    the gauge as in :func:`ppo` (its ratio ``exp(l)`` formed for the gauge alone)."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    if _fused.wanted(logprobs) and (
        out := _fused.dro(logprobs, sampling_logprobs, advantages, mask, beta=beta, ratio_outside=outside)
    ):
        return out
    batch = LossInputs(logprobs, sampling_logprobs, advantages, mask)
    log_ratio = logprobs - sampling_logprobs
    objective = logprobs * advantages - 0.5 * beta * log_ratio**2
    loss = -(objective * batch.weight).sum()
    gauge = gauge_of(
        log_ratio, torch.exp(log_ratio.detach()), batch.mask_eligible, *outside, weight=batch.weight
    )
    return batch.output(loss, log_ratio, gauge=gauge)


def cross_entropy(logprobs: Tensor, weights: Tensor, mask: Tensor | None = None) -> LossOutput:
    """Weighted negative log-likelihood: per token ``-(weights * logprobs)``. Never clips.

    Eligible tokens are ``mask != 0`` when a mask is given, else ``weights != 0``.
    """
    if _fused.wanted(logprobs) and (out := _fused.cross_entropy(logprobs, weights, mask)):
        return out
    _check_tensor("weights", weights, like=logprobs)
    batch = LossInputs(logprobs, None, weights, mask, advantages_name="weights")
    weighted = weights * logprobs
    if mask is None:
        batch.eligible = weights.detach() != 0
        loss = -weighted.sum()
    else:
        loss = -(weighted * batch.weight).sum()
    return batch.output(loss, logprobs.detach())


# ---------------------------------------------------------------------------------------------
# The registry: every loss the backends can run, declared once.
# ---------------------------------------------------------------------------------------------


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""Default of an :class:`Option` that the caller must give."""


@dataclass(frozen=True)
class TensorInput:
    """A per-token tensor a loss takes after the policy log-probs (same shape as them).

    ``name``: the loss function's keyword. ``required``: whether a call must give it.
    ``datum_fields``: the Tinker ``Datum.loss_fn_inputs`` fields it is read from on the Miles
    runtime, first present wins (default: ``(name,)``).
    """

    name: str
    required: bool = True
    datum_fields: tuple[str, ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        return self.datum_fields or (self.name,)


@dataclass(frozen=True)
class Option:
    """A keyword option of a loss (Tinker's ``loss_fn_config`` key).

    ``default``: its value when not given (:data:`REQUIRED`: must be given). ``per_datum``: a
    datum's ``loss_fn_inputs`` may override it with a tensor (one value, or one per token).
    """

    name: str
    default: Any = REQUIRED
    per_datum: bool = False


@dataclass(frozen=True)
class LossSpec:
    """One loss: its Tinker ``loss_fn`` name, function, whether it clips, inputs and options.

    The function is called as ``fn(logprobs, **tensor_inputs, **options)`` and returns a
    :class:`LossOutput` whose clip fields are set exactly when ``clips``, whose low/high split
    is set exactly when ``splits`` (only for a loss that clips), and whose ``gauge`` is set
    exactly when ``gauge`` (a loss with sampling log-probs: :func:`gauge_of`; its inputs checked
    with :func:`check_inputs`).
    """

    name: str
    fn: Callable[..., LossOutput]
    clips: bool
    inputs: tuple[TensorInput, ...]
    options: tuple[Option, ...] = ()
    splits: bool = False
    gauge: bool = False

    def __post_init__(self) -> None:
        if self.splits and not self.clips:
            raise ValueError(
                f"loss {self.name}: splits=True needs clips=True (the split is of the clipped tokens)"
            )

    def check_output(self, out: object) -> LossOutput:
        """``out`` if it is a :class:`LossOutput` shaped as declared, else TypeError naming the loss."""
        if not isinstance(out, LossOutput):
            raise TypeError(f"loss {self.name} returned {type(out).__name__}, expected LossOutput")
        split = out.clipped_low_tokens is not None and out.clipped_high_tokens is not None
        if out.clips != self.clips or (out.clips and split != self.splits):

            def shape(clips: bool, splits: bool) -> str:
                return (
                    "clip counts with the low/high split"
                    if splits
                    else "clip counts"
                    if clips
                    else "no clip counts"
                )

            raise TypeError(
                f"loss {self.name} is registered as returning {shape(self.clips, self.splits)} but returned "
                f"{shape(out.clips, out.clips and split)}"
            )
        if out.has_gauge != self.gauge:
            raise TypeError(
                f"loss {self.name} is registered {'with' if self.gauge else 'without'} the on-policy gauge "
                f"but returned {'one' if out.has_gauge else 'none'} (LossOutput.gauge, adapters.losses.gauge_of)"
            )
        return out

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def required_inputs(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.required)

    @property
    def option_defaults(self) -> dict[str, Any]:
        """Option name -> default (:data:`REQUIRED` when none)."""
        return {o.name: o.default for o in self.options}

    def check_arguments(self, inputs: Mapping[str, object], config: Mapping[str, object]) -> None:
        """Raise ValueError naming an unknown or missing input or option, TypeError for a
        non-tensor input (the policy log-probs are not among ``inputs``)."""
        accepted = self.input_names
        for key, value in inputs.items():
            if key not in accepted:
                raise ValueError(
                    f"loss_fn_inputs has {key!r}, which loss {self.name} does not take; it takes {sorted(accepted)} "
                    "(the policy log-probs come from the model's output tensor)"
                )
            if not isinstance(value, Tensor):
                raise TypeError(f"loss_fn_inputs[{key!r}] must be a torch.Tensor, got {type(value).__name__}")
        missing = sorted(set(self.required_inputs) - set(inputs))
        if missing:
            raise ValueError(f"loss_fn_inputs lacks {missing} required by loss {self.name}")
        self.check_config(config)

    def check_config(self, config: Mapping[str, object]) -> None:
        """Raise ValueError naming an option the loss does not take or a required one missing."""
        defaults = self.option_defaults
        unknown = sorted(set(config) - set(defaults))
        if unknown:
            raise ValueError(
                f"loss_fn_config has {unknown}, which loss {self.name} does not take; its options are "
                f"{sorted(defaults) or 'none'}"
            )
        missing = [name for name, default in defaults.items() if default is REQUIRED and name not in config]
        if missing:
            raise ValueError(f"loss_fn_config lacks {missing} required by loss {self.name}")


_REGISTRY: dict[str, LossSpec] = {}


def register_loss(spec: LossSpec, *, replace: bool = False) -> LossSpec:
    """Add ``spec`` to the registry (the Megatron and Miles paths then run it by name)."""
    if not isinstance(spec, LossSpec):
        raise TypeError(f"register_loss takes a LossSpec, got {type(spec).__name__}")
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"a loss named {spec.name!r} is already registered (pass replace=True)")
    _REGISTRY[spec.name] = spec
    return spec


def unregister_loss(name: str) -> LossSpec:
    """Remove a registered loss and return its spec."""
    try:
        return _REGISTRY.pop(name)
    except KeyError:
        raise ValueError(f"no loss named {name!r} is registered") from None


def loss_spec(loss_fn: str | LossSpec | Callable[..., LossOutput]) -> LossSpec | None:
    """The spec of a loss name, a spec, or a registered function; ``None`` for an unregistered
    function. ValueError for an unknown name."""
    if isinstance(loss_fn, LossSpec):
        return loss_fn
    if isinstance(loss_fn, str):
        try:
            return _REGISTRY[loss_fn]
        except KeyError:
            raise ValueError(f"loss_fn {loss_fn!r} is not one of {sorted(_REGISTRY)}") from None
    return next((spec for spec in _REGISTRY.values() if spec.fn is loss_fn), None)


class _Functions(Mapping[str, Callable[..., LossOutput]]):
    """Live view: loss name -> function, over the registry."""

    def __getitem__(self, name: str) -> Callable[..., LossOutput]:
        return _REGISTRY[name].fn

    def __iter__(self) -> Iterator[str]:
        return iter(list(_REGISTRY))

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"LOSSES({sorted(_REGISTRY)})"


class _Clipping(Set[str]):
    """Live view: names of the registered losses that clip."""

    def __contains__(self, name: object) -> bool:
        spec = _REGISTRY.get(name) if isinstance(name, str) else None
        return spec is not None and spec.clips

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, spec in _REGISTRY.items() if spec.clips])

    def __len__(self) -> int:
        return sum(spec.clips for spec in _REGISTRY.values())

    def __repr__(self) -> str:
        return f"CLIPPING_LOSSES({sorted(self)})"


LOSSES: Mapping[str, Callable[..., LossOutput]] = _Functions()
"""Loss functions by Tinker ``loss_fn`` name (a live view of the registry)."""
CLIPPING_LOSSES: Set[str] = _Clipping()
"""Names of the registered losses that clip and so emit clip counts (a live view)."""

_RL_INPUTS = (
    TensorInput("sampling_logprobs", datum_fields=("logprobs",)),
    TensorInput("advantages"),
    TensorInput("mask", required=False, datum_fields=("mask", "weights")),
)
"""Inputs of the RL losses; on the Miles runtime the sampler's log-probs arrive as ``logprobs``
and the eligible tokens as ``mask`` (else ``weights``)."""


GAUGE_OPTIONS = (
    Option(measures.RATIO_OUTSIDE_LOW_OPTION, RATIO_OUTSIDE_LOW),
    Option(measures.RATIO_OUTSIDE_HIGH_OPTION, RATIO_OUTSIDE_HIGH),
)
"""The gauge's per-call options (``loss_fn_config`` keys) of every loss with sampling log-probs."""


def _thresholds(low: float, high: float) -> tuple[Option, ...]:
    return (
        Option("clip_low_threshold", low, per_datum=True),
        Option("clip_high_threshold", high, per_datum=True),
        *GAUGE_OPTIONS,
    )


for _spec in (
    LossSpec("ppo", ppo, True, _RL_INPUTS, _thresholds(PPO_CLIP_LOW, PPO_CLIP_HIGH), splits=True, gauge=True),
    LossSpec(
        "cispo",
        cispo,
        True,
        _RL_INPUTS,
        _thresholds(CISPO_CLIP_LOW, CISPO_CLIP_HIGH),
        splits=True,
        gauge=True,
    ),
    LossSpec("importance_sampling", importance_sampling, False, _RL_INPUTS, GAUGE_OPTIONS, gauge=True),
    LossSpec("dro", dro, False, _RL_INPUTS, (Option("beta"), *GAUGE_OPTIONS), gauge=True),
    LossSpec(
        "cross_entropy", cross_entropy, False, (TensorInput("weights"), TensorInput("mask", required=False))
    ),
):
    register_loss(_spec)
del _spec


# ---------------------------------------------------------------------------------------------
# The packing: a LossOutput as one float64 vector, for every host transfer and the one collective.
# ---------------------------------------------------------------------------------------------

PACKED_FIELDS: tuple[str, ...] = measures.PACKED_FIELDS
"""Layout of a packed :class:`LossOutput` (or a combination of packed ones), declared in
:data:`tracking.measures.PACKED_FIELDS`.

The added part (:data:`PACKED_ADDED` fields): ``loss:sum``; the four token counts (0 where
absent); the gauge's sums (0 where absent); the number of loss calls summed, of those from a
clipping loss, of those reporting the low/high split and of those with the gauge; then the
bad-input counts of :data:`INPUT_CHECKS`. The extremes (``log_ratio:max``, ``-log_ratio:min``;
``-inf`` where absent or over no token) are combined by max (:func:`combine_packed`). One dtype,
:data:`PACKED_DTYPE`: every count stays exact below 2**53 tokens (checked on the host by
:func:`unpack`), so a step's vectors combine on device and cross ranks in one collective.
"""
PACKED_DTYPE = torch.float64
PACKED_ADDED = len(measures.PACKED_ADDED)
"""Number of leading packed fields that add; the rest combine by max."""
_COUNTERS = PACKED_FIELDS.index("calls")
_INVALID = _COUNTERS + len(measures.CALL_COUNTERS)


@functools.lru_cache(maxsize=256)
def _constants(device: torch.device, calls: int, groups: tuple[bool, ...]) -> tuple[Tensor, Tensor]:
    """``[0, calls, per-group calls...]`` and the gauge of no call (sums 0, extremes -inf) on
    ``device``, made once per combination (fills, never a host-to-device copy); only ever read."""
    values = (0.0, float(calls), *(float(calls if present else 0) for present in groups))
    counters = torch.empty(len(values), dtype=PACKED_DTYPE, device=device)
    for i, value in enumerate(values):
        counters[i].fill_(value)
    absent = torch.zeros(len(GAUGE_FIELDS), dtype=PACKED_DTYPE, device=device)
    absent[_GAUGE_SUMS:].fill_(-math.inf)
    return counters, absent


def pack_rows(
    loss: Tensor,
    loss_tokens: Tensor,
    clipped_tokens: Tensor | None,
    clipped_low_tokens: Tensor | None,
    clipped_high_tokens: Tensor | None,
    invalid: Tensor,
    calls: int = 1,
    gauge: Tensor | None = None,
) -> Tensor:
    """``[n, len(PACKED_FIELDS)]`` rows of ``n`` loss outputs of one layout, each field given for
    all of them at once: ``[n]`` for the loss and the counts, ``[n, len(INPUT_CHECKS)]`` for
    ``invalid``, ``[n, len(GAUGE_FIELDS)]`` for the gauge (``None``: the field is absent in every
    output); ``calls`` per row. A few stacked ops whatever ``n``, on ``loss``'s device. No sync."""
    device = loss.device
    n = loss.shape[0]
    clipping = clipped_tokens is not None
    split = clipping and clipped_low_tokens is not None and clipped_high_tokens is not None
    counters, absent = _constants(device, calls, (clipping, split, gauge is not None))
    zero = counters[0].expand(n)

    def column(t: Tensor | None) -> Tensor:
        return zero if t is None else t.to(device=device, dtype=PACKED_DTYPE)

    head = torch.stack(
        [
            column(loss),
            column(loss_tokens),
            column(clipped_tokens),
            column(clipped_low_tokens if split else None),
            column(clipped_high_tokens if split else None),
        ],
        dim=1,
    )
    measured = absent.expand(n, -1) if gauge is None else gauge.to(device=device, dtype=PACKED_DTYPE)
    return torch.cat(
        [
            head,
            measured[:, :_GAUGE_SUMS],
            counters[1:].expand(n, -1),
            invalid.to(device=device, dtype=PACKED_DTYPE),
            measured[:, _GAUGE_SUMS:],
        ],
        dim=1,
    )


def pack(out: LossOutput) -> Tensor:
    """``out`` as one :data:`PACKED_FIELDS` vector on its device (no host sync)."""

    def row(t: Tensor | None, *shape: int) -> Tensor | None:
        return None if t is None else t.detach().reshape(1, *shape)

    rows = pack_rows(
        out.loss.detach().reshape(1),
        out.loss_tokens.detach().reshape(1),
        row(out.clipped_tokens),
        row(out.clipped_low_tokens),
        row(out.clipped_high_tokens),
        out.invalid.detach().reshape(1, -1),
        out.calls,
        row(out.gauge, -1),
    )
    return rows[0]


def combine_packed(rows: Tensor) -> Tensor:
    """Combine packed vectors (the rows of ``rows``, ``[n, len(PACKED_FIELDS)]``) into one: the
    added part summed, the extremes by max (the merge rules of :mod:`tracking.measures`). No sync."""
    if rows.dim() != 2 or rows.shape[1] != len(PACKED_FIELDS):
        raise ValueError(f"rows must have shape [n, {len(PACKED_FIELDS)}], got {tuple(rows.shape)}")
    return torch.cat([rows[:, :PACKED_ADDED].sum(dim=0), rows[:, PACKED_ADDED:].amax(dim=0)])


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
    what = {measures.CLIP: "a clipping loss", measures.GAUGE: "a loss with the on-policy gauge"}[group]
    rest = {measures.CLIP: "a loss that never clips", measures.GAUGE: "a loss without it (cross_entropy)"}[
        group
    ]
    return ValueError(
        f"{present} of {calls} loss calls come from {what} and the rest from {rest}; one step must use "
        "one kind of loss (PPO and CISPO sum together)"
    )


def _gauge_values(values: Sequence[float], loss_tokens: int) -> dict[str, float]:
    """The gauge's metric values from a packed vector: sums, and extremes over some token."""
    start = PACKED_FIELDS.index(GAUGE_SUM_KEYS[0])
    out = dict(zip(GAUGE_SUM_KEYS, values[start : start + _GAUGE_SUMS], strict=True))
    if loss_tokens:
        for key, packed in zip(GAUGE_EXTREME_KEYS, values[PACKED_ADDED:], strict=True):
            out[key] = -packed if measures.by_key(key).reduction == measures.MIN else packed
    return out


def unpack(values: Sequence[float], where: str = "") -> PackedSums:
    """Read a :data:`PACKED_FIELDS` vector brought to the host (one combination of packed outputs).

    Counts are checked whole, non-negative and exact (below 2**53), the gauge as in
    :func:`tracking.counts.check_gauge`; ``where`` is appended to the name of a bad value. Raises
    ValueError when the combination mixes clipping and non-clipping losses, or losses with and
    without the gauge. The split is kept only when every clipping call reported it. Bad inputs
    are left in ``invalid`` (see :meth:`PackedSums.check`); with any, the gauge is not read (its
    values are then not meaningful).
    """
    if len(values) != len(PACKED_FIELDS):
        raise ValueError(f"expected {len(PACKED_FIELDS)} packed values ({PACKED_FIELDS}), got {len(values)}")
    invalid = [int(v) for v in values[_INVALID:PACKED_ADDED]]
    calls, clipping, split, gauged = (int(v) for v in values[_COUNTERS:_INVALID])
    if clipping not in (0, calls):
        raise _mixed_calls(measures.CLIP, clipping, calls)
    if gauged not in (0, calls):
        raise _mixed_calls(measures.GAUGE, gauged, calls)
    suffix = f" ({where})" if where else ""
    count = {key: as_count(f"{key}{suffix}", values[1 + i]) for i, key in enumerate(keys.TOKEN_COUNT_KEYS)}
    tokens = count[keys.LOSS_TOKENS]
    gauge = None
    if gauged and not any(invalid):
        gauge = check_gauge(_gauge_values(values, tokens), tokens, suffix)
    if not clipping:
        counts = MeasuredSums(tokens, gauge=gauge)
    elif split == clipping:
        counts = MeasuredSums(*(count[k] for k in keys.TOKEN_COUNT_KEYS), gauge=gauge)
    else:
        counts = MeasuredSums(tokens, count[keys.CLIPPED_TOKENS], gauge=gauge)
    return PackedSums(float(values[0]), counts, calls, invalid)


def _clamp(ratio: Tensor, low: Threshold, high: Threshold) -> Tensor:
    """``torch.clamp`` with number or tensor bounds (one call either way; a number beside a tensor
    bound becomes a tensor, as ``torch.clamp`` takes both or neither)."""
    if isinstance(low, Tensor) != isinstance(high, Tensor):
        low, high = (torch.as_tensor(v, dtype=ratio.dtype, device=ratio.device) for v in (low, high))
    bounds: Any = (low, high)
    return torch.clamp(ratio, *bounds)


def _check_tensor(name: str, value: object, *, like: Tensor | None = None, floating: bool = False) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if like is not None:
        if value.shape != like.shape:
            raise ValueError(
                f"{name} has shape {tuple(value.shape)} but logprobs has shape {tuple(like.shape)}: "
                "all per-token inputs must have the same shape"
            )
        if value.device != like.device:
            raise ValueError(f"{name} is on {value.device} but logprobs is on {like.device}")


class LossInputs:
    """Checked per-token inputs of one loss call: eligible tokens, the mask as a multiplier.

    The public input checks of every loss (:func:`check_inputs`); a registered loss of one's own
    builds its output with :meth:`output` and so gets the same on-device checks and error messages.
    Attributes: ``eligible`` (bool, the token shape), ``mask_eligible`` (the same, ``None`` without
    a mask: every token is eligible), ``weight`` (the mask as a multiplier, ``1.0`` without one).
    """

    def __init__(
        self,
        logprobs: Tensor,
        sampling_logprobs: Tensor | None,
        advantages: Tensor,
        mask: Tensor | None,
        *,
        advantages_name: str = "advantages",
    ) -> None:
        _check_tensor("logprobs", logprobs, floating=True)
        self.sources: dict[str, Tensor] = {"logprobs": logprobs.detach()}
        if sampling_logprobs is not None:
            _check_tensor("sampling_logprobs", sampling_logprobs, like=logprobs, floating=True)
            self.sources["sampling_logprobs"] = sampling_logprobs.detach()
        _check_tensor(advantages_name, advantages, like=logprobs, floating=advantages_name == "advantages")
        self.sources[advantages_name] = advantages.detach()
        self.device = logprobs.device
        self.mask_bad: Tensor | None = None
        self.mask_eligible: Tensor | None = None
        if mask is None:
            self.eligible = torch.ones(logprobs.shape, dtype=torch.bool, device=self.device)
            self.weight: Tensor | float = 1.0
            return
        _check_tensor("mask", mask, like=logprobs)
        mask = mask.detach()
        self.sources["mask"] = mask
        if mask.dtype == torch.bool:
            self.eligible = mask
        else:
            self.eligible = mask != 0
            # 0/1 entries equal their own eligibility (0 or 1); any other value, NaN too, differs.
            self.mask_bad = torch.count_nonzero(mask != self.eligible)
        self.mask_eligible = self.eligible
        self.weight = mask.to(logprobs.dtype)

    def output(
        self,
        loss: Tensor,
        propagated: Tensor,
        clipped: Tensor | None = None,
        low: Tensor | None = None,
        high: Tensor | None = None,
        thresholds_bad: Tensor | None = None,
        gauge: Tensor | None = None,
    ) -> LossOutput:
        """Assemble the output (``gauge``: :func:`gauge_of`, for a loss with sampling log-probs).

        Non-finite inputs show in ``loss`` (advantages, weights, +inf/NaN logprobs) or in the sum
        of ``propagated`` (``logprobs - sampling_logprobs``, where a -inf that the ratio would turn
        into a harmless 0 still shows): one extra reduction. A sum that overflows from finite
        inputs (beyond 3.4e38, or an importance weight beyond float range) is reported as such.
        """
        with torch.no_grad():
            loss_tokens = torch.count_nonzero(self.eligible)  # int64, no int64 copy of the mask
            total = loss.detach() + propagated.detach().sum()
            if gauge is not None:
                total = total + gauge[_WEIGHT_SQ]  # +inf once an importance weight overflows
            nonfinite = (~torch.isfinite(total)).to(torch.int64)
            mask_bad = self.mask_bad
            if mask_bad is None:
                mask_bad = torch.zeros((), dtype=torch.int64, device=self.device)
            if thresholds_bad is None:
                thresholds_bad = torch.zeros((), dtype=torch.int64, device=self.device)
            invalid = torch.stack([nonfinite, mask_bad, thresholds_bad])
        return LossOutput(loss, loss_tokens, clipped, low, high, invalid, (self.sources,), gauge=gauge)


_WEIGHT_SQ = GAUGE_FIELDS.index(keys.IS_WEIGHT_SQ_SUM)
"""Index of ``is_weight_sq:sum`` in :data:`GAUGE_FIELDS` (the non-finite check reads it)."""


def check_inputs(
    logprobs: Tensor,
    sampling_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    advantages_name: str = "advantages",
) -> LossInputs:
    """The input checks of every loss, public: types, shapes and devices at once (TypeError /
    ValueError naming the input), mask entries counted on device. Build the output with
    :meth:`LossInputs.output` (and :func:`gauge_of` for a loss with sampling log-probs)."""
    return LossInputs(logprobs, sampling_logprobs, advantages, mask, advantages_name=advantages_name)


def _check_thresholds(low: Threshold, high: Threshold, device: torch.device) -> Tensor | None:
    """Check Python-number thresholds now; count bad tensor-threshold entries on device."""
    for name, value in (("clip_low_threshold", low), ("clip_high_threshold", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float, Tensor)):
            raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")
        if not isinstance(value, Tensor) and (not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} must be a finite ratio bound >= 0, got {value!r}")
    if not isinstance(low, Tensor) and not isinstance(high, Tensor):
        if low > high:
            raise ValueError(f"clip_low_threshold={low!r} is above clip_high_threshold={high!r}")
        return None
    with torch.no_grad():
        lo = torch.as_tensor(low, device=device)
        hi = torch.as_tensor(high, device=device)
        bad = (lo > hi) | (lo < 0) | ~torch.isfinite(lo) | ~torch.isfinite(hi)
        return bad.sum()
