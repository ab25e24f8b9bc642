"""The tinker wrapper and the tinker-cookbook logger, with the real ``tinker`` and ``tinker-cookbook``.

Only tinker's network service is stood in for: :class:`InProcessService` answers
``forward_backward`` with our Miles-runtime path (``cliptrack.adapters.miles.forward_backward_loss``) on a
tiny logits-table policy and ``optim_step`` with SGD, and returns real tinker types
(``tinker.types.ForwardBackwardOutput`` decoded from the JSON a REST service would send,
``tinker.types.OptimStepResponse``) in tinker's own ``AwaitableConcurrentFuture``. Each future is
completed when the test says so, so resolution order is chosen by the test, not by timing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import json
import math
import os
import random
import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("tinker")
from cliptrack import Tracker
from cliptrack.adapters.miles import forward_backward_loss, output_to_json
from cliptrack.adapters.tinker import TrackedTrainingClient, cookbook_metrics
from cliptrack.backends import load_runs
from cliptrack.core import keys
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

VOCAB = 9
DELTAS = (-0.6, -0.4, -0.1, 0.0, 0.1, 0.4, 0.6)
"""Log-ratios current / sampler, far from PPO's band [0.8, 1.2] (log: -0.22, 0.18)."""
SEED_KEYS = (keys.LOSS_SUM, keys.LOSS_TOKENS, keys.CLIPPED_TOKENS, keys.CLIP_FRACTION)


class InProcessService:
    """A tinker TrainingClient's service side, in process (see the module docstring)."""

    def __init__(self, *, seed_keys_only: bool = False) -> None:
        self.weights = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(3))
        self.weights.requires_grad_(True)
        self.seed_keys_only = seed_keys_only
        self.waiting: list[tuple[concurrent.futures.Future, types.ForwardBackwardOutput]] = []
        self.lock = threading.Lock()

    def logprobs(self, tokens: list[int], targets: list[int]) -> torch.Tensor:
        logits = self.weights[torch.tensor(tokens)]
        return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(targets)[:, None]).squeeze(-1)

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        with self.lock:
            policy = [
                self.logprobs(d.model_input.to_ints(), d.loss_fn_inputs["target_tokens"].tolist())
                for d in data
            ]
            result = forward_backward_loss(data, policy, loss_fn, loss_fn_config)
            result.loss.backward()
        wire = output_to_json(result.output)
        if self.seed_keys_only:  # what a service with only the seed's change sends
            wire["metrics"] = {k: v for k, v in wire["metrics"].items() if k in SEED_KEYS}
            for out in wire["loss_fn_outputs"]:
                for name in keys.DATUM_CLIP_FIELDS:
                    out.pop(name, None)
        output = types.ForwardBackwardOutput(**wire)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.waiting.append((future, output))
        return AwaitableConcurrentFuture(future)

    async def forward_backward_async(self, data, loss_fn, loss_fn_config=None):
        return self.forward_backward(data, loss_fn, loss_fn_config)

    def optim_step(self, adam_params):
        with self.lock, torch.no_grad():
            self.weights -= adam_params.learning_rate * self.weights.grad
            self.weights.grad = None
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(types.OptimStepResponse(metrics={}))
        return AwaitableConcurrentFuture(future)

    async def optim_step_async(self, adam_params):
        return self.optim_step(adam_params)

    def resolve(self, order: list[int]) -> None:
        """Complete the waiting forward_backward futures in ``order`` (indices into the queue)."""
        queue, self.waiting = self.waiting, []
        assert sorted(order) == list(range(len(queue)))
        for i in order:
            future, output = queue[i]
            future.set_result(output)

    def get_info(self) -> str:
        return "in-process"


