"""The live watch: its rule on planted series, its settings, and the tracker's alerts.

The rule (``cliptrack.compare.stats.watch``) is checked on simulated series from the comparison's
own generators (``research.simulation``): a planted jump is found within a bound, healthy
series stay under the stated false-alarm rate, and W&B's z-score filter on the same series does
not. The tracker's alerts go through real sinks: MLflow on a sqlite file, W&B offline (its real
local writer: the alert is a record of the run's ``.wandb`` file, which ``wandb sync`` would send;
no W&B server is involved, nothing is mocked) and the spool.
"""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest
from cliptrack.compare.stats import watch as rule
from cliptrack.log import watch as live
from cliptrack.log.tracker import NullTracker, Tracker
from hypothesis import given, settings
from hypothesis import strategies as st

from research import simulation as sim

KL = "kl_k3:mean"


def _alarms(x: np.ndarray, window: int = rule.WINDOW, **options: float) -> list[rule.Breach]:
    """The rule's breaches over ``x`` (values as logged), band from its first ``window`` points."""
    z = [rule.watched(float(v), "log") for v in x[:window]]
    cusum = rule.Cusum(rule.own_band([v for v in z if v is not None]), **options)  # type: ignore[arg-type]
    out = []
    for i in range(window, x.size):
        breach = cusum.update(i, float(x[i]))
        if breach is not None:
            out.append(breach)
    return out


def _kl(noise: np.ndarray) -> np.ndarray:
    """A mismatch KL around 1e-3 with ``noise`` on the log scale."""
    return 1e-3 * np.exp(noise)


# ---- the rule on planted series --------------------------------------------------------------------
@settings(deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    phi=st.floats(0.0, 0.5),
    factor=st.floats(2.0, 10.0),
    at=st.integers(150, 400),
)
def test_a_planted_jump_is_found_within_30_points(seed: int, phi: float, factor: float, at: int) -> None:
    rng = np.random.default_rng(seed)
    x = _kl(sim.ar1(rng, 1, 500, phi, 0.1)[0])
    x[at:] *= factor
    alarms = _alarms(x)
    if any(at - rule.COOLDOWN <= b.step < at for b in alarms):
        return  # the jump starts within an episode already alerted (rule.COOLDOWN)
    after = [b for b in alarms if b.step >= at]
    assert after, f"a jump x{factor:.2f} at {at} was never found"
    assert after[0].step - at <= 30
    assert after[0].direction == "up" and after[0].value == x[after[0].step]


@pytest.mark.parametrize(
    ("regime", "make"),
    [
        ("AR(1) phi=0.9", lambda rng: sim.ar1(rng, 20, 2000, 0.9, 0.2)),
        ("ARFIMA d=0.4", lambda rng: sim.arfima(rng, 20, 2000, 0.4, 0.2)),
        (
            "KL falling 100x",
            lambda rng: sim.ar1(rng, 20, 2000, 0.5, 0.2) - np.log(100) * np.arange(2000) / 2000,
        ),
    ],
)
def test_false_alarms_per_1000_healthy_steps_stay_at_most_1(regime, make) -> None:
    """Fixed seeds, 20 series of 2,000 points: the rule's rate at most 1 per 1,000 points, W&B's
    z-score filter (window 30, threshold 3) on the same values at least 5 (it assumes independence)."""
    series = _kl(make(np.random.default_rng(7)))
    ours = sum(len(_alarms(x)) for x in series)
    theirs = 0
    for x in series:
        z = rule.ZScoreFilter()
        theirs += sum(z.update(float(v)) for v in x)
    steps = series.shape[0] * (series.shape[1] - rule.WINDOW)
    assert 1000 * ours / steps <= 1.0, regime
    assert 1000 * theirs / (series.size) >= 5.0, regime


def test_a_fall_is_watched_only_where_asked() -> None:
    x = _kl(np.random.default_rng(3).normal(0, 0.1, 400))
    x[250:] /= 5
    assert not _alarms(x)
    (down,) = _alarms(x, direction="both")
    assert down.direction == "down" and 250 <= down.step <= 280


def test_values_without_a_log_are_skipped() -> None:
    cusum = rule.Cusum(rule.own_band([math.log(1e-3)] * 50 + [math.log(1.1e-3)] * 50))
    for step, value in enumerate([0.0, -1.0, math.nan, math.inf]):
        assert cusum.update(step, value) is None
    assert cusum.index == 0


