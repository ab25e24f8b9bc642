"""The losses of :mod:`adapters.losses` as one compiled computation per call: loss, counts, checks.

Each loss is written once more here as a plain tensor function (a *kernel*) that computes the loss,
its token counts and the on-device input checks from the same intermediate values, and is handed
to ``torch.compile`` with dynamic shapes: Inductor fuses the element-wise work and the reductions
into one pass over the tokens. The same pass writes the per-token gradient of the loss with
respect to the logprobs, formed term by term as eager autograd forms it, and the backward only
scales it (an ``autograd.Function``): measured faster forward + backward than letting AOTAutograd
derive and compile a backward that reads the inputs again (``benchmarks/loss_overhead.py``), and
nothing is compiled at ``loss.backward()`` time. The clip decision, the objective and the gradient
read the same ratio inside that pass, so the counts always describe the loss actually computed.
Gradients flow to the logprobs only: a call whose other inputs require grad runs eagerly.

Selection (read on every call): the environment variable ``CLIPTRACK_FUSED`` set to ``1`` forces
the fused path, ``0`` the eager one; unset (or empty), the fused path is taken where
``torch.compile`` can work on the input's device (a C++ compiler for CPU, Triton for CUDA) and the
call has at least :data:`AUTO_MIN_TOKENS` tokens. Calls with fewer than 2 tokens, calls made while
an enclosing ``torch.compile`` traces the caller, and calls with a non-tensor input always run
eagerly (the eager path then names the bad input). A compile (or compiled-run) failure gives one
``RuntimeWarning`` and every later call runs eagerly: training never stops for it.

The contract is that of :mod:`adapters.losses`: the same :class:`~adapters.losses.LossOutput`,
detached int64 0-dim counts on the input's device, no host synchronisation, the same input checks
and error messages, the loss and gradients equal to the eager objective up to floating-point
rounding (each intermediate is rounded to its dtype as in eager; the generated code may still
order a product or a sum differently, or compute ``exp`` to a different last bit, so a token whose
ratio lies within a few ulps of a bound may fall on the other side than in eager; its count then
follows the fused loss's own branch, forward and backward alike).
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from adapters import losses
from tracking import measures

ENV_VAR = "CLIPTRACK_FUSED"
"""``1``: always the fused path; ``0``: always eager; unset: the automatic choice."""

AUTO_MIN_TOKENS = 65_536
"""Tokens per call from which the automatic choice compiles (see README, "The losses").

Per call the fused path is faster at every size measured (one CPU thread, PPO forward + backward,
``benchmarks/loss_overhead.py``: about 0.61x eager at 256 tokens, 0.53x at 4,096, 0.27x at 65,536),
but each new compiled graph costs seconds once per process; from 64k tokens per call a saving of
about 1 ms per call repays that within a few thousand calls, below it rarely within a run.
"""

compiled_calls: Counter[str] = Counter()
"""Calls served by the fused path in this process, by loss name (for tests and diagnostics)."""

_failure: str | None = None
_compiled: dict[tuple[str, tuple[Any, ...]], Callable[..., Any]] = {}
_toolchain: dict[str, bool] = {}


# --- selection ---------------------------------------------------------------------------------


def setting() -> str:
    """The value of ``CLIPTRACK_FUSED``: ``"1"``, ``"0"`` or ``""`` (automatic)."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(
            f"{ENV_VAR} must be 1 (fused losses), 0 (eager losses) or unset (automatic), got {value!r}"
        )
    return value


def wanted(logprobs: object) -> bool:
    """Whether a loss call on ``logprobs`` takes the fused path (cheap; no device work)."""
    choice = setting()
    if choice == "0" or _failure is not None or not isinstance(logprobs, Tensor):
        return False
    if logprobs.numel() < 2 or torch.compiler.is_compiling():
        return False
    if choice == "1":
        return True
    return logprobs.numel() >= AUTO_MIN_TOKENS and compile_available(logprobs.device)


