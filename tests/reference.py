"""Plain references for the losses: Tinker's formulas without counting, and per-token rules.

``objective_*`` are the vectorised objectives exactly as Tinker documents them, with no counting;
``per_token_*`` apply the clipping rules of docs/CONTRACT.md ("Clip semantics") one token at a
time in plain Python. The ratio is computed once with the same element-wise ``exp`` as the loss
(the only op that is not correctly rounded), everything else per token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def objective_ppo(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    ratio = torch.exp(lp - slp)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, low, high) * adv
    return -(torch.minimum(unclipped, clipped) * mask.to(lp.dtype)).sum()


def objective_cispo(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    coefficient = torch.clamp(torch.exp(lp - slp).detach(), low, high)
    return -(coefficient * adv * lp * mask.to(lp.dtype)).sum()


def objective_importance_sampling(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor) -> Tensor:
    return -(torch.exp(lp - slp) * adv * mask.to(lp.dtype)).sum()


def objective_dro(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor, beta: float) -> Tensor:
    return -((lp * adv - 0.5 * beta * (lp - slp) ** 2) * mask.to(lp.dtype)).sum()


def objective_cross_entropy(lp: Tensor, weights: Tensor) -> Tensor:
    return -(weights * lp).sum()


@dataclass
class Counts:
    loss_tokens: int = 0
    clipped: int = 0
    low: int = 0
    high: int = 0
    loss: float = 0.0


def per_token_ppo(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> Counts:
    ratio = torch.exp(lp - slp).detach().flatten()
    out = Counts()
    terms = []
    for r, a, m in zip(ratio, adv.flatten(), mask.flatten(), strict=True):
        if float(m) == 0:
            continue
        out.loss_tokens += 1
        unclipped = r * a
        clipped = torch.clamp(r, low, high) * a
        terms.append(-min(float(unclipped), float(clipped)))
        if float(clipped) < float(unclipped):  # clipping bites
            out.clipped += 1
            if float(r) < low:
                out.low += 1
            else:
                assert float(r) > high
                out.high += 1
    out.loss = math.fsum(terms)
    return out


def per_token_cispo(lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> Counts:
    ratio = torch.exp(lp - slp).detach().flatten()
    out = Counts()
    terms = []
    for r, a, x, m in zip(ratio, adv.flatten(), lp.detach().flatten(), mask.flatten(), strict=True):
        if float(m) == 0:
            continue
        out.loss_tokens += 1
        coefficient = torch.clamp(r, low, high)
        terms.append(-float(coefficient) * float(a) * float(x))
        if float(coefficient) != float(r):
            out.clipped += 1
            if float(r) < low:
                out.low += 1
            else:
                out.high += 1
    out.loss = math.fsum(terms)
    return out


def per_token_loss(
    kind: str, lp: Tensor, slp: Tensor, adv: Tensor, mask: Tensor, beta: float = 0.0
) -> Counts:
    """Eligible tokens and the summed loss of a never-clipping loss, one token at a time in float64."""
    out = Counts()
    terms = []
    for x, s, a, m in zip(
        lp.flatten().tolist(),
        slp.flatten().tolist(),
        adv.flatten().tolist(),
        mask.flatten().tolist(),
        strict=True,
    ):
        if m == 0:
            continue
        out.loss_tokens += 1
        if kind == "importance_sampling":
            terms.append(-math.exp(x - s) * a)
        elif kind == "dro":
            terms.append(-(x * a - 0.5 * beta * (x - s) ** 2))
        elif kind == "cross_entropy":  # ``adv`` holds the weights
            terms.append(-a * x)
        else:
            raise ValueError(kind)
    out.loss = math.fsum(terms)
    return out


@dataclass
class Gauge:
    """The on-policy gauge of docs/CONTRACT.md in float64, one token at a time (plain Python).

    ``outside_ambiguous``: eligible tokens whose ratio lies within a few rounding steps of a
    ``ratio_outside`` bound, where another element-wise ``exp`` may put them on the other side.
    """

    loss_tokens: int
    metrics: dict[str, float]
    outside_ambiguous: int


def gauge(lp: Tensor, slp: Tensor, mask: Tensor | None, low: float = 0.5, high: float = 2.0) -> Gauge:
    """Every gauge key over eligible tokens (``mask != 0``; all without a mask), from ``l`` as the loss
    computes it (``lp - slp`` in the input dtype) taken exactly into float64: sums by ``math.fsum``
    of float64 terms (``|l|``, ``expm1(l) - l``, ``exp(l)``, ``exp(2 l)``), the means formed once."""
    log_ratio = (lp.detach() - slp.detach()).flatten()
    ratio = torch.exp(log_ratio).double().tolist()
    values = log_ratio.double().tolist()
    eligible = [True] * len(values) if mask is None else [float(m) != 0 for m in mask.flatten().tolist()]
    ls = [x for x, e in zip(values, eligible, strict=True) if e]
    rs = [r for r, e in zip(ratio, eligible, strict=True) if e]
    n = len(ls)
    eps = 4 * float(torch.finfo(lp.dtype).eps)
    outside = sum(1 for r in rs if r < low or r > high)
    ambiguous = sum(1 for r in rs for b in (low, high) if abs(r - b) <= eps * max(b, 1e-30))
    metrics = {
        "loss_tokens:sum": float(n),
        "log_ratio:sum": math.fsum(ls),
        "abs_log_ratio:sum": math.fsum(abs(x) for x in ls),
        "kl_k3:sum": math.fsum(math.expm1(x) - x for x in ls),
        "ratio_outside_tokens:sum": float(outside),
        "is_weight:sum": math.fsum(math.exp(x) for x in ls),
        "is_weight_sq:sum": math.fsum(math.exp(2 * x) for x in ls),
    }
    if n:
        metrics["log_ratio:max"] = max(ls)
        metrics["log_ratio:min"] = min(ls)
        metrics["abs_log_ratio:mean"] = metrics["abs_log_ratio:sum"] / n
        metrics["kl_k3:mean"] = metrics["kl_k3:sum"] / n
    return Gauge(n, metrics, ambiguous)


def gauge_tolerance(key: str, lp: Tensor, slp: Tensor, mask: Tensor | None) -> float:
    """Absolute tolerance of a gauge key computed with per-token terms in the input dtype (at least
    float32) against :func:`gauge` (float64 terms): a few ulps of float32 (or of the dtype) per token
    of each term's magnitude, summed; 0 for ``l`` itself (exact in float64) and its extremes."""
    log_ratio = (lp.detach() - slp.detach()).double().flatten()
    if mask is not None:
        log_ratio = log_ratio[mask.flatten() != 0]
    eps = 8 * max(float(torch.finfo(lp.dtype).eps), float(torch.finfo(torch.float32).eps))
    weight = torch.exp(log_ratio)
    scale = {
        "log_ratio:sum": 0.0,
        "abs_log_ratio:sum": 0.0,
        "log_ratio:max": 0.0,
        "log_ratio:min": 0.0,
        "kl_k3:sum": float((log_ratio.abs() + (weight - 1).abs()).sum()),
        "is_weight:sum": float(weight.sum()),
        "is_weight_sq:sum": 2 * float((weight * weight).sum()),
    }[key]
    return eps * scale + 1e-12 * len(log_ratio)


