"""Each built-in loss written once: its loss, token counts, gauge, input checks and gradient.

A *formula* (:data:`FORMULAS`) is a plain tensor function of one loss call's per-token inputs
(1-D or ``[batch, seq]``) and its parameters. Both paths of :mod:`cliptrack.adapters.losses.builtin` run it:

- **eager**: the inputs as the caller gave them, ``gradient=False``; autograd differentiates the
  returned loss, so every input that requires grad gets its gradient as the formula implies;
- **fused** (:mod:`cliptrack.adapters.losses.fused`): traced by ``torch.compile`` with the inputs detached and
  flattened, ``gradient=True``: the same pass also forms the per-token gradient of the loss with
  respect to the logprobs, term by term as autograd forms it from the eager loss (so both paths
  agree to floating-point rounding), and backward only scales it.

The clip decision, the loss, the gauge and the gradient read the same ``ratio``, so the counts
always describe the loss actually computed. Every formula returns a :class:`Result`: ``loss`` the
0-dim sum of per-token losses over eligible tokens (``mask != 0``), ``grad`` (or ``None``),
``invalid`` the int64 vector of :data:`cliptrack.adapters.losses.builtin.INPUT_CHECKS`, and ``measured``:
every measure the loss emits under its metric key (:mod:`cliptrack.core.measures`), 0-dim tensors
on the input's device — counts int64, the gauge's values float64 (:func:`gauge_of`), and the
term (:attr:`cliptrack.core.measures.Measure.term`) of every measure in ``terms`` (a declaration's
:attr:`~cliptrack.core.measures.Declaration.terms`) whose inputs the loss has (:class:`Tokens`). Where eager and compiled code differ in cost, a helper chooses its form with
``torch.compiler.is_compiling()``; the value is the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from cliptrack.core import keys, measures
from torch import Tensor

Threshold = float | Tensor
"""An absolute ratio bound: one number, or a tensor broadcasting to the token shape."""


class Result(NamedTuple):
    """What a formula returns (module docstring): the loss, its per-token gradient with respect to
    the logprobs (``None`` unless asked), the bad-input counts and the measured values by key."""

    loss: Tensor
    grad: Tensor | None
    invalid: Tensor
    measured: dict[str, Tensor]


class Tokens(NamedTuple):
    """The per-token terms of one loss call that a measure's term (:attr:`cliptrack.core.measures.Measure.term`) may read.

    ``logprobs``: the policy's log-probs (detached); ``log_ratio`` / ``ratio``: ``l = logprobs -
    sampling_logprobs`` and ``exp(l)`` as the loss computed them (``None`` for a loss without
    sampling log-probs); ``advantages`` (``None`` for cross entropy); ``eligible``: bool tensor of
    eligible tokens (``None``: every token); ``accumulate``: the integer dtype counts accumulate in
    (pass it to :func:`count`).
    """

    logprobs: Tensor
    log_ratio: Tensor | None
    ratio: Tensor | None
    advantages: Tensor | None
    eligible: Tensor | None
    accumulate: torch.dtype


Term = Callable[[Tokens], "Tensor | None"]
"""A measure's term (:attr:`cliptrack.core.measures.Measure.term`): the 0-dim value of one loss
call from its :class:`Tokens` (a count: :func:`count_eligible` of flags), or ``None`` where the
loss lacks an input it needs (the loss then does not emit the measure)."""

Terms = tuple[measures.Measure, ...]
"""The measures whose terms a formula computes (:attr:`cliptrack.core.measures.Declaration.terms`)."""


def count_eligible(tokens: Tokens, flags: Tensor) -> Tensor:
    """The eligible tokens among ``flags`` (a bool tensor of the token shape), exact, int64 0-dim:
    the usual body of a count's term."""
    if tokens.eligible is not None:
        flags = flags & tokens.eligible
    return count(flags, tokens.accumulate)


def extra_terms(tokens: Tokens, terms: Terms) -> dict[str, Tensor]:
    """The terms of ``terms`` for one loss call (those its inputs allow), by key, as int64 for a
    count and float64 otherwise."""
    out: dict[str, Tensor] = {}
    for measure in terms:
        assert measure.term is not None
        value = measure.term(tokens)
        if value is not None:
            out[measure.key] = value.to(torch.int64 if measure.exact else torch.float64)
    return out


K3_SERIES_BELOW = 0.5
"""``|l|`` below which ``kl_k3`` is the series; from it on ``w - 1 - l`` (no cancellation there)."""


# --- shared pieces --------------------------------------------------------------------------------


