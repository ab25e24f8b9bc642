"""The five losses against plain references: counts, low/high split, loss value and gradients."""

from __future__ import annotations

import math

import pytest
import torch
from cliptrack.adapters.losses import builtin as losses
from cliptrack.core import keys
from hypothesis import given
from hypothesis import strategies as st

from tests import reference

DTYPES = [torch.float32, torch.bfloat16]


@st.composite
def batches(draw, dtype=torch.float32):
    """Per-token inputs, 1-D packed or [batch, seq], with ratios spread across and onto the band edges."""
    two_d = draw(st.booleans())
    rows = draw(st.integers(1, 4)) if two_d else 1
    cols = draw(st.integers(1, 24))
    n = rows * cols
    lp = draw(st.lists(st.floats(-6.0, 0.0, width=32), min_size=n, max_size=n))
    edge = [0.0, math.log(0.8), math.log(1.2), math.log(4.0), 1e-7, -1e-7]
    deltas = draw(
        st.lists(st.one_of(st.floats(-2.0, 2.0, width=32), st.sampled_from(edge)), min_size=n, max_size=n)
    )
    adv = draw(
        st.lists(
            st.one_of(st.floats(-3.0, 3.0, width=32), st.sampled_from([0.0, 1.0, -1.0, 1e-30])),
            min_size=n,
            max_size=n,
        )
    )
    mask = draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n))
    shape = (rows, cols) if two_d else (n,)

    def t(values):
        return torch.tensor(values, dtype=torch.float32).reshape(shape)

    lp_t = t(lp).to(dtype)
    slp_t = (t(lp) - t(deltas)).to(dtype)
    return lp_t, slp_t, t(adv), t(mask)


def thresholds():
    return st.tuples(st.floats(0.0, 1.0, width=32), st.floats(1.0, 5.0, width=32))


def _leaf(x):
    return x.detach().clone().requires_grad_(True)


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data(), band=thresholds(), bool_mask=st.booleans())
def test_ppo_matches_per_token_reference(dtype, data, band, bool_mask):
    lp, slp, adv, mask = data.draw(batches(dtype))
    low, high = band
    out = losses.ppo(
        _leaf(lp),
        slp,
        adv,
        mask.bool() if bool_mask else mask,
        clip_low_threshold=low,
        clip_high_threshold=high,
    )
    ref = reference.per_token_ppo(lp, slp, adv, mask, low, high)
    assert (int(out.loss_tokens), int(out.get(keys.CLIPPED_TOKENS))) == (ref.loss_tokens, ref.clipped)
    assert (int(out.get(keys.CLIPPED_LOW_TOKENS)), int(out.get(keys.CLIPPED_HIGH_TOKENS))) == (
        ref.low,
        ref.high,
    )
    assert out.loss_tokens.dtype == torch.int64 and out.loss_tokens.dim() == 0
    assert not out.get(keys.CLIPPED_TOKENS).requires_grad
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    assert float(out.loss.detach()) == pytest.approx(ref.loss, rel=tol, abs=tol * max(1, ref.loss_tokens))


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data(), band=st.tuples(st.floats(0.0, 1.0, width=32), st.floats(1.0, 5.0, width=32)))
def test_cispo_matches_per_token_reference(dtype, data, band):
    lp, slp, adv, mask = data.draw(batches(dtype))
    low, high = band
    out = losses.cispo(_leaf(lp), slp, adv, mask, clip_low_threshold=low, clip_high_threshold=high)
    ref = reference.per_token_cispo(lp, slp, adv, mask, low, high)
    assert (int(out.loss_tokens), int(out.get(keys.CLIPPED_TOKENS))) == (ref.loss_tokens, ref.clipped)
    assert (int(out.get(keys.CLIPPED_LOW_TOKENS)), int(out.get(keys.CLIPPED_HIGH_TOKENS))) == (
        ref.low,
        ref.high,
    )
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    assert float(out.loss.detach()) == pytest.approx(ref.loss, rel=tol, abs=tol * max(1, ref.loss_tokens))