def make_data(service: InProcessService, n: int, seed: int) -> tuple[list[types.Datum], dict[str, int]]:
    """``n`` datums of different lengths sampled "off-policy" by known log-ratios, and their counts."""
    gen = torch.Generator().manual_seed(seed)
    data, totals = [], {"loss_tokens": 0, "clipped": 0, "low": 0, "high": 0, "deltas": []}
    for _ in range(n):
        length = int(torch.randint(2, 9, (), generator=gen))
        tokens = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        targets = torch.randint(0, VOCAB, (length,), generator=gen).tolist()
        delta = torch.tensor(DELTAS)[torch.randint(0, len(DELTAS), (length,), generator=gen)]
        advantages = torch.tensor([-1.0, 0.0, 1.0])[torch.randint(0, 3, (length,), generator=gen)]
        mask = (torch.rand(length, generator=gen) < 0.8).float()
        with torch.no_grad():
            sampling = service.logprobs(tokens, targets) - delta
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens),
                loss_fn_inputs={
                    "target_tokens": types.TensorData.from_torch(torch.tensor(targets)),
                    "logprobs": types.TensorData.from_torch(sampling.float()),
                    "advantages": types.TensorData.from_torch(advantages),
                    "mask": types.TensorData.from_torch(mask),
                },
            )
        )
        eligible = mask != 0
        low = eligible & (advantages < 0) & (delta < math.log(0.8))
        high = eligible & (advantages > 0) & (delta > math.log(1.2))
        totals["loss_tokens"] += int(eligible.sum())
        totals["low"] += int(low.sum())
        totals["high"] += int(high.sum())
        totals["clipped"] += int((low | high).sum())
        totals["deltas"] += [float(d) for d in delta[eligible]]
    return data, totals


def _add(a: dict, b: dict) -> dict:
    return {k: a[k] + b[k] for k in a}


def check_gauge(metrics: dict[str, float], deltas: list[float]) -> None:
    """The step's gauge against the log-ratios the data were sampled with (float64, plain Python;
    the loss forms l from float32 log-probs, so to float32 rounding), its means formed from the
    merged sums (bit for bit)."""
    n = len(deltas)
    expected = {
        keys.LOG_RATIO_SUM: math.fsum(deltas),
        keys.ABS_LOG_RATIO_SUM: math.fsum(abs(d) for d in deltas),
        keys.KL_K3_SUM: math.fsum(math.expm1(d) - d for d in deltas),
        keys.IS_WEIGHT_SUM: math.fsum(math.exp(d) for d in deltas),
        keys.IS_WEIGHT_SQ_SUM: math.fsum(math.exp(2 * d) for d in deltas),
        keys.LOG_RATIO_MAX: max(deltas),
        keys.LOG_RATIO_MIN: min(deltas),
    }
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-5 * n), key
    assert metrics[keys.RATIO_OUTSIDE_TOKENS] == sum(1 for d in deltas if not 0.5 <= math.exp(d) <= 2.0)
    assert metrics[keys.KL_K3_MEAN] == metrics[keys.KL_K3_SUM] / metrics[keys.LOSS_TOKENS]
    assert metrics[keys.ABS_LOG_RATIO_MEAN] == metrics[keys.ABS_LOG_RATIO_SUM] / metrics[keys.LOSS_TOKENS]


def logged_points(tracker: Tracker, spool) -> dict[int, dict[str, float]]:
    """What the tracker wrote for its run, read back by the comparison's JSONL loader: step -> metrics."""
    tracker.close()
    runs = load_runs([tracker.run_id], jsonl_dir=spool)
    by_step: dict[int, dict[str, float]] = {}
    for row in runs.frame.itertuples():
        by_step.setdefault(int(row.step), {})[row.metric] = float(row.value)
    return by_step


def check_step(metrics: dict[str, float], expected: dict[str, int], *, split: bool) -> None:
    assert metrics[keys.LOSS_TOKENS] == expected["loss_tokens"]
    assert metrics[keys.CLIPPED_TOKENS] == expected["clipped"]
    assert (
        metrics[keys.CLIP_FRACTION] == expected["clipped"] / expected["loss_tokens"]
    )  # exact, not approximately
    if split:
        assert metrics[keys.CLIPPED_LOW_TOKENS] == expected["low"]
        assert metrics[keys.CLIPPED_HIGH_TOKENS] == expected["high"]
    else:
        assert keys.CLIPPED_LOW_TOKENS not in metrics and keys.CLIPPED_HIGH_TOKENS not in metrics