def compile_available(device: torch.device) -> bool:
    """Whether ``torch.compile`` has a code generator for ``device`` here (cached per device type)."""
    kind = device.type
    if kind not in _toolchain:
        ok = False
        try:
            import torch._dynamo

            if torch._dynamo.is_dynamo_supported():
                if kind == "cpu":
                    ok = any(shutil.which(c) for c in (os.environ.get("CXX") or "g++", "c++", "clang++"))
                elif kind == "cuda":
                    from torch.utils._triton import has_triton

                    ok = has_triton()
        except Exception:  # noqa: BLE001 - an incomplete install may raise anything; the eager path is always there
            ok = False
        _toolchain[kind] = ok
    return _toolchain[kind]


def failure() -> str | None:
    """Why the fused path was switched off in this process, or ``None``."""
    return _failure


# --- kernels: traced by torch.compile; every input is a tensor (or None for an absent mask) -----


def _count(flags: Tensor, accumulate: torch.dtype) -> Tensor:
    """The number of true entries, exact, as an int64 0-dim tensor.

    ``accumulate`` is int32 below 2**31 tokens per call: Inductor's CPU code widens every lane to
    int64 otherwise, which costs about 7 % of a fused PPO forward + backward.
    """
    return flags.sum(dtype=accumulate).to(torch.int64)


def _mask_terms(
    mask: Tensor | None, like: Tensor, accumulate: torch.dtype
) -> tuple[Tensor | None, Tensor | float, Tensor, Tensor]:
    """Eligible tokens (``None``: all), the mask as a multiplier, eligible count, bad-mask count."""
    zero = torch.zeros((), dtype=torch.int64, device=like.device)
    if mask is None:
        return None, 1.0, zero + like.numel(), zero
    eligible = mask if mask.dtype == torch.bool else mask != 0
    # 0/1 entries equal their own eligibility; any other value (NaN too) differs.
    bad = zero if mask.dtype == torch.bool else _count(mask != eligible, accumulate)
    return eligible, mask.to(like.dtype), _count(eligible, accumulate), bad


def _checks(
    loss: Tensor,
    propagated: Tensor,
    mask_bad: Tensor,
    low: object = None,
    high: object = None,
    gauge: Tensor | None = None,
) -> Tensor:
    """``LossOutput.invalid``: non-finite flag, bad mask entries, bad tensor-threshold entries
    (the gauge's ``is_weight_sq:sum`` in the non-finite flag, as in the eager path)."""
    total = loss + propagated.sum()
    if gauge is not None:
        total = total + gauge[losses._WEIGHT_SQ]
    nonfinite = (~torch.isfinite(total)).to(torch.int64)
    if isinstance(low, Tensor) and isinstance(high, Tensor):
        thresholds_bad = ((low > high) | (low < 0) | ~torch.isfinite(low) | ~torch.isfinite(high)).sum(
            dtype=torch.int64
        )
    else:  # numbers, checked on the host before the call
        thresholds_bad = torch.zeros((), dtype=torch.int64, device=loss.device)
    return torch.stack([nonfinite, mask_bad, thresholds_bad])


def _as(grad: Tensor, like: Tensor) -> Tensor:
    """A gradient in ``like``'s dtype, as autograd casts it before passing it on."""
    return grad.to(like.dtype)


