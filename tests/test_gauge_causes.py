"""The gauge split into its causes (engine, drift) and the weight-version lag, against a plain
per-token reference, on the eager and fused paths and through every merge."""

from __future__ import annotations

import math

import pytest
import torch
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import fused
from cliptrack.adapters.losses.output import ForwardBackwardOutput, loss_metrics, merge_outputs
from cliptrack.core import keys, measures
from hypothesis import given, settings
from hypothesis import strategies as st
from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results

from tests._harness import host_sync_forbidden, loss_path
from tests.reference import gauge_tolerance, loss_rounding

GAUGE_LOSSES = ("ppo", "cispo", "importance_sampling", "dro")
EPS32 = float(torch.finfo(torch.float32).eps)


def _options(name: str) -> dict[str, float]:
    return {"beta": 0.1} if name == "dro" else {}


@st.composite
def inputs(draw, two_d: bool | None = None, n_max: int = 60):
    """(lp, slp, old, lag, adv, mask-or-None): the sampler's log-probs ``slp``, the trainer's at the
    sampling weights ``old`` (engine mismatch from 0 to large), the trained policy's ``lp`` (drift
    from 0 to large), per-token integer lags, 1-D or [batch, seq]."""
    two = draw(st.booleans()) if two_d is None else two_d
    rows = draw(st.integers(1, 4)) if two else 1
    cols = draw(st.integers(2, n_max))
    shape = (rows, cols) if two else (cols,)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    engine = draw(st.sampled_from([0.0, 1e-4, 1e-2, 0.5]))
    drift = draw(st.sampled_from([0.0, 1e-3, 0.3, 2.0]))
    slp = -torch.rand(shape, generator=gen) * 4
    old = slp + engine * torch.randn(shape, generator=gen)
    lp = old + drift * torch.randn(shape, generator=gen)
    lag = torch.randint(0, 4, shape, generator=gen).float()
    adv = torch.randn(shape, generator=gen)
    kind = draw(st.sampled_from(["bool", "float", "none"]))
    keep = torch.rand(shape, generator=gen) > draw(st.sampled_from([0.0, 0.3, 1.0]))
    mask = None if kind == "none" else keep if kind == "bool" else keep.float()
    return lp, slp, old, lag, adv, mask


def reference(lp, slp, old, lag, mask) -> dict[str, float]:
    """Every key of the causes and the lag, plainly: per eligible token ``l`` as the loss forms it
    (``lp - slp`` in the input dtype), ``e = old - slp`` and ``d = l - e`` in Python floats, sums by
    ``math.fsum``, k3 as ``expm1(x) - x``; also ``drift_plain``, the sum of ``lp - old``."""
    ls = (lp - slp).double().flatten().tolist()
    olds, slps, lps = (t.double().flatten().tolist() for t in (old, slp, lp))
    lags = lag.double().flatten().tolist()
    on = [True] * len(ls) if mask is None else [float(m) != 0 for m in mask.flatten().tolist()]
    rows = [
        (l_, o - s, p - o, g) for l_, o, s, p, g, e in zip(ls, olds, slps, lps, lags, on, strict=True) if e
    ]
    es = [e for _, e, _, _ in rows]
    ds = [l_ - e for l_, e, _, _ in rows]
    out = {
        keys.ENGINE_LOG_RATIO_SUM: math.fsum(es),
        keys.ENGINE_ABS_LOG_RATIO_SUM: math.fsum(abs(e) for e in es),
        keys.ENGINE_KL_K3_SUM: math.fsum(math.expm1(e) - e for e in es),
        keys.DRIFT_LOG_RATIO_SUM: math.fsum(ds),
        keys.DRIFT_ABS_LOG_RATIO_SUM: math.fsum(abs(d) for d in ds),
        keys.DRIFT_KL_K3_SUM: math.fsum(math.expm1(d) - d for d in ds),
        keys.WEIGHT_LAG_SUM: math.fsum(g for *_, g in rows),
        "drift_plain": math.fsum(p for *_, p, _ in rows),
        "scale": math.fsum(abs(x) for x in es + ds + [r[0] for r in rows]),
        "k3_scale_engine": math.fsum(abs(e) + abs(math.expm1(e)) for e in es),
        "k3_scale_drift": math.fsum(abs(d) + abs(math.expm1(d)) for d in ds),
        "l_scale": math.fsum(abs(r[0]) for r in rows),
    }
    if rows:
        out[keys.WEIGHT_LAG_MAX] = max(g for *_, g in rows)
    return out


