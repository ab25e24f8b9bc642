"""A custom loop's step as one point: ``cliptrack.log.steps.step_metrics`` against a plain reference,
and ``Tracker.log_output`` / ``with tracker.step(step):`` through a real tracker and its spool."""

from __future__ import annotations

import json

import pytest
from cliptrack import Tracker
from cliptrack.core import keys
from cliptrack.log.steps import step_metrics
from hypothesis import given
from hypothesis import strategies as st


@st.composite
def parts(draw):
    tokens = draw(st.integers(0, 10_000))
    clipped = draw(st.integers(0, tokens))
    low = draw(st.integers(0, clipped))
    return {
        keys.LOSS_SUM: draw(st.floats(-1e6, 1e6)),
        keys.LOSS_TOKENS: float(tokens),
        keys.CLIPPED_TOKENS: float(clipped),
        keys.CLIPPED_LOW_TOKENS: float(low),
        keys.CLIPPED_HIGH_TOKENS: float(clipped - low),
    }


@given(st.lists(parts(), min_size=1, max_size=6), st.floats(0.001, 100.0))
def test_counts_are_summed_exactly_and_the_fraction_formed_once(maps, seconds):
    out = step_metrics(*maps, reward=0.5, step_time_s=seconds)
    tokens = sum(int(m[keys.LOSS_TOKENS]) for m in maps)
    clipped = sum(int(m[keys.CLIPPED_TOKENS]) for m in maps)
    assert out[keys.LOSS_TOKENS] == tokens and out[keys.CLIPPED_TOKENS] == clipped
    assert out[keys.CLIPPED_LOW_TOKENS] + out[keys.CLIPPED_HIGH_TOKENS] == clipped
    if tokens:
        assert out[keys.CLIP_FRACTION] == clipped / tokens
    else:
        assert keys.CLIP_FRACTION not in out  # never invented
    assert out[keys.THROUGHPUT] == tokens / seconds and out[keys.STEP_TIME] == seconds
    assert out[keys.REWARD] == 0.5
    assert out[keys.LOSS_SUM] == pytest.approx(sum(m[keys.LOSS_SUM] for m in maps), abs=1e-6)


def test_bad_parts_are_named():
    with pytest.raises(ValueError, match="loss part 0"):
        step_metrics({"metrics": 3})
    with pytest.raises(ValueError, match="step_time_s must be > 0"):
        step_metrics({keys.LOSS_TOKENS: 1.0}, step_time_s=0.0)
    with pytest.raises(ValueError, match="already given"):
        step_metrics({keys.LOSS_TOKENS: 1.0}, reward=1.0, extra={keys.REWARD: 2.0})


def _points(tmp_path, run_id):
    lines = (tmp_path / "spool" / run_id / keys.POINTS_FILE).read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_a_timed_step_logs_one_point_with_step_time_and_throughput(tmp_path):
    first = {keys.LOSS_SUM: 1.0, keys.LOSS_TOKENS: 30.0, keys.CLIPPED_TOKENS: 3.0}
    second = {keys.LOSS_SUM: 2.0, keys.LOSS_TOKENS: 10.0, keys.CLIPPED_TOKENS: 1.0}
    with Tracker("loop", sinks=["jsonl"], spool_dir=tmp_path / "spool") as tracker:
        with tracker.step(0):
            tracker.log_output(0, first, reward=0.1)
            tracker.log_output(0, second, reward=0.25)  # a second epoch: counts add, the reward is replaced
        tracker.log_output(1, first)  # outside a step block: logged at once, untimed
        with pytest.raises(RuntimeError), tracker.step(2):
            tracker.log_output(2, first)
            raise RuntimeError("a failing step logs nothing")
        run_id = tracker.run_id
    step0, step1 = _points(tmp_path, run_id)
    metrics = step0["metrics"]
    assert step0["step"] == 0 and metrics[keys.LOSS_TOKENS] == 40 and metrics[keys.CLIPPED_TOKENS] == 4
    assert metrics[keys.CLIP_FRACTION] == 4 / 40 and metrics[keys.REWARD] == 0.25
    assert metrics[keys.STEP_TIME] > 0
    assert metrics[keys.THROUGHPUT] == pytest.approx(40 / metrics[keys.STEP_TIME])
    assert step1["step"] == 1 and keys.STEP_TIME not in step1["metrics"]


def test_an_empty_step_block_is_an_error(tmp_path):
    with Tracker("loop", sinks=["jsonl"], spool_dir=tmp_path / "spool") as tracker:
        with pytest.raises(ValueError, match="nothing was logged inside tracker.step"), tracker.step(0):
            pass
        with pytest.raises(ValueError, match="step 1: log_output needs at least one output"):
            tracker.log_output(1, reward=0.5)


def test_parts_with_the_gauge_combine_as_one_pass():
    """Two loss parts of one step: counts add exactly, gauge sums add, extremes by max / min, and the
    means are formed from the combined sums — as one pass over all the tokens gives them."""
    import torch
    from cliptrack.adapters.losses.builtin import ppo
    from cliptrack.adapters.losses.output import loss_metrics

    g = torch.Generator().manual_seed(3)
    lp = torch.randn(300, generator=g, dtype=torch.float64)
    slp = lp + 0.2 * torch.randn(300, generator=g, dtype=torch.float64)
    adv = torch.randn(300, generator=g, dtype=torch.float64)
    mask = torch.rand(300, generator=g) > 0.2
    whole = loss_metrics(ppo(lp, slp, adv, mask))
    parts = [loss_metrics(ppo(lp[s], slp[s], adv[s], mask[s])) for s in (slice(0, 110), slice(110, 300))]
    got = step_metrics(*parts)
    assert set(got) == set(whole)
    for key in keys.TOKEN_COUNT_KEYS + (keys.RATIO_OUTSIDE_TOKENS, keys.LOG_RATIO_MAX, keys.LOG_RATIO_MIN):
        assert got[key] == whole[key], key
    for key in (keys.KL_K3_SUM, keys.ABS_LOG_RATIO_SUM, keys.KL_K3_MEAN, keys.CLIP_FRACTION, keys.LOSS_SUM):
        assert got[key] == pytest.approx(whole[key], rel=1e-12), key
