"""verl 0.9.1's real PPO update on CPU, for tests: ``TrainingWorker.train_mini_batch`` (the body of
``update_actor``) on a tiny Qwen2 built from a config, one process or gloo ranks.

What it takes to run verl's engine without an accelerator (each step fixes a failure met otherwise):

- verl assumes an NVIDIA device when it finds no accelerator: :func:`use_cpu_platform` installs a
  CPU platform before ``verl.workers.engine.fsdp.transformer_impl`` is imported (it reads the
  device name at import), whose ``current_device()`` is ``"cpu"`` (verl calls
  ``.to(get_device_id())``; 0 would mean cuda:0) and whose collective backend is gloo;
- the FSDP engine is registered for cuda/npu only: ``VERL_ENGINE_DEVICE=cuda``;
- FSDP1 needs a GPU to sync module states: ``strategy="fsdp2"``;
- attention defaults to flash-attention 2: ``attn_implementation="eager"``;
- ``meta_info["temperature"]`` is required;
- the batch's non-tensor entries are those ``RayPPOTrainer._update_actor`` assigns.

Import this module only where verl is importable (tests ``importorskip`` it first).
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

VOCAB = 128
PROMPT = 6
RESPONSE = 8


def use_cpu_platform() -> None:
    """verl's platform set to the CPU (idempotent); call before building a worker."""
    os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")
    os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # the FSDP engine is registered for cuda/npu only
    from verl.plugin.platform.platform_cuda import PlatformCUDA
    from verl.plugin.platform.platform_manager import set_platform

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    module = types.SimpleNamespace(
        max_memory_allocated=zero,
        max_memory_reserved=zero,
        memory_allocated=zero,
        memory_reserved=zero,
        reset_peak_memory_stats=zero,
        empty_cache=zero,
        synchronize=zero,
        mem_get_info=lambda *a: (0, 0),
        get_device_name=lambda *a: "CPU",
        is_available=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: "cpu",
        set_device=zero,
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
    )

    class PlatformCPU(PlatformCUDA):  # type: ignore[misc]
        device_name = vendor_name = "cpu"
        device_module = module

        def current_device(self) -> str:
            return "cpu"

        def communication_backend_name(self) -> str:
            return "gloo"

        def set_device(self, index: Any) -> None:
            pass

        def synchronize(self, index: Any = None) -> None:
            pass

        def empty_cache(self) -> None:
            pass

        def is_available(self) -> bool:
            return True

    set_platform(PlatformCPU())


def init_gloo(rank: int, world_size: int, port: int) -> None:
    """The default process group on gloo over loopback (verl reads RANK, WORLD_SIZE, LOCAL_RANK)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)


def save_tiny_model(path: Path) -> Path:
    """A tiny Qwen2 (2 layers, hidden 32, vocabulary 128) saved at ``path``, seeded."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


@dataclass(frozen=True)
class Setup:
    """One update's configuration: the loss mode and verl's batch sizes (sequences)."""

    loss_mode: str
    mini_batch_size: int
    micro_batch_size_per_gpu: int
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    use_dynamic_bsz: bool = False


def make_worker(model: Path, setup: Setup) -> Any:
    """A ``TrainingWorker`` on the saved model with verl's ``ppo_loss`` for ``setup.loss_mode``
    (as ``ActorRolloutRefWorker`` sets it: ``partial(ppo_loss, config=actor_config)``)."""
    from verl.workers.config import ActorConfig, FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine_workers import TrainingWorker, TrainingWorkerConfig
    from verl.workers.utils.losses import ppo_loss

    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    worker = TrainingWorker(
        TrainingWorkerConfig(
            model_type="language_model",
            model_config=HFModelConfig(
                path=str(model), load_tokenizer=False, override_config={"attn_implementation": "eager"}
            ),
            engine_config=FSDPEngineConfig(
                strategy="fsdp2",
                use_dynamic_bsz=setup.use_dynamic_bsz,
                micro_batch_size_per_gpu=setup.micro_batch_size_per_gpu,
                max_token_len_per_gpu=64,
                use_torch_compile=False,
                mixed_precision=fp32,
            ),
            optimizer_config=FSDPOptimizerConfig(lr=1e-2, total_training_steps=10),
        )
    )
    worker.reset()
    actor = ActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_mini_batch_size=setup.mini_batch_size,
        ppo_micro_batch_size_per_gpu=setup.micro_batch_size_per_gpu,
        clip_ratio_low=setup.clip_ratio_low,
        clip_ratio_high=setup.clip_ratio_high,
        clip_ratio_c=setup.clip_ratio_c,
        loss_agg_mode=setup.loss_agg_mode,
        use_dynamic_bsz=setup.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=64,
        policy_loss={"loss_mode": setup.loss_mode},
    )
    worker.set_loss_fn(partial(ppo_loss, config=actor))
    return worker


