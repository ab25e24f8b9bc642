"""The tidy frame every loader produces: one row per (run, step, metric).

Columns (units):

- ``run``: display label of the run (its run name; made unique with the run id when two runs share
  a name);
- ``run_id``: the id the run has in the store it was loaded from;
- ``backend``: the training stack (``cliptrack.backend``), e.g. ``"megatron"`` or ``"miles"``;
- ``step``: the trainer's own step (int);
- ``tokens_seen``: cumulative ``loss_tokens:sum`` up to and including this step, in tokens
  (NaN when the run logs no token counts);
- ``wall_time``: unix seconds of the point as handed to the tracker;
- ``elapsed_s``: seconds since the run's first point;
- ``metric``: the metric key (``name:reduction``);
- ``value``: float.

Bad data is refused or named, never a silent number: a non-numeric value raises ValueError naming
the run, step and key; a step logged more than once with different values keeps the **last**
value (as a resumed run replays its last steps; ``LoadedRun.duplicates`` names them, and the
comparison says so); count problems (``count_problems``: a negative or fractional token count, a
count above its total) are found here and refused by the comparison, which names run, step and key.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from cliptrack.core import keys
from cliptrack.store.records import Point, RunInfo

COLUMNS = ("run", "run_id", "backend", "step", "tokens_seen", "wall_time", "elapsed_s", "metric", "value")
"""Column order of the tidy frame."""


@dataclass(frozen=True)
class Duplicate:
    """A key the run logged more than once at ``steps`` with different values; the last is kept."""

    metric: str
    steps: tuple[int, ...]


@dataclass(frozen=True)
class LoadedRun:
    """A run loaded for comparison: its ``cliptrack.store.records.RunInfo`` (the one run record, with the
    run.json mapping) plus where it was loaded from.

    ``source`` names the store (``"mlflow"``, ``"wandb"``, ``"jsonl"``), ``location`` the tracking
    URI, directory or W&B path; ``run.run_id`` is the id the run has in that store.
    """

    run: RunInfo
    source: str
    location: str = ""
    label: str = ""
    approximate: tuple[str, ...] = ()
    """Our keys this run logged only as another tracker's mean of per-sample or per-micro-batch
    means (``cliptrack.core.frameworks.ALIASES``): shown as approximate, never as exact."""
    duplicates: tuple[Duplicate, ...] = ()
    """Keys logged more than once at a step with different values (the last value is kept)."""
    audited: tuple[tuple[str, str], ...] = ()
    """(our key, foreign name): a framework's own number logged beside our exact one (kept under its
    name): the comparison shows both and the gap (``cliptrack.compare.audit``)."""
    per_step: tuple[str, ...] = ()
    """Our keys read from a framework's exact per-step value, without our token counts: compared as
    their mean over steps."""
    framework: str = ""
    """The framework whose own metric names the run holds (``cliptrack.core.frameworks.detect``)."""

    @property
    def display(self) -> str:
        """The label used in the frame's ``run`` column."""
        return self.label or self.run.run_name or self.run.run_id


def _empty_frame() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS})
    return frame.astype(
        {"run": "object", "run_id": "object", "backend": "object", "metric": "object", "step": "int64"}
    )


_NUMERIC = (int, float, np.integer, np.floating)


def _check_numeric(info: LoadedRun, steps: list[int], names: list[str], values: list[Any]) -> None:
    """Raise ValueError naming the run, step and key of the first non-numeric value (bools included)."""
    kinds = set(map(type, values))
    if all(issubclass(k, _NUMERIC) and not issubclass(k, bool) for k in kinds):
        return
    for step, key, value in zip(steps, names, values, strict=True):
        if isinstance(value, bool) or not isinstance(value, _NUMERIC):
            raise ValueError(
                f"run {info.display!r} step {step}: metric {key!r} has non-numeric value {value!r}"
            )


