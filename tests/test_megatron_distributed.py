"""Megatron-Core's real schedule on several gloo processes over 127.0.0.1: exact merged counts.

Each layout runs every scenario of ``_megatron_setup.SCENARIOS`` (PPO with unequal micro-batches
and an all-zero micro-batch, a DP rank with no eligible token, CISPO, a step where nothing clips,
cross entropy) and compares the merged metrics with one process computing the whole global batch.
The layouts (DP4, PP2 x DP2, TP2 x DP2, DP2 x CP2) run in one launch of four processes, one after
the other.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from cliptrack.adapters.losses.builtin import ppo
from cliptrack.adapters.losses.output import loss_metrics
from cliptrack.core import keys

from tests import _megatron_setup as setup
from tests._harness import run_ranks
from tests.test_megatron import assert_gauge_close

pytestmark = pytest.mark.slow  # processes importing torch and Megatron-Core: minutes on two cores

HERE = Path(__file__).resolve().parent
WORKER = HERE / "_megatron_worker.py"
COUNT_KEYS = (keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS)


Layout = tuple[int, int, int]
"""Tensor-, pipeline- and context-parallel sizes; the data-parallel size is what the world leaves."""
DP4, PP2_DP2, TP2_DP2, DP2_CP2 = (1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1, 2)
WORLD = 4


def _launch(tmp_path: Path, world: int, layouts: list[Layout]) -> dict[Layout, list[dict]]:
    """Start ``world`` worker processes on loopback, running ``layouts`` one after the other; each
    layout's results by rank."""
    names = [",".join(str(size) for size in layout) for layout in layouts]
    by_rank = run_ranks(WORKER, names, world, tmp_path, timeout_s=150 * len(layouts))
    return {layout: [rank[name] for rank in by_rank] for layout, name in zip(layouts, names, strict=True)}


@pytest.fixture(scope="module")
def world_4(tmp_path_factory: pytest.TempPathFactory) -> dict[Layout, list[dict]]:
    return _launch(tmp_path_factory.mktemp("world4"), WORLD, [DP4, PP2_DP2, TP2_DP2, DP2_CP2])


def _check_layout(results: list[dict], dp: int) -> None:
    n_seq = dp * setup.N_MICRO * setup.MICRO_BATCH
    for scenario in setup.SCENARIOS:
        expected = setup.expected_metrics(scenario, setup.global_batch(scenario, n_seq, dp=dp))
        for res in results:
            step = res["steps"][scenario]
            if not res["last_stage"]:
                assert step["n_reports"] == 0 and step["metrics"] is None
                assert step["collectives"] == []
            else:
                assert step["n_reports"] == setup.N_MICRO
                # one collective per step; the worst sequences ride in it, but under context parallelism
                # their slices are first gathered over the CP group (one more)
                expected_calls = 2 if setup.SCENARIOS[scenario].get("worst") and _cp(results) > 1 else 1
                assert len(step["collectives"]) == expected_calls, (
                    f"{scenario}: {expected_calls} collective(s) per step, got {step['collectives']}"
                )
                got = step["metrics"]
                assert set(got) == set(expected), f"{scenario} rank {res['rank']}: keys {sorted(got)}"
                for key in COUNT_KEYS:
                    if key in expected:
                        assert got[key] == expected[key], f"{scenario} rank {res['rank']} {key}"
                assert got.get(keys.CLIP_FRACTION) == expected.get(keys.CLIP_FRACTION)
                assert got[keys.LOSS_SUM] == pytest.approx(expected[keys.LOSS_SUM], rel=1e-5, abs=1e-4)
                assert_gauge_close(got, expected)
            # every rank, any pipeline stage, ends up with the last stage's output
            last = next(r for r in results if r["last_stage"])
            assert step["broadcast_metrics"] == last["steps"][scenario]["metrics"]
    _check_worst(results, dp)


def _cp(results: list[dict]) -> int:
    return 1 + max(r["steps"]["ppo_worst"]["cp_rank"] for r in results)


