"""Runs the field's frameworks logged themselves read as logged: one case per framework.

Each case writes two runs (two seeds) with the framework's own key spelling and its own reduction
(from its source, cliptrack.core.frameworks / docs/FRAMEWORKS.md) through the writer it uses: the
real W&B offline writer called as its logger calls it (its step column, its prefix), the real
MLflow sqlite store, transformers' own callbacks for TRL. The values are formed here from
per-micro-batch token counts, so each read-back is checked against a reference computed from
those counts: an exact entry reads back as the ratio of sums, an approximate one as the
framework's mean of means and flagged, a different quantity under its own name and never
compared. The two runs are then compared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cliptrack.backends import load_runs
from cliptrack.compare import compare
from cliptrack.compare.reasons import FrameworkRun
from cliptrack.core import frameworks, keys
from cliptrack.store.aliases import canonical_metrics
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

STEPS = 6
PROJECT = "frameworks"
"""The W&B project and MLflow experiment the writers log into (as each framework's logger is told)."""
MICRO = 3
"""Micro-batches (micro-steps, samples, ranks) per step, each with its own token count."""


def batches(seed: int, step: int) -> list[tuple[int, int, float]]:
    """(tokens, clipped tokens, k3 sum in nats) of each micro-batch of a step: unequal sizes, so a
    mean of micro-batch means differs from the ratio of sums."""
    rng = np.random.default_rng(1000 * seed + step)
    out = []
    for _ in range(MICRO):
        tokens = int(rng.integers(20, 400))
        clipped = int(rng.binomial(tokens, 0.02 + 0.2 * rng.random()))
        out.append((tokens, clipped, float(tokens * 0.001 * (1 + 9 * rng.random()))))
    return out


def ratio_of_sums(mbs: list[tuple[int, int, float]], part: int = 1) -> float:
    return sum(mb[part] for mb in mbs) / sum(mb[0] for mb in mbs)


def mean_of_means(mbs: list[tuple[int, int, float]], part: int = 1) -> float:
    return float(np.mean([mb[part] / mb[0] for mb in mbs]))


@dataclass(frozen=True)
class Expect:
    """What one of our keys reads back as: ``value(mbs)`` per step, and whether flagged approximate."""

    key: str
    value: Callable[[list[tuple[int, int, float]]], float]
    approximate: bool


@dataclass(frozen=True)
class Case:
    framework: str
    title: str
    rows: Callable[[list[tuple[int, int, float]]], dict[str, float]]
    """The framework's logged values of one step, under its own names (without prefix or step column)."""
    write: Callable[[Path, str, str, list[dict[str, float]]], None]
    """Write one run (directory, name, MLflow URI, per-step rows)."""
    expect: tuple[Expect, ...]
    different: tuple[str, ...] = ()
    """Names kept as logged (a different quantity)."""
    stores: tuple[str, ...] = ("wandb",)
    per_step_exact: tuple[str, ...] = field(default=())


# ---- writers: each as the framework's logger calls its tracker ------------------------------------


def _wandb(directory: Path, name: str, log: Callable[[Any, int, dict[str, float]], None], rows, setup=None):
    import wandb

    run = wandb.init(project=PROJECT, name=name, dir=str(directory), mode="offline", reinit="create_new")
    if setup is not None:
        setup(run)
    for step, row in enumerate(rows):
        log(run, step, row)
    run.finish()


def _mlflow(uri: str | None, name: str, rows, transform=lambda row: row) -> None:
    """Log ``rows`` to the MLflow store ``uri`` (None: the case is read from W&B only)."""
    if uri is None:
        return
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        mlflow.set_experiment(PROJECT)
        with mlflow.start_run(run_name=name):
            for step, row in enumerate(rows):
                mlflow.log_metrics(transform(row), step=step)
    finally:
        mlflow.set_tracking_uri(previous)


def write_step_keyword(directory: Path, name: str, uri: str | None, rows) -> None:
    """verl, AReaL, prime-rl, SkyRL, ROLL: ``wandb.log(data, step=step)``; verl and SkyRL also
    ``mlflow.log_metrics(data, step=step)`` (SkyRL rewrites ``@`` to ``_at_``)."""
    _wandb(directory, name, lambda run, step, row: run.log(row, step=step), rows)
    _mlflow(uri, name, rows, lambda row: {k.replace("@", "_at_"): v for k, v in row.items()})


def write_openrlhf(directory: Path, name: str, uri: str, rows) -> None:
    """OpenRLHF's WandbLogger (openrlhf/utils/logging_utils.py:79-98): ``train/<k>`` against
    ``train/global_step``."""

    def setup(run):
        run.define_metric("train/global_step")
        run.define_metric("train/*", step_metric="train/global_step", step_sync=True)

    def log(run, step, row):
        run.log({f"train/{k}": v for k, v in {**row, "global_step": step}.items()})

    _wandb(directory, name, log, rows, setup)


def write_prefixed(prefix: str, step_column: str | None = None):
    """NeMo-RL (``train/<k>``, W&B ``step=``; MLflow the same keys) and Miles/slime (``train/<k>``
    against ``train/step``)."""

    def write(directory: Path, name: str, uri: str | None, rows) -> None:
        prefixed = [{f"{prefix}/{k}": v for k, v in row.items()} for row in rows]
        if step_column is None:
            _wandb(directory, name, lambda run, step, row: run.log(row, step=step), prefixed)
        else:
            _wandb(directory, name, lambda run, step, row: run.log({**row, step_column: step}), prefixed)
        _mlflow(uri, name, prefixed)

    return write


@dataclass
class _TrainingArgs:
    """What the two callbacks read of ``TrainingArguments`` (whose constructor needs accelerate)."""

    output_dir: str
    run_name: str
    save_steps: int = 500
    load_best_model_at_end: bool = False
    metric_for_best_model: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"output_dir": self.output_dir, "run_name": self.run_name}