@pytest.mark.parametrize("seed_keys_only", [False, True], ids=["full_set", "seed_keys"])
def test_sync_steps_with_several_calls_resolved_out_of_order(tmp_path, seed_keys_only):
    service = InProcessService(seed_keys_only=seed_keys_only)
    tracker = Tracker("tinker-sync", sinks=["jsonl"], spool_dir=tmp_path, handle_signals=False)
    client = TrackedTrainingClient(service, tracker)
    assert client.get_info() == "in-process"  # everything else is the client's own
    expected, returned = {}, []
    for step, sizes in enumerate([(3, 1, 5), (2, 4), (6,)]):
        total = {"loss_tokens": 0, "clipped": 0, "low": 0, "high": 0, "deltas": []}
        futures = []
        for i, n in enumerate(sizes):
            data, counts = make_data(service, n, seed=10 * step + i)
            total = _add(total, counts)
            futures.append(client.forward_backward(data, "ppo"))
        expected[step] = total
        if step == 0:  # one output arrives before the optimizer step is submitted
            service.waiting[1][0].set_result(service.waiting[1][1])
            service.waiting = [service.waiting[0], service.waiting[2]]
            client.optim_step(types.AdamParams(learning_rate=0.1))
            service.resolve([1, 0])
        else:
            client.optim_step(types.AdamParams(learning_rate=0.1))
            service.resolve(list(reversed(range(len(service.waiting)))))
        for future in futures[::2]:  # the caller reads some results, ignores the others
            output = future.result()
            returned.append((output, copy.deepcopy(output.metrics)))
    assert client.flush(timeout_s=60)
    assert client.logged_steps == [0, 1, 2] and client.pending_steps == []
    points = logged_points(tracker, tmp_path)
    assert sorted(points) == [0, 1, 2]
    for step, total in expected.items():
        assert total["clipped"] > 0
        check_step(points[step], total, split=not seed_keys_only)
        if seed_keys_only:  # a service whose metrics carry no gauge: none is logged (never invented)
            assert not set(keys.GAUGE_KEYS) & set(points[step])
        else:
            check_gauge(points[step], total["deltas"])
    for output, metrics in returned:  # what the caller got is tinker's type, untouched
        assert isinstance(output, types.ForwardBackwardOutput)
        assert output.metrics == metrics


def test_a_step_is_logged_only_when_its_optim_step_is_submitted_and_every_output_is_back(tmp_path):
    service = InProcessService()
    tracker = Tracker("tinker-wait", sinks=["jsonl"], spool_dir=tmp_path, handle_signals=False)
    client = TrackedTrainingClient(service, tracker, first_step=7)
    data, counts = make_data(service, 4, seed=1)
    more, more_counts = make_data(service, 3, seed=2)
    client.forward_backward(data, "ppo")
    client.forward_backward(more, "ppo")
    service.resolve([0, 1])
    assert client.logged_steps == [] and client.pending_steps == [7]  # no optim_step yet: more may come
    client.optim_step(types.AdamParams(learning_rate=0.1))
    assert client.logged_steps == [7]
    check_step(logged_points(tracker, tmp_path)[7], _add(counts, more_counts), split=True)


def test_async_client(tmp_path):
    service = InProcessService()
    tracker = Tracker("tinker-async", sinks=["jsonl"], spool_dir=tmp_path, handle_signals=False)
    client = TrackedTrainingClient(service, tracker)
    expected = {}

    async def train() -> None:
        for step in range(2):
            total = {"loss_tokens": 0, "clipped": 0, "low": 0, "high": 0}
            futures = []
            for i in range(3):
                data, counts = make_data(service, 2 + i, seed=100 + 10 * step + i)
                total = _add(total, counts)
                futures.append(await client.forward_backward_async(data, "ppo"))
            expected[step] = total
            optim = await client.optim_step_async(types.AdamParams(learning_rate=0.1))
            service.resolve([2, 0, 1])
            outputs = await asyncio.gather(*futures)
            assert all(isinstance(o, types.ForwardBackwardOutput) for o in outputs)
            await optim

    asyncio.run(train())
    assert client.flush(timeout_s=60)
    points = logged_points(tracker, tmp_path)
    for step, total in expected.items():
        check_step(points[step], total, split=True)