FLOAT32_UNIT_ROUNDOFF = 2.0**-24
"""float32's unit roundoff ``u``: one rounding moves a value by at most ``u`` of its magnitude."""


def loss_rounding(
    name: str,
    lp: Tensor,
    slp: Tensor,
    adv: Tensor,
    mask: Tensor,
    low: float = 0.0,
    high: float = 0.0,
    beta: float = 0.0,
    *,
    weights: Tensor | None = None,
    dual_clip: float | None = None,
) -> float:
    """How far a float32 loss ``name`` over ``n`` eligible tokens may lie from its exact value, however
    its kernels are built (vector width, loop tails, order of the sum): each per-token term within
    8 roundings of its magnitude (``exp`` to a last bit that differs between vectorised and scalar
    code, then at most four products and differences), and a sum of ``n`` terms in any order within
    ``n - 1`` roundings of the sum of their magnitudes (Higham, *Accuracy and Stability of Numerical
    Algorithms*, 2002, eq. 4.4). Two builds of the same loss lie within twice this of each other.
    ``slp``: the log-probs the ratio is taken against (the old ones for decoupled PPO);
    ``weights`` (importance weights) and ``dual_clip`` as the loss takes them: one more product and
    an exact ``maximum``, within the same 8 roundings per term."""
    x, s, a = lp.detach().double(), slp.detach().double(), adv.double()
    w = 1.0 if weights is None else weights.detach().double()
    on = mask.double() != 0
    ratio = torch.exp(x - s)

    def ppo_terms() -> Tensor:
        objective = torch.minimum(ratio * a, torch.clamp(ratio, low, high) * a)
        if dual_clip is not None:
            objective = torch.where(a < 0, torch.maximum(objective, a * dual_clip), objective)
        return (objective * w).abs()

    terms = {
        "ppo": ppo_terms,
        "cispo": lambda: (torch.clamp(ratio, low, high) * a * w * x).abs(),
        "importance_sampling": lambda: (ratio * a).abs(),
        "dro": lambda: (x * a).abs() + 0.5 * beta * (x - s) ** 2,
    }[name]()[on]
    n = int(terms.numel())
    return (n - 1 + 8) * FLOAT32_UNIT_ROUNDOFF * float(terms.sum())


