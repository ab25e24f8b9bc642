"""The Megatron path in one process: Megatron-Core's real schedule on CPU, and the reduction alone.

Multi-process layouts (DP, TPxDP, DPxCP, PP) are in ``test_megatron_distributed.py``.
"""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cliptrack.adapters import megatron as mg
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses.builtin import INPUT_CHECKS, ppo
from cliptrack.core import keys, measures
from hypothesis import given
from hypothesis import strategies as st

from tests import _harness as harness
from tests import _megatron_setup as setup
from tests._harness import host_sync_forbidden
from tests.reference import objective_ppo

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def megatron_one_rank() -> Iterator[None]:
    """Megatron's parallel_state on a one-rank gloo group over 127.0.0.1, CUDA literals on CPU."""
    pytest.importorskip("megatron.core")
    with harness.megatron_one_rank():
        yield


def _one_rank_data(scenario: str) -> tuple[setup.GlobalBatch, list[dict]]:
    batch = setup.global_batch(scenario, setup.N_MICRO * setup.MICRO_BATCH)
    return batch, list(setup.micro_batches(scenario, batch, dp_rank=0, cp_rank=0, cp=1))


# ---- the real schedule, one rank ------------------------------------------------------------------


GAUGE_LIKE_KEYS = (
    *keys.GAUGE_KEYS,
    *keys.CAUSES_KEYS,
    *keys.STALENESS_KEYS,
    *(
        m.key
        for m in measures.DEFAULT.means
        if measures.DEFAULT.by_key[m.numerator].group in (measures.CAUSES, measures.STALENESS)
    ),
)
"""The gauge's keys, its engine and drift parts and the weight lag, with their means."""


def assert_gauge_close(got: dict[str, float], expected: dict[str, float]) -> None:
    """The gauge of a reduction against one pass over the whole batch: the same keys, counts exact,
    sums and extremes to float32 rounding of the log-probs. The schedule's model computes them
    micro-batch by micro-batch (and split over ranks), so where the sampler's log-probs are the
    one-pass model's own (``l = 0`` exactly there) the gauge reads the layouts' float32 differences:
    up to about 1e-7 per token, which is what it is for."""
    watched = set(GAUGE_LIKE_KEYS)
    assert set(got) & watched == set(expected) & watched
    tokens = expected[keys.LOSS_TOKENS]
    for key in set(expected) & watched:
        if key == keys.RATIO_OUTSIDE_TOKENS:
            assert got[key] == expected[key]
        elif key.endswith(":sum"):
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6 * tokens + 1e-6), key
        else:
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-5), key  # ulps of log-probs


@pytest.mark.parametrize("scenario", list(setup.SCENARIOS))
def test_schedule_matches_one_pass_over_the_whole_batch(megatron_one_rank, scenario):
    batch, data = _one_rank_data(scenario)
    model = setup.build_model()
    reports = setup.run_step(model, scenario, data, seq_len=setup.SEQ_LEN)
    assert len(reports) == setup.N_MICRO
    with setup.counted_collectives() as calls:
        fbo = mg.reduce_losses(reports)
    assert len(calls) == 1
    expected = setup.expected_metrics(scenario, batch)
    assert set(fbo.metrics) == set(expected)
    for key in (keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS, keys.CLIP_FRACTION, keys.RATIO_OUTSIDE_TOKENS):
        assert fbo.metrics.get(key) == expected.get(key), key
    assert fbo.metrics[keys.LOSS_SUM] == pytest.approx(expected[keys.LOSS_SUM], rel=1e-5, abs=1e-4)
    assert_gauge_close(fbo.metrics, expected)
    if setup.SCENARIOS[scenario]["loss_fn"] == "ppo":  # docs/CONTRACT.md's rule, token by token, agrees
        n, clipped, low, high = setup.plain_ppo_counts(batch)
        assert (fbo.metrics[keys.LOSS_TOKENS], fbo.metrics[keys.CLIPPED_TOKENS]) == (n, clipped)
        assert (fbo.metrics[keys.CLIPPED_LOW_TOKENS], fbo.metrics[keys.CLIPPED_HIGH_TOKENS]) == (low, high)