class MetricCodes(NamedTuple):
    """Metric keys as integer ``codes`` into ``names`` (distinct keys, an object array): the compact
    form of ``Columns.metric`` a journal is read into (``cliptrack.store.journal.load_columns``)."""

    codes: np.ndarray
    names: np.ndarray


@dataclass(frozen=True)
class Columns:
    """One run's points as parallel arrays, one entry per (step, metric) value, in logging order.

    ``wall_time`` is the unix time (seconds) of the entry; a step's wall time is the latest of its
    entries; ``metric`` the key of each entry (an object array), or ``MetricCodes``. Loaders that
    read stores in bulk (MLflow's SQL store, the journal) hand these to ``RunSet.from_points``
    instead of ``Point`` objects.
    """

    step: np.ndarray
    wall_time: np.ndarray
    metric: np.ndarray | MetricCodes
    value: np.ndarray

    def metric_keys(self) -> np.ndarray:
        """The key of each entry, as an object array."""
        if isinstance(self.metric, MetricCodes):
            return self.metric.names[self.metric.codes]
        return np.asarray(self.metric, dtype=object)


def build_frame(info: LoadedRun, points: Iterable[Point] | Columns) -> pd.DataFrame:
    """Turn one run's points into tidy rows.

    Points are sorted by step; a step logged more than once is merged (a later value of a key wins,
    the latest wall time is kept), as W&B merges repeated logs at one step. Non-finite values are
    kept (NaN stays NaN); non-numeric values raise ValueError naming the run, step and key.
    Vectorised: one pass over the points to flatten them, the rest in numpy/pandas.
    """
    return _assemble([_part(info, as_columns(info, points))])


def as_columns(info: LoadedRun, points: Iterable[Point] | Columns) -> Columns:
    """One run's points as ``Columns`` (one pass; non-numeric values raise ValueError naming the
    run, step and key)."""
    if isinstance(points, Columns):
        return points
    steps: list[int] = []
    names: list[str] = []
    values: list[Any] = []
    walls: list[float] = []
    for point in points:
        step = int(point.step)
        metrics = point.metrics
        steps.extend([step] * max(1, len(metrics)))
        walls.extend([float(point.wall_time)] * max(1, len(metrics)))
        if metrics:
            names.extend(metrics)
            values.extend(metrics.values())
        else:  # a point without metrics still carries its step's wall time
            names.append("")
            values.append(float("nan"))
    _check_numeric(info, steps, names, values)
    return Columns(
        np.asarray(steps, dtype=np.int64),
        np.asarray(walls, dtype=np.float64),
        np.asarray(names, dtype=object),
        np.asarray(values, dtype=np.float64),
    )


Coded = tuple[np.ndarray, pd.Index]
"""A run's metric names as integer codes and the names they stand for (``pd.factorize``)."""


def _coded(cols: Columns) -> Coded:
    if isinstance(cols.metric, MetricCodes):
        return cols.metric.codes, pd.Index(cols.metric.names)
    codes, names = pd.factorize(np.asarray(cols.metric, dtype=object))
    return codes, pd.Index(names)


def _entry_keys(step: np.ndarray, codes: np.ndarray, n_names: int) -> np.ndarray:
    """One int64 >= 0 per (step, metric) pair (equal pairs, equal keys): a fast stand-in for the
    pair. Steps span the whole int64 range: when ``(max - min) * n_names`` would not fit an int64,
    the steps are first replaced by their rank among the run's distinct steps."""
    step = np.asarray(step, dtype=np.int64)
    width = max(n_names, 1)
    if not step.size:
        return step.copy()
    low, high = int(step.min()), int(step.max())
    if (high - low + 1) * width < 2**62:
        return (step - low) * width + codes
    rank = pd.factorize(step, sort=True)[0].astype(np.int64)
    return rank * width + codes


