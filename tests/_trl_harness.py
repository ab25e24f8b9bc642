"""TRL's real ``GRPOTrainer`` on CPU, small enough for the suite: a two-layer Qwen2 built from a
config and a word-level tokenizer built here (no download), a 32-prompt dataset and a reward that
likes the letter ``a``. ``num_iterations=2``: each generation batch is trained on twice, so the
second pass has old log-probs that differ from the current ones and clipping bites (with one
iteration TRL's ratio is exactly 1); a learning rate of 3e-2 moves the tiny model enough.

:class:`Recording` is a trainer class (built over the cliptrack trainer or TRL's own) that keeps each
training micro-step's per-token tensors, for a reference recomputed from them in the tests.
Run as a script (``accelerate launch ... tests/_trl_harness.py OUT``) it trains the cliptrack
trainer and writes each process's log and tensors to ``OUT/rank<N>.pt``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

import torch

WORDS = "a b c d e f g h 0 1 2 3 say".split()
VOCAB = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}


def tokenizer() -> Any:
    """A left-padding word-level tokenizer over :data:`VOCAB`, built in-process."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.Whitespace(), decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def model(seed: int = 0) -> Any:
    """A two-layer Qwen2 with random weights from ``seed``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def dataset() -> Any:
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"say {c} {d}" for c in "abcdefgh" for d in "0123"]})


def reward(completions: list[str], **kwargs: Any) -> list[float]:
    """The number of ``a`` words, less a tenth per word."""
    return [c.split().count("a") - 0.1 * len(c.split()) for c in completions]


def config(output_dir: str, **overrides: Any) -> Any:
    """The run's ``GRPOConfig``: 4 completions per prompt, 8 tokens at most, two iterations per
    generation, ``max_steps`` optimizer steps (default 6), a log per step, no report, CPU."""
    from trl import GRPOConfig

    ga = overrides.pop("gradient_accumulation_steps", 1)
    values: dict[str, Any] = dict(
        output_dir=output_dir,
        use_cpu=True,
        use_vllm=False,
        report_to=[],
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        num_iterations=2,
        gradient_accumulation_steps=ga,
        steps_per_generation=ga,
        max_steps=6,
        learning_rate=3e-2,
        logging_steps=1,
        save_strategy="no",
        gradient_checkpointing=False,
        ddp_find_unused_parameters=False,
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def reference_bites(
    micro: dict[str, Any], loss_type: str, eps_low: float, eps_high: float
) -> tuple[int, int, int, int]:
    """(loss tokens, clipped, low, high) of one micro-step by TRL's formulas (TRL 1.16
    ``_compute_loss``): PPO clips where ``clamp(r)*A < r*A``; CISPO where ``min(r, eps_high) != r``."""
    logps = micro["logps"]
    old = micro["old"] if micro["old"] is not None else logps
    adv = micro["advantages"]
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    mask = micro["mask"].bool()
    coef_1 = torch.exp(logps - old)
    if loss_type == "cispo":
        low = torch.zeros_like(mask)
        high = (torch.clamp(coef_1, max=eps_high) != coef_1) & mask
    else:
        coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
        bites = (coef_2 * adv < coef_1 * adv) & mask
        low, high = bites & (adv < 0), bites & (adv > 0)
    return int(mask.sum()), int((low | high).sum()), int(low.sum()), int(high.sum())


def recording(base: type) -> type:
    """``base`` (a GRPO trainer class) recording each training micro-step's tensors in
    ``self.micro_steps``: the global step it belongs to, TRL's ``per_token_logps``, the old
    log-probs (``None``: TRL used the current ones), the advantages and the mask."""

    class Recording(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.micro_steps: list[dict[str, Any]] = []
            self._recording = False
            self._logps: torch.Tensor | None = None

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
            if self._recording:
                self._logps = out[0].detach().clone()
            return out

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            self._recording = True
            try:
                loss = super()._compute_loss(model, inputs)
            finally:
                self._recording = False
            if self.model.training:
                old = inputs.get("old_per_token_logps")
                mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)
                self.micro_steps.append(
                    {
                        "step": self.state.global_step + 1,  # the optimizer step in progress
                        "logps": self._logps,
                        "old": None if old is None else old.detach().clone(),
                        "advantages": inputs["advantages"].detach().clone(),
                        "mask": mask.detach().clone(),
                    }
                )
            return loss

    return Recording


def train(base: type, output_dir: str | None = None, *, tracker: Any = None, **overrides: Any) -> Any:
    """Train ``recording(base)`` for the configured steps from seed 0; return the trainer."""
    output_dir = output_dir or tempfile.mkdtemp(prefix="trl-run-")
    kwargs: dict[str, Any] = {} if tracker is None else {"tracker": tracker}
    trainer = recording(base)(
        model=model(),
        reward_funcs=reward,
        args=config(output_dir, **overrides),
        train_dataset=dataset(),
        processing_class=tokenizer(),
        **kwargs,
    )
    trainer.train()
    return trainer


def parameters(trainer: Any) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def main(out_dir: str) -> None:
    """One process of a distributed run: the cliptrack trainer, its log and tensors saved."""
    from cliptrack.adapters.trl import GRPOTrainer

    ga = int(os.environ.get("GA", "1"))
    trainer = train(GRPOTrainer, tempfile.mkdtemp(prefix="trl-dist-"), gradient_accumulation_steps=ga)
    rank = trainer.accelerator.process_index
    torch.save(
        {
            "world": trainer.accelerator.num_processes,
            "log_history": trainer.state.log_history,
            "micro_steps": trainer.micro_steps,
            "parameters": parameters(trainer),
        },
        os.path.join(out_dir, f"rank{rank}.pt"),
    )


if __name__ == "__main__":
    main(sys.argv[1])
