"""The paired probe: its statistics against plain references, its verdict by simulation with known
truth, its reading of outputs (bad input named), and the ``cliptrack probe`` command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from cliptrack.adapters.losses import builtin, formulas
from cliptrack.adapters.miles import forward_backward_loss, output_to_json
from cliptrack.cli.main import main
from cliptrack.compare.probe import compare_outputs
from cliptrack.compare.stats import probe as ps
from cliptrack.compare.stats.estimate import DIFFERENT, EQUIVALENT, INSUFFICIENT
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sst

from research.probe_simulation import AT_MARGIN, DETECT, simulate

counts = st.lists(st.integers(0, 400), min_size=2, max_size=60)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_paired_ratio_matches_plain_cluster_formula(data: st.DataObject) -> None:
    n = data.draw(st.integers(ps.MIN_DATUMS, 40))
    den = np.asarray(data.draw(st.lists(st.integers(1, 300), min_size=n, max_size=n)), float)
    num_a = np.asarray(data.draw(st.lists(st.floats(-50, 50), min_size=n, max_size=n)))
    num_b = np.asarray(data.draw(st.lists(st.floats(-50, 50), min_size=n, max_size=n)))
    got = ps.paired_ratio(num_a, num_b, den, 0.9)
    # plain reference: the ratio of sums, its linearisation per datum, the sample variance of the mean
    r = num_b.sum() / den.sum() - num_a.sum() / den.sum()
    z = ((num_b - num_a) - r * den) / den.mean()
    se = math.sqrt(np.sum(z**2) / (n - 1) / n)
    half = sst.t.ppf(0.95, n - 1) * se
    assert got.difference == pytest.approx(r, abs=1e-12)
    assert got.low == pytest.approx(r - half, abs=1e-9)
    assert got.high == pytest.approx(r + half, abs=1e-9)
    swapped = ps.paired_ratio(num_b, num_a, den, 0.9)  # a with b mirrors b with a
    assert swapped.low == pytest.approx(-got.high, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 60), st.integers(0, 60))
def test_mcnemar_is_the_exact_binomial_test(a_only: int, b_only: int) -> None:
    expected = 1.0 if a_only + b_only == 0 else sst.binomtest(b_only, a_only + b_only, 0.5).pvalue
    assert ps.mcnemar_exact(a_only, b_only) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert ps.mcnemar_exact(a_only, b_only) == ps.mcnemar_exact(b_only, a_only)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50), st.integers(0, 500))
def test_clip_test_interval_holds_the_difference(a_only: int, b_only: int, both: int, extra: int) -> None:
    tokens = a_only + b_only + both + extra
    if tokens == 0:
        return
    test = ps.clip_test(a_only, b_only, both, tokens)
    assert test.low <= test.difference <= test.high
    m = a_only + b_only
    if m:  # Clopper-Pearson from scipy's beta quantiles
        lo = 0.0 if b_only == 0 else sst.beta.ppf(0.05, b_only, m - b_only + 1)
        assert test.low == pytest.approx((2 * lo - 1) * m / tokens, abs=1e-9)


def test_bad_statistics_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="one entry per datum"):
        ps.paired_ratio([1.0, 2.0], [1.0], [1, 1])
    with pytest.raises(ValueError, match="a_only"):
        ps.mcnemar_exact(-1, 2)
    with pytest.raises(ValueError, match="fewer than the clipped"):
        ps.clip_test(3, 3, 3, 5)


def test_verdict_by_simulation_with_known_truth() -> None:
    """Fixed seed: at a true difference equal to the margin, 'equivalent' and 'different' each
    <= 5 % (+ Monte-Carlo allowance 2.5 pp at 200 replicates); at no difference 'equivalent' in
    >= 90 %; at 1.25 x, 'different' in >= 80 %."""
    rows = simulate(replicates=200, seed=1)
    for row in rows:
        if row.ratio == AT_MARGIN:
            assert row.equivalent <= 0.075 and row.different <= 0.075, row
        elif row.ratio == 1.0:
            assert row.equivalent >= 0.90, row
        elif row.ratio == DETECT:
            assert row.different >= 0.80, row


# ---- outputs -----------------------------------------------------------------------------------


def _batch(n: int = 40, length: int = 12, seed: int = 0) -> tuple[list[dict], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    datums, lps = [], []
    for _ in range(n):
        slp = -2 * torch.rand(length, generator=g)
        datums.append(
            {
                "logprobs": slp,
                "advantages": torch.randn(1, generator=g).expand(length),
                "mask": (torch.rand(length, generator=g) > 0.2).float(),
            }
        )
        lps.append(slp + 0.3 * torch.randn(length, generator=g))
    return datums, lps


def _output(datums: list[dict], lps: list[torch.Tensor], loss: str = "ppo", probe: bool = True) -> dict:
    return output_to_json(forward_backward_loss(datums, lps, loss, probe=probe).output)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(["ppo", "cispo"]), st.floats(0.05, 0.95), st.floats(1.05, 3.0))
def test_clip_sides_sum_to_the_loss_counts(seed: int, loss: str, low: float, high: float) -> None:
    g = torch.Generator().manual_seed(seed)
    lp, slp, adv = (torch.randn(50, generator=g) for _ in range(3))
    adv[::7] = 0.0
    mask = (torch.rand(50, generator=g) > 0.3).float()
    out = builtin.LOSSES[loss](lp, slp, adv, mask, clip_low_threshold=low, clip_high_threshold=high)
    sides = formulas.clip_sides(loss, lp, slp, adv, mask, low, high)
    assert int((sides != 0).sum()) == int(out.measured["clipped_tokens:sum"])
    assert int((sides < 0).sum()) == int(out.measured["clipped_low_tokens:sum"])


def test_same_numbers_are_equivalent_and_symmetric() -> None:
    datums, lps = _batch()
    a = _output(datums, lps)
    assert compare_outputs(a, _output(datums, [lp.clone() for lp in lps])).verdict == EQUIVALENT
    rounded = [lp.to(torch.bfloat16).float() for lp in lps]
    ab = compare_outputs(a, _output(datums, rounded))
    ba = compare_outputs(_output(datums, rounded), a)
    assert ab.verdict == ba.verdict == DIFFERENT
    assert ab.quantities["logprob_gap"].verdict == DIFFERENT
    for name, q in ab.quantities.items():
        assert ba.quantities[name].verdict == q.verdict
        if name != "logprob_gap":
            assert ba.quantities[name].difference == pytest.approx(-q.difference, abs=1e-12)


def test_clip_decisions_that_differ_are_caught_by_the_exact_test() -> None:
    datums, lps = _batch(n=60, seed=3)
    loose = [{**d, "clip_high_threshold": torch.tensor([1.01])} for d in datums]
    result = compare_outputs(_output(datums, lps), _output(loose, lps))
    clip = result.quantities["clip_fraction"]
    assert clip.clip_test is not None and clip.clip_test.b_only > 0 and clip.clip_test.a_only == 0
    assert clip.clip_test.p_value < 0.01
    assert clip.verdict == DIFFERENT


def test_bad_outputs_are_named() -> None:
    datums, lps = _batch()
    a = _output(datums, lps)
    with pytest.raises(ValueError, match="40 datums but b has 39"):
        compare_outputs(a, _output(datums[:-1], lps[:-1]))
    with pytest.raises(ValueError, match="no per-datum outputs"):
        compare_outputs(a, {"metrics": a["metrics"], "loss_fn_outputs": []})
    shorter = [{k: v[:-1] for k, v in d.items()} for d in datums]
    with pytest.raises(ValueError, match="datum 0: .*shape"):
        compare_outputs(a, _output(shorter, [lp[:-1] for lp in lps]))
    masked = [{**d, "mask": torch.zeros_like(d["mask"])} if i == 2 else d for i, d in enumerate(datums)]
    with pytest.raises(ValueError, match="datum 2: .*eligible tokens"):
        compare_outputs(a, _output(masked, lps))
    with pytest.raises(ValueError, match="not of the same loss"):
        compare_outputs(a, _output([{"weights": d["mask"]} for d in datums], lps, "cross_entropy"))
    with pytest.raises(ValueError, match="unknown quantities"):
        compare_outputs(a, a, margins={"reward": ps_margin()})


def ps_margin():
    from cliptrack.compare.quantities import relative

    return relative(0.1, 1.0)


def test_few_datums_are_insufficient() -> None:
    datums, lps = _batch(n=5)
    assert compare_outputs(_output(datums, lps), _output(datums, lps)).verdict == INSUFFICIENT


def test_without_clip_sides_there_is_no_exact_test() -> None:
    datums, lps = _batch()
    result = compare_outputs(_output(datums, lps, probe=False), _output(datums, lps, probe=False))
    assert result.quantities["clip_fraction"].clip_test is None
    assert "loss" not in result.quantities and result.notes


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    datums, lps = _batch()
    paths = {}
    for name, logprobs in (("a", lps), ("b", [lp.clone() for lp in lps]), ("c", [lp + 0.01 for lp in lps])):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(_output(datums, logprobs)))
    assert main(["probe", str(paths["a"]), str(paths["b"])]) == 0
    assert "equivalent" in capsys.readouterr().out
    assert main(["probe", str(paths["a"]), str(paths["c"]), "--labels", "megatron,miles"]) == 1
    assert "megatron" in capsys.readouterr().out
    assert main(["probe", str(paths["a"]), str(paths["b"]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == EQUIVALENT
    # margins as cliptrack compare writes them; a malformed one is a usage error naming it
    assert main(["probe", str(paths["a"]), str(paths["b"]), "--margin", "kl_k3=20%,1e-6"]) == 0
    capsys.readouterr()
    assert main(["probe", str(paths["a"]), str(paths["b"]), "--margin", "kl_k3=20%,x"]) == 2
    assert "kl_k3" in capsys.readouterr().err
    assert main(["probe", str(paths["a"]), str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    few = tmp_path / "few.json"
    few.write_text(json.dumps(_output(datums[:4], lps[:4])))
    assert main(["probe", str(few), str(few)]) == 2


# ---- what the probe is given: every value in its range, named when not (probe_input) ------------


def _field_set(output: dict, datum: int, name: str, data: list) -> dict:
    """``output`` (a JSON dict) with one datum's field replaced by ``data`` (its TensorData form)."""
    out = json.loads(json.dumps(output))
    field = out["loss_fn_outputs"][datum][name]
    field["data"], field["shape"] = data, [len(data)]
    return out


