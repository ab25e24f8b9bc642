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
from cliptrack.core.sums import MeasuredSums, as_count, check_sums
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
    "non-finite values (NaN or inf) in logprobs, sampling_logprobs, advantages, weights, old_logprobs or "
    "weight_lag, or a negative weight_lag, in {n} loss call(s)",
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

Sources = tuple[dict[str, Tensor], ...]
"""Detached inputs of each loss call, by argument name, kept to name bad entries precisely."""


@dataclass(frozen=True)
class LossOutput:
    """The loss of one micro-batch (or a sum of several) and everything it measured.

    ``loss``: 0-dim, sum of per-token losses over eligible tokens (differentiable for one call;
    detached in a sum). ``measured``: every measure the loss emits under its metric key
    (:mod:`cliptrack.core.measures`: ``loss_tokens:sum`` always, the clip counts for a loss that
    clips, the low/high split when it reports it, the on-policy gauge for a loss with sampling
    log-probs, registered measures), detached 0-dim tensors on the loss's device: counts int64 in
    tokens, the gauge float64 (``log_ratio:max`` / ``:min``: ``-inf`` / ``+inf`` over no eligible
    token). ``invalid``: int64 vector, the number of bad entries per input of
    :data:`INPUT_CHECKS`. Moved to the host through one packing (:func:`pack`, :data:`PACKED_FIELDS`).
    """

    loss: Tensor
    measured: Mapping[str, Tensor]
    invalid: Tensor
    sources: Sources = ()
    calls: int = 1
    """Number of loss calls summed in this output."""

    @property
    def loss_tokens(self) -> Tensor:
        """Eligible tokens (``mask != 0``), int64 0-dim."""
        return self.measured[keys.LOSS_TOKENS]

    def get(self, key: str) -> Tensor | None:
        """The measured value of ``key`` (a metric key), ``None`` when this loss does not emit it."""
        return self.measured.get(key)

    def has(self, group: str) -> bool:
        """Whether this output carries the measures of ``group`` (:mod:`cliptrack.core.measures`)."""
        return any(m.key in self.measured for m in measures.group_measures(group))

    @property
    def clips(self) -> bool:
        """Whether this loss clips (and so carries clip counts)."""
        return self.has(measures.CLIP)

    @property
    def has_gauge(self) -> bool:
        """Whether this loss measures the on-policy gauge (it has sampling log-probs)."""
        return self.has(measures.GAUGE)

    def metric_tensors(self) -> dict[str, Tensor]:
        """Every measured value under its metric key, as 0-dim device tensors (no sync):
        ``loss:sum`` and :attr:`measured`."""
        return {keys.LOSS_SUM: self.loss.detach(), **self.measured}

    def __add__(self, other: LossOutput) -> LossOutput:
        """Sum two outputs on device (no host sync); the summed ``loss`` is detached. A measure
        combines by its reduction; a group carried by one side only is refused
        (:func:`cliptrack.core.measures.mixed_groups_error`) or, when declared
        ``dropped_when_mixed`` (the split), dropped."""
        if not isinstance(other, LossOutput):
            return NotImplemented
        declaration = measures.declared()
        out: dict[str, Tensor] = {}
        for group in declaration.groups:
            mine, theirs = self.has(group.name), other.has(group.name)
            if mine != theirs and not group.dropped_when_mixed:
                raise measures.mixed_groups_error(group.name, mine, theirs, "this LossOutput")
            if not (mine and theirs):
                continue
            for measure in declaration.members[group.name]:
                a, b = self.measured.get(measure.key), other.measured.get(measure.key)
                if a is None or b is None:
                    continue
                if measure.reduction == measures.SUM:
                    out[measure.key] = a + b
                elif measure.reduction == measures.MAX:
                    out[measure.key] = torch.maximum(a, b)
                else:
                    out[measure.key] = torch.minimum(a, b)
        return LossOutput(
            loss=self.loss.detach() + other.loss.detach(),
            measured=out,
            invalid=self.invalid + other.invalid,
            sources=self.sources + other.sources,
            calls=self.calls + other.calls,
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

    def clip_counts(self) -> MeasuredSums | None:
        """Exact host-side clip counts (``loss_tokens`` and the clip groups; synchronises once);
        ``None`` when the loss never clips."""
        counts = self.token_counts()
        if not counts.clips:
            return None
        clip = (measures.EVERY, measures.CLIP, measures.SPLIT)
        return counts.without(*(g for g in measures.GROUPS if g not in clip))


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
    result = None
    if _fused.wanted(logprobs) and not any(
        isinstance(t, Tensor) and t.requires_grad for t in (*others, *threshold_tensors)
    ):
        detached = tuple(None if t is None else t.detach() for t in others)
        result = _fused.evaluate(name, logprobs, detached, constants, bounds)
    if result is None:
        result = formulas.FORMULAS[name](
            logprobs, *others, *threshold_tensors, *constants, torch.int64, False
        )
    return LossOutput(result.loss, result.measured, result.invalid, (sources,))


def _clipping(
    name: str,
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    low: Threshold,
    high: Threshold,
    ratio_outside: tuple[float, float],
    parts: tuple[Tensor | None, Tensor | None],
) -> LossOutput:
    sources, others = _rl_inputs(logprobs, sampling_logprobs, advantages, mask, parts)
    _check_thresholds(low, high)
    return _evaluate(name, sources, logprobs, others, ratio_outside, (low, high))


def _rl_inputs(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    parts: tuple[Tensor | None, Tensor | None],
) -> tuple[dict[str, Tensor], tuple[Tensor | None, ...]]:
    """An RL loss's inputs checked (``parts``: the optional ``old_logprobs`` and ``weight_lag``):
    their detached sources, and the per-token inputs of its formula after the logprobs: sampling
    log-probs, advantages, the mask (detached), ``old_logprobs`` and ``weight_lag`` (detached;
    ``None`` when not given)."""
    sources = _checked_sources(logprobs, sampling_logprobs, advantages, mask, parts=parts)
    others = (
        sampling_logprobs,
        advantages,
        sources.get("mask"),
        sources.get("old_logprobs"),
        sources.get("weight_lag"),
    )
    return sources, others


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
    old_logprobs: Tensor | None = None,
    weight_lag: Tensor | None = None,
) -> LossOutput:
    """Clipped PPO: per token ``-min(r*A, clamp(r, low, high)*A)``, ``r = exp(logprobs - sampling_logprobs)``.

    A token is clipped where clipping bites, ``clamp(r)*A < r*A``: low side ``A < 0, r < low``,
    high side ``A > 0, r > high``. Thresholds are absolute ratio bounds (floats, or tensors that
    broadcast to the token shape for per-datum thresholds). ``ratio_outside_low`` /
    ``ratio_outside_high``: the bounds of the gauge's ``ratio_outside_tokens:sum`` (:func:`gauge_of`).
    ``old_logprobs`` (optional, the shape of ``logprobs``): the trainer's own log-probs at the
    weights that sampled (what PPO implementations recompute as "old" log-probs); with it the gauge
    is also split into its engine and drift parts (:func:`cliptrack.adapters.losses.formulas.causes_of`).
    ``weight_lag`` (optional, the shape of ``logprobs``): each token's weight-version lag (training
    version minus the version that sampled its datum), summed as ``weight_lag:sum``.
    The formula: :func:`cliptrack.adapters.losses.formulas.ppo`.
    """
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    return _clipping(
        "ppo",
        logprobs,
        sampling_logprobs,
        advantages,
        mask,
        clip_low_threshold,
        clip_high_threshold,
        outside,
        (old_logprobs, weight_lag),
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
    old_logprobs: Tensor | None = None,
    weight_lag: Tensor | None = None,
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
        (old_logprobs, weight_lag),
    )


