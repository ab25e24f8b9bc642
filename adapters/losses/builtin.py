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
(:meth:`LossOutput.check`, :func:`cliptrack.adapters.losses.output.loss_metrics`, the backends' reductions). A
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
from cliptrack.adapters.losses import formulas
from cliptrack.adapters.losses import fused as _fused
from cliptrack.core import keys, measures
from cliptrack.core.sums import (
    GAUGE_EXTREME_KEYS,
    GAUGE_SUM_KEYS,
    MeasuredSums,
    TokenCounts,
    as_count,
    check_gauge,
    mixed_kinds_error,
)
from torch import Tensor

Threshold = formulas.Threshold
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

GAUGE_FIELDS = formulas.GAUGE_FIELDS
"""Layout of ``LossOutput.gauge`` (:data:`cliptrack.adapters.losses.formulas.GAUGE_FIELDS`): the gauge's sums, then
its extremes as combined by max; float64, the same order as in :data:`PACKED_FIELDS`."""
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


K3_SERIES_BELOW = formulas.K3_SERIES_BELOW
k3_terms = formulas.k3_terms
gauge_of = formulas.gauge_of
"""The on-policy gauge of one loss call (:func:`cliptrack.adapters.losses.formulas.gauge_of`), for a loss of one's own."""


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


def _evaluate(
    name: str,
    sources: dict[str, Tensor],
    logprobs: Tensor,
    others: tuple[Tensor | None, ...],
    constants: tuple[float, ...] = (),
    bounds: tuple[Threshold, Threshold] | None = None,
) -> LossOutput:
    """One call of formula ``name`` (:data:`cliptrack.adapters.losses.formulas.FORMULAS`) on checked inputs: fused
    where :func:`cliptrack.adapters.losses.fused.wanted` chooses it and only the logprobs require grad, else eager.

    ``others``: the per-token inputs after the logprobs as the caller gave them (autograd
    differentiates them on the eager path; the mask is detached); ``constants``: the formula's
    number parameters after its thresholds; ``bounds``: a clipping loss's thresholds.
    """
    threshold_tensors = () if bounds is None else bounds
    out = None
    if _fused.wanted(logprobs) and not any(
        isinstance(t, Tensor) and t.requires_grad for t in (*others, *threshold_tensors)
    ):
        detached = tuple(None if t is None else t.detach() for t in others)
        out = _fused.evaluate(name, logprobs, detached, constants, bounds)
    if out is None:
        loss, _, *counts = formulas.FORMULAS[name](
            logprobs, *others, *threshold_tensors, *constants, torch.int64, False
        )
        out = (loss, *counts)
    loss, loss_tokens, invalid, *rest = out
    if name in CLIPPING_LOSSES:
        clipped, low, high, *rest = rest
    else:
        clipped = low = high = None
    return LossOutput(
        loss, loss_tokens, clipped, low, high, invalid, (sources,), gauge=rest[0] if rest else None
    )


def _clipping(
    name: str,
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    low: Threshold,
    high: Threshold,
    ratio_outside: tuple[float, float],
) -> LossOutput:
    sources = _checked_sources(logprobs, sampling_logprobs, advantages, mask)
    _check_thresholds(low, high)
    others = (sampling_logprobs, advantages, sources.get("mask"))
    return _evaluate(name, sources, logprobs, others, ratio_outside, (low, high))


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
    The formula: :func:`cliptrack.adapters.losses.formulas.ppo`.
    """
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    return _clipping(
        "ppo", logprobs, sampling_logprobs, advantages, mask, clip_low_threshold, clip_high_threshold, outside
    )


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
    The formula: :func:`cliptrack.adapters.losses.formulas.cispo`.
    """
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    return _clipping(
        "cispo",
        logprobs,
        sampling_logprobs,
        advantages,
        mask,
        clip_low_threshold,
        clip_high_threshold,
        outside,
    )


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
    sources = _checked_sources(logprobs, sampling_logprobs, advantages, mask)
    others = (sampling_logprobs, advantages, sources.get("mask"))
    return _evaluate("importance_sampling", sources, logprobs, others, outside)


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
    sources = _checked_sources(logprobs, sampling_logprobs, advantages, mask)
    others = (sampling_logprobs, advantages, sources.get("mask"))
    return _evaluate("dro", sources, logprobs, others, (0.5 * float(beta), *outside))


def cross_entropy(logprobs: Tensor, weights: Tensor, mask: Tensor | None = None) -> LossOutput:
    """Weighted negative log-likelihood: per token ``-(weights * logprobs)``. Never clips.

    Eligible tokens are ``mask != 0`` when a mask is given, else ``weights != 0``.
    """
    _check_tensor("weights", weights, like=logprobs if isinstance(logprobs, Tensor) else None)
    sources = _checked_sources(logprobs, None, weights, mask, advantages_name="weights")
    return _evaluate("cross_entropy", sources, logprobs, (weights, sources.get("mask")))


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
                f"but returned {'one' if out.has_gauge else 'none'} (LossOutput.gauge, cliptrack.adapters.losses.builtin.gauge_of)"
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
:data:`cliptrack.core.measures.PACKED_FIELDS`.

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
    added part summed, the extremes by max (the merge rules of :mod:`cliptrack.core.measures`). No sync."""
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
    :func:`cliptrack.core.sums.check_gauge`; ``where`` is appended to the name of a bad value. Raises
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
        self.sources = _checked_sources(
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
        clipped: Tensor | None = None,
        low: Tensor | None = None,
        high: Tensor | None = None,
        thresholds_bad: Tensor | None = None,
        gauge: Tensor | None = None,
    ) -> LossOutput:
        """Assemble the output (``gauge``: :func:`gauge_of`, for a loss with sampling log-probs).

        ``propagated``: ``logprobs - sampling_logprobs`` (or the logprobs), read by the non-finite
        check (:func:`cliptrack.adapters.losses.formulas.checks`); ``thresholds_bad``: the count of bad tensor
        threshold entries (:func:`cliptrack.adapters.losses.formulas.bad_thresholds`).
        """
        with torch.no_grad():
            invalid = formulas.checks(loss, propagated, self.mask_bad, thresholds_bad, gauge)
        return LossOutput(loss, self.loss_tokens, clipped, low, high, invalid, (self.sources,), gauge=gauge)


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


def _checked_sources(
    logprobs: Tensor,
    sampling_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor | None,
    *,
    advantages_name: str = "advantages",
) -> dict[str, Tensor]:
    """Check types, shapes and devices now (TypeError / ValueError naming the input); the
    detached inputs by argument name (kept to name bad entries later)."""
    _check_tensor("logprobs", logprobs, floating=True)
    sources = {"logprobs": logprobs.detach()}
    if sampling_logprobs is not None:
        _check_tensor("sampling_logprobs", sampling_logprobs, like=logprobs, floating=True)
        sources["sampling_logprobs"] = sampling_logprobs.detach()
    _check_tensor(advantages_name, advantages, like=logprobs, floating=advantages_name == "advantages")
    sources[advantages_name] = advantages.detach()
    if mask is not None:
        _check_tensor("mask", mask, like=logprobs)
        sources["mask"] = mask.detach()
    return sources


def _check_thresholds(low: Threshold, high: Threshold) -> None:
    """Check Python-number clip thresholds now (tensor ones are counted on device by the formula,
    :func:`cliptrack.adapters.losses.formulas.bad_thresholds`)."""
    for name, value in (("clip_low_threshold", low), ("clip_high_threshold", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float, Tensor)):
            raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")
        if not isinstance(value, Tensor) and (not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} must be a finite ratio bound >= 0, got {value!r}")
    if not isinstance(low, Tensor) and not isinstance(high, Tensor) and low > high:
        raise ValueError(f"clip_low_threshold={low!r} is above clip_high_threshold={high!r}")
