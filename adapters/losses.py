"""Tinker's built-in losses over per-token tensors, counting the tokens where clipping bites.

Every loss takes per-token tensors of one shape (1-D packed ``[tokens]`` or ``[batch, seq]``) and
returns a :class:`LossOutput` whose ``loss`` is the **sum** of per-token losses over eligible tokens
(``mask != 0``), as Tinker's ``loss:sum``. Counting adds detached int64 0-dim tensors on the input's
device; it never changes the loss value or any gradient, and never synchronises with the host.

Input values (non-finite entries, masks that are not 0/1, tensor thresholds out of range) are
checked on the device too: the number of bad entries per input is carried in
``LossOutput.invalid`` and raised as a ``ValueError`` naming the input the first time the counts
reach the host (:meth:`LossOutput.check`, :func:`adapters.output.loss_metrics`, the backends'
reductions). Shapes, Python-number thresholds and ``beta`` are checked at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tracking.counts import ClipCounts

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
    "logprobs has {n} non-finite entries (NaN or inf)",
    "sampling_logprobs has {n} non-finite entries (NaN or inf)",
    "advantages has {n} non-finite entries (NaN or inf)",
    "weights has {n} non-finite entries (NaN or inf)",
    "mask has {n} entries that are neither 0 nor 1",
    "clip thresholds have {n} entries that are negative, non-finite or with low > high",
)
"""Messages for the entries of ``LossOutput.invalid``, in order."""
_LOGPROBS, _SAMPLING, _ADVANTAGES, _WEIGHTS, _MASK, _THRESHOLDS = range(len(INPUT_CHECKS))


@dataclass(frozen=True)
class LossOutput:
    """The loss of one micro-batch (or a sum of several) and its token counts.

    ``loss``: 0-dim, sum of per-token losses over eligible tokens (differentiable for one call;
    detached in a sum). Counts are detached int64 0-dim tensors on the loss's device, in tokens;
    the clip fields are ``None`` for losses that never clip. ``invalid``: int64 vector, the number
    of bad entries per input of :data:`INPUT_CHECKS`.
    """

    loss: Tensor
    loss_tokens: Tensor
    clipped_tokens: Tensor | None
    clipped_low_tokens: Tensor | None
    clipped_high_tokens: Tensor | None
    invalid: Tensor

    @property
    def clips(self) -> bool:
        """Whether this loss clips (and so carries clip counts)."""
        return self.clipped_tokens is not None

    def __add__(self, other: LossOutput) -> LossOutput:
        """Sum two outputs on device (no host sync); the summed ``loss`` is detached."""
        if not isinstance(other, LossOutput):
            return NotImplemented
        if self.clips != other.clips:
            raise ValueError("cannot add the output of a clipping loss to that of a loss that never clips")

        def add(a: Tensor | None, b: Tensor | None) -> Tensor | None:
            return None if a is None or b is None else a + b

        return LossOutput(
            loss=self.loss.detach() + other.loss.detach(),
            loss_tokens=self.loss_tokens + other.loss_tokens,
            clipped_tokens=add(self.clipped_tokens, other.clipped_tokens),
            clipped_low_tokens=add(self.clipped_low_tokens, other.clipped_low_tokens),
            clipped_high_tokens=add(self.clipped_high_tokens, other.clipped_high_tokens),
            invalid=self.invalid + other.invalid,
        )

    def check(self) -> None:
        """Raise ValueError naming every input with bad entries. Synchronises with the host."""
        raise_invalid(self.invalid)

    def clip_counts(self) -> ClipCounts | None:
        """Exact host-side counts (synchronises); ``None`` when the loss never clips."""
        self.check()
        if self.clipped_tokens is None:
            return None
        assert self.clipped_low_tokens is not None and self.clipped_high_tokens is not None
        values = torch.stack(
            [self.loss_tokens, self.clipped_tokens, self.clipped_low_tokens, self.clipped_high_tokens]
        ).tolist()
        return ClipCounts(*values)


def raise_invalid(invalid: Tensor | list[int]) -> None:
    """Raise ValueError listing the inputs with bad entries in an ``invalid`` count vector."""
    counts = invalid.tolist() if isinstance(invalid, Tensor) else list(invalid)
    problems = [INPUT_CHECKS[i].format(n=int(n)) for i, n in enumerate(counts) if n]
    if problems:
        raise ValueError("invalid loss input: " + "; ".join(problems))


def ppo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    clip_low_threshold: Threshold = PPO_CLIP_LOW,
    clip_high_threshold: Threshold = PPO_CLIP_HIGH,
) -> LossOutput:
    """Clipped PPO: per token ``-min(r*A, clamp(r, low, high)*A)``, ``r = exp(logprobs - sampling_logprobs)``.

    A token is clipped where clipping bites, ``clamp(r)*A < r*A``: low side ``A < 0, r < low``,
    high side ``A > 0, r > high``. Thresholds are absolute ratio bounds (floats, or tensors that
    broadcast to the token shape for per-datum thresholds).
    """
    eligible, weight, invalid = _prepare(logprobs, sampling_logprobs, advantages, mask)
    _check_thresholds(clip_low_threshold, clip_high_threshold, invalid)
    ratio = torch.exp(logprobs - sampling_logprobs)
    unclipped = ratio * advantages
    clipped = _clamp(ratio, clip_low_threshold, clip_high_threshold) * advantages
    loss = -(torch.minimum(unclipped, clipped) * weight).sum()
    with torch.no_grad():
        bites = (clipped < unclipped) & eligible
        n_clipped = bites.sum()
        n_low = (bites & (ratio < clip_low_threshold)).sum()
    return LossOutput(loss, eligible.sum(), n_clipped, n_low, n_clipped - n_low, invalid)


def cispo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    clip_low_threshold: Threshold = CISPO_CLIP_LOW,
    clip_high_threshold: Threshold = CISPO_CLIP_HIGH,
) -> LossOutput:
    """CISPO: per token ``-(clamp(r, low, high).detach() * A * logprobs)``.

    A token is clipped where the coefficient departs from the ratio, ``clamp(r) != r``: low side
    ``r < low``, high side ``r > high``, whatever the sign of ``A``.
    """
    eligible, weight, invalid = _prepare(logprobs, sampling_logprobs, advantages, mask)
    _check_thresholds(clip_low_threshold, clip_high_threshold, invalid)
    ratio = torch.exp(logprobs - sampling_logprobs).detach()
    coefficient = _clamp(ratio, clip_low_threshold, clip_high_threshold)
    loss = -(coefficient * advantages * logprobs * weight).sum()
    with torch.no_grad():
        n_low = ((ratio < clip_low_threshold) & eligible).sum()
        n_high = ((ratio > clip_high_threshold) & eligible).sum()
    return LossOutput(loss, eligible.sum(), n_low + n_high, n_low, n_high, invalid)


def importance_sampling(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
) -> LossOutput:
    """Importance-sampled policy gradient: per token ``-(r * A)``. Never clips."""
    eligible, weight, invalid = _prepare(logprobs, sampling_logprobs, advantages, mask)
    loss = -(torch.exp(logprobs - sampling_logprobs) * advantages * weight).sum()
    return LossOutput(loss, eligible.sum(), None, None, None, invalid)


def dro(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    beta: float,
) -> LossOutput:
    """DRO: per token ``-(logprobs*A - beta/2 * (logprobs - sampling_logprobs)**2)``. Never clips."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    eligible, weight, invalid = _prepare(logprobs, sampling_logprobs, advantages, mask)
    objective = logprobs * advantages - 0.5 * beta * (logprobs - sampling_logprobs) ** 2
    loss = -(objective * weight).sum()
    return LossOutput(loss, eligible.sum(), None, None, None, invalid)


