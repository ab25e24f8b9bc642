"""Runs logged by Miles' own tracker and by verl load into the same frame as cliptrack's own runs.

Each run is written by the library that would write it: cliptrack's ``Tracker``; Miles' own
``tracking_utils`` and ``log_train_step`` (from the released ``miles-rl`` source), whose MLflow
backend rewrites ``:`` to ``_`` and whose W&B backend plots ``train/*`` against ``train/step``;
and ``wandb`` / ``mlflow`` called as verl's tracker calls them (``wandb.log(data, step=step)``,
``mlflow.log_metrics(data, step=step)``). Our own keys passed through Miles' tracker read back
exactly; Miles' ``pg_clipfrac`` and verl's ``actor/pg_clipfrac`` (means of per-sample or
per-micro-batch means) read back as approximate clip fractions.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest
from cliptrack import Tracker
from cliptrack.backends import load_runs
from cliptrack.core import keys
from cliptrack.store.aliases import canonical_metrics
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

STEPS = 5
COUNTS = [(120, 30, 18, 12), (100, 12, 5, 7), (90, 0, 0, 0), (130, 26, 20, 6), (110, 11, 1, 10)]
"""(loss_tokens, clipped, low, high) per step."""
OURS = ("ours", "miles-exact")
GAUGE = [
    (-4.5, 9.25, 0.75, 3, 118.5, 121.25, 0.5, -1.25),
    (2.0, 6.5, 0.375, 0, 102.0, 104.5, 0.25, -0.5),
    (0.0, 0.0, 0.0, 0, 90.0, 90.0, 0.0, 0.0),
    (-13.0, 20.0, 2.5, 7, 117.0, 140.0, 1.0, -2.0),
    (1.5, 3.5, 0.125, 1, 111.5, 113.0, 0.125, -0.25),
]
"""The gauge per step, in the order of cliptrack.core.keys.GAUGE_MEASURED_KEYS."""
STOCK_MISMATCH = {"train_rollout_logprob_abs_diff": 0.05, "train_rollout_kl": 0.002}
"""Miles' stock mismatch metrics at step 0 (each grows by its own value per step)."""
VERL_MISMATCH = {"rollout_corr/k3_kl": 0.003, "rollout_corr/kl": -0.001}


def our_metrics(step: int) -> dict[str, float]:
    loss_tokens, clipped, low, high = COUNTS[step]
    return {
        keys.LOSS_SUM: -3.5 + step,
        keys.LOSS_TOKENS: loss_tokens,
        keys.CLIPPED_TOKENS: clipped,
        keys.CLIPPED_LOW_TOKENS: low,
        keys.CLIPPED_HIGH_TOKENS: high,
        keys.CLIP_FRACTION: clipped / loss_tokens,
        keys.REWARD: 0.1 * step,
        **dict(zip(keys.GAUGE_MEASURED_KEYS, GAUGE[step], strict=True)),
        keys.ABS_LOG_RATIO_MEAN: GAUGE[step][1] / loss_tokens,
        keys.KL_K3_MEAN: GAUGE[step][2] / loss_tokens,
    }


def mismatch(values: dict[str, float], step: int) -> dict[str, float]:
    return {name: value * (step + 1) for name, value in values.items()}


def _miles_args(tmp_path: Path, uri: str, name: str) -> Namespace:
    return Namespace(
        use_wandb=True,
        wandb_mode="offline",
        wandb_key=None,
        wandb_host=None,
        wandb_random_suffix=False,
        wandb_group=name,
        wandb_team=None,
        wandb_project="aliases",
        wandb_dir=str(tmp_path / "wandb-miles"),
        rank=0,
        env_report=None,
        use_mlflow=True,
        mlflow_tracking_uri=uri,
        mlflow_experiment_name="aliases",
        mlflow_run_name=name,
        use_tensorboard=False,
        use_prometheus=False,
    )