def test_a_reference_run_sets_the_band() -> None:
    rng = np.random.default_rng(5)
    reference = _kl(sim.ar1(rng, 1, 300, 0.3, 0.1)[0]) * np.exp(-np.arange(300) / 300)
    band = rule.reference_band(list(range(300)), [math.log(v) for v in reference])
    watched = reference * np.exp(rng.normal(0, 0.05, 300))
    watched[200:] *= 3
    cusum = rule.Cusum(band)
    steps = [s for s in range(300) if cusum.update(s, float(watched[s])) is not None]
    assert steps and 200 <= steps[0] <= 210


def test_a_reference_band_recentres_after_an_alert_episode() -> None:
    """A run that stays 5x above its reference is alerted once (the band re-centres on it over the
    cooldown), and a further jump on top of that is alerted again."""
    rng = np.random.default_rng(8)
    reference = _kl(sim.ar1(rng, 1, 1000, 0.3, 0.1)[0])
    band = rule.reference_band(list(range(1000)), [math.log(v) for v in reference])
    watched = _kl(rng.normal(0, 0.1, 1000))
    watched[200:] *= 5
    watched[700:] *= 5
    cusum = rule.Cusum(band)
    steps = [s for s in range(1000) if cusum.update(s, float(watched[s])) is not None]
    assert len(steps) == 2 and 200 <= steps[0] <= 210 and 700 <= steps[1] <= 710, steps


@settings(deadline=None, max_examples=20, derandomize=True)
@given(seed=st.integers(0, 2**31 - 1), phi=st.floats(0.0, 0.6))
def test_the_bands_long_run_sd_is_never_far_above_the_truth_on_100_points(seed: int, phi: float) -> None:
    """Over 200 windows of 100 AR(1) points (marginal sd 1), the band's long-run sd (an upper bound)
    stays within 3 times the true long-run sd; the comparison's estimator with its persistence check
    reaches 6 times on such windows (about 40 times the variance)."""
    z = sim.ar1(np.random.default_rng(seed), 200, 100, phi, 1.0)
    t = np.arange(100.0)
    truth = math.sqrt((1 + phi) / (1 - phi))
    for row in z:
        residual = row - np.polyval(np.polyfit(t, row, 1), t)
        sd, point = rule.long_run_sd(residual, degree=1)
        assert point <= sd < 3.0 * truth


def test_a_kl_sinking_below_its_floor_stays_under_1_false_alarm_per_1000_steps() -> None:
    """A fresh sampler's KL (``benchmarks.watch.fresh_sampler``: sinking to 1e-12 and 0 with clusters
    of healthy bursts back to 1e-3-1e-2), read as ``log(x + floor)`` with the KL's floor (1e-5),
    stays at most 1 false alarm per 1,000 steps (20 fixed seeds, pooled)."""
    from cliptrack.compare.quantities import KL_FLOOR

    series = [_fresh(seed) for seed in range(20)]
    count = sum(len(_floor_alarms(x, KL_FLOOR)) for x in series)
    assert 1000 * count / sum(x.size - 100 for x in series) <= 1.0


def _fresh(seed: int, back_at: int | None = None) -> np.ndarray:
    """``fresh_sampler`` over 2,000 steps; from ``back_at`` on, the KL back at about 1e-3."""
    from benchmarks.watch import fresh_sampler

    rng = np.random.default_rng(seed)
    x = fresh_sampler(rng, 2000)
    if back_at is not None:
        x[back_at:] = np.maximum(x[back_at:], 1e-3 * np.exp(rng.normal(0.0, 0.3, x.size - back_at)))
    return x


def _floor_alarms(x: np.ndarray, floor: float) -> list[int]:
    z = [v for v in (rule.watched(float(v), "log", floor) for v in x[:100]) if v is not None]
    cusum = rule.Cusum(rule.own_band(z, "log", floor))
    return [i for i in range(100, x.size) if cusum.update(i, float(x[i])) is not None]