def cross_entropy(logprobs: Tensor, weights: Tensor, mask: Tensor | None = None) -> LossOutput:
    """Weighted negative log-likelihood: per token ``-(weights * logprobs)``. Never clips.

    Eligible tokens are ``mask != 0`` when a mask is given, else ``weights != 0``.
    """
    _check_tensor("logprobs", logprobs, floating=True)
    _check_tensor("weights", weights, like=logprobs)
    invalid = torch.zeros(len(INPUT_CHECKS), dtype=torch.int64, device=logprobs.device)
    with torch.no_grad():
        invalid[_LOGPROBS] = (~torch.isfinite(logprobs)).sum()
        invalid[_WEIGHTS] = (~torch.isfinite(weights)).sum() if weights.is_floating_point() else 0
    if mask is None:
        eligible = weights.detach() != 0
        loss = -(weights * logprobs).sum()
    else:
        eligible, weight = _eligible(mask, logprobs, invalid)
        loss = -(weights * logprobs * weight).sum()
    return LossOutput(loss, eligible.sum(), None, None, None, invalid)


LOSSES = {
    "ppo": ppo,
    "cispo": cispo,
    "importance_sampling": importance_sampling,
    "dro": dro,
    "cross_entropy": cross_entropy,
}
"""Loss functions by Tinker ``loss_fn`` name."""
CLIPPING_LOSSES = frozenset({"ppo", "cispo"})
"""Names of the losses that clip and so emit clip counts."""


