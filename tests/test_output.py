"""ForwardBackwardOutput metrics: merging, tinker compatibility, exact fractions, bad input."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses.output import (
    ForwardBackwardOutput,
    clip_counts,
    loss_metrics,
    merge_outputs,
    validate_metrics,
)
from cliptrack.core import keys
from cliptrack.core.sums import MeasuredSums
from hypothesis import given
from hypothesis import strategies as st
from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results
from tinker.types import ForwardBackwardOutput as TinkerForwardBackwardOutput


def _chunk(n_datums: int, tokens_per_datum: list[int], seed: int, loss=losses.ppo):
    gen = torch.Generator().manual_seed(seed)
    outs = []
    for n in tokens_per_datum[:n_datums]:
        lp = -torch.rand(n, generator=gen) * 3
        slp = lp + 0.5 * torch.randn(n, generator=gen)
        outs.append(loss(lp, slp, torch.randn(n, generator=gen), torch.ones(n)))
    metrics = loss_metrics(*outs)
    return ForwardBackwardOutput(
        loss_fn_output_type="TorchLossReturn", loss_fn_outputs=[{}] * n_datums, metrics=metrics
    ), outs


def test_our_type_is_tinkers_own():
    assert ForwardBackwardOutput is TinkerForwardBackwardOutput


@given(
    sizes=st.lists(st.lists(st.integers(1, 200), min_size=1, max_size=6), min_size=1, max_size=6),
    seed=st.integers(0, 1000),
)
def test_tinker_chunk_merger_keeps_the_exact_token_fraction_through_clip_counts(sizes, seed):
    chunks, all_outs = [], []
    for i, tokens in enumerate(sizes):
        fbo, outs = _chunk(len(tokens), tokens, seed + i)
        chunks.append(fbo)
        all_outs.extend(outs)
    whole = loss_metrics(*all_outs)
    merged_by_tinker = combine_fwd_bwd_output_results(chunks)
    counts = clip_counts(merged_by_tinker)
    assert counts is not None
    assert counts.loss_tokens == whole[keys.LOSS_TOKENS]
    assert counts[keys.CLIPPED_TOKENS] == whole[keys.CLIPPED_TOKENS]
    assert counts.fraction == whole[keys.CLIP_FRACTION]
    ours = merge_outputs(chunks)
    assert ours.metrics[keys.CLIP_FRACTION] == whole[keys.CLIP_FRACTION]
    assert ours.metrics[keys.LOSS_SUM] == pytest.approx(whole[keys.LOSS_SUM], rel=1e-5, abs=1e-3)
    # the JSON dict form a REST frontend returns reads the same
    as_json = json.loads(json.dumps({**dataclasses.asdict(merged_by_tinker), "loss_fn_outputs": []}))
    assert clip_counts(as_json) == counts


def test_tinkers_datum_weighted_mean_is_wrong_and_ours_is_the_ratio_of_sums():
    small = ForwardBackwardOutput(
        "x",
        [{}],
        {
            keys.LOSS_TOKENS: 10.0,
            keys.CLIPPED_TOKENS: 10.0,
            keys.CLIPPED_LOW_TOKENS: 0.0,
            keys.CLIPPED_HIGH_TOKENS: 10.0,
            keys.CLIP_FRACTION: 1.0,
        },
    )
    large = ForwardBackwardOutput(
        "x",
        [{}],
        {
            keys.LOSS_TOKENS: 10000.0,
            keys.CLIPPED_TOKENS: 0.0,
            keys.CLIPPED_LOW_TOKENS: 0.0,
            keys.CLIPPED_HIGH_TOKENS: 0.0,
            keys.CLIP_FRACTION: 0.0,
        },
    )
    assert combine_fwd_bwd_output_results([small, large]).metrics[keys.CLIP_FRACTION] == 0.5
    assert merge_outputs([small, large]).metrics[keys.CLIP_FRACTION] == 10 / 10010
    assert clip_counts(combine_fwd_bwd_output_results([small, large])).fraction == 10 / 10010


def test_merge_follows_tinkers_reductions_for_other_suffixes():
    a = ForwardBackwardOutput("x", [{}, {}, {}], {"lr:mean": 1.0, "t:max": 3.0, "u:min": 2.0, "s:sum": 1.5})
    b = ForwardBackwardOutput(
        "x", [{}], {"lr:mean": 5.0, "t:max": 1.0, "u:min": 7.0, "s:sum": 2.0, "only_b:sum": 1}
    )
    ours = merge_outputs([a, b]).metrics
    theirs = combine_fwd_bwd_output_results([a, b]).metrics
    assert ours == pytest.approx(theirs)
    assert "only_b:sum" not in ours
    assert ours["lr:mean"] == 2.0


def test_never_clipping_loss_has_no_clip_keys_and_clip_counts_is_none():
    fbo, _ = _chunk(3, [4, 5, 6], 0, loss=losses.importance_sampling)
    assert not set(keys.CLIP_COUNT_KEYS + (keys.CLIP_FRACTION,)) & set(fbo.metrics)
    assert clip_counts(fbo) is None
    assert clip_counts(merge_outputs([fbo, fbo])) is None


def test_nothing_clips_gives_fraction_zero_with_keys_present():
    lp = torch.zeros(5)
    metrics = loss_metrics(losses.ppo(lp, lp, torch.ones(5)))
    assert metrics[keys.CLIP_FRACTION] == 0.0 and metrics[keys.CLIPPED_TOKENS] == 0.0


def test_zero_eligible_tokens_gives_no_fraction_and_no_nan():
    lp = torch.zeros(4)
    metrics = loss_metrics(losses.ppo(lp, lp + 1, torch.ones(4), torch.zeros(4)))
    assert metrics[keys.LOSS_TOKENS] == 0.0
    assert keys.CLIP_FRACTION not in metrics
    assert not any(math.isnan(v) for v in metrics.values())
    assert MeasuredSums(dict.fromkeys(keys.TOKEN_COUNT_KEYS, 0)).fraction is None


# ---- bad input -------------------------------------------------------------------------------------


def test_shape_mismatch_names_the_tensor():
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\) but logprobs has shape \(4,\)"):
        losses.ppo(torch.zeros(4), torch.zeros(4), torch.zeros(3))
    with pytest.raises(ValueError, match="mask has shape"):
        losses.cispo(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(3))


@pytest.mark.parametrize("which", ["logprobs", "sampling_logprobs", "advantages"])
def test_non_finite_inputs_are_named_with_their_count(which):
    inputs = {"logprobs": torch.zeros(6), "sampling_logprobs": torch.zeros(6), "advantages": torch.ones(6)}
    inputs[which][1] = float("nan")
    inputs[which][4] = float("inf")
    out = losses.ppo(**inputs)
    with pytest.raises(ValueError, match=f"{which} has 2 non-finite entries"):
        loss_metrics(out)
    with pytest.raises(ValueError, match=f"{which} has 2 non-finite"):
        out.check()


def test_cross_entropy_non_finite_weights_are_named():
    weights = torch.tensor([1.0, float("nan"), 1.0])
    with pytest.raises(ValueError, match="weights has 1 non-finite"):
        loss_metrics(losses.cross_entropy(torch.zeros(3), weights))


@pytest.mark.parametrize(
    "low,high,match",
    [
        (1.3, 1.2, "above clip_high_threshold"),
        (-0.1, 1.2, "clip_low_threshold must be"),
        (0.8, float("inf"), "clip_high_threshold must be"),
    ],
)
def test_bad_thresholds(low, high, match):
    with pytest.raises(ValueError, match=match):
        losses.ppo(
            torch.zeros(2), torch.zeros(2), torch.ones(2), clip_low_threshold=low, clip_high_threshold=high
        )


def test_bad_tensor_thresholds_are_counted_on_device_and_raised_at_the_host():
    low = torch.tensor([[0.8], [1.5], [-1.0]])
    out = losses.cispo(
        torch.zeros(3, 2),
        torch.zeros(3, 2),
        torch.ones(3, 2),
        clip_low_threshold=low,
        clip_high_threshold=torch.tensor(1.2),
    )
    with pytest.raises(ValueError, match="clip thresholds have 2 entries"):
        out.check()


def test_rl_mask_must_be_zero_one_or_boolean():
    out = losses.ppo(torch.zeros(3), torch.zeros(3), torch.ones(3), torch.tensor([1.0, 0.5, 2.0]))
    with pytest.raises(ValueError, match="mask has 2 entries that are neither 0 nor 1"):
        loss_metrics(out)
    with pytest.raises(TypeError, match="logprobs must be a floating-point tensor"):
        losses.ppo(torch.zeros(3, dtype=torch.long), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="beta must be"):
        losses.dro(torch.zeros(3), torch.zeros(3), torch.ones(3), beta=-1.0)


@pytest.mark.parametrize("key", ["loss", "a:b:c", ":sum", "loss:"])
def test_metric_keys_need_exactly_one_colon(key):
    with pytest.raises(ValueError, match="exactly one colon"):
        validate_metrics({key: 1.0})
    with pytest.raises(ValueError, match="exactly one colon"):
        merge_outputs([ForwardBackwardOutput("x", [{}], {key: 1.0})])


@pytest.mark.parametrize(
    "metrics,match",
    [
        ({keys.LOSS_TOKENS: 10.0, keys.CLIPPED_TOKENS: -1.0}, "must be >= 0"),
        ({keys.LOSS_TOKENS: 10.0, keys.CLIPPED_TOKENS: 1.5}, "whole number"),
        (
            {
                keys.LOSS_TOKENS: 10.0,
                keys.CLIPPED_TOKENS: 11.0,
                keys.CLIPPED_LOW_TOKENS: 11.0,
                keys.CLIPPED_HIGH_TOKENS: 0.0,
            },
            "exceeds loss_tokens",
        ),
        (
            {
                keys.LOSS_TOKENS: 10.0,
                keys.CLIPPED_TOKENS: 3.0,
                keys.CLIPPED_LOW_TOKENS: 1.0,
                keys.CLIPPED_HIGH_TOKENS: 1.0,
            },
            r"\+ clipped_high_tokens=1 != clipped_tokens=3",
        ),
        ({keys.LOSS_TOKENS: float("nan"), keys.CLIPPED_TOKENS: 0.0}, "finite"),
        ({keys.CLIPPED_TOKENS: 0.0}, "not 'loss_tokens:sum'"),
    ],
)
def test_bad_counts_are_refused(metrics, match):
    with pytest.raises(ValueError, match=match):
        clip_counts(ForwardBackwardOutput("x", [], metrics))
    with pytest.raises(ValueError, match=match):
        validate_metrics(metrics)


def test_non_numeric_metric_value_is_refused():
    with pytest.raises(ValueError, match="'reward:mean' must be a real number"):
        validate_metrics({"reward:mean": "high"})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.float64])
def test_valid_masks_of_any_dtype_pass_and_bad_ones_are_caught(dtype):
    good = torch.tensor([0, 1, 1, 0, 1], dtype=dtype)
    out = losses.ppo(torch.zeros(5), torch.zeros(5), torch.ones(5), good)
    assert loss_metrics(out)[keys.LOSS_TOKENS] == 3.0
    bad = torch.tensor([0, 2, 1, 0, -1], dtype=dtype)  # sum == count of nonzero; squares are not
    with pytest.raises(ValueError, match="mask has 2 entries that are neither 0 nor 1"):
        loss_metrics(losses.ppo(torch.zeros(5), torch.zeros(5), torch.ones(5), bad))


def test_minus_inf_logprobs_are_caught_although_the_ratio_hides_them():
    lp = torch.tensor([0.0, float("-inf"), -1.0])
    for fn in (losses.ppo, losses.importance_sampling):
        with pytest.raises(ValueError, match="logprobs has 1 non-finite"):
            loss_metrics(fn(lp, torch.zeros(3), torch.ones(3)))


def test_errors_without_the_inputs_still_say_what_is_wrong():
    from cliptrack.adapters.losses.builtin import raise_invalid

    with pytest.raises(ValueError, match=r"non-finite values .* in 2 loss call"):
        raise_invalid([2, 0, 0])
    raise_invalid([0, 0, 0])


def test_a_stale_fraction_is_never_kept_when_no_token_was_eligible():
    stale = {
        keys.LOSS_TOKENS: 0.0,
        keys.CLIPPED_TOKENS: 0.0,
        keys.CLIPPED_LOW_TOKENS: 0.0,
        keys.CLIPPED_HIGH_TOKENS: 0.0,
        keys.CLIP_FRACTION: 0.0,
    }
    assert keys.CLIP_FRACTION not in validate_metrics(stale)
    assert keys.CLIP_FRACTION not in merge_outputs([ForwardBackwardOutput("x", [{}], stale)]).metrics
    wrong = {
        **stale,
        keys.LOSS_TOKENS: 10.0,
        keys.CLIPPED_TOKENS: 1.0,
        keys.CLIPPED_HIGH_TOKENS: 1.0,
        keys.CLIP_FRACTION: 0.5,
    }
    assert validate_metrics(wrong)[keys.CLIP_FRACTION] == 0.1


def test_counts_at_2_to_the_53_are_refused_as_no_longer_exact():
    from cliptrack.core.sums import as_count

    assert as_count("n", float(2**53 - 1)) == 2**53 - 1
    with pytest.raises(ValueError, match="reached 2\\*\\*53"):
        as_count("n", float(2**53))
    with pytest.raises(ValueError, match="reached 2\\*\\*53"):
        clip_counts(
            ForwardBackwardOutput("x", [], {keys.LOSS_TOKENS: float(2**53 + 2), keys.CLIPPED_TOKENS: 0.0})
        )
