"""Adding a loss is one registry entry: a toy clipping loss runs through both backend paths.

The toy is truncated importance sampling (per token ``-(min(r, cap).detach() * A * logprobs)``,
a token is clipped where ``r > cap``), reporting no low/high split. Registered once, it runs
through the Megatron path (``make_loss_func`` / ``reduce_losses``) and the Miles runtime
(``forward_backward_loss``, per-datum ``cap`` overrides, the client's aggregation) with no other
change, and both give the counts of a plain per-token reference.
"""

from __future__ import annotations

import dataclasses
import random
from fractions import Fraction

import pytest
import torch
from cliptrack.adapters import megatron as mg
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses.output import loss_metrics
from cliptrack.adapters.miles import ClientAggregator, forward_backward_loss
from cliptrack.core import keys


def truncated_is(logprobs, sampling_logprobs, advantages, mask=None, *, cap=2.0):
    """Toy loss: truncated importance sampling, clipped where the ratio exceeds ``cap``."""
    weight = torch.ones_like(logprobs) if mask is None else mask.to(logprobs.dtype)
    ratio = torch.exp((logprobs - sampling_logprobs).detach())
    coefficient = torch.clamp(ratio, max=cap)
    loss = -(coefficient * advantages * logprobs * weight).sum()
    eligible = weight != 0
    with torch.no_grad():
        clipped = torch.count_nonzero((ratio > cap) & eligible)
    invalid = torch.zeros(len(losses.INPUT_CHECKS), dtype=torch.int64, device=logprobs.device)
    measured = {keys.LOSS_TOKENS: torch.count_nonzero(eligible), keys.CLIPPED_TOKENS: clipped}
    return losses.LossOutput(loss, measured, invalid)


TOY = losses.LossSpec(
    name="truncated_is",
    fn=truncated_is,
    clips=True,
    inputs=(
        losses.TensorInput("sampling_logprobs", datum_fields=("logprobs",)),
        losses.TensorInput("advantages"),
        losses.TensorInput("mask", required=False, datum_fields=("mask", "weights")),
    ),
    options=(losses.Option("cap", 2.0, per_datum=True),),
)


@pytest.fixture
def toy():
    losses.register_loss(TOY)
    try:
        yield TOY
    finally:
        losses.unregister_loss(TOY.name)


def reference(lp, slp, adv, mask, cap):
    """Plain per-token counts: (eligible tokens, clipped tokens)."""
    tokens = clipped = 0
    for a, b, m in zip(lp.tolist(), slp.tolist(), mask.tolist(), strict=True):
        if m != 0:
            tokens += 1
            clipped += float(torch.exp(torch.tensor(a - b))) > cap
    return tokens, clipped


def batch(n_datums, seed):
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    out = []
    for _ in range(n_datums):
        n = rng.randint(1, 12)
        slp = torch.randn(n, generator=gen) * 0.3 - 1.5
        lp = slp + torch.randn(n, generator=gen) * 0.6
        adv = torch.randn(n, generator=gen)
        mask = (torch.rand(n, generator=gen) > 0.25).float()
        out.append((lp, slp, adv, mask))
    return out


def test_the_registry_knows_the_toy_only_while_registered(toy):
    assert "truncated_is" in losses.LOSSES and "truncated_is" in losses.CLIPPING_LOSSES
    assert losses.loss_spec(truncated_is) is toy
    with pytest.raises(ValueError, match="already registered"):
        losses.register_loss(TOY)


def test_the_toy_is_absent_without_its_entry():
    assert "truncated_is" not in losses.LOSSES
    with pytest.raises(ValueError, match="loss_fn 'truncated_is' is not one of"):
        mg.make_loss_func("truncated_is", {})
    with pytest.raises(ValueError, match="unknown loss_fn 'truncated_is'"):
        forward_backward_loss([], [], "truncated_is")


