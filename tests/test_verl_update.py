"""cliptrack's verl modes inside verl 0.9.1's real update (``TrainingWorker.train_mini_batch``, the
body of ``update_actor``) on CPU, one process and two gloo ranks, over micro-batches of unequal
token counts: the logged clip fraction is the exact ratio of sums of a per-token reference, verl's
own ``actor/pg_clipfrac`` beside it is the mean of micro-batch means, and the loss and parameters
after the step are those of verl's own mode. Skipped where verl is not importable (the ``verl``
extra: ``pip install 'cliptrack[verl]'``)."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'cliptrack[verl]', verl==0.9.1)")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(out: Path, model: Path, world: int, mode: str, *extra: str) -> list[dict[str, Any]]:
    port = _port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("CLIPTRACK_VERL_ENGINE", None)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests._verl_update_worker",
                str(out),
                str(model),
                str(rank),
                str(world),
                str(port),
                mode,
                *extra,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-4000:]}"
    return [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(world)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests import _verl_harness as harness

    return harness.save_tiny_model(tmp_path_factory.mktemp("verl-model") / "tiny")


def _run(
    tmp_path_factory: pytest.TempPathFactory, model: Path, world: int, mode: str
) -> list[dict[str, Any]]:
    return _launch(tmp_path_factory.mktemp(f"verl-{mode}-{world}"), model, world, mode)


@pytest.fixture(scope="module")
def vanilla_one(tmp_path_factory: pytest.TempPathFactory, model: Path) -> list[dict[str, Any]]:
    return _run(tmp_path_factory, model, 1, "vanilla")


@pytest.fixture(scope="module")
def vanilla_two(tmp_path_factory: pytest.TempPathFactory, model: Path) -> list[dict[str, Any]]:
    return _run(tmp_path_factory, model, 2, "vanilla")


@pytest.fixture(scope="module")
def vanilla_weights(tmp_path_factory: pytest.TempPathFactory, model: Path) -> list[dict[str, Any]]:
    return _launch(tmp_path_factory.mktemp("verl-weights"), model, 1, "vanilla", "weights")


@pytest.fixture(scope="module")
def cispo_one(tmp_path_factory: pytest.TempPathFactory, model: Path) -> list[dict[str, Any]]:
    return _run(tmp_path_factory, model, 1, "cispo")


# ---- the per-token reference (SPEC "When a token counts as clipped"; verl's band 1 -/+ 0.2) ----------

LOW, HIGH = 1 - 0.2, 1 + 0.2


def _clipped(call: dict[str, Any], mode: str) -> tuple[int, int, int]:
    """(clipped tokens, eligible tokens, dual-clipped tokens) of one recorded loss call, token by
    token; the dual clip (vanilla, ``clip_ratio_c`` 3) as verl writes it, in the inputs' float32."""
    adv, ratio = call["advantages"], torch.exp(call["current"] - call["old"])
    dual = (torch.maximum(-adv * ratio, -adv * ratio.clamp(LOW, HIGH)) > -adv * 3.0) & (adv < 0)
    clipped = tokens = duals = 0
    rows = zip(
        call["mask"].flatten().tolist(),
        adv.flatten().tolist(),
        ratio.flatten().tolist(),
        dual.flatten().tolist(),
        strict=True,
    )
    for m, a, r, d in rows:
        if not m:
            continue
        tokens += 1
        duals += d and mode == "vanilla"
        if mode == "cispo":
            clipped += r < LOW or r > HIGH
        else:
            clipped += (a > 0 and r > HIGH) or (a < 0 and r < LOW)
    return clipped, tokens, duals


def _mean_of_means(per_rank: list[list[float]]) -> float:
    """verl's reduction of a per-micro-batch value: the mean over ranks, then over micro-batches."""
    return sum(sum(values) / len(values) for values in per_rank) / len(per_rank)