def _repeated(key: np.ndarray) -> np.ndarray | None:
    """Mask of the entries whose key (an ``_entry_keys`` value, >= 0) occurs more than once, None
    when every key occurs once: one counting pass when the keys are dense, as a run's (step, metric)
    keys are; a hash table otherwise."""
    if key.size and int(key.max()) < 4 * key.size + 1024:
        counts = np.bincount(key)
        return None if counts.max() <= 1 else counts[key] > 1
    mask = pd.Series(key).duplicated(keep=False).to_numpy()
    return mask if mask.any() else None


def _last_of_each(key: np.ndarray) -> np.ndarray:
    """Mask of the entries that are the last of their key."""
    if _repeated(key) is None:  # the usual run: every (step, metric) logged once
        return np.ones(key.size, dtype=bool)
    return ~pd.Series(key[::-1]).duplicated().to_numpy()[::-1]


def _step_starts(step: np.ndarray) -> np.ndarray | None:
    """Index of the first entry of each step when ``step`` is non-decreasing (as loggers write
    runs); None when it is not."""
    if step.size == 0:
        return np.zeros(0, dtype=np.intp)
    before, after = step[:-1], step[1:]  # compared, not subtracted: steps span the int64 range
    if (after < before).any():
        return None
    return np.flatnonzero(np.concatenate(([True], after != before)))


def _positions(starts: np.ndarray, size: int) -> np.ndarray:
    """Each entry's step as a position among the steps, from the steps' first entries (``_step_starts``)."""
    return np.repeat(np.arange(starts.size), np.diff(np.append(starts, size)))


def _named(codes: np.ndarray, names: pd.Index) -> np.ndarray:
    """Mask of entries with a metric name (a point without metrics has the name "")."""
    return codes != names.get_loc("") if "" in names else np.ones(codes.size, dtype=bool)


@dataclass(frozen=True)
class _Entries:
    """A run's entries that carry a metric (points without metrics left out), in logging order:
    step, metric code into ``names``, value; ``repeated`` marks those whose (step, metric) pair
    occurs more than once (None: every pair once, the usual run)."""

    step: np.ndarray
    codes: np.ndarray
    names: pd.Index
    value: np.ndarray
    repeated: np.ndarray | None


def _entries(cols: Columns) -> _Entries:
    codes, names = _coded(cols)
    step = np.asarray(cols.step, dtype=np.int64)
    value = np.asarray(cols.value, dtype=np.float64)
    named = _named(codes, names)
    if not named.all():
        step, codes, value = step[named], codes[named], value[named]
    return _Entries(step, codes, names, value, _repeated(_entry_keys(step, codes, len(names))))


def duplicated_values(entries: _Entries) -> tuple[Duplicate, ...]:
    """Keys logged more than once at one step with different values (NaN equals NaN), by key."""
    repeated = entries.repeated
    if repeated is None:
        return ()
    rows = pd.DataFrame(
        {
            "step": entries.step[repeated],
            "metric": entries.names.to_numpy(dtype=object)[entries.codes[repeated]],
            "value": entries.value[repeated],
        }
    )
    spread = rows.groupby(["metric", "step"], sort=True)["value"].nunique(dropna=False)
    differing = spread[spread > 1]
    out = []
    for metric, group in differing.groupby(level=0, sort=True):
        out.append(Duplicate(str(metric), tuple(int(s) for s in group.index.get_level_values(1))))
    return tuple(out)


def count_problems(wide: pd.DataFrame, numerator: str, denominator: str) -> list[tuple[str, str, np.ndarray]]:
    """``(key, problem, step mask)`` (``problem``: ``"negative"``, ``"fractional"`` or
    ``"above <denominator>"``) for each problem the exact counts ``numerator`` /
    ``denominator`` have in a run's wide table: a negative or fractional value of either key, or
    the numerator above the denominator (e.g. more clipped tokens than loss tokens). Only problems
    present are listed; a key not logged has none."""
    out = []
    present = {}
    for key in (numerator, denominator):
        if key not in wide:
            continue
        v = wide[key].to_numpy(dtype=float)
        finite = np.isfinite(v)
        present[key] = v
        for problem, mask in (("negative", finite & (v < 0)), ("fractional", finite & (v != np.floor(v)))):
            if mask.any():
                out.append((key, problem, mask))
    if len(present) == 2:
        num, den = present[numerator], present[denominator]
        above = np.isfinite(num) & np.isfinite(den) & (num > den)
        if above.any():
            out.append((numerator, f"above {denominator}", above))
    return out