def count(flags: Tensor, accumulate: torch.dtype = torch.int64) -> Tensor:
    """The number of true entries, exact, int64 0-dim.

    Eager: ``count_nonzero`` (no integer copy of the flags). Compiled: a sum in ``accumulate``,
    int32 below 2**31 entries (Inductor's CPU code widens every lane to int64 otherwise, which
    costs about 7 % of a fused PPO forward + backward).
    """
    if not torch.compiler.is_compiling():
        return torch.count_nonzero(flags)
    return flags.sum(dtype=accumulate).to(torch.int64)


def clamp(ratio: Tensor, low: Threshold, high: Threshold) -> Tensor:
    """``torch.clamp`` with number or tensor bounds (one call either way; a number beside a tensor
    bound becomes a tensor, as ``torch.clamp`` takes both or neither)."""
    if isinstance(low, Tensor) != isinstance(high, Tensor):
        low, high = (torch.as_tensor(v, dtype=ratio.dtype, device=ratio.device) for v in (low, high))
    return torch.clamp(ratio, low, high)  # type: ignore[arg-type]


def mask_terms(
    mask: Tensor | None, like: Tensor, accumulate: torch.dtype
) -> tuple[Tensor | None, Tensor | float, Tensor, Tensor]:
    """Eligible tokens (``None``: all), the mask as a multiplier in ``like``'s dtype (``1.0``
    without one), the eligible count and the count of mask entries that are neither 0 nor 1."""
    zero = torch.zeros((), dtype=torch.int64, device=like.device)
    if mask is None:
        return None, 1.0, zero + like.numel(), zero
    mask = mask.detach()
    eligible = mask if mask.dtype == torch.bool else mask != 0
    # 0/1 entries equal their own eligibility; any other value (NaN too) differs.
    bad = zero if mask.dtype == torch.bool else count(mask != eligible, accumulate)
    return eligible, mask.to(like.dtype), count(eligible, accumulate), bad


def bad_thresholds(low: object, high: object, device: torch.device) -> Tensor:
    """Entries of tensor clip thresholds that are negative, non-finite or with low > high (int64
    0-dim); 0 for number bounds, which the caller checked on the host."""
    if not isinstance(low, Tensor) and not isinstance(high, Tensor):
        return torch.zeros((), dtype=torch.int64, device=device)
    lo, hi = (v.detach() if isinstance(v, Tensor) else torch.as_tensor(v, device=device) for v in (low, high))
    return ((lo > hi) | (lo < 0) | ~torch.isfinite(lo) | ~torch.isfinite(hi)).sum(dtype=torch.int64)


def checks(
    loss: Tensor,
    propagated: Tensor,
    mask_bad: Tensor,
    thresholds_bad: Tensor | None = None,
    gauge: dict[str, Tensor] | None = None,
) -> Tensor:
    """``LossOutput.invalid``: [non-finite flag, bad mask entries, bad tensor-threshold entries].
    ``gauge``: the measured values by key, when the loss has the gauge (:func:`gauge_of`, and
    :func:`causes_of` / :func:`staleness_of` where given).

    Non-finite inputs show in ``loss`` (advantages, weights, +inf/NaN logprobs) or in the sum of
    ``propagated`` (``logprobs - sampling_logprobs``, where a -inf that the ratio would turn into
    a harmless 0 still shows): one extra reduction. A sum that overflows from finite inputs
    (beyond 3.4e38, or an importance weight beyond float range: the gauge's ``is_weight_sq:sum``)
    is flagged too; so are non-finite ``old_logprobs`` (in the engine and drift sums) and
    ``weight_lag`` (in its sum).
    """
    total = loss.detach() + propagated.detach().sum()
    if gauge is not None:
        total = total + gauge[keys.IS_WEIGHT_SQ_SUM]
        for key in (keys.ENGINE_ABS_LOG_RATIO_SUM, keys.DRIFT_ABS_LOG_RATIO_SUM, keys.WEIGHT_LAG_SUM):
            if key in gauge:
                total = total + gauge[key]
    nonfinite = (~torch.isfinite(total)).to(torch.int64)
    if thresholds_bad is None:
        thresholds_bad = torch.zeros((), dtype=torch.int64, device=loss.device)
    return torch.stack([nonfinite, mask_bad, thresholds_bad])


def _as(grad: Tensor, like: Tensor) -> Tensor:
    """A gradient in ``like``'s dtype, as autograd casts it before passing it on."""
    return grad.to(like.dtype)


# --- the gauge ------------------------------------------------------------------------------------