def plain_worst(sequences: Iterable[Any], criterion: str, k: int) -> tuple[Any, ...]:
    """The worst ``k`` sequences (``cliptrack.core.worst.SequenceGauge``) by ``criterion``, plainly:
    every sequence with a token (a datum seen twice: its pass with the largest value, then the
    largest row), sorted by value descending then datum ascending (two stable sorts)."""
    fields = ("tokens", "log_ratio", "abs_log_ratio", "kl_k3", "max_abs_log_ratio", "worst_token")

    def rank(s: Any) -> tuple[Any, ...]:
        return (getattr(s, criterion), *(getattr(s, f) for f in fields))

    best: dict[int, Any] = {}
    for s in sequences:
        if s.tokens > 0 and (s.datum not in best or rank(s) > rank(best[s.datum])):
            best[s.datum] = s
    kept = sorted(best.values(), key=lambda s: s.datum)
    kept.sort(key=lambda s: getattr(s, criterion), reverse=True)  # stable: ties keep datum order
    return tuple(kept[:k])


# ---- decoupled PPO: the clip reference, verl's dual clip and importance weights ------------------


@dataclass
class DecoupledCounts(Counts):
    dual: int = 0


def per_token_decoupled(
    name: str,
    lp: Tensor,
    reference_lp: Tensor,
    adv: Tensor,
    mask: Tensor,
    low: float,
    high: float,
    dual_clip: float | None = None,
    weights: Tensor | None = None,
) -> DecoupledCounts:
    """``ppo`` or ``cispo`` clipping against ``reference_lp`` (the sampler's or the old log-probs),
    one token at a time: the clip decision and its side, the dual clip (ppo, ``A < 0`` and ``A*c``
    strictly above the objective ``min(r*A, clamp(r)*A)``), each token's loss times its weight,
    summed with ``math.fsum``. The ratio is the element-wise ``exp`` of the tensors, as the loss
    forms it."""
    ratio = torch.exp(lp.detach() - reference_lp.detach()).flatten()
    w = [1.0] * ratio.numel() if weights is None else weights.flatten().tolist()
    out = DecoupledCounts()
    terms = []
    for r, a, x, m, weight in zip(
        ratio, adv.flatten(), lp.detach().flatten(), mask.flatten(), w, strict=True
    ):
        if float(m) == 0:
            continue
        out.loss_tokens += 1
        if name == "cispo":
            coefficient = torch.clamp(r, low, high)
            terms.append(-float(coefficient) * float(a) * weight * float(x))
            departs = float(coefficient) != float(r)
            out.clipped += departs
            out.low += departs and float(r) < low
            out.high += departs and float(r) > high
            continue
        unclipped, clipped = float(r * a), float(torch.clamp(r, low, high) * a)
        objective = min(unclipped, clipped)
        if clipped < unclipped:  # clipping bites, whatever the dual clip does (verl's pg_clipfrac)
            out.clipped += 1
            out.low += float(a) < 0
            out.high += float(a) >= 0
        if dual_clip is not None and float(a) < 0 and float(a * dual_clip) > objective:
            out.dual += 1
            objective = float(a * dual_clip)
        terms.append(-objective * weight)
    out.loss = math.fsum(terms)
    return out


