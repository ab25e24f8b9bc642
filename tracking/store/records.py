"""The records the tracking core passes around: a point, the run it belongs to, run statuses.

One home for each: the spool writes them, sinks receive them, replay and the loaders read them
back through ``RunInfo.from_meta`` (the run.json mapping lives here and nowhere else).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cliptrack.core.text import printable as printable  # terminal escaping lives in cliptrack.core.text

RUNNING = "RUNNING"
FINISHED = "FINISHED"
FAILED = "FAILED"
KILLED = "KILLED"
STATUSES = (RUNNING, FINISHED, FAILED, KILLED)
"""Run statuses, spelled as MLflow's ``RunStatus`` names; W&B gets an exit code from them."""

EXIT_CODES = {FINISHED: 0, FAILED: 1, KILLED: 143}
"""Process-style exit code per terminal status (W&B ``finish(exit_code=...)``); 143 = 128 + SIGTERM."""

DEFAULT_EXPERIMENT = "cliptrack"

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


RawPoint = tuple[int, float, Mapping[str, float]]
"""A point as the writer holds it: a plain ``(step, wall_time, metrics)`` tuple. The garbage
collector stops tracking a plain tuple of numbers and a dict of floats (not a tuple subclass), so
tens of thousands of points buffered for a lagging backend cost a collection nothing."""


class Point(NamedTuple):
    """One ``log`` call: ``step`` (trainer steps, >= 0), ``wall_time`` (unix seconds), ``metrics``
    (``name:reduction`` -> value). Sinks receive these; ``Point._make(raw)`` builds one from a
    ``RawPoint``.
    """

    step: int
    wall_time: float
    metrics: Mapping[str, float]

    def to_json(self) -> dict[str, Any]:
        """The JSONL line form: ``{"step": int, "wall_time": float, "metrics": {key: float}}``."""
        return {"step": self.step, "wall_time": self.wall_time, "metrics": dict(self.metrics)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Point:
        """The point of one JSONL line; KeyError / TypeError / ValueError when it is not one."""
        return cls(
            int(obj["step"]), float(obj["wall_time"]), {k: float(v) for k, v in obj["metrics"].items()}
        )


@dataclass
class RunInfo:
    """The run every sink writes: one per training job, whatever the number of sinks or ranks.

    ``run_id`` is cliptrack's own id (see ``check_run_id``); sinks that mint their own ids (MLflow)
    record them in their replay state. ``started`` and ``ended`` are unix seconds. ``backend_label``
    names the training stack (stored under ``keys.TAG_BACKEND``; ``backend`` in run.json).
    """

    run_id: str
    run_name: str
    backend_label: str | None
    config: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    experiment: str = DEFAULT_EXPERIMENT
    status: str = RUNNING
    ended: float | None = None

    def to_meta(self) -> dict[str, Any]:
        """The run.json fields of this run (per-sink replay states live beside them under ``sinks``)."""
        meta: dict[str, Any] = {
            "run_id": self.run_id,
            "run_name": self.run_name,
            "backend": self.backend_label,
            "config": self.config,
            "started": self.started,
            "experiment": self.experiment,
            "status": self.status,
        }
        if self.ended is not None:
            meta["ended"] = self.ended
        return meta

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], run_id: str) -> RunInfo:
        """The run a run.json describes; ``run_id`` (the directory name) fills what it lacks."""
        ended = meta.get("ended")
        return cls(
            run_id=str(meta.get("run_id") or run_id),
            run_name=str(meta.get("run_name") or ""),
            backend_label=None if meta.get("backend") is None else str(meta["backend"]),
            config=dict(meta.get("config") or {}),
            started=float(meta.get("started") or 0.0),
            experiment=str(meta.get("experiment") or DEFAULT_EXPERIMENT),
            status=str(meta.get("status") or RUNNING),
            ended=None if ended is None else float(ended),
        )


def check_run_id(run_id: object) -> str:
    """``run_id`` if it is safe as a directory name and a backend id (letters, digits, ``_``, ``-``;
    1..128 characters, starting with a letter or digit); ValueError naming it otherwise."""
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise ValueError(
            f"run_id {run_id!r} is not a valid run id: use 1 to 128 letters, digits, '_' or '-', "
            "starting with a letter or digit (it names a directory under the spool)"
        )
    return run_id
