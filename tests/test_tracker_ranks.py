"""Ranks from every launcher: one run per job, whichever launcher started the processes."""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
import threading
import typing
from pathlib import Path

import mlflow
import pytest
from cliptrack.core import keys
from cliptrack.log.process import global_rank, rank_zero_only
from cliptrack.log.tracker import NullTracker, Tracker
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parents[1]
LAUNCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "PMI_RANK",
    "OMPI_COMM_WORLD_RANK",
    "CLIPTRACK_RANK",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({}, 0),
        ({"RANK": "3", "SLURM_PROCID": "1"}, 3),  # torchrun's RANK first
        ({"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "LOCAL_RANK": "0"}, 2),  # srun
        ({"PMI_RANK": "5"}, 5),  # MPICH / Intel MPI
        ({"OMPI_COMM_WORLD_RANK": "4", "LOCAL_RANK": "0"}, 4),  # Open MPI
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, 1),  # one node: local is global
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "8"}, 0),  # several nodes: not global
        ({"LOCAL_RANK": "1"}, 0),  # a world of unknown size: not global
        ({"CLIPTRACK_RANK": "0", "RANK": "3"}, 0),  # forced
    ],
)
def test_the_global_rank_comes_from_the_launcher(clean_env, env, rank):
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert global_rank() == rank


@pytest.mark.parametrize(
    "name", ["RANK", "SLURM_PROCID", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "CLIPTRACK_RANK"]
)
def test_a_rank_variable_that_is_not_a_rank_is_named(clean_env, name):
    clean_env.setenv(name, "x1")
    with pytest.raises(ValueError, match=f"{name}='x1' is not a global rank"):
        global_rank()


def test_the_rank_argument_forces_the_rank(clean_env, tmp_path):
    clean_env.setenv("SLURM_PROCID", "1")
    assert isinstance(Tracker(sinks=("jsonl",), spool_dir=tmp_path), NullTracker)
    with Tracker(sinks=("jsonl",), spool_dir=tmp_path, rank=0, handle_signals=False) as tracker:
        tracker.log(0, {"a:mean": 1.0})
    assert tracker.active and tracker.rank == 0 and (tmp_path / tracker.run_id / keys.POINTS_FILE).is_file()
    with pytest.raises(ValueError, match="rank=-1 is not a global rank"):
        Tracker(sinks=("jsonl",), spool_dir=tmp_path, rank=-1)


