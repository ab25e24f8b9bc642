"""Shared by the Megatron tests: a tiny model of Megatron-Core layers, a global batch, a schedule run.

The model is a vocab-parallel embedding (first pipeline stage) and a column-parallel output layer
with Megatron's vocab-parallel cross entropy (last stage), so tensor and pipeline parallelism run
through Megatron's own layers and p2p code. It is per-token (no attention), so context-parallel
ranks can hold disjoint slices of each sequence. Weights are filled from fixed generators, so
every layout computes the same function, and :func:`reference_logprobs` reproduces it in plain torch.

A global batch is ``n_seq`` sequences of ``seq_len`` tokens. The sampling log-probs are the
reference log-probs shifted by a per-token ``delta`` (the log-ratio), far from the clip thresholds,
so float differences between layouts never move a token across a threshold.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

VOCAB = 32
HIDDEN = 16
SEQ_LEN = 16
MICRO_BATCH = 2
N_MICRO = 3
DELTAS = (-0.6, -0.4, -0.1, 0.0, 0.1, 0.4, 0.6)
"""Log-ratios of the tokens: exp() = 0.55, 0.67, 0.90, 1.0, 1.11, 1.49, 1.82 (PPO band 0.8..1.2)."""

SCENARIOS: dict[str, dict[str, Any]] = {
    "ppo": {"loss_fn": "ppo", "config": {}},
    "ppo_empty_last_rank": {"loss_fn": "ppo", "config": {}, "empty_last_dp_rank": True},
    "cispo": {"loss_fn": "cispo", "config": {"clip_low_threshold": 0.85, "clip_high_threshold": 1.5}},
    "ppo_nothing_clips": {"loss_fn": "ppo", "config": {}, "zero_deltas": True},
    "ppo_causes": {"loss_fn": "ppo", "config": {}, "causes": True},
    "ppo_worst": {"loss_fn": "ppo", "config": {}, "worst": True},
    "cross_entropy": {"loss_fn": "cross_entropy", "config": {}},
}
"""One training step each: the loss and how its global batch is built."""


def _fill(weight: Tensor, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight.copy_(torch.randn(weight.shape, generator=gen, dtype=torch.float32).to(weight.dtype))


def init_embedding(weight: Tensor) -> None:
    _fill(weight, 11)


def init_head(weight: Tensor) -> None:
    _fill(weight, 12)


def full_weights() -> tuple[Tensor, Tensor]:
    """The unsharded embedding [vocab, hidden] and output weight [vocab, hidden]."""
    emb, head = torch.empty(VOCAB, HIDDEN), torch.empty(VOCAB, HIDDEN)
    init_embedding(emb)
    init_head(head)
    return emb, head


def reference_logprobs(tokens: Tensor, labels: Tensor) -> Tensor:
    """Plain-torch log-probs of ``labels`` under the model, shape of ``tokens``."""
    emb, head = full_weights()
    logits = emb[tokens] @ head.T
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()


@dataclass(frozen=True)
class GlobalBatch:
    """Per-token tensors [n_seq, seq_len] of one step's global batch."""

    tokens: Tensor
    labels: Tensor
    sampling_logprobs: Tensor
    advantages: Tensor
    mask: Tensor
    deltas: Tensor
    old_logprobs: Tensor | None = None
    """With ``causes``: the trainer at the sampling weights, half of each token's log-ratio away from
    the sampler (engine part ``deltas / 2``, drift part ``deltas / 2``)."""
    weight_lag: Tensor | None = None
    """With ``causes``: each token's weight-version lag, its row's index mod 3."""


