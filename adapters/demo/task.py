"""The demo's task and policy: count up from a prompt token, learned by RL on CPU in seconds.

A prompt is one token ``p`` of a ``vocab``-token alphabet; a completion is ``length`` tokens and
earns reward = the fraction of positions ``t`` whose token is ``(p + t + 1) % vocab``. The policy
is a tiny autoregressive MLP (prompt, position and previous token embeddings -> logits), small
enough that a whole run takes seconds, real enough that several PPO/CISPO epochs per batch move
the ratio off 1 and clipping bites.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class TaskConfig:
    """Sizes of the toy task: ``vocab`` tokens, ``length`` completion tokens per sequence."""

    vocab: int = 16
    length: int = 8
    hidden: int = 64


class Policy(nn.Module):
    """Autoregressive policy: logits over the vocabulary for each completion position."""

    def __init__(self, task: TaskConfig) -> None:
        super().__init__()
        self.task = task
        self.prompt = nn.Embedding(task.vocab, task.hidden)
        self.position = nn.Embedding(task.length, task.hidden)
        self.previous = nn.Embedding(task.vocab + 1, task.hidden)  # index ``vocab`` = start of completion
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(task.hidden, task.hidden), nn.Tanh())
        self.head = nn.Linear(task.hidden, task.vocab)

    def logits(self, prompts: Tensor, tokens: Tensor) -> Tensor:
        """Teacher-forced logits ``[n, length, vocab]`` for completions ``tokens [n, length]``."""
        n, length = tokens.shape
        start = torch.full((n, 1), self.task.vocab, dtype=tokens.dtype)
        previous = torch.cat([start, tokens[:, :-1]], dim=1)
        hidden = (
            self.prompt(prompts)[:, None, :]
            + self.position(torch.arange(length))[None, :, :]
            + self.previous(previous)
        )
        return self.head(self.body(hidden))

    def forward(self, prompts: Tensor, tokens: Tensor) -> Tensor:
        """Per-token log-probs ``[n, length]`` of ``tokens`` under the policy."""
        logprobs = torch.log_softmax(self.logits(prompts, tokens), dim=-1)
        return logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def sample(self, prompts: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Sample completions; returns ``(tokens [n, length], sampling_logprobs [n, length])``."""
        n = prompts.shape[0]
        tokens = torch.zeros((n, self.task.length), dtype=torch.long)
        for t in range(self.task.length):
            probs = torch.softmax(self.logits(prompts, tokens)[:, t, :], dim=-1)
            tokens[:, t] = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        return tokens, self(prompts, tokens)


def completion_mask(task: TaskConfig, prompts: Tensor) -> Tensor:
    """``[n, length]`` 0/1 mask: prompt ``p`` asks for ``length // 2 + p % (length // 2 + 1)`` tokens.

    Completions of different prompts carry different numbers of loss tokens, as real ones do; the
    positions after the requested length are padding (mask 0).
    """
    half = task.length // 2
    wanted = half + prompts % (half + 1)
    return (torch.arange(task.length)[None, :] < wanted[:, None]).float()


def rewards(task: TaskConfig, prompts: Tensor, tokens: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence reward in [0, 1]: fraction of requested positions counting up from the prompt."""
    target = (prompts[:, None] + torch.arange(1, task.length + 1)[None, :]) % task.vocab
    return ((tokens == target).float() * mask).sum(dim=1) / mask.sum(dim=1)


def group_advantages(reward: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """GRPO-style advantages: each reward minus its group's mean, over the group's std."""
    grouped = reward.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return (centred / (grouped.std(dim=1, keepdim=True, unbiased=False) + eps)).view(-1)


@dataclass
class Rollout:
    """One step's sampled batch. Per-token tensors are ``[sequences, length]``."""

    prompts: Tensor
    tokens: Tensor
    sampling_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    reward: Tensor
    old_logprobs: Tensor | None = None
    """The trainer's log-probs of ``tokens`` at the weights that sampled them (the "old" log-probs
    a PPO trainer recomputes), ``[sequences, length]``; ``None`` until the trainer sets them."""
    weight_lag: Tensor | None = None
    """Each token's weight-version lag: training steps between the weights that sampled it and the
    weights it is trained from, ``[sequences, length]`` (float, whole numbers)."""

    @property
    def sequences(self) -> int:
        return int(self.prompts.shape[0])


def rollout(
    sampler: Policy, task: TaskConfig, prompts_per_step: int, group_size: int, generator: torch.Generator
) -> Rollout:
    """Sample ``group_size`` completions per prompt, score them, normalise advantages per group."""
    prompts = torch.randint(0, task.vocab, (prompts_per_step,), generator=generator).repeat_interleave(
        group_size
    )
    tokens, sampling_logprobs = sampler.sample(prompts, generator)
    mask = completion_mask(task, prompts)
    reward = rewards(task, prompts, tokens, mask)
    advantages = group_advantages(reward, group_size)[:, None].expand_as(sampling_logprobs).contiguous()
    return Rollout(prompts, tokens, sampling_logprobs, advantages, mask, reward)
