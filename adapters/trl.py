"""TRL's ``GRPOTrainer``, with cliptrack's exact clip counts and on-policy gauge beside TRL's metrics.

``from cliptrack.adapters.trl import GRPOTrainer`` is a drop-in subclass of TRL's trainer: the same
constructor plus an optional ``tracker=`` (a :class:`cliptrack.Tracker`, or anything with its
``log`` / ``log_config``). The loss, its gradients and TRL's own metrics are TRL's, untouched:
:meth:`GRPOTrainer._compute_loss` returns what TRL's returns. Beside it, each micro-step's
per-token tensors (TRL's log-probs, its old log-probs, the advantages, its mask, and the sampler's
log-probs and importance weights when TRL has them, i.e. with vLLM) go through cliptrack's core loss
under no grad (:func:`cliptrack.adapters.losses.ppo` or ``cispo``, clipping against the old
log-probs as TRL does), whose counts are packed on device (no host sync per micro-step) and added
over every micro-step of the logging window. At TRL's ``log()`` (every ``logging_steps`` optimizer
steps, called on every process) the window's sums cross the processes in **one** collective, and
the fractions are formed once from the sums: ``clip_fraction:mean``, ``clipped_tokens:sum``,
``loss_tokens:sum``, the low/high split, and the gauge (``kl_k3:mean`` ...) split into its engine
and drift parts by the old log-probs when TRL has sampler log-probs. They join TRL's log dict under
cliptrack's keys (so ``report_to``'s W&B and MLflow get them beside ``clip_ratio/region_mean``) and
go to the tracker when one is given. TRL's ``clip_ratio/*`` are exact within one micro-step but
averaged over the micro-steps of a window; cliptrack's are one ratio of sums over the window.

The loss configuration is recorded in the run (:class:`cliptrack.core.recipe.Recipe`, under
``loss_recipe``: W&B config, MLflow params ``loss_recipe.<field>``, the tracker's config).

Which TRL losses count what (TRL 1.16, ``trl/trainer/grpo_trainer.py::_compute_loss``):

- ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``: PPO's clip, band ``[1 - epsilon, 1 + epsilon_high]``;
- ``cispo``: CISPO's clip of the weight at ``epsilon_high`` (an absolute bound; no lower bound);
- ``sapo`` (a soft gate) and ``vespo`` (a gamma weight): never clip; the gauge alone.

Refused at construction (ValueError naming the option): ``importance_sampling_level="sequence"``
(one ratio per sequence; cliptrack counts tokens against their own ratio), and ``delta`` at or below
``1 + epsilon_high`` (TRL's two-sided clip would then cut positive advantages inside the band).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from cliptrack.adapters.losses.builtin import cispo, importance_sampling, ppo
from cliptrack.adapters.losses.output import LossOutput
from cliptrack.adapters.losses.registry import loss_spec
from cliptrack.adapters.shared.collective import merge_packed
from cliptrack.adapters.shared.merge import ForwardBackwardOutput, measured_sums
from cliptrack.adapters.shared.packing import PackedSums, combine_packed, pack, unpack
from cliptrack.adapters.shared.stack import StackCall
from cliptrack.core import keys, measures
from cliptrack.core.recipe import CONFIG_KEY, OLD, Recipe
from cliptrack.core.sums import MeasuredSums
from cliptrack.core.versions import check_version
from torch import Tensor

__all__ = ["GRPOTrainer"]

MINIMUM = (1, 16)
"""Oldest TRL the hooks were verified on."""
SUPPORTED_BELOW = (1, 17)
"""First TRL release not verified (exclusive bound)."""
USES = (
    "GRPOTrainer._compute_loss, _get_per_token_logps_and_entropies, log and their inputs "
    "(old_per_token_logps, sampling_per_token_logps, importance_sampling_ratio)"
)

PPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
"""TRL loss types that clip as PPO does: ``-min(r*A, clamp(r, 1 - eps, 1 + eps_high)*A)``."""
NEVER_CLIP = ("sapo", "vespo")
"""TRL loss types without a hard clip (a soft gate, a gamma weight): the gauge alone."""


def _trl_version() -> str:
    found = metadata.version("trl")
    return check_version("trl", found, MINIMUM, SUPPORTED_BELOW, USES, "cliptrack.adapters.trl")


@dataclass(frozen=True)
class TRLRecipe:
    """How cliptrack counts one TRL configuration. ``loss``: the core loss counting it (``ppo``,
    ``cispo``, ``importance_sampling`` for a loss that never clips); ``clip_low`` / ``clip_high``:
    absolute ratio bounds of ``exp(logprobs - old_logprobs)`` (``None`` without a clip);
    ``dual_clip``: TRL's ``delta``; ``importance_sampling_correction``: TRL multiplies each token's
    loss by vLLM's importance weight; ``loss_type``: TRL's, which also names its aggregation."""

    loss: str
    loss_type: str
    clip_low: float | None
    clip_high: float | None
    dual_clip: float | None
    importance_sampling_correction: bool

    def recipe(self) -> Recipe:
        """The run's :class:`cliptrack.core.recipe.Recipe` (clip reference ``old``, aggregation ``trl:<loss_type>``)."""
        return Recipe(
            loss=self.loss,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            dual_clip=self.dual_clip,
            clip_reference=OLD,
            aggregation=f"trl:{self.loss_type}",
        )

    def config(self) -> dict[str, dict[str, Any]]:
        """The run config recording the recipe: ``{"loss_recipe": {field: value}}``, with
        ``importance_sampling_correction`` (on/off) beside the recipe's fields."""
        config = self.recipe().as_config()
        config[CONFIG_KEY]["importance_sampling_correction"] = self.importance_sampling_correction
        return config


