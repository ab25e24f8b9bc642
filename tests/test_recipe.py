"""Every run carries the recipe its counts were measured under, and a comparison names any
difference: a quantity whose definition differs between the runs gets no verdict."""

from __future__ import annotations

import dataclasses
import math

import pytest
from cliptrack.backends import load_runs
from cliptrack.compare import compare
from cliptrack.core import keys
from cliptrack.core.recipe import Recipe, quantities_defined_differently, recipe_from_config
from cliptrack.store.records import Point
from hypothesis import given
from hypothesis import strategies as st

from tests._compare_fixtures import SyntheticRun, log_with_tracker, synthetic_run

bounds = st.none() | st.floats(0.0, 10.0, allow_nan=False)


@st.composite
def recipes(draw) -> Recipe:
    return Recipe(
        loss=draw(st.sampled_from(["ppo", "cispo", "verl:vanilla", "trl:dapo"])),
        clip_low=draw(bounds),
        clip_high=draw(bounds),
        dual_clip=draw(bounds),
        clip_reference=draw(st.sampled_from([None, "sampler", "old"])),
        ratio_outside_low=draw(bounds),
        ratio_outside_high=draw(bounds),
        aggregation=draw(st.sampled_from([None, "sum", "token-mean", "seq-mean-token-sum"])),
    )


def _flattened(config: dict, prefix: str = "") -> dict[str, str]:
    """A config as MLflow keeps it: nested keys joined with ``.``, every value a string."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flattened(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


@given(recipe=recipes())
def test_a_recipe_reads_back_from_its_config_nested_or_flattened(recipe):
    config = {"seed": 3, **recipe.as_config()}
    assert recipe_from_config(config) == recipe
    assert recipe_from_config(_flattened(config)) == recipe


def test_bad_recipes_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="clip_high must be a finite number"):
        Recipe(loss="ppo", clip_high=math.inf)
    with pytest.raises(ValueError, match="clip_reference must be one of"):
        Recipe(loss="ppo", clip_reference="trainer")
    with pytest.raises(ValueError, match="loss must be a non-empty name"):
        Recipe(loss="")


def test_verl_and_trl_configs_as_they_log_them():
    verl = {
        "actor_rollout_ref": {
            "actor": {
                "clip_ratio": 0.2,
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.28,
                "clip_ratio_c": 3.0,
                "loss_agg_mode": "token-mean",
                "policy_loss": {"loss_mode": "vanilla"},
            }
        }
    }
    got = recipe_from_config(_flattened(verl))
    assert got is not None
    assert (got.loss, got.clip_reference, got.dual_clip, got.aggregation) == (
        "verl:vanilla",
        "old",
        3.0,
        "token-mean",
    )
    assert got.clip_low == pytest.approx(0.8) and got.clip_high == pytest.approx(1.28)
    trl = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "learning_rate": 1e-6}
    got = recipe_from_config(trl)
    assert got is not None and (got.loss, got.clip_reference) == ("trl:dapo", "old")
    assert got.clip_low == pytest.approx(0.8) and got.clip_high == pytest.approx(1.28)
    cispo = recipe_from_config({"loss_type": "cispo", "epsilon": 0.2, "epsilon_high": 5.0})
    assert cispo is not None and (cispo.clip_low, cispo.clip_high) == (
        None,
        5.0,
    )  # TRL clamps at epsilon_high
    assert recipe_from_config({"seed": 1, "lr": 0.1}) is None


def test_which_quantities_a_difference_touches():
    a = Recipe(loss="ppo", clip_low=0.8, clip_high=1.2, clip_reference="sampler")
    assert quantities_defined_differently({"a": a, "b": a}) == {}
    wider = dataclasses.replace(a, clip_high=1.28)
    assert set(quantities_defined_differently({"a": a, "b": wider})) == {
        "clip_fraction",
        "clip_high_fraction",
    }
    outside = dataclasses.replace(a, ratio_outside_high=4.0)
    assert set(quantities_defined_differently({"a": a, "b": outside})) == {"ratio_outside_fraction"}
    assert (
        quantities_defined_differently({"a": a, "b": dataclasses.replace(a, aggregation="token-mean")}) == {}
    )
    assert quantities_defined_differently({"a": a, "b": None}) == {}


BASE = Recipe(loss="ppo", clip_low=0.8, clip_high=1.2, clip_reference="sampler")


def _gauge(tokens: float) -> dict[str, float]:
    """A whole gauge for ``tokens`` loss tokens whose log ratios are +-0.05 in equal numbers, 1 % of
    them counted outside the ratio-outside bounds."""
    half = tokens / 2
    return {
        keys.LOG_RATIO_SUM: 0.0,
        keys.ABS_LOG_RATIO_SUM: 0.05 * tokens,
        keys.KL_K3_SUM: half * (math.expm1(0.05) - 0.05) + half * (math.expm1(-0.05) + 0.05),
        keys.IS_WEIGHT_SUM: half * (math.exp(0.05) + math.exp(-0.05)),
        keys.IS_WEIGHT_SQ_SUM: half * (math.exp(0.1) + math.exp(-0.1)),
        keys.RATIO_OUTSIDE_TOKENS: float(round(tokens * 0.01)),
    }


def _with_recipe(run: SyntheticRun, recipe: Recipe) -> SyntheticRun:
    points = [
        Point(p.step, p.wall_time, {**p.metrics, **_gauge(p.metrics[keys.LOSS_TOKENS])}) for p in run.points
    ]
    return dataclasses.replace(run, points=points, config={**run.config, **recipe.as_config()})


def _runs(high: float, outside_high: float) -> list[SyntheticRun]:
    other = dataclasses.replace(BASE, clip_high=high, ratio_outside_high=outside_high)
    return [
        _with_recipe(synthetic_run("recipeA0001", "a", "megatron", seed=1, n_steps=120), BASE),
        _with_recipe(synthetic_run("recipeB0002", "b", "miles", seed=2, n_steps=120, clip_p=0.2), other),
    ]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two runs of different clip bands (and ratio-outside bounds), and two of one recipe, logged by
    the tracker to MLflow (sqlite), W&B (offline) and the JSONL spool."""
    root = tmp_path_factory.mktemp("recipes")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    logged = {}
    for name, runs in (("differ", _runs(1.28, 4.0)), ("alike", _runs(1.2, 2.0))):
        ids = [
            log_with_tracker(r, tracking_uri=uri, spool_dir=root / name, wandb_dir=root / f"wb-{name}")
            for r in runs
        ]
        logged[name] = {
            "jsonl": lambda ids=ids, name=name: load_runs(ids, jsonl_dir=root / name),
            "wandb": lambda ids=ids, name=name: load_runs(ids, wandb_dir=root / f"wb-{name}"),
            "mlflow": lambda ids=ids: load_runs(ids, tracking_uri=uri),
        }
    return logged


