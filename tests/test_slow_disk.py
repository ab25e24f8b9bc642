"""The crash bound on a slow spool disk: a SIGKILL loses only points handed over in the last
crash window, and no ``log()`` call waits longer than its bound.

Real components: an ext4 file system on a loop device (direct I/O) whose writes are throttled by a
cgroup v1 blkio throttle (root only; skipped with the reason where it cannot be set up), checked
to really slow synchronous writes before the tracker runs; a child process that joins the throttled
cgroup and logs 10-metric points in a tight loop, recording each ``log()`` call's start and return
(unix seconds) on the normal disk; SIGKILL; the journal read back.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest
from cliptrack.log._pipeline.writer import CRASH_GRACE_S
from cliptrack.log.limits import Limits

from tests._disk import SlowDisk, slow_disk, slow_disk_unavailable
from tests._journal import journal_steps
from tests.test_tracker_faults import REPO, _env

pytestmark = pytest.mark.slow

WINDOW_S = Limits().flush_interval_s + CRASH_GRACE_S
"""The documented crash window at the defaults (seconds), also the most one ``log()`` waits."""
LOAD_SLACK_S = 1.0
"""Seconds of margin for a loaded machine (today's code: 4.7 s lost, one call 5.7 s, at 50 IOPS)."""
RUN_S = 8.0
"""Seconds of logging before the kill."""


def _probe_seconds(disk: SlowDisk, writes: int) -> float:
    """Seconds ``writes`` synchronous 4 KiB writes to ``disk`` take from inside its cgroup."""
    code = textwrap.dedent(
        f"""
        import os, time
        with open({str(disk.cgroup / "cgroup.procs")!r}, "w") as fh:
            fh.write(str(os.getpid()))
        fd = os.open({str(disk.mount / "probe")!r}, os.O_WRONLY | os.O_CREAT | os.O_DSYNC)
        start = time.monotonic()
        for _ in range({writes}):
            os.write(fd, b"x" * 4096)
        print(time.monotonic() - start)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return float(done.stdout)


@pytest.fixture(params=[(50, 2**20), (4, 64 * 2**10)], ids=["50iops-1MBps", "4iops-64KBps"])
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SlowDisk]:
    iops, bps = request.param
    reason = slow_disk_unavailable()
    if reason is not None:
        pytest.skip(reason)
    where = tmp_path / "slow"
    where.mkdir()
    try:
        context = slow_disk(where, iops=iops, bps=bps)
        throttled = context.__enter__()
    except OSError as exc:
        pytest.skip(f"cannot set up a throttled loop device here: {exc}")
    try:
        writes = max(4, iops)  # about a second: more than the burst the throttle lets through
        took = _probe_seconds(throttled, writes)
        if took < 0.5 * writes / iops:
            pytest.skip(
                f"the blkio throttle does not slow writes here ({writes} synced writes took {took:.3f} s)"
            )
        yield throttled
    finally:
        context.__exit__(None, None, None)


def test_a_sigkill_on_a_slow_spool_disk_loses_at_most_the_crash_window(
    disk: SlowDisk, tmp_path: Path
) -> None:
    """Every point whose ``log()`` returned more than the crash window (flush interval + 0.5 s)
    before the kill is in the journal, as a gap-free prefix; no ``log()`` call took longer than the
    window (both with ``LOAD_SLACK_S`` for a loaded machine)."""
    spool, times_file = disk.mount / "spool", tmp_path / "times.bin"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests._tracking_worker",
            "slowdisk",
            str(spool),
            str(disk.cgroup),
            str(times_file),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("run "), proc.stderr.read()[-3000:]  # type: ignore[union-attr]
        run_id = line.split()[1]
        time.sleep(RUN_S)
        killed_at = time.time()
        proc.kill()
        proc.wait(30)
    finally:
        proc.kill()
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    steps = journal_steps(spool / run_id)
    assert steps == list(range(len(steps)))
    raw = times_file.read_bytes()
    times = array("d", raw[: len(raw) - len(raw) % 16])  # whole (call, return) pairs
    called, returned = times[0::2], times[1::2]
    assert "log() is faster than points can be written" in stderr  # the disk held the loop back
    lost = len(returned) - len(steps)  # of the points whose return was recorded
    # the oldest point log() accepted that is not on disk (none: every recorded one is)
    lost_since = killed_at - returned[len(steps)] if lost > 0 else 0.0
    longest = max(r - c for c, r in zip(called, returned, strict=True))
    running = killed_at - returned[-1] - 0.05  # the call in progress at the kill lasted at least this
    figures = (
        f"{max(0, lost)} of {len(returned)} points lost, the oldest returned by log() "
        f"{lost_since:.2f} s before the kill; longest log() {max(longest, running):.2f} s"
    )
    assert lost_since <= WINDOW_S + LOAD_SLACK_S, figures
    assert max(longest, running) <= WINDOW_S + LOAD_SLACK_S, figures
    print(figures)
