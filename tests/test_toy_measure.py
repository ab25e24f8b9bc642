"""A summed count added by extending the declaration reaches every path exactly, and the default
declaration stays as it was.

The toy measure ``negative_advantage_tokens:sum`` (eligible tokens with ``A < 0``) is added the
way docs/ARCHITECTURE.md, "Adding a measure", describes: one keyword-only ``Measure`` carrying its
per-token term, in a ``Group`` of its own, in a new declaration built by
``cliptrack.core.measures.DEFAULT.extended``, which is then passed to the losses and the
reductions (nothing is registered; no module state changes). Its exact integer value is checked
against a plain per-token reference after the eager loss, the fused loss, the output merge, the
Megatron reduction, the Miles runtime and client aggregator, a real Tracker with the MLflow sink
(sqlite) and the comparison's loader.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from cliptrack import Limits
from cliptrack.adapters import megatron as mg
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import formulas, fused
from cliptrack.adapters.losses.output import ForwardBackwardOutput, loss_metrics, merge_outputs
from cliptrack.adapters.miles import ClientAggregator, forward_backward_loss
from cliptrack.core import keys, measures
from cliptrack.core.sums import MeasuredSums


def negative_advantages(tokens: formulas.Tokens) -> torch.Tensor | None:
    """The toy's term: eligible tokens with a negative advantage (none without advantages)."""
    return None if tokens.advantages is None else formulas.count_eligible(tokens, tokens.advantages < 0)


TOY = measures.Measure(
    name="negative_advantage_tokens",
    reduction=measures.SUM,
    exact=True,
    group="advantage_sign",
    definition="1 for an eligible token with A < 0; tokens",
    nonnegative=True,
    term=negative_advantages,
)
GROUP = measures.Group(
    name="advantage_sign",
    emitted_by="losses with advantages (ppo, cispo, importance_sampling, dro)",
    dropped_when_mixed=True,
)
DECLARATION = measures.DEFAULT.extended(TOY, groups=(GROUP,))
TOY_KEY = TOY.key


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


def _snapshot(declaration: measures.Declaration) -> tuple[object, ...]:
    return (
        declaration.groups,
        declaration.measures,
        declaration.means,
        declaration.packed_fields,
        declaration.call_counters,
        tuple(declaration.by_key),
    )


def test_extending_builds_a_new_declaration_and_leaves_the_default_unchanged():
    before = _snapshot(measures.DEFAULT)
    packed_before, keys_before = measures.PACKED_FIELDS, keys.MEASURED_KEYS
    extended = measures.DEFAULT.extended(TOY, groups=(GROUP,))
    assert extended is not measures.DEFAULT and extended is not DECLARATION
    assert _snapshot(measures.DEFAULT) == before
    assert (measures.PACKED_FIELDS, keys.MEASURED_KEYS) == (packed_before, keys_before)
    assert TOY_KEY not in measures.DEFAULT.by_key and not measures.DEFAULT.terms
    assert TOY_KEY not in measures.PACKED_FIELDS and TOY_KEY not in keys.MEASURED_KEYS
    # the extension: the default's entries, then the toy's, in every layout
    assert extended.measures == (*measures.DEFAULT.measures, TOY)
    assert extended.groups == (*measures.DEFAULT.groups, GROUP)
    assert extended.terms == (TOY,)
    assert TOY_KEY in extended.packed_fields and TOY.field == "negative_advantage_tokens"
    assert extended.call_counters == (*measures.DEFAULT.call_counters, "advantage_sign_calls")
    assert len(extended.packed_fields) == len(measures.DEFAULT.packed_fields) + 2  # the sum and its counter
    with pytest.raises(dataclasses.FrozenInstanceError):
        measures.DEFAULT.measures = ()  # type: ignore[misc]


def test_an_extension_is_checked():
    with pytest.raises(ValueError, match="already declared"):
        DECLARATION.extended(TOY)
    with pytest.raises(ValueError, match="groups \\['advantage_sign'\\] are already declared"):
        DECLARATION.extended(groups=(GROUP,))
    gauge_member = dataclasses.replace(TOY, name="x", group=measures.GAUGE)
    with pytest.raises(ValueError, match="a group of its own"):
        measures.DEFAULT.extended(gauge_member)
    with pytest.raises(ValueError, match="'advantage_sign' is not one of"):
        measures.DEFAULT.extended(TOY)  # its group not given
    with pytest.raises(TypeError, match="Measure entries"):
        measures.DEFAULT.extended("negative_advantage_tokens:sum")  # type: ignore[arg-type]


