"""A summed count added by one declaration entry and its term reaches every path exactly.

The toy measure ``negative_advantage_tokens:sum`` (eligible tokens with ``A < 0``) is registered
the way docs/ARCHITECTURE.md, "Adding a measure", describes: one ``Measure`` (in a group of its
own) through ``cliptrack.core.measures.register_measure`` and its per-token term through
``cliptrack.adapters.losses.formulas.register_term``. Its exact integer value is checked against a
plain per-token reference after the eager loss, the fused loss, the output merge, the Megatron
reduction, the Miles runtime and client aggregator, a real Tracker with the MLflow sink (sqlite)
and the comparison's loader.
"""

from __future__ import annotations

import pytest
import torch
from cliptrack.adapters import megatron as mg
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import formulas, fused
from cliptrack.adapters.losses.output import ForwardBackwardOutput, loss_metrics, merge_outputs
from cliptrack.adapters.miles import ClientAggregator, forward_backward_loss
from cliptrack.core import keys, measures
from cliptrack.core.sums import MeasuredSums

TOY = measures.Measure(
    "negative_advantage_tokens",
    measures.SUM,
    True,
    "advantage_sign",
    "1 for an eligible token with A < 0; tokens",
    True,
)
GROUP = measures.Group(
    "advantage_sign", "losses with advantages (ppo, cispo, importance_sampling, dro)", dropped_when_mixed=True
)


def negative_advantages(tokens: formulas.Tokens) -> torch.Tensor | None:
    """The toy's term: eligible tokens with a negative advantage (none without advantages)."""
    return None if tokens.advantages is None else formulas.count_eligible(tokens, tokens.advantages < 0)


@pytest.fixture
def toy():
    measures.register_measure(TOY, group=GROUP)
    formulas.register_term(TOY.key, negative_advantages)
    try:
        yield TOY.key
    finally:
        formulas.unregister_term(TOY.key)
        measures.unregister_measure(TOY.key)


def _batches(n: int = 3, size: int = 40, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        lp = -torch.rand(size + i, generator=gen) * 2
        out.append(
            {
                "logprobs": lp,
                "sampling_logprobs": lp + 0.3 * torch.randn(size + i, generator=gen),
                "advantages": torch.randn(size + i, generator=gen),
                "mask": (torch.rand(size + i, generator=gen) > 0.25).float(),
            }
        )
    return out


def _reference(batch: dict[str, torch.Tensor]) -> int:
    """The toy's value, token by token in plain Python."""
    adv, mask = batch["advantages"].tolist(), batch["mask"].tolist()
    return sum(1 for a, m in zip(adv, mask, strict=True) if m != 0 and a < 0)


def _inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in batch.items() if k != "logprobs"}


def test_the_declaration_grows_by_one_entry_and_shrinks_back(toy):
    declaration = measures.declared()
    assert toy in declaration.by_key and toy in declaration.packed_fields
    assert toy in keys.MEASURED_KEYS and TOY.field in keys.DATUM_MEASURE_FIELDS
    assert "advantage_sign_calls" in measures.CALL_COUNTERS
    with pytest.raises(ValueError, match="already declared"):
        measures.register_measure(TOY, group=GROUP)
    with pytest.raises(ValueError, match="a group of its own"):
        measures.register_measure(measures.Measure("x", measures.SUM, True, measures.GAUGE, "x", True))
    with pytest.raises(ValueError, match="built-in measure"):
        measures.unregister_measure(keys.CLIPPED_TOKENS)
    sums = MeasuredSums({keys.LOSS_TOKENS: 3, toy: 2})
    with pytest.raises(ValueError, match=f"{toy}=4 exceeds loss_tokens=3"):
        MeasuredSums({keys.LOSS_TOKENS: 3, toy: 4})
    assert (sums + MeasuredSums({keys.LOSS_TOKENS: 1})).to_metrics() == {
        keys.LOSS_TOKENS: 4.0
    }  # dropped when mixed


