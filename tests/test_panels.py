"""W&B workspace/report models and the MLflow comparison run.

The W&B models are built offline with the real ``wandb-workspaces`` classes; the only thing
replaced is the report runset's project-id lookup (a W&B cloud API call), via ``unittest.mock``.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from cliptrack.backends import load_runs
from cliptrack.cli.main import main
from cliptrack.compare import LoadedRun, RunSet, compare
from cliptrack.compare.views.mlflow_run import log_comparison
from cliptrack.compare.views.panels import PANELS
from cliptrack.compare.views.plots import PALETTE
from cliptrack.compare.views.wandb_panels import build_report, build_workspace, report_spec, workspace_spec
from cliptrack.core import keys
from cliptrack.core.text import markdown_lines
from cliptrack.store.records import RunInfo
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests._compare_fixtures import megatron_vs_miles, synthetic_run, write_mlflow


def _difference(quantity):
    base = f"difference/{quantity}"
    return [base, f"{base}:low", f"{base}:high", f"{base}:margin_low", f"{base}:margin_high"]


CLIP_AS_LOGGED = [
    "actor/pg_clipfrac",
    "clip_ratio/region_mean",
    "train/clip_ratio/region_mean",
    "train/ppo_clip_ratio",
    "train/pg_clipfrac",
    "ppo_actor/update/clip_ratio/avg",
    "policy/clip_ratio",
    "actor/clipfrac",
]
"""The frameworks' own clip fractions (docs/FRAMEWORKS.md): a W&B line plot shows them beside ours."""
KL_AS_LOGGED = ["rollout_corr/k3_kl", "train/gen_kl_error", "train/train_rollout_kl", "mismatch_kl/all/mean"]
ABS_AS_LOGGED = [
    "sampling/sampling_logp_difference/mean",
    "train/sampling/sampling_logp_difference/mean",
    "train/train_rollout_logprob_abs_diff",
    "policy/rollout_train_logprobs_abs_diff_mean",
]
EXPECTED = {
    "clipping": [
        [keys.CLIP_FRACTION, *CLIP_AS_LOGGED],
        _difference("clip_fraction"),
        [
            keys.CLIPPED_TOKENS,
            keys.LOSS_TOKENS,
            "ppo_actor/update/clipped_tokens",
            "ppo_actor/update/n_valid_tokens",
        ],
        [keys.CLIPPED_LOW_TOKENS, keys.CLIPPED_HIGH_TOKENS],
    ],
    "reward": [[keys.REWARD, "critic/score/mean"], _difference("reward")],
    "throughput": [[keys.THROUGHPUT], _difference("throughput"), [keys.STEP_TIME]],
    "gauge": [
        [keys.KL_K3_MEAN, *KL_AS_LOGGED],
        _difference("kl_k3"),
        _difference("abs_log_ratio"),
        _difference("ratio_outside_fraction"),
        [keys.ENGINE_KL_K3_MEAN, keys.DRIFT_KL_K3_MEAN],
        [keys.ABS_LOG_RATIO_MEAN, *ABS_AS_LOGGED],
    ],
}


