"""A live watch never takes the run down and never holds it up: callbacks that raise ``SystemExit``
or ``KeyboardInterrupt``, a callback that closes the run, a callback stuck while a SIGTERM ends the
process against a server that never replies, reference runs that cannot be read, ``cliptrack watch``
on a run whose writer was SIGKILLed, and what a large reference run costs."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest
from cliptrack.backends import preflight
from cliptrack.backends.mlflow import _compat as mlflow_compat
from cliptrack.compare.stats import watch as rule
from cliptrack.log import watch as live
from cliptrack.log.process import SIGNAL_CLOSE_S
from cliptrack.log.tracker import Tracker
from cliptrack.store import journal
from cliptrack.store.spool import RunDir
from hypothesis import given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
KL = "kl_k3:mean"
GRAD = "grad_norm:mean"
LAUNCHER_GRACE_S = 10.0
"""What a launcher gives a process between SIGTERM and SIGKILL (the contract's bound)."""


def _planted(steps: int = 260, at: int = 200, factor: float = 5.0, seed: int = 11) -> list[float]:
    """A KL around 1e-3 (log-scale noise sd 0.1) multiplied by ``factor`` from point ``at`` on."""
    x = 1e-3 * np.exp(np.random.default_rng(seed).normal(0, 0.1, steps))
    x[at:] *= factor
    return [float(v) for v in x]


@pytest.fixture
def silent_server():
    """A TCP port that takes connections (the kernel's backlog) and never answers a byte."""
    server = socket.create_server(("127.0.0.1", 0), backlog=128)
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()


# ---- callbacks -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raised", "line"),
    [
        (SystemExit(3), "raised SystemExit: 3"),
        (KeyboardInterrupt(), "raised KeyboardInterrupt"),
        (RuntimeError("disk full"), "raised RuntimeError: disk full"),
    ],
)
def test_a_callback_that_raises_anything_is_one_line_and_the_other_watches_go_on(
    tmp_path, capfd, raised, line
) -> None:
    """The KL's callback raises at the KL's jump (step ~205); the grad norm jumps later (step 230):
    its alert and callback still come. Before, ``SystemExit`` and ``KeyboardInterrupt`` ended the
    watch thread (the second alert never came; a traceback for the interrupt)."""
    seen: list[str] = []

    def failing(alert: object) -> None:
        raise raised

    watches = [
        live.Watch(KL, on_breach=failing),
        live.Watch(GRAD, on_breach=lambda alert: seen.append(alert.key)),
    ]
    kl, grad = _planted(), _planted(at=230, seed=12)
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, watch=watches) as t:
        for step in range(len(kl)):
            t.log(step, {KL: kl[step], GRAD: grad[step]})
    assert [a.key for a in t.breaches] == [KL, GRAD]
    assert seen == [GRAD] and 230 <= t.breaches[1].step <= 240
    err = capfd.readouterr().err
    reported = [x for x in err.splitlines() if "on_breach of" in x]
    assert len(reported) == 1 and reported[0].startswith(f"cliptrack watch: on_breach of {KL} {line}")
    assert "Traceback" not in err
    assert json.loads((t.run_dir.path / "run.json").read_text())["status"] == "FINISHED"


def test_close_from_a_callback_is_refused_and_the_run_ends_finished(tmp_path, capfd) -> None:
    """``close()`` inside ``on_breach`` (the watch's thread) is refused with a RuntimeError saying
    what to do; the training thread goes on logging, its ``close()`` ends the run FINISHED with its
    summary. Before: "cannot join current thread", run.json stayed RUNNING, the writer kept running
    and the training thread's ``close()`` did nothing."""
    box: dict[str, Tracker] = {}
    refused: list[BaseException] = []
    called = threading.Event()

    def stop_now(alert: object) -> None:
        try:
            box["t"].close()
        except RuntimeError as exc:
            refused.append(exc)
            raise
        finally:
            called.set()

    values = _planted()
    t = Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, watch=live.Watch(KL, on_breach=stop_now))
    box["t"] = t
    for step, value in enumerate(values):
        t.log(step, {KL: value})
    assert called.wait(60)
    t.log(len(values), {KL: values[-1]})  # still open: the callback closed nothing
    t.close()
    assert len(refused) == 1 and "from a watch's on_breach callback is refused" in str(refused[0])
    assert t.status == "FINISHED"
    meta = json.loads((t.run_dir.path / "run.json").read_text())
    assert meta["status"] == "FINISHED" and meta["journal"]["points"] == len(values) + 1
    err = capfd.readouterr().err
    assert t.summary().startswith(f"run {t.run_id} FINISHED: {len(values) + 1} points")
    assert f"on_breach of {KL} raised RuntimeError: close() of run {t.run_id}" in err


