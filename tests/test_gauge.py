"""The on-policy gauge (docs/CONTRACT.md, "The on-policy gauge"): every key against a float64
reference, eager and fused, through the merges and the tracker; loss and gradients unchanged;
bad input refused and named."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from cliptrack import Limits
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import fused
from cliptrack.adapters.losses.output import ForwardBackwardOutput, loss_metrics, measured_sums, merge_outputs
from cliptrack.adapters.miles import keys as miles_keys
from cliptrack.core import keys, measures
from cliptrack.core.sums import MeasuredSums, exact_measured_metrics
from cliptrack.core.validation import check_metrics
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results

from tests import reference
from tests._harness import host_sync_forbidden, loss_path

GAUGE_LOSSES = ("ppo", "cispo", "importance_sampling", "dro")
FLOAT_KEYS = ("log_ratio:sum", "abs_log_ratio:sum", "kl_k3:sum", "is_weight:sum", "is_weight_sq:sum")


def _options(name: str) -> dict[str, float]:
    return {"beta": 0.1} if name == "dro" else {}


@st.composite
def inputs(draw, two_d: bool | None = None, n_max: int = 60):
    """(lp, slp, adv, mask-or-None): 1-D or [batch, seq], mask bool / float / none, log-ratios from
    tiny (sampler-trainer numerics) to large (stale samples)."""
    two = draw(st.booleans()) if two_d is None else two_d
    rows = draw(st.integers(1, 4)) if two else 1
    cols = draw(st.integers(2, n_max))
    shape = (rows, cols) if two else (cols,)
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([1e-4, 1e-2, 0.3, 2.0]))
    lp = -torch.rand(shape, generator=gen) * 4
    slp = lp + scale * torch.randn(shape, generator=gen)
    adv = torch.randn(shape, generator=gen)
    kind = draw(st.sampled_from(["bool", "float", "none"]))
    keep = torch.rand(shape, generator=gen) > draw(st.sampled_from([0.0, 0.3, 1.0]))
    mask = None if kind == "none" else keep if kind == "bool" else keep.float()
    return lp, slp, adv, mask


def assert_gauge(metrics: dict[str, float], lp, slp, mask, low: float = 0.5, high: float = 2.0) -> None:
    """Every gauge key of ``metrics`` against the float64 reference."""
    ref = reference.gauge(lp, slp, mask, low, high)
    assert metrics[keys.LOSS_TOKENS] == ref.loss_tokens
    expected_keys = {k for k in ref.metrics if k != keys.LOSS_TOKENS}
    assert expected_keys <= set(metrics)
    assert set(keys.GAUGE_KEYS) & set(metrics) == expected_keys
    for key in FLOAT_KEYS:
        tol = reference.gauge_tolerance(key, lp, slp, mask)
        assert abs(metrics[key] - ref.metrics[key]) <= tol, (key, metrics[key], ref.metrics[key], tol)
    for key in (keys.LOG_RATIO_MAX, keys.LOG_RATIO_MIN):
        if ref.loss_tokens:
            assert metrics[key] == ref.metrics[key], key  # exact: one value of l
    outside = metrics[keys.RATIO_OUTSIDE_TOKENS]
    expected_outside = ref.metrics[keys.RATIO_OUTSIDE_TOKENS]
    assert abs(outside - expected_outside) <= ref.outside_ambiguous
    if ref.loss_tokens:
        for mean in measures.GAUGE_MEANS:  # formed once from the sums
            assert metrics[mean.key] == metrics[mean.numerator] / metrics[keys.LOSS_TOKENS]
    else:
        assert keys.KL_K3_MEAN not in metrics and keys.ABS_LOG_RATIO_MEAN not in metrics


@pytest.mark.parametrize("name", GAUGE_LOSSES)
@settings(max_examples=60)
@given(data=inputs())
def test_every_key_matches_the_float64_reference_eager(name, data):
    lp, slp, adv, mask = data
    with loss_path("0"):
        out = losses.LOSSES[name](lp, slp, adv, mask, **_options(name))
    assert_gauge(loss_metrics(out), lp, slp, mask)


@pytest.mark.parametrize("name", GAUGE_LOSSES)
@settings(max_examples=25)
@given(data=inputs())
def test_every_key_matches_the_float64_reference_fused(name, data):
    lp, slp, adv, mask = data
    before = fused.compiled_calls[name]
    with loss_path("1"):
        out = losses.LOSSES[name](lp, slp, adv, mask, **_options(name))
    assert fused.compiled_calls[name] == before + 1, fused.failure()
    assert_gauge(loss_metrics(out), lp, slp, mask)


@pytest.mark.parametrize("name", GAUGE_LOSSES)
def test_loss_and_gradients_are_those_of_the_objective_without_the_gauge(name):
    """Eager: bit-identical to Tinker's formula (tests.reference.objective_*); fused: equal to eager
    within rounding, as before the gauge."""
    gen = torch.Generator().manual_seed(3)
    lp = -torch.rand(4, 300, generator=gen) * 3
    slp = lp + 0.4 * torch.randn(4, 300, generator=gen)
    adv = torch.randn(4, 300, generator=gen)
    mask = (torch.rand(4, 300, generator=gen) > 0.2).float()
    plain = {
        "ppo": lambda x: reference.objective_ppo(x, slp, adv, mask, 0.8, 1.2),
        "cispo": lambda x: reference.objective_cispo(x, slp, adv, mask, 0.0, 4.0),
        "importance_sampling": lambda x: reference.objective_importance_sampling(x, slp, adv, mask),
        "dro": lambda x: reference.objective_dro(x, slp, adv, mask, 0.1),
    }[name]
    x0 = lp.clone().requires_grad_(True)
    loss0 = plain(x0)
    loss0.backward()
    grads = {}
    for value in ("0", "1"):
        x = lp.clone().requires_grad_(True)
        with loss_path(value):
            out = losses.LOSSES[name](x, slp, adv, mask, **_options(name))
        out.loss.backward()
        assert out.has_gauge
        grads[value] = (out.loss.detach(), x.grad)
    assert torch.equal(grads["0"][0], loss0.detach()) and torch.equal(grads["0"][1], x0.grad)
    torch.testing.assert_close(grads["1"][0], loss0.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grads["1"][1], x0.grad, rtol=1e-5, atol=1e-6)


def test_cross_entropy_emits_no_gauge_and_cannot_be_mixed_with_one():
    lp = -torch.rand(10)
    out = losses.cross_entropy(lp, torch.ones(10))
    metrics = loss_metrics(out)
    assert not out.has_gauge and set(metrics).isdisjoint(keys.GAUGE_KEYS)
    other = losses.importance_sampling(lp, lp - 0.1, torch.ones(10))
    with pytest.raises(ValueError, match="carries the gauge measures but earlier outputs .* do not"):
        out + other
    with pytest.raises(ValueError, match="gauge"):
        losses.unpack(losses.combine_packed(torch.stack([losses.pack(out), losses.pack(other)])).tolist())


def test_the_ratio_outside_bound_is_a_per_call_option():
    lp = torch.zeros(6)
    slp = torch.log(torch.tensor([0.4, 0.6, 1.0, 1.5, 2.5, 3.5])).neg()  # ratios 0.4 .. 3.5
    adv = torch.ones(6)
    default = loss_metrics(losses.ppo(lp, slp, adv))
    assert default[keys.RATIO_OUTSIDE_TOKENS] == 3  # 0.4, 2.5, 3.5 outside [1/2, 2]
    narrow = loss_metrics(losses.ppo(lp, slp, adv, ratio_outside_low=0.9, ratio_outside_high=1.1))
    assert narrow[keys.RATIO_OUTSIDE_TOKENS] == 5
    spec = losses.loss_spec("importance_sampling")
    assert spec is not None and spec.option_defaults[measures.RATIO_OUTSIDE_HIGH_OPTION] == 2.0
    with pytest.raises(ValueError, match="ratio_outside_low=3.0 is above ratio_outside_high=2.0"):
        losses.cispo(lp, slp, adv, ratio_outside_low=3.0)
    with pytest.raises(ValueError, match="ratio_outside_high must be a finite ratio bound"):
        losses.dro(lp, slp, adv, beta=0.1, ratio_outside_high=math.inf)
    with pytest.raises(TypeError, match="ratio_outside_low must be a float"):
        losses.importance_sampling(lp, slp, adv, ratio_outside_low=torch.tensor(0.5))


@pytest.mark.parametrize("value", ["0", "1"])
def test_non_finite_values_are_refused_and_named(value):
    lp = -torch.rand(8)
    slp = lp.clone()
    slp[2] = math.nan
    with loss_path(value):
        out = losses.importance_sampling(lp, slp, torch.ones(8), torch.ones(8))
    with pytest.raises(ValueError, match="sampling_logprobs has 1 non-finite entries"):
        loss_metrics(out)
    # finite inputs whose importance weight overflows float32: CISPO's loss stays finite (its
    # coefficient is clamped), the gauge would not: refused, not logged as inf
    slp = lp.clone()
    slp[0] = lp[0] - 200.0
    with loss_path(value):
        out = losses.cispo(lp, slp, torch.ones(8))
    with pytest.raises(ValueError, match="importance weight .* overflows"):
        loss_metrics(out)


def test_the_gauge_adds_no_host_sync_on_either_path():
    lp = -torch.rand(3, 50)
    slp = lp + 0.2 * torch.randn(3, 50)
    with loss_path("1"):  # compile first, outside the guard, the graph the guarded calls use (a bool mask)
        losses.ppo(lp.clone().requires_grad_(True), slp, torch.randn(3, 50), torch.rand(3, 50) > 0.3)
    for value in ("0", "1"):
        before = fused.compiled_calls["ppo"]
        with loss_path(value), host_sync_forbidden():
            total = None
            for _ in range(3):
                x = lp.clone().requires_grad_(True)
                out = losses.ppo(x, slp, torch.randn(3, 50), torch.rand(3, 50) > 0.3)
                out.loss.backward()
                total = out if total is None else total + out
            assert total is not None
            packed = losses.pack(total)
        assert fused.compiled_calls["ppo"] - before == (3 if value == "1" else 0), fused.failure()
        assert losses.unpack(packed.tolist()).counts.has_gauge


def _split(n: int, cuts: list[int]) -> list[tuple[int, int]]:
    points = sorted({0, n, *(c % (n + 1) for c in cuts)})
    return list(zip(points[:-1], points[1:], strict=False))


@settings(max_examples=60)
@given(
    data=inputs(two_d=False, n_max=120),
    cuts=st.lists(st.integers(0, 200), max_size=6),
    name=st.sampled_from(GAUGE_LOSSES),
)
def test_merges_in_any_chunking_equal_the_whole_ours_and_tinkers(data, cuts, name):
    """Chunks of one request (each a datum) merged by merge_outputs, and by tinker's own
    combine_fwd_bwd_output_results then merge_outputs: the same gauge as the whole batch."""
    lp, slp, adv, mask = data
    with loss_path("0"):
        whole = loss_metrics(losses.LOSSES[name](lp, slp, adv, mask, **_options(name)))
        chunks = []
        for a, b in _split(lp.numel(), cuts):
            part = None if mask is None else mask[a:b]
            out = losses.LOSSES[name](lp[a:b], slp[a:b], adv[a:b], part, **_options(name))
            chunks.append(
                ForwardBackwardOutput(
                    loss_fn_output_type="x", loss_fn_outputs=[{}], metrics=loss_metrics(out)
                )
            )
    ours = merge_outputs(chunks).metrics
    via_tinker = merge_outputs([combine_fwd_bwd_output_results(chunks)]).metrics
    for merged in (ours, via_tinker):
        for key in (keys.LOSS_TOKENS, keys.RATIO_OUTSIDE_TOKENS, keys.LOG_RATIO_MAX, keys.LOG_RATIO_MIN):
            if key in merged or key in whole:
                if (
                    merged is via_tinker
                    and key in (keys.LOG_RATIO_MAX, keys.LOG_RATIO_MIN)
                    and key not in merged
                ):
                    # tinker drops a key missing from any chunk: a chunk without an eligible token has no extreme
                    assert any(c.metrics[keys.LOSS_TOKENS] == 0 for c in chunks)
                    continue
                assert merged[key] == whole[key], key
        for key in FLOAT_KEYS:
            assert merged[key] == pytest.approx(whole[key], rel=1e-12, abs=1e-12), key
        for mean in measures.GAUGE_MEANS:
            if whole[keys.LOSS_TOKENS]:
                assert merged[mean.key] == merged[mean.numerator] / merged[keys.LOSS_TOKENS]
            else:
                assert mean.key not in merged


def test_tinker_keeps_max_and_min_by_max_and_min():
    chunks = []
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        lp = -torch.rand(20, generator=gen)
        out = losses.ppo(lp, lp + torch.randn(20, generator=gen), torch.randn(20, generator=gen))
        chunks.append(
            ForwardBackwardOutput(
                loss_fn_output_type="x", loss_fn_outputs=[{}] * (seed + 1), metrics=loss_metrics(out)
            )
        )
    merged = combine_fwd_bwd_output_results(chunks).metrics
    assert merged[keys.LOG_RATIO_MAX] == max(c.metrics[keys.LOG_RATIO_MAX] for c in chunks)
    assert merged[keys.LOG_RATIO_MIN] == min(c.metrics[keys.LOG_RATIO_MIN] for c in chunks)
    # tinker's :mean is datum-weighted; merge_outputs re-forms it from the sums
    ours = merge_outputs([combine_fwd_bwd_output_results(chunks)]).metrics
    assert ours[keys.KL_K3_MEAN] == ours[keys.KL_K3_SUM] / ours[keys.LOSS_TOKENS]
    assert ours[keys.KL_K3_MEAN] != merged[keys.KL_K3_MEAN]


def _metrics() -> dict[str, float]:
    lp = -torch.rand(30)
    return loss_metrics(losses.ppo(lp, lp + 0.3 * torch.randn(30), torch.randn(30)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({keys.KL_K3_SUM: -1.0}, "kl_k3:sum must be >= 0"),
        ({keys.ABS_LOG_RATIO_SUM: math.nan}, "abs_log_ratio:sum must be finite"),
        ({keys.RATIO_OUTSIDE_TOKENS: 0.5}, "whole number"),
        ({keys.RATIO_OUTSIDE_TOKENS: 31.0}, "exceeds loss_tokens=30"),
        ({keys.LOG_RATIO_MIN: 5.0}, "log_ratio:min=5.0 is above log_ratio:max"),
        ({keys.IS_WEIGHT_SUM: None}, r"lacks \['is_weight:sum'\]"),
        ({keys.KL_K3_MEAN: -0.1, keys.KL_K3_SUM: None}, r"lacks \['kl_k3:sum'\]"),
    ],
)
def test_bad_gauge_values_are_refused_and_named(change, message):
    metrics = _metrics()
    for key, value in change.items():
        if value is None:
            metrics.pop(key)
        else:
            metrics[key] = value
    with pytest.raises(ValueError, match=message):
        check_metrics(metrics)


def test_a_gauge_mean_without_its_sums_is_checked_and_kept_and_with_them_re_formed():
    assert check_metrics({keys.KL_K3_MEAN: 0.01}) == {keys.KL_K3_MEAN: 0.01}
    with pytest.raises(ValueError, match="kl_k3:mean must be a finite mean >= 0"):
        check_metrics({keys.KL_K3_MEAN: -0.01})
    metrics = _metrics()
    metrics[keys.KL_K3_MEAN] = 123.0
    assert exact_measured_metrics(metrics)[keys.KL_K3_MEAN] == metrics[keys.KL_K3_SUM] / 30


def test_measured_sums_add_by_the_declared_rules():
    torch.manual_seed(3)
    metrics = [_metrics() for _ in range(3)]
    sums = [MeasuredSums.from_metrics(m) for m in metrics]
    total = sums[0] + sums[1] + sums[2]
    gauge = total.group_values(measures.GAUGE)
    assert gauge is not None
    assert gauge[keys.LOG_RATIO_MAX] == max(m[keys.LOG_RATIO_MAX] for m in metrics)
    assert gauge[keys.LOG_RATIO_MIN] == min(m[keys.LOG_RATIO_MIN] for m in metrics)
    assert gauge[keys.RATIO_OUTSIDE_TOKENS] == sum(int(m[keys.RATIO_OUTSIDE_TOKENS]) for m in metrics)
    # float sums add in order, as the terms are added ((a + b) + c; fsum may differ by an ulp)
    assert gauge[keys.KL_K3_SUM] == sum(m[keys.KL_K3_SUM] for m in metrics)
    assert (
        measured_sums(ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics=metrics[0]))
        == sums[0]
    )
    # a term over no eligible token has no extremes and leaves the others' in place
    gauge_sums = [m.key for m in measures.GAUGE_MEASURES if m.reduction == measures.SUM]
    empty = MeasuredSums(dict.fromkeys([*keys.TOKEN_COUNT_KEYS, *gauge_sums], 0))
    assert (empty + total).group_values(measures.GAUGE) == gauge
    with pytest.raises(ValueError, match="does not carry the gauge measures but earlier"):
        total + total.without(measures.GAUGE)


def test_the_declaration_is_the_one_source_of_keys_fields_and_layout():
    assert keys.GAUGE_MEASURED_KEYS == (
        "log_ratio:sum",
        "abs_log_ratio:sum",
        "kl_k3:sum",
        "ratio_outside_tokens:sum",
        "is_weight:sum",
        "is_weight_sq:sum",
        "log_ratio:max",
        "log_ratio:min",
    )
    assert keys.GAUGE_MEAN_KEYS == ("abs_log_ratio:mean", "kl_k3:mean")
    assert losses.PACKED_FIELDS == measures.PACKED_FIELDS
    assert measures.PACKED_FIELDS[losses.PACKED_ADDED :] == (
        "log_ratio:max",
        "-log_ratio:min",
        "weight_lag:max",
    )
    assert {m.field for m in measures.GAUGE_MEASURES} == set(keys.DATUM_GAUGE_FIELDS)
    assert miles_keys.GAUGE_ENTRIES == tuple(
        f for f in keys.DATUM_GAUGE_FIELDS if not f.endswith(("_max", "_min"))
    )
    for spec_name in GAUGE_LOSSES:
        spec = losses.loss_spec(spec_name)
        assert spec is not None and spec.gauge
    assert not losses.loss_spec("cross_entropy").gauge  # type: ignore[union-attr]
    assert dataclasses.is_dataclass(measures.Measure)


def test_tracker_records_the_gauge_series_beside_the_clip_series(tmp_path):
    from cliptrack import Tracker

    lp = -torch.rand(40)
    out = losses.ppo(lp, lp + 0.2 * torch.randn(40), torch.randn(40))
    fbo = ForwardBackwardOutput(loss_fn_output_type="x", loss_fn_outputs=[], metrics=loss_metrics(out))
    tracker = Tracker(
        sinks=("jsonl",), spool_dir=tmp_path, limits=Limits(flush_interval_s=0.05), handle_signals=False
    )
    tracker.log_output(0, fbo)
    bad = dict(fbo.metrics)
    bad[keys.KL_K3_SUM] = -1.0
    with pytest.raises(ValueError, match="kl_k3:sum must be >= 0"):
        tracker.log_output(1, ForwardBackwardOutput(loss_fn_output_type="x", loss_fn_outputs=[], metrics=bad))
    tracker.close()
    import json

    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    points = [json.loads(line) for line in (run / "points.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points] == [0]
    logged = points[0]["metrics"]
    for key in (*keys.GAUGE_SERIES_KEYS, *keys.CLIP_SERIES_KEYS):
        assert logged[key] == fbo.metrics[key], key


_compiled_k3 = torch.compile(losses.k3_terms, dynamic=True)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.floats(-3.0, 3.0, width=32, allow_subnormal=False)
        | st.floats(-0.0009765625, 0.0009765625, width=32),
        min_size=2,
        max_size=64,
    )
)
@example(values=[0.0, 1.0865730223706849e-21])  # a term of 5.9e-43: below float32's normal range
def test_the_k3_term_is_exact_to_float32_rounding_of_the_term_itself_compiled_and_eager(values):
    """Per token, relative to the term (not to ``l``), against float64 of the same float32 ``l``
    (the Taylor series below |l| = 1e-3, where it is exact to float64 rounding, ``expm1(l) - l``
    above): the compiled series (below |l| = 1/2) and the direct ``w - 1 - l`` (above) to a few
    float32 ulps; the eager ``expm1(l) - l`` in float64 to float64's rounding of ``expm1(l)`` (an
    ulp of ``l``, below float32 rounding of the term from |l| of about 1e-8 up). A tiny ``l`` is
    where cancellation in float32 would lose every digit."""
    log_ratio = torch.tensor(values, dtype=torch.float32)
    x = log_ratio.double()
    series_f64 = x * x * (1 / 2 + x * (1 / 6 + x * (1 / 24 + x / 120)))
    truth = torch.where(x.abs() < 1e-3, series_f64, torch.expm1(x) - x)
    eps32, eps64 = 1.2e-7, 2.3e-16
    # a term below float32's normal range (|l| < 1.5e-19) is a multiple of 2**-149: each product of
    # the series rounds by up to half that spacing, whatever the term's size
    subnormal = 4 * 2.0**-149
    below = log_ratio.abs() < losses.K3_SERIES_BELOW
    # the direct term (>= 0.1): the rounding of w and of the two subtractions, an ulp of w + 1 + |l|
    direct = 2 * eps32 * (torch.exp(x) + 1 + x.abs())
    for path, got, bound in (
        (
            "compiled",
            _compiled_k3(log_ratio, torch.exp(log_ratio)),
            torch.where(below, 8 * eps32 * truth, direct),
        ),
        ("eager", losses.k3_terms(log_ratio, torch.exp(log_ratio)), 8 * eps32 * truth + 2 * eps64 * x.abs()),
    ):
        assert got.dtype in (torch.float32, torch.float64)
        error = (got.double() - truth).abs()
        assert bool((error <= bound + subnormal).all()), (
            path,
            log_ratio[error > bound],
            error[error > bound],
        )


def test_the_compiled_k3_polynomial_is_exact_to_float32_rounding_over_its_whole_range():
    """Every 2**-20 step of ``l`` in (-1/2, 1/2) and a fine grid near 0: the compiled term (a fitted
    polynomial, not the Taylor series) within a few float32 ulps of the float64 truth, relative to
    the term (measured: 1.6 ulps at most)."""
    grid = torch.arange(-(2**19) + 1, 2**19, dtype=torch.float64) / 2**20
    fine = torch.logspace(-12, -3, 2001, dtype=torch.float64)
    log_ratio = torch.cat([grid, fine, -fine]).float()
    log_ratio = log_ratio[log_ratio != 0]
    x = log_ratio.double()
    series_f64 = x * x * (1 / 2 + x * (1 / 6 + x * (1 / 24 + x / 120)))
    truth = torch.where(x.abs() < 1e-3, series_f64, torch.expm1(x) - x)
    got = _compiled_k3(log_ratio, torch.exp(log_ratio)).double()
    relative = (got - truth).abs() / truth
    assert float(relative.max()) <= 4 * 1.2e-7, float(relative.max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("masked", [False, True])
def test_the_gauge_leaves_its_input_and_the_loss_graph_untouched(dtype, masked):
    # Found by comparing against the previous eager code: float64 without a mask, the eager gauge
    # overwrote the caller's log ratio with |l| (DRO's backward then failed, the extremes were wrong).
    lp = torch.tensor([-0.5, -1.0, -0.2], dtype=dtype, requires_grad=True)
    slp = torch.tensor([-0.7, -0.4, -0.2], dtype=dtype)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=dtype)
    mask = torch.ones(3) if masked else None
    log_ratio = (lp - slp).detach()
    before = log_ratio.clone()
    losses.gauge_of(log_ratio, log_ratio.exp(), None if mask is None else mask != 0)
    assert torch.equal(log_ratio, before)
    with loss_path("0"):
        out = losses.dro(lp, slp, adv, mask, beta=0.1)
        out.loss.backward()  # the log ratio DRO saved for its backward is intact
    ratio_log = (lp - slp).detach().double()
    torch.testing.assert_close(lp.grad.double(), -adv.double() + 0.1 * ratio_log)
    packed = dict(zip(losses.PACKED_FIELDS, losses.pack(out).tolist(), strict=True))
    top, bottom = packed[keys.LOG_RATIO_MAX], packed["-" + keys.LOG_RATIO_MIN]
    assert top == pytest.approx(float(ratio_log.max())) and -bottom == pytest.approx(float(ratio_log.min()))


def test_a_zero_extreme_is_positive_zero_on_policy():
    lp = torch.tensor([-0.5, -0.5, -0.1])
    with loss_path("0"):
        out = losses.importance_sampling(lp, lp.clone(), torch.ones(3), torch.tensor([1.0, 1.0, 0.0]))
    packed = losses.pack(out).tolist()  # the extremes as the collective combines them
    slot = measures.DEFAULT.slot
    extremes = [packed[slot[keys.LOG_RATIO_MAX]], packed[slot[keys.LOG_RATIO_MIN]]]
    assert [math.copysign(1.0, v) for v in extremes] == [1.0, 1.0]