@dataclass(frozen=True)
class _Part:
    """One run's tidy rows as compact columns: its labels once, the per-row arrays, and the metric
    names as codes into ``names`` (the frame is assembled from the parts of every run at once)."""

    labels: tuple[str, str, str]
    step: np.ndarray
    tokens_seen: np.ndarray
    wall_time: np.ndarray
    elapsed_s: np.ndarray
    codes: np.ndarray
    names: np.ndarray
    value: np.ndarray


def _empty_part(labels: tuple[str, str, str]) -> _Part:
    empty = np.zeros(0)
    return _Part(
        labels, np.zeros(0, np.int64), empty, empty, empty, np.zeros(0, np.intp), np.zeros(0, object), empty
    )


def _latest_walls(
    all_steps: np.ndarray, all_walls: np.ndarray, starts: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, wall time)``: the run's steps, sorted, with each step's latest wall time."""
    if starts is not None:  # steps in order: each step's latest wall time in one pass
        return all_steps[starts], np.fmax.reduceat(all_walls, starts)
    walls = pd.Series(all_walls, index=pd.Index(all_steps, name="step")).groupby(level=0).max()
    return walls.index.to_numpy(dtype=np.int64), walls.to_numpy(dtype=np.float64)


def _last_in_order(entries: _Entries, in_order: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(step, codes, value)`` of the named entries: the last of a key logged twice at a step, sorted by step."""
    step, codes, value = entries.step, entries.codes, entries.value
    if entries.repeated is not None:  # a key logged twice at a step: the last wins
        last = _last_of_each(_entry_keys(step, codes, len(entries.names)))
        step, codes, value = step[last], codes[last], value[last]
    if not in_order:
        order = np.argsort(step, kind="stable")
        step, codes, value = step[order], codes[order], value[order]
    return step, codes, value


def _tokens_seen(
    names: pd.Index, step: np.ndarray, codes: np.ndarray, value: np.ndarray, steps: np.ndarray
) -> pd.Series:
    """Cumulative finite ``loss_tokens:sum`` at each of ``steps`` (NaN before the first logged)."""
    if keys.LOSS_TOKENS in names:
        is_tokens = codes == names.get_loc(keys.LOSS_TOKENS)
        tokens = pd.Series(value[is_tokens], index=step[is_tokens])
        tokens = tokens[np.isfinite(tokens.to_numpy())]
    else:
        tokens = pd.Series(dtype=np.float64)
    if not len(tokens):
        return pd.Series(np.nan, index=pd.Index(steps))
    cumulative = tokens.reindex(pd.Index(steps)).fillna(0.0).cumsum()
    cumulative[cumulative.index < tokens.index.min()] = np.nan
    return cumulative


def _step_positions(step: np.ndarray, steps: np.ndarray, in_order: bool) -> np.ndarray:
    """Every row's step as a position among the run's steps: one lookup instead of two reindexes."""
    own_starts = _step_starts(step) if in_order else None
    if own_starts is not None and own_starts.size == steps.size:  # every step has a named entry
        return _positions(own_starts, step.size)
    return np.searchsorted(steps, step)