def _check(ranks: list[dict[str, Any]], mode: str, differs: bool = True) -> None:
    metrics = ranks[0]["ours_metrics"]
    per_rank = [[_clipped(call, mode) for call in rank["calls"]] for rank in ranks]
    clipped = sum(c for calls in per_rank for c, _, _ in calls)
    tokens = sum(t for calls in per_rank for _, t, _ in calls)
    duals = sum(d for calls in per_rank for _, _, d in calls)
    mean_of_means = _mean_of_means([[c / t for c, t, _ in calls] for calls in per_rank])
    token_counts = [t for calls in per_rank for _, t, _ in calls]
    assert len(set(token_counts)) > 1, f"micro-batches of equal token counts {token_counts}"
    # one mini-batch: the logged sums are the step's exact totals, their ratio the exact fraction
    assert metrics["cliptrack/loss_tokens"] == tokens
    assert metrics["cliptrack/clipped_tokens"] == clipped
    assert metrics["cliptrack/clipped_tokens"] / metrics["cliptrack/loss_tokens"] == clipped / tokens
    # verl's own clip fraction, kept, is the mean of means (float32 means), not the exact ratio
    assert metrics["actor/pg_clipfrac"] == pytest.approx(mean_of_means, rel=1e-6)
    assert ranks[0]["theirs_metrics"]["actor/pg_clipfrac"] == metrics["actor/pg_clipfrac"]
    if differs:
        assert not math.isclose(mean_of_means, clipped / tokens, rel_tol=1e-3), "the data shows no difference"
    if mode == "vanilla":
        assert metrics["cliptrack/dual_clipped_tokens"] == duals
        dual_means = _mean_of_means([[d / t for _, t, d in calls] for calls in per_rank])
        assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(dual_means, rel=1e-6, abs=1e-12)
    # the same update as verl's own mode: loss, gradient norm, every parameter after the step
    for key in ("actor/pg_loss", "grad_norm", "actor/ppo_kl"):
        assert metrics[key] == ranks[0]["theirs_metrics"][key], key
    for rank in ranks:
        ours, theirs = rank["ours_parameters"], rank["theirs_parameters"]
        assert ours.keys() == theirs.keys()
        changed = [name for name in ours if not torch.equal(ours[name], theirs[name])]
        assert not changed, f"rank {rank['rank']}: parameters differ after the step: {changed}"


def test_vanilla_fraction_exact_in_one_process(vanilla_one: list[dict[str, Any]]) -> None:
    _check(vanilla_one, "vanilla")


def test_vanilla_fraction_exact_on_two_gloo_ranks(vanilla_two: list[dict[str, Any]]) -> None:
    _check(vanilla_two, "vanilla")


def test_cispo_fraction_exact_in_one_process(cispo_one: list[dict[str, Any]]) -> None:
    _check(cispo_one, "cispo", differs=False)  # its micro-batches clip 9 of 15 and 3 of 5: 0.6 either way


def test_drift_logged_and_engine_unavailable_without_rollout_log_probs(
    vanilla_one: list[dict[str, Any]],
) -> None:
    metrics = vanilla_one[0]["ours_metrics"]
    calls = vanilla_one[0]["calls"]
    drift = sum(float(((c["current"] - c["old"]).double().abs() * c["mask"]).sum()) for c in calls)
    assert metrics["cliptrack/drift_abs_log_ratio"] == pytest.approx(drift, rel=1e-9)
    assert metrics["cliptrack/engine_gauge"] == 0.0
    absent = [
        k for k in metrics if k.startswith(("cliptrack/engine_", "cliptrack/log_ratio", "cliptrack/kl_k3"))
    ]
    assert absent == ["cliptrack/engine_gauge"], absent
    assert metrics["cliptrack/loss/cliptrack_vanilla"] == 1.0
    assert metrics["cliptrack/aggregation/token-mean"] == 1.0
    assert (
        metrics["cliptrack/clip_low"],
        metrics["cliptrack/clip_high"],
        metrics["cliptrack/dual_clip"],
    ) == (
        0.8,
        1.2,
        3.0,
    )


def test_plain_rollout_weights_give_the_engine_part(vanilla_weights: list[dict[str, Any]]) -> None:
    """With rollout weights in the batch (verl's ppo_loss hands them to the loss) declared plain,
    the update is still verl's own, and the gauge against the sampler is measured: its engine part
    is log(w) per token."""
    _check(vanilla_weights, "vanilla")
    metrics = vanilla_weights[0]["ours_metrics"]
    calls = vanilla_weights[0]["calls"]
    assert all(call["weights"] is not None for call in calls)
    assert metrics["cliptrack/engine_gauge"] == 1.0
    engine = sum(float((c["weights"].double().log().abs() * c["mask"]).sum()) for c in calls)
    tokens = sum(int(c["mask"].sum()) for c in calls)
    assert metrics["cliptrack/engine_abs_log_ratio"] == pytest.approx(engine, abs=tokens * 1e-6)
    assert metrics["cliptrack/kl_k3"] > 0 and metrics["cliptrack/is_weight"] > 0
