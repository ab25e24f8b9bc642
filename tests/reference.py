"""Plain references for the losses: Tinker's formulas without counting, and per-token rules.

``objective_*`` are the vectorised objectives exactly as Tinker documents them, with no counting;
``per_token_*`` apply the clipping rules of docs/CONTRACT.md ("Clip semantics") one token at a
time in plain Python. The ratio is computed once with the same element-wise ``exp`` as the loss
(the only op that is not correctly rounded), everything else per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
