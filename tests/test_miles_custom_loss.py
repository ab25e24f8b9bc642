"""cliptrack's Miles loss against Miles' own code (the released ``miles-rl`` source, on CPU).

Miles' ``loss_function`` runs our loss via ``--loss-type custom_loss`` exactly as its training loop
would (it loads it with its own ``load_function``), over several micro-batches of unequal size,
with all-masked samples, in per-sample-mean and per-token mode, on one process and on 2 x 2
gloo ranks (DP x CP, Miles' zigzag CP slicing). Checked: the loss of every micro-batch and the
gradient are bit-identical to Miles' ``policy_loss``; our entries read back, from the dict
``aggregate_train_losses`` returns and from the ``train/*`` dict ``log_train_step`` logs, as the
exact counts of a plain reference; Miles' own entries are unchanged.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")  # Miles' log-prob path uses megatron-core's fused cross entropy

from cliptrack.adapters.miles import MilesCountWarning, read_train_log, sum_train_logs
from cliptrack.core import keys

from tests import _miles_loss_case as case
from tests._harness import free_port, run_ranks
from tests._miles_source import VERSION, MilesUnavailable, import_miles

HERE = Path(__file__).resolve().parent
COUNT_FIELDS = ("loss_tokens", "clipped_tokens", "clipped_low_tokens", "clipped_high_tokens")


@pytest.fixture(scope="module")
def miles():
    try:
        return import_miles()
    except MilesUnavailable as exc:
        pytest.skip(f"Miles' source (the miles-rl {VERSION} wheel) is not obtainable here: {exc}")


@pytest.fixture(scope="module")
def one_rank(miles):
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    case.set_parallel_state(miles, dp=1, cp=1)
    yield miles
    if created:
        dist.destroy_process_group()


def _expected(dp: int) -> dict[str, int]:
    ref = case.reference_counts(dp)
    assert ref["clipped_low_tokens"] > 0 and ref["clipped_high_tokens"] > 0
    assert ref["miles_count"] > ref["loss_tokens"], "the step must hold all-masked samples"
    return {k: ref[k] for k in COUNT_FIELDS}


def _counts(counts: object) -> dict[str, int]:
    """The count fields of a read-back (a MeasuredSums or its ``vars`` from a rank)."""
    fields = counts if isinstance(counts, dict) else case._fields(counts)
    return {k: fields[k] for k in COUNT_FIELDS}


def _assert_gauge(counts: object, dp: int) -> None:
    """The gauge read back from Miles' log: the reference sums (Miles' float32 log-probs against the
    float64 log-ratios: to float32 rounding), the outside count exactly, and no extreme (Miles sums
    its log values, which no max survives)."""
    gauge = (counts if isinstance(counts, dict) else case._fields(counts))["gauge"]
    ref = case.reference_gauge(dp)
    assert ref["ratio_outside_tokens:sum"] > 0
    assert set(gauge) == set(ref)
    assert gauge["ratio_outside_tokens:sum"] == ref["ratio_outside_tokens:sum"]
    for key, value in ref.items():
        assert gauge[key] == pytest.approx(value, rel=1e-5, abs=1e-4), key


@pytest.mark.parametrize("per_token", [False, True], ids=["per_sample_mean", "per_token"])
def test_loss_gradient_and_counts_on_one_rank(one_rank, per_token):
    miles = one_rank
    ours = case.run_step(miles, custom=True, per_token=per_token, dp=1, dp_rank=0)
    stock = case.run_step(miles, custom=False, per_token=per_token, dp=1, dp_rank=0)
    for a, b in zip(ours["losses"], stock["losses"], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(ours["grad"], stock["grad"]) and ours["grad"].abs().sum() > 0
    for log_ours, log_stock in zip(ours["logs"], stock["logs"], strict=True):  # Miles' entries untouched
        n = len(log_stock["keys"])
        assert log_ours["keys"][:n] == log_stock["keys"]
        assert torch.equal(log_ours["values"][: n + 1].float(), log_stock["values"].float())
    expected = _expected(1)
    for log in (ours["aggregated"], ours["logged"], sum_train_logs(ours["logs"])):
        # the dict aggregate_train_losses returns, the train/* dict Miles' tracker gets, the
        # summed dict before Miles' division: the counts exactly, the gauge's sums
        counts = read_train_log(log)
        assert _counts(counts) == expected
        _assert_gauge(counts, 1)
    if not per_token:  # Miles' default mode: the aggregated entries are the token counts themselves
        assert {k: ours["aggregated"][k] for k in COUNT_FIELDS} == expected


def test_stock_log_warns_that_all_masked_samples_inflate_loss_tokens(one_rank):
    miles = one_rank
    stock = case.run_step(miles, custom=False, per_token=True, dp=1, dp_rank=0)
    expected = _expected(1)
    summed = sum_train_logs(stock["logs"])
    masks = [s["mask"] for s in case.samples(1)]
    masked = sum(1 for m in masks if m.sum() == 0)
    assert masked == 1
    with pytest.warns(MilesCountWarning, match="all zero adds one token") as record:
        counts = read_train_log(summed, calculate_per_token_loss=True)
    assert len(record) == 1
    assert counts.loss_tokens == expected["loss_tokens"] + masked  # Miles' max(., 1)
    assert counts[keys.CLIPPED_TOKENS] == expected["clipped_tokens"]
    with pytest.warns(MilesCountWarning, match=f"{masked} of {len(masks)} samples") as record:
        counts = read_train_log(summed, calculate_per_token_loss=True, loss_masks=masks)
    assert len(record) == 1
    assert counts.loss_tokens == expected["loss_tokens"]
    with pytest.raises(ValueError, match="already divided by Miles' count"):
        read_train_log(stock["aggregated"])
    ours = sum_train_logs(case.run_step(miles, custom=True, per_token=True, dp=1, dp_rank=0)["logs"])
    with warnings.catch_warnings():  # a log with our entries is exact: no warning
        warnings.simplefilter("error")
        assert read_train_log(ours).loss_tokens == expected["loss_tokens"]


def test_scaled_entries_that_do_not_divide_are_refused():
    log = {
        "loss_tokens": 7.5,
        "clipped_tokens": 1.0,
        "clipped_low_tokens": 1.0,
        "clipped_high_tokens": 0.0,
        "count_scale": 1.0,
    }
    with pytest.raises(ValueError, match="'loss_tokens' / 'count_scale' = 7.5 is not a whole number"):
        read_train_log(log)
    with pytest.raises(ValueError, match="'count_scale' = 0.0 must be > 0"):
        read_train_log({**log, "count_scale": 0.0})
    with pytest.raises(ValueError, match="low \\+ high|clipped"):
        read_train_log({**log, "loss_tokens": 7.0, "clipped_tokens": 2.0})
    gauge = {"log_ratio": 0.5, "abs_log_ratio": 1.5, "kl_k3": 0.25, "is_weight": 7.5, "is_weight_sq": 8.0}
    with pytest.raises(ValueError, match=r"but not \['ratio_outside_tokens'\]: they come together"):
        read_train_log({**log, "loss_tokens": 7.0, **gauge})
    with pytest.raises(ValueError, match="'ratio_outside_tokens' / 'count_scale' = 0.5 is not a whole"):
        read_train_log({**log, "loss_tokens": 7.0, **gauge, "ratio_outside_tokens": 0.5})
    with pytest.raises(ValueError, match="ratio_outside_tokens:sum=9 exceeds loss_tokens=7"):
        read_train_log({**log, "loss_tokens": 7.0, **gauge, "ratio_outside_tokens": 9.0})
    with pytest.raises(ValueError, match="abs_log_ratio:sum.*must be >= 0"):
        read_train_log(
            {**log, "loss_tokens": 7.0, **gauge, "abs_log_ratio": -1.0, "ratio_outside_tokens": 1.0}
        )


@pytest.mark.slow  # four gloo processes importing torch
def test_counts_through_dp2_by_cp2_gloo_ranks(miles, tmp_path):
    dp, cp = 2, 2
    world = dp * cp
    results = run_ranks(HERE / "_miles_loss_case.py", [str(dp), str(cp)], world, tmp_path, timeout_s=300)
    expected = _expected(dp)
    for res in results:
        for mode in ("per_sample", "per_token"):
            got = res[mode]
            assert got["same_losses"] and got["same_grad"], (res["rank"], mode)
            assert _counts(got["counts"]) == expected, (res["rank"], mode)
            assert _counts(got["counts_logged"]) == expected, (res["rank"], mode)
            _assert_gauge(got["counts"], dp)
            _assert_gauge(got["counts_logged"], dp)
            for key, value in got["stock_aggregated"].items():  # Miles' own metrics, as without our entries
                assert got["aggregated"][key] == pytest.approx(value, rel=1e-6, abs=1e-7), (
                    res["rank"],
                    mode,
                    key,
                )
        assert {k: res["per_sample"]["aggregated"][k] for k in COUNT_FIELDS} == expected


def test_the_miles_seam_refuses_an_unverified_release_and_restores_what_it_swaps(miles, monkeypatch):
    from cliptrack.adapters._compat import UnsupportedVersionError
    from cliptrack.adapters._compat import miles as seam

    monkeypatch.setattr(seam, "installed_version", lambda: "0.2.0")
    with pytest.raises(UnsupportedVersionError, match="miles-rl 0.2.0 is not supported.*compute_policy_loss"):
        seam.policy_loss()
    monkeypatch.setattr(seam, "installed_version", lambda: "0.0.2")
    _, namespace = seam.policy_loss()
    original = namespace["compute_policy_loss"]
    with pytest.raises(RuntimeError, match="boom"):
        with seam.recording_clip_decisions(namespace):
            assert namespace["compute_policy_loss"] is not original
            raise RuntimeError("boom")
    assert namespace["compute_policy_loss"] is original