WORKER = textwrap.dedent(
    """
    import sys, threading, time
    import numpy as np
    from cliptrack.log.tracker import Tracker
    from cliptrack.log.watch import Watch

    spool, server = sys.argv[1], sys.argv[2]
    entered = threading.Event()

    def stuck(alert):  # a checkpoint that never returns
        entered.set()
        threading.Event().wait()

    x = 1e-3 * np.exp(np.random.default_rng(11).normal(0, 0.1, 260))
    x[200:] *= 5
    t = Tracker("stuck", sinks=[server], spool_dir=spool, watch=Watch("kl_k3:mean", on_breach=stuck))
    print("run", t.run_id, flush=True)
    for step, value in enumerate(x):
        t.log(step, {"kl_k3:mean": float(value)})
    entered.wait()
    print("stuck", flush=True)
    step = len(x)
    while True:
        t.log(step, {"kl_k3:mean": float(x[-1])})
        step += 1
        time.sleep(0.01)
    """
)


@pytest.mark.slow
def test_a_stuck_callback_and_a_silent_server_keep_sigterm_within_the_launchers_grace(
    tmp_path, silent_server
) -> None:
    """The callback blocks for ever and the MLflow server takes connections but never replies: after
    SIGTERM the process dies of it within the 10 s a launcher gives and the run is KILLED (the watch
    takes ``WATCH_CLOSE_SHARE`` of the 6 s close, counted in its one deadline). Before: 12.1 s (the
    watch's 3 s drain and 3 s join came before the lanes' own 6 s), so a launcher's SIGKILL at 10 s
    left the run RUNNING."""
    spool = tmp_path / "spool"
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(spool), silent_server],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = proc.stdout.readline().split()[1]
        assert proc.stdout.readline().strip() == "stuck", proc.stderr.read()
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - sent
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert code == -signal.SIGTERM and took < LAUNCHER_GRACE_S, (code, took, err[-2000:])
    meta = json.loads((spool / run_id / "run.json").read_text())
    assert meta["status"] == "KILLED"
    assert f"run {run_id} KILLED:" in err


def test_the_watchs_share_of_a_signals_close_is_a_quarter_of_it() -> None:
    from cliptrack.log.tracker import DISK_DRAIN_S, WATCH_CLOSE_SHARE

    assert min(DISK_DRAIN_S, WATCH_CLOSE_SHARE * SIGNAL_CLOSE_S) == 1.5 and SIGNAL_CLOSE_S < LAUNCHER_GRACE_S


# ---- reference runs that cannot be read -------------------------------------------------------------------
def _foreign_sqlite(path: Path) -> str:
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    return f"sqlite:///{path}"


@pytest.mark.parametrize("where", ["missing path", "missing jsonl run", "foreign sqlite", "silent server"])
def test_a_reference_that_cannot_be_read_fails_before_the_run_opens(tmp_path, where, request) -> None:
    """A ValueError naming the watch, within the reads' bound (``REFERENCE_TIMEOUT_S``), and no run
    directory left in the spool. Before: a stray RUNNING run directory each time, and against a
    server that never replies ``Tracker()`` blocked 184 s and raised a raw ``MlflowException``."""
    if where == "missing path":
        reference: str = str(tmp_path / "no-such-run")
    elif where == "missing jsonl run":
        reference = f"jsonl:{tmp_path / 'other'}#no-such-run"
    elif where == "foreign sqlite":
        reference = f"{_foreign_sqlite(tmp_path / 'notes.db')}#0123abcd"
    else:
        reference = f"{request.getfixturevalue('silent_server')}#0123abcd"
    spool = tmp_path / "spool"
    started = time.monotonic()
    with pytest.raises(ValueError, match=f"watch {KL}: ") as caught:
        Tracker("w", sinks=["jsonl"], spool_dir=spool, watch=live.Watch(KL, reference=reference))
    took = time.monotonic() - started
    assert not spool.exists() or list(spool.iterdir()) == [], list(spool.iterdir())
    assert type(caught.value) is ValueError
    if where == "silent server":
        assert f"no answer within {live.REFERENCE_TIMEOUT_S:g} s" in str(caught.value)
        assert live.REFERENCE_TIMEOUT_S <= took < live.REFERENCE_TIMEOUT_S + 20, took