@settings(deadline=None, max_examples=12, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    order=st.randoms(use_true_random=False),
    loss_fn=st.sampled_from(["ppo", "cispo", "importance_sampling"]),
    seed=st.integers(0, 1000),
)
@example(calls=[1], order=random.Random(0), loss_fn="ppo", seed=125)  # one datum, every token masked
def test_any_number_of_calls_resolved_in_any_order_log_the_merged_gauge_exactly(calls, order, loss_fn, seed):
    """Whatever the calls of a step and their order of resolution, the logged point is the exact
    merge of the outputs the caller got: counts summed, float sums by one fsum, extremes by max /
    min, means formed once from the merged sums (read back from the run's journal)."""
    import tempfile

    service = InProcessService()
    with tempfile.TemporaryDirectory() as spool:
        tracker = Tracker("tinker-any", sinks=["jsonl"], spool_dir=spool, handle_signals=False)
        client = TrackedTrainingClient(service, tracker, first_step=seed)
        futures = [
            client.forward_backward(make_data(service, n, seed + i)[0], loss_fn) for i, n in enumerate(calls)
        ]
        client.optim_step(types.AdamParams(learning_rate=0.1))
        resolution = list(range(len(calls)))
        order.shuffle(resolution)
        service.resolve(resolution)
        outputs = [f.result().metrics for f in futures]
        assert client.flush(timeout_s=60)
        tracker.close()
        run_dir = next(Path(spool).iterdir())
        (point,) = [json.loads(line) for line in (run_dir / keys.POINTS_FILE).read_text().splitlines()]
    assert point["step"] == seed
    logged = point["metrics"]
    tokens = sum(int(o[keys.LOSS_TOKENS]) for o in outputs)
    assert logged[keys.LOSS_TOKENS] == tokens
    assert logged[keys.RATIO_OUTSIDE_TOKENS] == sum(int(o[keys.RATIO_OUTSIDE_TOKENS]) for o in outputs)
    for key in (
        keys.LOG_RATIO_SUM,
        keys.ABS_LOG_RATIO_SUM,
        keys.KL_K3_SUM,
        keys.IS_WEIGHT_SUM,
        keys.IS_WEIGHT_SQ_SUM,
    ):
        assert logged[key] == math.fsum(o[key] for o in outputs), key
    if tokens == 0:  # every token masked (a short datum can be): sums only, no extreme, no mean
        assert not any(key in logged for key in (keys.LOG_RATIO_MAX, keys.LOG_RATIO_MIN, keys.KL_K3_MEAN))
        assert keys.CLIP_FRACTION not in logged
        return
    assert logged[keys.LOG_RATIO_MAX] == max(
        o[keys.LOG_RATIO_MAX] for o in outputs if keys.LOG_RATIO_MAX in o
    )
    assert logged[keys.LOG_RATIO_MIN] == min(
        o[keys.LOG_RATIO_MIN] for o in outputs if keys.LOG_RATIO_MIN in o
    )
    assert logged[keys.KL_K3_MEAN] == logged[keys.KL_K3_SUM] / tokens
    assert logged[keys.ABS_LOG_RATIO_MEAN] == logged[keys.ABS_LOG_RATIO_SUM] / tokens
    assert (keys.CLIP_FRACTION in logged) == (loss_fn != "importance_sampling")


def test_a_failed_call_leaves_its_step_unlogged_with_a_warning(tmp_path):
    service = InProcessService()
    tracker = Tracker("tinker-fail", sinks=["jsonl"], spool_dir=tmp_path, handle_signals=False)
    client = TrackedTrainingClient(service, tracker)
    data, _ = make_data(service, 2, seed=3)
    future = client.forward_backward(data, "ppo")
    client.optim_step(types.AdamParams(learning_rate=0.1))
    with pytest.warns(RuntimeWarning, match="step 0: forward_backward call 0 of 1 failed"):
        service.waiting[0][0].set_exception(RuntimeError("service down"))
    with pytest.raises(RuntimeError, match="service down"):
        future.result()  # the caller still sees its own error
    assert client.logged_steps == [] and client.flush(timeout_s=5)


