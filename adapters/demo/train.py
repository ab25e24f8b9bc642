"""The demo's training loop, once per backend path, with a different amount of off-policyness.

Both paths train the same policy on the same task with the same seed. Each step samples a batch
(from a sampler that may lag the trained policy by ``staleness`` steps), then runs ``epochs``
optimisation passes over it; every pass after the first is off-policy, so the ratio drifts and
clipping bites. The gradient is that of the token mean over the step's batch in both paths.

* Megatron path: :func:`cliptrack.adapters.megatron.make_loss_func` per micro-batch (micro-batches of
  unequal sizes), the reports reduced by :func:`cliptrack.adapters.megatron.reduce_losses`. With
  megatron-core installed, the micro-batches run through Megatron-Core's own
  ``get_forward_backward_func()`` schedule, the policy wrapped as a ``MegatronModule``, on a
  one-rank gloo ``parallel_state`` (on CPU through :mod:`cliptrack.adapters.demo.megatron_cpu`, which says
  why); without it, through a plain micro-batch loop. :attr:`StepResult.schedule` names which ran.
* Miles-runtime path: the runtime's :func:`cliptrack.adapters.miles.forward_backward_loss` per chunk of
  datums (one datum per completion, trimmed to its own length), the per-datum outputs sent over
  JSON as a REST frontend would and summed per client by :class:`cliptrack.adapters.miles.ClientAggregator`.

Every step's output carries the on-policy gauge beside the clip counts. The demo's Miles run
samples from a policy two steps stale (``staleness=2``, ``cliptrack demo --miles-staleness``), so
its ``kl_k3:mean`` and ``abs_log_ratio:mean`` sit well above the Megatron run's (about 6x the k3
KL over 40 steps of the default task); :class:`OnPolicy` sums a run's steps into those numbers.
Each batch carries the trainer's log-probs at the sampling weights and the weight-version lag, so
the gauge is split into its causes: the Miles run's extra KL shows in the drift part (staleness),
and the engine part is about 0 on both paths (trainer and sampler share the code here).
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from cliptrack.adapters.demo import megatron_cpu
from cliptrack.adapters.demo.task import Policy, Rollout, TaskConfig, rollout
from cliptrack.adapters.losses.output import ForwardBackwardOutput, merge_outputs
from cliptrack.adapters.losses.recipe import recipe_of
from cliptrack.core import keys
from cliptrack.core.worst import DEFAULT_K, Worst, merge_worst
from torch import Tensor

PATHS = ("megatron", "miles")
"""The two backend paths the demo trains through."""


@dataclass(frozen=True)
class RunConfig:
    """One demo run. ``steps`` training steps of ``prompts_per_step * group_size`` completions."""

    path: str
    loss: str = "ppo"
    steps: int = 150
    epochs: int = 4
    staleness: int = 0
    prompts_per_step: int = 16
    group_size: int = 4
    micro_batches: int = 4
    datums_per_chunk: int = 24
    learning_rate: float = 3e-3
    seed: int = 0
    threads: int = 1
    """torch intra-op threads while training: the policy's tensors are a few thousand floats, so
    more threads only add synchronisation (on a busy machine, spinning workers make each op many
    times slower); results do not depend on it."""
    task: TaskConfig = field(default_factory=TaskConfig)

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {PATHS}, got {self.path!r}")
        if self.loss not in ("ppo", "cispo"):
            raise ValueError(f"the demo trains with a clipping loss, 'ppo' or 'cispo'; got {self.loss!r}")
        for name in (
            "steps",
            "epochs",
            "prompts_per_step",
            "group_size",
            "micro_batches",
            "datums_per_chunk",
            "threads",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0 steps, got {self.staleness}")

    def as_config(self) -> dict[str, Any]:
        """The run's configuration, for the tracker, with the recipe its counts are measured under
        (the loss's defaults; every path divides the step's summed loss by its tokens)."""
        return {
            **recipe_of(self.loss, aggregation="token-mean").as_config(),
            "path": self.path,
            "loss": self.loss,
            "steps": self.steps,
            "epochs": self.epochs,
            "staleness": self.staleness,
            "prompts_per_step": self.prompts_per_step,
            "group_size": self.group_size,
            "micro_batches": self.micro_batches,
            "datums_per_chunk": self.datums_per_chunk,
            "learning_rate": self.learning_rate,
            "seed": self.seed,
            "threads": self.threads,
            "task": vars(self.task),
        }


@dataclass(frozen=True)
class StepResult:
    """One training step: its merged output and the metrics logged beside the clip series."""

    step: int
    output: ForwardBackwardOutput
    metrics: dict[str, float]
    schedule: str = ""
    """What ran the step's micro-batches (:data:`SCHEDULE_LOOP`, :data:`SCHEDULE_MILES` or the
    Megatron-Core schedule function's dotted name)."""
    checkpoint: dict[str, Tensor] | None = None
    """The last step's only: the trained policy's weights after it (a state dict copy)."""
    sampler: dict[str, Tensor] | None = None
    """The last step's only: the weights its batch was sampled with (``staleness`` steps behind the
    weights it started from)."""
    worst: Worst | None = None
    """The step's worst sequences over its epochs (datum id: the completion's index in the step's
    batch; a completion ranks by its worst epoch), found on each path's own way: Megatron's
    :func:`cliptrack.adapters.megatron.reduce_step`, the Miles client aggregator's ``emit_step``."""