def write_trl(directory: Path, name: str, uri: str, rows) -> None:
    """transformers' own WandbCallback and MLflowCallback, as TRL's Trainer.log calls them."""
    import os

    from transformers import TrainerControl, TrainerState
    from transformers.integrations import MLflowCallback, WandbCallback

    args = _TrainingArgs(str(directory / name), name)
    names = ("WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_MODE")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(WANDB_DIR=str(directory), WANDB_PROJECT=PROJECT, MLFLOW_TRACKING_URI=uri)
    os.environ["MLFLOW_EXPERIMENT_NAME"] = PROJECT
    os.environ["WANDB_MODE"] = "offline"
    import mlflow

    previous = mlflow.get_tracking_uri()
    try:
        import wandb

        # the run a user starts before training (W&B's settings are read once per process); the
        # callback logs into it as it would into its own
        wandb.init(project=PROJECT, name=name, dir=str(directory), mode="offline", reinit="finish_previous")
        # a fresh process's MLflow reads MLFLOW_TRACKING_URI; this one has set another store before
        mlflow.set_tracking_uri(uri)
        callbacks = (WandbCallback(), MLflowCallback())
        state, control = TrainerState(), TrainerControl()
        for step, row in enumerate(rows):
            state.global_step = step
            for callback in callbacks:
                callback.on_log(args, state, control, logs=dict(row))
        for callback in callbacks:
            callback.on_train_end(args, state, control)
        if wandb.run is not None:
            wandb.run.finish()
        if mlflow.active_run() is not None:
            mlflow.end_run()
    finally:
        mlflow.set_tracking_uri(previous)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- each framework's reduction, from its source ---------------------------------------------------


def verl_rows(mbs):  # core_algos.py:1353 per micro-batch, then means over micro-batches and ranks;
    # rollout_corr/* once over the step's batch (ray_trainer.py:1658): a token mean, of the old log-probs
    return {
        "actor/pg_clipfrac": mean_of_means(mbs),
        "actor/pg_clipfrac_lower": 0.5 * mean_of_means(mbs),
        "rollout_corr/k3_kl": ratio_of_sums(mbs, 2),
        "rollout_corr/chi2_token": 0.01,
        "critic/score/mean": 0.5,
    }


def trl_rows(mbs):  # exact across processes within a micro-step; log() averages the micro-steps
    return {
        "clip_ratio/region_mean": mean_of_means(mbs),
        "clip_ratio/high_max": max(mb[1] / mb[0] for mb in mbs),
        "loss": 0.1,
    }


def openrlhf_rows(mbs):  # ppo_actor.py:205-222: token-weighted over micro-batches and ranks
    return {"ppo_clip_ratio": ratio_of_sums(mbs), "logprobs_diff": 0.02, "policy_loss": 0.3}