def test_workspace_model_builds_offline_with_expected_panels():
    spec = workspace_spec(build_workspace("ent", "proj"))
    assert spec["entity"] == "ent" and spec["project"] == "proj"
    section = spec["spec"]["section"]
    sections = section["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == list(EXPECTED)
    for s in sections:
        configs = [p["config"] for p in s["panels"]]
        assert [c["metrics"] for c in configs] == EXPECTED[s["name"]]
        assert all(p["viewType"] == "Run History Line Plot" for p in s["panels"])
        assert all(c["xAxis"] == keys.WANDB_STEP_METRIC and c["groupBy"] == "group" for c in configs)
    assert section["settings"]["xAxis"] == keys.WANDB_STEP_METRIC
    assert section["runSets"][0]["grouping"] == [{"section": "run", "name": "group"}]


def test_report_model_builds_with_only_the_project_lookup_patched():
    from wandb_workspaces.reports.v2 import gql
    from wandb_workspaces.reports.v2 import interface as wri

    calls = []

    def lookup(api, query, variables):
        assert query is gql.projectInternalId, "only the project-id lookup may reach the API"
        calls.append(variables)
        return {"project": {"internalId": "UHJvamVjdDox"}}

    report = build_report("ent", "proj", ["megatron0001", "miles0000002"], summary="Equally on-policy: test.")
    with mock.patch.object(wri, "_get_api", lambda: None), mock.patch.object(wri, "execute_graphql", lookup):
        spec = report_spec(report)
    assert calls and all(c == {"entityName": "ent", "projectName": "proj"} for c in calls)
    grids = [b for b in spec["spec"]["blocks"] if b["type"] == "panel-grid"]
    assert len(grids) == len(EXPECTED)
    metrics = [
        p["config"]["metrics"] for g in grids for p in g["metadata"]["panelBankSectionConfig"]["panels"]
    ]
    assert metrics == [m for section in EXPECTED.values() for m in section]
    runset = grids[0]["metadata"]["runSets"][0]
    assert runset["project"] == {"name": "proj", "entityName": "ent", "id": "UHJvamVjdDox"}
    chosen = runset["filters"]["filters"]  # the compared runs or the comparison's run
    assert chosen[0]["value"] == ["megatron0001", "miles0000002"]
    assert chosen[1]["key"]["name"] == "group" and chosen[1]["value"] == "comparison"
    assert chosen[1]["connector"] == "OR"
    assert runset["grouping"] == [{"section": "run", "name": "group"}]
    texts = json.dumps(spec["spec"]["blocks"])
    assert "Equally on-policy: test." in texts


def test_panels_wandb_command_writes_specs_offline(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "specs.json"
    assert (
        main(
            ["panels", "wandb", "--entity", "ent", "--project", "proj", "--runs", "a", "b", "--out", str(out)]
        )
        == 0
    )
    assert "wrote workspace and report specs" in capsys.readouterr().out
    specs = json.loads(out.read_text())
    assert set(specs) >= {"workspace", "report"}
    names = [s["name"] for s in specs["workspace"]["spec"]["section"]["panelBankConfig"]["sections"]]
    assert names == list(EXPECTED)


LOG_TO_WANDB = """
import sys
from tests._compare_fixtures import megatron_vs_miles
from tests.test_panels import _runset
from cliptrack.compare import compare
from cliptrack.compare.views.wandb_panels import log_comparison

runset = _runset(*megatron_vs_miles(miles_clip_p=0.15))
print(log_comparison(runset, compare(runset), project="cliptrack-tests", directory=sys.argv[1]))
"""


def test_comparison_logged_to_wandb_offline_holds_the_difference_panels_data(tmp_path):
    """The comparison's W&B run (real wandb, offline) holds, at each segment's first and last step,
    the difference, its interval and the margin the difference panels plot. Logged in a process of
    its own: W&B writes the file completely by the time that process exits (``finish`` alone
    returns before a shared wandb-core has written it)."""
    import subprocess
    import sys

    from cliptrack.backends.wandb._compat import history_rows

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONPATH": str(root)}
    env.pop("WANDB_SERVICE", None)
    proc = subprocess.run(
        [sys.executable, "-c", LOG_TO_WANDB, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    (wandb_file,) = run_dir.glob("run-*.wandb")
    rows = [r for r in history_rows(wandb_file) if "difference/clip_fraction" in r]
    runset = _runset(*megatron_vs_miles(miles_clip_p=0.15))
    d = compare(runset).difference("clip_fraction")
    segments = sorted(d.segments, key=lambda s: s.start)
    assert segments
    assert [r[keys.WANDB_STEP_METRIC] for r in rows] == [x for s in segments for x in (s.start, s.end)]
    for row, s in zip(rows, [s for s in segments for _ in (0, 1)], strict=True):
        assert row["difference/clip_fraction"] == s.estimate.value
        assert row["difference/clip_fraction:low"] == s.estimate.low
        assert row["difference/clip_fraction:high"] == s.estimate.high
        assert (
            row["difference/clip_fraction:margin_high"]
            == d.tolerance
            == -row["difference/clip_fraction:margin_low"]
        )


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    megatron, miles = megatron_vs_miles(miles_clip_p=0.15)
    ids = [write_mlflow(uri, megatron), write_mlflow(uri, miles)]
    return uri, ids


def test_mlflow_comparison_run(mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, ids = mlflow_store
    runset = load_runs(ids, tracking_uri=uri)
    result = compare(runset)
    run_id = log_comparison(runset, result, tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    tags = run.data.tags
    assert tags[keys.TAG_RUN_KIND] == "comparison"
    assert tags[keys.TAG_COMPARED_RUNS] == ",".join(ids)
    assert tags[keys.TAG_VERDICT] == "different" == result.on_policy_verdict
    assert tags[f"{keys.TAG_VERDICT}.clip_fraction"] == "different"
    assert tags["mlflow.note.content"] == markdown_lines(result.summary())  # the summary, as markdown
    # its own experiment, named after the compared runs' experiment, artifacts beside the store
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "cliptrack-tests-comparisons"
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.info.artifact_uri.startswith(
        (Path(uri.removeprefix("sqlite:///")).parent / "comparison-artifacts").as_uri()
    )
    d = result.difference("clip_fraction")
    # the numbers are metrics too (step 0), named apart from every training series
    assert run.data.metrics["clip_fraction.difference"] == pytest.approx(d.estimate.value, rel=1e-12)
    assert run.data.metrics["clip_fraction.paired_units"] == d.estimate.n_units
    assert not set(run.data.metrics) & set(client.get_run(ids[0]).data.metrics)
    params = run.data.params
    clip = next(q for q in result.quantities if q.name == "clip_fraction")
    assert params["align"] == "step" and params["tolerance.clip_fraction"] == f"{clip.margin:g} {clip.scale}"
    assert params["abs_tolerance.clip_fraction"] == f"{clip.abs_margin:g}"
    assert float(params["clip_fraction.difference"]) == pytest.approx(d.estimate.value, rel=1e-5)
    assert float(params["clip_fraction.ess"]) == pytest.approx(d.estimate.ess, rel=1e-5)
    assert params["clip_fraction.verdict"] == "different" and params["min_units"] == "100"
    for compared in ids:
        assert run_id in client.get_run(compared).data.tags[keys.TAG_COMPARED_IN].split(",")
    listed = {a.path for a in client.list_artifacts(run_id)} | {
        a.path for a in client.list_artifacts(run_id, "figures")
    }
    assert {"comparison.csv", "comparison.md", "comparison.json", "dashboard.html"} <= listed
    assert {f"figures/{panel.id}.png" for panel in PANELS} <= listed  # the one panel list
    saved = json.loads(open(client.download_artifacts(run_id, "comparison.json", str(tmp_path))).read())
    assert saved == result.to_dict()
    local = client.download_artifacts(run_id, "figures/clip.png", str(tmp_path))
    with open(local, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    # the comparison run is not itself loaded as a training run of the experiment
    again = load_runs([], tracking_uri=uri, experiment="cliptrack-tests")
    assert sorted(i.run.run_id for i in again.runs) == sorted(ids)


def test_mlflow_comparison_run_of_stacks_over_seeds(tmp_path):
    """A grouped comparison's run holds the stacks' numbers: per quantity the difference over seeds,
    its interval, seeds per stack, P(b > a), the seed means, and a verdict tag per quantity."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    seeds = {
        "megatron": [synthetic_run(f"m{i}", f"m{i}", "megatron", seed=i) for i in range(3)],
        "miles": [synthetic_run(f"l{i}", f"l{i}", "miles", seed=10 + i, clip_p=0.2) for i in range(3)],
    }
    runset = _runset(*[r for group in seeds.values() for r in group])
    result = compare(runset, groups={name: [r.run_name for r in runs] for name, runs in seeds.items()})
    run = MlflowClient(tracking_uri=uri).get_run(log_comparison(runset, result, tracking_uri=uri))
    metrics, tags = run.data.metrics, run.data.tags
    g = result.group_difference("clip_fraction")
    assert tags[f"{keys.TAG_VERDICT}.clip_fraction.stacks"] == g.verdict == "different"
    assert metrics["clip_fraction.stacks.difference"] == pytest.approx(g.estimate.value, rel=1e-12)
    assert metrics["clip_fraction.stacks.ci_low"] < g.estimate.value < metrics["clip_fraction.stacks.ci_high"]
    assert metrics["clip_fraction.stacks.seeds_run"] == metrics["clip_fraction.stacks.seeds_reference"] == 3
    assert metrics["clip_fraction.stacks.probability_greater"] > 0.99
    # the seed means, from the points themselves: the ratio of sums of each seed, averaged
    for key, runs in (("reference_value", seeds["megatron"]), ("run_value", seeds["miles"])):
        per_seed = [
            sum(p.metrics[keys.CLIPPED_TOKENS] for p in r.points)
            / sum(p.metrics[keys.LOSS_TOKENS] for p in r.points)
            for r in runs
        ]
        assert metrics[f"clip_fraction.stacks.{key}"] == pytest.approx(np.mean(per_seed), rel=1e-9)


def test_panels_mlflow_command(mlflow_store, capsys, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, ids = mlflow_store
    artifacts = tmp_path / "chosen"
    assert (
        main(
            [
                "panels",
                "mlflow",
                "megatron-run",
                "miles-run",
                "--tracking-uri",
                uri,
                "--log-experiment",
                "elsewhere",
                "--artifact-dir",
                str(artifacts),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "comparison run:" in out and "Not equally on-policy" in out
    run_id = out.strip().rsplit(" ", 1)[-1]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "elsewhere"
    assert run.info.artifact_uri.startswith(artifacts.resolve().as_uri())
    assert list(artifacts.rglob("dashboard.html"))


def test_wandb_workspaces_version_is_checked():
    from cliptrack.compare.views import _wandb_workspaces as compat

    assert compat.check_version() == compat.installed_version()  # the installed one is supported
    low, high = compat.SUPPORTED
    assert compat.check_version(".".join(map(str, low))) == ".".join(map(str, low))
    for unsupported in (".".join(map(str, high)), "0.1.9", "1.0.0"):
        with pytest.raises(
            compat.UnsupportedVersionError, match=f"wandb-workspaces {unsupported} is not supported"
        ):
            compat.check_version(unsupported)


# --- the panel model: downsampling, difference panels, seed groups, shared x axis -------------------


def _reference_line(x, y, max_points):
    """Plain loops: bucket b holds points floor(b n / k) .. floor((b + 1) n / k) - 1, k = max_points // 2;
    each keeps its first lowest and first highest finite point in step order (two NaN when none)."""
    n = len(x)
    if n <= max_points:
        return list(x), list(y)
    k = max_points // 2
    out_x, out_y = [], []
    for b in range(k):
        lo_i = hi_i = None
        for i in range((b * n) // k, ((b + 1) * n) // k):
            if math.isfinite(y[i]):
                if lo_i is None or y[i] < y[lo_i]:
                    lo_i = i
                if hi_i is None or y[i] > y[hi_i]:
                    hi_i = i
        if lo_i is None:
            start = (b * n) // k
            out_x += [x[start], x[start]]
            out_y += [math.nan, math.nan]
            continue
        for i in sorted((lo_i, hi_i)):
            out_x.append(x[i])
            out_y.append(y[i])
    return out_x, out_y


values = st.one_of(st.floats(-1e6, 1e6), st.just(math.nan), st.just(math.inf))


sized = st.integers(0, 300).flatmap(lambda n: st.lists(values, min_size=n, max_size=n))


@settings(max_examples=40)
@given(sized, st.integers(2, 40))
def test_downsampled_line_keeps_each_buckets_extremes(ys, max_points):
    from cliptrack.compare.views import downsample

    x = [float(i * 3) for i in range(len(ys))]
    ys = [v if v != math.inf else math.nan for v in ys]  # non-finite values are gaps
    got_x, got_y = downsample.line(np.array(x), np.array(ys), max_points)
    want_x, want_y = _reference_line(x, ys, max_points)
    assert len(got_x) <= max(max_points, len(x))
    assert got_x.tolist() == want_x
    np.testing.assert_array_equal(got_y, np.array(want_y, dtype=float))


@settings(max_examples=40)
@given(
    st.integers(1, 300).flatmap(lambda n: st.lists(st.tuples(values, values), min_size=n, max_size=n)),
    st.integers(2, 40),
)
def test_downsampled_band_covers_the_full_band(edges, max_points):
    from cliptrack.compare.views import downsample

    low = np.array([a for a, _ in edges], dtype=float)
    high = np.array([b for _, b in edges], dtype=float)
    x = np.arange(len(edges), dtype=float)
    bx, blo, bhi = downsample.band(x, low, high, max_points)
    assert len(bx) <= max_points
    if len(edges) <= max_points:
        np.testing.assert_array_equal(blo, low)
        return
    k, n = max_points // 2, len(edges)
    for b in range(k):
        rows = range((b * n) // k, ((b + 1) * n) // k)
        assert bx[b] == x[rows[0]]
        finite_lo = [low[i] for i in rows if math.isfinite(low[i])]
        finite_hi = [high[i] for i in rows if math.isfinite(high[i])]
        assert (blo[b] == min(finite_lo)) if finite_lo else math.isnan(blo[b])
        assert (bhi[b] == max(finite_hi)) if finite_hi else math.isnan(bhi[b])


def test_downsampling_refuses_mismatched_input():
    from cliptrack.compare.views import downsample

    with pytest.raises(ValueError, match="x and y differ in length: 3 x values, 2 y values"):
        downsample.line(np.zeros(3), np.zeros(2))
    with pytest.raises(ValueError, match="max_points must be at least 2, got 1"):
        downsample.band(np.zeros(3), np.zeros(3), np.zeros(3), 1)


@given(st.floats(-1e7, 1e7), st.floats(1e-3, 1e7))
@example(5e-324, 9.0)  # lo / step underflows to 0: the first tick must still be at or above lo
def test_nice_ticks(lo, width):
    from cliptrack.compare.views.plots import nice_ticks

    hi = lo + width
    first, step = nice_ticks(lo, hi)
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5, 10))
    assert first >= lo - 1e-9 * abs(lo) and first - step < lo
    assert 3 <= (hi - first) / step + 1 <= 17  # about 8 ticks over the range


def _runset(*runs):
    return RunSet.from_points(
        [(LoadedRun(RunInfo(r.run_id, r.run_name, r.backend, r.config), "test"), r.points) for r in runs]
    )


def test_every_compared_quantity_has_a_difference_panel_and_a_new_one_is_one_entry():
    from cliptrack.compare.quantities import QUANTITIES
    from cliptrack.compare.views.panels import DIFFERENCE, Shown, difference_panels

    compared = [q.name for q in QUANTITIES if q.verdict]
    assert sorted(p.quantity for p in PANELS if p.kind == DIFFERENCE) == sorted(compared)
    (new,) = difference_panels([Shown("entropy", "Entropy", False)])
    assert new.kind == DIFFERENCE and new.id == "entropy_difference" and new.section == "differences"
    assert new.wandb_keys == [
        "difference/entropy",
        "difference/entropy:low",
        "difference/entropy:high",
        "difference/entropy:margin_low",
        "difference/entropy:margin_high",
    ]


def test_difference_panel_draws_the_result():
    """Run b clips +10 pp more during steps 600-659 of 1200: the panel draws every segment of the
    result with its interval, shades the differing ones, and draws the margin and the average. The
    whole window decides the verdict (equivalent); the short episode is shaded, not the verdict."""
    from cliptrack.compare.stats import DIFFERENT, EQUIVALENT
    from cliptrack.compare.views.plots import BAND, HLINE, LINE, SPAN, panel_figures

    a = synthetic_run("a", "a", "megatron", seed=1, n_steps=1200, clip_sd=0.003)
    b = synthetic_run("b", "b", "miles", seed=2, n_steps=1200, clip_sd=0.003)
    for p in b.points:
        if 600 <= p.step < 660:
            tokens = p.metrics[keys.LOSS_TOKENS]
            p.metrics[keys.CLIPPED_TOKENS] = min(tokens, p.metrics[keys.CLIPPED_TOKENS] + round(0.1 * tokens))
            p.metrics[keys.CLIP_FRACTION] = p.metrics[keys.CLIPPED_TOKENS] / tokens
    runset = _runset(a, b)
    result = compare(runset)
    figs = {f.panel.id: f for f in panel_figures(runset, result)}
    assert len({f.x_range for f in figs.values()}) == 1  # one x range for every panel
    assert figs["clip"].x_range == (0.0, 1199.0)
    fig = figs["clip_fraction_difference"]
    d = result.difference("clip_fraction")
    assert d.verdict == EQUIVALENT and len(d.segments) >= 2
    assert [s.verdict for s in d.segments].count(DIFFERENT) >= 1
    segments = sorted(d.segments, key=lambda s: s.start)
    # each segment held from its first step until the next segment's first step (the last: its end)
    edges = [(s.start, t.start) for s, t in zip(segments, segments[1:], strict=False)]
    edges.append((segments[-1].start, segments[-1].end))
    band = next(t for t in fig.traces if t.kind == BAND)
    assert band.x.tolist() == [x for edge in edges for x in edge]
    # on the log-ratio scale every y is a ratio run / reference: exp of the log-ratio difference
    np.testing.assert_allclose(band.y, [math.exp(s.estimate.high) for s in segments for _ in (0, 1)])
    np.testing.assert_allclose(band.y2, [math.exp(s.estimate.low) for s in segments for _ in (0, 1)])
    step_line, whole = (t for t in fig.traces if t.kind == LINE)
    np.testing.assert_allclose(step_line.y, [math.exp(s.estimate.value) for s in segments for _ in (0, 1)])
    assert np.allclose(whole.y, math.exp(d.estimate.value)) and tuple(whole.x) == fig.x_range
    spans = [tuple(t.x) for t in fig.traces if t.kind == SPAN]
    assert spans == [edge for edge, s in zip(edges, segments, strict=True) if s.verdict == DIFFERENT]
    assert any(lo < 660 and hi >= 600 for lo, hi in spans)  # the differing steps are shaded
    assert all(not (hi < 600 or lo >= 660) for lo, hi in spans)  # and nothing else
    margins = sorted(float(t.y[0]) for t in fig.traces if t.kind == HLINE and t.dash == "dash")
    assert np.allclose(margins, [1 / 1.25, 1.25])  # the ±25 % margin, as ratios
    # both runs clip well away from zero: the relative margin, on the log-ratio scale, drawn as ratios
    assert d.scale == "log-ratio" and fig.ratio and fig.y_title == "run / reference (log scale)"
    assert not fig.percent and fig.segmented and "over training" in fig.title
    assert figs["throughput_difference"].y_title == "run / reference (log scale)"


def test_seed_groups_draw_each_seed_and_the_groups_mean_and_spread():
    from cliptrack.compare.views.plots import BAND, LINE, panel_figures

    seeds = {
        "megatron": [synthetic_run(f"m{i}", f"m{i}", "megatron", seed=i) for i in range(3)],
        "miles": [synthetic_run(f"l{i}", f"l{i}", "miles", seed=10 + i, clip_p=0.12) for i in range(3)],
    }
    runset = _runset(*[r for group in seeds.values() for r in group])
    result = compare(runset, groups={name: [r.run_name for r in runs] for name, runs in seeds.items()})
    fig = next(f for f in panel_figures(runset, result) if f.panel.id == "reward")
    for color_index, (name, runs) in enumerate(seeds.items()):
        group = f"{name} (3 seeds)"
        mine = [t for t in fig.traces if t.group == group]
        lines = [t for t in mine if t.kind == LINE]
        thin, (mean,) = [t for t in lines if not t.name], [t for t in lines if t.name]
        assert len(thin) == 3 and all(t.width < mean.width for t in thin)  # each seed, thin
        assert mean.name == f"{group}: mean ± sd over seeds"  # one legend entry per group
        (band,) = [t for t in mine if t.kind == BAND]
        per_step = np.array([[p.metrics["reward:mean"] for p in r.points] for r in runs])
        np.testing.assert_allclose(mean.y, per_step.mean(axis=0))
        sd = per_step.std(axis=0, ddof=1)
        np.testing.assert_allclose(band.y2, per_step.mean(axis=0) - sd)
        np.testing.assert_allclose(band.y, per_step.mean(axis=0) + sd)
        assert {t.color for t in mine} == {PALETTE[color_index]}
    diff = next(f for f in panel_figures(runset, result) if f.panel.id == "clip_fraction_difference")
    g = result.group_difference("clip_fraction")
    if len(g.segments) > 1:  # the stacks' difference per segment across seeds, as ratios
        step = next(t for t in diff.traces if t.kind == LINE and t.name.endswith("per segment"))
        segments = sorted(g.segments, key=lambda s: s.start)
        np.testing.assert_allclose(step.y, [math.exp(s.estimate.value) for s in segments for _ in (0, 1)])
        assert diff.segmented
    else:  # the whole window's difference over seeds alone
        (band,) = [t for t in diff.traces if t.kind == BAND]
        assert np.allclose(band.y, math.exp(g.estimate.high))
        assert np.allclose(band.y2, math.exp(g.estimate.low))
        assert not diff.segmented and "over training" not in diff.title


def test_long_runs_are_downsampled_for_drawing_only():
    from cliptrack.compare.views import downsample
    from cliptrack.compare.views.plots import MARKERS, panel_figures

    n = 3 * downsample.MAX_POINTS
    a = synthetic_run("a", "a", "megatron", seed=1, n_steps=n)
    b = synthetic_run("b", "b", "miles", seed=2, n_steps=n, clip_p=0.2)
    runset = _runset(a, b)
    result = compare(runset)
    figs = panel_figures(runset, result)
    assert all(len(t.x) <= downsample.MAX_POINTS for f in figs for t in f.traces)
    clip = next(f for f in figs if f.panel.id == "clip")
    markers = [t for t in clip.traces if t.kind == MARKERS]
    highest = max(p.metrics["clipped_tokens:sum"] / p.metrics["loss_tokens:sum"] for p in b.points)
    assert max(float(np.nanmax(t.y)) for t in markers) == highest  # the most clipped step is drawn
    assert result.difference("clip_fraction").estimate.n_units == n  # the numbers use every step


def test_matplotlib_draws_what_the_dashboard_draws():
    """The MLflow figures' and the notebook's drawer: every panel, the shared x range and ticks,
    one shaded span per differing segment, the margin in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    from cliptrack.compare.views.plots import SPAN, panel_figures
    from cliptrack.compare.views.plots_matplotlib import draw_all

    runset = _runset(*megatron_vs_miles(miles_clip_p=0.15))
    result = compare(runset)
    figs = draw_all(runset, result)
    assert list(figs) == [p.id for p in PANELS]
    axes = {k: f.axes[0] for k, f in figs.items()}
    assert {ax.get_xlim() for ax in axes.values()} == {(0.0, 199.0)}
    assert len({tuple(ax.get_xticks()) for ax in axes.values()}) == 1
    model = {f.panel.id: f for f in panel_figures(runset, result)}
    spans = [t for t in model["clip_fraction_difference"].traces if t.kind == SPAN]
    assert spans and len(axes["clip_fraction_difference"].patches) == len(spans)
    labels = [t.get_text() for t in axes["clip_fraction_difference"].get_legend().get_texts()]
    d = result.difference("clip_fraction")
    assert d.scale == "log-ratio"
    assert "± margin 25 %" in labels  # the default, drawn as ratios ×1.25 and ×0.8
    assert "miles-run − megatron-run per segment" in labels
    import matplotlib.pyplot as plt

    for f in figs.values():
        plt.close(f)
