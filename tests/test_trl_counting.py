"""cliptrack's TRL counting without TRL: each micro-step through the core loss against a per-token
reference of TRL's own formulas (``tests/_trl_harness.py``), the logging window's sums, and TRL as a
:class:`cliptrack.adapters.shared.stack.Stack`. ``cliptrack.adapters.trl`` needs torch alone until its
``GRPOTrainer`` is used (tests/test_trl.py runs TRL's real trainer where TRL is installed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from cliptrack.adapters import trl as ct_trl
from cliptrack.adapters.shared.stack import Stack, run_step
from cliptrack.core import keys
from hypothesis import given
from hypothesis import strategies as st

from tests._trl_harness import reference_bites


def trl_args(**overrides: Any) -> SimpleNamespace:
    """The ``GRPOConfig`` fields :func:`cliptrack.adapters.trl.recipe_of` reads, at TRL 1.16's
    defaults (tests/test_trl.py reads the real ``GRPOConfig``)."""
    values: dict[str, Any] = dict(
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=None,
        delta=None,
        importance_sampling_level="token",
        use_vllm=False,
        vllm_importance_sampling_correction=True,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def _tensors(draw: Any, shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    b, t = shape
    numbers = st.floats(-1.5, 1.5, allow_nan=False, width=32)
    logps = torch.tensor(draw(st.lists(numbers, min_size=b * t, max_size=b * t))).reshape(b, t) - 2
    shift = torch.tensor(draw(st.lists(numbers, min_size=b * t, max_size=b * t))).reshape(b, t) / 3
    adv = torch.tensor(draw(st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0]), min_size=b, max_size=b)))
    mask = torch.tensor(draw(st.lists(st.integers(0, 1), min_size=b * t, max_size=b * t))).reshape(b, t)
    return {"logps": logps, "old": logps - shift, "advantages": adv, "mask": mask}


@st.composite
def micro_steps(draw: Any) -> dict[str, torch.Tensor]:
    shape = (draw(st.integers(1, 4)), draw(st.integers(1, 6)))
    return _tensors(draw, shape)


@given(
    micro=micro_steps(),
    loss_type=st.sampled_from(["grpo", "dapo", "cispo"]),
    eps=st.sampled_from([0.1, 0.2, 0.28]),
)
def test_counts_equal_trl_formulas_per_token(micro, loss_type, eps):
    recipe = ct_trl.recipe_of(
        trl_args(loss_type=loss_type, epsilon=eps, epsilon_high=eps if loss_type != "cispo" else 1 + eps)
    )
    measured = ct_trl.measure_micro_step(
        recipe, micro["logps"], micro["old"], micro["advantages"], micro["mask"]
    )
    counts = measured.output.token_counts()
    high_eps = eps if loss_type != "cispo" else 1 + eps
    tokens, clipped, low, high = reference_bites(micro, loss_type, eps, high_eps)
    assert (counts.loss_tokens, counts[keys.CLIPPED_TOKENS]) == (tokens, clipped)
    assert (counts[keys.CLIPPED_LOW_TOKENS], counts[keys.CLIPPED_HIGH_TOKENS]) == (low, high)
    assert not measured.gauge  # no sampler log-probs given: the window logs no gauge


def test_window_sums_micro_steps_and_forms_the_fraction_once():
    recipe = ct_trl.recipe_of(trl_args())
    big = {
        "logps": torch.full((1, 10), -1.0),
        "old": torch.full((1, 10), -1.5),
        "advantages": torch.tensor([1.0]),
        "mask": torch.ones(1, 10),
    }
    small = {
        "logps": torch.full((1, 2), -1.0),
        "old": torch.full((1, 2), -1.0),
        "advantages": torch.tensor([1.0]),
        "mask": torch.ones(1, 2),
    }
    window = ct_trl.ExactWindow()
    for micro in (big, small):
        measured = ct_trl.measure_micro_step(
            recipe, micro["logps"], micro["old"], micro["advantages"], micro["mask"]
        )
        window.add(measured.output, gauge=measured.gauge)
    counts = window.reduce("test")
    assert counts is not None and window.empty
    metrics = counts.to_metrics()
    # r = e^0.5 > 1.2 with A > 0: all ten tokens of the first micro-step clip, none of the second
    assert (metrics[keys.CLIPPED_TOKENS], metrics[keys.LOSS_TOKENS]) == (10, 12)
    assert metrics[keys.CLIP_FRACTION] == 10 / 12  # not (1 + 0) / 2, TRL's mean over micro-steps
    assert not counts.has_gauge  # no sampler log-probs: no gauge
    assert window.reduce("again") is None


def test_sampler_log_probs_give_the_gauge_split_by_the_old_ones():
    """With vLLM's log-probs (and its importance weights) the gauge is against the sampler and
    split into engine (old - sampler) and drift (current - old); the clip counts stay against old."""
    recipe = ct_trl.recipe_of(trl_args(use_vllm=True))
    assert recipe.importance_sampling_correction
    logps = torch.tensor([[-1.0, -1.0, -2.0]])
    old = torch.tensor([[-1.5, -1.0, -2.0]])
    sampler = torch.tensor([[-1.5, -1.25, -2.0]])
    adv, mask = torch.tensor([1.0]), torch.ones(1, 3)
    weights = torch.exp(old - sampler)
    measured = ct_trl.measure_micro_step(recipe, logps, old, adv, mask, sampler, weights)
    assert measured.gauge
    counts = measured.output.token_counts()
    assert counts[keys.CLIPPED_TOKENS] == 1  # exp(0.5) > 1.2 against old; the second token is 1 against old
    assert counts[keys.LOG_RATIO_SUM] == pytest.approx(0.5 + 0.25)  # current - sampler
    assert counts[keys.ENGINE_LOG_RATIO_SUM] == pytest.approx(0.25)  # old - sampler
    assert counts[keys.DRIFT_LOG_RATIO_SUM] == pytest.approx(0.5)  # current - old


def test_trl_is_a_stack_whose_step_counts_exactly():
    assert isinstance(ct_trl.STACK, Stack) and ct_trl.STACK.name == "trl"
    calls = []
    for tokens, clipped in ((10, 10), (2, 0)):
        logps = torch.full((tokens,), -1.0, requires_grad=True)
        shift = 0.5 if clipped else 0.0
        inputs = {
            "sampling_logprobs": torch.full((tokens,), -1.0 - shift),
            "advantages": torch.ones(tokens),
            "mask": torch.ones(tokens),
        }
        calls.append((logps, inputs))
    result = run_step(ct_trl.STACK, "ppo", calls, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    assert result.sums is not None
    assert (result.sums[keys.CLIPPED_TOKENS], result.sums.loss_tokens) == (10, 12)
    assert result.output.metrics[keys.CLIP_FRACTION] == 10 / 12
    assert ct_trl.STACK.read_back({"loss": 0.1, **result.sums.to_metrics()}) == result.sums
    with pytest.raises(ValueError, match="at least one"):
        ct_trl.STACK.reduce([])


def test_refusals_name_the_option():
    with pytest.raises(ValueError, match="importance_sampling_level='sequence' is not supported"):
        ct_trl.recipe_of(trl_args(importance_sampling_level="sequence"))
    with pytest.raises(ValueError, match="delta=1.1 is at or below 1 \\+ epsilon_high"):
        ct_trl.recipe_of(trl_args(delta=1.1))
    with pytest.raises(ValueError, match="loss_type='ppo2' is not a TRL loss type"):
        ct_trl.recipe_of(trl_args(loss_type="ppo2"))


def test_delta_is_counted_as_the_dual_clip():
    """TRL's ``delta`` clamps the unclipped ratio at delta: for A < 0 and r > delta the loss is
    ``-delta*A``, verl's dual clip with c = delta; counted apart from the band's clips."""
    recipe = ct_trl.recipe_of(trl_args(delta=2.0))
    assert recipe.dual_clip == 2.0 and recipe.recipe().dual_clip == 2.0
    old = torch.zeros(1, 4) - 2
    logps = old + torch.log(torch.tensor([[3.0, 1.5, 3.0, 0.5]]))  # r = 3, 1.5, 3, 0.5
    adv = torch.tensor([[-1.0, -1.0, 1.0, -1.0]])
    counts = ct_trl.measure_micro_step(recipe, logps, old, adv, torch.ones(1, 4)).output.token_counts()
    coef_1 = torch.exp(logps - old)
    bound_bites = int(((adv < 0) & (coef_1 > 2.0)).sum())  # TRL: min(min(r, delta)*A, ...) = delta*A
    assert counts["dual_clipped_tokens:sum"] == bound_bites == 1
    assert counts[keys.CLIPPED_TOKENS] == 2  # r = 3 with A > 0 (high), r = 0.5 with A < 0 (low)


def test_a_token_vllm_could_not_score_is_measured_against_old():
    """vLLM gives NaN for a token it could not score (TRL keeps it): the micro-step is still
    counted, that token's engine part 0 (sampler taken as the old log-probs), no invalid input."""
    recipe = ct_trl.recipe_of(trl_args(use_vllm=True))
    logps, old = torch.tensor([[-1.0, -1.0]]), torch.tensor([[-1.0, -1.5]])
    sampler = torch.tensor([[-1.25, float("nan")]])
    measured = ct_trl.measure_micro_step(recipe, logps, old, torch.tensor([1.0]), torch.ones(1, 2), sampler)
    counts = measured.output.token_counts()  # raises for an invalid input
    assert counts[keys.ENGINE_LOG_RATIO_SUM] == pytest.approx(0.25)  # the first token's old - sampler
    assert counts[keys.DRIFT_LOG_RATIO_SUM] == pytest.approx(0.5)
    assert counts[keys.CLIPPED_TOKENS] == 1  # exp(0.5) > 1.2 against old