def importance_sampling(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    ratio_outside_low: float = RATIO_OUTSIDE_LOW,
    ratio_outside_high: float = RATIO_OUTSIDE_HIGH,
    old_logprobs: Tensor | None = None,
    weight_lag: Tensor | None = None,
) -> LossOutput:
    """Importance-sampled policy gradient: per token ``-(r * A)``. Never clips; the gauge as in :func:`ppo`."""
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    sources, others = _rl_inputs(logprobs, sampling_logprobs, advantages, mask, (old_logprobs, weight_lag))
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
    old_logprobs: Tensor | None = None,
    weight_lag: Tensor | None = None,
) -> LossOutput:
    """DRO: per token ``-(logprobs*A - beta/2 * (logprobs - sampling_logprobs)**2)``. Never clips;
    the gauge as in :func:`ppo` (its ratio ``exp(l)`` formed for the gauge alone)."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    sources, others = _rl_inputs(logprobs, sampling_logprobs, advantages, mask, (old_logprobs, weight_lag))
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
    runtime, first present wins (default: ``(name,)``). ``per_datum``: a datum may give one value
    for all its tokens (the Miles runtime repeats it over the datum's tokens). ``exact``: the Miles
    runtime reads it in float64, not in the log-probs' dtype (a number of versions, which bfloat16
    would round above 256).
    """

    name: str
    required: bool = True
    datum_fields: tuple[str, ...] = ()
    per_datum: bool = False
    exact: bool = False

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
    :class:`LossOutput` whose ``measured`` carries the clip counts exactly when ``clips``, the
    low/high split exactly when ``splits`` (only for a loss that clips), and the gauge exactly
    when ``gauge`` (a loss with sampling log-probs: :func:`gauge_of`; its inputs checked with
    :func:`check_inputs`); a registered measure's group is the loss's own business.
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
        if keys.LOSS_TOKENS not in out.measured:
            raise TypeError(f"loss {self.name} returned no {keys.LOSS_TOKENS!r} in LossOutput.measured")
        split = out.has(measures.SPLIT)
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
                f"but returned {'one' if out.has_gauge else 'none'} (LossOutput.measured, cliptrack.adapters.losses.builtin.gauge_of)"
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
    TensorInput("old_logprobs", required=False),
    TensorInput("weight_lag", required=False, per_datum=True, exact=True),
)
"""Inputs of the RL losses; on the Miles runtime the sampler's log-probs arrive as ``logprobs``
and the eligible tokens as ``mask`` (else ``weights``). ``old_logprobs`` (the trainer's log-probs
at the sampling weights) and ``weight_lag`` (each token's weight-version lag; on the Miles runtime
one number per datum will do) are optional: with them the gauge is split into engine and drift,
and the lag summed."""


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

