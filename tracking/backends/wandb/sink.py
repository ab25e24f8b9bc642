"""W&B sink: one W&B run per training job, online when credentials exist, offline otherwise.

Every row carries the trainer's step under ``keys.WANDB_STEP_METRIC`` and the point's wall time
(unix seconds) under ``keys.WANDB_WALL_TIME``; every metric is declared against the step metric
with ``define_metric``, and rows are logged without W&B's own ``step=`` argument, so out-of-order
or repeated trainer steps are kept as rows (W&B would drop a step lower than its current one).
Keys keep their ``:``; W&B reads ``.`` in a *defined* metric name as nesting, which the metric
keys (``name:reduction``) never contain.

Summaries: ``clip_fraction:mean`` keeps ``mean`` (unweighted over steps) and ``last``; the count
series keep ``last``. The token-weighted fraction of a whole run is a ratio of summed counts and
is computed by the comparison, not by a W&B summary.

What W&B holds is what reached the run's ``.wandb`` transaction log, not what ``run.log``
accepted: after a crash ``delivered`` reads the log(s) back and finds the last row in the journal,
so replay sends exactly the rows that are missing (none twice). That holds only if the run's
wandb-core ends with the process that logs it: the sink never attaches to a service inherited
through ``WANDB_SERVICE`` (a parent's, or a detached ``wandb beta core`` one), which would keep a
killed run open and refuse its resume ("run ID ... is in use"); it starts one of its own. The W&B directory is resolved once
(``dir=``, else ``WANDB_DIR``, else the working directory) and recorded for replay.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from cliptrack.backends.base import Alert, PartialWrite, Sink, SinkError, exit_code
from cliptrack.backends.wandb import _compat as compat
from cliptrack.core import keys
from cliptrack.core.secrets import redact_value
from cliptrack.core.worst import Worst
from cliptrack.store import worst as worst_store
from cliptrack.store.records import Point, RunInfo

DEFAULT_PROJECT = "cliptrack"


def has_credentials() -> bool:
    """True when a W&B API key is available (``WANDB_API_KEY`` or a netrc entry for the host)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_mode(mode: str | None) -> str:
    """The explicit mode, else ``WANDB_MODE``, else "online" with credentials and "offline" without."""
    return mode or os.environ.get("WANDB_MODE") or ("online" if has_credentials() else "offline")