def k3_terms(log_ratio: Tensor, weight: Tensor | None = None) -> Tensor:
    """Per-token ``exp(l) - 1 - l`` without cancellation, from ``l`` and ``w = exp(l)`` (formed
    here when not given); >= 0.

    Compiled (the fused kernel): for ``|l| < 1/2`` the term is ``l**2 * p(l)``, with ``p`` a
    degree-5 polynomial fitted to ``(exp(l) - 1 - l) / l**2`` (relative error below ``3.3e-8``
    there, a quarter of a float32 ulp, against ``2.4e-9`` for the degree-7 Taylor series it replaced,
    with two multiply-adds fewer per token), by Horner in the dtype of ``l`` (a few ulps of
    rounding), where ``w - 1 - l`` would lose every digit to cancellation: float32 ``w`` near 1
    carries ``6e-8`` absolute, the k3 term of ``l = 1e-4`` is ``5e-9``; from ``1/2`` on ``w - 1 - l``
    (the term is then at least ``0.1``, and positive: no clamp needed). No second ``exp``, and no
    ``expm1``, which Inductor's CPU code writes as ``exp(x) - 1``. The coefficients and the bound
    are literals in this code: a float read from a module global becomes a runtime input of a
    graph compiled with dynamic shapes, loaded and converted once per vector of tokens (it made the
    fused PPO loss with the gauge about 1.6x slower). Eager: ``expm1(l) - l`` in float64 (three
    element-wise ops; ATen's ``expm1`` is exact to an ulp), clamped at 0 against rounding. Both
    agree with the float64 reference to float32 rounding of the term (``tests/test_gauge.py``).
    """
    if not torch.compiler.is_compiling():
        wide = log_ratio.to(torch.float64)
        return torch.expm1(wide).sub_(wide).clamp_min_(0.0)
    x = log_ratio
    # p(l) = 1/2 + l/6 + ... fitted on [-1/2, 1/2] (least squares at Chebyshev nodes, relative,
    # constant term held at 1/2 so that a tiny l gives l**2 / 2 rounded once)
    poly = x * 0.0001981786626856774 + 0.0013975739711895585
    poly = poly * x + 0.008333632722496986
    poly = poly * x + 0.04166598990559578
    poly = poly * x + 0.166666641831398
    poly = poly * x + 0.5
    direct = (torch.exp(x) if weight is None else weight) - 1.0 - x
    return torch.where(x.abs() < 0.5, x * x * poly, direct)  # 0.5: K3_SERIES_BELOW