def nemo_rows(mbs):  # loss_functions.py: each micro-batch over the global valid tokens, summed
    total = sum(mb[0] for mb in mbs)
    return {"gen_kl_error": sum(mb[2] / total for mb in mbs), "token_mult_prob_error": 1.01}


def miles_rows(mbs):  # sum_of_sample_mean: per-sample means (each micro-batch one sample here)
    return {"pg_clipfrac": mean_of_means(mbs), "train_rollout_kl": mean_of_means(mbs, 2), "loss": 0.2}


def areal_rows(mbs):  # stats_tracker: SUM of counts, AVG = sum(x * mask) / sum(mask)
    return {
        "ppo_actor/update/clipped_tokens": float(sum(mb[1] for mb in mbs)),
        "ppo_actor/update/n_valid_tokens": float(sum(mb[0] for mb in mbs)),
        "ppo_actor/update/clip_ratio/avg": ratio_of_sums(mbs),
        "ppo_actor/update/behave_approx_kl/avg": -0.003,
    }


def prime_rows(mbs):  # compute_stats: the mean of every token's k3, gathered over micro-batches and ranks
    return {"mismatch_kl/all/mean": ratio_of_sums(mbs, 2), "mismatch_kl/all/max": 0.4, "is_masked/mean": 0.01}


def skyrl_rows(mbs):  # reduce_metrics then all_reduce_metrics: means of micro-batch means
    return {"policy/clip_ratio": mean_of_means(mbs), "policy/rollout_train_logprobs_abs_diff_max": 0.7}


def roll_rows(mbs):  # actor/clipfrac: np.mean over micro-batches; ppo_ratio_clipfrac@sum the band exit
    return {"actor/clipfrac": mean_of_means(mbs), "actor/ppo_ratio_clipfrac@sum": 1.5 * ratio_of_sums(mbs)}


CLIP_APPROX = Expect(keys.CLIP_FRACTION, mean_of_means, True)
CASES = {
    "verl": Case(
        "verl",
        "verl",
        verl_rows,
        write_step_keyword,
        (
            CLIP_APPROX,
            Expect(keys.KL_K3_MEAN, lambda mbs: ratio_of_sums(mbs, 2), True),
            Expect(keys.DUAL_CLIP_FRACTION, lambda mbs: 0.5 * mean_of_means(mbs), True),
            Expect(keys.REWARD, lambda mbs: 0.5, False),
        ),
        ("rollout_corr/chi2_token",),
        ("wandb", "mlflow"),
    ),
    "trl": Case(
        "trl",
        "TRL",
        trl_rows,
        write_trl,
        (CLIP_APPROX,),
        ("clip_ratio/high_max",),
        ("wandb", "mlflow"),
    ),
    "openrlhf": Case(
        "openrlhf",
        "OpenRLHF",
        openrlhf_rows,
        write_openrlhf,
        (Expect(keys.CLIP_FRACTION, ratio_of_sums, False),),
        ("train/logprobs_diff",),
        per_step_exact=(keys.CLIP_FRACTION,),
    ),
    "nemo-rl": Case(
        "nemo-rl",
        "NeMo-RL",
        nemo_rows,
        write_prefixed("train"),
        (Expect(keys.KL_K3_MEAN, lambda mbs: ratio_of_sums(mbs, 2), True),),
        ("train/token_mult_prob_error",),
        ("wandb", "mlflow"),
    ),
    "miles": Case(
        "miles",
        "slime/Miles",
        miles_rows,
        write_prefixed("train", "train/step"),
        (CLIP_APPROX, Expect(keys.KL_K3_MEAN, lambda mbs: mean_of_means(mbs, 2), True)),
        (),
        ("wandb", "mlflow"),
    ),
    "areal": Case(
        "areal",
        "AReaL",
        areal_rows,
        write_step_keyword,
        (
            Expect(keys.CLIPPED_TOKENS, lambda mbs: sum(mb[1] for mb in mbs), False),
            Expect(keys.LOSS_TOKENS, lambda mbs: sum(mb[0] for mb in mbs), False),
            Expect(keys.CLIP_FRACTION, ratio_of_sums, False),
        ),
        ("ppo_actor/update/behave_approx_kl/avg",),
    ),
    "prime-rl": Case(
        "prime-rl",
        "prime-rl",
        prime_rows,
        write_step_keyword,
        (Expect(keys.KL_K3_MEAN, lambda mbs: ratio_of_sums(mbs, 2), False),),
        ("mismatch_kl/all/max", "is_masked/mean"),
        per_step_exact=(keys.KL_K3_MEAN,),
    ),
    "skyrl": Case(
        "skyrl",
        "SkyRL",
        skyrl_rows,
        write_step_keyword,
        (CLIP_APPROX,),
        ("policy/rollout_train_logprobs_abs_diff_max",),
        ("wandb", "mlflow"),
    ),
    "roll": Case(
        "roll",
        "ROLL",
        roll_rows,
        write_step_keyword,
        (CLIP_APPROX,),
        ("actor/ppo_ratio_clipfrac@sum",),
    ),
}


