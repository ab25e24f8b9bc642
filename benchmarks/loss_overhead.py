"""Cost of counting clipped tokens: the losses, eager and fused, against the objectives without counting.

One CPU thread (``torch.set_num_threads(1)``), [64, 2048] tokens, forward + backward over the
logprobs, medians of interleaved repeats in one process, steady state (every compiled function is
called before timing starts). Anchors:

- the plain objective (``tests.reference.objective_*``: Tinker's formula, no counting), eager and
  under ``torch.compile(dynamic=True)``;
- Miles' compiled PPO policy loss, written here from its published formula (``compute_policy_loss``:
  ``ratio = exp(-(old - new))``, ``pg_losses1 = -ratio*A``, ``pg_losses2 = -clamp(ratio, 1-eps,
  1+eps_high)*A``, per-token loss ``max(pg_losses1, pg_losses2)``, ``clipfrac = (pg_losses2 >
  pg_losses1).float()``, the function under ``torch.compile(dynamic=True)``), then the masked sums
  of the loss and of ``clipfrac`` — what Miles computes to log its clip fraction;
- Miles' policy loss with its clip fraction and its two mismatch metrics (``logprob_abs_diff`` and
  the k3 KL against the rollout log-probs), Miles' own functions compiled whole with their masked
  sums (:mod:`benchmarks.miles_loss`, which says where the functions come from): what the gauge
  replaces in a Miles run;
- the other gradient structure for the fused loss: its forward compiled with autograd, so that
  AOTAutograd derives and compiles the backward (the fused path instead computes the per-token
  gradient in its forward pass and scales it in an ``autograd.Function``).

A whole forward + backward step of a small policy model shows what the loss costs in training.
First-call compile times (fresh Inductor cache unless ``TORCHINDUCTOR_CACHE_DIR`` is set) are
printed and reported as rows. Run: ``python benchmarks/loss_overhead.py``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import formulas, fused
from cliptrack.core import measures

from benchmarks import miles_loss
from benchmarks._timing import Row, interleaved_medians, markdown
from tests import reference

SHAPE = (64, 2048)
VOCAB, HIDDEN = 128, 64


def _inputs(seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lp = -torch.rand(SHAPE, generator=gen) * 4
    slp = lp + 0.3 * torch.randn(SHAPE, generator=gen)
    adv = torch.randn(SHAPE, generator=gen)
    mask = (torch.rand(SHAPE, generator=gen) > 0.1).float()
    return lp, slp, adv, mask


def _miles_policy_loss(ppo_kl: Tensor, advantages: Tensor, eps_clip: float, eps_clip_high: float):
    """Miles' PPO policy loss per token and its clip indicator, from the published formula."""
    ratio = torch.exp(-ppo_kl)
    pg_losses1 = -ratio * advantages
    pg_losses2 = -torch.clamp(ratio, 1 - eps_clip, 1 + eps_clip_high) * advantages
    return torch.maximum(pg_losses1, pg_losses2), (pg_losses2 > pg_losses1).float()


