"""Each point stored once per sink, exactly: repeated steps with equal values are distinct rows.

MLflow's sqlite store identifies a metric row by (run, key, value, step, timestamp ms); the tracker
stamps points so that no two of one step share a millisecond (``cliptrack.store.stamps``). Counted in the
journal and in a real sqlite MLflow store.
"""

from __future__ import annotations

from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
from cliptrack.store.stamps import StepClock, millisecond
from hypothesis import given
from hypothesis import strategies as st
from mlflow import MlflowClient

from tests._journal import journal_steps


def test_eight_identical_points_per_step_are_eight_hundred_rows_in_mlflow(tmp_path):
    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with Tracker(
        "micro-batches", sinks=(db,), spool_dir=tmp_path / "spool", experiment="rows", handle_signals=False
    ) as tracker:
        for step in range(100):
            for _micro_batch in range(8):  # per-micro-batch logging: equal values, one step
                tracker.log(step, {keys.LOSS_SUM: 1.0, "grad_norm:mean": 0.5})
    assert journal_steps(tmp_path / "spool" / tracker.run_id) == [s for s in range(100) for _ in range(8)]
    client = MlflowClient(db)
    (run,) = client.search_runs([client.get_experiment_by_name("rows").experiment_id])
    for key in (keys.LOSS_SUM, "grad_norm:mean"):
        history = client.get_metric_history(run.info.run_id, key)
        assert len(history) == 800, (key, len(history))
        assert sorted(m.step for m in history) == [s for s in range(100) for _ in range(8)]
        assert len({(m.step, m.timestamp) for m in history}) == 800


def _reference(calls: list[tuple[int, int]]) -> list[int]:
    """The plain rule: a point keeps its clock millisecond unless an earlier point of its step sits at
    or after it (or the clock went back below the latest used one); then it takes the first free
    millisecond at or after the latest used one."""
    used: dict[int, set[int]] = {}
    latest = -1
    out = []
    for step, ms in calls:
        ms = max(ms, latest)
        while step in used.get(ms, set()):
            ms += 1
        used.setdefault(ms, set()).add(step)
        latest = max(latest, ms)
        out.append(ms)
    return out


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(-2, 3)),  # (step, clock advance in ms)
        min_size=1,
        max_size=60,
    )
)
def test_stamps_never_repeat_a_step_in_a_millisecond_and_follow_the_clock(calls):
    now = [1_700_000_000_000]
    clock = StepClock(lambda: (now[0] + 0.25) / 1000)
    given_ms = []
    got = []
    for step, advance in calls:
        now[0] += advance
        given_ms.append((step, now[0]))
        got.append(millisecond(clock.stamp(step)))
    assert got == _reference(given_ms)
    assert len(set(zip([s for s, _ in calls], got, strict=True))) == len(calls)  # (step, ms) unique
