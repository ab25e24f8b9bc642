"""The built-in losses as one compiled computation per call: loss, counts, gauge, checks, gradient.

Each loss's formula (:data:`cliptrack.adapters.losses.formulas.FORMULAS`, the same function the eager path runs)
is handed to ``torch.compile`` with dynamic shapes and ``gradient=True``: Inductor fuses the
element-wise work and the reductions into one pass over the tokens, and the same pass writes the
per-token gradient of the loss with respect to the logprobs, formed term by term as autograd
forms it from the eager loss; the backward only scales it (an ``autograd.Function``): measured
faster forward + backward than letting AOTAutograd derive and compile a backward that reads the
inputs again (``benchmarks/loss_overhead.py``), and nothing is compiled at ``loss.backward()``
time. Gradients flow to the logprobs only: a call whose other inputs require grad runs eagerly.

Selection (read on every call): the environment variable ``CLIPTRACK_FUSED`` set to ``1`` forces
the fused path, ``0`` the eager one; unset (or empty), the fused path is taken where
``torch.compile`` can work on the input's device (a C++ compiler for CPU, Triton for CUDA) and the
call has at least :data:`AUTO_MIN_TOKENS` tokens. Calls with fewer than 2 tokens, calls made while
an enclosing ``torch.compile`` traces the caller, and calls with a non-tensor input always run
eagerly (the eager path then names the bad input). A compile (or compiled-run) failure gives one
``RuntimeWarning`` and every later call runs eagerly: training never stops for it.

The contract is that of :mod:`cliptrack.adapters.losses.builtin`: the same :class:`~cliptrack.adapters.losses.builtin.LossOutput`,
detached int64 0-dim counts on the input's device, no host synchronisation, the same input checks
and error messages, the loss and gradients equal to the eager loss up to floating-point
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
from cliptrack.adapters.losses import formulas
from cliptrack.adapters.losses.formulas import FORMULAS, Threshold
from torch import Tensor
from torch.autograd.function import once_differentiable

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
"""Kernels by (loss, constants and the declaration's measure terms)."""
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


def compiled(
    name: str, constants: tuple[Any, ...] = (), terms: formulas.Terms = ()
) -> Callable[..., Any] | None:
    """The compiled kernel of loss ``name`` with ``constants`` bound (dynamic shapes, built on first use).

    ``None`` once :data:`MAX_CONSTANT_SETS` other sets of constants are compiled for this loss.
    A kernel is built per set of measure terms too (``terms``, a declaration's
    :attr:`~cliptrack.core.measures.Declaration.terms`): it computes them.
    """
    key = (name, (*constants, *terms))
    if key not in _compiled:
        if sum(1 for other, _ in _compiled if other == name) >= MAX_CONSTANT_SETS:
            return None
        fn = _bind(name, constants, f"{FORMULAS[name].__name__}_{len(_compiled)}", terms)
        _compiled[key] = torch.compile(fn, backend=_inductor, dynamic=True)
    return _compiled[key]


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, torch.dtype):
        return str(value)  # "torch.int32"
    assert isinstance(value, float) and repr(float(repr(value))) == repr(value)
    return repr(value)  # round-trips exactly


def _bind(
    name: str, constants: tuple[Any, ...], function_name: str, terms: formulas.Terms = ()
) -> Callable[..., Any]:
    """``FORMULAS[name]`` with ``constants`` written into a new function's code as literals (and
    ``terms``, the measures whose terms it computes, as a global of that function).

    Literals, not arguments or closure cells: torch.compile turns a float argument or cell into a
    symbolic input, Inductor's CPU code with a runtime bound is several times slower, and Inductor's
    on-disk caches then key two graphs that differ only in that float as one (torch 2.13 serves the
    first one's constants to the second). A function of its own also gets its own graph cache and
    recompile limit.
    """
    values = "".join(f", {_literal(c)}" for c in constants)
    source = f"def {function_name}(*tensors):\n    return _kernel(*tensors{values}, terms=_terms)\n"
    namespace: dict[str, Any] = {"_kernel": FORMULAS[name], "torch": torch, "_terms": tuple(terms)}
    exec(
        compile(source, f"<cliptrack fused {name}>", "exec"), namespace
    )  # the source holds only literals we wrote
    return cast(Callable[..., Any], namespace[function_name])


