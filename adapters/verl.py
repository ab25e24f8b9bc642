"""verl's own policy losses, counted exactly: cliptrack twins in verl's policy-loss registry.

Importing this module registers, in verl's registry (``verl.trainer.ppo.core_algos``), a twin of
each verl mode it covers (:data:`TWINS`)::

    cliptrack_vanilla   verl's "vanilla": decoupled PPO (clip against the old log-probs), dual clip
                        (clip_ratio_c), rollout-correction weights
    cliptrack_cispo     verl's "cispo"

chosen as verl's own modes are (``actor_rollout_ref.actor.policy_loss.loss_mode=cliptrack_vanilla``).
The registry is per process: under Ray, name the module in ``VERL_USE_EXTERNAL_MODULES=cliptrack.adapters.verl``
so that every worker imports it with verl.

What a twin does, per micro-batch (one call from verl's ``workers/utils/losses.py::ppo_loss``):

- its loss is verl's mode's, computed by verl's own function with the same arguments (the same
  value and autograd graph, so the same gradients, for every ``loss_agg_mode``: verl's function
  passes ``**config.global_batch_info`` to ``agg_loss``), and verl's own metrics are kept, keys and
  values;
- beside it, detached, cliptrack's core loss (:func:`cliptrack.adapters.losses.ppo` /
  :func:`~cliptrack.adapters.losses.cispo`) counts the same micro-batch with verl's rule: ratio
  against the old log-probs, band ``[1 - clip_ratio_low, 1 + clip_ratio_high]``; its sums are added
  to the metrics as 0-dim device tensors under ``cliptrack/<measure>`` (:mod:`cliptrack.core.verl_keys`),
  with the recipe. The twin itself never synchronises with the host; verl's ``ppo_loss`` turns
  every metric into a number (``.item()``), as it does its own ``pg_clipfrac``.

Exact through verl's reduction: verl averages a loss metric over the micro-batches and ranks of a
mini-batch, then over mini-batches. Each sum is written multiplied by the mini-batch's number of
micro-batches over all ranks (``global_batch_size / ppo_micro_batch_size_per_gpu``), so the logged
value is the exact sum per optimizer step (averaged over the step's optimizer steps), and the ratio
of two logged sums is the exact ratio of the step's sums. ``use_dynamic_bsz`` is refused: its
mini-batches have different numbers of micro-batches, known to no loss call, and verl's mean over
mini-batches would then weight them unequally (ValueError at the first call).

The gauge: verl's engine path hands a policy loss the old log-probs and ``rollout_is_weights``,
never the rollout's log-probs. By default the twin logs the drift part (current against old
log-probs: ``drift_*``) and marks the engine part and the gauge against the sampler unavailable
(``cliptrack/engine_gauge`` = 0; their entries are absent, never zero). With
``CLIPTRACK_VERL_ENGINE=weights`` (:data:`ENGINE_ENV`) the user declares the rollout weights plain
token-level ratios ``exp(old - rollout)`` (verl's ``algorithm.rollout_correction``: ``rollout_is=token``,
``rollout_is_threshold`` above ``exp(20)``, no batch normalisation, no rejection sampling); the
twin then recovers the rollout log-probs as ``old - log(w)`` and logs the whole gauge against the
sampler, split into engine and drift (to float rounding of ``log(exp(.))``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from cliptrack.adapters.losses import LossOutput, cispo, ppo
from cliptrack.adapters.shared.merge import ForwardBackwardOutput
from cliptrack.adapters.shared.stack import StackCall
from cliptrack.core import keys, measures, verl_keys
from cliptrack.core.sums import MeasuredSums
from torch import Tensor

__all__ = ["register"]

TWINS: dict[str, str] = {"cliptrack_vanilla": "vanilla", "cliptrack_cispo": "cispo"}
"""cliptrack's mode name -> the verl mode it twins."""
ENGINE_ENV = "CLIPTRACK_VERL_ENGINE"
"""Environment variable: ``weights`` declares ``rollout_is_weights`` plain token-level ratios
``exp(old - rollout)`` (see the module's docstring); unset or ``none``: the drift part only."""
_ENGINE_CHOICES = ("none", "weights")
_LOSSES: dict[str, Callable[..., LossOutput]] = {"vanilla": ppo, "cispo": cispo}


def engine_from_weights() -> bool:
    """Whether :data:`ENGINE_ENV` declares the rollout weights plain (ValueError for a bad value)."""
    value = os.environ.get(ENGINE_ENV, "none").strip().lower() or "none"
    if value not in _ENGINE_CHOICES:
        raise ValueError(f"{ENGINE_ENV}={value!r}: expected one of {_ENGINE_CHOICES}")
    return value == "weights"