def _ppo_kernel(
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor | None,
    low: losses.Threshold,
    high: losses.Threshold,
    outside_low: float,
    outside_high: float,
    accumulate: torch.dtype,
) -> tuple:
    log_ratio = lp - slp
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = losses._clamp(ratio, low, high) * adv
    eligible, weight, tokens, mask_bad = _mask_terms(mask, lp, accumulate)
    loss = -(torch.minimum(unclipped, clipped) * weight).sum()
    # d loss / d logprobs as eager autograd forms it, -weight * share * A * r: torch.minimum gives
    # the smaller side the gradient and a tie half to each side; clamp passes it inside [low, high]
    # only. So the share is 0 where clipping bites (r is then outside the band), 1/2 for a tie
    # outside the band (a rounding tie: clamped side passes nothing), else 1 (the two halves of a
    # tie inside the band add up exactly, as in eager).
    bites = clipped < unclipped
    outside_tie = (unclipped == clipped) & ~((ratio >= low) & (ratio <= high))
    share = torch.where(bites, 0.0, torch.where(outside_tie, 0.5, 1.0))
    grad = _as(-weight * share * adv, lp) * ratio
    if eligible is not None:
        bites = bites & eligible
    n_clipped = _count(bites, accumulate)
    n_low = _count(bites & (adv < 0), accumulate)  # clipping bites on the low side exactly when A < 0
    gauge = losses.gauge_of(log_ratio, ratio, eligible, outside_low, outside_high, weight)
    invalid = _checks(loss, log_ratio, mask_bad, low, high, gauge)
    return loss, grad, tokens, invalid, n_clipped, n_low, n_clipped - n_low, gauge


def _cispo_kernel(
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor | None,
    low: losses.Threshold,
    high: losses.Threshold,
    outside_low: float,
    outside_high: float,
    accumulate: torch.dtype,
) -> tuple:
    log_ratio = lp - slp
    ratio = torch.exp(log_ratio)
    coefficient = losses._clamp(ratio, low, high)
    eligible, weight, tokens, mask_bad = _mask_terms(mask, lp, accumulate)
    scale = coefficient * adv
    loss = -(scale * lp * weight).sum()
    grad = _as(-weight * scale, lp)
    departs = coefficient != ratio
    if eligible is not None:
        departs = departs & eligible
    n_clipped = _count(departs, accumulate)
    n_low = _count(departs & (ratio < coefficient), accumulate)
    gauge = losses.gauge_of(log_ratio, ratio, eligible, outside_low, outside_high, weight)
    invalid = _checks(loss, log_ratio, mask_bad, low, high, gauge)
    return loss, grad, tokens, invalid, n_clipped, n_low, n_clipped - n_low, gauge


def _importance_sampling_kernel(
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor | None,
    outside_low: float,
    outside_high: float,
    accumulate: torch.dtype,
) -> tuple:
    log_ratio = lp - slp
    ratio = torch.exp(log_ratio)
    eligible, weight, tokens, mask_bad = _mask_terms(mask, lp, accumulate)
    loss = -(ratio * adv * weight).sum()
    grad = _as(-weight * adv, lp) * ratio
    gauge = losses.gauge_of(log_ratio, ratio, eligible, outside_low, outside_high, weight)
    return loss, grad, tokens, _checks(loss, log_ratio, mask_bad, gauge=gauge), gauge


def _dro_kernel(
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor | None,
    half_beta: float,
    outside_low: float,
    outside_high: float,
    accumulate: torch.dtype,
) -> tuple:
    log_ratio = lp - slp
    eligible, weight, tokens, mask_bad = _mask_terms(mask, lp, accumulate)
    objective = lp * adv - half_beta * log_ratio**2
    loss = -(objective * weight).sum()
    grad = _as(-weight * adv, lp) + _as(weight * half_beta * (2 * log_ratio), lp)
    gauge = losses.gauge_of(log_ratio, torch.exp(log_ratio), eligible, outside_low, outside_high, weight)
    return loss, grad, tokens, _checks(loss, log_ratio, mask_bad, gauge=gauge), gauge


def _cross_entropy_kernel(lp: Tensor, weights: Tensor, mask: Tensor | None, accumulate: torch.dtype) -> tuple:
    weighted = weights * lp
    if mask is None:
        zero = torch.zeros((), dtype=torch.int64, device=lp.device)
        tokens, mask_bad = _count(weights != 0, accumulate), zero
        loss = -weighted.sum()
        grad = _as(-weights, lp)
    else:
        _, weight, tokens, mask_bad = _mask_terms(mask, lp, accumulate)
        loss = -(weighted * weight).sum()
        grad = _as(-weight * weights, lp)
    return loss, grad, tokens, _checks(loss, lp, mask_bad)