def test_after_it_is_gone_the_builtin_layout_is_back():
    assert measures.declared().packed_fields == measures.BUILTIN.packed_fields
    assert TOY.key not in keys.MEASURED_KEYS and not formulas.TERMS


@pytest.mark.parametrize("name", ["ppo", "cispo", "importance_sampling", "dro"])
def test_eager_losses_megatron_merge_and_miles_carry_it_exactly(toy, name, monkeypatch):
    monkeypatch.setenv(fused.ENV_VAR, "0")
    config = {"beta": 0.1} if name == "dro" else {}
    batches = _batches()
    expected = [_reference(b) for b in batches]
    outs = [losses.LOSSES[name](b["logprobs"], **_inputs(b), **config) for b in batches]
    assert [int(o.measured[toy]) for o in outs] == expected
    assert outs[0].measured[toy].dtype == torch.int64
    assert loss_metrics(*outs)[toy] == sum(expected)

    # Megatron: one report per micro-batch, reduced on one process
    reports = [mg.make_loss_func(name, _inputs(b), config)(b["logprobs"])[2] for b in batches]
    reduced = mg.reduce_losses(reports, group=None)
    assert reduced is not None and reduced.metrics[toy] == sum(expected)
    # the tinker-style merge of per-micro-batch outputs
    parts = [mg.reduce_losses([r], group=None) for r in reports]
    assert merge_outputs(parts).metrics[toy] == sum(expected)

    # Miles: per-datum fields on the wire, summed by the client aggregator over chunks
    datums = [{"loss_fn_inputs": {"logprobs": b["sampling_logprobs"], **_inputs(b)}} for b in batches]
    aggregator = ClientAggregator()
    aggregator.register("run")
    for i, (datum, batch) in enumerate(zip(datums, batches, strict=True)):
        result = forward_backward_loss([datum], [batch["logprobs"]], name, config)
        assert int(result.output.loss_fn_outputs[0][TOY.field].data[0]) == expected[i]
        aggregator.add("run", 0, result.output)
    assert aggregator.emit("run", 0).metrics[toy] == sum(expected)


def test_cross_entropy_has_no_advantages_and_so_no_toy(toy, monkeypatch):
    monkeypatch.setenv(fused.ENV_VAR, "0")
    batch = _batches(1)[0]
    out = losses.cross_entropy(batch["logprobs"], batch["advantages"], batch["mask"])
    assert toy not in out.measured and toy not in loss_metrics(out)


@pytest.mark.skipif(
    not fused.compile_available(torch.device("cpu")), reason="no C++ compiler for torch.compile"
)
def test_the_fused_loss_computes_the_registered_term(toy, monkeypatch):
    monkeypatch.setenv(fused.ENV_VAR, "1")
    batch = _batches(1, size=64, seed=4)[0]
    before = fused.compiled_calls["importance_sampling"]
    out = losses.importance_sampling(batch["logprobs"], **_inputs(batch))
    assert fused.compiled_calls["importance_sampling"] == before + 1, fused.failure()
    assert int(out.measured[toy]) == _reference(batch)


def test_a_tracker_with_mlflow_and_the_comparison_read_it_back(toy, tmp_path, monkeypatch):
    from cliptrack import Tracker, load_runs

    monkeypatch.setenv(fused.ENV_VAR, "0")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    expected = {}
    with Tracker(
        "toy-measure", backends=(uri,), spool_dir=tmp_path / "spool", experiment="toy", flush_interval_s=0.05
    ) as tracker:
        for step in range(3):
            batches = _batches(seed=step)
            reports = [mg.make_loss_func("ppo", _inputs(b))(b["logprobs"])[2] for b in batches]
            output = mg.reduce_losses(reports, group=None)
            assert isinstance(output, ForwardBackwardOutput)
            tracker.log_output(step, output)
            expected[step] = float(sum(_reference(b) for b in batches))
    runs = load_runs(["toy-measure"], tracking_uri=uri, experiment="toy")
    wide = runs.wide(runs.labels[0])
    assert {step: float(wide.loc[step, toy]) for step in expected} == expected