@pytest.mark.parametrize("source", ["jsonl", "wandb", "mlflow"])
def test_runs_of_different_clip_bands_get_a_note_and_no_clip_verdict(stores, source):
    runset = stores["differ"][source]()
    assert [recipe_from_config(r.run.config) for r in runset.runs][0] == BASE
    result = compare(runset)
    text = " | ".join(n.text for n in result.notes)
    assert "these runs clip at [0.8, 1.2] (a), [0.8, 1.28] (b): clip fractions are not measured alike" in text
    assert "count ratios outside [1/2, 2] (a), [1/2, 4] (b)" in text
    for withheld in ("clip_fraction", "clip_high_fraction", "ratio_outside_fraction"):
        with pytest.raises(KeyError):
            result.difference(withheld)
        assert any(
            n.metric == withheld and "no verdict, as it is defined differently" in n.text
            for n in result.notes
        )
    assert result.difference("clip_low_fraction").verdict  # the low side is defined alike: judged
    assert result.difference("reward").verdict
    assert "clip_fraction" not in result.on_policy
    assert {e.run for e in result.estimates if e.metric == "clip_fraction"} == {"a", "b"}  # still estimated
    assert result.headline_lines()[0].endswith(
        "Clip fraction (token-weighted): no verdict, as it is defined differently in these runs (recipe "
        "clip_high); each run's own estimate is shown."
    )
    assert "tokens with ratio outside each run's bounds: no verdict" in result.summary()
    assert '"clip_fraction"' in result.to_json()  # the runs' own estimates


@pytest.mark.parametrize("source", ["jsonl", "wandb", "mlflow"])
def test_runs_of_one_recipe_are_judged_and_labelled_from_it(stores, source):
    result = compare(stores["alike"][source]())
    assert not any("these runs" in n.text for n in result.notes)
    assert result.difference("clip_fraction").verdict == "different"  # 10 % against 20 %
    outside = next(q for q in result.quantities if q.name == "ratio_outside_fraction")
    assert outside.label == "tokens with ratio outside [1/2, 2]"


def test_stacks_over_seeds_with_different_bands_get_no_clip_verdict(tmp_path):
    from tests._compare_fixtures import write_jsonl

    wide = dataclasses.replace(BASE, clip_high=1.28)
    runs = [
        _with_recipe(synthetic_run(f"stackA000{i}", f"a{i}", "megatron", seed=i, n_steps=120), BASE)
        for i in (1, 2)
    ] + [
        _with_recipe(synthetic_run(f"stackB000{i}", f"b{i}", "miles", seed=i, n_steps=120), wide)
        for i in (3, 4)
    ]
    for run in runs:
        write_jsonl(tmp_path, run)
    result = compare(load_runs([r.run_id for r in runs], jsonl_dir=tmp_path), group_by="stack")
    assert {d.metric for d in result.group_differences} >= {"kl_k3", "reward", "clip_low_fraction"}
    assert not {"clip_fraction", "clip_high_fraction"} & {d.metric for d in result.group_differences}
    assert "[0.8, 1.2] (a1), [0.8, 1.2] (a2), [0.8, 1.28] (b3), [0.8, 1.28] (b4)" in " ".join(
        n.text for n in result.notes
    )
