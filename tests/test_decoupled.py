"""Decoupled PPO in the core losses: the clip reference (the sampler's log-probs or the trainer's old
ones), verl's dual clip and importance weights, against a plain per-token reference
(tests/reference.py) and a plain vectorised objective, eager and fused.

The eager loss and its gradient equal the vectorised objective bit for bit (the same operations);
the fused loss lies within the rounding bound of tests.reference.loss_rounding of the exact loss.
The counts are exact token counts; the gauge always measures against the sampler."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from cliptrack import Limits
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import fused
from cliptrack.core import keys
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import reference
from tests._harness import loss_path

C = 3.0
"""verl's default ``clip_ratio_c``."""
EDGES = [0.0, math.log(0.8), math.log(1.2), math.log(C), 1e-7, -1e-7, 2.0, -2.0]
"""Log-ratios onto the band's edges and the dual bound."""


@st.composite
def decoupled_batches(draw, dtype=torch.float64):
    """``(lp, slp, old, adv, mask, weights)``: the sampler's and the old log-probs each spread across
    and onto the band edges and the dual bound, advantages of both signs, a 0/1 mask, weights >= 0."""
    n = draw(st.integers(1, 40))
    rows = draw(st.sampled_from([r for r in (1, 2, 4) if n % r == 0]))
    shape = (rows, n // rows) if rows > 1 else (n,)

    def floats(lo, hi, extra=()):
        return draw(
            st.lists(
                st.one_of(st.floats(lo, hi, width=32), st.sampled_from(list(extra) or [lo])),
                min_size=n,
                max_size=n,
            )
        )

    def t(values):
        return torch.tensor(values, dtype=torch.float64).reshape(shape)

    lp = t(floats(-6.0, 0.0))
    slp = lp - t(floats(-2.0, 2.0, EDGES))
    old = lp - t(floats(-2.0, 2.0, EDGES))
    adv = t(floats(-3.0, 3.0, [0.0, 1.0, -1.0]))
    mask = t(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)))
    weights = t(floats(0.0, 2.0, [0.0, 1.0]))
    return lp.to(dtype), slp.to(dtype), old.to(dtype), adv, mask, weights


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def _options(name: str, reference_old: bool, dual: float | None, weights, old) -> dict:
    options = {
        "clip_reference": "old" if reference_old else "sampler",
        "importance_weights": weights,
        "old_logprobs": old,
    }
    if name == "ppo":
        options["dual_clip"] = dual
    return options


def _check_counts(out, ref, name: str, dual: float | None) -> None:
    assert int(out.loss_tokens) == ref.loss_tokens
    assert int(out.get(keys.CLIPPED_TOKENS)) == ref.clipped
    assert int(out.get(keys.CLIPPED_LOW_TOKENS)) == ref.low
    assert int(out.get(keys.CLIPPED_HIGH_TOKENS)) == ref.high
    if dual is None:
        assert out.get(keys.DUAL_CLIPPED_TOKENS) is None
    else:
        dual_count = out.get(keys.DUAL_CLIPPED_TOKENS)
        assert dual_count is not None and dual_count.dtype == torch.int64 and not dual_count.requires_grad
        assert int(dual_count) == ref.dual


CONFIGS = [(name, old, dual) for name in ("ppo", "cispo") for old in (False, True) for dual in (None, C)]
CONFIGS = [c for c in CONFIGS if not (c[0] == "cispo" and c[2] is not None)]


@pytest.mark.parametrize(("name", "reference_old", "dual"), CONFIGS)
@given(batch=decoupled_batches(), use_weights=st.booleans())
def test_eager_counts_loss_and_gradient_equal_the_plain_references(
    name, reference_old, dual, batch, use_weights
):
    lp, slp, old, adv, mask, weights = batch
    weights = weights if use_weights else None
    low, high = (0.8, 1.2) if name == "ppo" else (0.0, 4.0)
    with loss_path("0"):
        x = _leaf(lp)
        out = losses.LOSSES[name](
            x,
            slp,
            adv,
            mask,
            clip_low_threshold=low,
            clip_high_threshold=high,
            **_options(name, reference_old, dual, weights, old),
        )
        out.loss.backward()
    ref_lp = old if reference_old else slp
    per_token = reference.per_token_decoupled(name, lp, ref_lp, adv, mask, low, high, dual, weights)
    _check_counts(out, per_token, name, dual)
    # the loss and its gradient: the same operations as the vectorised objective, bit for bit
    y = _leaf(lp)
    objective = reference.objective_decoupled(name, y, ref_lp, adv, mask, low, high, dual, weights)
    objective.backward()
    assert out.loss.detach().item() == objective.detach().item()
    assert torch.equal(x.grad, y.grad)
    assert float(out.loss.detach()) == pytest.approx(
        per_token.loss, rel=1e-12, abs=1e-12 * max(1, lp.numel())
    )
    # the gauge measures against the sampler whatever the reference, split by the old log-probs
    with loss_path("0"):
        plain = losses.LOSSES[name](
            lp, slp, adv, mask, clip_low_threshold=low, clip_high_threshold=high, old_logprobs=old
        )
    for key in (*keys.GAUGE_KEYS, *keys.CAUSES_KEYS):
        if plain.get(key) is not None:
            assert torch.equal(out.get(key), plain.get(key)), key