def test_declaration_entries_are_keyword_only_and_frozen():
    with pytest.raises(TypeError):
        measures.Measure("x", measures.SUM, True, "g", "x", True)  # type: ignore[misc]
    with pytest.raises(TypeError):
        measures.Group("g", "who")  # type: ignore[misc]
    with pytest.raises(TypeError):
        measures.Mean("x:mean", keys.CLIPPED_TOKENS, keys.LOSS_TOKENS, True, "x")  # type: ignore[misc]
    with pytest.raises(TypeError):
        measures.Declaration(measures.DEFAULT.groups, measures.DEFAULT.measures, ())  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        TOY.name = "y"  # type: ignore[misc]
    with pytest.raises(ValueError, match="a term is a callable, and only for a sum"):
        dataclasses.replace(TOY, reduction=measures.MAX, exact=False)


def test_sums_are_read_by_the_declaration_given():
    sums = MeasuredSums({keys.LOSS_TOKENS: 3, TOY_KEY: 2}, declaration=DECLARATION)
    with pytest.raises(ValueError, match=f"{TOY_KEY}=4 exceeds loss_tokens=3"):
        MeasuredSums({keys.LOSS_TOKENS: 3, TOY_KEY: 4}, declaration=DECLARATION)
    with pytest.raises(ValueError, match="are not measured sums"):
        MeasuredSums({keys.LOSS_TOKENS: 3, TOY_KEY: 2})  # the default declaration has no toy
    without = MeasuredSums({keys.LOSS_TOKENS: 1}, declaration=DECLARATION)
    assert (sums + without).to_metrics() == {keys.LOSS_TOKENS: 4.0}  # dropped when mixed
    with pytest.raises(ValueError, match="different declarations"):
        sums + MeasuredSums({keys.LOSS_TOKENS: 1})


def test_a_loss_given_no_declaration_emits_no_toy(monkeypatch):
    monkeypatch.setenv(fused.ENV_VAR, "0")
    batch = _batches(1)[0]
    out = losses.ppo(batch["logprobs"], **_inputs(batch))
    assert out.declaration is measures.DEFAULT and TOY_KEY not in out.measured
    toy = losses.ppo(batch["logprobs"], **_inputs(batch), declaration=DECLARATION)
    assert toy.declaration is DECLARATION and int(toy.measured[TOY_KEY]) == _reference(batch)
    # the toy is extra: the loss and every other measure are the same, bit for bit
    assert torch.equal(toy.loss, out.loss)
    assert all(torch.equal(toy.measured[k], v) for k, v in out.measured.items())
    with pytest.raises(ValueError, match="different declarations"):
        out + toy


@pytest.mark.parametrize("name", ["ppo", "cispo", "importance_sampling", "dro"])
def test_eager_losses_megatron_merge_and_miles_carry_it_exactly(name, monkeypatch):
    monkeypatch.setenv(fused.ENV_VAR, "0")
    config = {"beta": 0.1} if name == "dro" else {}
    batches = _batches()
    expected = [_reference(b) for b in batches]
    outs = [
        losses.LOSSES[name](b["logprobs"], **_inputs(b), **config, declaration=DECLARATION) for b in batches
    ]
    assert [int(o.measured[TOY_KEY]) for o in outs] == expected
    assert outs[0].measured[TOY_KEY].dtype == torch.int64
    assert loss_metrics(*outs)[TOY_KEY] == sum(expected)

    # Megatron: one report per micro-batch, reduced on one process
    reports = [
        mg.make_loss_func(name, _inputs(b), config, declaration=DECLARATION)(b["logprobs"])[2]
        for b in batches
    ]
    reduced = mg.reduce_losses(reports, group=None, declaration=DECLARATION)
    assert reduced is not None and reduced.metrics[TOY_KEY] == sum(expected)
    # the tinker-style merge of per-micro-batch outputs
    parts = [mg.reduce_losses([r], group=None, declaration=DECLARATION) for r in reports]
    assert merge_outputs(parts, DECLARATION).metrics[TOY_KEY] == sum(expected)
    # the default declaration's reduction does not know the toy's report entry
    assert TOY_KEY not in mg.reduce_losses(reports, group=None).metrics  # type: ignore[union-attr]

    # Miles: per-datum fields on the wire, summed by the client aggregator over chunks
    datums = [{"loss_fn_inputs": {"logprobs": b["sampling_logprobs"], **_inputs(b)}} for b in batches]
    aggregator = ClientAggregator(declaration=DECLARATION)
    aggregator.register("run")
    for i, (datum, batch) in enumerate(zip(datums, batches, strict=True)):
        result = forward_backward_loss([datum], [batch["logprobs"]], name, config, declaration=DECLARATION)
        assert int(result.output.loss_fn_outputs[0][TOY.field].data[0]) == expected[i]
        aggregator.add("run", 0, result.output)
    assert aggregator.emit("run", 0).metrics[TOY_KEY] == sum(expected)