class _Fused(torch.autograd.Function):
    """One compiled call; autograd gets the per-token gradient the kernel computed alongside the loss.

    Returns ``(loss, invalid, *measured values)``; the measured keys, in the same order, are
    appended to ``names`` (an autograd function returns tensors only)."""

    @staticmethod
    def forward(
        ctx: Any,
        kernel: Callable[..., formulas.Result],
        names: list[str],
        logprobs: Tensor,
        *others: Tensor | None,
    ) -> Any:
        result = kernel(logprobs.detach(), *others)  # the others come detached
        ctx.save_for_backward(result.grad)
        ctx.others = len(others)
        values = tuple(result.measured.values())
        names.extend(result.measured)
        ctx.mark_non_differentiable(result.invalid, *values)
        return (result.loss, result.invalid, *values)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_loss: Tensor, *_: Any) -> Any:
        (grad,) = ctx.saved_tensors
        return (None, None, grad_loss * grad) + (None,) * ctx.others


def evaluate(
    name: str,
    logprobs: Tensor,
    others: tuple[Tensor | None, ...],
    constants: tuple[float | bool, ...] = (),
    bounds: tuple[Threshold, Threshold] | None = None,
    terms: formulas.Terms = (),
) -> formulas.Result | None:
    """Formula ``name`` compiled, on one call's checked inputs; ``None``: run it eagerly instead.

    ``others``: the per-token inputs after the logprobs, detached (``None`` for an absent mask);
    ``constants``: the numbers (and bools: PPO's clip reference) the formula takes after its
    thresholds (compiled in);
    ``bounds``: a clipping loss's ``(low, high)``, numbers (checked by the caller, compiled in) or
    tensors (a number beside a tensor becomes a tensor; checked on device); ``terms``: the measures
    whose terms it computes beside its own (:func:`compiled`). Returns the formula's
    :class:`~cliptrack.adapters.losses.formulas.Result` without its gradient (autograd holds it). ``None`` when the call's set of
    constants is beyond :data:`MAX_CONSTANT_SETS`, or on a compile or run failure: then one
    warning, and the fused path is off for the process.
    """
    global _failure
    extra: tuple[Tensor, ...] = ()
    if bounds is not None:
        if isinstance(bounds[0], Tensor) or isinstance(bounds[1], Tensor):
            extra = tuple(_tensor_bound(b, logprobs) for b in bounds)
        else:
            constants = (float(bounds[0]), float(bounds[1]), *constants)
    if any(
        b.dim() > 0 for b in extra
    ):  # per-datum thresholds broadcast against the token shape: one graph per rank
        tensors = (logprobs, *others, *extra)
    else:
        tensors = (*_flat(logprobs, *others), *extra)
    accumulate = torch.int32 if logprobs.numel() < 2**31 else torch.int64
    fn = compiled(name, (*constants, accumulate, True), terms)
    if fn is None:
        return None
    names: list[str] = []
    try:
        loss, invalid, *values = _Fused.apply(fn, names, *tensors)
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
    return formulas.Result(loss, None, invalid, dict(zip(names, values, strict=True)))


def _tensor_bound(value: Threshold, like: Tensor) -> Tensor:
    """A clip bound as a tensor: a tensor detached, a number filled in (no host-to-device copy)."""
    if isinstance(value, Tensor):
        return value.detach()
    dtype = torch.promote_types(like.dtype, torch.float32)
    return torch.full((), float(value), dtype=dtype, device=like.device)


def _flat(logprobs: Tensor, *others: Tensor | None) -> tuple[Tensor | None, ...]:
    """1-D views (a copy only for non-contiguous input): one graph serves every batch shape.

    The other inputs are detached after flattening, so that the kernel never sees a view of a
    tensor of another rank (torch.compile guards on a view's base, and would compile per rank).
    """
    return (logprobs.reshape(-1), *(None if t is None else t.reshape(-1).detach() for t in others))