def _part(info: LoadedRun, cols: Columns, entries: _Entries | None = None) -> _Part:
    labels = (info.display, info.run.run_id, info.run.backend_label or "")
    if len(cols.step) == 0:
        return _empty_part(labels)
    all_steps = np.asarray(cols.step, dtype=np.int64)
    starts = _step_starts(all_steps)
    steps, step_walls = _latest_walls(all_steps, np.asarray(cols.wall_time, dtype=np.float64), starts)
    entries = entries or _entries(cols)
    step, codes, value = _last_in_order(entries, starts is not None)
    cumulative = _tokens_seen(entries.names, step, codes, value, steps)
    position = _step_positions(step, steps, starts is not None)
    wall = step_walls[position]
    first = np.nanmin(step_walls) if (~np.isnan(step_walls)).any() else np.nan
    return _Part(
        labels,
        step,
        cumulative.to_numpy(dtype=np.float64)[position],
        wall,
        wall - first,
        codes,
        entries.names.to_numpy(dtype=object),
        value,
    )


def _columns(parts: list[_Part]) -> dict[str, np.ndarray]:
    """The tidy frame's columns, each joined once over the runs' parts."""
    sizes = [len(p.step) for p in parts]

    def labels(i: int) -> np.ndarray:
        return np.repeat(np.array([p.labels[i] for p in parts], dtype=object), sizes)

    def joined(arrays: list[np.ndarray]) -> np.ndarray:
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)  # one run: no copy

    return {
        "run": labels(0),
        "run_id": labels(1),
        "backend": labels(2),
        "step": joined([p.step for p in parts]),
        "tokens_seen": joined([p.tokens_seen for p in parts]),
        "wall_time": joined([p.wall_time for p in parts]),
        "elapsed_s": joined([p.elapsed_s for p in parts]),
        "metric": joined([p.names[p.codes] for p in parts]),
        "value": joined([p.value for p in parts]),
    }


def _assemble(parts: list[_Part]) -> pd.DataFrame:
    """The tidy frame of every run's part, each column built once (no per-run frames to concatenate)."""
    parts = [p for p in parts if len(p.step)]
    if not parts:
        return _empty_frame()
    # the arrays as they are: no copy into consolidated blocks, the label columns kept as objects
    return pd.DataFrame(
        {c: pd.Series(a, dtype=a.dtype, copy=False) for c, a in _columns(parts).items()},
        columns=list(COLUMNS),
        copy=False,
    )