def recipe_of(args: Any, *, use_vllm: bool | None = None) -> TRLRecipe:
    """The counting recipe of a TRL ``GRPOConfig`` ``args``; ValueError naming an option cliptrack
    cannot count exactly (``importance_sampling_level="sequence"``, ``delta <= 1 + epsilon_high``)
    or an unknown ``loss_type``."""
    loss_type = str(args.loss_type)
    eps_low = float(args.epsilon)
    eps_high = float(args.epsilon_high if args.epsilon_high is not None else args.epsilon)
    if args.importance_sampling_level != "token":
        raise ValueError(
            f"importance_sampling_level={args.importance_sampling_level!r} is not supported by "
            "cliptrack.adapters.trl: TRL then clips one ratio per sequence, and cliptrack counts tokens "
            "against their own ratio (use importance_sampling_level='token', TRL's default)"
        )
    vllm = bool(args.use_vllm if use_vllm is None else use_vllm)
    correction = vllm and bool(args.vllm_importance_sampling_correction) and loss_type != "vespo"
    delta = None if args.delta is None else float(args.delta)
    if loss_type in PPO_LOSS_TYPES:
        if delta is not None and delta <= 1 + eps_high:
            raise ValueError(
                f"delta={delta!r} is at or below 1 + epsilon_high = {1 + eps_high!r}: TRL's two-sided clip "
                "would cut positive advantages inside the band, which cliptrack cannot count as a clip "
                "(TRL recommends delta > 1 + epsilon)"
            )
        return TRLRecipe("ppo", loss_type, 1 - eps_low, 1 + eps_high, delta, correction)
    if loss_type == "cispo":
        return TRLRecipe("cispo", loss_type, 0.0, eps_high, None, correction)
    if loss_type in NEVER_CLIP:
        return TRLRecipe("importance_sampling", loss_type, None, None, None, correction)
    raise ValueError(
        f"loss_type={loss_type!r} is not a TRL loss type cliptrack knows ({PPO_LOSS_TYPES}, cispo, sapo, vespo)"
    )


