"""Tinker's built-in losses over per-token tensors, counting the tokens where clipping bites.

Every loss takes per-token tensors of one shape (1-D packed ``[tokens]`` or ``[batch, seq]``) and
returns a :class:`~cliptrack.adapters.losses.output.LossOutput` whose ``loss`` is the **sum** of
per-token losses over eligible tokens (``mask != 0``), as Tinker's ``loss:sum``. Each loss is
written once in :mod:`cliptrack.adapters.losses.formulas` and run eagerly or fused
(:mod:`cliptrack.adapters.losses.fused`); its inputs are checked by
:mod:`cliptrack.adapters.losses.inputs`.
"""

from __future__ import annotations

import math

import torch
from cliptrack.adapters.losses import formulas
from cliptrack.adapters.losses import fused as _fused
from cliptrack.adapters.losses.inputs import (
    SAMPLER,
    Threshold,
    check_clip_reference,
    check_dual_clip,
    check_ratio_outside,
    check_tensor,
    check_thresholds,
    checked_sources,
)
from cliptrack.adapters.losses.output import LossOutput
from cliptrack.core import measures
from torch import Tensor

PPO_CLIP_LOW = 0.8
"""Tinker's default absolute lower ratio bound for PPO."""


PPO_CLIP_HIGH = 1.2
"""Tinker's default absolute upper ratio bound for PPO."""


CISPO_CLIP_LOW = 0.0
"""Tinker's default absolute lower ratio bound for CISPO."""


CISPO_CLIP_HIGH = 4.0
"""Tinker's default absolute upper ratio bound for CISPO."""


RATIO_OUTSIDE_LOW = measures.RATIO_OUTSIDE_LOW
"""Default lower ratio bound of ``ratio_outside_tokens:sum`` (keyword ``ratio_outside_low``)."""


RATIO_OUTSIDE_HIGH = measures.RATIO_OUTSIDE_HIGH
"""Default upper ratio bound of ``ratio_outside_tokens:sum`` (keyword ``ratio_outside_high``)."""


K3_SERIES_BELOW = formulas.K3_SERIES_BELOW


k3_terms = formulas.k3_terms


gauge_of = formulas.gauge_of
"""The on-policy gauge of one loss call (:func:`cliptrack.adapters.losses.formulas.gauge_of`), for a loss of one's own."""


def _evaluate(
    name: str,
    sources: dict[str, Tensor],
    logprobs: Tensor,
    others: tuple[Tensor | None, ...],
    constants: tuple[float | bool, ...] = (),
    bounds: tuple[Threshold, Threshold] | None = None,
    declaration: measures.Declaration = measures.DEFAULT,
) -> LossOutput:
    """One call of formula ``name`` (:data:`cliptrack.adapters.losses.formulas.FORMULAS`) on checked inputs: fused
    where :func:`cliptrack.adapters.losses.fused.wanted` chooses it and only the logprobs require grad, else eager.

    ``others``: the per-token inputs after the logprobs as the caller gave them (autograd
    differentiates them on the eager path; the mask is detached); ``constants``: the formula's
    parameters after its thresholds (numbers, and a clipping loss's clip reference as a bool);
    ``bounds``: a clipping loss's thresholds; ``declaration``: what it measures (the terms of its
    added measures computed beside the formula's own).
    """
    threshold_tensors = () if bounds is None else bounds
    result = None
    if _fused.wanted(logprobs) and not any(
        isinstance(t, Tensor) and t.requires_grad for t in (*others, *threshold_tensors)
    ):
        detached = tuple(None if t is None else t.detach() for t in others)
        result = _fused.evaluate(name, logprobs, detached, constants, bounds, declaration.terms)
    if result is None:
        result = formulas.FORMULAS[name](
            logprobs, *others, *threshold_tensors, *constants, torch.int64, False, terms=declaration.terms
        )
    return LossOutput(result.loss, result.measured, result.invalid, (sources,), declaration=declaration)


def _clipping(
    name: str,
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    bounds: tuple[Threshold, Threshold],
    constants: tuple[float | bool, ...],
    parts: tuple[Tensor | None, Tensor | None],
    importance_weights: Tensor | None,
    declaration: measures.Declaration,
) -> LossOutput:
    """A clipping loss's call: its inputs checked, then its formula with ``bounds`` (low, high) and
    ``constants`` (the gauge's bounds, the clip reference, the dual clip)."""
    sources, others = _rl_inputs(logprobs, sampling_logprobs, advantages, mask, parts, importance_weights)
    check_thresholds(*bounds)
    others = (*others, sources.get("importance_weights"))
    return _evaluate(name, sources, logprobs, others, constants, bounds, declaration)