def test_the_floor_lets_a_kl_back_at_1e3_be_found() -> None:
    """The same KL coming back to about 1e-3 (100 times the floor) for good at step 1,000: with the
    floor it is alerted within 60 steps in at least 3/4 of 20 fixed seeds; read as ``log(x)``, the
    noise of values down to 1e-15 widens the band so that fewer than 2/3 are."""
    from cliptrack.compare.quantities import KL_FLOOR

    def found(floor: float) -> float:
        hits = 0
        for seed in range(20):
            after = [i for i in _floor_alarms(_fresh(seed, back_at=1000), floor) if i >= 1000]
            hits += bool(after) and after[0] - 1000 <= 60
        return hits / 20

    assert found(KL_FLOOR) >= 0.75
    assert found(0.0) < 2 / 3


def test_one_sided_bursts_widen_the_scale_on_the_watched_side_only() -> None:
    """A series at its floor with upward bursts: an "up" watch's scale is the upper semi-variance's
    (twice the mean square above the prediction), wider than the two-sided one; a "down" watch of
    the same points keeps the two-sided scale."""
    rng = np.random.default_rng(4)
    z = list(rng.normal(0.0, 0.1, 100))
    x = np.exp(rng.normal(0.0, 0.1, 600))
    x[rng.random(600) < 0.05] *= 20.0
    cusums = {d: rule.Cusum(rule.own_band(z), direction=d, cooldown=1) for d in ("up", "down")}
    for cusum in cusums.values():
        for i, v in enumerate(x):
            cusum.update(i, float(v))
        assert cusum.variance() >= cusum._sq
    assert cusums["up"].variance() > 1.5 * cusums["up"]._sq
    assert cusums["down"].variance() == cusums["down"]._sq


def test_zscore_filter_fires_on_an_outlier_once_per_episode() -> None:
    z = rule.ZScoreFilter()
    values = [1.0 + 0.01 * (i % 3) for i in range(40)] + [5.0, 5.0] + [1.0] * 5
    fired = [i for i, v in enumerate(values) if z.update(v)]
    assert fired == [40]


# ---- settings ----------------------------------------------------------------------------------------
def test_the_string_form() -> None:
    a, b = live.parse_watch("kl_k3:mean ; abs_log_ratio:mean,window=200,direction=both,h=9")
    assert a == live.Watch(KL)
    assert (b.key, b.window, b.direction, b.h) == ("abs_log_ratio:mean", 200, "both", 9.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kl_k3", "expected a metric key 'name:reduction'"),
        ("kl_k3:mean,window=5", "window=5: expected an integer >= 20"),
        ("kl_k3:mean,window=x", "window='x' is not a valid window"),
        ("kl_k3:mean,speed=1", "'speed=1' is not 'option=value' with an option of"),
        ("kl_k3:mean,direction=sideways", "direction='sideways': expected one of"),
        (" ; ", "names no metric key"),
    ],
)
def test_bad_watches_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        live.parse_watch(text)


@pytest.mark.parametrize(
    ("text", "run", "store"),
    [
        ("sqlite:///tmp/mlflow.db#abc123", "abc123", {"tracking_uri": "sqlite:///tmp/mlflow.db"}),
        ("http://localhost:5000#baseline", "baseline", {"tracking_uri": "http://localhost:5000"}),
        ("jsonl:spool#run-1", "run-1", {"jsonl_dir": "spool"}),
        ("wandb:./wandb#x7", "x7", {"wandb_dir": "./wandb"}),
        ("csv:out#r", "r", {"csv_dir": "out"}),
    ],
)
def test_a_reference_names_its_store(text: str, run: str, store: dict[str, str]) -> None:
    ref = live.RunRef.parse(text)
    assert (ref.run, dict(ref.store)) == (run, store)
    (w,) = live.parse_watch(f"{KL},reference={text}")
    assert w.reference == text and "reference run" in w.source
    with pytest.raises(ValueError, match="STORE#RUN"):
        live.RunRef.parse("sqlite:///tmp/mlflow.db")


def test_the_floor_is_the_quantitys() -> None:
    from cliptrack.compare.quantities import CLIP_FLOOR, KL_FLOOR

    assert live.Watch(KL).offset == KL_FLOOR and live.Watch("clip_fraction:mean").offset == CLIP_FLOOR
    assert live.Watch("reward:mean").offset == 0.0 and live.Watch(KL, scale="value").offset == 0.0
    assert live.parse_watch(f"{KL},floor=0")[0].offset == 0.0
    with pytest.raises(ValueError, match="floor=-1.0"):
        live.Watch(KL, floor=-1.0)


