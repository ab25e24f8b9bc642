"""A live watch: chosen series followed during training against a band, alerts on a breach.

``Tracker(..., watch=...)`` takes a ``Watch`` (or its string form, or a list of either); each names
a metric key, where its band comes from (the run's own first ``window`` points, or a reference
run: a run directory of the spool, or its values) and the rule's settings. The statistics are
``cliptrack.compare.stats.watch`` (a CUSUM on the log of the series, scaled by the long-run sd of
the reference window: autocorrelation and long memory widen it; docs/TRACKING.md "A live watch").

``log`` never waits on the watch: it appends the watched values of a point to a bounded in-memory
queue (O(number of watches); past ``MAX_QUEUED`` points the oldest are dropped and counted) and
wakes the watch's own thread, which updates the rule and, on a breach, raises the alert:

- one line on stderr, always (``cliptrack watch: ...``);
- each remote sink's own mechanism, on the sink's lane thread (``cliptrack.backends.base.Sink.alert``:
  W&B ``run.alert``; MLflow the tag ``cliptrack.watch.<key>`` and the metric ``watch.<key>.breach``);
- a line of ``watch.jsonl`` in the run directory (the spool's record of the run's breaches);
- the watch's ``on_breach(alert)`` callback, on the watch thread (to checkpoint, or to set a flag
  the training loop reads and stops on). A callback that raises (``SystemExit`` and
  ``KeyboardInterrupt`` too) is reported in one stderr line and never propagated: every watch goes
  on. A slow one delays only later alerts, never ``log``; one stuck at ``close`` is left behind
  (``cliptrack.log.tracker.WATCH_CLOSE_SHARE``). The callback may not close the run (``close()``
  there raises RuntimeError): it sets a flag the training loop reads.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cliptrack.backends.base import Alert
from cliptrack.compare.quantities import ABS_LOG_RATIO_FLOOR, CLIP_FLOOR, KL_FLOOR, WEIGHT_LAG_FLOOR
from cliptrack.compare.stats import watch as rule
from cliptrack.core.secrets import redact, redacted_repr
from cliptrack.core.text import printable
from cliptrack.store import journal
from cliptrack.store.spool import RunDir

LOG = logging.getLogger("cliptrack")

ENV = "CLIPTRACK_WATCH"
"""Environment variable holding the string form of the watches, read when ``Tracker(watch=None)``."""
MAX_QUEUED = 100_000
"""Points the watch's queue holds before dropping its oldest (the watch thread is behind)."""
MAX_SEEN_KEYS = 10_000
"""Most distinct logged keys kept for the suggestion when a watched key is never logged."""
BREACHES_FILE = "watch.jsonl"
"""The run directory's record of the breaches, one JSON object (an ``Alert``) per line."""
REFERENCE_TIMEOUT_S = 12.0
"""Seconds a reference run on a server may take to be read when the tracker opens (a server that
accepts connections and never replies would hold ``Tracker()`` 184 s): the bounds a read already has
against a server it cannot reach, ``cliptrack.backends.preflight.PROBE_TIMEOUT_S`` (3 s) to probe it
plus 9 s of connection attempts (MLflow's reads: three of 2 s and the backoff between them). Past
it the tracker raises, before the run is opened."""

OnBreach = Callable[[Alert], object]

FLOORS = {
    "kl_k3": KL_FLOOR,
    "drift_kl_k3": KL_FLOOR,
    "engine_kl_k3": KL_FLOOR,
    "clip_fraction": CLIP_FLOOR,
    "abs_log_ratio": ABS_LOG_RATIO_FLOOR,
    "weight_lag": WEIGHT_LAG_FLOOR,
}
"""The log scale's floor per metric name: the comparison's floor near zero of the quantity
(``cliptrack.compare.quantities``); a watched value ``x`` is read as ``log(x + floor)``."""


def default_floor(key: str, scale: str) -> float:
    """The floor a watch of ``key`` uses unless given one: the quantity's (``FLOORS``) on the log
    scale, else 0."""
    return FLOORS.get(key.partition(":")[0], 0.0) if scale == "log" else 0.0