@pytest.fixture(scope="module")
def stores(tmp_path_factory, monkeypatch_module):
    import mlflow
    import wandb

    from tests._miles_source import MilesUnavailable, import_miles

    try:
        miles = import_miles()
        import importlib

        miles_tracking = importlib.import_module("miles.utils.tracking_utils")
    except (MilesUnavailable, ImportError) as exc:
        pytest.skip(f"Miles' tracker source is not obtainable here: {exc}")
    tmp_path = tmp_path_factory.mktemp("aliases")
    monkeypatch_module.setenv("WANDB_MODE", "offline")
    monkeypatch_module.setenv("WANDB_SILENT", "true")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    previous_uri = mlflow.get_tracking_uri()
    try:
        # cliptrack's own run
        with Tracker(
            "ours",
            sinks=[uri, "wandb"],
            experiment="aliases",
            spool_dir=tmp_path / "spool",
            sink_options={"wandb": {"project": "aliases", "dir": tmp_path / "wandb-ours", "mode": "offline"}},
            handle_signals=False,
        ) as tracker:
            for step in range(STEPS):
                tracker.log(step, our_metrics(step))
        # Miles' own tracker: our keys, then Miles' stock pg_clipfrac
        for name in ("miles-exact", "miles-stock"):
            args = _miles_args(tmp_path, uri, name)
            miles_tracking.init_tracking(args)
            for step in range(STEPS):
                if name == "miles-exact":
                    loss_dict = our_metrics(step)
                else:  # a mean of per-sample clip fractions, as Miles' per-sample-mean mode logs it
                    loss_dict = {"pg_clipfrac": 0.2 + 0.01 * step, "loss": 0.5}
                    loss_dict.update(mismatch(STOCK_MISMATCH, step))
                miles.log_utils.log_train_step(
                    args,
                    loss_dict,
                    grad_norm=1.0,
                    rollout_id=step,
                    step_id=0,
                    num_steps_per_rollout=1,
                    should_log=True,
                )
            miles_tracking.finish_tracking()
        # verl's tracker: wandb.log(data, step=step) and mlflow.log_metrics(data, step=step)
        verl = {
            step: {
                "actor/pg_clipfrac": 0.3 - 0.01 * step,
                "actor/pg_clipfrac_lower": 0.001 * step,
                "critic/score/mean": 0.1 * step,
                "actor/ppo_kl": 0.01,
                **mismatch(VERL_MISMATCH, step),
            }
            for step in range(STEPS)
        }
        run = wandb.init(project="aliases", name="verl", dir=str(tmp_path / "wandb-verl"), mode="offline")
        for step, data in verl.items():
            wandb.log(data, step=step)
        run.finish()
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("aliases")
        with mlflow.start_run(run_name="verl"):
            for step, data in verl.items():
                mlflow.log_metrics(data, step=step)
    finally:
        mlflow.set_tracking_uri(previous_uri)
    return tmp_path, uri


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _series(runs, name: str) -> dict[tuple[int, str], float]:
    """A run's (step, metric) -> value for our keys, with its tokens_seen per step."""
    frame = runs.frame[(runs.frame.run == runs.info(name).display)]
    ours = set(our_metrics(0))
    rows = frame[frame.metric.isin(ours)]
    values = {(int(r.step), r.metric): float(r.value) for r in rows.itertuples()}
    values.update({(int(r.step), "tokens_seen"): float(r.tokens_seen) for r in rows.itertuples()})
    return values


def _check(runs) -> None:
    expected = {(step, key): float(v) for step in range(STEPS) for key, v in our_metrics(step).items()}
    for name in OURS:
        got = _series(runs, name)
        assert {k: v for k, v in got.items() if k[1] != "tokens_seen"} == expected, name
        assert got == _series(runs, "ours"), name  # same frame, tokens_seen included
        assert runs.info(name).approximate == ()
    stock = runs.info("miles-stock")
    assert stock.approximate == (keys.ABS_LOG_RATIO_MEAN, keys.CLIP_FRACTION, keys.KL_K3_MEAN)
    verl = runs.info("verl")
    assert verl.approximate == (keys.CLIP_FRACTION, keys.DUAL_CLIP_FRACTION, keys.KL_K1, keys.KL_K3_MEAN)
    verl_rows = runs.frame[runs.frame.run == verl.display]
    by_key = {(int(r.step), r.metric): r.value for r in verl_rows.itertuples()}
    for step in range(STEPS):
        assert by_key[step, keys.CLIP_FRACTION] == pytest.approx(0.3 - 0.01 * step)
        assert by_key[step, keys.REWARD] == pytest.approx(0.1 * step)
        assert by_key[step, keys.DUAL_CLIP_FRACTION] == pytest.approx(0.001 * step)
        assert by_key[step, keys.KL_K3_MEAN] == pytest.approx(0.003 * (step + 1))
        assert by_key[step, keys.KL_K1] == pytest.approx(-0.001 * (step + 1))
        for name in ("actor/pg_clipfrac", *VERL_MISMATCH):
            assert (step, name) not in by_key
    stock_rows = runs.frame[runs.frame.run == stock.display]
    assert sorted(stock_rows[stock_rows.metric == keys.CLIP_FRACTION].step) == list(range(STEPS))
    by_key = {(int(r.step), r.metric): r.value for r in stock_rows.itertuples()}
    for step in range(STEPS):  # Miles' own mismatch metrics, through Miles' own log_train_step
        assert by_key[step, keys.ABS_LOG_RATIO_MEAN] == pytest.approx(0.05 * (step + 1))
        assert by_key[step, keys.KL_K3_MEAN] == pytest.approx(0.002 * (step + 1))