def test_scenarios_cover_the_edge_cases(megatron_one_rank):
    """An all-zero micro-batch, nothing clipping (keys present, 0), never clipping (keys absent)."""
    _, data = _one_rank_data("ppo")
    reports = setup.run_step(setup.build_model(), "ppo", data, seq_len=setup.SEQ_LEN)
    assert data[1]["inputs"]["mask"].sum() == 0
    assert reports[1][keys.LOSS_TOKENS] == 0 and reports[1][keys.CLIPPED_TOKENS] == 0
    ppo_metrics = mg.reduce_losses(reports).metrics
    assert ppo_metrics[keys.CLIPPED_LOW_TOKENS] > 0 and ppo_metrics[keys.CLIPPED_HIGH_TOKENS] > 0

    _, data = _one_rank_data("ppo_nothing_clips")
    nothing = mg.reduce_losses(setup.run_step(setup.build_model(), "ppo_nothing_clips", data, setup.SEQ_LEN))
    assert nothing.metrics[keys.CLIP_FRACTION] == 0.0
    assert nothing.metrics[keys.CLIPPED_TOKENS] == 0.0 and nothing.metrics[keys.LOSS_TOKENS] > 0

    _, data = _one_rank_data("cross_entropy")
    never = mg.reduce_losses(setup.run_step(setup.build_model(), "cross_entropy", data, setup.SEQ_LEN))
    assert set(never.metrics) == {keys.LOSS_SUM, keys.LOSS_TOKENS}

    _, data = _one_rank_data("ppo_empty_last_rank")  # one rank = the last DP rank: no eligible token
    empty = mg.reduce_losses(setup.run_step(setup.build_model(), "ppo_empty_last_rank", data, setup.SEQ_LEN))
    assert empty.metrics[keys.LOSS_TOKENS] == 0.0 and empty.metrics[keys.CLIPPED_TOKENS] == 0.0
    assert keys.CLIP_FRACTION not in empty.metrics


def test_micro_batches_of_different_lengths(megatron_one_rank):
    """Without pipeline parallelism the schedule takes micro-batches of any length."""
    lengths = (3, 16, 9, 1)
    parts = [setup.global_batch("ppo", setup.MICRO_BATCH, seq_len=n, seed=n) for n in lengths]
    data = [
        {
            "tokens": b.tokens,
            "labels": b.labels,
            "inputs": setup.loss_inputs("ppo", b, slice(None), slice(None)),
        }
        for b in parts
    ]
    reports = setup.run_step(setup.build_model(), "ppo", data, seq_len=max(lengths))
    fbo = mg.reduce_losses(reports)
    expected: dict[str, float] = {}
    for b in parts:
        for key, value in setup.expected_metrics("ppo", b).items():
            if key != keys.CLIP_FRACTION:
                expected[key] = expected.get(key, 0.0) + value
    for key in (keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS):
        assert fbo.metrics[key] == expected[key]
    assert [int(r[keys.LOSS_TOKENS]) for r in reports] == [int(b.mask.sum()) for b in parts]
    assert fbo.metrics[keys.CLIP_FRACTION] == expected[keys.CLIPPED_TOKENS] / expected[keys.LOSS_TOKENS]