@dataclass(frozen=True)
class OnPolicy:
    """How far off-policy a run's steps so far were, and why: ratios of its sums over every step.

    ``staleness``: steps the sampler lagged the trained policy. ``loss_tokens`` and
    ``clipped_tokens``: summed tokens; ``kl_k3_sum`` and ``abs_log_ratio_sum``: the gauge's sums
    (nats), ``ratio_outside_tokens``: tokens with a ratio outside [1/2, 2]; ``engine_kl_k3_sum``
    and ``drift_kl_k3_sum``: the k3 sums of the gauge's engine and drift parts (nats);
    ``weight_lag_sum``: the summed weight-version lag (versions x tokens). :meth:`add` a step's
    result; the properties are the run's clip fraction, mean k3 KL(sampler || trainer), mean
    ``|l|`` per eligible token and the parts' means (``None`` before any token).
    """

    staleness: int = 0
    loss_tokens: int = 0
    clipped_tokens: int = 0
    ratio_outside_tokens: int = 0
    kl_k3_sum: float = 0.0
    abs_log_ratio_sum: float = 0.0
    engine_kl_k3_sum: float = 0.0
    drift_kl_k3_sum: float = 0.0
    weight_lag_sum: float = 0.0

    def add(self, result: StepResult) -> OnPolicy:
        """These sums plus one step's (its merged output's ``loss_tokens:sum``, ``clipped_tokens:sum``,
        ``ratio_outside_tokens:sum``, ``kl_k3:sum``, ``abs_log_ratio:sum`` and, where carried, the
        parts' ``engine_kl_k3:sum``, ``drift_kl_k3:sum`` and ``weight_lag:sum``)."""
        m = result.output.metrics
        return OnPolicy(
            self.staleness,
            self.loss_tokens + int(m[keys.LOSS_TOKENS]),
            self.clipped_tokens + int(m[keys.CLIPPED_TOKENS]),
            self.ratio_outside_tokens + int(m[keys.RATIO_OUTSIDE_TOKENS]),
            math.fsum((self.kl_k3_sum, m[keys.KL_K3_SUM])),
            math.fsum((self.abs_log_ratio_sum, m[keys.ABS_LOG_RATIO_SUM])),
            math.fsum((self.engine_kl_k3_sum, m.get(keys.ENGINE_KL_K3_SUM, 0.0))),
            math.fsum((self.drift_kl_k3_sum, m.get(keys.DRIFT_KL_K3_SUM, 0.0))),
            math.fsum((self.weight_lag_sum, m.get(keys.WEIGHT_LAG_SUM, 0.0))),
        )

    def _mean(self, total: float) -> float | None:
        return total / self.loss_tokens if self.loss_tokens else None

    @property
    def clip_fraction(self) -> float | None:
        return self.clipped_tokens / self.loss_tokens if self.loss_tokens else None

    @property
    def kl_k3(self) -> float | None:
        """Mean k3 KL(sampler || trainer) per eligible token, in nats."""
        return self._mean(self.kl_k3_sum)

    @property
    def abs_log_ratio(self) -> float | None:
        """Mean ``|logprobs - sampling_logprobs|`` per eligible token, in nats."""
        return self._mean(self.abs_log_ratio_sum)

    @property
    def engine_kl_k3(self) -> float | None:
        """Mean k3 KL of the engine part (sampler against the trainer at the sampling weights), nats."""
        return self._mean(self.engine_kl_k3_sum)

    @property
    def drift_kl_k3(self) -> float | None:
        """Mean k3 KL of the drift part (the trainer at the sampling weights against the trainer), nats."""
        return self._mean(self.drift_kl_k3_sum)

    @property
    def weight_lag(self) -> float | None:
        """Mean weight-version lag per eligible token, in versions (steps)."""
        return self._mean(self.weight_lag_sum)

    def describe(self) -> str:
        """One line: the run's clip fraction and gauge, its split into engine and drift, and its
        sampler's staleness."""
        if not self.loss_tokens:
            return "no eligible token yet"
        return (
            f"clip fraction {self.clip_fraction:.4f}, mismatch KL (k3) {self.kl_k3:.5f} "
            f"(engine part {self.engine_kl_k3:.5f}, drift part {self.drift_kl_k3:.5f}), "
            f"mean |log ratio| {self.abs_log_ratio:.4f} (sampler {self.staleness} step(s) stale, "
            f"mean weight lag {self.weight_lag:.2f})"
        )