@dataclass(frozen=True)
class Measured:
    """One micro-step measured: the core loss's ``output`` (detached) and whether its gauge is
    against the sampler's log-probs (``gauge``; else it is not logged)."""

    output: LossOutput
    gauge: bool


@torch.no_grad()
def measure_micro_step(
    recipe: TRLRecipe,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    sampling_logprobs: Tensor | None = None,
    importance_weights: Tensor | None = None,
) -> Measured:
    """One TRL micro-step through cliptrack's core loss, detached: ``logprobs`` (TRL's
    ``per_token_logps``, ``[B, T]``), ``old_logprobs`` (``old_per_token_logps``: the trainer's
    log-probs at the weights that sampled, the clip reference), ``advantages`` (``[B]`` or
    ``[B, T]``), ``mask`` (TRL's ``completion_mask * tool_mask``), ``sampling_logprobs`` (vLLM's,
    when TRL has them; a token vLLM could not score, NaN, is measured against ``old_logprobs``: engine
    part 0) and ``importance_weights`` (TRL's ``importance_sampling_ratio``, ``[B, T]`` or ``[B, 1]``,
    when it corrects by it). The clip counts are always measured; the gauge only against the
    sampler's log-probs (its engine/drift split by the old log-probs).
    """
    logprobs, old = logprobs.detach(), old_logprobs.detach()
    adv = advantages.detach()
    adv = (adv.unsqueeze(1) if adv.dim() == 1 else adv).expand_as(logprobs)
    sampler = None
    if sampling_logprobs is not None:  # a token vLLM could not score (NaN) is measured against old
        sampler = torch.where(torch.isnan(sampling_logprobs), old, sampling_logprobs.detach())
    options: dict[str, Any] = {"old_logprobs": old}
    if recipe.loss != "importance_sampling":  # decoupled: clipped against the old log-probs
        options.update(clip_low_threshold=recipe.clip_low, clip_high_threshold=recipe.clip_high)
        options["clip_reference"] = OLD
        if recipe.dual_clip is not None:
            options["dual_clip"] = recipe.dual_clip
        if importance_weights is not None:  # they change the loss, never a count
            options["importance_weights"] = importance_weights.detach().expand_as(logprobs)
    loss = {"ppo": ppo, "cispo": cispo, "importance_sampling": importance_sampling}[recipe.loss]
    return Measured(
        loss(logprobs, old if sampler is None else sampler, adv, mask, **options), sampler is not None
    )


class ExactWindow:
    """The packed sums of a logging window's micro-steps on device (:func:`pack`, combined with
    :func:`combine_packed`: no host sync), reduced across processes once per window."""

    def __init__(self) -> None:
        self._packed: Tensor | None = None
        self._declaration = measures.DEFAULT
        self.gauge = True
        """Whether every micro-step of the window had the sampler's log-probs."""

    def add(self, out: LossOutput, *, gauge: bool) -> None:
        """Add one micro-step's output; ``gauge``: it had the sampler's log-probs."""
        packed = pack(out)
        if self._packed is None:
            self._packed, self._declaration = packed, out.declaration
        else:
            self._packed = combine_packed(torch.stack([self._packed, packed]), self._declaration)
        self.gauge = self.gauge and gauge

    @property
    def empty(self) -> bool:
        return self._packed is None

    def reduce(self, where: str) -> MeasuredSums | None:
        """The window's exact sums over every process (one collective when torch.distributed runs
        more than one), then the window restarts; ``None`` for an empty window (the same on every
        process: they run the same micro-steps). ValueError for invalid loss inputs."""
        packed, gauge = self._packed, self.gauge
        self._packed, self.gauge = None, True
        if packed is None:
            return None
        counts = reduce_packed(packed, where, self._declaration).counts
        return counts if gauge else counts.without(measures.GAUGE)