def test_the_reference_bound_is_the_reads_bound_against_a_server_they_cannot_reach() -> None:
    assert live.REFERENCE_TIMEOUT_S == preflight.PROBE_TIMEOUT_S + mlflow_compat.READ_UNREACHABLE_WORST_CASE_S


# ---- cliptrack watch -------------------------------------------------------------------------------------
KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from cliptrack.log.tracker import Tracker

    t = Tracker("killed", sinks=["jsonl"], spool_dir=sys.argv[1], handle_signals=False)
    for step in range(150):
        t.log(step, {"kl_k3:mean": 1e-3})
    assert t.flush(30)
    print(t.run_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.slow
def test_cliptrack_watch_stops_following_a_run_whose_writer_was_killed(tmp_path) -> None:
    """A writer SIGKILLed leaves run.json RUNNING and its lock free: ``cliptrack watch`` reads the
    journal to its end, says the writer is gone and stops (before: it followed the run for ever). A
    run whose writer is alive holds the lock and is still followed."""
    spool = tmp_path / "spool"
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(spool)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_id = killed.stdout.strip()
    run_dir = RunDir(spool, run_id)
    assert run_dir.read_meta()["status"] == "RUNNING"
    command = [sys.executable, "-m", "cliptrack.cli.main", "watch", str(run_dir.path), "--key", KL]
    try:
        done = subprocess.run(
            [*command, "--interval", "0.2"], cwd=REPO, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("cliptrack watch followed a run whose writer was SIGKILLed for 60 s")
    assert done.returncode == 0, done.stderr
    assert f"run {run_id} is marked RUNNING but no process is logging it" in done.stderr
    assert "150 points" not in done.stderr  # the key was logged: no never-logged line
    assert run_dir.writer_alive() is False and run_dir.read_meta()["status"] == "RUNNING"  # read-only

    with Tracker("live", sinks=["jsonl"], spool_dir=spool) as alive:
        alive.log(0, {KL: 1e-3})
        assert RunDir(spool, alive.run_id).writer_alive() is True
    assert RunDir(spool, alive.run_id).writer_alive() is False


# ---- what a reference run costs --------------------------------------------------------------------------
OTHER_KEYS = [f"metric_{i}:mean" for i in range(24)]


def _reference_journal(path: Path, points: int) -> Path:
    """A spool run directory whose journal holds ``points`` points of 25 keys, the KL among them."""
    rng = np.random.default_rng(5)
    path.mkdir(parents=True)
    with open(path / "points.jsonl", "wb") as fh:
        for start in range(0, points, 1000):
            batch = [
                (
                    step,
                    1.7e9 + step,
                    {KL: float(1e-3 * np.exp(rng.normal(0, 0.1))), **dict.fromkeys(OTHER_KEYS, 0.5)},
                )
                for step in range(start, min(points, start + 1000))
            ]
            fh.write(b"".join(journal.encode_points(batch)))
    return path


def test_a_reference_run_is_read_within_twice_its_size(tmp_path) -> None:
    """The band of a 20,000-point reference (about 17 MB of journal) takes less than twice the
    journal's size in memory (Python's allocations, ``tracemalloc``): only the watched key is kept.
    Before: every point of the journal was held whole (3.7 times the file: 861 MB for 234 MB)."""
    run = _reference_journal(tmp_path / "reference", 20_000)
    size = (run / "points.jsonl").stat().st_size
    watch = live.Watch(KL, reference=run)
    live.band_of_reference(
        live.Watch(KL, reference=[1e-3 * (1 + i % 7 / 100) for i in range(200)])
    )  # imports
    tracemalloc.start()
    try:
        band = live.band_of_reference(watch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert band.points == 20_000 and abs(band.level - math.log(1e-3 + live.default_floor(KL, "log"))) < 0.05
    assert peak < 2 * size, (peak, size)


def _journal_lines(entries: list[tuple[int, object]]) -> bytes:
    return b"".join(
        journal.encode_points([(step, 1.0, {"x:mean": 1.0, KL: value}) for step, value in entries])
    )


HOSTILE_LINES = [
    b'{"step": 7, "wall_time": 1.0, "metrics": {"kl\\u005fk3:mean": 0.25}}\n',  # the key escaped
    b'{"step": 8, "wall_time": 1.0, "metrics": {"a": 1, "kl_k3:mean": 1.0, "kl_k3:mean": 2.0}}\n',
    b'{"step": 9, "wall_time": 1.0, "metrics": {"x\\"kl_k3:mean": 3.0, "y": 1}}\n',  # inside a key
    b'{"step": 10, "wall_time": 1.0, "metrics": {"kl_k3:mean": 1_0}}\n',  # not JSON
    b'{"step": 11, "wall_time": 1.0, "metrics": {"kl_k3:mean": NaN, "z": -Infinity}}\n',
    b'{"step": 12, "wall_time": 1.0, "metrics": {"kl_k3:mean": 1e400}}\n',
    b'{"step": 13, "wall_time": 1.0, "metrics": {"kl_k3:mean": 5}}\n',
    b'{"step": 14, "wall_time": 1.0, "metrics": {"kl_k3:mean": 0.5,\n',  # damaged
    b'{"step": 16, "wall_time": 1.0, "metrics": {"kl_k3:mean": "high"}}\n',  # not a number
    b"\n",
    b'{"step": 15, "wall_time": 1.0, "metrics": {"kl_k3:mean": 0.75}}',  # torn last line
]


@settings(deadline=None, max_examples=60)
@given(
    entries=st.lists(
        st.tuples(
            st.integers(0, 2**63 - 1),
            st.floats(allow_nan=False)
            | st.sampled_from([math.inf, -math.inf])
            | st.integers(-(2**70), 2**70),
        ),
        max_size=30,
    ),
    hostile=st.lists(st.sampled_from(range(len(HOSTILE_LINES) - 1)), max_size=6),
    torn=st.booleans(),
)
def test_the_series_of_one_key_is_what_the_whole_points_give(
    tmp_path_factory, entries, hostile, torn
) -> None:
    """``journal.load_series`` against the plain reference: every point read whole
    (``load_points``), the key's values kept, NaN compared as NaN."""
    path = tmp_path_factory.mktemp("series") / "points.jsonl"
    lines = _journal_lines(entries).splitlines(keepends=True)
    for i, which in enumerate(hostile):
        lines.insert((i * 7) % (len(lines) + 1), HOSTILE_LINES[which])
    data = b"".join(lines) + (HOSTILE_LINES[-1] if torn else b"")
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", journal.DamagedLine)
        points = journal.load_points(path)
        expected = [(p.step, p.metrics[KL]) for p in points if KL in p.metrics]
        numeric = all(
            not isinstance(v, bool)
            and isinstance(v, (int, float))
            and not (type(v) is int and abs(v) > 1.7976931348623157e308)
            for _, v in expected
        )
        if not numeric:
            with pytest.raises(ValueError, match="non-numeric value"):
                journal.load_series(path, KL)
            return
        steps, values = journal.load_series(path, KL)
    assert list(steps) == [s for s, _ in expected]
    got = [("nan" if math.isnan(v) else v) for v in values]
    assert got == [("nan" if math.isnan(float(v)) else float(v)) for _, v in expected]


@settings(deadline=None, max_examples=200)
@given(
    z=st.lists(st.floats(-1e6, 1e6) | st.sampled_from([0.0, 1.0, -1.0]), max_size=300),
    half=st.integers(1, 120),
)
def test_the_moving_median_is_numpys_median_of_each_slice(z, half) -> None:
    """Bit for bit the plain definition (``numpy.median`` of each centred slice), through the
    blocks (``half`` up to ``MEDIAN_HEAPS_ABOVE``) and through the heaps (above it)."""
    arr = np.asarray(z, dtype=float)
    expected = [float(np.median(arr[max(0, i - half) : i + half + 1])) for i in range(arr.size)]
    assert rule.moving_median(z, half) == expected
    assert rule._heap_median(z, half) == expected


def test_the_environment_store_of_a_reference_is_bounded_when_it_is_a_server(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert live.RunRef("r").remote() and not live.RunRef("r", (("tracking_uri", "sqlite:///x.db"),)).remote()
    assert not live.RunRef("r", (("jsonl_dir", "spool"),)).remote()
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert not live.RunRef("r").remote() and live.RunRef("r", (("tracking_uri", "https://h"),)).remote()
    assert os.environ.get("MLFLOW_TRACKING_URI") is None