KERNELS: dict[str, Callable[..., tuple]] = {
    "ppo": _ppo_kernel,
    "cispo": _cispo_kernel,
    "importance_sampling": _importance_sampling_kernel,
    "dro": _dro_kernel,
    "cross_entropy": _cross_entropy_kernel,
}
"""The fused computation of each loss of :data:`adapters.losses.LOSSES`, by the same name."""


def _inductor(gm: Any, example_inputs: Any) -> Any:
    """Inductor, rounding every intermediate to its dtype as eager does (``emulate_precision_casts``).

    Without it Inductor keeps bfloat16 intermediates in float32, and a bfloat16 ratio within a
    rounding step of a bound would fall on the other side than in the eager loss.
    """
    import torch._inductor.config
    from torch._inductor.compile_fx import compile_fx

    with torch._inductor.config.patch(emulate_precision_casts=True):
        return compile_fx(gm, example_inputs)


MAX_CONSTANT_SETS = 8
"""Distinct number-valued parameter sets (thresholds, ``beta``) compiled per loss and process.

Numbers are compiled in as constants: Inductor's CPU code is several times slower when a bound
is a runtime scalar. Training uses one set; a further set runs eagerly (tensor thresholds, which
enter the kernel as tensors, are never limited).
"""


def compiled(name: str, constants: tuple[Any, ...] = ()) -> Callable[..., Any] | None:
    """The compiled kernel of loss ``name`` with ``constants`` bound (dynamic shapes, built on first use).

    ``None`` once :data:`MAX_CONSTANT_SETS` other sets of constants are compiled for this loss.
    """
    key = (name, constants)
    if key not in _compiled:
        if sum(1 for other, _ in _compiled if other == name) >= MAX_CONSTANT_SETS:
            return None
        fn = _bind(name, constants, f"{KERNELS[name].__name__}_{len(_compiled)}")
        _compiled[key] = torch.compile(fn, backend=_inductor, dynamic=True)
    return _compiled[key]


def _literal(value: Any) -> str:
    if isinstance(value, torch.dtype):
        return str(value)  # "torch.int32"
    assert isinstance(value, float) and repr(float(repr(value))) == repr(value)
    return repr(value)  # round-trips exactly


def _bind(name: str, constants: tuple[Any, ...], function_name: str) -> Callable[..., Any]:
    """``KERNELS[name]`` with ``constants`` written into a new function's code as literals.

    Literals, not arguments or closure cells: torch.compile turns a float argument or cell into a
    symbolic input, Inductor's CPU code with a runtime bound is several times slower, and Inductor's
    on-disk caches then key two graphs that differ only in that float as one (torch 2.13 serves the
    first one's constants to the second). A function of its own also gets its own graph cache and
    recompile limit.
    """
    values = "".join(f", {_literal(c)}" for c in constants)
    source = f"def {function_name}(*tensors):\n    return _kernel(*tensors{values})\n"
    namespace: dict[str, Any] = {"_kernel": KERNELS[name], "torch": torch}
    exec(
        compile(source, f"<cliptrack fused {name}>", "exec"), namespace
    )  # the source holds only literals we wrote
    return cast(Callable[..., Any], namespace[function_name])


class _Fused(torch.autograd.Function):
    """One compiled call; autograd gets the per-token gradient the kernel computed alongside the loss."""

    @staticmethod
    def forward(ctx: Any, kernel: Callable[..., tuple], logprobs: Tensor, *others: Tensor | None) -> Any:
        loss, grad, *counts = kernel(logprobs.detach(), *others)  # the others come detached
        ctx.save_for_backward(grad)
        ctx.others = len(others)
        ctx.mark_non_differentiable(*counts)
        return (loss, *counts)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor, *_: Any) -> Any:
        (grad,) = ctx.saved_tensors
        return (None, grad_loss * grad) + (None,) * ctx.others