def global_batch(
    scenario: str, n_seq: int, seq_len: int = SEQ_LEN, dp: int = 1, seed: int = 0
) -> GlobalBatch:
    """The step's global batch: ``n_seq = dp * N_MICRO * MICRO_BATCH`` sequences in DP-rank order.

    Masks have a different density per micro-batch; micro-batch 1 of DP rank 0 is all zero. With
    ``empty_last_dp_rank`` every token of the last DP rank is ineligible.
    """
    spec = SCENARIOS[scenario]
    gen = torch.Generator().manual_seed(1000 + seed)
    tokens = torch.randint(0, VOCAB, (n_seq, seq_len), generator=gen)
    labels = torch.randint(0, VOCAB, (n_seq, seq_len), generator=gen)
    deltas = torch.tensor(DELTAS)[torch.randint(0, len(DELTAS), (n_seq, seq_len), generator=gen)]
    if spec.get("zero_deltas"):
        deltas = torch.zeros_like(deltas)
    if spec.get("worst"):  # every sequence's sums distinct: one order whatever the layout's rounding
        deltas = deltas * (1 + 0.01 * torch.arange(n_seq, dtype=torch.float32))[:, None]
    advantages = torch.randint(-1, 2, (n_seq, seq_len), generator=gen).float()
    mask = torch.zeros(n_seq, seq_len)
    for row in range(n_seq):
        micro = row // MICRO_BATCH
        density = 0.25 + 0.7 * ((micro * 5 + 3) % 7) / 6  # varies by micro-batch
        mask[row] = (torch.rand(seq_len, generator=gen) < density).float()
    if n_seq >= 2 * MICRO_BATCH:
        mask[MICRO_BATCH : 2 * MICRO_BATCH] = 0.0  # micro-batch 1 of DP rank 0: all zero
    if spec.get("empty_last_dp_rank"):
        rows = n_seq // dp
        mask[n_seq - rows :] = 0.0
    reference = reference_logprobs(tokens, labels)
    sampling = reference - deltas
    if not spec.get("causes"):
        return GlobalBatch(tokens, labels, sampling, advantages, mask, deltas)
    old = reference - deltas / 2
    lag = (torch.arange(n_seq) % 3).float()[:, None].expand(n_seq, seq_len).contiguous()
    return GlobalBatch(tokens, labels, sampling, advantages, mask, deltas, old, lag)


def loss_inputs(loss_fn: str, batch: GlobalBatch, rows: slice, cols: slice) -> dict[str, Tensor]:
    """The loss inputs of ``make_loss_func`` for a slice of the batch."""
    if loss_fn == "cross_entropy":
        return {"weights": batch.mask[rows, cols], "mask": batch.mask[rows, cols]}
    inputs = {
        "sampling_logprobs": batch.sampling_logprobs[rows, cols],
        "advantages": batch.advantages[rows, cols],
        "mask": batch.mask[rows, cols],
    }
    if batch.old_logprobs is not None and batch.weight_lag is not None:
        inputs["old_logprobs"] = batch.old_logprobs[rows, cols]
        inputs["weight_lag"] = batch.weight_lag[rows, cols]
    return inputs


WORST_K = 5
"""Sequences kept per criterion in the worst-sequences scenario."""


def expected_worst(batch: GlobalBatch, k: int = WORST_K) -> Any:
    """One process over the whole global batch: the worst sequences of the reference log-probs
    (datum id = the sequence's row in the global batch)."""
    from cliptrack.adapters.losses.worst import sequence_rows
    from cliptrack.core.worst import SequenceGauge, worst_of

    rows = sequence_rows(reference_logprobs(batch.tokens, batch.labels), batch.sampling_logprobs, batch.mask)
    return worst_of([SequenceGauge.from_row(r) for r in rows.tolist()], k)


def expected_metrics(scenario: str, batch: GlobalBatch) -> dict[str, float]:
    """One process computing the whole global batch: the loss on reference log-probs."""
    from cliptrack.adapters.losses.builtin import LOSSES
    from cliptrack.adapters.losses.output import loss_metrics

    spec = SCENARIOS[scenario]
    logprobs = reference_logprobs(batch.tokens, batch.labels)
    full = slice(None)
    out = LOSSES[spec["loss_fn"]](
        logprobs, **loss_inputs(spec["loss_fn"], batch, full, full), **spec["config"]
    )
    return loss_metrics(out)


def plain_ppo_counts(batch: GlobalBatch, low: float = 0.8, high: float = 1.2) -> tuple[int, int, int, int]:
    """(loss_tokens, clipped, low, high) of PPO from the log-ratios, by docs/CONTRACT.md's rule."""
    eligible = batch.mask != 0
    a = batch.advantages
    is_low = eligible & (a < 0) & (batch.deltas < math.log(low))
    is_high = eligible & (a > 0) & (batch.deltas > math.log(high))
    return int(eligible.sum()), int((is_low | is_high).sum()), int(is_low.sum()), int(is_high.sum())


COLLECTIVES = (
    "all_reduce",
    "all_to_all_single",
    "all_to_all",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather_object",
    "broadcast_object_list",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
)
"""The ``torch.distributed`` communication functions :func:`counted_collectives` wraps."""