def _rl_inputs(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    parts: tuple[Tensor | None, Tensor | None],
    importance_weights: Tensor | None = None,
) -> tuple[dict[str, Tensor], tuple[Tensor | None, ...]]:
    """An RL loss's inputs checked (``parts``: the optional ``old_logprobs`` and ``weight_lag``;
    ``importance_weights``, a clipping loss's): their detached sources, and the per-token inputs of
    its formula after the logprobs: sampling log-probs, advantages, the mask (detached),
    ``old_logprobs`` and ``weight_lag`` (detached; ``None`` when not given)."""
    sources = checked_sources(
        logprobs, sampling_logprobs, advantages, mask, parts=parts, importance_weights=importance_weights
    )
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
    clip_reference: str = SAMPLER,
    dual_clip: float | None = None,
    importance_weights: Tensor | None = None,
    ratio_outside_low: float = RATIO_OUTSIDE_LOW,
    ratio_outside_high: float = RATIO_OUTSIDE_HIGH,
    old_logprobs: Tensor | None = None,
    weight_lag: Tensor | None = None,
    declaration: measures.Declaration = measures.DEFAULT,
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

    ``clip_reference``: ``"sampler"`` (default, Tinker's semantics) or ``"old"``: decoupled PPO
    (verl, TRL, OpenRLHF, AReaL), ``r = exp(logprobs - old_logprobs)``, which needs
    ``old_logprobs``. The clip decision and the clip counts read that ``r``; the gauge always
    measures ``logprobs - sampling_logprobs``. ``dual_clip`` (``c > 1``, verl's ``clip_ratio_c``;
    ``None``: off): for ``A < 0`` the per-token loss is ``min(loss, -A*c)``, and a token is
    dual-clipped where ``-A*c`` is strictly below it (``dual_clipped_tokens:sum``, apart from the
    clip counts, which count clipping by the band whatever the dual clip does, as verl's
    ``pg_clipfrac``). ``importance_weights`` (optional, the shape of ``logprobs``; rollout
    correction, TIS): each token's loss is multiplied by its weight (detached: no gradient flows to
    it); the counts stay token counts. ``declaration``: what the loss measures
    (:class:`cliptrack.core.measures.Declaration`; the default one unless given): the terms of the
    measures it was extended with are computed too, and the output carries it. The formula:
    :func:`cliptrack.adapters.losses.formulas.ppo`.
    """
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    reference_old = check_clip_reference(clip_reference, old_logprobs)
    c = check_dual_clip(dual_clip)
    return _clipping(
        "ppo",
        logprobs,
        sampling_logprobs,
        advantages,
        mask,
        (clip_low_threshold, clip_high_threshold),
        (*outside, reference_old, c),
        (old_logprobs, weight_lag),
        importance_weights,
        declaration,
    )


def cispo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    clip_low_threshold: Threshold = CISPO_CLIP_LOW,
    clip_high_threshold: Threshold = CISPO_CLIP_HIGH,
    clip_reference: str = SAMPLER,
    importance_weights: Tensor | None = None,
    ratio_outside_low: float = RATIO_OUTSIDE_LOW,
    ratio_outside_high: float = RATIO_OUTSIDE_HIGH,
    old_logprobs: Tensor | None = None,
    weight_lag: Tensor | None = None,
    declaration: measures.Declaration = measures.DEFAULT,
) -> LossOutput:
    """CISPO: per token ``-(clamp(r, low, high).detach() * A * logprobs)``.

    A token is clipped where the coefficient departs from the ratio, ``clamp(r) != r``: low side
    ``r < low``, high side ``r > high``, whatever the sign of ``A``. The gauge, ``clip_reference``
    and ``importance_weights`` as in :func:`ppo` (no dual clip). The formula:
    :func:`cliptrack.adapters.losses.formulas.cispo`.
    """
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    reference_old = check_clip_reference(clip_reference, old_logprobs)
    return _clipping(
        "cispo",
        logprobs,
        sampling_logprobs,
        advantages,
        mask,
        (clip_low_threshold, clip_high_threshold),
        (*outside, reference_old),
        (old_logprobs, weight_lag),
        importance_weights,
        declaration,
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
    declaration: measures.Declaration = measures.DEFAULT,
) -> LossOutput:
    """Importance-sampled policy gradient: per token ``-(r * A)``. Never clips; the gauge as in :func:`ppo`."""
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    sources, others = _rl_inputs(logprobs, sampling_logprobs, advantages, mask, (old_logprobs, weight_lag))
    return _evaluate("importance_sampling", sources, logprobs, others, outside, declaration=declaration)


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
    declaration: measures.Declaration = measures.DEFAULT,
) -> LossOutput:
    """DRO: per token ``-(logprobs*A - beta/2 * (logprobs - sampling_logprobs)**2)``. Never clips;
    the gauge as in :func:`ppo` (its ratio ``exp(l)`` formed for the gauge alone)."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    outside = check_ratio_outside(ratio_outside_low, ratio_outside_high)
    sources, others = _rl_inputs(logprobs, sampling_logprobs, advantages, mask, (old_logprobs, weight_lag))
    return _evaluate("dro", sources, logprobs, others, (0.5 * float(beta), *outside), declaration=declaration)


def cross_entropy(
    logprobs: Tensor,
    weights: Tensor,
    mask: Tensor | None = None,
    *,
    declaration: measures.Declaration = measures.DEFAULT,
) -> LossOutput:
    """Weighted negative log-likelihood: per token ``-(weights * logprobs)``. Never clips.

    Eligible tokens are ``mask != 0`` when a mask is given, else ``weights != 0``. ``declaration``
    as in :func:`ppo`.
    """
    check_tensor("weights", weights, like=logprobs if isinstance(logprobs, Tensor) else None)
    sources = checked_sources(logprobs, None, weights, mask, advantages_name="weights")
    return _evaluate(
        "cross_entropy", sources, logprobs, (weights, sources.get("mask")), declaration=declaration
    )