@dataclass
class RunSet:
    """Runs loaded for comparison: the tidy ``frame`` and one ``LoadedRun`` per run, in load order."""

    frame: pd.DataFrame
    runs: list[LoadedRun]
    _wide: dict[str, pd.DataFrame] = field(default_factory=dict, init=False, repr=False, compare=False)
    _slices: dict[str, tuple[int, int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _codes: dict[str, tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _nonfinite: dict[str, dict[str, list[int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def from_points(cls, items: Iterable[tuple[LoadedRun, Iterable[Point] | Columns]]) -> RunSet:
        """Build a RunSet from (info, points) pairs (points as ``Point``s or ``Columns``), giving
        each run a unique label."""
        pairs = [(info, points if isinstance(points, Columns) else list(points)) for info, points in items]
        names = [info.run.run_name or info.run.run_id for info, _ in pairs]
        infos = []
        for (info, _), name in zip(pairs, names, strict=True):
            label = name if names.count(name) == 1 else f"{name} ({info.run.run_id})"
            infos.append(replace(info, run=replace(info.run, config=dict(info.run.config)), label=label))
        parts = []
        for index, (_, points) in enumerate(pairs):  # one run at a time: its points dropped once parted
            columns = as_columns(infos[index], points)
            pairs[index] = (pairs[index][0], [])
            entries = _entries(columns)  # the run's metric names factorised once
            infos[index] = replace(infos[index], duplicates=duplicated_values(entries))
            parts.append(_part(infos[index], columns, entries))
            del columns, entries, points
        runset = cls(frame=_assemble(parts), runs=infos)
        start = 0
        for info, part in zip(infos, parts, strict=True):  # each run's rows, in load order
            runset._slices[info.display] = (start, start + len(part.step))
            small = part.codes.astype(np.min_scalar_type(max(len(part.names) - 1, 0)))  # kept: 1 byte a row
            runset._codes[info.display] = (small, part.names)
            start += len(part.step)
        return runset

    def _rows(self, display: str) -> pd.DataFrame:
        """The frame's rows of one run (by position when built by ``from_points``)."""
        if display in self._slices:
            start, stop = self._slices[display]
            return self.frame.iloc[start:stop]
        return self.frame[(self.frame["run"] == display).to_numpy()]

    @property
    def labels(self) -> list[str]:
        """Run labels, in load order."""
        return [info.display for info in self.runs]

    def info(self, label: str) -> LoadedRun:
        """The run whose label, name or id is ``label``; KeyError listing the runs otherwise."""
        for info in self.runs:
            if label in (info.display, info.run.run_id):
                return info
        for info in self.runs:
            if label == info.run.run_name:
                return info
        raise KeyError(f"no run {label!r} among {self.labels}")

    def metrics(self) -> list[str]:
        """Metric keys present in any run, sorted."""
        return sorted(self.frame["metric"].unique().tolist())

    def wide(self, label: str) -> pd.DataFrame:
        """One run as a step-indexed table: columns tokens_seen, wall_time, elapsed_s and one per metric.

        Built once per run and cached (the frame is not expected to change): do not modify it.
        """
        display = self.info(label).display
        if display not in self._wide:
            self._wide[display] = _wide_table(self._rows(display), self._codes.get(display))
        return self._wide[display]

    def nonfinite(self, label: str) -> dict[str, list[int]]:
        """Metric key -> steps at which the run logged a NaN or infinite value (keys without any left out)."""
        display = self.info(label).display
        if display not in self._nonfinite:
            rows = self._rows(display)
            bad = rows[~np.isfinite(rows["value"].to_numpy(dtype=float))]
            self._nonfinite[display] = {
                str(key): sorted(group["step"].tolist()) for key, group in bad.groupby("metric")
            }
        return self._nonfinite[display]


def _sorted_codes(codes: np.ndarray, names: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Metric codes and names recoded so that the names present are sorted (absent ones dropped),
    as ``pd.factorize(..., sort=True)`` gives them."""
    present = np.flatnonzero(np.bincount(codes, minlength=len(names)))
    order = np.asarray(
        sorted(present.tolist(), key=lambda i: str(names[i])), dtype=np.intp
    )  # no fixed-width copy
    rank = np.full(len(names), -1, dtype=np.intp)
    rank[order] = np.arange(order.size)
    return rank[codes], names[order]


def _wide_table(rows: pd.DataFrame, part: tuple[np.ndarray, np.ndarray] | None = None) -> pd.DataFrame:
    """A run's tidy rows as one row per step: the axes (first entry of each step) and one column per
    metric, sorted by name (the last value of a (step, metric) pair wins). ``part``: the rows' metric
    codes and names as ``from_points`` built them (each pair once, in step order): no hashing of the
    names again. O(rows), in numpy."""
    steps = rows["step"].to_numpy(dtype=np.int64)
    values = rows["value"].to_numpy(dtype=float)
    if part is not None:
        codes, names = _sorted_codes(*part)
        kept = steps
    else:
        codes, names = pd.factorize(rows["metric"].to_numpy(dtype=object), sort=True)
        last = _last_of_each(_entry_keys(steps, codes, len(names)))
        codes, values, kept = codes[last], values[last], steps[last]
    starts = _step_starts(steps) if part is not None else None
    if starts is not None:
        unique_steps, first, position = steps[starts], starts, _positions(starts, steps.size)
    else:
        unique_steps, first = np.unique(steps, return_index=True)
        position = np.searchsorted(unique_steps, kept)
    table = np.full((unique_steps.size, len(names)), np.nan)
    table[position, codes] = values
    axes = {c: rows[c].to_numpy(dtype=float)[first] for c in ("tokens_seen", "wall_time", "elapsed_s")}
    columns = {str(name): table[:, i] for i, name in enumerate(names)}
    return pd.DataFrame({**axes, **columns}, index=pd.Index(unique_steps, name="step"))
