"""The comparison's JSON: it validates against the one schema (``report_json.schema``) at the
version docs/JSON.md documents, every documented key is in it, and it round-trips from the result's
dataclasses (every field's value, under its JSON name)."""

from __future__ import annotations

import copy
import json
import math
import re
from dataclasses import asdict
from pathlib import Path

import jsonschema
import pytest
from cliptrack.compare import RunSet, compare, report_json
from cliptrack.compare.findings import Difference, GroupDifference, RunEstimate
from cliptrack.compare.stats import Estimate
from cliptrack.compare.stats.estimate import GroupEstimate
from cliptrack.store.frame import LoadedRun
from cliptrack.store.records import RunInfo

from tests._compare_fixtures import megatron_vs_miles, synthetic_run

DOC = Path(__file__).resolve().parent.parent / "docs" / "JSON.md"


def _runset(*runs) -> RunSet:
    return RunSet.from_points(
        (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend), "test"), r.points) for r in runs
    )


@pytest.fixture(scope="module")
def pair():
    """Two runs 10 % and 14 % clipped, three steps missing from one: differences, segments, notes."""
    return compare(_runset(*megatron_vs_miles(miles_clip_p=0.14, miles_missing=(3, 4, 50))))


@pytest.fixture(scope="module")
def groups():
    """Two stacks of three seeds each: group differences over seeds."""
    runs = [synthetic_run(f"m{i}", f"m{i}", "megatron", seed=10 + i, n_steps=80) for i in range(3)]
    runs += [synthetic_run(f"s{i}", f"s{i}", "miles", seed=20 + i, n_steps=80, clip_p=0.11) for i in range(3)]
    return compare(_runset(*runs), groups={"megatron": ["m0", "m1", "m2"], "miles": ["s0", "s1", "s2"]})


def _documented_version() -> int:
    found = re.search(r"^Schema version: \*\*(\d+)\*\*", DOC.read_text(encoding="utf-8"), re.M)
    assert found, f"{DOC} does not state its schema version"
    return int(found.group(1))


@pytest.mark.parametrize("which", ["pair", "groups"])
def test_the_json_validates_against_the_documented_schema_version(which, request):
    result = request.getfixturevalue(which)
    schema = report_json.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    data = json.loads(result.to_json())
    jsonschema.Draft202012Validator(schema).validate(data)
    assert data["schema_version"] == report_json.SCHEMA_VERSION == _documented_version() == 3
    assert len(data["differences" if which == "pair" else "group_differences"]) >= 5


def test_the_schema_refuses_a_missing_key_an_unknown_key_and_a_wrong_type(pair):
    """The validation above can fail: the schema is strict about the keys and their types."""
    validator = jsonschema.Draft202012Validator(report_json.schema())
    data = json.loads(pair.to_json())
    missing, unknown, wrong = copy.deepcopy(data), copy.deepcopy(data), copy.deepcopy(data)
    del missing["differences"][0]["difference"]["ci_low"]
    unknown["estimates"][0]["surprise"] = 1
    wrong["differences"][0]["segments"][0]["start_unit"] = "7"
    for bad in (missing, unknown, wrong):
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)


def test_docs_list_every_key_of_every_object():
    """docs/JSON.md has a section per object of the schema listing each of its keys in backticks."""
    text = DOC.read_text(encoding="utf-8")
    sections = dict(re.findall(r"^### `(\w+)`\n(.*?)(?=^### |\Z)", text, re.M | re.S))
    defs = report_json.schema()["$defs"]
    assert sorted(sections) == sorted(defs)
    for name, definition in defs.items():
        listed = set(re.findall(r"^\| `(\w+)` \|", sections[name], re.M))
        assert listed == set(definition["properties"]), name


def _plain(x):
    """``asdict``'s value as JSON holds it: NaN and infinities null, tuples lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


# The JSON's names of the fields that are not named as the dataclass names them (the stable contract:
# scripts read these keys; written out here, not read from the module under test).
ESTIMATE = {"low": "ci_low", "high": "ci_high", "n_units": "units", "memory": "memory_d"}
GROUP_ESTIMATE = {
    "low": "ci_low",
    "high": "ci_high",
    "seeds_a": "seeds_reference",
    "seeds_b": "seeds_group",
    "between_sd_a": "between_sd_reference",
    "between_sd_b": "between_sd_group",
}


def _check_estimate(entry: dict, e: Estimate | GroupEstimate) -> None:
    names = ESTIMATE if isinstance(e, Estimate) else GROUP_ESTIMATE
    for field, value in asdict(e).items():
        assert entry[names.get(field, field)] == _plain(value), field
    if isinstance(e, Estimate):
        assert entry["enough_data"] is e.enough_data


def _check_difference(entry: dict, d: Difference | GroupDifference) -> None:
    nested = {"estimate", "segments", "differing", "why", "step_weighted", "reference_paired", "run_paired"}
    for field, value in asdict(d).items():
        if field not in nested:
            assert entry[field] == _plain(value), field
    _check_estimate(entry["difference"], d.estimate)
    if isinstance(d, Difference):
        for name in ("reference_paired", "run_paired", "step_weighted"):
            own = getattr(d, name)
            if own is None:
                assert entry[name] is None
            else:
                _check_estimate(entry[name], own)
    assert len(entry["segments"]) == len(d.segments)
    for s, out in zip(d.segments, entry["segments"], strict=True):
        _check_estimate(out["difference"], s.estimate)
        assert (out["start"], out["end"], out["verdict"]) == (s.start, s.end, s.verdict)
        assert out["differs"] is (s in d.differing)


def _check_run_estimate(entry: dict, e: RunEstimate) -> None:
    outer = {"units": "units_valid", "total_numerator": "numerator", "total_denominator": "denominator"}
    for field, value in asdict(e).items():
        if field not in ("estimate", "step_weighted"):
            assert entry[outer.get(field, field)] == _plain(value), field
    _check_estimate(entry, e.estimate)  # the run's estimate stands in the entry's own keys
    if e.step_weighted is not None:
        _check_estimate(entry["step_weighted"], e.step_weighted)


def test_the_json_round_trips_from_the_dataclasses(pair, groups):
    """Every field of every difference, segment, estimate and note is in the JSON with its value."""
    for result in (pair, groups):
        data = json.loads(result.to_json())
        rows = result.group_differences if result.groups else result.differences
        entries = data["group_differences"] if result.groups else data["differences"]
        assert len(entries) == len(rows) > 0
        for d, entry in zip(rows, entries, strict=True):
            _check_difference(entry, d)
        assert len(data["estimates"]) == len(result.estimates)
        for e, entry in zip(result.estimates, data["estimates"], strict=True):
            _check_run_estimate(entry, e)
        assert data["notes"] == [
            {"metric": n.metric, "run": n.run, "text": n.text, "warning": n.warning} for n in result.notes
        ]
    assert any(s["differs"] for d in json.loads(pair.to_json())["differences"] for s in d["segments"])