SCHEDULE_LOOP = "plain micro-batch loop (megatron-core not installed)"
SCHEDULE_MILES = "cliptrack.adapters.miles.forward_backward_loss (Miles runtime)"


StepFn = Callable[
    [Policy, torch.optim.Optimizer, Rollout, RunConfig, int], tuple[list[ForwardBackwardOutput], Worst | None]
]
"""One training step of a path: its outputs (one per epoch, or one for the step) and its worst sequences."""


def train(run: RunConfig, *, use_schedule: bool | None = None) -> Iterator[StepResult]:
    """Train one run; yield each step's result as soon as the step is done.

    ``use_schedule`` (Megatron path): ``None`` picks Megatron-Core's schedule when megatron-core is
    installed, ``True`` forces it, ``False`` runs the plain loop. The schedule runs in
    :func:`cliptrack.adapters.demo.megatron_cpu.megatron_session` (set up here unless already initialised).
    torch runs ``run.threads`` intra-op threads meanwhile; the previous setting is restored after.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(run.threads)
    try:
        yield from _train_path(run, use_schedule)
    finally:
        torch.set_num_threads(previous_threads)


def _train_path(run: RunConfig, use_schedule: bool | None) -> Iterator[StepResult]:
    if run.path == "megatron" and (use_schedule if use_schedule is not None else megatron_cpu.available()):
        with megatron_cpu.megatron_session():
            yield from _train(run, _MegatronScheduleStep())
        return
    yield from _train(run, _megatron_loop_step if run.path == "megatron" else MilesClient(run).step)


def _train(run: RunConfig, step_fn: StepFn) -> Iterator[StepResult]:
    torch.manual_seed(run.seed)
    generator = torch.Generator().manual_seed(run.seed)
    policy = Policy(run.task)
    optimizer = torch.optim.Adam(policy.parameters(), lr=run.learning_rate)
    history: deque[dict[str, Tensor]] = deque(maxlen=run.staleness + 1)
    sampler = Policy(run.task)
    for step in range(run.steps):
        history.append(copy.deepcopy(policy.state_dict()))
        sampler.load_state_dict(history[0])  # the oldest kept weights: ``staleness`` steps behind
        start = time.perf_counter()
        batch = rollout(sampler, run.task, run.prompts_per_step, run.group_size, generator)
        _recompute_old(batch, sampler, lag=len(history) - 1)
        outputs, worst = step_fn(policy, optimizer, batch, run, step)
        output = merge_outputs(outputs)
        seconds = time.perf_counter() - start
        metrics = {
            keys.REWARD: float(batch.reward.mean()),
            keys.THROUGHPUT: output.metrics[keys.LOSS_TOKENS] / seconds,
            keys.STEP_TIME: seconds,
        }
        last = step == run.steps - 1
        yield StepResult(
            step,
            output,
            metrics,
            schedule=getattr(step_fn, "schedule", "")
            or (SCHEDULE_MILES if run.path == "miles" else SCHEDULE_LOOP),
            checkpoint=copy.deepcopy(policy.state_dict()) if last else None,
            sampler=history[0] if last else None,
            worst=worst,
        )


def _recompute_old(batch: Rollout, sampler: Policy, lag: int) -> None:
    """Set the batch's ``old_logprobs`` (the trainer's forward at the sampling weights, as a PPO
    trainer recomputes them; here trainer and sampler share the code, so the engine part of the
    gauge is about 0) and its ``weight_lag`` (``lag`` steps on every token)."""
    with torch.no_grad():
        batch.old_logprobs = sampler(batch.prompts, batch.tokens)
    batch.weight_lag = torch.full_like(batch.mask, float(lag))


def _micro_batch_bounds(sequences: int, parts: int) -> list[tuple[int, int]]:
    """Unequal micro-batches: sizes 1, 2, ... in proportion, covering all ``sequences``."""
    parts = min(parts, sequences)
    weights = list(range(1, parts + 1))
    cuts = [0]
    for i in range(1, parts):
        cuts.append(max(cuts[-1] + 1, round(sequences * sum(weights[:i]) / sum(weights))))
    cuts.append(sequences)
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _loss_inputs(batch: Rollout, lo: int, hi: int) -> dict[str, Tensor]:
    inputs = {
        "sampling_logprobs": batch.sampling_logprobs[lo:hi],
        "advantages": batch.advantages[lo:hi],
        "mask": batch.mask[lo:hi],
    }
    if batch.old_logprobs is not None and batch.weight_lag is not None:
        inputs["old_logprobs"] = batch.old_logprobs[lo:hi]
        inputs["weight_lag"] = batch.weight_lag[lo:hi]
    return inputs


def _loss_func(run: RunConfig, batch: Rollout, lo: int, hi: int) -> Any:
    """The Megatron path's loss function of sequences ``lo:hi``, with their gauge rows (datum ids:
    their indices in the step's batch)."""
    from cliptrack.adapters.megatron import make_loss_func

    return make_loss_func(
        run.loss, _loss_inputs(batch, lo, hi), sequences=True, datum_ids=torch.arange(lo, hi)
    )