STORES = {"jsonl:": "jsonl_dir", "csv:": "csv_dir", "wandb:": "wandb_dir"}
"""A reference's store prefix -> the ``load_runs`` keyword it names; any other store text before
``#`` is an MLflow tracking URI (``sqlite:///mlflow.db``, ``http://host:5000``)."""


@dataclass(frozen=True)
class RunRef:
    """A reference run in any store ``cliptrack.load_runs`` reads: ``run`` (an id or a run name, as
    ``load_runs`` takes it) and ``store``, its keywords as ``(name, value)`` pairs
    (``(("tracking_uri", "sqlite:///mlflow.db"),)``, ``(("jsonl_dir", "spool"),)``,
    ``(("wandb_dir", "wandb"),)``). The string form is ``STORE#RUN``: ``sqlite:///mlflow.db#RUN_ID``
    (an MLflow tracking URI), ``jsonl:DIR#RUN``, ``csv:DIR#RUN``, ``wandb:DIR#RUN``."""

    run: str
    store: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, text: str) -> RunRef:
        """The reference ``STORE#RUN`` names (ValueError without a ``#`` or a run)."""
        store, sep, run = text.rpartition("#")
        if not sep or not store or not run:
            raise ValueError(
                redact(f"reference {printable(text)!r}: expected STORE#RUN (sqlite:///mlflow.db#RUN_ID)")
            )
        for prefix, keyword in STORES.items():
            if store.startswith(prefix):
                return cls(run, ((keyword, store[len(prefix) :]),))
        return cls(run, (("tracking_uri", store),))

    def __repr__(self) -> str:
        return redacted_repr(self)

    def __str__(self) -> str:
        """For humans: the run and its store, without the store's credentials."""
        # each value redacted alone: in the sentence, a URI's query value would run on into the ')'
        where = ", ".join(f"{k}={redact(str(v))}" for k, v in self.store)
        return redact(f"{self.run} ({where})" if where else self.run)

    def run_directory(self) -> Path | None:
        """The run's directory when the store is a spool (``jsonl:DIR#RUN_ID``) holding it by id:
        its journal is read for the one key (``cliptrack.store.journal.load_series``)."""
        store = dict(self.store)
        if set(store) != {"jsonl_dir"}:
            return None
        path = Path(os.fspath(store["jsonl_dir"])) / self.run
        return path if (path / "points.jsonl").is_file() else None

    def remote(self) -> bool:
        """Whether the store is reached over a network (an MLflow tracking server or database,
        W&B's API, or MLflow's default store named by ``MLFLOW_TRACKING_URI``): its read is bounded
        by ``REFERENCE_TIMEOUT_S``. A sqlite file and the stores' directories are read as they are."""
        store = dict(self.store)
        if store.keys() & {"jsonl_dir", "csv_dir", "wandb_dir"}:
            return False
        uri = str(store.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:")
        return "://" in uri and not uri.startswith(("sqlite:", "file:"))

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """The run's ``(steps, values)`` of ``key``, read through ``load_runs``."""
        from cliptrack.backends.load import load_runs

        runset = load_runs([self.run], **dict(self.store))
        label = runset.labels[0]
        wide = runset.wide(label)
        if key not in wide.columns:
            return [], []
        column = wide[key].dropna()
        return [int(s) for s in column.index], [float(v) for v in column.to_numpy()]


@dataclass(frozen=True)
class Watch:
    """One watched series.

    ``key``: the metric key (``kl_k3:mean``); ``reference``: None for the run's own first ``window``
    points, else a reference run: a ``RunRef`` (or its string form ``STORE#RUN``, e.g.
    ``sqlite:///mlflow.db#RUN_ID``: any store ``load_runs`` reads), its spool run directory
    (``<spool>/<run id>``), or its values (a sequence, one per point, or a mapping step -> value);
    ``window``: points of the reference window, and of
    a reference run's smoothing; ``direction``: "up", "down" or "both"; ``scale``: "log" (positive
    series: KL, fractions) or "value"; ``k``, ``h``: the CUSUM's allowance and threshold in long-run
    sd; ``floor``: on the log scale the series is ``log(x + floor)`` (None: the quantity's floor,
    ``FLOORS``, else 0); ``on_breach``: called with each ``Alert`` on the watch thread."""

    key: str
    reference: RunRef | str | os.PathLike[str] | Sequence[float] | Mapping[int, float] | None = None
    window: int = rule.WINDOW
    direction: str = "up"
    scale: str = "log"
    k: float = rule.K
    h: float = rule.H
    floor: float | None = None
    on_breach: OnBreach | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or self.key.count(":") != 1:
            raise ValueError(f"Watch key={self.key!r}: expected a metric key 'name:reduction'")
        for name in ("k", "h", "floor"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise TypeError(f"Watch {self.key} {name}={value!r}: expected a number")
        if self.reference is not None and not isinstance(
            self.reference, (RunRef, str, os.PathLike, Sequence, Mapping)
        ):
            raise TypeError(
                f"Watch {self.key} reference={self.reference!r}: expected STORE#RUN, a RunRef, a spool "
                "run directory, or the reference values (a sequence, or a mapping step -> value)"
            )
        rule.check_settings(
            scale=self.scale,
            direction=self.direction,
            window=self.window,
            k=self.k,
            h=self.h,
            floor=self.offset,
        )
        if self.on_breach is not None and not callable(self.on_breach):
            raise ValueError(f"Watch on_breach={self.on_breach!r}: expected a callable taking an Alert")

    def __repr__(self) -> str:
        return redacted_repr(self)

    @property
    def offset(self) -> float:
        """The floor in use (``floor``, or the quantity's default)."""
        return default_floor(self.key, self.scale) if self.floor is None else self.floor

    @property
    def source(self) -> str:
        """Where the band comes from, for humans: escaped for a terminal, and without the
        credentials of a reference's store (``cliptrack.core.secrets``), as every alert, sink and
        ``watch.jsonl`` takes it from here."""
        return redact(self._source())

    def _source(self) -> str:
        if self.reference is None:
            return f"the run's first {self.window} points"
        if isinstance(self.reference, RunRef):
            return f"reference run {printable(str(self.reference))}"
        if isinstance(self.reference, str) and "#" in self.reference:
            return f"reference run {printable(str(RunRef.parse(self.reference)))}"
        if isinstance(self.reference, (str, os.PathLike)):
            return f"reference run {printable(os.fspath(self.reference))}"
        return f"{len(self.reference)} reference values"


_OPTIONS: dict[str, Callable[[str], Any]] = {
    "reference": str,
    "window": int,
    "direction": str,
    "scale": str,
    "k": float,
    "h": float,
    "floor": float,
}


def parse_watch(text: str) -> list[Watch]:
    """Watches from their string form (a config file, ``CLIPTRACK_WATCH``, the command line): entries
    separated by ``;``, each ``KEY[,option=value...]`` with the options ``reference`` (a run
    directory), ``window``, ``direction``, ``scale``, ``k``, ``h``, ``floor``. Example:
    ``"kl_k3:mean;abs_log_ratio:mean,window=200,direction=both"``."""
    if not isinstance(text, str):
        raise ValueError(f"watch={text!r}: expected a string such as 'kl_k3:mean,window=100'")
    out = []
    for entry in text.split(";"):
        entry = entry.strip()
        if not entry:
            continue
        key, *options = (part.strip() for part in entry.split(","))
        given: dict[str, Any] = {}
        for option in options:
            name, sep, value = option.partition("=")
            name = name.strip()
            if not sep or name not in _OPTIONS:
                raise ValueError(
                    redact(
                        f"watch {entry!r}: {option!r} is not 'option=value' with an option of {sorted(_OPTIONS)}"
                    )
                )
            try:
                given[name] = _OPTIONS[name](value.strip())
            except ValueError:
                raise ValueError(
                    redact(f"watch {entry!r}: {name}={value.strip()!r} is not a valid {name}")
                ) from None
        out.append(Watch(key, **given))
    if not out:
        raise ValueError(redact(f"watch={text!r} names no metric key"))
    return out


def watches(given: Watch | str | Iterable[Watch | str] | None) -> list[Watch]:
    """The watches a ``Tracker(watch=...)`` argument names (``CLIPTRACK_WATCH`` when None); a key
    watched twice is refused."""
    if given is None:
        env = os.environ.get(ENV, "").strip()
        try:
            return parse_watch(env) if env else []
        except ValueError as exc:
            raise ValueError(redact(f"{ENV}={printable(env)!r}: {exc}")) from None
    if not isinstance(given, (Watch, str, Iterable)):
        raise TypeError(f"watch={given!r}: expected a Watch, its string form, or a list of them")
    items: Iterable[Watch | str] = [given] if isinstance(given, (Watch, str)) else given
    out: list[Watch] = []
    for item in items:
        if isinstance(item, Watch):
            out.append(item)
        elif isinstance(item, str):
            out.extend(parse_watch(item))
        else:
            raise ValueError(redact(f"watch: {item!r} is neither a Watch nor its string form"))
    keys = [w.key for w in out]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"watch names {twice} more than once")
    return out


def reference_series(watch: Watch) -> tuple[list[int], list[float]]:
    """The reference run's ``(steps, values)`` of the watched key: read through ``load_runs`` (a
    ``RunRef`` or ``STORE#RUN``), from its spool run directory (its journal), or the values given
    (steps 0, 1, ... for a sequence)."""
    ref = watch.reference
    if ref is None:
        raise ValueError(f"watch {watch.key}: no reference run")
    if isinstance(ref, str) and "#" in ref:
        ref = RunRef.parse(ref)
    if isinstance(ref, RunRef):
        return _run_ref_series(watch, ref)
    if isinstance(ref, (str, os.PathLike)):
        return _spool_series(watch, ref)
    try:
        if isinstance(ref, Mapping):
            pairs = sorted((int(s), float(v)) for s, v in ref.items())
            return [s for s, _ in pairs], [v for _, v in pairs]
        values = [float(v) for v in ref]
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"watch {watch.key}: the reference values must be numbers: {printable(str(exc))}"
        ) from None
    return list(range(len(values))), values