def _clamp(ratio: Tensor, low: Threshold, high: Threshold) -> Tensor:
    """``torch.clamp`` with number or tensor bounds (one call either way)."""
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


def _eligible(mask: Tensor, logprobs: Tensor, invalid: Tensor) -> tuple[Tensor, Tensor]:
    """Eligible-token booleans and the mask as a multiplier in the loss's dtype."""
    _check_tensor("mask", mask, like=logprobs)
    mask = mask.detach()
    if mask.dtype == torch.bool:
        return mask, mask.to(logprobs.dtype)
    eligible = mask != 0
    with torch.no_grad():
        invalid[_MASK] = (eligible & (mask != 1)).sum()
    return eligible, mask.to(logprobs.dtype)


def _prepare(
    logprobs: Tensor, sampling_logprobs: Tensor, advantages: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Check shapes now and values on device; return (eligible, weight, invalid)."""
    _check_tensor("logprobs", logprobs, floating=True)
    _check_tensor("sampling_logprobs", sampling_logprobs, like=logprobs, floating=True)
    _check_tensor("advantages", advantages, like=logprobs, floating=True)
    invalid = torch.zeros(len(INPUT_CHECKS), dtype=torch.int64, device=logprobs.device)
    with torch.no_grad():
        invalid[_LOGPROBS] = (~torch.isfinite(logprobs)).sum()
        invalid[_SAMPLING] = (~torch.isfinite(sampling_logprobs)).sum()
        invalid[_ADVANTAGES] = (~torch.isfinite(advantages)).sum()
    if mask is None:
        eligible = torch.ones(logprobs.shape, dtype=torch.bool, device=logprobs.device)
        return eligible, eligible.to(logprobs.dtype), invalid
    eligible, weight = _eligible(mask, logprobs, invalid)
    return eligible, weight, invalid


def _check_thresholds(low: Threshold, high: Threshold, invalid: Tensor) -> None:
    """Python-number thresholds are checked now; tensor thresholds on device into ``invalid``."""
    for name, value in (("clip_low_threshold", low), ("clip_high_threshold", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float, Tensor)):
            raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")
        if not isinstance(value, Tensor) and (not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} must be a finite ratio bound >= 0, got {value!r}")
    if not isinstance(low, Tensor) and not isinstance(high, Tensor):
        if low > high:
            raise ValueError(f"clip_low_threshold={low!r} is above clip_high_threshold={high!r}")
        return
    with torch.no_grad():
        lo = torch.as_tensor(low, device=invalid.device)
        hi = torch.as_tensor(high, device=invalid.device)
        bad = (lo > hi) | (lo < 0) | ~torch.isfinite(lo) | ~torch.isfinite(hi)
        invalid[_THRESHOLDS] = bad.sum()
