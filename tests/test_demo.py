"""The main job end to end: ``cliptrack demo`` trains both paths, logs them, compares them."""

from __future__ import annotations

import html as html_module
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cliptrack.core import keys

from tests._demo import DEMO_STEPS, DemoRun
from tests._tools import CHROMIUM, needs_chromium

STEPS = DEMO_STEPS
# every test that reads the session demo runs on one worker (tests/conftest.py: the group of its
# session fixture), so the demo runs once; the others run on any worker


@pytest.fixture
def demo(demo_run: DemoRun) -> tuple[Path, str]:
    """The session's one demo run (``tests/conftest.py``): its output folder and what it printed."""
    return demo_run.out, demo_run.proc.stdout


@pytest.mark.slow  # reads the session's demo run (a subprocess training and logging both runs)
def test_both_runs_are_in_mlflow_with_every_clip_series(demo):
    from mlflow.tracking import MlflowClient

    out, _ = demo
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cliptrack-demo")
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.`{keys.TAG_RUN_KIND}` = '{keys.RUN_KIND_TRAINING}'"
    )
    assert sorted(r.data.tags[keys.TAG_BACKEND] for r in runs) == ["megatron"] * 6 + ["miles"] * 3
    for run in runs:
        assert run.info.status == "FINISHED"
        for key in keys.CLIP_SERIES_KEYS + (keys.REWARD, keys.THROUGHPUT):
            history = client.get_metric_history(run.info.run_id, key)
            assert sorted(m.step for m in history) == list(range(STEPS)), (run.info.run_name, key)
        clipped = sum(m.value for m in client.get_metric_history(run.info.run_id, keys.CLIPPED_TOKENS))
        tokens = sum(m.value for m in client.get_metric_history(run.info.run_id, keys.LOSS_TOKENS))
        assert 0 < clipped / tokens < 1, run.info.run_name
        low = sum(m.value for m in client.get_metric_history(run.info.run_id, keys.CLIPPED_LOW_TOKENS))
        high = sum(m.value for m in client.get_metric_history(run.info.run_id, keys.CLIPPED_HIGH_TOKENS))
        assert low + high == clipped


@pytest.mark.slow  # reads the session's demo run (a subprocess training and logging both runs)
def test_megatron_path_ran_through_megatron_cores_schedule(demo):
    """With megatron-core installed, the Megatron run's micro-batches go through its own schedule."""
    pytest.importorskip("megatron.core")
    from mlflow.tracking import MlflowClient

    out, stdout = demo
    schedule = "megatron.core.pipeline_parallel.schedules.forward_backward_no_pipelining"
    assert f"megatron path ran through: {schedule}" in stdout
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cliptrack-demo")
    runs = client.search_runs([experiment.experiment_id], f"tags.`{keys.TAG_BACKEND}` = 'megatron'")
    assert len(runs) == 6 and {run.data.params["schedule"] for run in runs} == {schedule}