@pytest.mark.parametrize(
    ("name", "data", "expected"),
    [
        ("loss_tokens", [10.5], "loss_tokens must be a whole number of tokens, got the fraction 10.5"),
        ("loss_tokens", [1e300], "loss_tokens=1e\\+300 reached 2\\*\\*53"),
        ("loss_tokens", [13], "loss_tokens = 13 exceeds the datum's tokens \\(its logprobs\\) \\(12\\)"),
        ("loss_tokens", [-1], "loss_tokens must be >= 0 tokens"),
        ("loss_tokens", [3, 4], "loss_tokens holds 2 values: one token count is expected"),
        ("clipped_tokens", [99], "clipped_tokens = 99 exceeds its loss_tokens"),
        ("clipped_tokens", [0.5], "clipped_tokens must be a whole number"),
        ("kl_k3", [-0.25, 0.0], "kl_k3 = -0.25 is below 0"),
        ("abs_log_ratio", [-1e-3], "abs_log_ratio = -0.001 is below 0"),
        ("log_ratio_max", [50.0, 0.0], "log_ratio_max = 50.0 exceeds abs_log_ratio"),
        ("log_ratio", [-80.0, 0.0], "log_ratio = -80.0 exceeds abs_log_ratio"),
        ("clip_sides", [1, 0, -1], "clip_sides holds 3 entries but the datum has 12 tokens"),
        ("clip_sides", [1] * 12, "clip_sides mark 12 clipped tokens but its clipped_tokens is"),
        ("loss", [1.0, 2.0, 3.0], "loss holds 3 values"),
    ],
)
def test_a_value_out_of_its_range_is_refused_naming_file_datum_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: list, expected: str
) -> None:
    """Counts whole, >= 0 and within the datum's tokens, the gauge's sums in their ranges, one clip
    side per token: the library names the output, the datum and the field; ``cliptrack probe``
    names the file and exits 2 (not numpy's broadcast error, not a verdict)."""
    datums, lps = _batch(length=12)
    good = _output(datums, lps)
    bad = _field_set(good, 7, name, data)
    with pytest.raises(ValueError, match=f"^b\\.loss_fn_outputs\\[7\\]\\.{expected}"):
        compare_outputs(good, bad)
    paths = {"a.json": good, "b.json": bad}
    for file, output in paths.items():
        (tmp_path / file).write_text(json.dumps(output))
    assert main(["probe", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'b.json'}.loss_fn_outputs[7].{name}" in err, err


def test_a_datum_without_eligible_tokens_keeps_its_placeholder_extremes() -> None:
    """Over no eligible token the wire carries 0 extremes (ignored), and the sums are 0: accepted."""
    datums, lps = _batch(length=12)
    masked = [{**d, "mask": torch.zeros_like(d["mask"])} if i == 4 else d for i, d in enumerate(datums)]
    out = _output(masked, lps)
    assert out["loss_fn_outputs"][4]["loss_tokens"]["data"] == [0]
    assert compare_outputs(out, out).verdict == EQUIVALENT


def test_labels_and_file_names_reach_the_terminal_escaped_and_without_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A label or a file name holding terminal escapes (clear screen, set the title) or a URI's
    password: the summary writes the escapes visibly and masks the password, from the library's
    ``summary()`` as from ``cliptrack probe``."""
    datums, lps = _batch()
    output = json.dumps(_output(datums, lps))
    hostile = "\x1b[2Jstack\x1b]0;TITLE\x07"
    a, b = tmp_path / f"{hostile}.json", tmp_path / "b.json"
    a.write_text(output)
    b.write_text(output)
    assert main(["probe", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[2Jstack\\x1b]0;TITLE\\x07" in out
    secret = "http://user:Pw-s3cr3t-98712@h:5000?token=Tk-9f8e7d6c5b4a"
    assert main(["probe", str(a), str(b), "--labels", f"{hostile},{secret}"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "Pw-s3cr3t" not in out and "Tk-9f8e" not in out
    assert "http://user:***@h:5000?token=***" in out
    result = compare_outputs(json.loads(output), json.loads(output), labels=(hostile, secret))
    text = result.summary() + json.dumps(result.to_dict())
    assert "\x1b" not in result.summary() and "Pw-s3cr3t" not in text and "Tk-9f8e" not in text


def test_the_probe_s_memory_is_within_its_documented_bound(tmp_path: Path) -> None:
    """Two files read one at a time, each datum's JSON freed once read: the peak of Python's
    allocations (numpy's included, tracemalloc) stays within ``probe_input``'s bound, 3.5 times the
    larger file plus 9 bytes per token of both outputs and 1 KB per datum (3.8 times the file
    here, all told; reading both JSON trees at once, as the probe did, is over 6 times)."""
    import tracemalloc

    datums, lps = _batch(n=400, length=300)
    paths = []
    for name, logprobs in (("a", lps), ("b", [lp + 1e-5 for lp in lps])):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(_output(datums, logprobs)))
    size = max(p.stat().st_size for p in paths)
    tokens = 2 * 400 * 300
    tracemalloc.start()
    try:
        assert main(["probe", *map(str, paths)]) in (0, 1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 3.5 * size + 9 * tokens + 1024 * 2 * 400, (peak, size)
