"""A backend is one folder and one registry entry (docs/ARCHITECTURE.md, "Adding a backend").

The toy backend below is such a backend, written in this file and nowhere else: a sink that keeps
one JSON-lines file per run (its worst-sequence tables too), a reader for the comparison, a
listing for ``cliptrack runs``, one store flag, a worst-sequence table reader and a panels command.
It is registered with one ``register_backend`` call, every part optional; two runs are logged to it
through a real ``Tracker``, listed through ``cliptrack runs``, compared through ``cliptrack
compare`` (verdict and estimates checked against the counts logged), their worst sequences read
back through ``load_worst`` and drawn by ``cliptrack panels toy``. The real CSV backend makes the
same round trip.
"""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from cliptrack import load_worst
from cliptrack.backends import BACKENDS, RunEntry, Sink, load_runs, register_backend
from cliptrack.backends.catalog import choose_runs
from cliptrack.backends.options import StoreOption
from cliptrack.cli.compare import add_comparison_arguments, add_source_arguments, load_and_compare
from cliptrack.cli.main import main
from cliptrack.core import keys
from cliptrack.core.worst import SequenceGauge, Worst
from cliptrack.log.tracker import Tracker
from cliptrack.store.frame import LoadedRun, RunSet
from cliptrack.store.records import Point, RunInfo

STEPS = 150
"""Steps per run: past the comparison's minimum of 100 paired units."""

# ------------------------------------------------------------------------------- the toy backend


class ToySink(Sink):
    """One file per run, ``<dir>/<run_id>.toy``: a JSON line for the run, one per point, one for
    the final status."""

    name = "toy"

    def __init__(self, directory: str | None = None) -> None:
        self.directory = Path(directory or "toy-runs").resolve()
        self.path: Path | None = None

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **overrides: Any) -> ToySink:
        return cls(overrides.get("dir") or state["dir"])

    @property
    def location(self) -> str:
        return f"toy {self.directory}"

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{run.run_id}.toy"
        self._append({"run": run.run_id, "name": run.run_name, "backend": run.backend_label})
        return {"dir": str(self.directory)}

    def write(self, points: Sequence[Point]) -> None:
        for point in points:
            self._append({"step": point.step, "wall": point.wall_time, "metrics": dict(point.metrics)})

    def close(self, status: str) -> None:
        self._append({"status": status})

    def log_worst(self, worst: Worst) -> None:
        self._append({"worst": worst.records(), "worst_step": worst.step, "k": worst.k})

    def _append(self, record: dict[str, Any]) -> None:
        assert self.path is not None
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")


def _toy_runs(directory: str) -> Iterator[tuple[RunInfo, list[Point]]]:
    for path in sorted(Path(directory).glob("*.toy")):
        run, points = RunInfo(path.stem, "", None, status="RUNNING"), []
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if "run" in record:
                run = RunInfo(record["run"], record["name"], record["backend"], status="RUNNING")
            elif "status" in record:
                run.status = record["status"]
            elif "worst" not in record:
                points.append(Point(record["step"], record["wall"], record["metrics"]))
        yield run, points


def toy_read(refs: Sequence[str], *, toy_dir: str) -> RunSet:
    """The toy's reader: runs by id or name, as compare's frames."""
    runs = {run.run_id: (run, points) for run, points in _toy_runs(toy_dir)}
    chosen = choose_runs(
        refs, [(run, run.run_id, run.run_name) for run, _ in runs.values()], f"toy {toy_dir}"
    )
    return RunSet.from_points((LoadedRun(run, "toy", toy_dir), runs[run.run_id][1]) for run in chosen)


def toy_list(*, include_comparisons: bool = False, toy_dir: str) -> list[RunEntry]:
    """The toy's listing for ``cliptrack runs``."""
    return [
        RunEntry(
            cliptrack_id=run.run_id,
            store_id=run.run_id,
            name=run.run_name,
            backend=run.backend_label or "",
            status=run.status,
            started=0.0,
            steps=len(points),
        )
        for run, points in _toy_runs(toy_dir)
    ]


def toy_worst(run: LoadedRun) -> list[Worst]:
    """The toy's worst-sequence tables of a run it read, by step."""
    path = Path(run.location) / f"{run.run.run_id}.toy"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [Worst.from_records(r["worst_step"], r["k"], r["worst"]) for r in records if "worst" in r]


