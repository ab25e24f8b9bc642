"""The stacks' own output shape, without cliptrack's low/high split, works everywhere.

``loss:sum``, ``loss_tokens:sum``, ``clipped_tokens:sum``, ``clip_fraction:mean`` (docs/CONTRACT.md,
"Metric keys": the split is optional on input). In each of its three forms (cliptrack's
dataclass, tinker's own type, the JSON dict) it is read, merged (by cliptrack and by tinker's own
chunk merger), validated, logged, aggregated per client, reduced on the Megatron path and
compared: the fraction is exact (the ratio of the summed counts, rounded once), the split series
are simply absent, nothing raises.
"""

from __future__ import annotations

import dataclasses
import json
import random
from fractions import Fraction

import pytest
import torch
from cliptrack import Limits
from cliptrack.adapters import megatron as mg
from cliptrack.adapters.losses.builtin import INPUT_CHECKS
from cliptrack.adapters.losses.output import (
    ForwardBackwardOutput,
    clip_counts,
    merge_outputs,
    validate_metrics,
)
from cliptrack.adapters.miles import ClientAggregator, aggregate_datums, output_from_json, output_to_json
from cliptrack.adapters.miles.wire import count_data
from cliptrack.backends import load_runs
from cliptrack.compare import compare
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
from hypothesis import given
from hypothesis import strategies as st
from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results
from tinker.types import ForwardBackwardOutput as TinkerOutput

SPLIT = {keys.CLIPPED_LOW_TOKENS, keys.CLIPPED_HIGH_TOKENS}
FORMS = ["ours", "tinker", "json"]


def seed_metrics(loss_tokens: int, clipped: int, loss: float = -1.25) -> dict[str, float]:
    """The four keys a stack emits today; its fraction as the stack computes it."""
    metrics = {keys.LOSS_SUM: loss, keys.LOSS_TOKENS: float(loss_tokens), keys.CLIPPED_TOKENS: float(clipped)}
    if loss_tokens:
        metrics[keys.CLIP_FRACTION] = clipped / loss_tokens
    return metrics


def seed_datum(loss_tokens: int, clipped: int) -> dict:
    """A per-datum output of a runtime that reports ``loss_tokens`` and ``clipped_tokens`` only."""
    return {keys.DATUM_LOSS_TOKENS: count_data(loss_tokens), keys.DATUM_CLIPPED_TOKENS: count_data(clipped)}


def in_form(form: str, metrics: dict, datums: list | None = None) -> object:
    datums = datums or []
    if form == "ours":
        return ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=datums, metrics=metrics
        )
    if form == "tinker":
        return TinkerOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=datums, metrics=metrics)
    ours = ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=datums, metrics=metrics)
    return json.loads(json.dumps(output_to_json(ours)))


def exact(clipped: int, tokens: int) -> float:
    return float(Fraction(clipped, tokens))


# ---- read, validate, merge -----------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_read_and_validated_without_the_split(form):
    output = in_form(form, seed_metrics(1000, 37))
    counts = clip_counts(output)
    assert counts is not None
    assert (counts.loss_tokens, counts.get(keys.CLIPPED_TOKENS)) == (1000, 37)
    assert counts.get(keys.CLIPPED_LOW_TOKENS) is None and counts.get(keys.CLIPPED_HIGH_TOKENS) is None
    assert counts.fraction == exact(37, 1000)
    checked = validate_metrics(seed_metrics(1000, 37))
    assert checked[keys.CLIP_FRACTION] == exact(37, 1000)
    assert not SPLIT & set(checked)
    # the split, when present, must still add up
    with pytest.raises(
        ValueError, match=r"clipped_low_tokens=1 \+ clipped_high_tokens=1 != clipped_tokens=37"
    ):
        validate_metrics(
            {**seed_metrics(1000, 37), keys.CLIPPED_LOW_TOKENS: 1.0, keys.CLIPPED_HIGH_TOKENS: 1.0}
        )