def _rows(case: Case, seed: int) -> list[dict[str, float]]:
    return [case.rows(batches(seed, step)) for step in range(STEPS)]


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Every case's two runs, each framework in its own W&B directory and MLflow store."""
    import os

    os.environ.setdefault("WANDB_SILENT", "true")
    out = {}
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))  # a writer's default store lands here, never in the checkout
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"  # one store: run names differ
    try:
        for name, case in CASES.items():
            root = tmp_path_factory.mktemp(name.replace("-", "_"))
            for seed in (0, 1):
                store = uri if "mlflow" in case.stores else None
                case.write(root / "wandb", f"{name}-seed{seed}", store, _rows(case, seed))
            out[name] = (root / "wandb", uri)
    finally:
        os.chdir(here)
    return out


def _load(case: Case, store: str, where: tuple[Path, str]):
    directory, uri = where
    names = [f"{case.framework}-seed{seed}" for seed in (0, 1)]
    if store == "wandb":
        return load_runs(wandb_dir=directory)
    return load_runs(names, tracking_uri=uri)


def _by_step(runs, label: str) -> dict[tuple[int, str], float]:
    frame = runs.frame[runs.frame.run == label]
    return {(int(r.step), r.metric): float(r.value) for r in frame.itertuples()}


PARAMS = [(name, store) for name, case in CASES.items() for store in case.stores]


@pytest.mark.parametrize(("name", "store"), PARAMS, ids=[f"{n}-{s}" for n, s in PARAMS])
def test_a_frameworks_own_runs_read_as_logged_and_compare(written, name, store):
    case = CASES[name]
    runs = _load(case, store, written[name])
    labels = sorted(info.display for info in runs.runs)
    assert labels == [f"{name}-seed0", f"{name}-seed1"]
    for seed, label in enumerate(labels):
        info = runs.info(label)
        assert info.framework == name and info.run.backend_label == name, label
        values = _by_step(runs, label)
        for e in case.expect:
            for step in range(STEPS):
                assert values[step, e.key] == pytest.approx(e.value(batches(seed, step)), rel=1e-6), (
                    e.key,
                    step,
                )
            assert (e.key in info.approximate) == e.approximate, e.key
        assert set(case.per_step_exact) <= set(info.per_step)
        for kept in case.different:  # under its own name (W&B's transformers callback prefixes train/)
            assert any(k == (0, kept) or k == (0, f"train/{kept}") for k in values), kept
    result = compare(runs, labels)
    compared = {q.name for q in result.quantities}
    for kept in case.different:
        assert kept not in compared
    said = [n for n in result.notes if isinstance(n.reason, FrameworkRun)]
    assert sorted(n.run for n in said) == labels
    assert all(f"logged by {case.title} itself" in n.text for n in said)
    for kept in case.different:
        assert all(kept in n.text for n in said), kept
    clip = [e for e in case.expect if e.key == keys.CLIP_FRACTION]
    if clip:
        estimates = {e.run: e for e in result.estimates if e.metric == "clip_fraction"}
        for seed, label in enumerate(labels):
            assert estimates[label].approximate == clip[0].approximate
            per_step = [clip[0].value(batches(seed, s)) for s in range(STEPS)]
            if keys.CLIPPED_TOKENS not in {e.key for e in case.expect}:  # no counts: the mean over steps
                assert estimates[label].estimate.value == pytest.approx(float(np.mean(per_step)), rel=1e-6)
            else:  # counts: the ratio of token sums over the window
                mbs = [mb for s in range(STEPS) for mb in batches(seed, s)]
                assert estimates[label].estimate.value == pytest.approx(ratio_of_sums(mbs), rel=1e-9)
        assert result.differences[0].approximate == clip[0].approximate