def assert_causes(metrics: dict[str, float], ref: dict[str, float], compiled: bool) -> None:
    tight = 1e-12 * ref["scale"] + 1e-300
    for key in (
        keys.ENGINE_LOG_RATIO_SUM,
        keys.ENGINE_ABS_LOG_RATIO_SUM,
        keys.DRIFT_LOG_RATIO_SUM,
        keys.DRIFT_ABS_LOG_RATIO_SUM,
        keys.WEIGHT_LAG_SUM,
    ):
        assert abs(metrics[key] - ref[key]) <= tight, (key, metrics[key], ref[key])
    # the k3 terms: float64 eager; compiled in float32, a few ulps of each term's magnitude
    for key, scale in ((keys.ENGINE_KL_K3_SUM, "k3_scale_engine"), (keys.DRIFT_KL_K3_SUM, "k3_scale_drift")):
        tol = (8 * EPS32 * ref[scale] if compiled else 1e-12 * ref[scale]) + 1e-12
        assert abs(metrics[key] - ref[key]) <= tol, (key, metrics[key], ref[key], tol)
    # the drift is logprobs - old_logprobs to the float32 rounding of l
    assert abs(metrics[keys.DRIFT_LOG_RATIO_SUM] - ref["drift_plain"]) <= EPS32 * ref["l_scale"] + tight
    # total = engine + drift, to the float64 rounding of the sums
    identity = metrics[keys.LOG_RATIO_SUM] - (
        metrics[keys.ENGINE_LOG_RATIO_SUM] + metrics[keys.DRIFT_LOG_RATIO_SUM]
    )
    assert abs(identity) <= tight, identity
    if metrics[keys.LOSS_TOKENS]:
        assert metrics[keys.WEIGHT_LAG_MAX] == ref[keys.WEIGHT_LAG_MAX]
        for mean in measures.DEFAULT.means:
            if measures.by_key(mean.numerator).group in (measures.CAUSES, measures.STALENESS):
                assert metrics[mean.key] == metrics[mean.numerator] / metrics[keys.LOSS_TOKENS]
    else:
        assert keys.WEIGHT_LAG_MAX not in metrics and keys.DRIFT_KL_K3_MEAN not in metrics


def _call(name, lp, slp, old, lag, adv, mask):
    return losses.LOSSES[name](lp, slp, adv, mask, old_logprobs=old, weight_lag=lag, **_options(name))


@pytest.mark.parametrize("name", GAUGE_LOSSES)
@settings(max_examples=60)
@given(data=inputs())
def test_engine_and_drift_match_the_plain_reference_eager(name, data):
    lp, slp, old, lag, adv, mask = data
    with loss_path("0"):
        out = _call(name, lp, slp, old, lag, adv, mask)
    assert out.has(measures.CAUSES) and out.has(measures.STALENESS)
    assert_causes(loss_metrics(out), reference(lp, slp, old, lag, mask), compiled=False)


@pytest.mark.parametrize("name", GAUGE_LOSSES)
@settings(max_examples=20)
@given(data=inputs())
def test_engine_and_drift_match_the_plain_reference_fused(name, data):
    lp, slp, old, lag, adv, mask = data
    before = fused.compiled_calls[name]
    with loss_path("1"):
        out = _call(name, lp, slp, old, lag, adv, mask)
    assert fused.compiled_calls[name] == before + 1, fused.failure()
    assert_causes(loss_metrics(out), reference(lp, slp, old, lag, mask), compiled=True)


@pytest.mark.parametrize("name", GAUGE_LOSSES)
def test_the_split_changes_neither_the_loss_nor_its_gradient_nor_the_gauge(name):
    gen = torch.Generator().manual_seed(5)
    slp = -torch.rand(3, 200, generator=gen) * 3
    old = slp + 0.05 * torch.randn(3, 200, generator=gen)
    lp = old + 0.3 * torch.randn(3, 200, generator=gen)
    adv = torch.randn(3, 200, generator=gen)
    mask = (torch.rand(3, 200, generator=gen) > 0.2).float()
    for path in ("0", "1"):
        got = {}
        for given_old in (False, True):
            x = lp.clone().requires_grad_(True)
            with loss_path(path):
                extra = {"old_logprobs": old, "weight_lag": torch.ones_like(lp)} if given_old else {}
                out = losses.LOSSES[name](x, slp, adv, mask, **extra, **_options(name))
            out.loss.backward()
            got[given_old] = (out.loss.detach(), x.grad, loss_metrics(out))
        (loss0, grad0, plain), (loss1, grad1, split) = got[False], got[True]
        assert set(split) - set(plain) >= set(keys.CAUSES_KEYS) | set(keys.STALENESS_KEYS)
        if path == "0":
            # eager: the split adds ops beside the loss's and the gauge's, never between them, so
            # both calls run the same operations on the same values: bitwise equal on any machine
            assert torch.equal(loss0, loss1) and torch.equal(grad0, grad1)
            assert {k: split[k] for k in plain} == plain  # the gauge and counts unchanged, keys added
        else:
            # fused: the two calls are two graphs compiled apart (with and without the split), whose
            # generated kernels may order a sum or vectorise an exp differently (they do with AVX-512,
            # not with AVX2): equal to rounding, within the stated bounds, and the counts exactly
            assert_same_to_rounding(name, (loss0, grad0, plain), (loss1, grad1, split), (lp, slp, adv, mask))


