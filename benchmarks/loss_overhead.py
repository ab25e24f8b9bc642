"""Cost of counting clipped tokens: the losses with counting against the same objective without.

Two views, CPU, [64, 2048] tokens, medians of interleaved repeats in one process:
- the loss alone (forward + backward over the logprobs): counting is one extra pass over tensors
  the loss already holds — the harshest view (target ratio <= 1.10);
- a whole forward + backward step of a small policy model whose loss it is (target <= 1.01).
Run: ``python benchmarks/loss_overhead.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adapters import losses  # noqa: E402
from benchmarks._timing import Row, interleaved_medians, markdown  # noqa: E402
from tests import reference  # noqa: E402

SHAPE = (64, 2048)
VOCAB, HIDDEN = 128, 64


def _inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lp = -torch.rand(SHAPE, generator=gen) * 4
    slp = lp + 0.3 * torch.randn(SHAPE, generator=gen)
    adv = torch.randn(SHAPE, generator=gen)
    mask = (torch.rand(SHAPE, generator=gen) > 0.1).float()
    return lp, slp, adv, mask


def run(repeats: int = 30) -> list[Row]:
    torch.manual_seed(0)
    lp, slp, adv, mask = _inputs()
    rows: list[Row] = []
    pairs = {
        "ppo": (lambda x: losses.ppo(x, slp, adv, mask).loss,
                lambda x: reference.objective_ppo(x, slp, adv, mask, 0.8, 1.2)),
        "cispo": (lambda x: losses.cispo(x, slp, adv, mask).loss,
                  lambda x: reference.objective_cispo(x, slp, adv, mask, 0.0, 4.0)),
    }
    for name, (counted, plain) in pairs.items():
        def step(fn):
            x = lp.clone().requires_grad_(True)
            fn(x).backward()

        medians = interleaved_medians({"counted": lambda c=counted: step(c), "plain": lambda p=plain: step(p)},
                                      repeats)
        rows.append(Row(f"{name} loss fwd+bwd, {SHAPE[0]}x{SHAPE[1]} tokens, with counting",
                        medians["counted"], f"{name} objective without counting",
                        medians["counted"] / medians["plain"], "≤ 1.10"))

    # A whole step of a small policy: embedding -> MLP -> log-softmax over the vocabulary.
    tokens = torch.randint(0, VOCAB, SHAPE)
    targets = torch.randint(0, VOCAB, SHAPE)
    policy = torch.nn.Sequential(torch.nn.Embedding(VOCAB, HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN),
                                 torch.nn.Tanh(), torch.nn.Linear(HIDDEN, VOCAB))

    def policy_step(loss_of):
        policy.zero_grad(set_to_none=True)
        logprobs = torch.log_softmax(policy(tokens), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        loss_of(logprobs).backward()

    for name, (counted, plain) in pairs.items():
        medians = interleaved_medians(
            {"counted": lambda c=counted: policy_step(c), "plain": lambda p=plain: policy_step(p)},
            max(5, repeats // 3))
        rows.append(Row(f"{name} whole policy step (fwd+bwd), with counting", medians["counted"],
                        "same step without counting", medians["counted"] / medians["plain"], "≤ 1.01"))
    return rows


if __name__ == "__main__":
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(markdown(run()))