def reduce_packed(
    packed: Tensor, where: str, declaration: measures.Declaration = measures.DEFAULT
) -> PackedSums:
    """A packed vector of ``declaration`` (:func:`cliptrack.adapters.shared.packing.pack`) summed
    over every process of the default group (one collective, when torch.distributed runs more than
    one) and read on the host; ValueError for invalid loss inputs, naming ``where``."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        packed = merge_packed(packed, None, declaration)
    sums = unpack(packed.tolist(), where, declaration)
    sums.check()
    return sums


def read_back(logged: Mapping[str, Any]) -> MeasuredSums | None:
    """cliptrack's exact sums from one entry of TRL's log (``trainer.state.log_history``, or a
    row as ``report_to`` logged it without its ``train/`` prefix); ``None`` when it carries none."""
    return MeasuredSums.from_metrics({k: v for k, v in logged.items() if isinstance(v, int | float)})


@dataclass(frozen=True)
class TRLStack:
    """TRL as a :class:`cliptrack.adapters.shared.stack.Stack`: the loss hook is one micro-step's
    count by the registered core loss (its report: the output, detached sums on device), the
    reduction the trainer's (the micro-steps' packed sums added, one collective over the processes,
    :func:`reduce_packed`), the read-back the output's measured sums (or a TRL log entry's,
    :func:`read_back`); the measures: ``declaration``'s."""

    name: str = "trl"
    declaration: measures.Declaration = measures.DEFAULT

    def loss_hook(
        self, loss_fn: str, logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]
    ) -> StackCall:
        spec = loss_spec(loss_fn)
        if spec is None:
            raise ValueError(f"loss_fn {loss_fn!r} is not a registered loss")
        spec.check_arguments(inputs, config)
        extra = {} if self.declaration is measures.DEFAULT else {"declaration": self.declaration}
        out = spec.check_output(spec.fn(logprobs, **inputs, **config, **extra))
        return StackCall(out.loss, out)

    def reduce(self, reports: Sequence[Any]) -> ForwardBackwardOutput:
        if not reports:
            raise ValueError("a step needs at least one micro-step's report")
        packed = combine_packed(torch.stack([pack(out) for out in reports]), self.declaration)
        sums = reduce_packed(packed, "TRL step", self.declaration)
        metrics = {keys.LOSS_SUM: sums.loss_sum, **sums.counts.to_metrics()}
        return ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics=metrics)

    def read_back(self, output: object) -> MeasuredSums | None:
        if isinstance(output, Mapping):
            return read_back(output)
        return measured_sums(output, self.declaration)


STACK = TRLStack()
"""TRL as a stack (:class:`TRLStack`)."""