@pytest.mark.slow
def test_a_reference_run_is_read_from_an_mlflow_store(tmp_path) -> None:
    """The reference run logged to MLflow on a sqlite file, named ``sqlite:///...#RUN_ID``: the band
    is its trajectory, and a run 5x above it is alerted once."""
    from cliptrack.backends.mlflow.sink import MlflowSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = MlflowSink(tracking_uri=uri)
    with Tracker("ref", sinks=[sink], spool_dir=tmp_path / "spool") as ref:
        for step, value in enumerate(_kl(np.random.default_rng(2).normal(0, 0.1, 200))):
            ref.log(step, {KL: float(value)})
    watch = live.Watch(KL, reference=f"{uri}#{sink.mlflow_run_id}")
    steps, values = live.reference_series(watch)
    assert steps == list(range(200)) and len(values) == 200 and min(values) > 0
    band = live.band_of_reference(watch)
    assert band.points == 200 and abs(band.level - math.log(1e-3)) < 0.1
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path / "spool", watch=watch) as t:
        for step, value in enumerate(_planted()):
            t.log(step, {KL: value})
    (alert,) = t.breaches
    assert 200 <= alert.step <= 210 and "reference run" in alert.text
    missing = live.Watch(KL, reference=f"{uri}#no-such-run")
    with pytest.raises(ValueError, match="reference run no-such-run"):
        live.band_of_reference(missing)


def test_the_environment_names_the_watches(monkeypatch) -> None:
    monkeypatch.setenv(live.ENV, "kl_k3:mean,h=12")
    assert live.watches(None) == [live.Watch(KL, h=12.0)]
    with pytest.raises(ValueError, match="more than once"):
        live.watches([KL, live.Watch(KL)])
    monkeypatch.setenv(live.ENV, "kl_k3:mean,speed=2")
    with pytest.raises(ValueError, match=r"^CLIPTRACK_WATCH='kl_k3:mean,speed=2': watch "):
        live.watches(None)


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: live.Watch(KL, k="1"), TypeError, "Watch kl_k3:mean k='1': expected a number"),
        (lambda: live.Watch(KL, floor="0"), TypeError, "Watch kl_k3:mean floor='0': expected a number"),
        (
            lambda: live.Watch(KL, reference=12),
            TypeError,
            "Watch kl_k3:mean reference=12: expected STORE#RUN",
        ),
        (lambda: live.watches(3), TypeError, "watch=3: expected a Watch"),
        (
            lambda: live.band_of_reference(live.Watch(KL, reference={0: "a"})),
            ValueError,
            "watch kl_k3:mean: the reference values must be numbers",
        ),
        (
            lambda: live.band_of_reference(live.Watch(KL, reference=[1.0, 2.0])),
            ValueError,
            "^watch kl_k3:mean: 2 reference values: a reference run needs",
        ),
    ],
)
def test_bad_watch_arguments_are_named(make, error, message) -> None:
    with pytest.raises(error, match=message):
        make()


def test_other_ranks_watch_nothing(tmp_path) -> None:
    tracker = Tracker("r", sinks=["jsonl"], spool_dir=tmp_path, rank=1, watch=KL)
    assert isinstance(tracker, NullTracker)
    tracker.log(0, {KL: 1.0})
    assert tracker.breaches == []


# ---- the tracker ---------------------------------------------------------------------------------------
def _planted(steps: int = 260, at: int = 200, factor: float = 5.0) -> list[float]:
    x = _kl(np.random.default_rng(11).normal(0, 0.1, steps))
    x[at:] *= factor
    return [float(v) for v in x]