def gauge_of(
    log_ratio: Tensor,
    ratio: Tensor,
    eligible: Tensor | None,
    low: float = measures.RATIO_OUTSIDE_LOW,
    high: float = measures.RATIO_OUTSIDE_HIGH,
    weight: Tensor | float | None = None,
) -> dict[str, Tensor]:
    """The on-policy gauge of one loss call: its measures (:data:`cliptrack.core.measures.GAUGE_MEASURES`)
    by metric key, float64 0-dim tensors.

    ``log_ratio``: per token ``l = logprobs - sampling_logprobs`` as the loss computed it;
    ``ratio``: ``exp(l)`` as the loss computed it (the ratio its clip decision read);
    ``eligible``: bool tensor of eligible tokens, ``None`` for all; ``low`` / ``high``: the
    ``ratio_outside_tokens`` bounds; ``weight``: the eligibility as a 0/1 multiplier (the loss's
    mask in its dtype; formed from ``eligible`` when not given). Per-token terms are formed in
    float32 or float64 (a bfloat16 or float16 ``l`` is promoted and its ``w = exp(l)`` formed anew
    in float32): ``|l|``, the k3 term (:func:`k3_terms`), ``w`` and ``w**2`` (in float64, so it
    does not overflow before ``w``); sums accumulate in float64. The extremes are those of ``l``
    over eligible tokens (``-inf`` / ``+inf`` over none). Detached, on the input's device, no host
    sync.

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
        on = None
        if eligible is not None:
            on = eligible.to(lr.dtype) if not isinstance(weight, Tensor) else weight.to(lr.dtype)
        if not torch.compiler.is_compiling():
            return _gauge_eager(lr, w, eligible, on, low, high)
        f64 = torch.float64
        accumulate = torch.int32 if lr.numel() < 2**31 else torch.int64
        none = None
        if eligible is None or on is None:
            lm, wm = lr, w
            outside = (w < low) | (w > high)
        else:
            lm = lr * on
            wm = torch.where(eligible, w, 0.0)
            outside = ((w < low) | (w > high)) & eligible
            # the loss's own count of eligible tokens (the same sum, merged by the compiler):
            # cheaper than a max over the mask
            none = count(eligible, accumulate) == 0
        l64 = lm.to(f64)  # one copy, read by the sums of l and |l|
        w64 = wm.to(f64)
        kl = k3_terms(lm, wm)  # ineligible: l = w = 0, term 0
        sums = [
            l64.sum(),
            l64.abs().sum(),
            kl.sum(dtype=f64),
            count(outside, accumulate).to(f64),
            w64.sum(),
            torch.dot(w64.reshape(-1), w64.reshape(-1)),
        ]
        return _named(sums, _extremes(lr, lm, on, none))


_GAUGE_SUMS = tuple(m.key for m in measures.GAUGE_MEASURES if m.reduction == measures.SUM)
_GAUGE_MAX = keys.LOG_RATIO_MAX
_GAUGE_MIN = keys.LOG_RATIO_MIN
assert _GAUGE_SUMS == (
    keys.LOG_RATIO_SUM,
    keys.ABS_LOG_RATIO_SUM,
    keys.KL_K3_SUM,
    keys.RATIO_OUTSIDE_TOKENS,
    keys.IS_WEIGHT_SUM,
    keys.IS_WEIGHT_SQ_SUM,
), "gauge_of computes the gauge's sums in this order"


def _named(sums: list[Tensor], extremes: list[Tensor]) -> dict[str, Tensor]:
    """The gauge by key from its sums (in :data:`_GAUGE_SUMS` order) and ``[max l, -min l]``."""
    top, negated_bottom = extremes
    # the min is -(-min): the packed vector negates it back to the very bits computed here
    return {**dict(zip(_GAUGE_SUMS, sums, strict=True)), _GAUGE_MAX: top, _GAUGE_MIN: -negated_bottom}


def _gauge_eager(
    lr: Tensor, w: Tensor, eligible: Tensor | None, on: Tensor | None, low: float, high: float
) -> dict[str, Tensor]:
    """:func:`gauge_of` as eager ops: the same values in fewer passes over the tokens.

    Each eager op is a pass over memory, so the float64 copy of ``l`` (always a copy, never the
    caller's tensor) is overwritten by ``|l|`` once read, the comparisons combine in place, and
    the extremes are one ``aminmax`` over ``l`` with every ineligible token replaced by the first
    eligible one (found by ``argmax`` of the eligibility bytes and read with ``gather``: no host
    sync).
    """
    f64 = torch.float64
    outside = torch.lt(w, low).logical_or_(torch.gt(w, high))
    if eligible is None or on is None:
        lm, wm = lr, w
    else:
        lm = lr * on
        wm = torch.where(eligible, w, 0.0)
        outside.logical_and_(eligible)
    l64 = lm.to(f64, copy=lm is lr)  # our own copy: it is overwritten by |l| below
    w64 = wm.to(f64)
    w64_flat = w64.reshape(-1)
    log_ratio_sum = l64.sum()
    kl = k3_terms(l64, w64)  # ineligible: l = 0, term 0
    sums = [
        log_ratio_sum,
        l64.abs_().sum(),
        kl.sum(),
        torch.count_nonzero(outside).to(f64),
        w64.sum(),
        torch.dot(w64_flat, w64_flat),
    ]
    if lr.numel() == 0:
        return _named(sums, _extremes(lr, lm, on))
    if eligible is None or on is None:
        low_l, high_l = torch.aminmax(lr)
        extremes = [high_l.to(f64), low_l.neg().to(f64)]
    else:
        flags = eligible.reshape(-1)
        first = flags.view(torch.uint8).argmax().reshape(1)  # the first eligible token (0 when none is)
        filled = torch.where(eligible, lr, lr.reshape(-1).gather(0, first))
        low_l, high_l = torch.aminmax(filled)
        none = ~flags.gather(0, first)[0]
        # high + 0 and 0 - low, as the compiled form's offsets give them (a zero extreme is +0.0)
        extremes = [torch.where(none, -math.inf, v).to(f64) for v in (high_l + 0.0, 0.0 - low_l)]
    return _named(sums, extremes)


def _extremes(lr: Tensor, lm: Tensor, on: Tensor | None, none: Tensor | None = None) -> list[Tensor]:
    """``[max l, -min l]`` over eligible tokens in float64, ``-inf`` over none.

    ``on`` is the eligibility as 0/1 in ``lr``'s dtype and ``lm = lr * on``. An ineligible token
    is pushed to the bottom by the offset ``(on - 1) * max_float`` instead of a ``where``, which
    costs about seven multiplies eager: an eligible token's value is ``l + 0``, exactly ``l``.
    ``none``: whether no token is eligible (bool 0-dim), when the caller has it; else the max of
    ``on`` is 0.
    """
    f64 = torch.float64
    if lr.numel() == 0:
        return [torch.full((), -math.inf, dtype=f64, device=lr.device)] * 2
    if on is None:
        return [lr.amax().to(f64), lr.amin().neg().to(f64)]
    offset = (on - 1) * torch.finfo(lr.dtype).max
    if none is None:
        none = on.amax() == 0  # a float max: cheaper than eligible.any() on CPU
    top, bottom = (lm + offset).amax(), (offset - lm).amax()
    return [torch.where(none, -math.inf, v).to(f64) for v in (top, bottom)]


def causes_of(
    log_ratio: Tensor,
    sampling_logprobs: Tensor,
    old_logprobs: Tensor,
    eligible: Tensor | None,
    weight: Tensor | float | None = None,
) -> dict[str, Tensor]:
    """The gauge split into its causes (:data:`cliptrack.core.measures.CAUSES_MEASURES`) by
    metric key, float64 0-dim tensors.

    Per eligible token, with ``l`` the loss's own ``log_ratio`` (``logprobs - sampling_logprobs``):
    the engine part ``e = old_logprobs - sampling_logprobs`` (the trainer at the sampling weights
    against the sampler) and the drift part ``d = l - e`` (the trained policy against itself at the
    sampling weights; ``logprobs - old_logprobs`` to the rounding of ``l``), both formed in float64,
    so ``e + d == l`` per token (each a difference of two float32 or bfloat16 values, exact in
    float64 while their exponents lie within 29 of each other) and ``log_ratio:sum ==
    engine_log_ratio:sum + drift_log_ratio:sum`` to the float64 rounding of the sums. Their
    ``|.|`` sums and k3 terms (:func:`k3_terms`; compiled: in the dtype of ``l``) accumulate in
    float64. An ineligible token is zeroed by the mask's multiply, as in :func:`gauge_of`.
    Detached, on the input's device, no host sync.
    """
    f64 = torch.float64
    with torch.no_grad():
        e = old_logprobs.detach().to(f64) - sampling_logprobs.detach().to(f64)
        d = log_ratio.detach().to(f64) - e
        if eligible is not None:
            on = (eligible if not isinstance(weight, Tensor) else weight).to(f64)
            e = e * on
            d = d * on
        if torch.compiler.is_compiling():
            narrow = log_ratio.dtype if log_ratio.dtype in (torch.float32, f64) else torch.float32
            kl_e, kl_d = (k3_terms(t.to(narrow)).sum(dtype=f64) for t in (e, d))
        else:
            kl_e, kl_d = (k3_terms(t).sum() for t in (e, d))
        return {
            keys.ENGINE_LOG_RATIO_SUM: e.sum(),
            keys.ENGINE_ABS_LOG_RATIO_SUM: e.abs().sum(),
            keys.ENGINE_KL_K3_SUM: kl_e,
            keys.DRIFT_LOG_RATIO_SUM: d.sum(),
            keys.DRIFT_ABS_LOG_RATIO_SUM: d.abs().sum(),
            keys.DRIFT_KL_K3_SUM: kl_d,
        }


def staleness_of(weight_lag: Tensor, eligible: Tensor | None) -> dict[str, Tensor]:
    """The weight-version lag (:data:`cliptrack.core.measures.STALENESS_MEASURES`) by metric key,
    float64 0-dim tensors: ``weight_lag:sum`` over eligible tokens (versions x tokens) and
    ``weight_lag:max`` (versions; ``-inf`` over no eligible token). A negative or non-finite entry,
    eligible or not, makes the sum NaN (refused by :func:`checks`, named by the loss). Detached, no
    host sync."""
    f64 = torch.float64
    with torch.no_grad():
        lag = weight_lag.detach().to(f64)
        # input validation: a negative or non-finite lag anywhere (an ineligible token too, as the
        # other inputs are checked) makes the sum NaN, which the loss's non-finite check refuses
        screen = torch.where(lag < 0, math.nan, lag).sum() * 0.0
        if eligible is None:
            total = lag.sum()
            top = lag.amax() if lag.numel() else torch.full((), -math.inf, dtype=f64, device=lag.device)
        else:
            total = torch.where(eligible, lag, 0.0).sum()
            top = (
                torch.where(eligible, lag, -math.inf).amax()
                if lag.numel()
                else torch.full((), -math.inf, dtype=f64, device=lag.device)
            )
        return {keys.WEIGHT_LAG_SUM: total + screen, keys.WEIGHT_LAG_MAX: top}


def _gauge_parts(
    log_ratio: Tensor,
    slp: Tensor,
    old: Tensor | None,
    lag: Tensor | None,
    eligible: Tensor | None,
    weight: Tensor | float,
) -> dict[str, Tensor]:
    """:func:`causes_of` and :func:`staleness_of` where their inputs are given (none: empty)."""
    parts: dict[str, Tensor] = {}
    if old is not None:
        parts.update(causes_of(log_ratio, slp, old, eligible, weight))
    if lag is not None:
        parts.update(staleness_of(lag, eligible))
    return parts


# --- the formulas ---------------------------------------------------------------------------------


def ppo(
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor | None,
    old: Tensor | None,
    lag: Tensor | None,
    weights: Tensor | None,
    low: Threshold,
    high: Threshold,
    outside_low: float,
    outside_high: float,
    reference_old: bool,
    dual_clip: float,
    accumulate: torch.dtype,
    gradient: bool,
    terms: Terms = (),
) -> Result:
    """Clipped PPO, per token ``-min(r*A, clamp(r, low, high)*A)``; clipped where clipping bites,
    ``clamp(r)*A < r*A`` (low side exactly when ``A < 0``).

    ``r = exp(lp - slp)`` (the sampler's log-probs as the reference), or ``exp(lp - old)`` with
    ``reference_old`` (the trainer's old log-probs: decoupled PPO); the gauge reads ``lp - slp``
    either way. ``dual_clip`` (``c > 1``; ``0.0``: none): for ``A < 0`` the per-token loss is
    ``min(loss, -A*c)``, dual-clipped where ``-A*c`` is strictly below the loss (counted apart
    from the clip decision, as verl's ``pg_clipfrac_lower``). ``weights`` (detached, or ``None``):
    each token's loss multiplied by its importance weight; the counts stay token counts."""
    log_ratio = lp - slp
    ratio = torch.exp(log_ratio)
    clip_ratio = torch.exp(lp - old) if reference_old and old is not None else ratio
    unclipped = clip_ratio * adv
    clipped = clamp(clip_ratio, low, high) * adv
    eligible, weight, tokens, mask_bad = mask_terms(mask, lp, accumulate)
    objective = torch.minimum(unclipped, clipped)
    bites = clipped < unclipped
    dual = bound = None
    if dual_clip:
        bound = adv * dual_clip
        dual = (adv < 0) & (bound > objective)
        objective = torch.where(adv < 0, torch.maximum(objective, bound), objective)
    per_token = objective if weights is None else objective * weights
    loss = -(per_token * weight).sum()
    grad = None
    if gradient:
        grad = _ppo_grad(lp, adv, weight, weights, clip_ratio, unclipped, clipped, bites, low, high, bound)
    if eligible is not None:
        bites = bites & eligible
    n_clipped = count(bites, accumulate)
    n_low = count(bites & (adv < 0), accumulate)
    gauge = gauge_of(log_ratio, ratio, eligible, outside_low, outside_high, weight)
    gauge.update(_gauge_parts(log_ratio, slp, old, lag, eligible, weight))
    invalid = checks(loss, log_ratio, mask_bad, bad_thresholds(low, high, lp.device), gauge)
    clip = _clip_counts(tokens, n_clipped, n_low)
    if dual is not None:
        clip[keys.DUAL_CLIPPED_TOKENS] = count(dual if eligible is None else dual & eligible, accumulate)
    return Result(
        loss,
        grad,
        invalid,
        _with_terms({**clip, **gauge}, lp, log_ratio, ratio, adv, eligible, accumulate, terms),
    )


def _ppo_grad(
    lp: Tensor,
    adv: Tensor,
    weight: Tensor | float,
    weights: Tensor | None,
    clip_ratio: Tensor,
    unclipped: Tensor,
    clipped: Tensor,
    bites: Tensor,
    low: Threshold,
    high: Threshold,
    bound: Tensor | None,
) -> Tensor:
    """d loss / d logprobs of :func:`ppo` as autograd forms it, ``-weight * weights * share * A * r``.

    torch.minimum gives the smaller side the gradient and a tie half to each side; clamp passes it
    inside [low, high] only. So the share is 0 where clipping bites (r is then outside the band),
    1/2 for a tie outside the band (a rounding tie: the clamped side passes nothing), else 1 (the
    two halves of a tie inside the band add up exactly, as in eager). The dual clip's
    torch.maximum against the constant ``A*c`` (``bound``) passes nothing where the bound is above,
    half on a tie. The shares are 0, 1/2 or 1: their product is exact.
    """
    objective = torch.minimum(unclipped, clipped)
    outside_tie = (unclipped == clipped) & ~((clip_ratio >= low) & (clip_ratio <= high))
    share = torch.where(bites, 0.0, torch.where(outside_tie, 0.5, 1.0))
    if bound is not None:
        dual_share = torch.where(bound > objective, 0.0, torch.where(bound == objective, 0.5, 1.0))
        share = share * torch.where(adv < 0, dual_share, 1.0)
    scale = -weight if weights is None else -weight * weights
    return _as(scale * share * adv, lp) * clip_ratio


def cispo(
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor | None,
    old: Tensor | None,
    lag: Tensor | None,
    weights: Tensor | None,
    low: Threshold,
    high: Threshold,
    outside_low: float,
    outside_high: float,
    reference_old: bool,
    accumulate: torch.dtype,
    gradient: bool,
    terms: Terms = (),
) -> Result:
    """CISPO, per token ``-(clamp(r, low, high).detach() * A * logprobs)``; clipped where the
    coefficient departs from the ratio, ``clamp(r) != r`` (low side ``r < low``). ``r`` as in
    :func:`ppo` (``reference_old``: against the old log-probs); ``weights`` multiply each token's
    coefficient (detached)."""
    log_ratio = (lp - slp).detach()
    ratio = torch.exp(log_ratio)
    clip_ratio = torch.exp((lp - old).detach()) if reference_old and old is not None else ratio
    coefficient = clamp(clip_ratio, low, high)
    eligible, weight, tokens, mask_bad = mask_terms(mask, lp, accumulate)
    scale = coefficient * adv
    if weights is not None:
        scale = scale * weights
    loss = -(scale * lp * weight).sum()
    grad = _as(-weight * scale, lp) if gradient else None
    departs = coefficient != clip_ratio
    if eligible is not None:
        departs = departs & eligible
    n_clipped = count(departs, accumulate)
    n_low = count(departs & (clip_ratio < coefficient), accumulate)
    gauge = gauge_of(log_ratio, ratio, eligible, outside_low, outside_high, weight)
    gauge.update(_gauge_parts(log_ratio, slp, old, lag, eligible, weight))
    invalid = checks(loss, log_ratio, mask_bad, bad_thresholds(low, high, lp.device), gauge)
    clip = _clip_counts(tokens, n_clipped, n_low)
    return Result(
        loss,
        grad,
        invalid,
        _with_terms({**clip, **gauge}, lp, log_ratio, ratio, adv, eligible, accumulate, terms),
    )


CLIP_SIDE_LOSSES = ("ppo", "cispo")
"""The losses whose per-token clip decision :func:`clip_sides` writes out."""


def clip_sides(
    loss: str, lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor | None, low: Threshold, high: Threshold
) -> Tensor:
    """Each token's clip decision of :func:`ppo` or :func:`cispo` (``loss``), as those formulas take
    it from the same ``ratio = exp(lp - slp)`` (``slp``: the log-probs the loss clips against, the
    old ones for ``clip_reference="old"``): int8, the broadcast shape of the inputs, ``-1`` where
    clipping bites below the band (PPO ``A < 0``, CISPO ``r < low``), ``+1`` above it, ``0``
    elsewhere and on tokens that are not eligible (``mask == 0``). Summed, it gives the loss's
    ``clipped_tokens`` (its nonzero entries) and ``clipped_low_tokens`` (its ``-1`` entries). Detached;
    for a paired probe's per-token output (:data:`cliptrack.core.keys.DATUM_CLIP_SIDES`), never
    on the loss's own path."""
    ratio = torch.exp(lp.detach() - slp.detach())
    if loss == "ppo":
        bites = clamp(ratio, low, high) * adv < ratio * adv
        below = adv < 0
    elif loss == "cispo":
        coefficient = clamp(ratio, low, high)
        bites = coefficient != ratio
        below = ratio < coefficient
    else:
        raise ValueError(f"clip sides are written for {CLIP_SIDE_LOSSES}, not for {loss!r}")
    if mask is not None:
        bites = bites & (mask.detach() != 0)
    one = torch.ones((), dtype=torch.int8, device=ratio.device)
    return torch.where(bites, torch.where(below, -one, one), 0 * one)


def importance_sampling(
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor | None,
    old: Tensor | None,
    lag: Tensor | None,
    outside_low: float,
    outside_high: float,
    accumulate: torch.dtype,
    gradient: bool,
    terms: Terms = (),
) -> Result:
    """Importance-sampled policy gradient, per token ``-(r * A)``; never clips."""
    log_ratio = lp - slp
    ratio = torch.exp(log_ratio)
    eligible, weight, tokens, mask_bad = mask_terms(mask, lp, accumulate)
    loss = -(ratio * adv * weight).sum()
    grad = _as(-weight * adv, lp) * ratio if gradient else None
    gauge = gauge_of(log_ratio, ratio, eligible, outside_low, outside_high, weight)
    gauge.update(_gauge_parts(log_ratio, slp, old, lag, eligible, weight))
    invalid = checks(loss, log_ratio, mask_bad, gauge=gauge)
    measured = {keys.LOSS_TOKENS: tokens, **gauge}
    return Result(
        loss, grad, invalid, _with_terms(measured, lp, log_ratio, ratio, adv, eligible, accumulate, terms)
    )


def dro(
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor | None,
    old: Tensor | None,
    lag: Tensor | None,
    half_beta: float,
    outside_low: float,
    outside_high: float,
    accumulate: torch.dtype,
    gradient: bool,
    terms: Terms = (),
) -> Result:
    """DRO, per token ``-(logprobs*A - beta/2 * (logprobs - sampling_logprobs)**2)`` (``half_beta``
    is ``beta / 2``); never clips. Its ratio ``exp(l)`` is formed for the gauge alone."""
    log_ratio = lp - slp
    eligible, weight, tokens, mask_bad = mask_terms(mask, lp, accumulate)
    objective = lp * adv - half_beta * log_ratio**2
    loss = -(objective * weight).sum()
    grad = _as(-weight * adv, lp) + _as(weight * half_beta * (2 * log_ratio), lp) if gradient else None
    ratio = torch.exp(log_ratio.detach())
    gauge = gauge_of(log_ratio, ratio, eligible, outside_low, outside_high, weight)
    gauge.update(_gauge_parts(log_ratio, slp, old, lag, eligible, weight))
    invalid = checks(loss, log_ratio, mask_bad, gauge=gauge)
    measured = {keys.LOSS_TOKENS: tokens, **gauge}
    return Result(
        loss, grad, invalid, _with_terms(measured, lp, log_ratio, ratio, adv, eligible, accumulate, terms)
    )


def cross_entropy(
    lp: Tensor,
    weights: Tensor,
    mask: Tensor | None,
    accumulate: torch.dtype,
    gradient: bool,
    terms: Terms = (),
) -> Result:
    """Weighted negative log-likelihood, per token ``-(weights * logprobs)``; never clips.
    Eligible tokens are ``mask != 0`` with a mask, else ``weights != 0``."""
    weighted = weights * lp
    eligible: Tensor | None
    if mask is None:
        zero = torch.zeros((), dtype=torch.int64, device=lp.device)
        eligible = weights.detach() != 0
        tokens, mask_bad = count(eligible, accumulate), zero
        loss = -weighted.sum()
        grad = _as(-weights, lp) if gradient else None
    else:
        eligible, weight, tokens, mask_bad = mask_terms(mask, lp, accumulate)
        loss = -(weighted * weight).sum()
        grad = _as(-weight * weights, lp) if gradient else None
    measured = _with_terms({keys.LOSS_TOKENS: tokens}, lp, None, None, None, eligible, accumulate, terms)
    return Result(loss, grad, checks(loss, lp, mask_bad), measured)


def _clip_counts(tokens: Tensor, clipped: Tensor, low: Tensor) -> dict[str, Tensor]:
    """``loss_tokens`` and the clip counts of a clipping loss, by key (high side: clipped - low)."""
    return {
        keys.LOSS_TOKENS: tokens,
        keys.CLIPPED_TOKENS: clipped,
        keys.CLIPPED_LOW_TOKENS: low,
        keys.CLIPPED_HIGH_TOKENS: clipped - low,
    }


def _with_terms(
    measured: dict[str, Tensor],
    lp: Tensor,
    log_ratio: Tensor | None,
    ratio: Tensor | None,
    adv: Tensor | None,
    eligible: Tensor | None,
    accumulate: torch.dtype,
    terms: Terms,
) -> dict[str, Tensor]:
    """``measured`` with the terms of ``terms`` for this call added (none: as it is)."""
    if not terms:
        return measured

    def detached(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.detach()

    tokens = Tokens(lp.detach(), detached(log_ratio), detached(ratio), detached(adv), eligible, accumulate)
    return {**measured, **extra_terms(tokens, terms)}


FORMULAS: dict[str, Callable[..., Result]] = {
    "ppo": ppo,
    "cispo": cispo,
    "importance_sampling": importance_sampling,
    "dro": dro,
    "cross_entropy": cross_entropy,
}
"""The formula of each built-in loss of :data:`cliptrack.adapters.losses.builtin.LOSSES`, by the same name."""