def _browse(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium on ``url``; ``--virtual-time-budget`` lets the app fetch and draw its charts."""
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-quic",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1600,1400",
        "--virtual-time-budget=30000",
        "--run-all-compositor-stages-before-draw",
    ]
    return subprocess.run(base + list(args) + [url], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@needs_chromium
def test_mlflow_ui_shows_the_training_runs_clip_series(demo, demo_ui, tmp_path):
    """``mlflow ui`` on the demo's store, in headless Chromium: the training runs' clip series are
    charted (line charts over steps), in a training experiment without the comparison's numbers."""
    from mlflow.tracking import MlflowClient

    out, _ = demo
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cliptrack-demo")
    runs = client.search_runs([experiment.experiment_id])
    training = {
        r.info.run_name: r.info.run_id
        for r in runs
        if r.data.tags.get(keys.TAG_RUN_KIND) == keys.RUN_KIND_TRAINING
    }
    assert {"demo-megatron-ppo-seed0", "demo-miles-ppo-seed0", "demo-megatron-ppo-stale2-seed3"} <= set(
        training
    )
    assert len(training) == 9  # 3 seeds of megatron, miles and the control
    assert len(runs) == len(training), "only the training runs belong in the training experiment"
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development", experiment.tags
    assert experiment.artifact_location.startswith(out.as_uri()), experiment.artifact_location
    url = demo_ui  # `mlflow ui` on the demo's store (tests/conftest.py)
    # the address the demo prints without its view (viewStateShareKey: four charts alone, checked in
    # tests/test_mlflow_ui.py), so every chart shows; a tall window, so every chart of the clip
    # series and the gauge is drawn (the chart view draws only the charts in view)
    charts = (
        f"{url}/#/experiments/{experiment.experiment_id}/runs"
        "?workflowType=machine_learning&compareRunsMode=CHART"
    )
    tall = "--window-size=1600,6000"
    shot = tmp_path / "mlflow-training-runs.png"
    # one browser for the picture and the page's DOM, both taken at the end of the virtual time budget
    proc = _browse(charts, tmp_path / "profile-charts", tall, f"--screenshot={shot}", "--dump-dom")
    assert shot.is_file() and shot.stat().st_size > 20_000, proc.stderr[-2000:]
    dom = proc.stdout
    for name in training:
        assert name in dom
    for key in (keys.CLIP_FRACTION, keys.CLIPPED_TOKENS, keys.LOSS_TOKENS):
        assert key in dom, f"no chart of {key} on the training runs' chart view"
    assert "clip_fraction.difference" not in dom and "compare:" not in dom
    # one run's own metric page charts every clip series (every run holds them all, as MLflow's client
    # reads them: test_both_runs_are_in_mlflow_with_every_clip_series); the Miles run, whose series
    # come through the client aggregator
    name = "demo-miles-ppo-seed0"
    page = f"{url}/#/experiments/{experiment.experiment_id}/runs/{training[name]}/model-metrics"
    dom = _browse(page, tmp_path / "profile-run", tall, "--dump-dom").stdout
    assert name in dom
    for key in keys.CLIP_SERIES_KEYS:
        assert key in dom, f"{name}: no chart of {key}"


@pytest.mark.slow  # reads the session's demo run
def test_the_readme_picture_shows_the_demo_as_it_now_runs(demo):
    """docs/dashboard.png records the headline of the dashboard it shows (``make docs-picture``):
    the demo's dashboard says the same now, numbers aside (the session's demo trains fewer steps)."""
    from benchmarks.dashboard_picture import PICTURE, dashboard_headline, picture_headline, shape

    out, _ = demo
    now = dashboard_headline((out / "dashboard.html").read_text(encoding="utf-8"))
    shown = picture_headline(PICTURE)
    assert shown, f"{PICTURE} records no headline: regenerate it with make docs-picture"
    assert [shape(line) for line in shown.splitlines()] == [shape(line) for line in now.splitlines()], (
        f"{PICTURE} shows another dashboard than the demo writes now: regenerate it with make docs-picture"
    )


@pytest.mark.slow  # reads the session's demo run (a subprocess training and logging both runs)
def test_the_demo_prints_and_logs_each_groups_worst_sequences(demo):
    """Both paths find each step's worst sequences (Megatron's reduce_step, the Miles aggregator):
    every run's spool holds one table per step, and the line the demo prints for a group is its
    first run's last table, as logged."""
    from cliptrack.core.worst import CRITERIA
    from cliptrack.store.worst import WORST_FILE, read_worst_file

    out, stdout = demo
    tables = {}
    for run_dir in (out / "spool").iterdir():
        if not (run_dir / "run.json").is_file():
            continue
        meta = json.loads((run_dir / "run.json").read_text())
        logged = read_worst_file(run_dir / WORST_FILE)
        assert [w.step for w in logged] == list(range(STEPS)), run_dir
        for w in logged:
            assert all(1 <= len(w.by[c]) <= w.k for c in CRITERIA)
            values = [s.abs_log_ratio for s in w.by["abs_log_ratio"]]
            assert values == sorted(values, reverse=True)
            assert len({s.datum for s in w.by["abs_log_ratio"]}) == len(values)
        tables[meta["run_name"]] = logged[-1]
    for group, name in (("megatron", "demo-megatron-ppo-seed0"), ("miles", "demo-miles-ppo-seed0")):
        line = re.search(
            rf"^{group} worst sequences \(step {STEPS - 1} of its first seed\): (.*)$", stdout, re.M
        )
        assert line is not None, stdout
        printed = [int(d) for d in re.findall(r"#(\d+) sum \|log ratio\| ", line.group(1))]
        assert printed == [s.datum for s in tables[name].by["abs_log_ratio"][:3]]


def test_dashboard_panels_and_verdict_are_produced(demo):
    out, stdout = demo
    html = (out / "dashboard.html").read_text(encoding="utf-8")
    assert "demo-megatron-ppo-seed0" in html and "demo-miles-ppo-seed0" in html
    assert "Sequences that recur as worst" in html  # where: the worst sequences, read back from MLflow
    assert (out / "wandb-panels.json").is_file()
    assert "verdict on the stacks: different" in stdout and "clip_fraction" in stdout
    assert re.search(r"control verdict \(megatron-stale2 vs miles\): (equivalent|inconclusive)", stdout)
    assert "mlflow ui --backend-store-uri" in stdout
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cliptrack-demo")
    assert not client.search_runs(
        [experiment.experiment_id], f"tags.`{keys.TAG_RUN_KIND}` = '{keys.RUN_KIND_COMPARISON}'"
    )
    comparisons = client.get_experiment_by_name("cliptrack-demo-comparisons")
    [comparison] = client.search_runs(
        [comparisons.experiment_id], f"tags.`{keys.TAG_RUN_KIND}` = '{keys.RUN_KIND_COMPARISON}'"
    )
    assert comparison.data.tags[keys.TAG_VERDICT] == "different"  # the stale stack, over 3 seeds each
    assert comparison.info.artifact_uri.startswith((out / "comparison-artifacts").resolve().as_uri())
    artifacts = {a.path for a in client.list_artifacts(comparison.info.run_id)}
    assert {"dashboard.html", "comparison.csv", "comparison.json"} <= artifacts
    assert any((out / "comparison-artifacts").rglob("comparison.json"))
    # the dashboard's headline: three lines, then the control's verdict (same staleness, other path)
    headline = re.search(r'id="headline">(.*?)</p>', html, re.S)
    assert headline is not None
    assert len(html_module.unescape(headline.group(1)).split("\n")) == 3
    control = re.search(r'<p class="control ([^"]*)" id="control">(.*?)</p>', html, re.S)
    assert control is not None, "the demo ran a control: its verdict belongs on the dashboard"
    said = html_module.unescape(control.group(2))
    assert said.startswith(f"Control: {control.group(1).replace('-', ' ')} — megatron-stale2 "), said
    if control.group(1) == "equivalent":
        assert said.endswith("Staleness is the cause of the gap, not the stack."), said
    # the MLflow experiment's page: the runs grouped by stack, the verdict in its description, the
    # comparison run named after it
    training = client.get_experiment_by_name("cliptrack-demo")
    view = json.loads(training.tags["mlflow.sharedViewState.cliptrack-charts"])
    assert view["groupBy"]["groupByKeys"] == [{"mode": "param", "groupByData": "group"}]
    description = training.tags["mlflow.note.content"]
    assert "Not equally on-policy" in description and "Control: " in description
    assert comparison.info.run_name == "different: miles vs megatron (3 seeds each)"
    assert f"/runs/{comparison.info.run_id})" in description
    # why: the folded prose names the part of the mismatch KL that differs (the stale sampler's
    # drift), the engine part agreeing at 0
    prose = re.search(r'id="prose">(.*?)</p>', html, re.S)
    assert prose is not None
    lines = html_module.unescape(prose.group(1)).split("\n")
    why = next(line for line in lines if line.startswith("Why:"))
    assert "the drift part differs (miles" in why and "the engine part agrees (miles 0 vs megatron 0" in why
    assert why.endswith("The gap is in the drift part: staleness or the update's own drift."), why


@pytest.mark.slow  # reads the session's demo run (a subprocess training and logging both runs)
def test_miles_run_is_more_off_policy_than_megatron_run(demo):
    from cliptrack.backends import load_runs

    out, _ = demo
    runs = load_runs(jsonl_dir=out / "spool")
    frame = runs.frame
    sums = (
        frame[frame.metric.isin([keys.CLIPPED_TOKENS, keys.LOSS_TOKENS])]
        .groupby(["backend", "metric"])
        .value.sum()
    )
    fraction = {b: sums[b, keys.CLIPPED_TOKENS] / sums[b, keys.LOSS_TOKENS] for b in ("megatron", "miles")}
    assert fraction["miles"] > fraction["megatron"] > 0


@pytest.mark.slow  # reads the session's demo run (a subprocess training and logging both runs)
def test_miles_run_sits_further_off_policy_on_the_gauge_and_the_demo_prints_it(demo):
    """The Miles run samples from a policy two steps stale: its mismatch KL (k3) and mean |log
    ratio|, ratios of sums over the run as logged to MLflow, are well above the Megatron run's, and
    the demo's own summary lines show the same numbers."""
    from mlflow.tracking import MlflowClient

    out, stdout = demo
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cliptrack-demo")
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.`{keys.TAG_RUN_KIND}` = '{keys.RUN_KIND_TRAINING}'"
    )

    def total(run_id: str, key: str) -> float:
        history = client.get_metric_history(run_id, key)
        assert sorted(m.step for m in history) == list(range(STEPS)), key
        return math.fsum(m.value for m in history)

    sums: dict[str, list[float]] = {}
    for run in runs:
        run_id = run.info.run_id
        group = sums.setdefault(run.data.params["group"], [0.0] * 6)
        for i, key in enumerate(
            (
                keys.LOSS_TOKENS,
                keys.KL_K3_SUM,
                keys.ABS_LOG_RATIO_SUM,
                keys.ENGINE_KL_K3_SUM,
                keys.DRIFT_KL_K3_SUM,
                keys.WEIGHT_LAG_SUM,
            )
        ):
            group[i] += total(run_id, key)
        for key in (keys.KL_K3_MEAN, keys.ABS_LOG_RATIO_MEAN, keys.LOG_RATIO_MAX, keys.LOG_RATIO_MIN):
            assert len(client.get_metric_history(run_id, key)) == STEPS, key
        # total = engine + drift, step by step, as logged
        parts = [
            {m.step: m.value for m in client.get_metric_history(run_id, key)}
            for key in (keys.LOG_RATIO_SUM, keys.ENGINE_LOG_RATIO_SUM, keys.DRIFT_LOG_RATIO_SUM)
        ]
        for step, value in parts[0].items():
            assert value == pytest.approx(parts[1][step] + parts[2][step], rel=1e-9, abs=1e-9)
    gauge = {
        g: {"kl": kl / n, "abs": a / n, "engine": e / n, "drift": d / n, "lag": lag / n}
        for g, (n, kl, a, e, d, lag) in sums.items()
    }
    assert gauge["miles"]["kl"] > 2 * gauge["megatron"]["kl"] > 0, gauge
    assert gauge["miles"]["abs"] > 1.5 * gauge["megatron"]["abs"] > 0, gauge
    # why: the extra KL is drift (the sampler's staleness); the engine part is about 0 on both paths
    for backend in ("megatron", "miles"):
        assert gauge[backend]["engine"] < 1e-9 < gauge[backend]["drift"], gauge
    assert gauge["miles"]["drift"] > 2 * gauge["megatron"]["drift"], gauge
    assert gauge["megatron"]["lag"] == 0 and 1.5 < gauge["miles"]["lag"] <= 2, gauge
    for backend, staleness in (("megatron", 0), ("miles", 2), ("megatron-stale2", 2)):
        line = re.search(
            rf"^{backend} \(3 seeds\): clip fraction [0-9.]+, mismatch KL \(k3\) ([0-9.]+) \(engine part "
            rf"([0-9.]+), drift part ([0-9.]+)\), mean \|log ratio\| ([0-9.]+) \(sampler {staleness} "
            rf"step\(s\) stale, mean weight lag ([0-9.]+)\)$",
            stdout,
            re.MULTILINE,
        )
        assert line is not None, stdout
        assert float(line[1]) == pytest.approx(gauge[backend]["kl"], abs=1e-5)
        assert float(line[2]) == pytest.approx(gauge[backend]["engine"], abs=1e-5)
        assert float(line[3]) == pytest.approx(gauge[backend]["drift"], abs=1e-5)
        assert float(line[4]) == pytest.approx(gauge[backend]["abs"], abs=1e-4)
        assert float(line[5]) == pytest.approx(gauge[backend]["lag"], abs=1e-2)


