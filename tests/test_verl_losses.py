"""cliptrack's twins of verl's policy losses against verl 0.9.1's own functions, installed: the same
loss and gradient for every ``loss_agg_mode`` (bit for bit: the twin's loss is verl's function's),
verl's own metrics kept, and cliptrack's sums equal to a plain per-token reference. Skipped where
verl is not importable (the ``verl`` extra)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("verl", reason="verl is not installed (pip install 'cliptrack[verl]', verl==0.9.1)")
torch = pytest.importorskip("torch")

import cliptrack.adapters.verl as adapter  # noqa: E402
from cliptrack.core import keys  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
MICRO = 2


def _config(low: float, high: float, c: float, info: dict[str, Any], **extra: Any) -> Any:
    config = ActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=MICRO,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        **extra,
    )
    config.global_batch_info.update(info)
    return config


@st.composite
def batches(draw: st.DrawFn) -> dict[str, Any]:
    rows = draw(st.integers(1, 4))
    length = draw(st.integers(1, 9))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    old = -2.0 + torch.randn(rows, length, generator=g)
    spread = draw(st.sampled_from([0.05, 0.3, 1.5]))
    mask = torch.rand(rows, length, generator=g) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    tokens = int(mask.sum())
    info = draw(
        st.sampled_from(
            [
                {},
                {
                    "dp_size": 1,
                    "batch_num_tokens": max(tokens, 1),
                    "global_batch_size": 2 * MICRO,
                    "loss_scale_factor": None,
                },
                {
                    "dp_size": 2,
                    "batch_num_tokens": 2 * tokens + 3,
                    "global_batch_size": 4 * MICRO,
                    "loss_scale_factor": 7,
                },
            ]
        )
    )
    return {
        "old": old,
        "current": old + spread * torch.randn(rows, length, generator=g),
        "advantages": torch.randn(rows, length, generator=g) * (torch.rand(rows, length, generator=g) > 0.1),
        "mask": mask,
        "weights": torch.exp(0.2 * torch.randn(rows, length, generator=g)) if draw(st.booleans()) else None,
        "agg": draw(st.sampled_from(AGG_MODES)),
        "low": draw(st.sampled_from([0.2, 0.1, 0.35])),
        "high": draw(st.sampled_from([0.2, 0.28, 0.5])),
        "c": draw(st.sampled_from([3.0, 1.5, 10.0])),
        "info": info,
    }


def _call(name: str, b: dict[str, Any], config: Any) -> tuple[Any, dict[str, Any], Any]:
    current = b["current"].clone().requires_grad_(True)
    loss, metrics = core_algos.get_policy_loss_fn(name)(
        b["old"], current, b["advantages"], b["mask"], b["agg"], config, b["weights"]
    )
    loss.backward()
    return loss.detach(), metrics, current.grad


def _reference(b: dict[str, Any], mode: str) -> dict[str, int]:
    """Token by token, verl's rules: ratio exp(current - old); PPO clipped where the band bites
    (A > 0, r > 1 + high; A < 0, r < 1 - low); CISPO where r is outside the band."""
    low, high = 1 - b["low"], 1 + b["high"]
    ratio = torch.exp(b["current"] - b["old"])
    # the dual clip as verl writes it, in the inputs' float32: max(-A*r, -A*clamp(r)) > -A*c with A < 0
    adv = b["advantages"]
    dual = (torch.maximum(-adv * ratio, -adv * ratio.clamp(low, high)) > -adv * b["c"]) & (adv < 0)
    out = {"loss_tokens": 0, "clipped_tokens": 0, "clipped_low_tokens": 0, "clipped_high_tokens": 0}
    if mode == "vanilla":
        out["dual_clipped_tokens"] = 0
    for m, a, r, d in zip(
        b["mask"].flatten().tolist(),
        adv.flatten().tolist(),
        ratio.flatten().tolist(),
        dual.flatten().tolist(),
        strict=True,
    ):
        if not m:
            continue
        out["loss_tokens"] += 1
        below = r < low if mode == "cispo" else (a < 0 and r < low)
        above = r > high if mode == "cispo" else (a > 0 and r > high)
        out["clipped_low_tokens"] += below
        out["clipped_high_tokens"] += above
        out["clipped_tokens"] += below or above
        if mode == "vanilla":
            out["dual_clipped_tokens"] += d
    return out


@pytest.mark.parametrize("mode", ["vanilla", "cispo"])
@settings(max_examples=60)
@given(b=batches())
def test_twin_equals_verls_mode(mode: str, b: dict[str, Any]) -> None:
    config = _config(b["low"], b["high"], b["c"], b["info"])
    loss, metrics, grad = _call(f"cliptrack_{mode}", b, config)
    verl_loss, verl_metrics, verl_grad = _call(mode, b, config)
    torch.testing.assert_close(loss, verl_loss, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(grad, verl_grad, rtol=0, atol=0, equal_nan=True)
    for key, value in verl_metrics.items():
        assert metrics[key] == value or (value != value and metrics[key] != metrics[key]), key
    scale = b["info"].get("global_batch_size", MICRO) // MICRO
    expected = _reference(b, mode)
    for name, count in expected.items():
        value = metrics[f"cliptrack/{name}"]
        assert value.dtype == torch.int64 and value.device == b["current"].device
        assert int(value) == count * scale, name
    # verl's own fraction, where the micro-batch has tokens, is this call's clipped / eligible
    if expected["loss_tokens"] and mode == "vanilla":
        assert verl_metrics["actor/pg_clipfrac"] == pytest.approx(
            expected["clipped_tokens"] / expected["loss_tokens"], rel=1e-6
        )
        assert verl_metrics["actor/pg_clipfrac_lower"] == pytest.approx(
            expected["dual_clipped_tokens"] / expected["loss_tokens"], rel=1e-6
        )
    # without the rollout's log-probs: the drift part of the gauge only, the engine part marked unavailable
    assert metrics["cliptrack/engine_gauge"] == 0.0
    assert not [
        k
        for k in metrics
        if k.startswith(("cliptrack/engine_", "cliptrack/log_ratio", "cliptrack/kl_k3"))
        and k != "cliptrack/engine_gauge"
    ]
    drift = float(((b["current"] - b["old"]).double().abs() * b["mask"]).sum()) * scale
    assert float(metrics["cliptrack/drift_abs_log_ratio"]) == pytest.approx(drift, rel=1e-9, abs=1e-12)


@settings(max_examples=30)
@given(b=batches())
def test_engine_part_from_plain_rollout_weights(b: dict[str, Any]) -> None:
    """With CLIPTRACK_VERL_ENGINE=weights the rollout log-probs are old - log(w): the engine part is
    log(w), the gauge current - rollout; the clip counts stay against the old log-probs."""
    g = torch.Generator().manual_seed(7)
    engine = 0.3 * torch.randn(b["old"].shape, generator=g)
    b = {**b, "weights": torch.exp(engine)}
    config = _config(b["low"], b["high"], b["c"], b["info"])
    plain, _, _ = _call("cliptrack_vanilla", b, config)
    _, without, _ = _call("cliptrack_vanilla", b, config)
    os.environ[adapter.ENGINE_ENV] = "weights"
    try:
        loss, metrics, _ = _call("cliptrack_vanilla", b, config)
    finally:
        del os.environ[adapter.ENGINE_ENV]
    torch.testing.assert_close(loss, plain, rtol=0, atol=0, equal_nan=True)
    scale = b["info"].get("global_batch_size", MICRO) // MICRO
    mask = b["mask"].double()
    tokens = float(mask.sum())
    assert metrics["cliptrack/engine_gauge"] == 1.0
    for name in (
        "loss_tokens",
        "clipped_tokens",
        "clipped_low_tokens",
        "clipped_high_tokens",
        "dual_clipped_tokens",
    ):
        assert int(metrics[f"cliptrack/{name}"]) == int(without[f"cliptrack/{name}"]), name
    engine_abs = float((engine.double().abs() * mask).sum()) * scale
    gauge = float(((b["current"] - b["old"]).double() + engine.double()).mul(mask).sum()) * scale
    # log(exp(e)) in float32: each token within a few float32 roundings of its e
    bound = 8 * 2.0**-23 * (tokens * scale) * (1 + float(b["current"].abs().max()) if tokens else 1)
    assert float(metrics["cliptrack/engine_abs_log_ratio"]) == pytest.approx(engine_abs, abs=bound)
    assert float(metrics["cliptrack/log_ratio"]) == pytest.approx(gauge, abs=bound)


def test_twin_metric_keys_survive_verls_mean_reduction() -> None:
    g = torch.Generator().manual_seed(3)
    b = {
        "old": torch.randn(2, 5, generator=g),
        "current": torch.randn(2, 5, generator=g),
        "advantages": torch.randn(2, 5, generator=g),
        "mask": torch.ones(2, 5, dtype=torch.bool),
        "weights": None,
        "agg": "token-mean",
    }
    for mode in adapter.TWINS:
        _, metrics, _ = _call(mode, b, _config(0.2, 0.2, 3.0, {}))
        ours = [k for k in metrics if k.startswith("cliptrack/")]
        assert ours and not [k for k in ours if "max" in k or "min" in k]
        assert all(
            not isinstance(v, torch.Tensor) or (v.dim() == 0 and not v.requires_grad)
            for v in metrics.values()
        )


def test_dynamic_batch_size_is_refused() -> None:
    b = {
        "old": torch.zeros(1, 3),
        "current": torch.zeros(1, 3),
        "advantages": torch.ones(1, 3),
        "mask": torch.ones(1, 3, dtype=torch.bool),
        "weights": None,
        "agg": "token-mean",
    }
    config = _config(0.2, 0.2, 3.0, {}, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=64)
    with pytest.raises(ValueError, match="use_dynamic_bsz"):
        _call("cliptrack_vanilla", b, config)


def test_bad_engine_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(adapter.ENGINE_ENV, "yes")
    b = {
        "old": torch.zeros(1, 3),
        "current": torch.zeros(1, 3),
        "advantages": torch.ones(1, 3),
        "mask": torch.ones(1, 3, dtype=torch.bool),
        "weights": torch.ones(1, 3),
        "agg": "token-mean",
    }
    with pytest.raises(ValueError, match=adapter.ENGINE_ENV):
        _call("cliptrack_vanilla", b, _config(0.2, 0.2, 3.0, {}))


def test_external_modules_variable_registers_the_twins() -> None:
    code = (
        "from verl.trainer.ppo import core_algos; "
        "print(sorted(k for k in core_algos.POLICY_LOSS_REGISTRY if k.startswith('cliptrack_')))"
    )
    env = {
        **os.environ,
        "VERL_USE_EXTERNAL_MODULES": "cliptrack.adapters.verl",
        "VERL_USE_EXTERNAL_PLUGINS": "none",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(sorted(adapter.TWINS))


def test_verl_as_a_stack_gives_the_steps_exact_sums() -> None:
    """Three micro-batches of unequal token counts through the Stack protocol: verl's mean over
    calls of the scaled entries is the step's exact sum, the fraction formed once from it."""
    from cliptrack.adapters.shared import run_step

    g = torch.Generator().manual_seed(11)
    calls, batches_ = [], []
    for rows, length, keep in ((2, 8, 1.0), (2, 8, 0.45), (1, 5, 0.5)):
        b = {
            "old": -2.0 + torch.randn(rows, length, generator=g),
            "advantages": torch.randn(rows, length, generator=g),
            "mask": torch.rand(rows, length, generator=g) < keep,
            "low": 0.2,
            "high": 0.2,
            "c": 3.0,
        }
        b["current"] = b["old"] + 0.5 * torch.randn(rows, length, generator=g)
        batches_.append(b)
        inputs = {"old_logprobs": b["old"], "advantages": b["advantages"], "mask": b["mask"]}
        calls.append((b["current"].clone().requires_grad_(True), inputs))
    config = _config(0.2, 0.2, 3.0, {"dp_size": 1, "batch_num_tokens": 1, "global_batch_size": 3 * MICRO})
    result = run_step(adapter.VerlStack(config), "ppo", calls)
    expected = [_reference(b, "vanilla") for b in batches_]
    assert len({e["loss_tokens"] for e in expected}) == 3
    totals = {name: sum(e[name] for e in expected) for name in expected[0]}
    assert result.sums is not None
    for name, total in totals.items():
        assert result.sums[f"{name}:sum"] == total, name
    assert result.output.metrics[keys.CLIP_FRACTION] == totals["clipped_tokens"] / totals["loss_tokens"]
    assert all(loss.requires_grad for loss in result.losses)