def _toy_panels_arguments(parser: Any) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN")
    parser.add_argument("--out", required=True, help="the panel file")
    add_source_arguments(parser)
    add_comparison_arguments(parser)


def _toy_panels_run(args: Any) -> int:
    """The toy's panel: one JSON file with the verdict per quantity of the compared runs."""
    _, result = load_and_compare(args)
    verdicts = {d.metric: d.verdict for d in result.differences}
    Path(args.out).write_text(json.dumps({"runs": list(result.runs), "verdicts": verdicts}), encoding="utf-8")
    return 0


TOY_PANELS = types.SimpleNamespace(
    HELP="the toy's panel file", add_arguments=_toy_panels_arguments, run=_toy_panels_run
)


TOY_OPTIONS = types.SimpleNamespace(
    STORE_OPTIONS=(StoreOption("toy_dir", "--toy", metavar="DIR", help="toy backend directory"),),
    TARGET_OPTIONS=(),
)


@pytest.fixture
def toy_backend() -> Iterator[None]:
    register_backend(
        "toy",
        sink=ToySink,
        reader=toy_read,
        listing=toy_list,
        options=TOY_OPTIONS,
        worst=toy_worst,
        panels=TOY_PANELS,
    )
    try:
        yield
    finally:
        del BACKENDS["toy"]


# ------------------------------------------------------------------------------------- the runs


WORST_STEPS = (10, 20)
"""The steps the toy runs log a worst-sequence table at."""


def _worst(step: int, seed: int) -> Worst:
    """A step's worst sequences: two sequences ranked by mean |log ratio| (datum ``seed * 1000 + step``)."""
    gauges = tuple(
        SequenceGauge(seed * 1000 + step + i, 100, -0.5 * (i + 1), 0.5 / (i + 1) * 100, 0.01, 0.9, 3)
        for i in range(2)
    )
    return Worst(step, 2, {"abs_log_ratio": gauges})


def _log_run(name: str, clip_p: float, seed: int, **tracker: Any) -> tuple[str, int, int]:
    """Log ``STEPS`` steps clipping about ``clip_p`` of the tokens (and a worst-sequence table at
    each of ``WORST_STEPS``); the run id and the sums of clipped and loss tokens logged (integers)."""
    rng = random.Random(seed)
    clipped_sum = loss_sum = 0
    with Tracker(name, backend_label=name, handle_signals=False, **tracker) as t:
        for step in range(STEPS):
            loss_tokens = rng.randint(2000, 4000)
            clipped = round(loss_tokens * (clip_p + rng.uniform(-0.02, 0.02)))
            t.log(step, {keys.LOSS_TOKENS: loss_tokens, keys.CLIPPED_TOKENS: clipped, keys.REWARD: 0.5})
            if step in WORST_STEPS:
                t.log_worst(step, _worst(step, seed))
            clipped_sum, loss_sum = clipped_sum + clipped, loss_sum + loss_tokens
    return t.run_id, clipped_sum, loss_sum


def _cli_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


def _round_trip(flag: str, directory: Path, runs: dict[str, tuple[str, int, int]], capsys: Any) -> None:
    """List the runs with ``cliptrack runs FLAG DIR`` and compare them with ``cliptrack compare``:
    the listing names both with every step, the estimates are the logged sums, the verdict
    ``different`` (10 % against 30 % clipped)."""
    listed = _cli_json(["runs", flag, str(directory), "--json"], capsys)
    assert sorted((e["cliptrack_id"], e["name"], e["steps"]) for e in listed) == sorted(
        (run_id, name, STEPS) for name, (run_id, _, _) in runs.items()
    )
    assert {e["status"] for e in listed} == {"FINISHED"}
    (a_id, a_clipped, a_loss), (b_id, b_clipped, b_loss) = runs["low"], runs["high"]
    result = _cli_json(["compare", a_id, b_id, flag, str(directory), "--json"], capsys)
    estimates = {e["run"]: e for e in result["estimates"] if e["metric"] == "clip_fraction"}
    assert (estimates["low"]["numerator"], estimates["low"]["denominator"]) == (a_clipped, a_loss)
    assert (estimates["high"]["numerator"], estimates["high"]["denominator"]) == (b_clipped, b_loss)
    assert estimates["low"]["value"] == pytest.approx(a_clipped / a_loss, rel=1e-12)
    (difference,) = [d for d in result["differences"] if d["metric"] == "clip_fraction"]
    assert difference["verdict"] == "different"
    # every step paired: the difference of the two runs' sums, on the log-ratio scale of the
    # clip fraction's relative margin (both runs clearly away from zero)
    paired = difference["difference"]
    assert difference["scale"] == "log-ratio"
    assert paired["value"] == pytest.approx(math.log((b_clipped / b_loss) / (a_clipped / a_loss)), rel=1e-9)
    assert paired["units"] == STEPS and paired["ci_low"] > 0.1
    assert result["verdict"] == "different"
    assert main(["compare", a_id, b_id, flag, str(directory), "--fail-on", "different"]) == 1


