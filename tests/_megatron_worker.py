"""One rank of a multi-process Megatron test: ``python _megatron_worker.py OUT_DIR LAYOUT [LAYOUT ...]``,
each ``LAYOUT`` ``TP,PP,CP``.

Environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``. For each layout in turn (one
process group, Megatron's model parallel state set up and torn down per layout): runs every scenario
of ``_megatron_setup.SCENARIOS`` through Megatron-Core's real schedule on gloo, reduces with
``cliptrack.adapters.megatron.reduce_losses`` while counting ``torch.distributed`` collectives, hands the
result to every pipeline stage. Writes ``OUT_DIR/rank<RANK>.json``: ``{LAYOUT: result}``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _explicit_group(rank: int, world: int) -> dict:
    """Without parallel_state: reports from the loss function, the world group passed in, and the
    last rank holding no report at all (it contributes zeros to the one collective)."""
    import torch.distributed as dist
    from cliptrack.adapters.megatron import make_loss_func, reduce_losses

    from tests import _megatron_setup as setup

    batch = setup.global_batch("ppo", world * setup.MICRO_BATCH, dp=world)
    rows = slice(rank * setup.MICRO_BATCH, (rank + 1) * setup.MICRO_BATCH)
    inputs = setup.loss_inputs("ppo", batch, rows, slice(None))
    logprobs = setup.reference_logprobs(batch.tokens[rows], batch.labels[rows])
    reports = [] if rank == world - 1 else [make_loss_func("ppo", inputs)(logprobs)[2]]
    with setup.counted_collectives() as calls:
        fbo = reduce_losses(reports, group=dist.group.WORLD)
    return {"metrics": fbo.metrics if fbo is not None else None, "collectives": calls}


def _layout(tp: int, pp: int, cp: int, rank: int, world: int) -> dict:
    """Every scenario under one TP x PP x CP layout (the data-parallel size follows from the world)."""
    import torch.distributed as dist
    from cliptrack.adapters.megatron import broadcast_from_last_stage, reduce_losses, reduce_step
    from megatron.core import parallel_state

    from tests import _megatron_setup as setup
    from tests.megatron_shim import cpu_megatron

    result: dict = {"rank": rank, "steps": {}}
    with cpu_megatron():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            create_gloo_process_groups=False,  # the default backend is gloo already
        )
        dp = parallel_state.get_data_parallel_world_size()
        dp_rank = parallel_state.get_data_parallel_rank()
        cp_rank = parallel_state.get_context_parallel_rank()
        dp_cp = parallel_state.get_data_parallel_group(with_context_parallel=True)
        result["dp_cp_ranks"] = dist.get_process_group_ranks(dp_cp)
        result["tp_ranks"] = dist.get_process_group_ranks(parallel_state.get_tensor_model_parallel_group())
        result["tp_rank_zero"] = parallel_state.get_tensor_model_parallel_rank() == 0
        result["last_stage"] = parallel_state.is_pipeline_last_stage()
        model = setup.build_model(
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
        )
        n_seq = dp * setup.N_MICRO * setup.MICRO_BATCH
        for scenario in setup.SCENARIOS:
            batch = setup.global_batch(scenario, n_seq, dp=dp)
            data = list(setup.micro_batches(scenario, batch, dp_rank, cp_rank, cp))
            model.zero_grad(set_to_none=True)
            reports = setup.run_step(model, scenario, data, seq_len=setup.SEQ_LEN // cp)
            worst = None
            with setup.counted_collectives() as calls:
                if setup.SCENARIOS[scenario].get("worst"):
                    reduced = reduce_step(reports, step=7, worst_k=setup.WORST_K)
                    fbo, worst = reduced.output, reduced.worst
                else:
                    fbo = reduce_losses(reports)
            everywhere = broadcast_from_last_stage(fbo)
            result["steps"][scenario] = {
                "n_reports": len(reports),
                "collectives": calls,
                "metrics": None if fbo is None else fbo.metrics,
                "broadcast_metrics": everywhere.metrics,
                "worst": None if worst is None else worst.records(),
                "rows": [r["cliptrack/sequences"].tolist() for r in reports if "cliptrack/sequences" in r],
                "cp_rank": cp_rank,
            }
        parallel_state.destroy_model_parallel()
    if tp == pp == cp == 1:
        result["explicit_group"] = _explicit_group(rank, world)
    dist.barrier()
    return result


def main() -> int:
    out_dir, layouts = Path(sys.argv[1]), sys.argv[2:]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for layout in layouts:
        tp, pp, cp = (int(size) for size in layout.split(","))
        results[layout] = _layout(tp, pp, cp, rank, world)
    dist.destroy_process_group()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