@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data(), band=thresholds(), beta=st.floats(0.0, 2.0))
def test_loss_and_gradients_bit_identical_to_objective_without_counting(dtype, data, band, beta):
    lp, slp, adv, mask = data.draw(batches(dtype))
    low, high = band
    cases = [
        (
            lambda x: losses.ppo(x, slp, adv, mask, clip_low_threshold=low, clip_high_threshold=high),
            lambda x: reference.objective_ppo(x, slp, adv, mask, low, high),
        ),
        (
            lambda x: losses.cispo(x, slp, adv, mask, clip_low_threshold=low, clip_high_threshold=high),
            lambda x: reference.objective_cispo(x, slp, adv, mask, low, high),
        ),
        (
            lambda x: losses.importance_sampling(x, slp, adv, mask),
            lambda x: reference.objective_importance_sampling(x, slp, adv, mask),
        ),
        (
            lambda x: losses.dro(x, slp, adv, mask, beta=beta),
            lambda x: reference.objective_dro(x, slp, adv, mask, beta),
        ),
        (lambda x: losses.cross_entropy(x, adv), lambda x: reference.objective_cross_entropy(x, adv)),
    ]
    for counted, plain in cases:
        x1, x2 = _leaf(lp), _leaf(lp)
        ours = counted(x1).loss
        theirs = plain(x2)
        ours.backward()
        theirs.backward()
        assert torch.equal(ours, theirs)
        assert torch.equal(x1.grad, x2.grad)


@given(data=st.data(), beta=st.floats(0.0, 2.0))
def test_never_clipping_losses_match_per_token_reference(data, beta):
    lp, slp, adv, mask = data.draw(batches())
    cases = {
        "importance_sampling": losses.importance_sampling(lp, slp, adv, mask),
        "dro": losses.dro(lp, slp, adv, mask, beta=beta),
        "cross_entropy": losses.cross_entropy(lp, adv, mask),
    }
    for kind, out in cases.items():
        ref = reference.per_token_loss(kind, lp, slp, adv, mask, beta)
        assert int(out.loss_tokens) == ref.loss_tokens, kind
        assert float(out.loss) == pytest.approx(ref.loss, rel=1e-4, abs=1e-4 * max(1, ref.loss_tokens)), kind


@given(data=st.data())
def test_never_clipping_losses_count_tokens_and_emit_no_clip_fields(data):
    lp, slp, adv, mask = data.draw(batches())
    weights = adv.abs() * mask
    eligible = int((mask != 0).sum())
    for out in (
        losses.importance_sampling(lp, slp, adv, mask),
        losses.dro(lp, slp, adv, mask, beta=0.1),
        losses.cross_entropy(lp, adv, mask),
    ):
        assert int(out.loss_tokens) == eligible
        assert (
            out.get(keys.CLIPPED_TOKENS) is None
            and out.get(keys.CLIPPED_LOW_TOKENS) is None
            and out.get(keys.CLIPPED_HIGH_TOKENS) is None
        )
        assert out.clip_counts() is None
    ce = losses.cross_entropy(lp, weights)
    assert int(ce.loss_tokens) == int((weights != 0).sum())


def test_ppo_counts_only_where_clipping_bites():
    # r = 1.5 > high with A < 0: the unclipped branch is the smaller one, so clipping does not bite.
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.5, 1.0])
    adv = torch.tensor([-1.0, 1.0, -1.0, 1.0, 0.0, 1.0])
    lp = torch.zeros(6)
    out = losses.ppo(lp, -torch.log(ratio), adv)
    assert int(out.get(keys.CLIPPED_TOKENS)) == 2
    assert int(out.get(keys.CLIPPED_HIGH_TOKENS)) == 1  # r=1.5, A=+1
    assert int(out.get(keys.CLIPPED_LOW_TOKENS)) == 1  # r=0.5, A=-1
    cispo = losses.cispo(lp, -torch.log(ratio), adv, clip_low_threshold=0.8, clip_high_threshold=1.2)
    assert int(cispo.get(keys.CLIPPED_TOKENS)) == 5  # every ratio outside [0.8, 1.2], whatever the sign of A