def _run(name: str, tensors: tuple[Tensor | None, ...], constants: tuple[Any, ...] = ()) -> tuple | None:
    """Run the compiled kernel; ``None`` (run eagerly) when it cannot serve the call.

    On a compile or run failure: one warning, and the fused path is off for the process.
    """
    global _failure
    logprobs = tensors[0]
    assert logprobs is not None
    accumulate = torch.int32 if logprobs.numel() < 2**31 else torch.int64
    fn = compiled(name, (*constants, accumulate))
    if fn is None:
        return None
    try:
        out = _Fused.apply(fn, *tensors)
    except Exception as exc:  # noqa: BLE001 - any failure of the compiler must not stop training
        text = str(exc).strip()
        _failure = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        warnings.warn(
            f"cliptrack: the fused {name} loss could not be compiled or run ({_failure}); "
            f"every loss runs eagerly from now on in this process (set {ENV_VAR}=0 to skip the attempt)",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    compiled_calls[name] += 1
    return cast(tuple, out)


# --- public entry points: host-side checks as in adapters.losses, then one compiled call --------

_DEFAULT_OUTSIDE = (measures.RATIO_OUTSIDE_LOW, measures.RATIO_OUTSIDE_HIGH)


def _differentiable(*others: object) -> bool:
    """Whether an input other than the logprobs requires grad (the kernel differentiates the logprobs only)."""
    return any(isinstance(t, Tensor) and t.requires_grad for t in others)


def _sources(
    logprobs: Tensor,
    sampling_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor | None,
    advantages_name: str = "advantages",
) -> dict[str, Tensor]:
    """Check shapes, devices and dtypes now (as the eager path does); the detached inputs by name."""
    check = losses._check_tensor
    check("logprobs", logprobs, floating=True)
    sources = {"logprobs": logprobs.detach()}
    if sampling_logprobs is not None:
        check("sampling_logprobs", sampling_logprobs, like=logprobs, floating=True)
        sources["sampling_logprobs"] = sampling_logprobs.detach()
    check(advantages_name, advantages, like=logprobs, floating=advantages_name == "advantages")
    sources[advantages_name] = advantages.detach()
    if mask is not None:
        check("mask", mask, like=logprobs)
        sources["mask"] = mask.detach()
    return sources


def _bounds(
    low: losses.Threshold, high: losses.Threshold, like: Tensor
) -> tuple[Tensor, Tensor] | tuple[float, float]:
    """Numbers checked now (as eager) and kept as numbers; with a tensor, both as tensors (checked in the kernel)."""
    if not isinstance(low, Tensor) and not isinstance(high, Tensor):
        losses._check_thresholds(low, high, like.device)
        return float(low), float(high)
    for value in (low, high):  # a number beside a tensor: its own checks (type, finite, >= 0)
        if not isinstance(value, Tensor):
            losses._check_thresholds(value, value, like.device)

    def as_tensor(value: losses.Threshold) -> Tensor:
        if isinstance(value, Tensor):
            return value.detach()
        dtype = torch.promote_types(like.dtype, torch.float32)
        return torch.full((), float(value), dtype=dtype, device=like.device)  # a fill, no copy

    return as_tensor(low), as_tensor(high)


def _flat(logprobs: Tensor, *others: Tensor | None) -> tuple[Tensor | None, ...]:
    """1-D views (a copy only for non-contiguous input): one graph serves every batch shape.

    The other inputs are detached after flattening, so that the kernel never sees a view of a
    tensor of another rank (torch.compile guards on a view's base, and would compile per rank).
    """
    return (logprobs.reshape(-1), *(None if t is None else t.reshape(-1).detach() for t in others))


def _clipping(
    name: str,
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    low: losses.Threshold,
    high: losses.Threshold,
    ratio_outside: tuple[float, float],
) -> losses.LossOutput | None:
    if _differentiable(sampling_logprobs, advantages, mask, low, high):
        return None
    sources = _sources(logprobs, sampling_logprobs, advantages, mask)
    lo, hi = _bounds(low, high, logprobs)
    tokens = (logprobs, sources["sampling_logprobs"], sources["advantages"], sources.get("mask"))
    if not isinstance(lo, Tensor) or not isinstance(hi, Tensor):
        out = _run(name, _flat(*tokens), (lo, hi, *ratio_outside))
    elif lo.dim() == 0 and hi.dim() == 0:
        out = _run(name, _flat(*tokens) + (lo, hi), ratio_outside)
    else:  # per-datum thresholds broadcast against the token shape: one graph per rank
        out = _run(name, tokens + (lo, hi), ratio_outside)
    if out is None:
        return None
    loss, n_tokens, invalid, n_clipped, n_low, n_high, gauge = out
    return losses.LossOutput(loss, n_tokens, n_clipped, n_low, n_high, invalid, (sources,), gauge=gauge)


def ppo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    clip_low_threshold: losses.Threshold,
    clip_high_threshold: losses.Threshold,
    ratio_outside: tuple[float, float] = _DEFAULT_OUTSIDE,
) -> losses.LossOutput | None:
    """Fused :func:`adapters.losses.ppo`; ``None`` when the compiler failed (run the eager loss)."""
    return _clipping(
        "ppo",
        logprobs,
        sampling_logprobs,
        advantages,
        mask,
        clip_low_threshold,
        clip_high_threshold,
        ratio_outside,
    )