def _step_worst(step: int, passes: list[Worst | None]) -> Worst | None:
    """The step's worst sequences over its epochs (each completion by its worst epoch)."""
    found = [w.by for w in passes if w is not None]
    return Worst(step, DEFAULT_K, merge_worst(found, DEFAULT_K)) if found else None


def _megatron_loop_step(
    policy: Policy, optimizer: torch.optim.Optimizer, batch: Rollout, run: RunConfig, step: int
) -> tuple[list[ForwardBackwardOutput], Worst | None]:
    from cliptrack.adapters.megatron import reduce_step

    total_tokens = float(batch.mask.sum())
    outputs, passes = [], []
    for _ in range(run.epochs):
        optimizer.zero_grad(set_to_none=True)
        reports = []
        for lo, hi in _micro_batch_bounds(batch.sequences, run.micro_batches):
            loss, _num_tokens, report = _loss_func(run, batch, lo, hi)(
                policy(batch.prompts[lo:hi], batch.tokens[lo:hi])
            )
            (loss / total_tokens).backward()  # token mean over the step's batch
            reports.append(report)
        optimizer.step()
        reduced = reduce_step(reports, group=None, step=step)
        assert reduced.output is not None
        outputs.append(reduced.output)
        passes.append(reduced.worst)
    return outputs, _step_worst(step, passes)


def _megatron_model(policy: Policy) -> Any:
    """The policy as Megatron-Core's schedule expects a model: a ``MegatronModule`` with its config."""
    from megatron.core.enums import ModelType
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=policy.task.hidden,
        num_attention_heads=1,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
        calculate_per_token_loss=True,
    )

    class MegatronPolicy(MegatronModule):
        """The demo policy on Megatron-Core's side: first and last pipeline stage at once."""

        def __init__(self) -> None:
            super().__init__(config)
            self.policy = policy
            self.model_type = ModelType.encoder_or_decoder

        def set_input_tensor(self, tensor: Any) -> None:  # first and last stage: nothing to receive
            pass

        def forward(self, prompts: Tensor, tokens: Tensor) -> Tensor:
            return self.policy(prompts, tokens)

    return MegatronPolicy()