PACKED_DTYPE = torch.float64
"""The one dtype of a packed vector: every count stays exact below 2**53 tokens (checked on the
host by :func:`unpack`), so a step's vectors combine on device and cross ranks in one collective.

The layout is :data:`cliptrack.core.measures.PACKED_FIELDS` (read live, a registered measure
included): ``loss:sum`` and every sum measure (0 where absent), the call counters, the bad-input
counts of :data:`INPUT_CHECKS`, all added; then the extremes (``log_ratio:max``,
``-log_ratio:min``; ``-inf`` where absent or over no token), combined by max (:func:`combine_packed`).
"""


def __getattr__(name: str) -> object:
    if name == "PACKED_FIELDS":  # live: the declaration in force
        return measures.declared().packed_fields
    if name == "PACKED_ADDED":
        return len(measures.declared().packed_added)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PACKED_FIELDS: tuple[str, ...]
"""Layout of a packed :class:`LossOutput` (:data:`cliptrack.core.measures.PACKED_FIELDS`, live)."""
PACKED_ADDED: int
"""Number of leading packed fields that add; the rest combine by max (live)."""


@functools.lru_cache(maxsize=256)
def _constants(
    device: torch.device, calls: int, groups: tuple[bool, ...], version: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The call counters ``[calls, per-group calls...]``, a 0 and a ``-inf`` on ``device``, made
    once per combination (fills, never a host-to-device copy); only ever read. ``version``: the
    declaration's (a registration changes the counters)."""
    values = (float(calls), *(float(calls if present else 0) for present in groups))
    counters = torch.empty(len(values), dtype=PACKED_DTYPE, device=device)
    for i, value in enumerate(values):
        counters[i].fill_(value)
    zero = torch.zeros((), dtype=PACKED_DTYPE, device=device)
    return counters, zero, torch.full((), -math.inf, dtype=PACKED_DTYPE, device=device)


def present_groups(measured: Mapping[str, object]) -> tuple[str, ...]:
    """The optional groups ``measured`` carries whole (every sum of the group present, and the
    group it refines too), in declaration order."""
    declaration = measures.declared()
    present: list[str] = []
    for group in declaration.groups:
        if not group.optional:
            continue
        sums = [m.key for m in declaration.members[group.name] if m.reduction == measures.SUM]
        if sums and all(k in measured for k in sums) and (group.within is None or group.within in present):
            present.append(group.name)
    return tuple(present)


def pack_rows(loss: Tensor, measured: Mapping[str, Tensor], invalid: Tensor, calls: int = 1) -> Tensor:
    """``[n, len(PACKED_FIELDS)]`` rows of ``n`` loss outputs of one layout, each field given for
    all of them at once: ``loss`` ``[n]``, ``measured`` metric key -> ``[n]`` (a key absent: the
    measure is absent in every output; only groups carried whole are packed), ``invalid``
    ``[n, len(INPUT_CHECKS)]``; ``calls`` per row. A few stacked ops whatever ``n``, on ``loss``'s
    device. No sync."""
    declaration = measures.declared()
    device = loss.device
    n = loss.shape[0]
    groups = present_groups(measured)
    optional = declaration.optional_groups
    counters, zero, minus_inf = _constants(
        device, calls, tuple(g in groups for g in optional), declaration.version
    )
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


def pack(out: LossOutput) -> Tensor:
    """``out`` as one :data:`PACKED_FIELDS` vector on its device (no host sync)."""
    measured = {key: value.detach().reshape(1) for key, value in out.measured.items()}
    return pack_rows(out.loss.detach().reshape(1), measured, out.invalid.detach().reshape(1, -1), out.calls)[
        0
    ]


def combine_packed(rows: Tensor) -> Tensor:
    """Combine packed vectors (the rows of ``rows``, ``[n, len(PACKED_FIELDS)]``) into one: the
    added part summed, the extremes by max (the merge rules of :mod:`cliptrack.core.measures`). No sync."""
    declaration = measures.declared()
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


def _carried_groups(values: Sequence[float], slot: Mapping[str, int], calls: int) -> set[str]:
    """The groups every call of a packed vector carried (by their call counters); ValueError for
    a group that refuses mixing carried by some calls only."""
    present = {measures.EVERY}
    for group in measures.declared().groups:
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


def unpack(values: Sequence[float], where: str = "") -> PackedSums:
    """Read a :data:`PACKED_FIELDS` vector brought to the host (one combination of packed outputs).

    Counts are checked whole, non-negative and exact (below 2**53), every value as
    :func:`cliptrack.core.sums.check_sums` checks it; ``where`` is appended to the name of a bad
    value. Raises ValueError when the combination mixes calls with and without a group that
    refuses mixing (a clipping and a non-clipping loss, losses with and without the gauge). A group
    ``dropped_when_mixed`` (the split) is kept only when every call carried it. Bad inputs are
    left in ``invalid`` (see :meth:`PackedSums.check`); with any, a group with float values is not
    read (its values are then not meaningful).
    """
    declaration = measures.declared()
    fields = declaration.packed_fields
    if len(values) != len(fields):
        raise ValueError(f"expected {len(fields)} packed values ({fields}), got {len(values)}")
    slot = declaration.slot
    invalid = [int(values[slot[f"invalid[{i}]"]]) for i in range(measures.INVALID_SLOTS)]
    calls = int(values[slot["calls"]])
    present = _carried_groups(values, slot, calls)
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
        float(values[slot[keys.LOSS_SUM]]), MeasuredSums(check_sums(sums, suffix)), calls, invalid
    )


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
        measured: Mapping[str, Tensor] | None = None,
        thresholds_bad: Tensor | None = None,
    ) -> LossOutput:
        """Assemble the output: ``measured``, the loss's measures by metric key (the clip counts
        ``clipped_tokens:sum`` and the split for a loss that clips; ``**gauge_of(...)`` for a loss
        with sampling log-probs), 0-dim tensors; ``loss_tokens:sum`` is the batch's own.

        ``propagated``: ``logprobs - sampling_logprobs`` (or the logprobs), read by the non-finite
        check (:func:`cliptrack.adapters.losses.formulas.checks`); ``thresholds_bad``: the count of bad tensor
        threshold entries (:func:`cliptrack.adapters.losses.formulas.bad_thresholds`).
        """
        values = {keys.LOSS_TOKENS: self.loss_tokens, **(measured or {})}
        gauge = values if keys.IS_WEIGHT_SQ_SUM in values else None
        with torch.no_grad():
            invalid = formulas.checks(loss, propagated, self.mask_bad, thresholds_bad, gauge)
        return LossOutput(loss, values, invalid, (self.sources,))


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
    parts: tuple[Tensor | None, Tensor | None] = (None, None),
) -> dict[str, Tensor]:
    """Check types, shapes and devices now (TypeError / ValueError naming the input); the
    detached inputs by argument name (kept to name bad entries later). ``parts``: the optional
    ``old_logprobs`` and ``weight_lag``."""
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
    old_logprobs, weight_lag = parts
    if old_logprobs is not None:
        _check_tensor("old_logprobs", old_logprobs, like=logprobs, floating=True)
        sources["old_logprobs"] = old_logprobs.detach()
    if weight_lag is not None:
        _check_tensor("weight_lag", weight_lag, like=logprobs)
        if weight_lag.dtype == torch.bool:
            raise TypeError("weight_lag must hold numbers (versions), got dtype torch.bool")
        sources["weight_lag"] = weight_lag.detach()
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