def objective_decoupled(
    name: str,
    lp: Tensor,
    reference_lp: Tensor,
    adv: Tensor,
    mask: Tensor,
    low: float,
    high: float,
    dual_clip: float | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """The plain vectorised objective of ``ppo`` / ``cispo`` clipping against ``reference_lp``, with
    the dual clip and the importance weights, for autograd."""
    if name == "cispo":
        scale = torch.clamp(torch.exp(lp - reference_lp).detach(), low, high) * adv
        if weights is not None:
            scale = scale * weights
        return -(scale * lp * mask.to(lp.dtype)).sum()
    ratio = torch.exp(lp - reference_lp)
    objective = torch.minimum(ratio * adv, torch.clamp(ratio, low, high) * adv)
    if dual_clip is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, adv * dual_clip), objective)
    if weights is not None:
        objective = objective * weights
    return -(objective * mask.to(lp.dtype)).sum()


@dataclass
class Verl:
    """verl's ``compute_policy_loss_vanilla`` per token (0.9.1, ``core_algos.py``; without its
    clamp of the log-ratio to [-20, 20]): ``per_token`` (``pg_losses`` times the rollout weights),
    ``clipped`` (the tokens of ``pg_clipfrac``), ``lower`` (those of ``pg_clipfrac_lower``)."""

    per_token: Tensor
    clipped: Tensor
    lower: Tensor


def verl_vanilla(
    lp: Tensor,
    old_lp: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float,
    weights: Tensor | None = None,
) -> Verl:
    """verl's rule as written there (``clip_low`` / ``clip_high`` are verl's ``1 - low`` / ``high - 1``)."""
    ratio = torch.exp(lp - old_lp)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -adv * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(adv < 0, clip_pg_losses2, clip_pg_losses1)
    if weights is not None:
        pg_losses = pg_losses * weights
    return Verl(
        pg_losses, torch.gt(pg_losses2, pg_losses1), torch.gt(clip_pg_losses1, pg_losses3) & (adv < 0)
    )


def near_bounds(lp: Tensor, reference_lp: Tensor, bounds: Iterable[float]) -> Tensor:
    """Tokens whose ratio ``exp(lp - reference_lp)`` lies within 4 ulps of the dtype of a bound, in
    the input dtype or in float64: where another build of ``exp`` may put it on the other side."""
    eps = torch.finfo(lp.dtype).eps
    narrow = torch.exp(lp - reference_lp).double()
    exact = torch.exp(lp.double() - reference_lp.double())
    lo, hi = torch.minimum(narrow, exact), torch.maximum(narrow, exact)
    near = torch.zeros(lp.shape, dtype=torch.bool)
    for b in bounds:
        tol = 4 * eps * max(b, 1e-30)
        near |= (lo - tol <= b) & (b <= hi + tol)
    return near