@pytest.mark.parametrize("per_token_loss", [True, False])
def test_loss_values_and_gradients_unchanged(megatron_one_rank, per_token_loss):
    """Same schedule, plain PPO without counting vs make_loss_func: bit-identical gradients.

    Also pins down Megatron's scaling of the 3-tuple: with per-token loss the gradient is that of
    the summed loss (finalize_model_grads would divide by the global token count); without it,
    that of the mean over micro-batches of each micro-batch's token mean.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    scenario = "ppo"
    _, data = _one_rank_data(scenario)
    baseline_losses: list[torch.Tensor] = []

    def plain_step(data_iterator, model):  # type: ignore[no-untyped-def]
        micro = next(data_iterator)
        output = model(micro["tokens"], micro["labels"])
        inputs = micro["inputs"]

        def loss_func(output_tensor):  # type: ignore[no-untyped-def]
            loss = objective_ppo(
                -output_tensor, inputs["sampling_logprobs"], inputs["advantages"], inputs["mask"], 0.8, 1.2
            )
            baseline_losses.append(loss.detach().clone())
            return loss, (inputs["mask"] != 0).sum(), {}

        return output, loss_func

    baseline = setup.build_model(per_token_loss=per_token_loss)
    get_forward_backward_func()(
        forward_step_func=plain_step,
        data_iterator=iter(data),
        model=[baseline],
        num_microbatches=len(data),
        seq_length=setup.SEQ_LEN,
        micro_batch_size=setup.MICRO_BATCH,
    )
    counted = setup.build_model(per_token_loss=per_token_loss)
    reports = setup.run_step(counted, scenario, data, seq_len=setup.SEQ_LEN)

    grads = {name: p.grad for name, p in counted.named_parameters()}
    for name, p in baseline.named_parameters():
        assert grads[name] is not None and torch.equal(grads[name], p.grad), name
    for report, loss in zip(reports, baseline_losses, strict=True):
        assert torch.equal(report[keys.LOSS_SUM], loss)  # the unscaled sum, whatever the mode

    # what the scaling means: gradient of sum_m w_m * loss_m, computed by plain autograd
    direct = setup.build_model(per_token_loss=per_token_loss)
    total = torch.zeros(())
    for micro in data:
        inputs = micro["inputs"]
        lp = -direct(micro["tokens"], micro["labels"])
        loss = objective_ppo(lp, inputs["sampling_logprobs"], inputs["advantages"], inputs["mask"], 0.8, 1.2)
        weight = 1.0 if per_token_loss else 1.0 / (max(int(inputs["mask"].sum()), 1) * len(data))
        total = total + weight * loss
    total.backward()
    for name, p in direct.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-5, atol=1e-7)
        assert p.grad.abs().sum() > 0


def test_no_host_sync_in_the_loss_or_the_micro_batch_sum(megatron_one_rank):
    _, data = _one_rank_data("ppo")
    model = setup.build_model()
    outputs = [model(m["tokens"], m["labels"]) for m in data]
    reports = []
    with host_sync_forbidden():
        for micro, output in zip(data, outputs, strict=True):
            loss_func = mg.make_loss_func(
                "ppo", micro["inputs"], {"clip_high_threshold": 1.3}, output_to_logprobs=torch.neg
            )
            loss, num_tokens, report = loss_func(output)
            loss.backward()
            reports.append(report)
        packed = mg.sum_reports(reports)
    assert packed.dtype == torch.float64 and packed.shape == (len(mg.PACKED_FIELDS),)
    fields = dict(zip(mg.PACKED_FIELDS, packed.tolist(), strict=True))
    assert fields[keys.LOSS_TOKENS] == sum(float(m["inputs"]["mask"].sum()) for m in data)
    assert fields["calls"] == fields["clipping_calls"] == fields["split_calls"] == len(data)


def test_the_guard_catches_a_sync():
    with host_sync_forbidden(), pytest.raises(AssertionError, match="host synchronisation"):
        bool(torch.ones(()) > 0)


# ---- the loss function and its report -------------------------------------------------------------


def _micro(n: int = 12, seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    logprobs = (torch.randn(n, generator=gen) * 0.3 - 1.0).requires_grad_()
    inputs = {
        "sampling_logprobs": torch.randn(n, generator=gen) * 0.3 - 1.0,
        "advantages": torch.randn(n, generator=gen),
        "mask": (torch.rand(n, generator=gen) > 0.3).float(),
    }
    return logprobs, inputs


def test_loss_func_returns_megatrons_three_tuple():
    logprobs, inputs = _micro()
    loss, num_tokens, report = mg.make_loss_func("ppo", inputs)(logprobs)
    direct = ppo(logprobs, **inputs)
    assert torch.equal(loss, direct.loss) and loss.requires_grad
    assert num_tokens.dtype == torch.int64 and int(num_tokens) == int((inputs["mask"] != 0).sum())
    assert set(report) == {keys.LOSS_SUM, *direct.measured, mg.REPORT_INVALID}
    assert set(direct.measured) == {keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS, *keys.GAUGE_MEASURED_KEYS}
    for key in keys.GAUGE_MEASURED_KEYS:
        assert report[key].dtype == torch.float64 and not report[key].requires_grad
    for key in (keys.LOSS_SUM, keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS):
        assert report[key].dim() == 0 and not report[key].requires_grad
    assert report[keys.CLIPPED_TOKENS].dtype == torch.int64
    assert int(report[keys.CLIPPED_TOKENS]) == int(direct.get(keys.CLIPPED_TOKENS))
    loss /= 7.0  # Megatron scales the returned loss in place (calculate_per_token_loss off)
    assert torch.equal(report[keys.LOSS_SUM], direct.loss.detach())


def test_never_clipping_loss_reports_no_clip_keys():
    logprobs, inputs = _micro()
    _, _, report = mg.make_loss_func("dro", inputs, {"beta": 0.1})(logprobs)
    assert set(report) == {keys.LOSS_SUM, keys.LOSS_TOKENS, *keys.GAUGE_MEASURED_KEYS, mg.REPORT_INVALID}
    fbo = mg.reduce_losses([report, report], group=None)
    assert set(fbo.metrics) == {keys.LOSS_SUM, keys.LOSS_TOKENS, *keys.GAUGE_KEYS}
    assert fbo.metrics[keys.LOSS_TOKENS] == 2 * int((inputs["mask"] != 0).sum())
    # the gauge of the same micro-batch twice: sums doubled, extremes unchanged
    gauge = {key: float(report[key]) for key in keys.GAUGE_MEASURED_KEYS}
    assert fbo.metrics[keys.KL_K3_SUM] == 2 * gauge[keys.KL_K3_SUM]
    assert fbo.metrics[keys.LOG_RATIO_MAX] == gauge[keys.LOG_RATIO_MAX]
    assert fbo.metrics[keys.LOG_RATIO_MIN] == gauge[keys.LOG_RATIO_MIN]


@pytest.mark.parametrize(
    ("loss_fn", "inputs", "config", "message"),
    [
        ("ppo2", {}, {}, "loss_fn 'ppo2'"),
        (
            "ppo",
            {"sampling_logprobs": torch.zeros(2), "advantages": torch.zeros(2), "labels": torch.zeros(2)},
            {},
            "'labels', which loss ppo does not take",
        ),
        ("ppo", {"sampling_logprobs": torch.zeros(2)}, {}, "lacks \\['advantages'\\]"),
        ("ppo", {"sampling_logprobs": torch.zeros(2), "advantages": torch.zeros(2)}, {"clip": 0.2}, "'clip'"),
        (
            "dro",
            {"sampling_logprobs": torch.zeros(2), "advantages": torch.zeros(2)},
            {},
            "lacks \\['beta'\\]",
        ),
        ("ppo", {"sampling_logprobs": [0.0], "advantages": torch.zeros(1)}, {}, "sampling_logprobs"),
    ],
)
def test_bad_loss_arguments_are_named(loss_fn, inputs, config, message):
    with pytest.raises((ValueError, TypeError), match=message):
        mg.make_loss_func(loss_fn, inputs, config)


def test_bad_input_values_raise_after_the_one_collective(megatron_one_rank):
    logprobs, inputs = _micro()
    good = mg.make_loss_func("ppo", inputs)(logprobs)[2]
    inputs = dict(inputs, advantages=inputs["advantages"].clone())
    inputs["advantages"][3] = float("nan")
    bad = mg.make_loss_func("ppo", inputs)(logprobs)[2]
    with setup.counted_collectives() as calls, pytest.raises(ValueError, match="advantages"):
        mg.reduce_losses([good, bad])
    assert len(calls) == 1


# ---- the reduction without Megatron-Core ----------------------------------------------------------


def _report(loss: float, tokens: int, low: int | None = None, high: int | None = None) -> dict:
    report = {
        keys.LOSS_SUM: torch.tensor(loss, dtype=torch.float32),
        keys.LOSS_TOKENS: torch.tensor(tokens),
        mg.REPORT_INVALID: torch.zeros(len(INPUT_CHECKS), dtype=torch.int64),
    }
    if low is not None and high is not None:
        report[keys.CLIPPED_TOKENS] = torch.tensor(low + high)
        report[keys.CLIPPED_LOW_TOKENS] = torch.tensor(low)
        report[keys.CLIPPED_HIGH_TOKENS] = torch.tensor(high)
    return report


micro_counts = st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)).map(
    lambda t: (t[0] + t[1] + t[2], t[0], t[1])
)


@given(
    st.lists(micro_counts, min_size=1, max_size=12), st.lists(st.floats(-1e3, 1e3), min_size=12, max_size=12)
)
def test_sums_of_reports_are_exact(counts, losses):
    reports = [_report(loss, n, low, high) for (n, low, high), loss in zip(counts, losses, strict=False)]
    metrics = mg.reduce_losses(reports, group=None).metrics
    tokens = sum(c[0] for c in counts)
    low, high = sum(c[1] for c in counts), sum(c[2] for c in counts)
    assert metrics[keys.LOSS_TOKENS] == tokens
    assert (metrics[keys.CLIPPED_LOW_TOKENS], metrics[keys.CLIPPED_HIGH_TOKENS]) == (low, high)
    assert metrics[keys.CLIPPED_TOKENS] == low + high
    if tokens:
        assert metrics[keys.CLIP_FRACTION] == (low + high) / tokens
    else:
        assert keys.CLIP_FRACTION not in metrics
    expected_loss = math.fsum(float(torch.tensor(x, dtype=torch.float32)) for x in losses[: len(counts)])
    assert metrics[keys.LOSS_SUM] == pytest.approx(expected_loss, rel=1e-9, abs=1e-6)


def test_token_weighted_not_a_mean_of_micro_batch_fractions():
    reports = [_report(0.0, 10, 0, 5), _report(0.0, 10_000, 0, 0)]
    assert mg.reduce_losses(reports, group=None).metrics[keys.CLIP_FRACTION] == 5 / 10_010


@pytest.mark.parametrize(
    ("reports", "error", "message"),
    [
        ([], ValueError, "empty on every rank"),
        ({"loss:sum": 1}, TypeError, "losses_reduced must be the list"),
        ([_report(1.0, 3, 0, 1), _report(1.0, 3)], ValueError, "1 of 2 loss calls come from a clipping loss"),
        ([_report(1.0, 3), {keys.LOSS_SUM: torch.tensor(1.0)}], ValueError, "micro-batch 1: report lacks"),
        ([{**_report(1.0, 3), keys.CLIPPED_LOW_TOKENS: torch.tensor(1)}], ValueError, "but not"),
        (
            [{**_report(1.0, 3, 0, 1), keys.CLIPPED_HIGH_TOKENS: torch.tensor(0)}],
            ValueError,
            "!= clipped_tokens",
        ),
        ([{**_report(1.0, 3), keys.LOSS_TOKENS: 3}], TypeError, "expected a tensor"),
        ([{**_report(1.0, 3), keys.LOSS_TOKENS: torch.ones(2)}], ValueError, "shape \\(2,\\)"),
        ([_report(1.0, 3, 2, 2)], ValueError, "exceeds loss_tokens"),
        ([_report(float("nan"), 3)], ValueError, "not finite"),
        ([3.0], TypeError, "micro-batch 0: report is a float"),
        # counts from a hand-written loss: never truncated to an int or emitted negative
        (
            [{**_report(1.0, 3), keys.LOSS_TOKENS: torch.tensor(2.5)}],
            ValueError,
            "loss_tokens:sum.*fraction 2.5",
        ),
        (
            [{**_report(1.0, 3, 0, 1), keys.LOSS_TOKENS: torch.tensor(2.5)}],
            ValueError,
            "loss_tokens:sum.*fraction",
        ),
        (
            [
                {
                    **_report(1.0, 3, 0, 1),
                    keys.CLIPPED_LOW_TOKENS: torch.tensor(0.5),
                    keys.CLIPPED_HIGH_TOKENS: torch.tensor(0.5),
                }
            ],
            ValueError,
            "clipped_low_tokens:sum.*fraction 0.5",
        ),
        ([_report(1.0, -3)], ValueError, "loss_tokens:sum .*must be >= 0"),
    ],
)
def test_bad_reports_are_named(reports, error, message):
    with pytest.raises(error, match=message):
        mg.reduce_losses(reports, group=None)


def test_works_without_megatron_core_installed():
    """With ``megatron`` unimportable, the module imports and reduces reports for one process."""
    code = (
        "import sys; sys.modules['megatron'] = None; sys.modules['megatron.core'] = None\n"
        "import torch\n"
        "from cliptrack.adapters.megatron import make_loss_func, reduce_losses, broadcast_from_last_stage\n"
        "lp = torch.tensor([-1.0, -0.5, -2.0]); slp = torch.tensor([-1.5, -0.5, -1.0])\n"
        "f = make_loss_func('ppo', {'sampling_logprobs': slp, 'advantages': torch.tensor([1.0, 1.0, -1.0])})\n"
        "fbo = broadcast_from_last_stage(reduce_losses([f(lp)[2]]))\n"
        "print(sorted(fbo.metrics.items()))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = dict(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    # ratios exp(0.5)=1.65 with A>0 (high side bites), 1.0, exp(-1)=0.37 with A<0 (low side bites)
    assert metrics[keys.LOSS_SUM] == pytest.approx(-(1.2 + 1.0 - 0.8), rel=1e-6)
    assert metrics[keys.LOSS_TOKENS] == 3.0 and metrics[keys.CLIPPED_TOKENS] == 2.0
    assert (metrics[keys.CLIPPED_LOW_TOKENS], metrics[keys.CLIPPED_HIGH_TOKENS]) == (1.0, 1.0)
    assert metrics[keys.CLIP_FRACTION] == 2 / 3


def test_module_does_not_import_megatron():
    code = "import sys, cliptrack.adapters.megatron; print('megatron' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


def test_merged_counts_at_2_to_the_53_are_refused():
    fields = dict.fromkeys(mg.PACKED_FIELDS, 0.0)
    fields.update({keys.LOSS_SUM: 1.0, keys.LOSS_TOKENS: float(2**53), "calls": 1.0})
    with pytest.raises(ValueError, match="reached 2\\*\\*53"):
        mg.output_from_sums([fields[f] for f in mg.PACKED_FIELDS])
    fields[keys.LOSS_TOKENS] = float(2**53 - 1)
    assert mg.output_from_sums([fields[f] for f in mg.PACKED_FIELDS]).metrics[keys.LOSS_TOKENS] == 2**53 - 1


@given(
    st.lists(
        st.sampled_from(["ppo", "cispo", "importance_sampling", "cross_entropy"]), min_size=1, max_size=6
    )
)
def test_sum_reports_equals_the_reports_packed_one_by_one_in_any_mix_of_layouts(names):
    """One layout is packed in a few stacked ops, a mix report by report: both are the combination
    of each micro-batch's own packed vector (the reference: ``pack`` of its LossOutput)."""
    reports, rows = [], []
    for i, name in enumerate(names):
        logprobs, inputs = _micro(seed=i)
        if name == "cross_entropy":
            inputs = {"weights": inputs["mask"]}
        reports.append(mg.make_loss_func(name, inputs)(logprobs)[2])
        rows.append(losses.pack(losses.LOSSES[name](logprobs, **inputs)))
    expected = losses.combine_packed(torch.stack(rows))
    assert torch.equal(mg.sum_reports(reports), expected)