def test_cookbook_metric_names():
    got = cookbook_metrics(
        {
            "env/all/reward/total": 0.25,
            "time/total": 4.0,
            "env/all/total_ac_tokens": 1000,
            "optim/kl_sample_train_v1": 0.01,
            "time/sample_async:total": 1.5,
            "progress/done_frac": 0.5,
            "a:b:c": 1.0,
            "text": "hello",
            "flag": True,
        }
    )
    assert got == {
        keys.REWARD: 0.25,
        keys.STEP_TIME: 4.0,
        "env/all/total_ac_tokens:mean": 1000.0,
        keys.THROUGHPUT: 250.0,
        "optim/kl_sample_train_v1:mean": 0.01,
        "time/sample_async:total": 1.5,
        "progress/done_frac:mean": 0.5,
        "a_b_c:mean": 1.0,
    }
    for key in got:
        keys.split_key(key)


def test_cookbook_logger_inside_the_cookbooks_multiplex_logger(tmp_path, monkeypatch):
    ml_log = pytest.importorskip("tinker_cookbook.utils.ml_log")
    from cliptrack.adapters.tinker import CookbookLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    wandb.teardown()  # W&B reads WANDB_MODE once per process setup: an earlier test's setup must not decide
    service = InProcessService()
    tracker = Tracker("cookbook-run", sinks=["jsonl"], spool_dir=tmp_path / "spool", handle_signals=False)
    client = TrackedTrainingClient(service, tracker)
    cookbook = CookbookLogger(tracker)
    assert isinstance(cookbook, ml_log.Logger)
    wandb_logger = ml_log.WandbLogger(project="cliptrack-cookbook", log_dir=tmp_path, wandb_name="run")
    logger = ml_log.MultiplexLogger([ml_log.JsonLogger(tmp_path / "json"), wandb_logger, cookbook])
    logger.log_hparams({"learning_rate": 0.1, "loss_fn": "ppo"})
    expected = {}
    for i_batch in range(2):
        data, counts = make_data(service, 5, seed=200 + i_batch)
        client.forward_backward(data, "ppo")
        client.optim_step(types.AdamParams(learning_rate=0.1))
        service.resolve([0])
        expected[i_batch] = counts
        logger.log_metrics(
            {
                "env/all/reward/total": 0.1 * i_batch,
                "time/total": 2.0,
                "env/all/total_ac_tokens": 40 + i_batch,
                "optim/kl_sample_train_v1": 0.02,
            },
            step=i_batch,
        )
    logger.close()  # closes W&B and the JSON logger; the cliptrack tracker stays with its owner
    assert client.flush(timeout_s=60)
    points = logged_points(tracker, tmp_path / "spool")
    for i_batch, counts in expected.items():
        check_step(points[i_batch], counts, split=True)  # clipping from the wrapped client ...
        assert points[i_batch][keys.REWARD] == 0.1 * i_batch  # ... beside the cookbook's own metrics
        assert points[i_batch][keys.THROUGHPUT] == (40 + i_batch) / 2.0
        assert points[i_batch]["optim/kl_sample_train_v1:mean"] == 0.02
    [run] = load_runs([tracker.run_id], jsonl_dir=tmp_path / "spool").runs
    assert (
        run.run.config["learning_rate"] == 0.1 and run.run.config["loss_fn"] == "ppo"
    )  # the cookbook's hparams
    assert (tmp_path / "json" / "metrics.jsonl").is_file()  # the cookbook's loggers ran alongside
    assert any(p.suffix == ".wandb" for p in (tmp_path / "wandb").rglob("*.wandb"))
    assert os.environ["WANDB_MODE"] == "offline"