def _check_worst(results: list[dict], dp: int) -> None:
    """Every last-stage rank's worst sequences equal (a) a plain sort of every sequence of the step
    as the ranks computed them (their rows, CP slices combined by hand) and (b) the worst of one
    process over the whole batch, the same sequences in the same order, values to float32 rounding."""
    from cliptrack.core.worst import COLUMNS, CRITERIA, SequenceGauge, Worst, worst_of

    n_seq = dp * setup.N_MICRO * setup.MICRO_BATCH
    last = [r for r in results if r["last_stage"]]
    whole: dict[int, list[list[float]]] = {}
    for r in last:
        if r["tp_rank_zero"]:
            for rows in r["steps"]["ppo_worst"]["rows"]:
                for row in rows:
                    whole.setdefault(int(row[0]), []).append(row)
    col = {name: i for i, name in enumerate(COLUMNS)}
    sequences = []
    for datum, slices in whole.items():
        with_tokens = [s for s in slices if s[col["tokens"]] > 0]
        top = max((s[col["max_abs_log_ratio"]] for s in with_tokens), default=0.0)
        sequences.append(
            SequenceGauge(
                datum,
                int(sum(s[col["tokens"]] for s in slices)),
                sum(s[col["log_ratio"]] for s in slices),
                sum(s[col["abs_log_ratio"]] for s in slices),
                sum(s[col["kl_k3"]] for s in slices),
                top,
                int(
                    min(
                        (s[col["worst_token"]] for s in with_tokens if s[col["max_abs_log_ratio"]] == top),
                        default=-1,
                    )
                ),
            )
        )
    assert len(sequences) == n_seq
    plain = worst_of(sequences, setup.WORST_K)
    batch = setup.global_batch("ppo_worst", n_seq, dp=dp)
    reference = setup.expected_worst(batch)
    for r in last:
        got = Worst.from_records(7, setup.WORST_K, r["steps"]["ppo_worst"]["worst"])
        for c in CRITERIA:
            assert len(got.by[c]) == min(setup.WORST_K, sum(1 for s in sequences if s.tokens)) > 0
            for mine, theirs, ref in zip(got.by[c], plain[c], reference[c], strict=True):
                assert mine == theirs or mine.datum == theirs.datum, c
                assert mine.datum == ref.datum and mine.tokens == theirs.tokens == ref.tokens, c
                # the worst token: one with the sequence's largest |l| (tokens of equal |l| differ by
                # the layout's rounding, so which of them is not fixed)
                eligible = batch.deltas[mine.datum].abs() * (batch.mask[mine.datum] != 0)
                assert eligible[mine.worst_token] == eligible.max()
                for name in ("log_ratio", "abs_log_ratio", "kl_k3", "max_abs_log_ratio"):
                    # the CP slices add in another order on the ranks than by hand: float64 rounding
                    assert getattr(mine, name) == pytest.approx(getattr(theirs, name), rel=1e-12, abs=1e-12)
                    assert getattr(mine, name) == pytest.approx(getattr(ref, name), rel=1e-5, abs=1e-5), name