@pytest.mark.parametrize("stack", ["megatron", "miles", "tinker", "trl"])
def test_each_stack_given_the_declaration_carries_it_through_a_step(stack, monkeypatch):
    from cliptrack.adapters import tinker, trl
    from cliptrack.adapters.miles import runtime
    from cliptrack.adapters.shared.stack import run_step

    monkeypatch.setenv(fused.ENV_VAR, "0")
    stacks = {
        "megatron": mg.MegatronStack(declaration=DECLARATION),
        "miles": runtime.MilesStack(declaration=DECLARATION),
        "tinker": tinker.TinkerStack(declaration=DECLARATION),
        "trl": trl.TRLStack(declaration=DECLARATION),
    }
    batches = _batches(seed=7)
    result = run_step(stacks[stack], "cispo", [(b["logprobs"], _inputs(b)) for b in batches])
    expected = sum(_reference(b) for b in batches)
    assert result.output.metrics[TOY_KEY] == expected
    assert result.sums is not None and result.sums[TOY_KEY] == expected
    assert result.sums.declaration is DECLARATION


def test_cross_entropy_has_no_advantages_and_so_no_toy(monkeypatch):
    monkeypatch.setenv(fused.ENV_VAR, "0")
    batch = _batches(1)[0]
    out = losses.cross_entropy(batch["logprobs"], batch["advantages"], batch["mask"], declaration=DECLARATION)
    assert TOY_KEY not in out.measured and TOY_KEY not in loss_metrics(out)


@pytest.mark.skipif(
    not fused.compile_available(torch.device("cpu")), reason="no C++ compiler for torch.compile"
)
def test_the_fused_loss_computes_the_declared_term(monkeypatch):
    monkeypatch.setenv(fused.ENV_VAR, "1")
    batch = _batches(1, size=64, seed=4)[0]
    before = fused.compiled_calls["importance_sampling"]
    out = losses.importance_sampling(batch["logprobs"], **_inputs(batch), declaration=DECLARATION)
    assert fused.compiled_calls["importance_sampling"] == before + 1, fused.failure()
    assert int(out.measured[TOY_KEY]) == _reference(batch)
    plain = losses.importance_sampling(batch["logprobs"], **_inputs(batch))
    assert fused.compiled_calls["importance_sampling"] == before + 2, fused.failure()
    assert TOY_KEY not in plain.measured


def test_a_tracker_with_mlflow_and_the_comparison_read_it_back(tmp_path, monkeypatch):
    from cliptrack import Tracker, load_runs

    monkeypatch.setenv(fused.ENV_VAR, "0")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    expected = {}
    with Tracker(
        "toy-measure",
        sinks=(uri,),
        spool_dir=tmp_path / "spool",
        experiment="toy",
        limits=Limits(flush_interval_s=0.05),
    ) as tracker:
        for step in range(3):
            batches = _batches(seed=step)
            reports = [
                mg.make_loss_func("ppo", _inputs(b), declaration=DECLARATION)(b["logprobs"])[2]
                for b in batches
            ]
            output = mg.reduce_losses(reports, group=None, declaration=DECLARATION)
            assert isinstance(output, ForwardBackwardOutput)
            tracker.log_output(step, output)
            expected[step] = float(sum(_reference(b) for b in batches))
    runs = load_runs(["toy-measure"], tracking_uri=uri, experiment="toy")
    wide = runs.wide(runs.labels[0])
    assert {step: float(wide.loc[step, TOY_KEY]) for step in expected} == expected