def test_mlflow_runs_of_miles_and_verl_load_as_our_keys(stores):
    _, uri = stores
    runs = load_runs(["ours", "miles-exact", "miles-stock", "verl"], tracking_uri=uri)
    names = {info.run.run_name for info in runs.runs}
    assert names == {"ours", "miles-exact", "miles-stock", "verl"}
    _check(runs)


def test_wandb_offline_runs_of_miles_and_verl_load_as_our_keys(stores):
    tmp_path, _ = stores
    for directory in ("wandb-ours", "wandb-miles", "wandb-verl"):
        assert list((tmp_path / directory).rglob("*.wandb")), directory
    import shutil

    merged = tmp_path / "wandb-all"
    for directory in ("wandb-ours", "wandb-miles", "wandb-verl"):
        shutil.copytree(tmp_path / directory, merged / directory)
    runs = load_runs(wandb_dir=merged)
    assert {info.run.run_name for info in runs.runs} == {"ours", "miles-exact", "miles-stock", "verl"}
    _check(runs)


def test_miles_custom_loss_entries_read_back_as_exact_counts():
    """``cliptrack.adapters.miles.custom_loss``'s entries as Miles logs them (scaled, per-token mode)."""
    scale = 0.375  # G * cp / N for some step
    logged = {
        "train/loss_tokens": 120 * 32 * scale,
        "train/clipped_tokens": 30 * 32 * scale,
        "train/clipped_low_tokens": 18 * 32 * scale,
        "train/clipped_high_tokens": 12 * 32 * scale,
        "train/count_scale": 32 * scale,
        "train/pg_clipfrac": 0.24,
        "train/grad_norm": 1.0,
    }
    got = canonical_metrics(logged)
    assert got.metrics[keys.LOSS_TOKENS] == 120 and got.metrics[keys.CLIPPED_TOKENS] == 30
    assert got.metrics[keys.CLIP_FRACTION] == 30 / 120  # from the counts, not Miles' pg_clipfrac
    assert got.approximate == frozenset()
    assert got.metrics["train/grad_norm"] == 1.0  # other names are kept


def test_miles_custom_loss_gauge_entries_read_back_as_our_sums_and_means():
    """The gauge's scaled entries: each over ``count_scale`` is our sum, the means formed from
    them (not from Miles' own approximate mismatch metrics logged beside them)."""
    scale = 0.375
    gauge = dict(zip(keys.GAUGE_MEASURED_KEYS, GAUGE[3], strict=True))
    logged = {
        "train/loss_tokens": 130 * 32 * scale,
        "train/count_scale": 32 * scale,
        "train/train_rollout_logprob_abs_diff": 0.9,
        "train/train_rollout_kl": 0.8,
        **{f"train/{name}": gauge[key] * 32 * scale for name, key in _GAUGE_ENTRIES.items()},
    }
    got = canonical_metrics(logged)
    for name, key in _GAUGE_ENTRIES.items():
        assert got.metrics[key] == pytest.approx(gauge[key], rel=1e-15), name
    assert got.metrics[keys.RATIO_OUTSIDE_TOKENS] == 7  # a count: rounded to the token
    assert got.metrics[keys.ABS_LOG_RATIO_MEAN] == pytest.approx(20.0 / 130, rel=1e-15)
    assert got.metrics[keys.KL_K3_MEAN] == pytest.approx(2.5 / 130, rel=1e-15)
    assert got.approximate == frozenset()
    assert keys.LOG_RATIO_MAX not in got.metrics  # extremes do not survive Miles' summing: absent


_GAUGE_ENTRIES = {
    "log_ratio": keys.LOG_RATIO_SUM,
    "abs_log_ratio": keys.ABS_LOG_RATIO_SUM,
    "kl_k3": keys.KL_K3_SUM,
    "ratio_outside_tokens": keys.RATIO_OUTSIDE_TOKENS,
    "is_weight": keys.IS_WEIGHT_SUM,
    "is_weight_sq": keys.IS_WEIGHT_SQ_SUM,
}
"""custom_loss's gauge entries, written out (not read from the table under test)."""