def _bounds(config: Any) -> tuple[float, float]:
    """verl's band as absolute ratio bounds: ``1 - clip_ratio_low``, ``1 + clip_ratio_high``
    (each falling back to ``clip_ratio``), computed as verl computes them."""
    low = config.clip_ratio_low if config.clip_ratio_low is not None else config.clip_ratio
    high = config.clip_ratio_high if config.clip_ratio_high is not None else config.clip_ratio
    return 1 - low, 1 + high


def _scale(config: Any) -> int:
    """The mini-batch's number of micro-batches over all data-parallel ranks (1 outside verl's
    engine, where ``global_batch_info`` has no global batch size); ValueError under
    ``use_dynamic_bsz``."""
    if getattr(config, "use_dynamic_bsz", False):
        raise ValueError(
            "cliptrack's verl losses need use_dynamic_bsz=False: with dynamic batch sizes the "
            "mini-batches have different numbers of micro-batches, and verl's mean of the loss "
            "metrics over mini-batches would weight their counts unequally (the clip fraction would "
            "not be the exact ratio of sums); set actor_rollout_ref.actor.use_dynamic_bsz=False"
        )
    info = getattr(config, "global_batch_info", None) or {}
    size = info.get("global_batch_size")
    if size is None:
        return 1
    micro = getattr(config, "ppo_micro_batch_size_per_gpu", None)
    if not micro or int(size) % int(micro):
        raise ValueError(
            f"global_batch_size {size} is not a whole number of micro-batches of "
            f"ppo_micro_batch_size_per_gpu={micro}"
        )
    return int(size) // int(micro)


def _sampler(old_log_prob: Tensor, rollout_is_weights: Tensor | None) -> Tensor | None:
    """The rollout's log-probs recovered from plain token-level weights ``w = exp(old - rollout)``
    when :data:`ENGINE_ENV` declares them so; ``None`` otherwise."""
    if rollout_is_weights is None or not engine_from_weights():
        return None
    return old_log_prob.detach() - torch.log(rollout_is_weights.detach().to(old_log_prob.dtype))


def _count(
    mode: str,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: Any,
    rollout_is_weights: Tensor | None,
    sampler: Tensor | None,
) -> LossOutput:
    """cliptrack's core loss on the micro-batch, detached: decoupled (``clip_reference="old"``: the
    ratio against the old log-probs, as verl clips), verl's band, its dual clip for vanilla, the
    rollout weights as importance weights; the gauge against ``sampler`` (else against the old
    log-probs, of which only the drift part is kept)."""
    low, high = _bounds(config)
    options: dict[str, Any] = {
        "clip_low_threshold": low,
        "clip_high_threshold": high,
        "clip_reference": "old",
        "importance_weights": None if rollout_is_weights is None else rollout_is_weights.detach(),
    }
    if mode == "vanilla":
        options["dual_clip"] = float(config.get("clip_ratio_c", 3.0))
    old = old_log_prob.detach()
    with torch.no_grad():
        return _LOSSES[mode](
            log_prob.detach(),
            old if sampler is None else sampler,
            advantages.detach(),
            response_mask,
            old_logprobs=old,
            **options,
        )


def twin_metrics(
    mode: str, out: LossOutput, config: Any, loss_agg_mode: str, engine: bool
) -> dict[str, Tensor | float]:
    """The entries a twin adds to verl's metrics: each sum of ``out`` (0-dim device tensors, times
    the mini-batch's micro-batches, :func:`_scale`), the recipe, and the engine flag. Without the
    rollout's log-probs (``engine`` false) only the drift part of the gauge is kept."""
    scale = _scale(config)
    metrics: dict[str, Tensor | float] = {}
    for key, value in out.measured.items():
        measure = measures.by_key(key, out.declaration)
        if measure.reduction != measures.SUM:
            continue  # extremes: verl averages every loss metric
        if not engine and (measure.group == measures.GAUGE or key.startswith("engine_")):
            continue
        metrics[verl_keys.entry(measure.name)] = value * scale
    low, high = _bounds(config)
    metrics[verl_keys.entry("clip_low")] = float(low)
    metrics[verl_keys.entry("clip_high")] = float(high)
    if mode == "vanilla":
        metrics[verl_keys.entry("dual_clip")] = float(config.get("clip_ratio_c", 3.0))
    metrics[verl_keys.marker("loss", f"cliptrack_{mode}")] = 1.0
    metrics[verl_keys.marker("aggregation", loss_agg_mode)] = 1.0
    metrics[verl_keys.marker("clip_reference", "old")] = 1.0
    metrics[verl_keys.entry(verl_keys.ENGINE_GAUGE)] = 1.0 if engine else 0.0
    return metrics


