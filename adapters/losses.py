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

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from adapters import fused as _fused
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
    "non-finite values (NaN or inf) in logprobs, sampling_logprobs, advantages or weights of {n} loss call(s)",
    "mask has {n} entries that are neither 0 nor 1",
    "clip thresholds have {n} entries that are negative, non-finite or with low > high",
)
"""Messages for the entries of ``LossOutput.invalid``, in order; ``{n}`` is the entry's value."""
_NONFINITE, _MASK, _THRESHOLDS = range(len(INPUT_CHECKS))

Sources = tuple[dict[str, Tensor], ...]
"""Detached inputs of each loss call, by argument name, kept to name bad entries precisely."""


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
    sources: Sources = ()

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
            sources=self.sources + other.sources,
        )

    def check(self) -> None:
        """Raise ValueError naming every input with bad entries. Synchronises with the host."""
        raise_invalid(self.invalid, self.sources)

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
            problems = ["the loss or logprobs - sampling_logprobs overflows to inf although the inputs are finite"]
    raise ValueError("invalid loss input: " + "; ".join(problems))


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
) -> LossOutput:
    """Clipped PPO: per token ``-min(r*A, clamp(r, low, high)*A)``, ``r = exp(logprobs - sampling_logprobs)``.

    A token is clipped where clipping bites, ``clamp(r)*A < r*A``: low side ``A < 0, r < low``,
    high side ``A > 0, r > high``. Thresholds are absolute ratio bounds (floats, or tensors that
    broadcast to the token shape for per-datum thresholds).
    """
    if _fused.wanted(logprobs) and (out := _fused.ppo(logprobs, sampling_logprobs, advantages, mask,
                                                      clip_low_threshold=clip_low_threshold,
                                                      clip_high_threshold=clip_high_threshold)):
        return out
    batch = _Batch(logprobs, sampling_logprobs, advantages, mask)
    thresholds_bad = _check_thresholds(clip_low_threshold, clip_high_threshold, logprobs.device)
    log_ratio = logprobs - sampling_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = _clamp(ratio, clip_low_threshold, clip_high_threshold) * advantages
    loss = -(torch.minimum(unclipped, clipped) * batch.weight).sum()
    with torch.no_grad():
        bites = (clipped < unclipped) & batch.eligible
        n_clipped = torch.count_nonzero(bites)
        n_low = torch.count_nonzero(bites & (advantages < 0))  # clipping bites on the low side exactly when A < 0
    return batch.output(loss, log_ratio, n_clipped, n_low, n_clipped - n_low, thresholds_bad)


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
    if _fused.wanted(logprobs) and (out := _fused.cispo(logprobs, sampling_logprobs, advantages, mask,
                                                        clip_low_threshold=clip_low_threshold,
                                                        clip_high_threshold=clip_high_threshold)):
        return out
    batch = _Batch(logprobs, sampling_logprobs, advantages, mask)
    thresholds_bad = _check_thresholds(clip_low_threshold, clip_high_threshold, logprobs.device)
    log_ratio = (logprobs - sampling_logprobs).detach()
    ratio = torch.exp(log_ratio)
    coefficient = _clamp(ratio, clip_low_threshold, clip_high_threshold)
    loss = -(coefficient * advantages * logprobs * batch.weight).sum()
    with torch.no_grad():
        departs = (coefficient != ratio) & batch.eligible
        n_clipped = torch.count_nonzero(departs)
        n_low = torch.count_nonzero(departs & (ratio < coefficient))
    return batch.output(loss, log_ratio, n_clipped, n_low, n_clipped - n_low, thresholds_bad)


def importance_sampling(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
) -> LossOutput:
    """Importance-sampled policy gradient: per token ``-(r * A)``. Never clips."""
    if _fused.wanted(logprobs) and (out := _fused.importance_sampling(logprobs, sampling_logprobs, advantages, mask)):
        return out
    batch = _Batch(logprobs, sampling_logprobs, advantages, mask)
    log_ratio = logprobs - sampling_logprobs
    loss = -(torch.exp(log_ratio) * advantages * batch.weight).sum()
    return batch.output(loss, log_ratio)


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
    if _fused.wanted(logprobs) and (out := _fused.dro(logprobs, sampling_logprobs, advantages, mask, beta=beta)):
        return out
    batch = _Batch(logprobs, sampling_logprobs, advantages, mask)
    log_ratio = logprobs - sampling_logprobs
    objective = logprobs * advantages - 0.5 * beta * log_ratio**2
    loss = -(objective * batch.weight).sum()
    return batch.output(loss, log_ratio)


def cross_entropy(logprobs: Tensor, weights: Tensor, mask: Tensor | None = None) -> LossOutput:
    """Weighted negative log-likelihood: per token ``-(weights * logprobs)``. Never clips.

    Eligible tokens are ``mask != 0`` when a mask is given, else ``weights != 0``.
    """
    if _fused.wanted(logprobs) and (out := _fused.cross_entropy(logprobs, weights, mask)):
        return out
    _check_tensor("weights", weights, like=logprobs)
    batch = _Batch(logprobs, None, weights, mask, advantages_name="weights")
    weighted = weights * logprobs
    if mask is None:
        batch.eligible = weights.detach() != 0
        loss = -weighted.sum()
    else:
        loss = -(weighted * batch.weight).sum()
    return batch.output(loss, logprobs.detach())


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


class _Batch:
    """Checked per-token inputs of one loss call: eligible tokens, the mask as a multiplier."""

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
        self.weight = mask.to(logprobs.dtype)

    def output(
        self,
        loss: Tensor,
        propagated: Tensor,
        clipped: Tensor | None = None,
        low: Tensor | None = None,
        high: Tensor | None = None,
        thresholds_bad: Tensor | None = None,
    ) -> LossOutput:
        """Assemble the output.

        Non-finite inputs show in ``loss`` (advantages, weights, +inf/NaN logprobs) or in the sum
        of ``propagated`` (``logprobs - sampling_logprobs``, where a -inf that the ratio would turn
        into a harmless 0 still shows): one extra reduction. A sum that overflows from finite
        inputs (beyond 3.4e38) is reported as such.
        """
        with torch.no_grad():
            loss_tokens = torch.count_nonzero(self.eligible)  # int64, no int64 copy of the mask
            nonfinite = (~torch.isfinite(loss.detach() + propagated.detach().sum())).to(torch.int64)
            mask_bad = self.mask_bad
            if mask_bad is None:
                mask_bad = torch.zeros((), dtype=torch.int64, device=self.device)
            if thresholds_bad is None:
                thresholds_bad = torch.zeros((), dtype=torch.int64, device=self.device)
            invalid = torch.stack([nonfinite, mask_bad, thresholds_bad])
        return LossOutput(loss, loss_tokens, clipped, low, high, invalid, (self.sources,))


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
