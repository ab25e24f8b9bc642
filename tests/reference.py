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
) -> float:
    """How far a float32 loss ``name`` over ``n`` eligible tokens may lie from its exact value, however
    its kernels are built (vector width, loop tails, order of the sum): each per-token term within
    8 roundings of its magnitude (``exp`` to a last bit that differs between vectorised and scalar
    code, then at most four products and differences), and a sum of ``n`` terms in any order within
    ``n - 1`` roundings of the sum of their magnitudes (Higham, *Accuracy and Stability of Numerical
    Algorithms*, 2002, eq. 4.4). Two builds of the same loss lie within twice this of each other."""
    x, s, a = lp.detach().double(), slp.detach().double(), adv.double()
    on = mask.double() != 0
    ratio = torch.exp(x - s)
    terms = {
        "ppo": lambda: torch.minimum(ratio * a, torch.clamp(ratio, low, high) * a).abs(),
        "cispo": lambda: (torch.clamp(ratio, low, high) * a * x).abs(),
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