def test_default_thresholds_are_tinkers():
    import inspect

    ppo_params = inspect.signature(losses.ppo).parameters
    cispo_params = inspect.signature(losses.cispo).parameters
    assert (ppo_params["clip_low_threshold"].default, ppo_params["clip_high_threshold"].default) == (0.8, 1.2)
    assert (cispo_params["clip_low_threshold"].default, cispo_params["clip_high_threshold"].default) == (
        0.0,
        4.0,
    )


@given(data=st.data())
def test_per_datum_tensor_thresholds_equal_scalar_thresholds_row_by_row(data):
    lp, slp, adv, mask = data.draw(batches())
    lp, slp, adv, mask = (x.reshape(1, -1) for x in (lp, slp, adv, mask))
    rows = [(0.8, 1.2), (0.5, 2.0), (0.9, 1.1)]
    lp3, slp3, adv3, mask3 = (x.expand(3, -1).contiguous() for x in (lp, slp, adv, mask))
    low = torch.tensor([[r[0]] for r in rows])
    high = torch.tensor([[r[1]] for r in rows])
    for fn in (losses.ppo, losses.cispo):
        batched = fn(lp3, slp3, adv3, mask3, clip_low_threshold=low, clip_high_threshold=high)
        per_row = [
            fn(lp, slp, adv, mask, clip_low_threshold=torch.tensor(lo), clip_high_threshold=torch.tensor(hi))
            for lo, hi in rows
        ]
        total = per_row[0] + per_row[1] + per_row[2]
        assert batched.clip_counts() == total.clip_counts()


def test_counts_stay_on_input_device_and_sum_across_micro_batches():
    torch.manual_seed(0)
    outs = []
    for n in (3, 50, 7):
        lp = torch.randn(n)
        outs.append(losses.ppo(lp, lp + 0.4 * torch.randn(n), torch.randn(n), torch.ones(n)))
    total = outs[0] + outs[1] + outs[2]
    assert total.loss_tokens.device == outs[0].loss_tokens.device
    assert int(total.loss_tokens) == 60
    assert int(total.get(keys.CLIPPED_TOKENS)) == sum(int(o.get(keys.CLIPPED_TOKENS)) for o in outs)
    with pytest.raises(ValueError, match="never clips"):
        outs[0] + losses.importance_sampling(torch.zeros(2), torch.zeros(2), torch.ones(2))


@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=8),
    st.sampled_from(["ppo", "cispo", "importance_sampling"]),
)
def test_the_one_packing_adds_on_device_and_reads_back_the_exact_counts(sizes, name):
    from tests._harness import host_sync_forbidden

    gen = torch.Generator().manual_seed(sum(sizes))
    outs = []
    with host_sync_forbidden():
        for n in sizes:
            lp = -torch.rand(n, generator=gen) * 3
            outs.append(
                losses.LOSSES[name](
                    lp,
                    lp + 0.4 * torch.randn(n, generator=gen),
                    torch.randn(n, generator=gen),
                    (torch.rand(n, generator=gen) > 0.2).float(),
                )
            )
        packed = losses.combine_packed(torch.stack([losses.pack(o) for o in outs]))
    assert packed.dtype == losses.PACKED_DTYPE and packed.shape == (len(losses.PACKED_FIELDS),)
    sums = losses.unpack(packed.tolist())
    assert sums.calls == len(outs) and sums.invalid == [0, 0, 0]
    assert sums.counts.loss_tokens == sum(int(o.loss_tokens) for o in outs)
    assert sums.loss_sum == pytest.approx(sum(float(o.loss) for o in outs), rel=1e-5, abs=1e-4)
    if name in losses.CLIPPING_LOSSES:
        assert sums.counts.get(keys.CLIPPED_TOKENS) == sum(int(o.get(keys.CLIPPED_TOKENS)) for o in outs)
        assert sums.counts.get(keys.CLIPPED_LOW_TOKENS) == sum(
            int(o.get(keys.CLIPPED_LOW_TOKENS)) for o in outs
        )
        assert sums.counts.get(keys.CLIPPED_HIGH_TOKENS) == sum(
            int(o.get(keys.CLIPPED_HIGH_TOKENS)) for o in outs
        )
    else:
        assert not sums.counts.clips