@dataclass(frozen=True)
class Batch:
    """A step's batch: prompts, responses (``lengths`` response tokens each), advantages, old
    log-probs, optional rollout log-probs."""

    prompts: torch.Tensor
    responses: torch.Tensor
    lengths: torch.Tensor
    advantages: torch.Tensor
    old_log_probs: torch.Tensor
    rollout_is_weights: torch.Tensor | None = None

    @property
    def response_mask(self) -> torch.Tensor:
        return (torch.arange(RESPONSE) < self.lengths[:, None]).long()


def random_batch(lengths: list[int], seed: int, weights: bool = False) -> Batch:
    """A batch whose responses have ``lengths`` tokens; old log-probs near the tiny model's (uniform
    over 128 tokens: -4.852) with spread 0.5, so that clipping bites on a good share of tokens."""
    generator = torch.Generator().manual_seed(seed)
    size = len(lengths)
    old = torch.full((size, RESPONSE), -4.852) + 0.5 * torch.randn(size, RESPONSE, generator=generator)
    return Batch(
        prompts=torch.randint(1, VOCAB, (size, PROMPT), generator=generator),
        responses=torch.randint(1, VOCAB, (size, RESPONSE), generator=generator),
        lengths=torch.tensor(lengths),
        advantages=torch.randn(size, RESPONSE, generator=generator),
        old_log_probs=old,
        rollout_is_weights=torch.exp(0.1 * torch.randn(size, RESPONSE, generator=generator))
        if weights
        else None,
    )


def tensordict(batch: Batch, setup: Setup, rows: slice | None = None) -> Any:
    """The batch (or its ``rows``) as ``update_actor`` receives it from ``RayPPOTrainer._update_actor``."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    rows = rows or slice(None)
    mask = batch.response_mask[rows]
    prompts, responses = batch.prompts[rows], batch.responses[rows]
    attention = torch.cat([torch.ones_like(prompts), mask], 1)
    data = {
        "input_ids": torch.cat([prompts, responses], 1),
        "prompts": prompts,
        "responses": responses,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(1) - 1).clamp(min=0),
        "response_mask": mask,
        "advantages": batch.advantages[rows],
        "old_log_probs": batch.old_log_probs[rows],
    }
    if batch.rollout_is_weights is not None:
        data["rollout_is_weights"] = batch.rollout_is_weights[rows]
    td = left_right_2_no_padding(
        DataProto.from_single_dict(data, meta_info={"temperature": 1.0}).to_tensordict()
    )
    tu.assign_non_tensor(
        td,
        calculate_entropy=False,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=setup.mini_batch_size,
        mini_batch_size=setup.mini_batch_size,
        epochs=1,
        seed=42,
        dataloader_kwargs={"shuffle": False},
        compute_loss=True,
    )
    return td


def update(worker: Any, td: Any) -> dict[str, Any] | None:
    """One ``update_actor`` body: ``train_mini_batch``, its metrics reduced as the trainer reduces
    them (``reduce_metrics``); ``None`` on ranks without outputs."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics

    output = worker.train_mini_batch(td)
    if output is None:
        return None
    return dict(reduce_metrics(dict(tu.get(output, "metrics"))))


def parameters(worker: Any) -> dict[str, torch.Tensor]:
    """The worker's parameters after its update, full tensors by name."""
    out = {}
    for name, param in worker.engine.module.named_parameters():
        data = param.data
        out[name] = (data.full_tensor() if hasattr(data, "full_tensor") else data).detach().clone()
    return out


class Recorder:
    """A policy loss that records each call's inputs and delegates to registered mode ``mode``;
    registered under ``name`` (per process)."""

    def __init__(self, name: str, mode: str) -> None:
        from verl.trainer.ppo import core_algos

        self.calls: list[dict[str, Any]] = []
        self.mode = mode
        core_algos.register_policy_loss(name)(self)

    def __call__(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> Any:
        from verl.trainer.ppo import core_algos

        loss, metrics = core_algos.get_policy_loss_fn(self.mode)(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights
        )
        self.calls.append(
            {
                "old": old_log_prob.detach().clone(),
                "current": log_prob.detach().clone(),
                "advantages": advantages.detach().clone(),
                "mask": response_mask.detach().clone(),
                "weights": None if rollout_is_weights is None else rollout_is_weights.detach().clone(),
                "metrics": {k: float(v) for k, v in metrics.items()},
            }
        )
        return loss, metrics