def test_a_null_tracker_lets_an_interrupt_through_its_with_block(clean_env, tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with Tracker(sinks=("jsonl",), spool_dir=tmp_path, rank=1) as tracker:
            tracker.log(0, {"a:mean": 1.0})
            raise KeyboardInterrupt
    assert not tracker.active and not any(tmp_path.iterdir())


def _public_api() -> dict[str, object]:
    """Tracker's public methods and properties, found on the class (a new one is covered at once),
    with the context-manager protocol."""
    return {
        name: inspect.getattr_static(Tracker, name)
        for name, value in inspect.getmembers(Tracker)
        if (not name.startswith("_") or name in ("__enter__", "__exit__"))
        and (callable(value) or isinstance(value, property))
    }


def _call_anything(method: typing.Callable[..., object], owner: object) -> object:
    """Call a bound method with ``object()`` for every required argument (and one extra positional):
    an inactive rank must not even look at them."""
    args: list[object] = []
    kwargs: dict[str, object] = {}
    for param in inspect.signature(method).parameters.values():
        if param.kind is param.VAR_POSITIONAL:
            args.append(object())
        elif param.default is not param.empty or param.kind is param.VAR_KEYWORD:
            continue
        elif param.kind is param.KEYWORD_ONLY:
            kwargs[param.name] = object()
        else:
            args.append(object())
    return method(*args, **kwargs)


def _expects(result: object, hint: object, tracker: object) -> None:
    """``result`` is what a caller of a method annotated ``-> hint`` can use; a context manager is
    entered and left, its value checked the same way."""
    if hint is type(None):
        assert result is None
        return
    origin = typing.get_origin(hint) or hint
    assert isinstance(result, origin), (result, hint)  # type: ignore[arg-type]
    if origin is contextlib.AbstractContextManager:
        with result as entered:  # type: ignore[attr-defined]
            (inner,) = typing.get_args(hint) or (object,)
            _expects(entered, inner, tracker)
    if origin is Tracker:
        assert result is tracker


def test_every_public_method_of_a_tracker_on_another_rank_writes_nothing(clean_env, tmp_path):
    """RANK=1 (torchrun) and SLURM_PROCID=1 (srun): every public method and property of Tracker,
    walked by introspection, returns what its annotation promises and writes nothing: no spool
    directory, no MLflow store, no background thread."""
    clean_env.setenv("RANK", "1")
    clean_env.setenv("SLURM_PROCID", "1")
    clean_env.chdir(tmp_path)  # MLflow's default store would be ./mlflow.db
    store = tmp_path / "store"
    clean_env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlflow.db'}")
    threads = threading.active_count()
    api = _public_api()
    assert {"log", "log_output", "log_config", "step", "flush", "close", "summary"} <= set(api)
    with Tracker("r1", sinks=("mlflow", "jsonl"), spool_dir=tmp_path / "spool") as tracker:
        assert isinstance(tracker, NullTracker) and (tracker.active, tracker.rank) == (False, 1)
        for name, member in api.items():
            if name in ("__enter__", "__exit__"):
                continue  # the with block itself
            if isinstance(member, property):
                result = getattr(tracker, name)
                hint = typing.get_type_hints(member.fget)["return"]
            else:
                result = _call_anything(getattr(tracker, name), tracker)
                hint = typing.get_type_hints(getattr(Tracker, name))["return"]
            _expects(result, hint, tracker)
        with pytest.raises(TypeError):  # a wrong call fails on every rank alike
            tracker.log(0)
    assert threading.active_count() == threads
    assert list(tmp_path.iterdir()) == []  # no spool directory, no MLflow store, no ./mlflow.db
    assert mlflow.active_run() is None


class _Real:
    def write(self, value: int) -> None:
        raise AssertionError("the real method ran")

    def count(self) -> int:
        raise AssertionError("the real method ran")

    @property
    def size(self) -> int:
        raise AssertionError("the real property ran")

    def __enter__(self) -> _Real:
        raise AssertionError("the real method ran")

    def __exit__(self, *exc: object) -> None:
        raise AssertionError("the real method ran")


def test_a_stand_in_covers_methods_and_properties_and_every_value_has_an_answer():
    answers = {"count": lambda self: 0, "size": lambda self: 7, "__enter__": lambda self: self}
    null = rank_zero_only(_Real, answers)(type("Null", (_Real,), {}))()
    with null as entered:
        assert entered is null
        assert (null.write(3), null.count(), null.size) == (None, 0, 7)
        with pytest.raises(TypeError):
            null.write()
    with pytest.raises(TypeError, match=r"_Real.count returns a value: give Null an answer"):
        rank_zero_only(_Real, {"size": lambda self: 7, "__enter__": lambda self: self})(
            type("Null", (_Real,), {})
        )
    with pytest.raises(TypeError, match=r"_Real.size returns a value"):
        rank_zero_only(_Real, {"count": lambda self: 0, "__enter__": lambda self: self})(
            type("Null", (_Real,), {})
        )
    with pytest.raises(TypeError, match=r"answers for \['counts'\]: not public"):
        rank_zero_only(_Real, {**answers, "counts": lambda self: 0})(type("Null", (_Real,), {}))
    own = type("Null", (_Real,), {"write": lambda self, value: None})
    with pytest.raises(TypeError, match=r"Null defines \['write'\] itself"):
        rank_zero_only(_Real, answers)(own)


def _launch(tmp_path: Path, db: Path, env_per_rank: list[dict[str, str]], *run_id: str) -> list[str]:
    """Start one worker per rank at once (as a launcher does); their report lines."""
    base = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and k != "WANDB_SERVICE"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests._tracking_worker",
                "rank",
                str(tmp_path / "spool"),
                f"sqlite:///{db}",
                *run_id,
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**base, "PYTHONPATH": str(REPO), **env},
        )
        for env in env_per_rank
    ]
    lines = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)  # MLflow's first sqlite store: minutes on a loaded machine
        assert proc.returncode == 0, err[-3000:]
        assert out.strip(), err[-3000:]
        lines.append(out.strip().splitlines()[-1])
    return lines


def _runs(db: Path) -> list[object]:
    client = MlflowClient(f"sqlite:///{db}")
    return list(client.search_runs([client.get_experiment_by_name("cliptrack").experiment_id]))


SRUN = [
    {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2", "LOCAL_RANK": str(rank)}
    for rank in range(2)
]


@pytest.mark.slow
def test_an_srun_job_without_rank_logs_one_mlflow_run(tmp_path):
    """srun sets SLURM_PROCID (and a launcher script often LOCAL_RANK), not RANK: both processes
    logged, two MLflow runs for one job."""
    db = tmp_path / "mlflow.db"
    lines = _launch(tmp_path, db, SRUN)
    assert lines[0].startswith("rank 0 active=True") and lines[1] == "rank 1 active=False run_id=None"
    (run,) = _runs(db)
    history = MlflowClient(f"sqlite:///{db}").get_metric_history(run.info.run_id, keys.LOSS_SUM)  # type: ignore[attr-defined]
    assert sorted(m.step for m in history) == list(range(5))


@pytest.mark.slow
def test_with_a_fixed_run_id_rank_0_owns_the_run(tmp_path):
    """With a fixed run id rank 0 crashed (the lock was taken) and rank 1 took the run."""
    db = tmp_path / "mlflow.db"
    lines = _launch(tmp_path, db, SRUN, "job-42")
    assert lines == ["rank 0 active=True run_id=job-42", "rank 1 active=False run_id=None"]
    (run,) = _runs(db)
    assert run.data.tags[keys.TAG_RUN_ID] == "job-42"  # type: ignore[attr-defined]
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == ["job-42"]