def _check_nontrivial(results: list[dict]) -> None:
    """Guard: the layouts' data really has clipped tokens and empty ranks where meant."""
    metrics = next(r for r in results if r["last_stage"])["steps"]
    assert metrics["ppo"]["metrics"][keys.CLIPPED_TOKENS] > 0
    assert metrics["ppo"]["metrics"][keys.CLIPPED_LOW_TOKENS] > 0
    assert metrics["ppo"]["metrics"][keys.CLIPPED_HIGH_TOKENS] > 0
    assert metrics["cispo"]["metrics"][keys.CLIPPED_TOKENS] > 0
    assert metrics["ppo_nothing_clips"]["metrics"][keys.CLIP_FRACTION] == 0.0
    assert keys.CLIP_FRACTION not in metrics["cross_entropy"]["metrics"]
    assert keys.CLIPPED_TOKENS not in metrics["cross_entropy"]["metrics"]
    assert set(keys.GAUGE_KEYS) <= set(metrics["ppo"]["metrics"])  # the gauge crossed the ranks
    assert set(keys.GAUGE_KEYS).isdisjoint(metrics["cross_entropy"]["metrics"])
    causes = metrics["ppo_causes"]["metrics"]  # the split and the lag crossed the ranks, exactly split
    assert set(keys.CAUSES_KEYS) | set(keys.STALENESS_KEYS) <= set(causes)
    assert (
        causes[keys.ENGINE_KL_K3_SUM] > 0
        and causes[keys.DRIFT_KL_K3_SUM] > 0
        and causes[keys.WEIGHT_LAG_MAX] == 2
    )
    total = causes[keys.ENGINE_LOG_RATIO_SUM] + causes[keys.DRIFT_LOG_RATIO_SUM]
    assert causes[keys.LOG_RATIO_SUM] == pytest.approx(total, rel=1e-12, abs=1e-12)
    assert set(keys.CAUSES_KEYS).isdisjoint(metrics["ppo"]["metrics"])


@pytest.fixture
def dp4_results(world_4: dict[Layout, list[dict]]) -> list[dict]:
    return world_4[DP4]


def test_data_parallel_4(dp4_results: list[dict]) -> None:
    results = dp4_results
    _check_layout(results, dp=WORLD)
    _check_nontrivial(results)
    assert [r["dp_cp_ranks"] for r in results] == [list(range(WORLD))] * WORLD
    # on gloo the one collective is an all-to-all (one round), see cliptrack.adapters.megatron.merge_packed
    assert all(r["steps"]["ppo"]["collectives"] == ["all_to_all_single"] for r in results)


def test_explicit_group_without_parallel_state(dp4_results: list[dict]) -> None:
    """The same processes, reports passed with group=WORLD; the last rank has none and still joins."""
    results = dp4_results
    batch = setup.global_batch("ppo", WORLD * setup.MICRO_BATCH, dp=WORLD)
    rows = slice(0, (WORLD - 1) * setup.MICRO_BATCH)
    logprobs = setup.reference_logprobs(batch.tokens[rows], batch.labels[rows])
    expected = loss_metrics(ppo(logprobs, **setup.loss_inputs("ppo", batch, rows, slice(None))))
    assert expected[keys.CLIPPED_TOKENS] > 0
    for res in results:
        got = res["explicit_group"]
        assert len(got["collectives"]) == 1, got["collectives"]
        assert set(got["metrics"]) == set(expected)
        for key in (keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS, keys.CLIP_FRACTION):
            assert got["metrics"][key] == expected[key]


def test_tensor_parallel_2_by_data_parallel_2(world_4: dict[Layout, list[dict]]) -> None:
    results = world_4[TP2_DP2]
    _check_layout(results, dp=2)
    _check_nontrivial(results)
    for res in results:
        # the merge group holds no tensor-parallel peer: TP ranks (same tokens) are not summed twice
        assert set(res["dp_cp_ranks"]) & set(res["tp_ranks"]) == {res["rank"]}
        assert len(res["dp_cp_ranks"]) == 2 and len(res["tp_ranks"]) == 2


def test_data_parallel_2_by_context_parallel_2(world_4: dict[Layout, list[dict]]) -> None:
    results = world_4[DP2_CP2]
    _check_layout(results, dp=2)
    _check_nontrivial(results)
    for res in results:
        assert sorted(res["dp_cp_ranks"]) == [0, 1, 2, 3]  # DP x CP: slices of a sequence are summed


def test_pipeline_parallel_2_by_data_parallel_2(world_4: dict[Layout, list[dict]]) -> None:
    results = world_4[PP2_DP2]
    # Megatron-Core's default order puts the pipeline outermost: ranks 0-1 hold the first stage
    assert [r["last_stage"] for r in results] == [False, False, True, True]
    _check_layout(results, dp=2)
    _check_nontrivial(results)