def test_the_toy_runs_through_both_backend_paths(toy):
    data = batch(10, seed=4)
    cap = 1.3
    expected_tokens = expected_clipped = 0
    for lp, slp, adv, mask in data:
        t, c = reference(lp, slp, adv, mask, cap)
        expected_tokens, expected_clipped = expected_tokens + t, expected_clipped + c
    assert 0 < expected_clipped < expected_tokens  # the scenario exercises clipping

    # Megatron path: one loss function per micro-batch (a datum here), reduced in one process
    reports = []
    for lp, slp, adv, mask in data:
        loss_func = mg.make_loss_func(
            "truncated_is", {"sampling_logprobs": slp, "advantages": adv, "mask": mask}, {"cap": cap}
        )
        loss, num_tokens, report = loss_func(lp.clone().requires_grad_())
        loss.backward()
        reports.append(report)
    megatron = mg.reduce_losses(reports, group=None).metrics

    # Miles runtime path: datums in Tinker's wire form, the request's config, then the client
    datums = [
        {"logprobs": slp.tolist(), "advantages": adv.tolist(), "mask": mask.tolist()}
        for _, slp, adv, mask in data
    ]
    policy = [lp.clone().requires_grad_() for lp, *_ in data]
    agg = ClientAggregator()
    agg.register("run")
    for part in (slice(0, 4), slice(4, 10)):
        result = forward_backward_loss(datums[part], policy[part], "truncated_is", {"cap": cap})
        result.loss.backward()
        agg.add("run", 0, result.output)
    miles = agg.emit("run", 0).metrics

    fraction = float(Fraction(expected_clipped, expected_tokens))
    for metrics in (megatron, miles):
        assert metrics[keys.LOSS_TOKENS] == expected_tokens
        assert metrics[keys.CLIPPED_TOKENS] == expected_clipped
        assert metrics[keys.CLIP_FRACTION] == fraction
        assert keys.CLIPPED_LOW_TOKENS not in metrics and keys.CLIPPED_HIGH_TOKENS not in metrics
    assert megatron[keys.LOSS_SUM] == pytest.approx(miles[keys.LOSS_SUM], rel=1e-6)


def test_the_toys_declared_options_and_inputs_are_checked_on_both_paths(toy):
    ((lp, slp, adv, mask),) = batch(1, seed=5)
    with pytest.raises(
        ValueError, match=r"loss_fn_config has \['clip_high_threshold'\], which loss truncated_is"
    ):
        mg.make_loss_func(
            "truncated_is", {"sampling_logprobs": slp, "advantages": adv}, {"clip_high_threshold": 1.2}
        )
    with pytest.raises(ValueError, match=r"lacks \['advantages'\] required by loss truncated_is"):
        mg.make_loss_func("truncated_is", {"sampling_logprobs": slp})
    datum = {"logprobs": slp.tolist(), "advantages": adv.tolist(), "mask": mask.tolist()}
    with pytest.raises(ValueError, match=r"loss_fn_config keys \['beta'\] are not used by 'truncated_is'"):
        forward_backward_loss([datum], [lp], "truncated_is", {"beta": 0.1})
    # a per-datum option overrides the request's config, as declared
    low_cap = forward_backward_loss([{**datum, "cap": [0.0]}], [lp], "truncated_is", {"cap": 100.0}).output
    assert low_cap.metrics[keys.CLIPPED_TOKENS] == low_cap.metrics[keys.LOSS_TOKENS] == int(mask.sum())


def test_a_registered_loss_that_breaks_its_declaration_is_named(toy):
    ((lp, slp, adv, _),) = batch(1, seed=6)
    never = losses.LossSpec("never_is", truncated_is, False, toy.inputs, toy.options)
    losses.register_loss(never)
    try:
        message = "loss never_is is registered as returning no clip counts but returned clip counts"
        with pytest.raises(TypeError, match=message):
            mg.make_loss_func("never_is", {"sampling_logprobs": slp, "advantages": adv})(lp)
        datum = {"logprobs": slp.tolist(), "advantages": adv.tolist()}
        with pytest.raises(TypeError, match=message):
            forward_backward_loss([datum], [lp], "never_is")
    finally:
        losses.unregister_loss("never_is")
    splitting = losses.LossSpec("split_is", truncated_is, True, toy.inputs, toy.options, splits=True)
    losses.register_loss(splitting)
    try:
        message = "registered as returning clip counts with the low/high split but returned clip counts$"
        with pytest.raises(TypeError, match=message):
            mg.make_loss_func("split_is", {"sampling_logprobs": slp, "advantages": adv})(lp)
    finally:
        losses.unregister_loss("split_is")
    with pytest.raises(ValueError, match="splits=True needs clips=True"):
        losses.LossSpec("bad", truncated_is, False, toy.inputs, splits=True)


