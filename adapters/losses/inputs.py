"""The input checks of every loss, public: types, shapes and devices checked at once (TypeError /
ValueError naming the input), values counted on device (no sync) and carried in
``LossOutput.invalid`` until the counts reach the host."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from cliptrack.adapters.losses import formulas
from cliptrack.adapters.losses.output import LossOutput
from cliptrack.core import keys, measures
from torch import Tensor

Threshold = formulas.Threshold
"""An absolute ratio bound: one number, or a tensor broadcasting to the token shape."""

SAMPLER = "sampler"
"""``clip_reference``: the ratio is taken against the sampler's log-probs (Tinker's semantics)."""
OLD = "old"
"""``clip_reference``: against the trainer's old log-probs at the sampling weights (decoupled PPO)."""
CLIP_REFERENCES = (SAMPLER, OLD)
"""The values of a clipping loss's ``clip_reference`` option."""


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


def check_tensor(name: str, value: object, *, like: Tensor | None = None, floating: bool = False) -> None:
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
    a mask: every token is eligible), ``weight`` (the mask as a multiplier, ``1.0`` without one),
    ``loss_tokens`` (int64 0-dim), ``mask_bad`` (mask entries neither 0 nor 1, int64 0-dim); the
    same terms as the built-in formulas (:func:`cliptrack.adapters.losses.formulas.mask_terms`).
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
        self.sources = checked_sources(
            logprobs, sampling_logprobs, advantages, mask, advantages_name=advantages_name
        )
        self.device = logprobs.device
        self._shape = logprobs.shape
        self._eligible: Tensor | None = None
        self.mask_eligible, self.weight, self.loss_tokens, self.mask_bad = formulas.mask_terms(
            mask, logprobs, torch.int64
        )

    @property
    def eligible(self) -> Tensor:
        """The eligible tokens as a bool tensor of the token shape (all true without a mask).

        A loss of one's own may set it (e.g. ``batch.eligible = weights != 0`` without a mask):
        ``loss_tokens`` then counts the tokens set; ``mask_eligible`` stays the mask's."""
        if self._eligible is not None:
            return self._eligible
        if self.mask_eligible is None:
            return torch.ones(self._shape, dtype=torch.bool, device=self.device)
        return self.mask_eligible

    @eligible.setter
    def eligible(self, value: Tensor) -> None:
        self._eligible = value
        self.loss_tokens = torch.count_nonzero(value)

    def output(
        self,
        loss: Tensor,
        propagated: Tensor,
        measured: Mapping[str, Tensor] | None = None,
        thresholds_bad: Tensor | None = None,
        declaration: measures.Declaration = measures.DEFAULT,
    ) -> LossOutput:
        """Assemble the output: ``measured``, the loss's measures by metric key (the clip counts
        ``clipped_tokens:sum`` and the split for a loss that clips; ``**gauge_of(...)`` for a loss
        with sampling log-probs), 0-dim tensors; ``loss_tokens:sum`` is the batch's own.

        ``propagated``: ``logprobs - sampling_logprobs`` (or the logprobs), read by the non-finite
        check (:func:`cliptrack.adapters.losses.formulas.checks`); ``thresholds_bad``: the count of bad tensor
        threshold entries (:func:`cliptrack.adapters.losses.formulas.bad_thresholds`); ``declaration``:
        the declaration the output carries (the default one unless given).
        """
        values = {keys.LOSS_TOKENS: self.loss_tokens, **(measured or {})}
        gauge = values if keys.IS_WEIGHT_SQ_SUM in values else None
        with torch.no_grad():
            invalid = formulas.checks(loss, propagated, self.mask_bad, thresholds_bad, gauge)
        return LossOutput(loss, values, invalid, (self.sources,), declaration=declaration)


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


def checked_sources(
    logprobs: Tensor,
    sampling_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor | None,
    *,
    advantages_name: str = "advantages",
    parts: tuple[Tensor | None, Tensor | None] = (None, None),
    importance_weights: Tensor | None = None,
) -> dict[str, Tensor]:
    """Check types, shapes and devices now (TypeError / ValueError naming the input); the
    detached inputs by argument name (kept to name bad entries later). ``parts``: the optional
    ``old_logprobs`` and ``weight_lag``; ``importance_weights``: a clipping loss's optional
    per-token weights."""
    check_tensor("logprobs", logprobs, floating=True)
    sources = {"logprobs": logprobs.detach()}
    if sampling_logprobs is not None:
        check_tensor("sampling_logprobs", sampling_logprobs, like=logprobs, floating=True)
        sources["sampling_logprobs"] = sampling_logprobs.detach()
    check_tensor(advantages_name, advantages, like=logprobs, floating=advantages_name == "advantages")
    sources[advantages_name] = advantages.detach()
    if mask is not None:
        check_tensor("mask", mask, like=logprobs)
        sources["mask"] = mask.detach()
    old_logprobs, weight_lag = parts
    if old_logprobs is not None:
        check_tensor("old_logprobs", old_logprobs, like=logprobs, floating=True)
        sources["old_logprobs"] = old_logprobs.detach()
    if weight_lag is not None:
        check_tensor("weight_lag", weight_lag, like=logprobs)
        if weight_lag.dtype == torch.bool:
            raise TypeError("weight_lag must hold numbers (versions), got dtype torch.bool")
        sources["weight_lag"] = weight_lag.detach()
    if importance_weights is not None:
        check_tensor("importance_weights", importance_weights, like=logprobs, floating=True)
        sources["importance_weights"] = importance_weights.detach()
    return sources


def check_thresholds(low: Threshold, high: Threshold) -> None:
    """Check Python-number clip thresholds now (tensor ones are counted on device by the formula,
    :func:`cliptrack.adapters.losses.formulas.bad_thresholds`)."""
    for name, value in (("clip_low_threshold", low), ("clip_high_threshold", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float, Tensor)):
            raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")
        if not isinstance(value, Tensor) and (not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} must be a finite ratio bound >= 0, got {value!r}")
    if not isinstance(low, Tensor) and not isinstance(high, Tensor) and low > high:
        raise ValueError(f"clip_low_threshold={low!r} is above clip_high_threshold={high!r}")


def check_clip_reference(value: object, old_logprobs: Tensor | None) -> bool:
    """Whether the ``clip_reference`` option asks for the old log-probs (``"old"``) rather than the
    sampler's (``"sampler"``); ValueError naming the option for another value, or for ``"old"``
    without ``old_logprobs`` (host-side, no sync)."""
    if value not in CLIP_REFERENCES:
        raise ValueError(f"clip_reference must be one of {CLIP_REFERENCES}, got {value!r}")
    if value == OLD and old_logprobs is None:
        raise ValueError(
            "clip_reference='old' clips r = exp(logprobs - old_logprobs): pass old_logprobs (the trainer's "
            "log-probs at the weights that sampled)"
        )
    return value == OLD


def check_dual_clip(value: object) -> float:
    """The ``dual_clip`` option as the formula's constant: ``c`` (a finite number above 1, verl's
    ``clip_ratio_c``), or ``0.0`` for ``None`` (off); TypeError / ValueError naming the option."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"dual_clip must be a float above 1 or None, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 1:
        raise ValueError(f"dual_clip must be a finite ratio above 1 (verl's clip_ratio_c), got {value!r}")
    return float(value)