@contextlib.contextmanager
def counted_collectives() -> Iterator[list[str]]:
    """Record the name of every ``torch.distributed`` communication call inside the block."""
    import torch.distributed as dist

    calls: list[str] = []
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def wrap(name: str, fn: Any) -> Any:
        def counting(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return fn(*args, **kwargs)

        return counting

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


# ---- Megatron side (imported lazily: tests skip when megatron-core is absent) ----------------------


def build_model(pre_process: bool = True, post_process: bool = True, per_token_loss: bool = True) -> Any:
    """The tiny model under the current ``parallel_state``."""
    from megatron.core import tensor_parallel
    from megatron.core.enums import ModelType
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        use_cpu_initialization=True,
        pipeline_dtype=torch.float32,
        params_dtype=torch.float32,
        calculate_per_token_loss=per_token_loss,
        batch_p2p_sync=False,
    )

    class TinyLM(MegatronModule):
        def __init__(self) -> None:
            super().__init__(config)
            self.model_type = ModelType.encoder_or_decoder
            self.pre_process, self.post_process = pre_process, post_process
            self.input_tensor: Tensor | None = None
            if pre_process:
                self.embedding = tensor_parallel.VocabParallelEmbedding(
                    VOCAB, HIDDEN, init_method=init_embedding, config=config
                )
            if post_process:
                self.output_layer = tensor_parallel.ColumnParallelLinear(
                    HIDDEN, VOCAB, config=config, init_method=init_head, bias=False, gather_output=False
                )

        def set_input_tensor(self, tensor: Any) -> None:
            self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

        def forward(self, tokens: Tensor, labels: Tensor) -> Tensor:
            """Per-token cross entropy [batch, seq] on the last stage, hidden [seq, batch, h] before."""
            if self.pre_process:
                hidden = self.embedding(tokens).transpose(0, 1).contiguous()
            else:
                assert self.input_tensor is not None
                hidden = self.input_tensor
            if not self.post_process:
                return hidden
            logits, _ = self.output_layer(hidden)
            ce = tensor_parallel.vocab_parallel_cross_entropy(
                logits.float(), labels.transpose(0, 1).contiguous()
            )
            return ce.transpose(0, 1).contiguous()

    return TinyLM()


def micro_batches(scenario: str, batch: GlobalBatch, dp_rank: int, cp_rank: int, cp: int) -> Iterator[dict]:
    """This rank's micro-batches: rows of its DP rank, columns of its CP slice."""
    seq_len = batch.tokens.shape[1]
    width = seq_len // cp
    cols = slice(cp_rank * width, (cp_rank + 1) * width)
    loss_fn = SCENARIOS[scenario]["loss_fn"]
    for m in range(N_MICRO):
        start = (dp_rank * N_MICRO + m) * MICRO_BATCH
        rows = slice(start, start + MICRO_BATCH)
        yield {
            "tokens": batch.tokens[rows, cols],
            "labels": batch.labels[rows, cols],
            "inputs": loss_inputs(loss_fn, batch, rows, cols),
            "datum_ids": torch.arange(start, start + MICRO_BATCH),
            "positions": torch.arange(seq_len)[cols].expand(MICRO_BATCH, -1),
        }


def run_step(model: Any, scenario: str, data: list[dict], seq_len: int, forward_only: bool = False) -> list:
    """One real ``get_forward_backward_func()`` step with ``make_loss_func``; returns its reports."""
    from cliptrack.adapters.megatron import make_loss_func
    from megatron.core.pipeline_parallel import get_forward_backward_func

    spec = SCENARIOS[scenario]

    def forward_step(data_iterator: Iterator[dict], model: Any) -> tuple[Tensor, Any]:
        micro = next(data_iterator)
        output = model(micro["tokens"], micro["labels"])
        sequences = (
            {"sequences": True, "datum_ids": micro["datum_ids"], "token_positions": micro["positions"]}
            if spec.get("worst")
            else {}
        )
        loss_func = make_loss_func(
            spec["loss_fn"], micro["inputs"], spec["config"], output_to_logprobs=torch.neg, **sequences
        )
        return output, loss_func

    forward_backward = get_forward_backward_func()
    return forward_backward(
        forward_step_func=forward_step,
        data_iterator=iter(data),
        model=[model],
        num_microbatches=len(data),
        seq_length=seq_len,
        micro_batch_size=MICRO_BATCH,
        forward_only=forward_only,
    )