def test_log_never_waits_on_a_slow_callback_nor_raises_from_a_failing_one(tmp_path, capfd) -> None:
    entered, release = threading.Event(), threading.Event()

    def slow(alert: object) -> None:
        entered.set()
        release.wait()
        raise RuntimeError("checkpoint failed")

    values = _planted()
    done = threading.Event()
    errors: list[BaseException] = []
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, watch=live.Watch(KL, on_breach=slow)) as t:

        def train() -> None:
            try:
                for step, value in enumerate(values):
                    t.log(step, {KL: value})
                entered.wait()  # the callback is running (and blocked) ...
                for step in range(len(values), len(values) + 500):
                    t.log(step, {KL: values[-1]})  # ... and log goes on
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                errors.append(exc)
            finally:
                done.set()

        worker = threading.Thread(target=train)
        worker.start()
        assert done.wait(120), "log waited on the watch's callback"
        assert not release.is_set() and entered.is_set()
        assert t.points_logged == len(values) + 500
        release.set()
        worker.join()
    assert not errors
    assert t.breaches and 200 <= t.breaches[0].step <= 210
    err = capfd.readouterr().err
    assert "cliptrack watch: on_breach of kl_k3:mean raised RuntimeError: checkpoint failed" in err
    assert f"cliptrack watch: run {t.run_id}: kl_k3:mean = " in err


def test_the_spool_records_each_breach(tmp_path) -> None:
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, watch=KL) as t:
        for step, value in enumerate(_planted()):
            t.log(step, {KL: value})
    (alert,) = live.read_breaches(t.run_dir)
    assert alert == t.breaches[0]
    assert 200 <= alert.step <= 210 and alert.direction == "up" and alert.key == KL


@pytest.mark.slow
def test_each_sink_raises_the_alert_its_own_way(tmp_path, monkeypatch, capfd) -> None:
    """MLflow (sqlite file): the tag and the breach metric; W&B offline: an alert record in the run's
    ``.wandb`` file; stderr: one line; the callback: the same alert."""
    from cliptrack.backends.mlflow.sink import MlflowSink, watch_metric, watch_tag
    from cliptrack.backends.wandb.sink import WandbSink
    from mlflow import MlflowClient

    from tests._tracking_wandb_log import of_type

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    got: list[object] = []
    reference = tmp_path / "reference"
    with Tracker("ref", sinks=["jsonl"], spool_dir=reference) as ref:
        for step, value in enumerate(_kl(np.random.default_rng(2).normal(0, 0.1, 200))):
            ref.log(step, {KL: float(value)})
    watch = live.Watch(KL, reference=ref.run_dir.path, on_breach=got.append)
    sinks = [MlflowSink(tracking_uri=uri), WandbSink(project="watch", mode="offline", dir=str(tmp_path))]
    with Tracker("w", sinks=sinks, spool_dir=tmp_path / "spool", watch=watch) as t:
        for step, value in enumerate(_planted()):
            t.log(step, {KL: value})
    alerts = t.breaches  # the run stays 5x above the reference: one alert, then the band re-centres
    alert = alerts[-1]
    assert got == alerts and 200 <= alerts[0].step <= 210 and "reference run" in alert.text
    assert all(b.step - a.step > rule.COOLDOWN for a, b in zip(alerts, alerts[1:], strict=False))

    client = MlflowClient(uri)
    run = client.get_run(sinks[0].mlflow_run_id)
    assert run.data.tags[watch_tag(KL)] == alert.text
    marks = client.get_metric_history(run.info.run_id, watch_metric(KL))
    assert sorted((m.step, m.value) for m in marks) == [(a.step, 1.0) for a in alerts]

    (wandb_file,) = tmp_path.glob(f"wandb/offline-run-*-{t.run_id}/run-{t.run_id}.wandb")
    records = of_type(wandb_file, "alert")
    assert [(r.title, r.text, r.level) for r in records] == [(a.title, a.text, "WARN") for a in alerts]

    assert capfd.readouterr().err.count(f"cliptrack watch: run {t.run_id}: kl_k3:mean") == len(alerts)
    lines = (t.run_dir.path / live.BREACHES_FILE).read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [a.step for a in alerts]