chunk_counts = st.lists(
    st.tuples(st.integers(1, 5), st.integers(0, 10**6), st.integers(0, 10**6)).map(
        lambda t: (t[0], t[1] + t[2], t[1])  # (datums, loss_tokens, clipped <= loss_tokens)
    ),
    min_size=1,
    max_size=8,
)


@given(chunks=chunk_counts, form=st.sampled_from(FORMS))
def test_merged_by_us_and_by_tinkers_chunk_merger(chunks, form):
    outputs = [in_form(form, seed_metrics(n, c), [{}] * d) for d, n, c in chunks]
    tokens, clipped = sum(n for _, n, _ in chunks), sum(c for _, _, c in chunks)
    ours = merge_outputs(outputs).metrics
    assert ours[keys.LOSS_TOKENS] == tokens and ours[keys.CLIPPED_TOKENS] == clipped
    if tokens:
        assert ours[keys.CLIP_FRACTION] == exact(clipped, tokens)
    else:
        assert keys.CLIP_FRACTION not in ours
    assert not SPLIT & set(ours)
    if form != "json":  # tinker's merger takes its own typed outputs (and ours, the same type)
        by_tinker = combine_fwd_bwd_output_results(outputs)
        assert not SPLIT & set(by_tinker.metrics)
        counts = clip_counts(by_tinker)
        assert counts is not None and (counts.loss_tokens, counts.get(keys.CLIPPED_TOKENS)) == (
            tokens,
            clipped,
        )
        assert counts.fraction == (exact(clipped, tokens) if tokens else None)
        # and its JSON dict reads the same
        as_json = json.loads(json.dumps({**dataclasses.asdict(by_tinker), "loss_fn_outputs": []}))
        assert clip_counts(as_json) == counts


def test_missing_metrics_field_is_empty_in_every_reader():
    """The normaliser's one rule: a JSON dict without ``metrics`` has no metrics."""
    payload = {"loss_fn_output_type": "ArrayRecord", "loss_fn_outputs": [seed_datum(4, 1)]}
    assert clip_counts(payload) is None
    assert merge_outputs([payload]).metrics == {}
    assert output_to_json(payload)["metrics"] == {}
    assert output_from_json(payload).metrics == {}
    assert aggregate_datums(payload) == {
        keys.LOSS_TOKENS: 4.0,
        keys.CLIPPED_TOKENS: 1.0,
        keys.CLIP_FRACTION: 0.25,
    }
    with pytest.raises(ValueError, match="without 'metrics' or 'loss_fn_outputs'"):
        clip_counts({"loss": 1.0})


# ---- logged, aggregated per client, reduced on the Megatron path, compared ---------------------------


@pytest.mark.parametrize("form", FORMS)
def test_client_aggregator_sums_seed_datums(form):
    rng = random.Random(7)
    agg = ClientAggregator()
    agg.register("run")
    tokens = clipped = 0
    for _ in range(5):  # five chunks of one step, each with its own datums
        pairs = [(n, rng.randint(0, n)) for n in (rng.randint(0, 50) for _ in range(rng.randint(1, 4)))]
        chunk_tokens, chunk_clipped = sum(n for n, _ in pairs), sum(c for _, c in pairs)
        tokens, clipped = tokens + chunk_tokens, clipped + chunk_clipped
        agg.add(
            "run",
            3,
            in_form(form, seed_metrics(chunk_tokens, chunk_clipped), [seed_datum(*p) for p in pairs]),
        )
    metrics = agg.emit("run", 3).metrics
    assert metrics[keys.LOSS_TOKENS] == tokens and metrics[keys.CLIPPED_TOKENS] == clipped
    assert metrics[keys.CLIP_FRACTION] == exact(clipped, tokens)
    assert not SPLIT & set(metrics)


def test_client_keeps_the_split_only_when_every_datum_carries_it():
    with_split = {
        **seed_datum(10, 3),
        keys.DATUM_CLIPPED_LOW_TOKENS: count_data(1),
        keys.DATUM_CLIPPED_HIGH_TOKENS: count_data(2),
    }
    assert aggregate_datums([with_split, with_split])[keys.CLIPPED_LOW_TOKENS] == 2.0
    mixed = aggregate_datums([with_split, seed_datum(10, 4)])
    assert mixed[keys.CLIPPED_TOKENS] == 7.0 and mixed[keys.CLIP_FRACTION] == exact(7, 20)
    assert not SPLIT & set(mixed)


