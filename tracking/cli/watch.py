"""``cliptrack watch``: follow a run's journal against a band and print each breach.

The run is a run directory of the spool (``<spool>/<run id>``, what the tracker prints), read from
its journal ``points.jsonl``: once (``--once``: the points written so far), or followed while the
run is RUNNING (the default: new lines read every ``--interval`` seconds until run.json says the
run ended, or until no process holds the run's write lock while run.json still says RUNNING: its
writer died without closing it, a SIGKILL; said on stderr, after the journal's last lines are
read). The watches are the tracker's (``cliptrack.log.watch``): ``--watch`` takes their string
form (``"kl_k3:mean,window=100;abs_log_ratio:mean"``), ``--key`` one key with the defaults,
``--reference RUN_DIR`` a reference run for every watch that names none. Each breach is one line on
stdout (the alert's text). Exit code: 0 without a breach, 1 with one (a check a CI job can run after
the run, or beside it), 2 for bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from cliptrack.core.jsonready import strict_json
from cliptrack.core.text import printable
from cliptrack.log.watch import Detector, KeysSeen, Watch, parse_watch, stderr_line
from cliptrack.store import journal
from cliptrack.store.records import RUNNING
from cliptrack.store.spool import RunDir

EXIT_BREACH = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="the run's directory in the spool (<spool>/<run id>)")
    parser.add_argument(
        "--watch", action="append", default=[], metavar="SPEC", help="watches, 'KEY[,option=value...][;...]'"
    )
    parser.add_argument("--key", action="append", default=[], help="a metric key to watch with the defaults")
    parser.add_argument("--reference", help="a reference run's directory, for watches that name none")
    parser.add_argument("--once", action="store_true", help="read the points written so far, then stop")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads when following")
    parser.add_argument("--json", action="store_true", help="print each breach as a JSON object")


def chosen(args: argparse.Namespace) -> list[Watch]:
    """The watches the arguments name (ValueError when none, or a bad one)."""
    out = [w for spec in args.watch for w in parse_watch(spec)]
    out += [Watch(key) for key in args.key]
    if not out:
        raise ValueError("name what to watch: --key KEY or --watch SPEC")
    if args.reference:
        out = [
            w if w.reference is not None else dataclasses.replace(w, reference=args.reference) for w in out
        ]
    return out


def run(args: argparse.Namespace) -> int:
    path = Path(args.run_dir)
    if not (path / "run.json").is_file():
        raise ValueError(f"{printable(str(path))} is not a run directory (it holds no run.json)")
    if not args.interval > 0:
        raise ValueError(f"--interval {args.interval}: expected seconds > 0")
    run_dir = RunDir(path.parent, path.name)
    watches = chosen(args)
    detector = Detector(watches, run_dir.run_id)
    seen = KeysSeen(w.key for w in watches)
    offset, breaches = 0, 0
    while True:
        running = _running(run_dir)  # read before the lines: none is missed
        offset, found = _read(run_dir, offset, detector, seen, args.json)
        breaches += found
        if args.once or not running:
            break
        if run_dir.writer_alive() is False and _running(run_dir):  # its lock free, still RUNNING
            offset, found = _read(run_dir, offset, detector, seen, args.json)
            breaches += found
            stderr_line(
                f"run {run_dir.run_id} is marked RUNNING but no process is logging it (its writer ended "
                "without closing it: killed?); stopped following it after its last point "
                f"(`cliptrack replay {printable(str(run_dir.root))}` marks it FAILED)"
            )
            break
        time.sleep(args.interval)
    for line in seen.never_logged():
        stderr_line(line)
    return EXIT_BREACH if breaches else 0


def _running(run_dir: RunDir) -> bool:
    return run_dir.read_meta().get("status") == RUNNING


def _read(run_dir: RunDir, offset: int, detector: Detector, seen: KeysSeen, as_json: bool) -> tuple[int, int]:
    """Follow the journal's complete lines from ``offset``; the offset reached and the breaches."""
    found = 0
    for _, line, end in journal.lines(run_dir.points_path, offset):
        if not line.endswith(b"\n"):
            break  # a line still being written: read again next time
        offset = end
        try:
            point = journal.parse_line(line)
        except (ValueError, KeyError, TypeError):
            continue
        seen.note(point.metrics)
        for alert in detector.update(point.step, point.metrics):
            found += 1
            print(_json(alert) if as_json else printable(alert.text), flush=True)
    return offset, found


def _json(alert: object) -> str:
    """One alert as a line of strict JSON: a non-finite number (a watched value that blew up) is
    ``null``, as in ``compare --json``; the alert's ``text`` still says which."""
    return strict_json(dataclasses.asdict(alert))  # type: ignore[call-overload]