class _RecipeHook:
    """Records the loss recipe in the run when training begins (after ``report_to``'s callbacks,
    which open their runs then); a ``TrainerCallback`` through :func:`_trainer_class`."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self.trainer.record_recipe()


if TYPE_CHECKING:  # the mixin's base is TRL's trainer, chosen at run time (_trainer_class)
    from typing import Any as _TrainerBase
else:
    _TrainerBase = object


class _Counting(_TrainerBase):
    """What cliptrack's ``GRPOTrainer`` adds to TRL's (a mixin placed before ``trl.GRPOTrainer``).

    ``tracker``: optional :class:`cliptrack.Tracker` (or anything with ``log(step, metrics)`` and
    ``log_config(config)``): it receives cliptrack's metrics at TRL's ``global_step`` on the main
    process, and the loss recipe when training begins. Every other argument is TRL's.
    """

    _recipe_callback: type

    def __init__(self, *args: Any, tracker: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cliptrack_recipe = recipe_of(self.args, use_vllm=self.use_vllm)
        self.cliptrack_tracker = tracker
        self._cliptrack_window = ExactWindow()
        self._cliptrack_logps: Tensor | None = None
        self._cliptrack_in_loss = False
        self.add_callback(self._recipe_callback(self))

    def record_recipe(self) -> None:
        """Record the loss recipe in the run: W&B config and MLflow params through ``report_to``'s
        own callbacks (those open), and the tracker's config."""
        config = self.cliptrack_recipe.config()
        flat = {f"{CONFIG_KEY}.{k}": v for k, v in config[CONFIG_KEY].items()}
        for callback in self.callback_handler.callbacks:
            name = type(callback).__name__
            if name == "WandbCallback" and getattr(callback, "_wandb", None) is not None:
                if callback._wandb.run is not None:
                    callback._wandb.config.update(config, allow_val_change=True)
            elif name == "MLflowCallback" and getattr(callback, "_ml_flow", None) is not None:
                if callback._ml_flow.active_run() is not None:
                    callback._ml_flow.log_params(flat)
        if self.cliptrack_tracker is not None:
            self.cliptrack_tracker.log_config(config)

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._cliptrack_in_loss:
            self._cliptrack_logps = out[0].detach()  # the per_token_logps TRL's loss uses
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        self._cliptrack_in_loss, self._cliptrack_logps = True, None
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._cliptrack_in_loss = False
        if self.model.training and self._cliptrack_logps is not None:
            self._measure(inputs, self._cliptrack_logps)
        self._cliptrack_logps = None
        return loss

    def _measure(self, inputs: Mapping[str, Any], logprobs: Tensor) -> None:
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        old = inputs.get("old_per_token_logps")
        sampling = inputs.get("sampling_per_token_logps")
        weights = (
            inputs.get("importance_sampling_ratio")
            if self.cliptrack_recipe.importance_sampling_correction
            else None
        )
        measured = measure_micro_step(
            self.cliptrack_recipe,
            logprobs,
            logprobs if old is None else old,
            inputs["advantages"],
            mask,
            sampling,
            weights,
        )
        self._cliptrack_window.add(measured.output, gauge=measured.gauge)

    def cliptrack_metrics(self) -> dict[str, float]:
        """The logging window's exact metrics, reduced across processes (every process calls it
        at the same point); ``{}`` for an empty window."""
        counts = self._cliptrack_window.reduce(f"TRL step {self.state.global_step}")
        return {} if counts is None else counts.to_metrics()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        metrics = self.cliptrack_metrics() if self.model.training else {}
        logs.update(metrics)
        super().log(logs, start_time)
        if metrics and self.cliptrack_tracker is not None and self.accelerator.is_main_process:
            reward = logs.get("reward")  # TRL's mean reward of the window's generation batches
            extra = {keys.REWARD: float(reward)} if isinstance(reward, int | float) else {}
            self.cliptrack_tracker.log(self.state.global_step, {**metrics, **extra})


@functools.cache
def _trainer_class() -> type:
    """cliptrack's ``GRPOTrainer``: :class:`_Counting` over TRL's, built on first use (TRL imported
    then; ImportError naming the extra without it; :class:`UnsupportedVersionError` for a TRL
    the hooks were not verified on)."""
    try:
        import trl
        from transformers import TrainerCallback
    except ImportError as exc:
        raise ImportError(
            f"cliptrack.adapters.trl's GRPOTrainer needs TRL ({exc}): pip install 'cliptrack[trl]'"
        ) from exc
    _trl_version()
    callback = type("RecipeCallback", (_RecipeHook, TrainerCallback), {"__module__": __name__})
    namespace = {"__module__": __name__, "__doc__": _DOC, "_recipe_callback": callback}
    return type("GRPOTrainer", (_Counting, trl.GRPOTrainer), namespace)


_DOC = """TRL's ``GRPOTrainer`` with cliptrack's exact counts in its log (:mod:`cliptrack.adapters.trl`):
the same constructor plus an optional ``tracker=`` (see :class:`_Counting`)."""


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":  # TRL imported on first use: the rest of the module needs torch alone
        return _trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


GRPOTrainer: type
"""TRL's ``GRPOTrainer`` with cliptrack's exact counts (built on first use: :func:`_trainer_class`)."""