def test_a_backend_registered_with_one_call_logs_lists_and_compares(tmp_path, toy_backend, capsys):
    target = tmp_path / "toy-runs"
    runs = {
        name: _log_run(name, p, seed, sinks=[f"toy:{target}"], spool_dir=tmp_path / "spool")
        for name, p, seed in (("low", 0.10, 1), ("high", 0.30, 2))
    }
    assert len(list(target.glob("*.toy"))) == 2
    _round_trip("--toy", target, runs, capsys)
    # the worst sequences, read back by the toy's own worst reader through load_worst
    runset = load_runs([runs["low"][0], runs["high"][0]], toy_dir=str(target))
    tables = load_worst(runset)
    assert {label: [w.step for w in found] for label, found in tables.items()} == {
        "low": list(WORST_STEPS),
        "high": list(WORST_STEPS),
    }
    assert tables["high"][1].by["abs_log_ratio"][0].datum == 2000 + WORST_STEPS[1]
    # the toy's panels, reached by `cliptrack panels toy` through its registry entry alone
    out = tmp_path / "toy-panel.json"
    argv = ["panels", "toy", runs["low"][0], runs["high"][0], "--toy", str(target), "--out", str(out)]
    assert main(argv) == 0
    panel = json.loads(out.read_text(encoding="utf-8"))
    assert panel["runs"] == ["low", "high"]
    assert panel["verdicts"]["clip_fraction"] == "different"


def test_the_csv_backend_logs_lists_and_compares(tmp_path, capsys):
    target = tmp_path / "csv-runs"
    runs = {
        name: _log_run(
            name, p, seed, sinks=["csv"], sink_options={"csv": {"dir": target}}, spool_dir=tmp_path
        )
        for name, p, seed in (("low", 0.10, 3), ("high", 0.30, 4))
    }
    files = sorted(target.glob("*.csv"))
    assert [f.stem for f in files] == sorted(run_id for run_id, _, _ in runs.values())
    header, first = files[0].read_text(encoding="utf-8").splitlines()[:2]
    assert header == "step,key,value,wall_time" and first.startswith(",run:name,")
    _round_trip("--csv", target, runs, capsys)


def test_a_backend_without_the_store_flag_is_refused_by_name(tmp_path):
    from cliptrack.backends import load_runs

    with pytest.raises(TypeError, match=r"unknown store keyword\(s\) \['toy_dir'\]"):
        load_runs(["a"], toy_dir=str(tmp_path))
    with pytest.raises(ValueError, match="name one store, got jsonl_dir, csv_dir"):
        load_runs(["a"], jsonl_dir=str(tmp_path), csv_dir=str(tmp_path))


def test_a_backends_vendor_library_is_imported_only_when_it_is_used(tmp_path):
    """Logging to CSV and reading it back imports neither MLflow nor W&B."""
    probe = (
        "import sys\n"
        "from cliptrack import Tracker, load_runs\n"
        f"with Tracker('x', sinks=['csv:{tmp_path}'], spool_dir={str(tmp_path / 'spool')!r},"
        " handle_signals=False) as t:\n"
        "    t.log(0, {'reward:mean': 1.0})\n"
        f"assert len(load_runs(csv_dir={str(tmp_path)!r}).runs) == 1\n"
        "print(sorted(m for m in ('mlflow', 'wandb') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
