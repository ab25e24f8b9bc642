"""The registry: every loss the stacks can run, declared once (its Tinker ``loss_fn`` name,
function, whether it clips, its tensor inputs and its options with defaults)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Set
from dataclasses import dataclass
from typing import Any

from cliptrack.adapters.losses.inputs import CLIP_REFERENCES, SAMPLER
from cliptrack.adapters.losses.objectives import (
    CISPO_CLIP_HIGH,
    CISPO_CLIP_LOW,
    PPO_CLIP_HIGH,
    PPO_CLIP_LOW,
    RATIO_OUTSIDE_HIGH,
    RATIO_OUTSIDE_LOW,
    cispo,
    cross_entropy,
    dro,
    importance_sampling,
    ppo,
)
from cliptrack.adapters.losses.output import LossOutput
from cliptrack.core import keys, measures
from torch import Tensor


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
    ``choices``: the words a word-valued option takes (``clip_reference``); empty for a number.
    """

    name: str
    default: Any = REQUIRED
    per_datum: bool = False
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class LossSpec:
    """One loss: its Tinker ``loss_fn`` name, function, whether it clips, inputs and options.

    The function is called as ``fn(logprobs, **tensor_inputs, **options)`` and returns a
    :class:`LossOutput` whose ``measured`` carries the clip counts exactly when ``clips``, the
    low/high split exactly when ``splits`` (only for a loss that clips), and the gauge exactly
    when ``gauge`` (a loss with sampling log-probs: :func:`gauge_of`; its inputs checked with
    :func:`check_inputs`); the group of a measure a declaration was extended with is the loss's own business (a loss of one's own given a declaration other than the default takes it as ``declaration=``).
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


_CLIP_INPUTS = (*_RL_INPUTS, TensorInput("importance_weights", required=False))
"""Inputs of the clipping losses: the RL losses' and the optional per-token importance weights
(rollout correction, TIS) that multiply each token's loss."""


def _thresholds(low: float, high: float, *more: Option) -> tuple[Option, ...]:
    return (
        Option("clip_low_threshold", low, per_datum=True),
        Option("clip_high_threshold", high, per_datum=True),
        Option("clip_reference", SAMPLER, choices=CLIP_REFERENCES),
        *more,
        *GAUGE_OPTIONS,
    )


for _spec in (
    LossSpec(
        "ppo",
        ppo,
        True,
        _CLIP_INPUTS,
        _thresholds(PPO_CLIP_LOW, PPO_CLIP_HIGH, Option("dual_clip", None)),
        splits=True,
        gauge=True,
    ),
    LossSpec(
        "cispo",
        cispo,
        True,
        _CLIP_INPUTS,
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