def assert_same_to_rounding(name, plain, split, inputs) -> None:
    """Two builds of one loss on the same inputs (``(loss, gradient, metrics)`` each) agree to
    rounding: the loss within twice :func:`~tests.reference.loss_rounding`; each token's gradient, a
    product of at most four rounded factors, within 8 float32 ulps of its magnitude; every count
    exactly; each float gauge sum within twice :func:`~tests.reference.gauge_tolerance` (each build
    lies within that of the float64 truth); the extremes exactly (a max of the same values)."""
    (loss0, grad0, metrics0), (loss1, grad1, metrics1) = plain, split
    lp, slp, adv, mask = inputs
    thresholds = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0)}.get(name, (0.0, 0.0))
    bound = 2 * loss_rounding(name, lp, slp, adv, mask, *thresholds, **_options(name))
    assert abs(float(loss0) - float(loss1)) <= bound, (float(loss0), float(loss1), bound)
    assert bool(((grad0 - grad1).abs() <= 8 * EPS32 * torch.maximum(grad0.abs(), grad1.abs())).all())
    gauge_floats = set(keys.GAUGE_MEASURED_KEYS) - {keys.RATIO_OUTSIDE_TOKENS}
    for key, value in metrics0.items():
        if key in gauge_floats:
            tol = 2 * gauge_tolerance(key, lp, slp, mask)
            assert abs(metrics1[key] - value) <= tol, (key, value, metrics1[key], tol)
        elif key.endswith(":sum") and key != keys.LOSS_SUM:
            assert metrics1[key] == value, key  # a count
    for key in (keys.ABS_LOG_RATIO_MEAN, keys.KL_K3_MEAN):  # formed once from the sums above
        assert metrics1[key] == metrics1[key.replace(":mean", ":sum")] / metrics1[keys.LOSS_TOKENS]


def test_without_old_logprobs_no_part_is_emitted_and_mixing_drops_the_parts():
    lp = -torch.rand(30)
    slp = lp + 0.1
    adv = torch.randn(30)
    plain = losses.ppo(lp, slp, adv)
    assert not plain.has(measures.CAUSES) and not plain.has(measures.STALENESS)
    assert set(loss_metrics(plain)).isdisjoint(keys.CAUSES_KEYS)
    split = losses.ppo(lp, slp, adv, old_logprobs=slp + 0.05, weight_lag=torch.full((30,), 2.0))
    both = plain + split
    assert both.has_gauge and not both.has(measures.CAUSES) and not both.has(measures.STALENESS)
    packed = losses.unpack(
        losses.combine_packed(torch.stack([losses.pack(plain), losses.pack(split)])).tolist()
    )
    assert packed.counts.has_gauge and keys.ENGINE_LOG_RATIO_SUM not in packed.counts
    alone = losses.unpack(losses.pack(split + split).tolist()).counts
    assert alone[keys.WEIGHT_LAG_SUM] == 120.0 and alone[keys.WEIGHT_LAG_MAX] == 2.0


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("old_logprobs", torch.tensor([0.0, float("nan"), 0.0, 0.0]), "old_logprobs has 1 non-finite"),
        ("weight_lag", torch.tensor([0.0, float("inf"), 0.0, 0.0]), "weight_lag has 1 non-finite"),
        ("old_logprobs", torch.zeros(5), "old_logprobs has shape"),
        ("weight_lag", torch.zeros(2, 2), "weight_lag has shape"),
    ],
)
def test_bad_old_logprobs_and_lags_are_refused_and_named(argument, value, message):
    lp = -torch.rand(4)
    with pytest.raises(ValueError, match=message):
        losses.ppo(lp, lp - 0.1, torch.ones(4), **{argument: value}).check()