class _MegatronScheduleStep:
    """The Megatron path's step through Megatron-Core's ``get_forward_backward_func()``."""

    def __init__(self) -> None:
        self.schedule = ""
        self.model: Any = None

    def __call__(
        self, policy: Policy, optimizer: torch.optim.Optimizer, batch: Rollout, run: RunConfig, step: int
    ) -> tuple[list[ForwardBackwardOutput], Worst | None]:
        from cliptrack.adapters.megatron import reduce_step
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if self.model is None or self.model.policy is not policy:
            self.model = _megatron_model(policy)
        total_tokens = float(batch.mask.sum())
        bounds = _micro_batch_bounds(batch.sequences, run.micro_batches)

        def forward_step(data_iterator: Iterator[tuple[int, int]], model: Any) -> tuple[Tensor, Any]:
            lo, hi = next(data_iterator)
            output = model(batch.prompts[lo:hi], batch.tokens[lo:hi])
            return output, _loss_func(run, batch, lo, hi)

        outputs, passes = [], []
        for _ in range(run.epochs):
            optimizer.zero_grad(set_to_none=True)
            forward_backward = get_forward_backward_func()
            self.schedule = f"{forward_backward.__module__}.{forward_backward.__name__}"
            with megatron_cpu.cpu_redirect():
                reports = forward_backward(
                    forward_step_func=forward_step,
                    data_iterator=iter(bounds),
                    model=[self.model],
                    num_microbatches=len(bounds),
                    seq_length=run.task.length,
                    micro_batch_size=1,
                )
            # calculate_per_token_loss: the schedule back-propagates summed losses; divide by the
            # step's tokens as finalize_model_grads would, for the token mean over the batch.
            for parameter in policy.parameters():
                if parameter.grad is not None:
                    parameter.grad /= total_tokens
            optimizer.step()
            reduced = reduce_step(reports, step=step)
            assert reduced.output is not None, "one process is the last pipeline stage"
            outputs.append(reduced.output)
            passes.append(reduced.worst)
        return outputs, _step_worst(step, passes)


def _datum(batch: Rollout, i: int, length: int) -> dict[str, Any]:
    """Completion ``i`` as a Miles datum's ``loss_fn_inputs``, trimmed to its ``length`` (its id: its
    index in the step's batch)."""
    datum: dict[str, Any] = {
        keys.DATUM_ID: [i],
        "target_tokens": batch.tokens[i, :length],
        "logprobs": batch.sampling_logprobs[i, :length],
        "advantages": batch.advantages[i, :length],
    }
    if batch.old_logprobs is not None and batch.weight_lag is not None:
        datum["old_logprobs"] = batch.old_logprobs[i, :length]
        datum["weight_lag"] = batch.weight_lag[i, :length]
    return datum


class MilesClient:
    """The Miles path: a runtime computing per-datum losses, a client summing them per run."""

    def __init__(self, run: RunConfig, client_id: str | None = None) -> None:
        from cliptrack.adapters.miles import ClientAggregator

        self.client_id = client_id or f"demo-{run.path}-{run.seed}"
        self.aggregator = ClientAggregator()
        self.aggregator.register(self.client_id)

    def step(
        self, policy: Policy, optimizer: torch.optim.Optimizer, batch: Rollout, run: RunConfig, step: int
    ) -> tuple[list[ForwardBackwardOutput], Worst | None]:
        from cliptrack.adapters.miles import forward_backward_loss, output_from_json, output_to_json

        lengths = [int(n) for n in batch.mask.sum(dim=1).long()]
        total_tokens = float(sum(lengths))
        for _ in range(run.epochs):
            optimizer.zero_grad(set_to_none=True)
            for lo in range(0, batch.sequences, run.datums_per_chunk):
                hi = min(lo + run.datums_per_chunk, batch.sequences)
                current = policy(batch.prompts[lo:hi], batch.tokens[lo:hi])
                datums = [_datum(batch, i, lengths[i]) for i in range(lo, hi)]
                result = forward_backward_loss(
                    datums, [current[i - lo, : lengths[i]] for i in range(lo, hi)], run.loss
                )
                (result.loss / total_tokens).backward()
                reply = output_from_json(output_to_json(result.output))  # over the wire, as over HTTP
                self.aggregator.add(self.client_id, step, reply)
            optimizer.step()
        emitted = self.aggregator.emit_step(self.client_id, step)
        return [emitted.output], emitted.worst