def cispo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    clip_low_threshold: losses.Threshold,
    clip_high_threshold: losses.Threshold,
    ratio_outside: tuple[float, float] = _DEFAULT_OUTSIDE,
) -> losses.LossOutput | None:
    """Fused :func:`adapters.losses.cispo`; ``None`` when the compiler failed (run the eager loss)."""
    return _clipping(
        "cispo",
        logprobs,
        sampling_logprobs,
        advantages,
        mask,
        clip_low_threshold,
        clip_high_threshold,
        ratio_outside,
    )


def _never_clipping(
    name: str,
    sources: dict[str, Tensor],
    tensors: tuple[Tensor | None, ...],
    constants: tuple[float, ...] = (),
) -> losses.LossOutput | None:
    out = _run(name, tensors, constants)
    if out is None:
        return None
    loss, n_tokens, invalid, *gauge = out
    return losses.LossOutput(
        loss, n_tokens, None, None, None, invalid, (sources,), gauge=gauge[0] if gauge else None
    )


def importance_sampling(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    ratio_outside: tuple[float, float] = _DEFAULT_OUTSIDE,
) -> losses.LossOutput | None:
    """Fused :func:`adapters.losses.importance_sampling`; ``None`` when the compiler failed."""
    if _differentiable(sampling_logprobs, advantages, mask):
        return None
    sources = _sources(logprobs, sampling_logprobs, advantages, mask)
    tokens = (logprobs, sources["sampling_logprobs"], sources["advantages"], sources.get("mask"))
    return _never_clipping("importance_sampling", sources, _flat(*tokens), ratio_outside)


def dro(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    *,
    beta: float,
    ratio_outside: tuple[float, float] = _DEFAULT_OUTSIDE,
) -> losses.LossOutput | None:
    """Fused :func:`adapters.losses.dro` (``beta`` already checked by the caller); ``None`` on failure."""
    if _differentiable(sampling_logprobs, advantages, mask):
        return None
    sources = _sources(logprobs, sampling_logprobs, advantages, mask)
    tokens = (logprobs, sources["sampling_logprobs"], sources["advantages"], sources.get("mask"))
    return _never_clipping("dro", sources, _flat(*tokens), (0.5 * beta, *ratio_outside))


def cross_entropy(logprobs: Tensor, weights: Tensor, mask: Tensor | None = None) -> losses.LossOutput | None:
    """Fused :func:`adapters.losses.cross_entropy`; ``None`` when the compiler failed."""
    if _differentiable(weights, mask):
        return None
    losses._check_tensor("weights", weights, like=logprobs)
    sources = _sources(logprobs, None, weights, mask, advantages_name="weights")
    return _never_clipping("cross_entropy", sources, _flat(logprobs, sources["weights"], sources.get("mask")))