def test_megatron_core_schedule_and_plain_loop_give_the_same_step(tmp_path):
    """The demo's Megatron path through Megatron-Core's own schedule (CPU shim) equals the plain loop."""
    pytest.importorskip("megatron.core")
    from cliptrack.adapters.demo.train import RunConfig, train

    from tests._harness import megatron_one_rank

    config = RunConfig(path="megatron", steps=1, epochs=1, seed=3)
    loop = [r.output.metrics for r in train(config, use_schedule=False)]
    with megatron_one_rank():
        scheduled = [r.output.metrics for r in train(config, use_schedule=True)]
    assert len(loop) == len(scheduled) == 1
    for key in (keys.LOSS_TOKENS, keys.CLIPPED_TOKENS, keys.CLIPPED_LOW_TOKENS, keys.CLIPPED_HIGH_TOKENS):
        assert loop[0][key] == scheduled[0][key]
    assert loop[0][keys.LOSS_SUM] == pytest.approx(scheduled[0][keys.LOSS_SUM], rel=1e-6)


def test_default_demo_trains_seeds_per_stack_and_a_control_on_other_seeds():
    """The default demo trains 2+ seeds per stack (a stack-level verdict needs them) and a control:
    the Megatron path as stale as Miles, on seeds neither stack uses."""
    import argparse

    from cliptrack.adapters.demo.train import RunConfig
    from cliptrack.cli.demo import add_arguments, plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([])
    assert defaults.seeds >= 2 and defaults.miles_staleness > 0
    groups = plan(["megatron", "miles"], defaults.seeds, defaults.seed, defaults.miles_staleness)
    assert list(groups) == ["megatron-stale2", "megatron", "miles"]  # the control first
    control, megatron, miles = groups.values()
    assert {s for _, _, s in control}.isdisjoint({s for _, _, s in megatron + miles})
    assert {(p, st) for p, st, _ in control} == {("megatron", defaults.miles_staleness)}
    assert [s for _, _, s in megatron] == [s for _, _, s in miles]
    assert RunConfig(path="megatron").epochs == defaults.epochs