# ---- the command line ------------------------------------------------------------------------------------
def test_cliptrack_watch_reads_a_run(tmp_path, capsys) -> None:
    from cliptrack.cli.main import main

    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, watch=None) as jumped:
        for step, value in enumerate(_planted()):
            jumped.log(step, {KL: value})
    with Tracker("h", sinks=["jsonl"], spool_dir=tmp_path) as healthy:
        for step, value in enumerate(_planted(factor=1.0)):
            healthy.log(step, {KL: value})
    capsys.readouterr()
    assert main(["watch", str(jumped.run_dir.path), "--key", KL]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"run {jumped.run_id}: kl_k3:mean = ")
    assert main(["watch", str(healthy.run_dir.path), "--watch", f"{KL},window=50", "--json"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["watch", str(tmp_path), "--key", KL]) == 2
    assert "is not a run directory" in capsys.readouterr().err


def test_a_watched_key_never_logged_is_named_with_the_keys_it_resembles(tmp_path, capfd) -> None:
    """A typo in the watched key would watch nothing in silence: at the end of the run (and of
    ``cliptrack watch``) the key is named with the run's closest logged keys; a key that was
    logged gets no such line."""
    from cliptrack.cli.main import main

    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, watch="kl_k3:maen;clip_fraction:mean") as t:
        for step in range(5):
            t.log(step, {KL: 0.01, "clip_fraction:mean": 0.1, "reward:mean": 0.5})
    err = capfd.readouterr().err
    assert "cliptrack watch: kl_k3:maen was never logged in this run (5 points)" in err
    assert "did you mean kl_k3:mean?" in err
    assert "clip_fraction:mean was never logged" not in err
    assert main(["watch", str(t.run_dir.path), "--key", "kl_k3:sum", "--key", KL]) == 0
    err = capfd.readouterr().err
    assert "cliptrack watch: kl_k3:sum was never logged in this run (5 points)" in err
    assert "did you mean kl_k3:mean?" in err
    assert f"{KL} was never logged" not in err


def test_a_run_without_points_names_no_key(tmp_path, capfd) -> None:
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, watch="kl_k3:maen"):
        pass
    assert "was never logged" not in capfd.readouterr().err


# ---- values that are not finite, a watch that fails --------------------------------------------------
def test_a_watched_series_that_blows_up_is_alerted_once_per_run_of_such_values(tmp_path, capsys) -> None:
    """A grad norm or reward that turns NaN or infinite has no reading the band could follow: it is
    alerted at once, on the watched side (NaN on either), once until a finite value returns; the
    alert reaches the spool's watch.jsonl like any breach."""
    healthy = [1.0 + 0.01 * (s % 5) for s in range(60)]
    series = healthy + [math.nan, math.nan, 1.02, math.inf, math.inf, -math.inf, 1.01, math.nan]
    up = live.Watch("grad_norm:mean", scale="value", window=20)
    down = live.Watch("reward:mean", scale="value", window=20, direction="down")
    with Tracker("blowup", sinks=["jsonl"], spool_dir=tmp_path, watch=[up, down], handle_signals=False) as t:
        for step, value in enumerate(series):
            t.log(step, {"grad_norm:mean": value, "reward:mean": value})
    got = [(a.key, a.step, a.direction) for a in t.breaches]
    assert got == [
        ("grad_norm:mean", 60, "up"),
        ("reward:mean", 60, "down"),
        ("grad_norm:mean", 63, "up"),  # +inf: up only
        ("reward:mean", 65, "down"),  # -inf after +inf: the same run of values, a new side
        ("grad_norm:mean", 67, "up"),
        ("reward:mean", 67, "down"),
    ]
    assert [(a.key, a.step) for a in live.read_breaches(t.run_dir)] == [(k, s) for k, s, _ in got]
    assert math.isnan(t.breaches[0].value) and "not a finite number" in t.breaches[0].text
    from cliptrack.cli.main import main

    capsys.readouterr()
    assert (
        main(["watch", str(t.run_dir.path), "--watch", "grad_norm:mean,scale=value,window=20", "--json"]) == 1
    )

    def strict(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    lines = [json.loads(line, parse_constant=strict) for line in capsys.readouterr().out.splitlines()]
    assert [x["step"] for x in lines] == [60, 63, 67] and all(x["value"] is None for x in lines)


def test_a_watch_that_fails_on_a_point_leaves_the_others_following_it() -> None:
    kl = live.Watch(KL, reference=[1e-3 * (1 + 0.01 * (i % 7)) for i in range(200)])
    other = live.Watch("x:mean", scale="value", reference=[float(i % 3) for i in range(200)])
    detector = live.Detector([other, kl], "run")
    alerts = []
    for step in range(30):
        alerts += detector.update(step, {"x:mean": "not a number", KL: 0.5})  # type: ignore[dict-item]
    assert alerts and {a.key for a in alerts} == {KL}