@pytest.mark.parametrize("path", ["0", "1"])
@pytest.mark.parametrize("name", GAUGE_LOSSES)
@pytest.mark.parametrize(
    ("lag", "message"),
    [
        # a sum >= 0 hides the negative entry: each entry is checked
        (torch.tensor([-1.0, 3.0, 0.0, 0.0]), "weight_lag has 1 negative entries"),
        (torch.tensor([0, -2, 5, 1]), "weight_lag has 1 negative entries"),
        # an ineligible token's lag is checked like the other inputs' entries
        (torch.tensor([0.0, 0.0, 0.0, float("nan")]), "weight_lag has 1 non-finite"),
        (torch.tensor([0.0, 0.0, 0.0, -float("inf")]), "weight_lag has 1 non-finite"),
    ],
)
def test_a_negative_or_non_finite_lag_anywhere_is_refused_and_named(path, name, lag, message):
    lp = -torch.rand(4)
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    with loss_path(path):
        out = losses.LOSSES[name](lp, lp - 0.1, torch.ones(4), mask, weight_lag=lag, **_options(name))
        with pytest.raises(ValueError, match=message):
            out.check()
        # summed elsewhere (a Megatron step, after its collective): the message still says which input
        packed = losses.pack(out).tolist()
        with pytest.raises(ValueError, match="negative weight_lag"):
            losses.raise_invalid(losses.unpack(packed).invalid)


def test_a_boolean_lag_is_refused():
    lp = -torch.rand(4)
    with pytest.raises(TypeError, match="weight_lag must hold numbers"):
        losses.ppo(lp, lp - 0.1, torch.ones(4), weight_lag=torch.ones(4, dtype=torch.bool))


def test_the_split_adds_no_host_sync_on_either_path():
    lp = -torch.rand(3, 50)
    slp = lp + 0.2 * torch.randn(3, 50)
    old, lag = slp + 0.01, torch.ones(3, 50)
    with loss_path("1"):  # compile first, outside the guard, the graph the guarded calls use (a bool mask)
        losses.ppo(
            lp.clone().requires_grad_(True),
            slp,
            torch.randn(3, 50),
            lp > -0.5,
            old_logprobs=old,
            weight_lag=lag,
        )
    for value in ("0", "1"):
        before = fused.compiled_calls["ppo"]
        with loss_path(value), host_sync_forbidden():
            total = None
            for _ in range(3):
                x = lp.clone().requires_grad_(True)
                out = losses.ppo(
                    x, slp, torch.randn(3, 50), torch.rand(3, 50) > 0.3, old_logprobs=old, weight_lag=lag
                )
                out.loss.backward()
                total = out if total is None else total + out
            assert total is not None
            packed = losses.pack(total)
        assert fused.compiled_calls["ppo"] - before == (3 if value == "1" else 0), fused.failure()
        counts = losses.unpack(packed.tolist()).counts
        assert counts.has(measures.CAUSES) and counts.has(measures.STALENESS)


def _split_points(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    points = sorted({0, n, *(c % (n + 1) for c in cuts)})
    return list(zip(points[:-1], points[1:], strict=False))


@settings(max_examples=40)
@given(
    data=inputs(two_d=False, n_max=120),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    name=st.sampled_from(GAUGE_LOSSES),
)
def test_merges_in_any_chunking_equal_the_whole_and_keep_the_identity(data, cuts, name):
    """Chunks merged by merge_outputs, by tinker's combine then merge_outputs, and as packed rows:
    the same parts as the whole batch, and total = engine + drift after every merge."""
    lp, slp, old, lag, adv, mask = data
    ref = reference(lp, slp, old, lag, mask)
    with loss_path("0"):
        whole = loss_metrics(_call(name, lp, slp, old, lag, adv, mask))
        outs, chunks = [], []
        for a, b in _split_points(lp.numel(), cuts):
            part = None if mask is None else mask[a:b]
            out = _call(name, lp[a:b], slp[a:b], old[a:b], lag[a:b], adv[a:b], part)
            outs.append(out)
            chunks.append(
                ForwardBackwardOutput(
                    loss_fn_output_type="x", loss_fn_outputs=[{}], metrics=loss_metrics(out)
                )
            )
    packed = losses.unpack(losses.combine_packed(torch.stack([losses.pack(o) for o in outs])).tolist())
    merged_forms = [
        merge_outputs(chunks).metrics,
        merge_outputs([combine_fwd_bwd_output_results(chunks)]).metrics,
    ]
    for merged in merged_forms:
        for key in keys.CAUSES_KEYS:
            assert merged[key] == pytest.approx(whole[key], rel=1e-12, abs=1e-12), key
        assert merged[keys.WEIGHT_LAG_SUM] == whole[keys.WEIGHT_LAG_SUM]
        identity = (
            merged[keys.LOG_RATIO_SUM] - merged[keys.ENGINE_LOG_RATIO_SUM] - merged[keys.DRIFT_LOG_RATIO_SUM]
        )
        assert abs(identity) <= 1e-12 * ref["scale"] + 1e-300
    for key in keys.CAUSES_KEYS:
        assert packed.counts[key] == pytest.approx(whole[key], rel=1e-12, abs=1e-12), key
    if whole[keys.LOSS_TOKENS]:
        assert packed.counts[keys.WEIGHT_LAG_MAX] == whole[keys.WEIGHT_LAG_MAX]