@given(batch=decoupled_batches(), use_weights=st.booleans(), reference_old=st.booleans())
def test_the_dual_clip_is_verls_rule(batch, use_weights, reference_old):
    lp, slp, old, adv, mask, weights = batch
    weights = weights if use_weights else None
    with loss_path("0"):
        out = losses.ppo(lp, slp, adv, mask, **_options("ppo", reference_old, C, weights, old))
    verl = reference.verl_vanilla(lp, old if reference_old else slp, adv, mask, 0.2, 0.2, C, weights)
    eligible = mask != 0
    assert int(out.get(keys.CLIPPED_TOKENS)) == int((verl.clipped & eligible).sum())  # pg_clipfrac's tokens
    assert int(out.get(keys.DUAL_CLIPPED_TOKENS)) == int((verl.lower & eligible).sum())  # pg_clipfrac_lower's
    assert out.loss.item() == (verl.per_token * mask).sum().item()


def test_bad_options_are_named():
    lp, slp, adv = torch.zeros(3), torch.zeros(3), torch.ones(3)
    with pytest.raises(ValueError, match="clip_reference='old' .* pass old_logprobs"):
        losses.ppo(lp, slp, adv, clip_reference="old")
    with pytest.raises(ValueError, match="clip_reference must be one of"):
        losses.cispo(lp, slp, adv, clip_reference="trainer")
    with pytest.raises(ValueError, match="dual_clip must be a finite ratio above 1"):
        losses.ppo(lp, slp, adv, dual_clip=1.0)
    with pytest.raises(TypeError, match="dual_clip must be a float"):
        losses.ppo(lp, slp, adv, dual_clip=True)
    with pytest.raises(ValueError, match="importance_weights has shape"):
        losses.ppo(lp, slp, adv, importance_weights=torch.ones(2))
    with pytest.raises(ValueError, match="importance_weights has 1 non-finite"):
        losses.ppo(lp, slp, adv, importance_weights=torch.tensor([1.0, math.nan, 1.0])).check()


def test_importance_weights_get_no_gradient_and_leave_the_counts_token_counts():
    lp = _leaf(torch.tensor([-1.0, -0.5, -2.0]))
    weights = torch.tensor([0.5, 2.0, 0.0], requires_grad=True)
    with loss_path("0"):
        out = losses.ppo(lp, lp.detach() + 0.5, torch.tensor([1.0, -1.0, -1.0]), importance_weights=weights)
    out.loss.backward()
    assert weights.grad is None
    # r = exp(-0.5) < 0.8 on every token: the two with A < 0 are clipped, the one of weight 0 too
    assert int(out.loss_tokens) == 3 and int(out.get(keys.CLIPPED_TOKENS)) == 2


# ---- the fused path: the same formula compiled ---------------------------------------------------

FUSED = [("ppo", True, C), ("ppo", False, C), ("ppo", True, None), ("cispo", True, None)]
"""Three new constant sets of the fused PPO kernel (within fused.MAX_CONSTANT_SETS beside the others)."""


@pytest.fixture()
def fused_path() -> Iterator[None]:
    with loss_path("1"):
        yield
    assert fused.failure() is None, fused.failure()