def test_an_empty_request_carries_the_declared_keys(toy):
    assert forward_backward_loss([], [], "truncated_is").output.metrics == {
        keys.LOSS_SUM: 0.0,
        keys.LOSS_TOKENS: 0.0,
        keys.CLIPPED_TOKENS: 0.0,
    }
    # a gauge loss: the gauge's sums are 0 over no token; no extreme and no mean is invented
    no_gauge = {key: 0.0 for key in keys.GAUGE_MEASURED_KEYS if key not in keys.EXTREME_KEYS}
    assert forward_backward_loss([], [], "ppo").output.metrics == {
        keys.LOSS_SUM: 0.0,
        keys.LOSS_TOKENS: 0.0,
        keys.CLIPPED_TOKENS: 0.0,
        keys.CLIPPED_LOW_TOKENS: 0.0,
        keys.CLIPPED_HIGH_TOKENS: 0.0,
        **no_gauge,
    }
    assert forward_backward_loss([], [], "dro", {"beta": 0.1}).output.metrics == {
        keys.LOSS_SUM: 0.0,
        keys.LOSS_TOKENS: 0.0,
        **no_gauge,
    }
    assert forward_backward_loss([], [], "cross_entropy").output.metrics == {
        keys.LOSS_SUM: 0.0,
        keys.LOSS_TOKENS: 0.0,
    }


def checked_truncated_is(logprobs, sampling_logprobs, advantages, mask=None, *, cap=2.0):
    """The toy written with the public input checks and the gauge: the built-in losses' checks,
    error messages and on-policy gauge for a loss of one's own."""
    batch = losses.check_inputs(logprobs, sampling_logprobs, advantages, mask)
    log_ratio = logprobs - sampling_logprobs
    ratio = torch.exp(log_ratio.detach())
    loss = -(torch.clamp(ratio, max=cap) * advantages * logprobs * batch.weight).sum()
    with torch.no_grad():
        clipped = torch.count_nonzero((ratio > cap) & batch.eligible)
        gauge = losses.gauge_of(log_ratio, ratio, batch.mask_eligible)
    return batch.output(loss, log_ratio, {keys.CLIPPED_TOKENS: clipped, **gauge})


def test_a_registered_loss_gets_the_input_checks_and_the_gauge():
    spec = losses.register_loss(
        dataclasses.replace(TOY, name="checked_is", fn=checked_truncated_is, gauge=True)
    )
    try:
        gen = torch.Generator().manual_seed(5)
        lp = -torch.rand(40, generator=gen) * 2
        slp = lp + 0.5 * torch.randn(40, generator=gen)
        adv = torch.randn(40, generator=gen)
        mask = (torch.rand(40, generator=gen) > 0.25).float()
        loss_func = mg.make_loss_func(spec.name, {"sampling_logprobs": slp, "advantages": adv, "mask": mask})
        metrics = mg.reduce_losses([loss_func(lp)[2]], group=None).metrics
        ppo_gauge = {
            k: v for k, v in loss_metrics(losses.ppo(lp, slp, adv, mask)).items() if k in keys.GAUGE_KEYS
        }
        assert {k: metrics[k] for k in ppo_gauge} == ppo_gauge  # the same gauge as a built-in loss
        assert metrics[keys.CLIPPED_TOKENS] == reference(lp, slp, adv, mask, 2.0)[1]
        bad = slp.clone()
        bad[3] = float("nan")
        with pytest.raises(
            ValueError, match=r"non-finite values \(NaN or inf\) in logprobs, sampling_logprobs"
        ):
            mg.reduce_losses(
                [mg.make_loss_func(spec.name, {"sampling_logprobs": bad, "advantages": adv})(lp)[2]],
                group=None,
            )
        with pytest.raises(ValueError, match="sampling_logprobs has 1 non-finite entries"):
            loss_metrics(checked_truncated_is(lp, bad, adv))  # the output keeps its inputs: named precisely
        with pytest.raises(ValueError, match="advantages has shape"):
            checked_truncated_is(lp, slp, adv[:5])
    finally:
        losses.unregister_loss("checked_is")


def test_a_loss_of_ones_own_may_set_the_eligible_tokens():
    weights = torch.tensor([0.0, 1.0, 2.0, 0.0])
    batch = losses.check_inputs(torch.zeros(4), None, weights, advantages_name="weights")
    batch.eligible = weights != 0
    out = batch.output(-(weights * torch.zeros(4)).sum(), torch.zeros(4))
    assert int(out.loss_tokens) == 2 and batch.mask_eligible is None