def test_datums_with_ids_log_the_steps_worst_sequences_over_all_its_calls(tmp_path):
    """Datums sent with ids: the step's worst sequences over every call, however they resolve,
    are logged beside the point and equal a plain sort of every datum the calls returned."""
    from cliptrack.adapters.miles.client import datum_sequence
    from cliptrack.core.worst import CRITERIA
    from cliptrack.store.worst import WORST_FILE, read_worst_file

    from tests.reference import plain_worst

    service = InProcessService()
    tracker = Tracker("tinker-worst", sinks=["jsonl"], spool_dir=tmp_path, handle_signals=False)
    client = TrackedTrainingClient(service, tracker, first_step=4)
    futures = []
    for call, n in enumerate((3, 5, 2)):
        data, _ = make_data(service, n, 40 + call)
        for i, datum in enumerate(data):
            datum.loss_fn_inputs[keys.DATUM_ID] = types.TensorData.from_torch(torch.tensor([call * 100 + i]))
        futures.append(client.forward_backward(data, "ppo"))
    client.optim_step(types.AdamParams(learning_rate=0.1))
    service.resolve([2, 0, 1])
    sequences = [datum_sequence(d) for f in futures for d in f.result().loss_fn_outputs]
    assert client.flush(timeout_s=60)
    tracker.close()
    (logged,) = read_worst_file(next(p for p in tmp_path.iterdir() if p.is_dir()) / WORST_FILE)
    assert logged.step == 4
    assert None not in sequences
    for c in CRITERIA:
        assert logged.by[c] == plain_worst(sequences, c, logged.k)


def test_ids_echoed_without_a_worst_token_keep_the_steps_metrics(tmp_path):
    """A service that echoes ``datum_id`` but not ``worst_token`` (not the Miles runtime): the step's
    metrics are logged exactly as without ids, with a warning that its worst sequences are left out."""
    from cliptrack.store.worst import WORST_FILE

    service = InProcessService()
    tracker = Tracker("tinker-ids", sinks=["jsonl"], spool_dir=tmp_path, handle_signals=False)
    client = TrackedTrainingClient(service, tracker)
    data, _ = make_data(service, 3, 7)
    for i, datum in enumerate(data):
        datum.loss_fn_inputs[keys.DATUM_ID] = types.TensorData.from_torch(torch.tensor([i]))
    future = client.forward_backward(data, "ppo")
    ((_, output),) = service.waiting
    for out in output.loss_fn_outputs:
        out.pop(keys.DATUM_WORST_TOKEN)
    client.optim_step(types.AdamParams(learning_rate=0.1))
    with pytest.warns(
        RuntimeWarning, match="no gauge and 'worst_token' to rank it by: the chunk's worst sequences"
    ):
        service.resolve([0])
        assert client.flush(timeout_s=60)
    tracker.close()
    assert client.logged_steps == [0]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert not (run_dir / WORST_FILE).exists()
    (point,) = [json.loads(line) for line in (run_dir / keys.POINTS_FILE).read_text().splitlines()]
    assert point["metrics"][keys.LOSS_TOKENS] == future.result().metrics[keys.LOSS_TOKENS]


def test_the_run_records_the_recipe_of_its_loss_calls(tmp_path):
    from cliptrack.core.recipe import Recipe, recipe_from_config

    service = InProcessService()
    tracker = Tracker("tinker-recipe", sinks=["jsonl"], spool_dir=tmp_path, handle_signals=False)
    client = TrackedTrainingClient(service, tracker)
    data, _ = make_data(service, 3, seed=5)
    client.forward_backward(data, "ppo", {"clip_high_threshold": 1.28})
    client.optim_step(types.AdamParams(learning_rate=0.1))
    service.resolve([0])
    assert client.flush(timeout_s=60)
    tracker.close()
    [run] = load_runs([tracker.run_id], jsonl_dir=tmp_path).runs
    assert recipe_from_config(run.run.config) == Recipe(
        loss="ppo", clip_low=0.8, clip_high=1.28, clip_reference="sampler", aggregation="sum"
    )