@pytest.mark.usefixtures("fused_path")
@pytest.mark.parametrize(("name", "reference_old", "dual"), FUSED)
@settings(max_examples=25)
@given(batch=decoupled_batches(torch.float32), use_weights=st.booleans())
def test_fused_counts_and_loss_within_the_rounding_bound(name, reference_old, dual, batch, use_weights):
    lp, slp, old, adv, mask, weights = batch
    adv, mask = adv.float(), mask.float()
    weights = weights.float() if use_weights else None
    low, high = (0.8, 1.2) if name == "ppo" else (0.0, 4.0)
    before = fused.compiled_calls[name]
    x = _leaf(lp)
    out = losses.LOSSES[name](
        x,
        slp,
        adv,
        mask,
        clip_low_threshold=low,
        clip_high_threshold=high,
        **_options(name, reference_old, dual, weights, old),
    )
    out.loss.backward()
    assert fused.compiled_calls[name] - before == int(lp.numel() >= 2)
    ref_lp = old if reference_old else slp
    per_token = reference.per_token_decoupled(
        name,
        lp.double(),
        ref_lp.double(),
        adv.double(),
        mask.double(),
        low,
        high,
        dual,
        None if weights is None else weights.double(),
    )
    near = reference.near_bounds(lp, ref_lp, (low, high, *(() if dual is None else (dual,)))) & (mask != 0)
    n_near = int(near.sum())
    assert int(out.loss_tokens) == per_token.loss_tokens
    assert abs(int(out.get(keys.CLIPPED_TOKENS)) - per_token.clipped) <= n_near
    if dual is not None:
        assert abs(int(out.get(keys.DUAL_CLIPPED_TOKENS)) - per_token.dual) <= n_near
    bound = reference.loss_rounding(name, lp, ref_lp, adv, mask, low, high, weights=weights, dual_clip=dual)
    if n_near == 0:
        assert abs(float(out.loss.detach()) - per_token.loss) <= bound
        with loss_path("0"):
            y = _leaf(lp)
            eager = losses.LOSSES[name](
                y,
                slp,
                adv,
                mask,
                clip_low_threshold=low,
                clip_high_threshold=high,
                **_options(name, reference_old, dual, weights, old),
            )
            eager.loss.backward()
        # the per-token gradient: the same product, rounded alike to within 8 float32 ulps
        assert torch.allclose(x.grad, y.grad, rtol=8 * torch.finfo(torch.float32).eps, atol=1e-30)


# ---- the merges: the dual-clip count through every stack and the tracker ------------------------


@pytest.mark.parametrize("stack", ["toy", "megatron", "miles", "tinker"])
def test_the_dual_clip_count_is_exact_through_every_stack(stack):
    from cliptrack.adapters.shared import run_step

    from tests.test_stacks import STACKS

    gen = torch.Generator().manual_seed(11)
    calls, expected = [], []
    for rows, tokens in ((2, 9), (1, 4), (3, 5)):
        slp = -torch.rand(rows, tokens, generator=gen, dtype=torch.float64) * 3
        old = slp + 0.1 * torch.randn(rows, tokens, generator=gen, dtype=torch.float64)
        lp = (old + 1.5 * torch.randn(rows, tokens, generator=gen, dtype=torch.float64)).requires_grad_()
        adv = torch.randn(rows, tokens, generator=gen, dtype=torch.float64)
        mask = (torch.rand(rows, tokens, generator=gen) < 0.8).to(torch.float64)
        weights = torch.rand(rows, tokens, generator=gen, dtype=torch.float64)
        inputs = {"sampling_logprobs": slp, "advantages": adv, "mask": mask}
        calls.append((lp, {**inputs, "old_logprobs": old, "importance_weights": weights}))
        expected.append(reference.per_token_decoupled("ppo", lp, old, adv, mask, 0.8, 1.2, C, weights))
    result = run_step(STACKS[stack], "ppo", calls, {"clip_reference": "old", "dual_clip": C})
    sums = result.sums
    assert sums is not None
    dual = sum(e.dual for e in expected)
    assert dual > 0 and sum(e.clipped for e in expected) > 0  # the example bites both ways
    assert sums[keys.DUAL_CLIPPED_TOKENS] == dual
    assert sums[keys.CLIPPED_TOKENS] == sum(e.clipped for e in expected)
    assert sums.loss_tokens == sum(e.loss_tokens for e in expected)
    assert result.output.metrics[keys.DUAL_CLIP_FRACTION] == dual / sums.loss_tokens
    loss = float(torch.stack(result.losses).sum().detach())
    assert loss == pytest.approx(sum(e.loss for e in expected), rel=1e-12, abs=1e-12)


def test_a_step_mixing_calls_with_and_without_the_dual_clip_drops_its_count():
    # r = e**2 > 3 with A < 0 on the first token: dual-clipped in every call with the dual clip
    lp, slp, adv = torch.tensor([-1.0, -0.5]), torch.tensor([-3.0, -0.5]), torch.tensor([-1.0, 1.0])
    with loss_path("0"):
        mixed = losses.ppo(lp, slp, adv, dual_clip=C) + losses.ppo(lp, slp, adv)
        both = losses.ppo(lp, slp, adv, dual_clip=C) + losses.ppo(lp, slp, adv, dual_clip=C)
    assert mixed.get(keys.DUAL_CLIPPED_TOKENS) is None and int(mixed.get(keys.CLIPPED_TOKENS)) == 0
    assert int(both.get(keys.DUAL_CLIPPED_TOKENS)) == 2
    assert keys.DUAL_CLIPPED_TOKENS not in losses.unpack(losses.pack(mixed).tolist()).counts
    assert losses.unpack(losses.pack(both).tolist()).counts[keys.DUAL_CLIPPED_TOKENS] == 2