def _seed_report(loss: float, tokens: int, clipped: int) -> dict:
    """A hand-written Megatron loss's report in the stacks' shape: no low/high split."""
    return {
        keys.LOSS_SUM: torch.tensor(loss),
        keys.LOSS_TOKENS: torch.tensor(tokens),
        keys.CLIPPED_TOKENS: torch.tensor(clipped),
        mg.REPORT_INVALID: torch.zeros(len(INPUT_CHECKS), dtype=torch.int64),
    }


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1, max_size=10))
def test_megatron_reduction_of_seed_reports(micro):
    reports = [_seed_report(0.5, a + b, a) for a, b in micro]
    metrics = mg.reduce_losses(reports, group=None).metrics
    tokens, clipped = sum(a + b for a, b in micro), sum(a for a, _ in micro)
    assert metrics[keys.LOSS_TOKENS] == tokens and metrics[keys.CLIPPED_TOKENS] == clipped
    assert metrics.get(keys.CLIP_FRACTION) == (exact(clipped, tokens) if tokens else None)
    assert not SPLIT & set(metrics)


def test_megatron_reports_with_and_without_the_split_keep_no_split():
    full = {
        **_seed_report(0.5, 10, 3),
        keys.CLIPPED_LOW_TOKENS: torch.tensor(1),
        keys.CLIPPED_HIGH_TOKENS: torch.tensor(2),
    }
    metrics = mg.reduce_losses([full, _seed_report(0.5, 10, 4)], group=None).metrics
    assert metrics[keys.CLIPPED_TOKENS] == 7 and metrics[keys.CLIP_FRACTION] == exact(7, 20)
    assert not SPLIT & set(metrics)


@pytest.mark.parametrize("form", FORMS)
def test_logged_by_the_tracker_and_compared(tmp_path, form):
    rng = random.Random(3)
    totals = {}
    for backend, p in (("megatron", 0.10), ("miles", 0.12)):
        tokens = clipped = 0
        with Tracker(
            f"seed-{backend}-{form}",
            sinks=("jsonl",),
            backend_label=backend,
            spool_dir=tmp_path,
            limits=Limits(flush_interval_s=0.05),
            handle_signals=False,
        ) as tracker:
            for step in range(40):
                n = rng.randint(200, 400)
                c = sum(rng.random() < p for _ in range(n))
                tokens, clipped = tokens + n, clipped + c
                tracker.log_output(step, in_form(form, seed_metrics(n, c)), extra={keys.REWARD: rng.random()})
        totals[tracker.run_id] = (tokens, clipped)
        points = [
            json.loads(line)
            for line in (tmp_path / tracker.run_id / keys.POINTS_FILE).read_text().splitlines()
        ]
        assert len(points) == 40
        assert all(not SPLIT & set(point["metrics"]) for point in points)
        assert points[0]["metrics"][keys.CLIP_FRACTION] == exact(
            int(points[0]["metrics"][keys.CLIPPED_TOKENS]), int(points[0]["metrics"][keys.LOSS_TOKENS])
        )
    runset = load_runs(list(totals), jsonl_dir=tmp_path)
    assert not SPLIT & set(runset.metrics())
    result = compare(runset)
    for run_id, (tokens, clipped) in totals.items():
        label = next(info.display for info in runset.runs if info.run.run_id == run_id)
        estimate = result.run_estimate("clip_fraction", label)
        assert (estimate.total_numerator, estimate.total_denominator) == (clipped, tokens)
        assert estimate.estimate.value == exact(clipped, tokens)
    compared = [q.name for q in result.quantities]
    for split in ("clip_low_fraction", "clip_high_fraction"):  # split series only when present
        assert split not in compared and not any(note.metric == split for note in result.notes), split