def _plain_ppo(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """The PPO objective with Tinker's default bounds as literals: compiled, they are constants."""
    return reference.objective_ppo(lp, slp, adv, mask, 0.8, 1.2)


def _plain_cispo(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """The CISPO objective with Tinker's default bounds as literals."""
    return reference.objective_cispo(lp, slp, adv, mask, 0.0, 4.0)


def _miles_policy_loss_constants(ppo_kl: Tensor, advantages: Tensor):
    """The same with ``eps`` as literals (Miles passes them as arguments: runtime scalars when compiled)."""
    return _miles_policy_loss(ppo_kl, advantages, 0.2, 0.2)


def _ppo_differentiated(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor):
    """The other gradient structure: the fused forward compiled *with* autograd (AOTAutograd derives
    and compiles the backward), counts and checks under ``no_grad``; bounds as literals."""
    ratio = torch.exp(lp - slp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 0.8, 1.2) * adv
    eligible = mask != 0
    loss = -(torch.minimum(unclipped, clipped) * mask).sum()
    with torch.no_grad():
        bites = (clipped < unclipped) & eligible
        n_clipped = bites.sum(dtype=torch.int32).to(torch.int64)
        n_low = (bites & (adv < 0)).sum(dtype=torch.int32).to(torch.int64)
        tokens = eligible.sum(dtype=torch.int32).to(torch.int64)
        nonfinite = ~torch.isfinite(loss + (lp - slp).sum())
        mask_bad = (mask != eligible).sum(dtype=torch.int32).to(torch.int64)
    return loss, tokens, n_clipped, n_low, nonfinite, mask_bad


def _ppo_objective_and_gauge(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The plain PPO objective and the gauge alone (no counts, no checks, no explicit gradient),
    compiled together: the least a fused loss with the gauge can cost."""
    loss = reference.objective_ppo(lp, slp, adv, mask, 0.8, 1.2)
    log_ratio = (lp - slp).detach()
    return loss, formulas.gauge_of(log_ratio, torch.exp(log_ratio), mask != 0, 0.5, 2.0, mask)


def _no_gauge(outputs: Tensor, *_: object, **__: object) -> dict[str, Tensor]:
    """Stands in for ``cliptrack.adapters.losses.formulas.gauge_of``: the gauge of no token, with no per-token work."""
    zero = torch.zeros((), dtype=torch.float64, device=outputs.device)
    return {m.key: zero for m in measures.GAUGE_MEASURES}


def _without_gauge(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """``fn`` with the gauge's per-token work taken out (counting as it was before the gauge).

    Fused: the ratio_outside bounds of the call must differ from the gauged call's, so that the
    kernel compiled without the gauge is a graph of its own."""

    def call(x: Tensor) -> Tensor:
        saved = formulas.gauge_of
        formulas.gauge_of = _no_gauge  # type: ignore[assignment]
        try:
            return fn(x)
        finally:
            formulas.gauge_of = saved

    return call


NO_GAUGE_BOUNDS = {"ratio_outside_low": 0.25, "ratio_outside_high": 4.0}
"""Bounds of the calls timed without the gauge (a graph of their own, see :func:`_without_gauge`)."""


def _first_call_seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(repeats: int = 100) -> list[Row]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    saved_env = os.environ.get(fused.ENV_VAR)
    cache = None
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # cold compile times, not a previous run's cache
        cache = tempfile.TemporaryDirectory(prefix="cliptrack-bench-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name
    try:
        return _run(repeats)
    finally:
        torch.set_num_threads(threads)
        if saved_env is None:
            os.environ.pop(fused.ENV_VAR, None)
        else:
            os.environ[fused.ENV_VAR] = saved_env
        if cache is not None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            cache.cleanup()


def _with_path(path: str, fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """``fn`` run with ``CLIPTRACK_FUSED`` set to ``path`` ("1" fused, "0" eager)."""

    def call(x: Tensor) -> Tensor:
        os.environ[fused.ENV_VAR] = path
        return fn(x)

    return call


@dataclass(frozen=True)
class _Batch:
    """The timed call's inputs: [64, 2048] tokens of logprobs, sampler logprobs, advantages, mask."""

    lp: Tensor
    slp: Tensor
    adv: Tensor
    mask: Tensor

    def step(self, fn: Callable[[Tensor], Tensor]) -> None:
        """One forward + backward of ``fn`` over a fresh leaf copy of the logprobs."""
        x = self.lp.clone().requires_grad_(True)
        fn(x).backward()


def _plain_objectives(b: _Batch) -> dict[str, Callable[[Tensor], Tensor]]:
    """The eager objectives without counting (``tests.reference``), by loss name."""
    slp, adv, mask = b.slp, b.adv, b.mask
    return {
        "ppo": lambda x: reference.objective_ppo(x, slp, adv, mask, 0.8, 1.2),
        "cispo": lambda x: reference.objective_cispo(x, slp, adv, mask, 0.0, 4.0),
        "importance_sampling": lambda x: reference.objective_importance_sampling(x, slp, adv, mask),
        "dro": lambda x: reference.objective_dro(x, slp, adv, mask, 0.1),
        "cross_entropy": lambda x: reference.objective_cross_entropy(x, adv * mask),
    }


def _run(repeats: int) -> list[Row]:
    torch.manual_seed(0)
    b = _Batch(*_inputs())
    lp, slp, adv, mask = b.lp, b.slp, b.adv, b.mask
    step = b.step
    tag = f"{SHAPE[0]}x{SHAPE[1]} tokens, fwd+bwd, 1 thread"
    rows: list[Row] = []

    # -- first calls: compile times --------------------------------------------------------------
    compile_s: dict[str, float] = {}
    ppo_fused = _with_path("1", lambda x: losses.ppo(x, slp, adv, mask).loss)
    cispo_fused = _with_path("1", lambda x: losses.cispo(x, slp, adv, mask).loss)
    compile_s["ppo fused"] = _first_call_seconds(lambda: step(ppo_fused))
    compile_s["cispo fused"] = _first_call_seconds(lambda: step(cispo_fused))
    other = [t[: SHAPE[0] // 2, : SHAPE[1] - 48].contiguous() for t in (lp, slp, adv, mask)]  # another shape

    def other_shape() -> None:
        x = other[0].clone().requires_grad_(True)
        _with_path("1", lambda y: losses.ppo(y, *other[1:]).loss)(x).backward()

    compile_s["ppo fused, second shape"] = _first_call_seconds(other_shape)

    # Bounds as constants (a float argument would become a runtime scalar: several times slower).
    plain_ppo_compiled = torch.compile(_plain_ppo, dynamic=True)
    plain_cispo_compiled = torch.compile(_plain_cispo, dynamic=True)
    miles_compiled = torch.compile(_miles_policy_loss, dynamic=True)
    miles_constants_compiled = torch.compile(_miles_policy_loss_constants, dynamic=True)

    def miles(x: Tensor) -> Tensor:
        pg_losses, clipfrac = miles_compiled(slp - x, adv, 0.2, 0.2)
        clipped = (clipfrac * mask).sum()  # noqa: F841 - computed as Miles does, to log it
        return (pg_losses * mask).sum()

    def miles_constants(x: Tensor) -> Tensor:
        pg_losses, clipfrac = miles_constants_compiled(slp - x, adv)
        clipped = (clipfrac * mask).sum()  # noqa: F841 - computed as Miles does, to log it
        return (pg_losses * mask).sum()

    policy_loss, approx_kl, source = miles_loss.miles_functions()
    print(f"Miles' loss with its metrics: {source}", flush=True)
    miles_metrics = torch.compile(
        miles_loss.miles_whole(miles_loss.miles_per_token(policy_loss, approx_kl)), dynamic=True
    )
    rollout = (slp + 0.05 * torch.randn(SHAPE, generator=torch.Generator().manual_seed(1))).reshape(-1)

    def miles_with_metrics(x: Tensor) -> Tensor:  # Miles' inputs: current, old (here: sampler) and rollout
        loss, _clipped, _abs_diff, _kl = miles_metrics(x.reshape(-1), flat[0], rollout, flat[1], flat[2])
        return loss

    differentiated = torch.compile(_ppo_differentiated, dynamic=True)
    objective_and_gauge = torch.compile(_ppo_objective_and_gauge, dynamic=True)
    flat = [t.reshape(-1) for t in (slp, adv, mask)]

    def compile_differentiated(x: Tensor) -> Tensor:
        return differentiated(x.reshape(-1), *flat)[0]

    def fused_kernel(x: Tensor) -> Tensor:  # the fused path without the host-side checks around it
        kernel = fused.compiled("ppo", (0.8, 1.2, 0.5, 2.0, False, 0.0, torch.int32, True))
        assert kernel is not None
        no_old, no_lag, no_weights = None, None, None
        return fused._Fused.apply(kernel, [], x.reshape(-1), *flat, no_old, no_lag, no_weights)[0]

    plain = _plain_objectives(b)
    compile_s["ppo objective compiled"] = _first_call_seconds(
        lambda: step(lambda x: plain_ppo_compiled(x, slp, adv, mask))
    )
    compile_s["cispo objective compiled"] = _first_call_seconds(
        lambda: step(lambda x: plain_cispo_compiled(x, slp, adv, mask))
    )
    compile_s["Miles policy loss compiled"] = _first_call_seconds(lambda: step(miles))
    compile_s["Miles policy loss with its metrics compiled"] = _first_call_seconds(
        lambda: step(miles_with_metrics)
    )
    compile_s["Miles policy loss compiled, eps as constants"] = _first_call_seconds(
        lambda: step(miles_constants)
    )
    compile_s["ppo fused, backward by AOTAutograd"] = _first_call_seconds(
        lambda: step(compile_differentiated)
    )
    for name, seconds in compile_s.items():
        print(f"first call (compile) of {name}: {seconds:.2f} s", flush=True)

    # Compiled candidates are timed among themselves, eager ones among themselves: an eager call
    # allocates megabytes of temporaries and evicts the inputs from the caches, which would bias
    # whichever compiled call runs next in the round.
    def medians(fns: dict[str, Callable[[Tensor], Tensor]]) -> dict[str, float]:
        return interleaved_medians({k: (lambda f=f: step(f)) for k, f in fns.items()}, repeats)

    # -- PPO -------------------------------------------------------------------------------------
    ppo_eager = _with_path("0", lambda x: losses.ppo(x, slp, adv, mask).loss)
    ppo_fused_no_gauge = _without_gauge(
        _with_path("1", lambda x: losses.ppo(x, slp, adv, mask, **NO_GAUGE_BOUNDS).loss)
    )
    ppo_eager_no_gauge = _without_gauge(_with_path("0", lambda x: losses.ppo(x, slp, adv, mask).loss))
    step(ppo_fused_no_gauge)
    m = medians(
        {
            "fused": ppo_fused,
            "fused no gauge": ppo_fused_no_gauge,
            "plain compiled": lambda x: plain_ppo_compiled(x, slp, adv, mask),
            "miles": miles,
            "miles constants": miles_constants,
            "miles metrics": miles_with_metrics,
            "differentiated": compile_differentiated,
            "fused kernel": fused_kernel,
            "objective and gauge": lambda x: objective_and_gauge(x, slp, adv, mask)[0],
        }
    )
    e = medians(
        {"fused": ppo_fused, "eager": ppo_eager, "eager no gauge": ppo_eager_no_gauge, "plain": plain["ppo"]}
    )
    eligible_log_ratio = (lp - slp) * mask

    def k3_alone() -> None:  # the eager gauge's k3 term, exact: float64 expm1 over every token
        wide = eligible_log_ratio.to(torch.float64)
        torch.expm1(wide).sub_(wide).sum()

    k3 = interleaved_medians({"eager no gauge": lambda: step(ppo_eager_no_gauge), "k3": k3_alone}, repeats)
    rows += [
        Row(
            f"ppo fused with counting and the gauge, {tag}",
            m["fused"],
            "ppo objective compiled, no counting",
            m["fused"] / m["plain compiled"],
            "≤ 1.40 (goal ≤ 1.10)",
        ),
        Row(
            "ppo fused with counting and the gauge",
            m["fused"],
            "Miles' policy loss + clip fraction + logprob_abs_diff + k3 KL, compiled whole",
            m["fused"] / m["miles metrics"],
            "≤ 0.5",
        ),
        Row(
            "ppo fused with counting, without the gauge",
            m["fused no gauge"],
            "ppo objective compiled, no counting",
            m["fused no gauge"] / m["plain compiled"],
        ),
        Row(
            "ppo objective and the gauge alone (no counts, checks or explicit gradient), compiled together",
            m["objective and gauge"],
            "ppo objective compiled, no counting",
            m["objective and gauge"] / m["plain compiled"],
        ),
        Row(
            "ppo eager with counting and the gauge",
            e["eager"],
            "ppo eager with counting, without the gauge",
            e["eager"] / e["eager no gauge"],
            "≤ 1.15",
        ),
        Row(
            "the eager gauge's k3 term alone (float64 expm1, subtract, sum)",
            k3["k3"],
            "ppo eager with counting, without the gauge",
            k3["k3"] / k3["eager no gauge"],
        ),
        Row(
            "ppo fused with counting",
            m["fused"],
            "Miles' compiled PPO loss + masked clipfrac sum",
            m["fused"] / m["miles"],
            "≤ 1.0",
        ),
        Row(
            "ppo fused with counting",
            m["fused"],
            "the same Miles loss with eps compiled in as constants",
            m["fused"] / m["miles constants"],
        ),
        Row(
            "Miles' compiled PPO loss + masked clipfrac sum",
            m["miles"],
            "ppo objective compiled, no counting",
            m["miles"] / m["plain compiled"],
        ),
        Row(
            "ppo fused kernel, backward by AOTAutograd (not used), called directly",
            m["differentiated"],
            "ppo fused kernel, gradient from its forward, called directly",
            m["differentiated"] / m["fused kernel"],
        ),
        Row(
            "ppo fused with counting (host-side checks, dispatch)",
            m["fused"],
            "ppo fused kernel, gradient from its forward, called directly",
            m["fused"] / m["fused kernel"],
        ),
        Row("ppo fused with counting", e["fused"], "ppo eager with counting", e["fused"] / e["eager"]),
        Row(
            "ppo eager with counting",
            e["eager"],
            "ppo objective eager, no counting",
            e["eager"] / e["plain"],
            "≤ 1.10",
        ),
    ]
    steady_ppo = m["fused"]

    # -- CISPO -----------------------------------------------------------------------------------
    cispo_eager = _with_path("0", lambda x: losses.cispo(x, slp, adv, mask).loss)
    cispo_fused_no_gauge = _without_gauge(
        _with_path("1", lambda x: losses.cispo(x, slp, adv, mask, **NO_GAUGE_BOUNDS).loss)
    )
    cispo_eager_no_gauge = _without_gauge(_with_path("0", lambda x: losses.cispo(x, slp, adv, mask).loss))
    step(cispo_fused_no_gauge)
    m = medians(
        {
            "fused": cispo_fused,
            "fused no gauge": cispo_fused_no_gauge,
            "plain compiled": lambda x: plain_cispo_compiled(x, slp, adv, mask),
            "miles metrics": miles_with_metrics,
        }
    )
    e = medians(
        {
            "fused": cispo_fused,
            "eager": cispo_eager,
            "eager no gauge": cispo_eager_no_gauge,
            "plain": plain["cispo"],
        }
    )
    rows += [
        Row(
            f"cispo fused with counting and the gauge, {tag}",
            m["fused"],
            "cispo objective compiled, no counting",
            m["fused"] / m["plain compiled"],
            "≤ 1.40 (goal ≤ 1.10)",
        ),
        Row(
            "cispo fused with counting and the gauge",
            m["fused"],
            "Miles' policy loss + clip fraction + logprob_abs_diff + k3 KL, compiled whole",
            m["fused"] / m["miles metrics"],
            "≤ 0.5",
        ),
        Row(
            "cispo fused with counting, without the gauge",
            m["fused no gauge"],
            "cispo objective compiled, no counting",
            m["fused no gauge"] / m["plain compiled"],
        ),
        Row(
            "cispo eager with counting and the gauge",
            e["eager"],
            "cispo eager with counting, without the gauge",
            e["eager"] / e["eager no gauge"],
            "≤ 1.15",
        ),
        Row("cispo fused with counting", e["fused"], "cispo eager with counting", e["fused"] / e["eager"]),
        Row(
            "cispo eager with counting",
            e["eager"],
            "cispo objective eager, no counting",
            e["eager"] / e["plain"],
            "≤ 1.10",
        ),
    ]

    rows += _unclipped_rows(b, plain, repeats)
    rows += _decoupled_rows(b, repeats)
    rows += _automatic_choice_rows(b, repeats)
    rows += _compile_cost_rows(compile_s, steady_ppo)
    rows += _policy_step_rows(b, plain, repeats)
    return rows


def _unclipped_rows(b: _Batch, plain: dict[str, Callable[[Tensor], Tensor]], repeats: int) -> list[Row]:
    """The losses that never clip, fused against eager and against the plain objective: does fusing pay?"""
    slp, adv, mask, step = b.slp, b.adv, b.mask, b.step
    rows: list[Row] = []
    others: dict[str, Callable[[Tensor], Tensor]] = {
        "importance_sampling": lambda x: losses.importance_sampling(x, slp, adv, mask).loss,
        "dro": lambda x: losses.dro(x, slp, adv, mask, beta=0.1).loss,
        "cross_entropy": lambda x: losses.cross_entropy(x, adv * mask).loss,
    }
    for name, fn in others.items():
        fused_fn, eager_fn = _with_path("1", fn), _with_path("0", fn)
        step(fused_fn)  # compile
        m = interleaved_medians(
            {
                "fused": lambda f=fused_fn: step(f),
                "eager": lambda e=eager_fn: step(e),
                "plain": lambda n=name: step(plain[n]),
            },
            repeats,
        )
        rows.append(
            Row(
                f"{name} fused with counting",
                m["fused"],
                f"{name} eager with counting",
                m["fused"] / m["eager"],
            )
        )
        rows.append(
            Row(
                f"{name} fused with counting",
                m["fused"],
                f"{name} objective eager, no counting",
                m["fused"] / m["plain"],
            )
        )
    return rows


def _plain_decoupled(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    """Decoupled PPO's objective (clipped against the old log-probs), no counting; bounds as literals."""
    return reference.objective_decoupled("ppo", lp, old, adv, mask, 0.8, 1.2)


def _plain_dual(lp: Tensor, old: Tensor, adv: Tensor, mask: Tensor, weights: Tensor) -> Tensor:
    """Decoupled PPO with verl's dual clip (c = 3) and importance weights, no counting."""
    return reference.objective_decoupled("ppo", lp, old, adv, mask, 0.8, 1.2, 3.0, weights)


def _decoupled_rows(b: _Batch, repeats: int) -> list[Row]:
    """Decoupled PPO (clipped against the old log-probs: the gauge then also splits into engine and
    drift) and with verl's dual clip and importance weights, fused and eager, against the same
    objectives without counting, compiled and eager, beside today's PPO against the sampler given
    the same old log-probs (whose gauge splits alike: what choosing the old reference costs)."""
    slp, adv, mask, step = b.slp, b.adv, b.mask, b.step
    gen = torch.Generator().manual_seed(2)
    old = slp + 0.05 * torch.randn(SHAPE, generator=gen)  # the trainer at the sampling weights
    weights = torch.rand(SHAPE, generator=gen) * 2
    decoupled = {"clip_reference": "old", "old_logprobs": old}
    counted: dict[str, Callable[[Tensor], Tensor]] = {
        "ppo decoupled": lambda x: losses.ppo(x, slp, adv, mask, **decoupled).loss,
        "ppo decoupled, dual clip and importance weights": lambda x: (
            losses.ppo(x, slp, adv, mask, dual_clip=3.0, importance_weights=weights, **decoupled).loss
        ),
    }
    compiled = {
        "ppo decoupled": torch.compile(_plain_decoupled, dynamic=True),
        "ppo decoupled, dual clip and importance weights": torch.compile(_plain_dual, dynamic=True),
    }
    plain: dict[str, Callable[[Tensor], Tensor]] = {
        "ppo decoupled": lambda x: _plain_decoupled(x, old, adv, mask),
        "ppo decoupled, dual clip and importance weights": lambda x: _plain_dual(x, old, adv, mask, weights),
    }
    plain_compiled: dict[str, Callable[[Tensor], Tensor]] = {
        "ppo decoupled": lambda x: compiled["ppo decoupled"](x, old, adv, mask),
        "ppo decoupled, dual clip and importance weights": lambda x: compiled[
            "ppo decoupled, dual clip and importance weights"
        ](x, old, adv, mask, weights),
    }
    # today's default, given the same old log-probs: the gauge's engine/drift split costs the same
    sampler = _with_path("1", lambda x: losses.ppo(x, slp, adv, mask, old_logprobs=old).loss)
    rows: list[Row] = []
    for name, fn in counted.items():
        fused_fn, eager_fn = _with_path("1", fn), _with_path("0", fn)
        step(fused_fn)  # compile
        step(plain_compiled[name])
        m = interleaved_medians(
            {
                "fused": lambda f=fused_fn: step(f),
                "plain compiled": lambda n=name: step(plain_compiled[n]),
                "sampler": lambda: step(sampler),
            },
            repeats,
        )
        e = interleaved_medians(
            {"eager": lambda f=eager_fn: step(f), "plain": lambda n=name: step(plain[n])}, repeats
        )
        rows += [
            Row(
                f"{name} fused with counting and the gauge",
                m["fused"],
                f"{name} objective compiled, no counting",
                m["fused"] / m["plain compiled"],
            ),
            Row(
                f"{name} fused with counting and the gauge",
                m["fused"],
                "ppo fused against the sampler, given the same old_logprobs",
                m["fused"] / m["sampler"],
            ),
            Row(
                f"{name} eager with counting and the gauge",
                e["eager"],
                f"{name} objective eager, no counting",
                e["eager"] / e["plain"],
            ),
        ]
    return rows


def _automatic_choice_rows(b: _Batch, repeats: int) -> list[Row]:
    """Fused against eager PPO by tokens per call: where the automatic choice starts."""
    lp, slp, adv, mask = b.lp, b.slp, b.adv, b.mask
    rows: list[Row] = []
    for tokens in (256, 4096, fused.AUTO_MIN_TOKENS):
        part = [t.reshape(-1)[:tokens].clone() for t in (lp, slp, adv, mask)]

        def sized(x: Tensor, p: list[Tensor] = part) -> Tensor:
            return losses.ppo(x, *p[1:]).loss

        def sized_step(fn: Callable[[Tensor], Tensor], p: list[Tensor] = part) -> None:
            x = p[0].clone().requires_grad_(True)
            fn(x).backward()

        fused_fn, eager_fn = _with_path("1", sized), _with_path("0", sized)
        sized_step(fused_fn)  # a call under 4,097 tokens compiles Inductor's small-reduction graph
        m = interleaved_medians(
            {"fused": lambda f=fused_fn: sized_step(f), "eager": lambda e=eager_fn: sized_step(e)}, repeats
        )
        rows.append(
            Row(
                f"ppo fused with counting, {tokens} tokens per call",
                m["fused"],
                "ppo eager with counting, same call",
                m["fused"] / m["eager"],
            )
        )
    return rows


def _compile_cost_rows(compile_s: dict[str, float], steady_ppo: float) -> list[Row]:
    """First calls of the fused PPO loss (seconds) against its steady-state call."""
    rows: list[Row] = []
    rows.append(
        Row(
            "ppo fused: first call, cold compile",
            compile_s["ppo fused"],
            "ppo fused steady-state call",
            compile_s["ppo fused"] / steady_ppo,
        )
    )
    rows.append(
        Row(
            "ppo fused: first call at a second shape (graph reused)",
            compile_s["ppo fused, second shape"],
            "ppo fused steady-state call",
            compile_s["ppo fused, second shape"] / steady_ppo,
        )
    )
    return rows


def _policy_step_rows(b: _Batch, plain: dict[str, Callable[[Tensor], Tensor]], repeats: int) -> list[Row]:
    """A whole step of a small policy (embedding -> MLP -> log-softmax), the loss counted or plain."""
    slp, adv, mask = b.slp, b.adv, b.mask
    rows: list[Row] = []
    tokens = torch.randint(0, VOCAB, SHAPE)
    targets = torch.randint(0, VOCAB, SHAPE)
    policy = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, HIDDEN),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.Tanh(),
        torch.nn.Linear(HIDDEN, VOCAB),
    )

    def policy_step(loss_of: Callable[[Tensor], Tensor]) -> None:
        policy.zero_grad(set_to_none=True)
        logprobs = torch.log_softmax(policy(tokens), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        loss_of(logprobs).backward()

    os.environ.pop(fused.ENV_VAR, None)  # the automatic choice, as in training
    counted = {
        "ppo": lambda x: losses.ppo(x, slp, adv, mask).loss,
        "cispo": lambda x: losses.cispo(x, slp, adv, mask).loss,
    }
    for name, fn in counted.items():
        medians = interleaved_medians(
            {"counted": lambda c=fn: policy_step(c), "plain": lambda p=plain[name]: policy_step(p)},
            max(5, repeats // 3),
        )
        rows.append(
            Row(
                f"{name} whole policy step (fwd+bwd), with counting (automatic path: fused)",
                medians["counted"],
                "same step, eager objective without counting",
                medians["counted"] / medians["plain"],
                "≤ 1.01",
            )
        )
    return rows


if __name__ == "__main__":
    print(markdown(run()))
