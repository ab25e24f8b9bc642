"""The fused losses (cliptrack.adapters.losses.fused) against the per-token references and the eager losses.

Every test here runs with ``CLIPTRACK_FUSED=1`` and checks that the fused path actually served the
call (``fused.compiled_calls``). Compiles are few and shared: float32 and bfloat16, two threshold
pairs, 1-D and 2-D inputs (one graph each, reused for every size).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import fused
from cliptrack.core import keys
from hypothesis import given, settings
from hypothesis import strategies as st

from tests import reference
from tests._harness import loss_path
from tests.test_losses import batches

ROOT = Path(__file__).resolve().parents[1]
DTYPES = [torch.float32, torch.bfloat16]
BANDS = {"ppo": [(0.8, 1.2), (0.5, 2.0)], "cispo": [(0.0, 4.0), (0.8, 1.2)]}


@pytest.fixture(scope="module", autouse=True)
def fused_path() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(fused.ENV_VAR, "1")
        yield
    assert fused.failure() is None, fused.failure()


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().clone().requires_grad_(True)


def _run(name: str, lp, *args, **kwargs):
    """(output, d loss / d logprobs) of loss ``name``; asserts which path served the call."""
    before = fused.compiled_calls[name]
    x = _leaf(lp)
    out = losses.LOSSES[name](x, *args, **kwargs)
    out.loss.backward()
    fused_expected = os.environ.get(fused.ENV_VAR) == "1" and lp.numel() >= 2
    assert fused.compiled_calls[name] - before == int(fused_expected), "the fused path did not serve the call"
    return out, x.grad


def _near_bounds(lp, slp, bounds) -> torch.Tensor:
    """Tokens whose ratio is within a few rounding steps of a bound, in either path's arithmetic.

    Eager computes ``exp(lp - slp)`` in the input dtype, the fused kernel in float32 or wider: a
    token is ambiguous if a bound lies between the two ratios, widened by 4 ulps of the dtype.
    """
    eps = torch.finfo(lp.dtype).eps
    eager = torch.exp(lp - slp).double()
    exact = torch.exp(lp.double() - slp.double())
    lo, hi = torch.minimum(eager, exact), torch.maximum(eager, exact)
    near = torch.zeros(lp.shape, dtype=torch.bool)
    for b in bounds:
        tol = 4 * eps * max(b, 1e-30)
        near |= (lo - tol <= b) & (b <= hi + tol)
    return near


def _counts(out) -> tuple[int, int, int, int]:
    return (
        int(out.loss_tokens),
        int(out.get(keys.CLIPPED_TOKENS)),
        int(out.get(keys.CLIPPED_LOW_TOKENS)),
        int(out.get(keys.CLIPPED_HIGH_TOKENS)),
    )


@pytest.mark.parametrize("name", ["ppo", "cispo"])
@pytest.mark.parametrize("dtype", DTYPES)
@given(data=st.data())
def test_clipping_losses_match_per_token_reference_and_eager(name, dtype, data):
    lp, slp, adv, mask = data.draw(batches(dtype))
    low, high = data.draw(st.sampled_from(BANDS[name] if dtype == torch.float32 else BANDS[name][:1]))
    kwargs = {"clip_low_threshold": low, "clip_high_threshold": high}
    out, grad = _run(name, lp, slp, adv, mask, **kwargs)
    per_token = reference.per_token_ppo if name == "ppo" else reference.per_token_cispo
    ref = per_token(lp, slp, adv, mask, low, high)
    near = _near_bounds(lp, slp, (low, high)) & (mask != 0)
    n_near = int(near.sum())

    tokens, clipped, n_low, n_high = _counts(out)
    assert tokens == ref.loss_tokens
    assert clipped == n_low + n_high
    # Exact, except tokens whose ratio sits within rounding of a bound.
    assert abs(clipped - ref.clipped) <= n_near
    assert abs(n_low - ref.low) <= n_near and abs(n_high - ref.high) <= n_near
    tol = 1e-4 if dtype == torch.float32 else 0.1  # bfloat16: eager rounds lp - slp, the kernel does not
    assert float(out.loss.detach()) == pytest.approx(ref.loss, rel=tol, abs=tol * max(1, ref.loss_tokens))
    assert out.loss_tokens.dtype == torch.int64 and out.get(keys.CLIPPED_TOKENS).dim() == 0
    assert not out.get(keys.CLIPPED_TOKENS).requires_grad and out.invalid.tolist() == [0, 0, 0]

    if name == "ppo":
        # The counts follow the loss's own branch: a clipped token's gradient is exactly 0
        # (clamp at a bound), any other eligible token with A != 0 has r*A's gradient. Subnormal
        # advantages (r*A may flush to 0 in vectorised code) are left out of the comparison.
        eligible = mask != 0
        normal = adv.abs() >= 1e-30
        zero_grad = (grad == 0) & eligible & normal
        tiny = int((eligible & (adv != 0) & ~normal).sum())
        assert int(zero_grad.sum()) <= clipped <= int(zero_grad.sum()) + tiny
        assert int((zero_grad & (adv < 0)).sum()) <= n_low <= int((zero_grad & (adv < 0)).sum()) + tiny

    with loss_path("0"):
        eager, eager_grad = _run(name, lp, slp, adv, mask, **kwargs)
    rtol, atol = (1e-5, 1e-6) if dtype == torch.float32 else (0.1, 1e-2)
    assert torch.allclose(
        out.loss.detach().double(), eager.loss.detach().double(), rtol=rtol, atol=atol * max(1, tokens)
    )
    far = ~_near_bounds(lp, slp, (low, high))
    assert torch.allclose(grad[far].double(), eager_grad[far].double(), rtol=rtol, atol=atol)


@settings(max_examples=40)
@given(data=st.data())
def test_never_clipping_losses_match_per_token_reference_and_eager(data):
    lp, slp, adv, mask = data.draw(batches())
    beta = 0.1
    cases = {
        "importance_sampling": ((slp, adv, mask), {}),
        "dro": ((slp, adv, mask), {"beta": beta}),
        "cross_entropy": ((adv, mask), {}),
    }
    for name, (args, kwargs) in cases.items():
        out, grad = _run(name, lp, *args, **kwargs)
        ref = reference.per_token_loss(name, lp, slp, adv, mask, beta)
        assert int(out.loss_tokens) == ref.loss_tokens, name
        assert out.get(keys.CLIPPED_TOKENS) is None and out.clip_counts() is None
        assert float(out.loss.detach()) == pytest.approx(
            ref.loss, rel=1e-4, abs=1e-4 * max(1, ref.loss_tokens)
        )
        with loss_path("0"):
            eager, eager_grad = _run(name, lp, *args, **kwargs)
        assert torch.allclose(out.loss.detach(), eager.loss.detach(), rtol=1e-5, atol=1e-5)
        assert torch.allclose(grad, eager_grad, rtol=1e-5, atol=1e-6), name
        assert out.invalid.tolist() == eager.invalid.tolist() == [0, 0, 0]


def _inputs(shape=(3, 40), seed=0):
    gen = torch.Generator().manual_seed(seed)
    lp = -torch.rand(shape, generator=gen) * 4
    slp = lp + 0.3 * torch.randn(shape, generator=gen)
    adv = torch.randn(shape, generator=gen)
    mask = (torch.rand(shape, generator=gen) > 0.2).float()
    return lp, slp, adv, mask


def _same(fused_out, eager_out):
    assert _counts(fused_out) == _counts(eager_out)
    assert fused_out.invalid.tolist() == eager_out.invalid.tolist()
    assert torch.allclose(fused_out.loss.detach(), eager_out.loss.detach(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", ["bool mask", "no mask", "per-datum thresholds"])
def test_mask_kinds_and_tensor_thresholds_agree_with_eager(variant):
    lp, slp, adv, mask = _inputs()
    kwargs = {}
    if variant == "bool mask":
        mask = mask.bool()
    elif variant == "no mask":
        mask = None
    else:
        kwargs = {
            "clip_low_threshold": torch.tensor([[0.8], [0.5], [0.9]]),
            "clip_high_threshold": torch.tensor([[1.2], [2.0], [1.1]]),
        }
    out, grad = _run("ppo", lp, slp, adv, mask, **kwargs)
    with loss_path("0"):
        eager, eager_grad = _run("ppo", lp, slp, adv, mask, **kwargs)
    _same(out, eager)
    assert torch.allclose(grad, eager_grad, rtol=1e-5, atol=1e-6)


def test_bad_inputs_are_flagged_on_device_and_named_as_in_eager():
    lp, slp, adv, mask = _inputs()
    lp[0, 3] = float("nan")
    mask[1, 5] = 0.5
    mask[2, 7] = 2.0
    bad_low = torch.tensor([[0.8], [-0.1], [0.9]])
    high = torch.tensor([[1.2], [1.2], [0.5]])  # row 2: low > high
    for name in ("ppo", "cispo"):
        out, _ = _run(name, lp, slp, adv, mask, clip_low_threshold=bad_low, clip_high_threshold=high)
        with loss_path("0"):
            eager, _ = _run(name, lp, slp, adv, mask, clip_low_threshold=bad_low, clip_high_threshold=high)
        assert out.invalid.tolist() == eager.invalid.tolist() == [1, 2, 2]
        with pytest.raises(ValueError) as fused_error:
            out.check()
        with pytest.raises(ValueError) as eager_error:
            eager.check()
        assert str(fused_error.value) == str(eager_error.value)
        assert "logprobs has 1 non-finite" in str(fused_error.value)
        assert "mask has 2 entries" in str(fused_error.value)
    with pytest.raises(ValueError, match="sampling_logprobs has shape"):
        losses.ppo(lp, slp[:, :5], adv, mask)
    with pytest.raises(ValueError, match="clip_low_threshold=1.5 is above"):
        losses.ppo(lp, slp, adv, mask, clip_low_threshold=1.5, clip_high_threshold=1.2)


def test_a_tensor_threshold_beside_a_number_is_checked_alike_on_both_paths():
    lp, slp, adv, mask = _inputs()
    low = torch.tensor([[0.8], [1.5], [0.9]])  # row 1 is above the number bound 1.2
    for name in ("ppo", "cispo"):
        out, _ = _run(name, lp, slp, adv, mask, clip_low_threshold=low, clip_high_threshold=1.2)
        with loss_path("0"):
            eager, _ = _run(name, lp, slp, adv, mask, clip_low_threshold=low, clip_high_threshold=1.2)
        assert out.invalid.tolist() == eager.invalid.tolist() == [0, 0, 1]
        with pytest.raises(ValueError, match="clip thresholds have 1 entries"):
            eager.check()


def test_one_graph_serves_every_batch_shape_and_layout():
    counters = torch._dynamo.utils.counters["stats"]
    shapes = [(3, 7), (5, 11), (1, 17), (2, 300), (50,), (7,), (3001,), (2, 5, 3), (1, 1, 9)]
    lp, slp, adv, mask = _inputs(shapes[0])
    _run("ppo", lp, slp, adv, mask)  # compiles the graph if no earlier test did
    graphs = counters["unique_graphs"]
    for shape in shapes[1:]:
        lp, slp, adv, mask = _inputs(shape, seed=len(shape))
        _run("ppo", lp, slp, adv, mask)
        assert counters["unique_graphs"] == graphs, f"recompiled for shape {shape}"


def test_selection_by_environment_and_size(monkeypatch):
    big = torch.empty(fused.AUTO_MIN_TOKENS)
    small = torch.empty(fused.AUTO_MIN_TOKENS - 1)
    monkeypatch.setenv(fused.ENV_VAR, "0")
    assert not fused.wanted(big)
    monkeypatch.setenv(fused.ENV_VAR, "1")
    assert fused.wanted(small) and not fused.wanted(torch.empty(1)) and not fused.wanted([0.0, 1.0])
    monkeypatch.delenv(fused.ENV_VAR)
    assert not fused.wanted(small)
    assert fused.wanted(big) == fused.compile_available(big.device)
    monkeypatch.setenv(fused.ENV_VAR, "yes")
    with pytest.raises(ValueError, match="CLIPTRACK_FUSED must be 1"):
        losses.ppo(small, small, small)


_FAILING_COMPILER = textwrap.dedent(
    """
    import json, os, warnings
    import torch
    import torch._inductor.config
    torch._inductor.config.cpp.cxx = ("/nonexistent/c++",)  # no C++ compiler: every CPU compile fails
    from cliptrack.adapters.losses import fused
    from cliptrack.adapters.losses import builtin as losses
    from cliptrack.core import keys

    def _fields(counts):
        return [counts.loss_tokens, counts.get(keys.CLIPPED_TOKENS), counts.get(keys.CLIPPED_LOW_TOKENS), counts.get(keys.CLIPPED_HIGH_TOKENS)]

    torch.manual_seed(0)
    lp, slp, adv = -torch.rand(4, 30), -torch.rand(4, 30), torch.randn(4, 30)
    results = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for fn in (losses.ppo, losses.cispo, losses.ppo):
            x = lp.clone().requires_grad_(True)
            out = fn(x, slp, adv)
            out.loss.backward()
            results.append([float(out.loss), *_fields(out.clip_counts()), x.grad.abs().sum().item()])
    os.environ[fused.ENV_VAR] = "0"
    eager = []
    for fn in (losses.ppo, losses.cispo, losses.ppo):
        x = lp.clone().requires_grad_(True)
        out = fn(x, slp, adv)
        out.loss.backward()
        eager.append([float(out.loss), *_fields(out.clip_counts()), x.grad.abs().sum().item()])
    ours = [str(w.message) for w in caught if "cliptrack" in str(w.message)]
    print(json.dumps({"warnings": ours, "failure": fused.failure(), "results": results, "eager": eager,
                      "fused_calls": sum(fused.compiled_calls.values())}))
    """
)


@pytest.mark.slow
def test_a_compile_failure_falls_back_to_eager_with_one_warning(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    env[fused.ENV_VAR] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", _FAILING_COMPILER],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "runs eagerly from now on" in report["warnings"][0]
    assert report["failure"] and report["fused_calls"] == 0
    assert report["results"] == report["eager"]
    assert all(math.isfinite(v) for row in report["results"] for v in row)


def test_a_call_differentiating_more_than_the_logprobs_runs_eagerly():
    lp, slp, adv, mask = _inputs()
    adv = adv.clone().requires_grad_(True)
    before = fused.compiled_calls["ppo"]
    out = losses.ppo(_leaf(lp), slp, adv, mask)
    out.loss.backward()
    assert fused.compiled_calls["ppo"] == before
    assert adv.grad is not None and bool(adv.grad.abs().sum() > 0)
