"""A throwaway PostgreSQL server for the tests (Debian's ``postgresql`` package), and the tracker
process the PostgreSQL load test runs several of.

The cluster lives in a fresh temporary directory: data in ``data/``, the unix socket in the
directory itself, TCP on 127.0.0.1 at a free port, password (scram-sha-256) on TCP and trust on
the socket. PostgreSQL refuses to run as root: as root every server command runs as ``nobody``,
which then owns the directory.

usage (the load test's tracker process):
  python -m tests._postgres load SPOOL TRACKING_URI RUN_ID METRICS STOP_FILE OUT_JSON
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from cliptrack import Limits

USER = "cliptrack"
"""The cluster's superuser, who owns every database the tests create."""

RUN_AS = "nobody"
"""Who runs the server when the tests run as root."""


def bin_dir() -> Path | None:
    """The folder of PostgreSQL's server programs (``initdb``, ``pg_ctl``), or None when absent."""
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def unavailable() -> str | None:
    """Why PostgreSQL cannot run here (a reason to skip with), or None when it can."""
    if bin_dir() is None:
        return "PostgreSQL's server programs are not installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"running as root and there is no user {RUN_AS!r} to run PostgreSQL as"
    return None


class PostgresError(RuntimeError):
    """A PostgreSQL program failed; the message holds its output."""


class Postgres:
    """One PostgreSQL cluster in ``root`` (a new directory), on 127.0.0.1:``port``."""

    def __init__(self, root: Path, port: int, password: str) -> None:
        self.root, self.port, self.password = root, port, password
        self.bin = bin_dir()
        self.data = root / "data"
        self.log = root / "postgres.log"
        self._user = RUN_AS if os.geteuid() == 0 else None

    def uri(self, database: str, driver: str | None = "psycopg2") -> str:
        """The SQLAlchemy URI of ``database`` over TCP with the password: ``postgresql+DRIVER://``,
        or a plain ``postgresql://`` (SQLAlchemy's default driver) when ``driver`` is None."""
        scheme = "postgresql" if driver is None else f"postgresql+{driver}"
        return f"{scheme}://{USER}:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *args: str, timeout_s: float = 120.0) -> str:
        assert self.bin is not None, unavailable()
        done = subprocess.run(
            [str(self.bin / program), *args],
            capture_output=True,
            text=True,
            cwd=self.root,
            user=self._user,
            timeout=timeout_s,
        )
        if done.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise PostgresError(
                f"{program} {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}{tail}"
            )
        return done.stdout

    def init(self) -> None:
        """``initdb`` the cluster (superuser ``USER`` with the password)."""
        if self._user is not None:
            os.chown(self.root, pwd.getpwnam(self._user).pw_uid, -1)
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._user is not None:
            os.chown(pwfile, pwd.getpwnam(self._user).pw_uid, -1)
        try:
            self._run(
                "initdb",
                *("-D", str(self.data), "-U", USER, "--pwfile", str(pwfile), "-E", "UTF8", "--no-sync"),
                *("--auth-local=trust", "--auth-host=scram-sha-256"),
            )
        finally:
            pwfile.unlink()

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c max_connections=100"
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "-o", options, "start"
        )

    def restart(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: like a crash, recovery from the WAL at start) and start it again."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")
        self.start()

    def stop(self) -> None:
        """Stop the server at once if it runs; never raises."""
        if self.bin is not None and (self.data / "postmaster.pid").exists():
            with contextlib.suppress(PostgresError, subprocess.TimeoutExpired):
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")

    def createdb(self, name: str) -> None:
        """Create database ``name`` (over the unix socket)."""
        self._run("createdb", "-h", str(self.root), "-p", str(self.port), "-U", USER, name)

    def psql(self, database: str, sql: str) -> str:
        """What ``sql`` prints in ``database`` (``psql``, unaligned, rows only), stripped."""
        socket = ("-h", str(self.root), "-p", str(self.port), "-U", USER)
        return self._run(
            "psql", *socket, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql, database
        ).strip()

    def dump(self, database: str) -> str:
        """``pg_dump`` of ``database``: its schema and every row, as SQL text; the same text for the
        same database (psql's ``\\restrict`` key, otherwise random per dump, is fixed)."""
        socket = ("-h", str(self.root), "-p", str(self.port), "-U", USER)
        return self._run("pg_dump", *socket, "--restrict-key=cliptrack", database)


@contextlib.contextmanager
def running(port: int, password: str) -> Iterator[Postgres]:
    """A started cluster in a new temporary directory, stopped and removed afterwards. Not in
    pytest's ``tmp_path``: its parents are private to root, and the server runs as ``nobody``."""
    root = Path(tempfile.mkdtemp(prefix="cliptrack-pg-"))
    server = Postgres(root, port, password)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


# --- the load test's tracker process -----------------------------------------------------------

PACE_S = 0.02
"""Seconds between two steps of a load run: it logs on through every fault the test injects."""

MIN_STEPS = 2000
"""A load run logs at least this many steps (40 s at ``PACE_S``), however early it is told to stop."""

MAX_STEPS = 50_000
"""A load run stops here if it is never told to stop."""


def metric_value(run_index: int, step: int, metric: int) -> float:
    """The value run ``run_index`` logs for metric ``metric`` at ``step`` (exact in float64)."""
    return run_index * 1000.0 + metric + step / 4


def load(spool: str, uri: str, run_id: str, metrics: int, stop_file: str, out: str) -> None:
    """One run logging a point of ``metrics`` values to ``uri`` every ``PACE_S`` until ``stop_file``
    exists (and at least ``MIN_STEPS``); then closes and writes how many steps it logged and what is
    still pending."""
    from cliptrack.log.tracker import Tracker

    index = int(run_id.rsplit("-", 1)[1])
    stop = Path(stop_file)
    with Tracker(
        run_id,
        sinks=(uri,),
        run_id=run_id,
        spool_dir=spool,
        experiment="postgres-load",
        backend_label="megatron",
        limits=Limits(flush_interval_s=0.2),
        close_timeout_s=120,
        handle_signals=False,
    ) as tracker:
        step = 0
        while step < MAX_STEPS and not (step >= MIN_STEPS and step % 10 == 0 and stop.exists()):
            tracker.log(step, {f"m{m}:mean": metric_value(index, step, m) for m in range(metrics)})
            step += 1
            time.sleep(PACE_S)
    Path(out).write_text(json.dumps({"run_id": run_id, "logged": step, "pending": tracker.pending()}))


if __name__ == "__main__":
    if len(sys.argv) != 8 or sys.argv[1] != "load":
        sys.exit(__doc__)
    load(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7])
