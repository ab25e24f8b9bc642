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