def _run_ref_series(watch: Watch, ref: RunRef) -> tuple[list[int], list[float]]:
    """The watched key's ``(steps, values)`` from a reference in a store: a spool's run directory
    read for the key alone; a server's run within ``REFERENCE_TIMEOUT_S``; ValueError naming the
    watch and the store for any failure (a store's own exception, ``MlflowException``, included)."""
    run_dir = ref.run_directory()
    if run_dir is not None:
        return _spool_series(watch, run_dir)
    try:
        if not ref.remote():
            return ref.series(watch.key)
        series: tuple[list[int], list[float]] = _within(REFERENCE_TIMEOUT_S, lambda: ref.series(watch.key))
        return series
    except TimeoutError:
        raise ValueError(
            f"watch {watch.key}: {watch.source}: no answer within {REFERENCE_TIMEOUT_S:g} s (a server "
            "that accepts the connection but does not reply?)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - named with the watch, never raw
        raise ValueError(f"watch {watch.key}: {watch.source}: {printable(redact(str(exc)))}") from None


def _spool_series(watch: Watch, ref: str | os.PathLike[str]) -> tuple[list[int], list[float]]:
    """The watched key's ``(steps, values)`` from a spool run directory's journal (or the journal
    file itself)."""
    path = Path(ref)
    points_path = path / "points.jsonl" if path.is_dir() else path
    if not points_path.is_file():
        raise ValueError(
            f"watch {watch.key}: reference {printable(redact(os.fspath(ref)))} holds no points.jsonl"
        )
    try:
        steps, values = journal.load_series(points_path, watch.key)
    except (OSError, ValueError) as exc:
        raise ValueError(f"watch {watch.key}: {watch.source}: {printable(redact(str(exc)))}") from None
    return steps.tolist(), values.tolist()


def _within(seconds: float, read: Callable[[], Any]) -> Any:
    """``read()`` on a thread of its own, waited for ``seconds`` at most: its value, or its
    exception raised again; TimeoutError when it has not returned by then (the thread is left to
    end by itself: a daemon that holds nothing of the run)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = read()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="cliptrack-watch-reference", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def band_of_reference(watch: Watch) -> rule.Band:
    """The band a watch's reference run gives (ValueError naming the watch when it cannot)."""
    steps, values = reference_series(watch)
    scale, offset, watched = watch.scale, watch.offset, rule.watched
    kept = [
        (s, z) for s, v in zip(steps, values, strict=True) if (z := watched(v, scale, offset)) is not None
    ]
    try:
        return rule.reference_band([s for s, _ in kept], [z for _, z in kept], watch.window, scale, offset)
    except ValueError as exc:
        raise ValueError(f"watch {watch.key}: {watch.source}: {exc}") from None


class _Follow:
    """One watch's state: the reference window being filled, then the CUSUM."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.cusum: rule.Cusum | None = None
        self.window: list[float] = []
        self.broken: set[str] = set()
        """The sides alerted since the last finite value (one alert per side and run of such values)."""
        if watch.reference is not None:
            self.cusum = self._rule(band_of_reference(watch))

    def not_finite(self, value: float) -> str | None:
        """The direction of an alert for a value that is not finite, the first of a run of such
        values on its side (``+inf`` up, ``-inf`` down, NaN the watched side), when that side is
        watched; else None. The band has no reading of it, so the CUSUM alone would never see a
        series that blew up."""
        side = "down" if value == -math.inf else "up"
        if math.isnan(value):
            side = "down" if self.watch.direction == "down" else "up"
        if side in self.broken or self.watch.direction not in (side, "both"):
            return None
        self.broken.add(side)
        return side

    def _rule(self, band: rule.Band) -> rule.Cusum:
        w = self.watch
        return rule.Cusum(band, direction=w.direction, k=w.k, h=w.h)

    def update(self, step: int, value: float) -> rule.Breach | None:
        self.broken.clear()
        if self.cusum is not None:
            return self.cusum.update(step, value)
        z = rule.watched(value, self.watch.scale, self.watch.offset)
        if z is not None:
            self.window.append(z)
            if len(self.window) >= self.watch.window:
                self.cusum = self._rule(rule.own_band(self.window, self.watch.scale, self.watch.offset))
                self.window = []
        return None


def describe(watch: Watch, breach: rule.Breach, run_id: str) -> Alert:
    """The ``Alert`` of a breach: its numbers and the sentence each sink shows (no credential:
    the text is redacted where it is made)."""
    moved = "above" if breach.direction == "up" else "below"
    title = f"cliptrack watch: {watch.key} {moved} its band"
    text = (
        f"run {run_id}: {watch.key} = {breach.value:.6g} at step {breach.step}, {moved} its band "
        f"(expected {breach.expected:.6g}; CUSUM {breach.statistic:.1f} > {watch.h:g} long-run sd; "
        f"band from {watch.source})"
    )
    return Alert(
        run_id=run_id,
        key=watch.key,
        step=breach.step,
        value=breach.value,
        expected=breach.expected,
        statistic=breach.statistic,
        threshold=watch.h,
        direction=breach.direction,
        reference=watch.source,
        title=redact(title),
        text=redact(text),
    )


def describe_not_finite(watch: Watch, step: int, value: float, direction: str, run_id: str) -> Alert:
    """The ``Alert`` of a watched value that is not finite (NaN or infinite): the series has no
    reading the band could follow, so it is raised at once (statistic NaN)."""
    title = f"cliptrack watch: {watch.key} is {value}"
    text = (
        f"run {run_id}: {watch.key} = {value} at step {step}: not a finite number, so it is off its "
        f"band (band from {watch.source}); raised once until a finite value returns"
    )
    return Alert(
        run_id=run_id,
        key=watch.key,
        step=step,
        value=value,
        expected=math.nan,
        statistic=math.nan,
        threshold=watch.h,
        direction=direction,
        reference=watch.source,
        title=redact(title),
        text=redact(text),
    )


class Detector:
    """The watches of one run, followed synchronously: ``update(step, metrics)`` returns the alerts
    the point completes. The watch thread (``Watcher``) and ``cliptrack watch`` share it."""

    def __init__(self, chosen: Sequence[Watch], run_id: str) -> None:
        self.run_id = run_id
        self.follows = [_Follow(w) for w in chosen]

    def update(self, step: int, metrics: Mapping[str, float]) -> list[Alert]:
        """The alerts of one point; a watch that fails on it is reported and skipped, the others
        still follow it."""
        out = []
        for follow in self.follows:
            value = metrics.get(follow.watch.key)
            if value is None:
                continue
            try:
                alert = self._follow(follow, step, float(value))
            except Exception as exc:  # noqa: BLE001 - one watch never stops the others
                LOG.warning("the watch of %s failed at step %d: %s", follow.watch.key, step, printable(exc))
                continue
            if alert is not None:
                out.append(alert)
        return out

    def _follow(self, follow: _Follow, step: int, value: float) -> Alert | None:
        if not math.isfinite(value):
            side = follow.not_finite(value)
            return None if side is None else describe_not_finite(follow.watch, step, value, side, self.run_id)
        breach = follow.update(step, value)
        return None if breach is None else describe(follow.watch, breach, self.run_id)


class Watcher:
    """A run's watches on their own thread (see the module docstring). ``deliver(alert)`` hands an
    alert to the sinks' lanes; ``run_dir`` gets ``watch.jsonl``."""

    def __init__(
        self,
        chosen: Sequence[Watch],
        run_dir: RunDir,
        deliver: Callable[[Alert], None],
        detector: Detector | None = None,
    ) -> None:
        """``detector``: the watches' ``Detector`` when already built (their reference runs read
        before the run was opened), else built here."""
        self.detector = detector if detector is not None else Detector(chosen, run_dir.run_id)
        self.watched = tuple(w.key for w in chosen)
        self.callbacks = {w.key: w.on_breach for w in chosen}
        self.run_dir = run_dir
        self._deliver = deliver
        self._queue: deque[tuple[int, tuple[float | None, ...]]] = deque()
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._offered = 0
        """Points queued so far (written by the training thread only)."""
        self._done = 0
        """Points followed so far (written by the watch thread only)."""
        self._stopping = False
        self.dropped = 0
        """Points dropped from the queue because the watch thread was behind."""
        self.keys = KeysSeen(self.watched)
        """Which watched keys the points carried (a mistyped key is named at ``stop``)."""
        self.alerts: list[Alert] = []
        self.callback_errors = 0
        self._thread = threading.Thread(target=self._run, name="cliptrack-watch", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------------------------------
    def offer(self, step: int, metrics: Mapping[str, float]) -> None:
        """Queue the watched values of one point; never waits (O(number of watches); while a watched
        key is still unseen, O(keys of the point) more)."""
        self.keys.note(metrics)
        values = tuple(metrics.get(key) for key in self.watched)
        if all(v is None for v in values):
            return
        if len(self._queue) >= MAX_QUEUED:
            self._queue.popleft()
            self.dropped += 1
        self._queue.append((step, values))
        self._offered += 1
        self._wake.set()

    # ---- any thread ------------------------------------------------------------------------------
    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued point is followed (and its alerts raised); False on timeout."""
        target = self._offered
        with self._progress:
            return self._progress.wait_for(lambda: self._done + self.dropped >= target, max(0.0, timeout_s))

    def stop(self, timeout_s: float) -> None:
        """Follow what is queued, then end the thread, within ``timeout_s`` seconds in all: a
        callback still running then (stuck) is left behind on its daemon thread."""
        deadline = time.monotonic() + timeout_s
        self.drain(timeout_s)
        self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        for line in self.keys.never_logged():
            stderr_line(line)

    def on_watch_thread(self) -> bool:
        """Whether the calling thread is the watch's own (an ``on_breach`` callback runs there)."""
        return threading.current_thread() is self._thread

    # ---- watch thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while self._queue:
                try:
                    step, values = self._queue.popleft()
                except IndexError:  # the training thread dropped it meanwhile
                    break
                try:
                    self._follow(step, values)
                except BaseException as exc:  # noqa: BLE001 - the thread never ends before stop
                    LOG.warning("the watch failed at step %d: %s", step, printable(repr(exc)))
                self._done += 1
                with self._progress:
                    self._progress.notify_all()
            if self._stopping and not self._queue:
                return

    def _follow(self, step: int, values: tuple[float | None, ...]) -> None:
        metrics = {k: v for k, v in zip(self.watched, values, strict=True) if v is not None}
        try:
            alerts = self.detector.update(step, metrics)
        except Exception as exc:  # noqa: BLE001 - a watch never stops training
            LOG.warning("the watch failed at step %d: %s", step, printable(exc))
            return
        for alert in alerts:
            self._raise(alert)

    def _raise(self, alert: Alert) -> None:
        self.alerts.append(alert)
        stderr_line(alert.text)
        try:
            with open(self.run_dir.path / BREACHES_FILE, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(asdict(alert), allow_nan=True) + "\n")
        except OSError as exc:
            LOG.warning("cannot record the breach in %s: %s", printable(self.run_dir.path), printable(exc))
        try:
            self._deliver(alert)
        except Exception as exc:  # noqa: BLE001 - reported, never raised into training
            LOG.warning("the alert could not be handed to the sinks: %s", printable(exc))
        callback = self.callbacks.get(alert.key)
        if callback is None:
            return
        try:
            callback(alert)
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too: reported, never propagated
            self.callback_errors += 1
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            stderr_line(f"on_breach of {alert.key} raised {why}; the watches go on")


class KeysSeen:
    """Which watched keys a run's points carried, so that a watch on a key never logged (a typo, a
    ``:sum`` for a ``:mean``) is named instead of staying silent. ``note`` is O(watches) once every
    watched key was seen, O(keys of the point) before."""

    def __init__(self, watched: Iterable[str]) -> None:
        self.unseen = set(watched)
        self.points = 0
        self.seen: set[str] = set()
        """The points' keys while a watched key is unseen (at most ``MAX_SEEN_KEYS``: the suggestions' pool)."""

    def note(self, metrics: Mapping[str, object]) -> None:
        self.points += 1
        if self.unseen:
            self.unseen.difference_update(metrics)
            if self.unseen and len(self.seen) < MAX_SEEN_KEYS:
                self.seen.update(metrics)

    def never_logged(self) -> list[str]:
        """One line per watched key no point carried (none before the first point): nothing was
        watched for it; the closest keys the run did log are named."""
        out = []
        for key in sorted(self.unseen) if self.points else ():
            close = difflib.get_close_matches(key, sorted(self.seen), n=3, cutoff=0.6)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            out.append(f"{key} was never logged in this run ({self.points} points): it was not watched{hint}")
        return out


def stderr_line(text: str) -> None:
    """One line of the watch on the process's stderr (looked up at call time), prefixed
    ``cliptrack watch:`` and escaped for a terminal; never raising."""
    try:
        stream = sys.stderr
        stream.write(f"cliptrack watch: {printable(text)}\n")
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass


def read_breaches(run_dir: RunDir) -> list[Alert]:
    """The breaches recorded in a run directory's ``watch.jsonl`` (a damaged line is skipped)."""
    path = run_dir.path / BREACHES_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(Alert(**json.loads(line)))
        except (TypeError, ValueError):
            continue
    return out