@pytest.mark.slow
def test_default_training_clips_more_on_the_stale_run_and_the_verdict_is_honest():
    """The demo's default pair trained with its defaults (no logging): clipping bites on both and more on the
    stale run, whose clip fraction rises and falls over the run (about 10 percentage points more on
    average). The stale run is trained on the Megatron path with the Miles path's staleness: the two paths
    are the same training step (tests/test_paths_agree.py; the demo's control group, the Megatron path as
    stale, compares "equivalent" with the Miles path), and the Megatron path trains one step in about an
    eighth of the Miles path's time (its per-datum wire). The paired difference's interval lies above
    zero; the verdict is "different", or "insufficient data" with the reason naming the effective sample
    size when the long-run variance reads that rise and fall as persistence (it does at 100-150 steps: the
    window is too short to tell a smooth trend of that shape from a persistent wander; seeds settle it, as
    the demo's grouped verdict does)."""
    import argparse

    import numpy as np
    from cliptrack.adapters.demo.train import RunConfig, train
    from cliptrack.cli.demo import add_arguments
    from cliptrack.compare import DEFAULT_TOLERANCES, compare
    from cliptrack.compare.stats import (
        DIFFERENT,
        INSUFFICIENT,
        LOG_RATIO,
        MIN_ESS,
        MIN_UNITS,
        equivalence_verdict,
        paired_difference,
    )
    from cliptrack.store.frame import LoadedRun, Point, RunInfo, RunSet

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([])
    threads = torch.get_num_threads()
    counts = {}
    logged: dict[str, list] = {}
    for label, staleness in (("fresh", 0), ("stale", defaults.miles_staleness)):
        config = RunConfig(
            path="megatron",
            loss=defaults.loss,
            steps=100,  # one pair of runs just long enough for a paired verdict (MIN_UNITS)
            epochs=defaults.epochs,
            staleness=staleness,
            seed=defaults.seed,
        )
        metrics = [r.output.metrics for r in train(config)]
        logged[label] = [Point(step, 1000.0 + step, dict(m)) for step, m in enumerate(metrics)]
        counts[label] = (
            np.array([m[keys.CLIPPED_TOKENS] for m in metrics]),
            np.array([m[keys.LOSS_TOKENS] for m in metrics]),
        )
    assert torch.get_num_threads() == threads, "training restores torch's thread setting"
    fraction = {label: clipped.sum() / tokens.sum() for label, (clipped, tokens) in counts.items()}
    assert 0.005 < fraction["fresh"] < fraction["stale"] < 0.5, fraction
    margin = DEFAULT_TOLERANCES["clip_fraction"]  # relative: both clip well above its floor
    difference = paired_difference(*counts["fresh"], *counts["stale"], scale=LOG_RATIO)
    assert difference.n_units >= MIN_UNITS and difference.low > 0, difference
    verdict = equivalence_verdict(difference, math.log1p(margin.value))
    assert verdict in (DIFFERENT, INSUFFICIENT), difference
    if verdict == INSUFFICIENT:
        assert difference.ess < MIN_ESS and "effective sample size" in difference.insufficiency(), difference
    # the comparison says what the two runs plainly show, and that seeds answer for the stacks
    runset = RunSet.from_points(
        [(LoadedRun(RunInfo(label, label, label), "test"), points) for label, points in logged.items()]
    )
    result = compare(runset)
    assert result.difference("clip_fraction").verdict == verdict
    lines = result.headline_lines()
    assert len(lines) <= 4 and result.on_policy_verdict in (DIFFERENT, INSUFFICIENT), lines
    # the fourth line says why: the stale run's extra mismatch is drift, its engine part 0
    assert (
        lines[-1].startswith("Why: of the mismatch KL, the drift part")
        and "the engine part agrees" in lines[-1]
    )
    if result.on_policy_verdict == INSUFFICIENT:
        assert lines[2].startswith("These runs differ by about +") and "2+ seeds each" in lines[2], lines


def test_demo_refuses_bad_settings():
    from cliptrack.adapters.demo.train import RunConfig

    with pytest.raises(ValueError, match="clipping loss"):
        RunConfig(path="miles", loss="dro")
    with pytest.raises(ValueError, match="path must be one of"):
        RunConfig(path="vllm")
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        RunConfig(path="miles", staleness=-1)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        RunConfig(path="miles", threads=0)
    proc = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "demo", "--paths", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "unknown path" in proc.stderr


def test_group_advantages_are_normalised_per_group():
    from cliptrack.adapters.demo.task import group_advantages

    reward = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.4, 0.6, 0.8])
    adv = group_advantages(reward, 4).view(2, 4)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(adv.std(dim=1, unbiased=False), torch.ones(2), atol=1e-4)