class WandbSink(Sink):
    """Logs to W&B. ``project`` defaults to ``WANDB_PROJECT`` or "cliptrack"; ``dir`` to W&B's own."""

    name = "wandb"

    def __init__(
        self,
        project: str | None = None,
        *,
        entity: str | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
    ) -> None:
        import wandb  # noqa: F401 - imported on the constructing thread, before the tracker freezes the heap

        self.project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.entity = entity
        self.mode = resolve_mode(mode)
        self.dir = compat.resolve_dir(dir)
        self.run: Any = None
        self._run_id: str | None = None

    @classmethod
    def from_spec(cls, argument: str | None, options: Mapping[str, Any]) -> WandbSink:
        """``"wandb"`` (the ``project`` option), ``"wandb:project"`` or ``"wandb:entity/project"``;
        the options ``project``, ``entity``, ``mode``, ``dir`` are the constructor's
        (``Tracker(sink_options={"wandb": {...}})``)."""
        project, entity = options.get("project"), options.get("entity")
        rest = (argument or "").strip("/")
        if rest:
            entity, _, project = rest.rpartition("/")
        return cls(project, entity=entity or None, mode=options.get("mode"), dir=options.get("dir"))

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **overrides: Any) -> WandbSink:
        """Rebuilt for replay; ``overrides`` (``project``, ``entity``, ``mode``, ``dir``) re-target it."""
        merged = {**state, **{k: v for k, v in overrides.items() if v is not None}}
        return cls(
            merged.get("project"), entity=merged.get("entity"), mode=merged.get("mode"), dir=merged.get("dir")
        )

    @property
    def location(self) -> str:
        where = ""
        if self.run is not None:
            url = getattr(self.run, "url", None) if self.mode == "online" else None
            where = f" {url}" if url else f" {os.path.dirname(self.run.dir)}"
        return f"wandb {self.mode} project {self.project!r} run {self._run_id or '(not started)'}{where}"

    def settings(self) -> dict[str, Any]:
        """What replay needs to resume this run."""
        return {"project": self.project, "entity": self.entity, "mode": self.mode, "dir": self.dir}

    def check_key(self, key: str) -> None:
        if key in (keys.WANDB_STEP_METRIC, keys.WANDB_WALL_TIME) or key.startswith("_"):
            raise ValueError(f"W&B reserves the key {key!r}; choose another metric name")

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        import wandb

        state = dict(state or {})
        self.project = state.get("project") or self.project
        self.entity = state.get("entity") or self.entity
        self.mode = state.get("mode") or self.mode
        self.dir = state.get("dir") or self.dir
        self._run_id = run.run_id
        config = {
            **redact_value(run.config),
            keys.TAG_BACKEND: run.backend_label,
            keys.TAG_RUN_ID: run.run_id,
        }
        compat.own_service()
        if state:
            compat.leave_the_second_of(compat.resolve_dir(self.dir), run.run_id)
        try:
            self.run = wandb.init(
                project=self.project,
                entity=self.entity,
                name=run.run_name,
                id=run.run_id,
                group=run.backend_label,
                job_type="training",
                config=config,
                mode=self.mode,  # type: ignore[arg-type]
                dir=self.dir,
                resume="allow" if state else None,
                reinit="create_new",
                settings=wandb.Settings(console="off", quiet=True, silent=True),
            )
            self.run.define_metric(keys.WANDB_STEP_METRIC)
            self.run.define_metric("*", step_metric=keys.WANDB_STEP_METRIC)
            self.run.define_metric(
                keys.CLIP_FRACTION, step_metric=keys.WANDB_STEP_METRIC, summary="mean,last"
            )
            for key in keys.TOKEN_COUNT_KEYS:
                self.run.define_metric(key, step_metric=keys.WANDB_STEP_METRIC, summary="last")
        except Exception as exc:
            raise SinkError(
                f"could not start the W&B run ({self.mode}): {type(exc).__name__}: {exc}"
            ) from exc
        return self.settings()

    def log_config(self, config: Mapping[str, Any]) -> None:
        if self.run is None:
            raise SinkError("W&B run is not open")
        self.run.config.update(redact_value(dict(config)), allow_val_change=True)

    def write(self, points: Sequence[Point]) -> None:
        if self.run is None:
            raise SinkError("W&B run is not open")
        for index, point in enumerate(points):
            if not point.metrics:  # every key refused for W&B (cliptrack.log._pipeline.delivery): no row
                continue
            row = {keys.WANDB_STEP_METRIC: point.step, keys.WANDB_WALL_TIME: point.wall_time}
            row.update(point.metrics)
            try:
                self.run.log(row)
            except Exception as exc:
                raise PartialWrite(index, exc) from exc

    def alert(self, alert: Alert) -> None:
        """A live watch's breach through ``run.alert`` (title at most 63 characters, W&B's limit).
        Online, W&B sends it by e-mail or Slack as the user's settings say; offline, it is a record
        of the run's ``.wandb`` file, sent by ``wandb sync``."""
        if self.run is None:
            raise SinkError("W&B run is not open")
        self.run.alert(title=alert.title[:63], text=alert.text, level=alert.level)

    def log_worst(self, worst: Worst) -> None:
        """A step's worst sequences as a ``wandb.Table`` (``worst_store.TABLE_COLUMNS``) under
        ``worst_store.WANDB_KEY`` at the trainer step. The row carries no wall time, so ``delivered``
        (which matches rows to journal points) never takes it for a point; offline, the table is a
        file of the run's ``files/media/table`` that ``wandb sync`` uploads."""
        import wandb

        if self.run is None:
            raise SinkError("W&B run is not open")
        table = wandb.Table(columns=list(worst_store.TABLE_COLUMNS), data=worst_store.table_rows(worst))
        self.run.log({keys.WANDB_STEP_METRIC: worst.step, worst_store.WANDB_KEY: table})

    def close(self, status: str) -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=exit_code(status))
        except Exception as exc:
            raise SinkError(f"could not finish the W&B run: {type(exc).__name__}: {exc}") from exc
        finally:
            self.run = None

    def delivered(self, run: RunInfo, journal: Iterable[tuple[Point, int]]) -> int | None:
        """The journal offset just past the last row found in this run's ``.wandb`` file(s).

        Rows are written to a ``.wandb`` file in logging order, so the rows of each file are a prefix
        of what its process logged; each row is identified in the journal by its trainer step and
        wall time (stamped once per ``log`` call). 0 when no file holds a row of the run.
        """
        lasts = set()
        for path in compat.run_files(self.dir, run.run_id):
            last = None
            for row in compat.history_rows(path):
                if keys.WANDB_STEP_METRIC in row and keys.WANDB_WALL_TIME in row:
                    last = (row[keys.WANDB_STEP_METRIC], row[keys.WANDB_WALL_TIME])
            if last is not None:
                lasts.add((int(last[0]), float(last[1])))
        if not lasts:
            return 0
        end = 0
        for point, offset in journal:
            if (point.step, point.wall_time) in lasts:
                end = offset
        return end