def test_stacks_over_seeds_group_by_framework_with_approximate_marked(written, tmp_path):
    """verl's two seeds against AReaL's two, grouped by the stack each run was detected as."""
    import shutil

    merged = tmp_path / "wandb"
    for name in ("areal", "verl"):
        shutil.copytree(written[name][0], merged / name)
    runs = load_runs(wandb_dir=merged)
    order = ["areal-seed0", "areal-seed1", "verl-seed0", "verl-seed1"]
    result = compare(runs, order, group_by="stack")
    assert {g: sorted(m) for g, m in result.groups.items()} == {
        "areal": ["areal-seed0", "areal-seed1"],
        "verl": ["verl-seed0", "verl-seed1"],
    }
    (clip,) = [d for d in result.group_differences if d.metric == "clip_fraction"]
    assert clip.approximate  # verl's clip fraction is a mean of micro-batch means
    exact = {e.run: e.approximate for e in result.estimates if e.metric == "clip_fraction"}
    assert exact == {"areal-seed0": False, "areal-seed1": False, "verl-seed0": True, "verl-seed1": True}
    row = result.compact_table().set_index("metric").loc["clip_fraction"]
    assert row["verl"].startswith("≈") and not row["areal"].startswith("≈")  # the stack's mean marked
    assert row["difference [90% CI]"].startswith("≈")


def test_every_entry_of_the_table_is_documented():
    """docs/FRAMEWORKS.md lists every framework's version and every metric name of the table."""

    text = (Path(__file__).parents[1] / "docs" / "FRAMEWORKS.md").read_text(encoding="utf-8")
    for f in frameworks.FRAMEWORKS:
        assert f.version in text, f.name
    for m in frameworks.METRICS:
        assert f"`{m.name}`" in text, m.name


def test_detection_needs_a_name_one_framework_alone_logs():
    assert frameworks.detect(["loss", "train/ppo_kl"]) is None  # shared and unknown names say nothing
    found = frameworks.detect(["train/ppo_clip_ratio", "train/ppo_kl", "loss"])
    assert found is not None and found.title == "OpenRLHF"


@pytest.mark.parametrize("name", ["verl", "trl", "skyrl"])
def test_runs_lists_a_frameworks_own_runs_under_its_name(written, name):
    """``cliptrack runs`` (its listing) names the framework as the backend and counts its steps."""
    from cliptrack.backends.catalog import list_runs

    directory, uri = written[name]
    for store in ({"tracking_uri": uri}, {"wandb_dir": directory}):
        entries = [e for e in list_runs(**store) if e.name.startswith(f"{name}-")]  # the store holds them all
        assert sorted((e.name, e.backend, e.steps) for e in entries) == [
            (f"{name}-seed{seed}", name, STEPS) for seed in (0, 1)
        ], store


@given(
    loss=st.integers(1, 10**9),
    share=st.floats(0, 1),
    theirs=st.floats(0, 1),
    name=st.sampled_from(sorted(m.name for m in frameworks.METRICS if m.key == keys.CLIP_FRACTION)),
)
def test_a_frameworks_fraction_beside_our_counts_is_kept_and_ours_is_used(loss, share, theirs, name):
    """Whatever the framework's value, the point's clip fraction is our counts' ratio, and the
    framework's number stays under its own name, recorded as audited (never as approximate)."""
    clipped = int(share * loss)
    got = canonical_metrics(
        {name: theirs, keys.CLIPPED_TOKENS: float(clipped), keys.LOSS_TOKENS: float(loss)}
    )
    assert got.metrics[keys.CLIP_FRACTION] == clipped / loss
    assert got.metrics[name] == theirs
    assert got.audited == {(keys.CLIP_FRACTION, name)}
    assert got.approximate == frozenset() and got.per_step == frozenset()
    alone = canonical_metrics({name: theirs})  # without our counts: read as ours, flagged per its entry
    assert alone.metrics[keys.CLIP_FRACTION] == theirs and name not in alone.metrics
    entry = frameworks.BY_FOREIGN[name]
    assert (keys.CLIP_FRACTION in alone.approximate) == (entry.agreement == frameworks.APPROXIMATE)
    assert (keys.CLIP_FRACTION in alone.per_step) == (entry.agreement == frameworks.EXACT)