def test_foreign_mismatch_metrics_alone_are_approximate_and_ours_win():
    got = canonical_metrics({"rollout_corr/k3_kl": 0.01, "rollout_corr/kl": -0.002})
    assert got.metrics == {keys.KL_K3_MEAN: 0.01, keys.KL_K1: -0.002}
    assert got.approximate == {keys.KL_K3_MEAN, keys.KL_K1}
    ours = canonical_metrics({"rollout_corr/k3_kl": 0.01, keys.KL_K3_SUM: 3.0, keys.LOSS_TOKENS: 100.0})
    assert ours.metrics[keys.KL_K3_MEAN] == 0.03 and ours.approximate == frozenset()


def test_an_approximate_clip_fraction_is_marked_in_table_dashboard_and_json(stores, tmp_path):
    import json

    from cliptrack.compare import compare
    from cliptrack.compare.report import formatted_table
    from cliptrack.compare.views.dashboard import write_dashboard

    _, uri = stores
    runs = load_runs(["ours", "verl"], tracking_uri=uri)
    result = compare(runs)
    clip = {e.run: e for e in result.estimates if e.metric == "clip_fraction"}
    assert clip["verl"].approximate and not clip["ours"].approximate
    # verl logged no counts: its value is the mean of its logged fraction over the steps
    assert clip["verl"].estimate.value == pytest.approx(sum(0.3 - 0.01 * s for s in range(STEPS)) / STEPS)
    exact = sum(c[1] for c in COUNTS) / sum(c[0] for c in COUNTS)
    assert clip["ours"].estimate.value == pytest.approx(exact)  # a ratio of token sums, not flagged
    reward = {e.run: e for e in result.estimates if e.metric == "reward"}
    assert not reward["verl"].approximate
    assert result.difference("clip_fraction", "verl").approximate
    assert not result.difference("reward", "verl").approximate
    table = formatted_table(result)
    row = table[table.metric == "clip_fraction"].iloc[0]
    assert row["verl"].startswith("≈") and "approx." in row["verl"]
    assert not row["ours"].startswith("≈") and row["difference [CI]"].startswith("≈")
    assert not table[table.metric == "reward"].iloc[0]["verl"].startswith("≈")
    data = json.loads(result.to_json())
    flags = {(e["metric"], e["run"]): e["approximate"] for e in data["estimates"]}
    assert flags["clip_fraction", "verl"] is True and flags["clip_fraction", "ours"] is False
    assert any(n["warning"] and n["run"] == "verl" and "approximate" in n["text"] for n in data["notes"])
    html = write_dashboard(tmp_path / "dash.html", runs, result).read_text(encoding="utf-8")
    assert "≈" in html and "approx." in html


@given(
    counts=st.tuples(st.integers(1, 10**6), st.integers(0, 10**6)).map(lambda t: (t[0] + t[1], t[1])),
    sums=st.lists(st.floats(0, 1e6), min_size=5, max_size=5),
    log_ratio=st.floats(-1e6, 1e6),
    scale=st.floats(1e-3, 1e3),
    foreign=st.sets(st.sampled_from(sorted(STOCK_MISMATCH) + sorted(VERL_MISMATCH))),
)
def test_scaled_gauge_entries_read_back_over_any_scale_and_win_over_foreign_means(
    counts, sums, log_ratio, scale, foreign
):
    """Any count scale Miles' division may leave (``count_scale`` = samples x cp / N): the counts
    come back exactly, the float sums to a few roundings, the means from those sums, and a foreign
    approximate mean logged beside them never replaces one (nor is the run marked approximate)."""
    tokens, outside = counts
    abs_sum, kl, weight, weight_sq, _ = sums
    exact = {
        "log_ratio": log_ratio,
        "abs_log_ratio": abs_sum,
        "kl_k3": kl,
        "ratio_outside_tokens": outside,
        "is_weight": weight,
        "is_weight_sq": weight_sq,
    }
    logged = {f"train/{name}": value * scale for name, value in exact.items()}
    logged |= {"train/loss_tokens": tokens * scale, "train/count_scale": scale}
    logged |= {(f"train/{n}" if n in STOCK_MISMATCH else n): 0.5 for n in foreign}
    got = canonical_metrics(logged)
    assert got.metrics[keys.RATIO_OUTSIDE_TOKENS] == outside
    for name, key in _GAUGE_ENTRIES.items():
        assert got.metrics[key] == pytest.approx(exact[name], rel=1e-14, abs=1e-300), name
    assert got.metrics[keys.KL_K3_MEAN] == got.metrics[keys.KL_K3_SUM] / tokens
    assert got.metrics[keys.ABS_LOG_RATIO_MEAN] == got.metrics[keys.ABS_LOG_RATIO_SUM] / tokens
    assert got.approximate == ({keys.KL_K1} if "rollout_corr/kl" in foreign else frozenset())