def _twin(mode: str, verl_loss: Callable[..., tuple[Tensor, dict[str, Any]]]) -> Callable[..., Any]:
    def loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Any]]:
        if config is None:
            raise ValueError(f"cliptrack_{mode} needs verl's actor config (config=None)")
        _scale(config)  # refuses use_dynamic_bsz before any work
        pg_loss, pg_metrics = verl_loss(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
        )
        sampler = _sampler(old_log_prob, rollout_is_weights)
        out = _count(
            mode, old_log_prob, log_prob, advantages, response_mask, config, rollout_is_weights, sampler
        )
        return pg_loss, {**pg_metrics, **twin_metrics(mode, out, config, loss_agg_mode, sampler is not None)}

    loss.__name__ = loss.__qualname__ = f"cliptrack_{mode}"
    loss.__doc__ = f"verl's {mode!r} policy loss, unchanged, with cliptrack's exact sums in its metrics."
    return loss


_STACK_LOSSES = {"ppo": "cliptrack_vanilla", "cispo": "cliptrack_cispo"}
"""cliptrack's loss name -> the twin a :class:`VerlStack` hook calls."""


@dataclass(frozen=True)
class VerlStack:
    """verl as a :class:`cliptrack.adapters.shared.stack.Stack`: the loss hook is a registered twin
    called as verl's ``ppo_loss`` calls it (per-token ``inputs``: ``old_logprobs``, ``advantages``,
    ``mask``, optional ``rollout_is_weights``; the band, dual clip and batch sizes are verl's
    ``actor_config``'s, so ``config`` must be empty), its report the twin's metrics; the reduction
    verl's own (each entry averaged over the step's calls, ``Metric(MEAN)``), its sums read as ours
    and the means formed once from them; the read-back the step's exact sums (the drift part of the
    gauge left out of them when its engine part was not measured: the group comes whole or not at all)."""

    actor_config: Any
    loss_agg_mode: str = "token-mean"
    name: str = "verl"
    declaration: measures.Declaration = measures.DEFAULT
    """The measures read from the twins' entries (their sums) and the means formed from them."""

    def loss_hook(
        self, loss_fn: str, logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]
    ) -> StackCall:
        if loss_fn not in _STACK_LOSSES:
            raise ValueError(
                f"verl stack: loss {loss_fn!r} has no verl twin; expected one of {sorted(_STACK_LOSSES)}"
            )
        if config:
            raise ValueError(
                f"verl stack: options {sorted(config)} belong in verl's actor config, not the call"
            )
        from verl.trainer.ppo import core_algos

        loss, metrics = core_algos.get_policy_loss_fn(_STACK_LOSSES[loss_fn])(
            inputs["old_logprobs"],
            logprobs,
            inputs["advantages"],
            inputs["mask"],
            self.loss_agg_mode,
            self.actor_config,
            inputs.get("rollout_is_weights"),
        )
        return StackCall(loss, metrics)

    def reduce(self, reports: Sequence[Any]) -> ForwardBackwardOutput:
        if not reports:
            raise ValueError("verl stack: a step needs at least one loss call")
        names = [k for k in reports[0] if k.startswith(verl_keys.PREFIX)]
        means = {k: sum(float(r[k]) for r in reports) / len(reports) for k in names}
        sums = verl_keys.logged_sums(means, verl_keys.PREFIX, self.declaration)
        metrics = dict(sums)
        for mean in self.declaration.means:
            if mean.numerator in sums and sums.get(mean.denominator):
                metrics[mean.key] = sums[mean.numerator] / sums[mean.denominator]
        return ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics=metrics)

    def read_back(self, output: object) -> MeasuredSums | None:
        metrics = dict(getattr(output, "metrics", {}) or {})
        if "engine_log_ratio:sum" not in metrics:
            metrics = {k: v for k, v in metrics.items() if not k.startswith("drift_")}
        return MeasuredSums.from_metrics(metrics, self.declaration)


def register() -> dict[str, Callable[..., Any]]:
    """Register every twin of :data:`TWINS` in verl's policy-loss registry (idempotent); returns
    name -> registered function. ImportError naming the extra when verl is not installed."""
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as error:
        raise ImportError(
            "cliptrack.adapters.verl needs verl: pip install 'cliptrack[verl]' (verl==0.9.1)"
        ) from error
    registered = {}
    for name, mode in TWINS.items():
        function = _twin(mode, core_algos.get_policy_loss_fn(mode))
        registered[name] = core_algos.register_policy_loss(name)(function)
    return registered


def exact_fraction(metrics: Mapping[str, Any], prefix: str = verl_keys.LOGGED_PREFIX) -> float | None:
    """The clip fraction formed once from the logged sums of one step (``None`` without tokens)."""
    sums = verl_keys.logged_sums(metrics, prefix)
    tokens = sums.get(keys.LOSS_TOKENS)
    if not tokens or keys.CLIPPED_TOKENS not in sums:
        return None
    return sums[keys.CLIPPED_TOKENS] / tokens


REGISTERED = register() if importlib.util.find_spec("verl") is not None else {}
"""The twins registered at import (none where verl is not installed: the module then imports, and
:func:`register` names the missing extra)."""