def test_the_tracker_logs_the_dual_clip_count_and_the_comparison_reads_it_back(tmp_path):
    from cliptrack import Tracker, load_runs
    from cliptrack.adapters import megatron as mg

    gen = torch.Generator().manual_seed(5)
    expected = {}
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with (
        loss_path("0"),
        Tracker(
            "dual",
            sinks=(uri,),
            spool_dir=tmp_path / "spool",
            experiment="dual",
            limits=Limits(flush_interval_s=0.05),
        ) as tracker,
    ):
        for step in range(3):
            reports, dual, tokens = [], 0, 0
            for size in (7, 13):  # micro-batches of unequal token counts
                slp = -torch.rand(size, generator=gen, dtype=torch.float64) * 3
                old = slp + 0.1 * torch.randn(size, generator=gen, dtype=torch.float64)
                lp = old + 1.5 * torch.randn(size, generator=gen, dtype=torch.float64)
                adv = torch.randn(size, generator=gen, dtype=torch.float64)
                inputs = {"sampling_logprobs": slp, "advantages": adv, "old_logprobs": old}
                config = {"clip_reference": "old", "dual_clip": C}
                reports.append(mg.make_loss_func("ppo", inputs, config)(lp)[2])
                ref = reference.per_token_decoupled("ppo", lp, old, adv, torch.ones(size), 0.8, 1.2, C)
                dual, tokens = dual + ref.dual, tokens + ref.loss_tokens
            output = mg.reduce_losses(reports, group=None)
            assert output is not None
            tracker.log_output(step, output)
            expected[step] = (dual, dual / tokens)
    runs = load_runs(["dual"], tracking_uri=uri, experiment="dual")
    wide = runs.wide(runs.labels[0])
    got = {
        step: (
            float(wide.loc[step, keys.DUAL_CLIPPED_TOKENS]),
            float(wide.loc[step, keys.DUAL_CLIP_FRACTION]),
        )
        for step in expected
    }
    assert got == expected
    assert any(dual for dual, _ in expected.values())


@pytest.mark.parametrize("path", ["miles", "megatron"])
def test_a_probes_clip_sides_follow_the_clip_reference(path):
    from cliptrack.adapters import megatron as mg
    from cliptrack.adapters.miles import forward_backward_loss
    from cliptrack.adapters.shared.wire import read_array, read_count

    gen = torch.Generator().manual_seed(3)
    slp = -torch.rand(3, 16, generator=gen, dtype=torch.float64) * 3
    old = slp + 0.8 * torch.randn(3, 16, generator=gen, dtype=torch.float64)  # far from the sampler
    lp = old + 0.3 * torch.randn(3, 16, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 16, generator=gen, dtype=torch.float64)
    config = {"clip_reference": "old", "dual_clip": C}
    if path == "miles":
        datums = [{"logprobs": slp[i], "advantages": adv[i], "old_logprobs": old[i]} for i in range(3)]
        output = forward_backward_loss(datums, list(lp.unbind(0)), "ppo", config, probe=True).output
    else:
        inputs = {"sampling_logprobs": slp, "advantages": adv, "old_logprobs": old}
        report = mg.make_loss_func("ppo", inputs, config, probe=True)(lp)[2]
        output = mg.reduce_losses([report], group=None)
    expected = [
        reference.per_token_decoupled("ppo", lp[i], old[i], adv[i], torch.ones(16), 0.8, 1.2, C)
        for i in range(3)
    ]
    for datum, ref in zip(output.loss_fn_outputs, expected, strict=True):
        sides, _ = read_array(datum[keys.DATUM_CLIP_SIDES], "clip_sides")
        assert int((sides != 0).sum()) == ref.clipped == read_count(datum["clipped_tokens"], "clipped_tokens")
        assert int((sides == -1).sum()) == ref.low
        assert read_count(datum["dual_clipped_tokens"], "dual_clipped_tokens") == ref.dual
    assert sum(ref.clipped for ref in expected) > 0


def test_the_miles_runtime_names_a_bad_clip_reference():
    from cliptrack.adapters.miles import forward_backward_loss

    datum = {"logprobs": torch.zeros(2), "advantages": torch.ones(2)}
    with pytest.raises(
        ValueError, match=r"loss_fn_config\['clip_reference'\] must be one of \('sampler', 'old'\)"
    ):
        forward_backward_loss([datum], [torch.zeros(2)], "ppo", {"clip_reference": "trainer"})
    with pytest.raises(ValueError, match=r"loss_fn_config\['dual_clip'\] must be a finite number"):
        forward_backward_loss([datum], [torch.zeros(2)], "ppo", {"dual_clip": "3"})
