"""tinker clients, tracked automatically: every forward_backward output of a step, merged exactly.

Two pieces, for where users meet a ``ForwardBackwardOutput``:

* :class:`TrackedTrainingClient` wraps a tinker ``TrainingClient`` (or anything with its
  ``forward_backward`` / ``optim_step`` methods, sync or ``*_async``). Each ``forward_backward``
  call belongs to the optimizer step in progress; when the step's ``optim_step`` has been
  submitted and every one of its ``forward_backward`` futures has resolved, their outputs are
  merged with :func:`cliptrack.adapters.losses.output.merge_outputs` (token counts summed exactly, the on-policy
  gauge's sums added and its extremes combined by max / min, ``clip_fraction:mean``,
  ``kl_k3:mean`` and ``abs_log_ratio:mean`` formed once from the sums, whatever the number of
  calls and their order of resolution) and logged through :class:`cliptrack.Tracker` at that step. It observes
  the futures through ``APIFuture.future()`` (a ``concurrent.futures.Future``) with a done
  callback, so it works however the caller resolves them (``.result()``, ``await``, or never)
  and hands back the very futures and outputs the client returned. Outputs carrying only the
  seed's keys (``loss:sum``, ``loss_tokens:sum``, ``clipped_tokens:sum``, ``clip_fraction:mean``)
  or the full set with the low/high split are both merged; a service whose outputs carry no
  counts gets its own metrics merged by tinker's rules. When the outputs' datums carry ids
  (``datum_id``, echoed by the Miles runtime behind the service), the step's worst sequences over
  all its calls are logged too (``Tracker.log_worst``; exact in any number and order of calls).
* ``CookbookLogger`` (created on first use, as it subclasses tinker-cookbook's
  ``ml_log.Logger``) sends the cookbook's own per-step metrics (reward, KL, timings) into the same
  cliptrack run; put it in the cookbook's ``MultiplexLogger`` beside its W&B logger.
  :func:`cookbook_metrics` is its key mapping.

tinker-cookbook's RL loop logs ``optim_step``'s metrics but drops ``forward_backward``'s, so the
two together put reward, throughput and clipping of a cookbook run in one run for
``cliptrack compare``.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cliptrack.adapters.losses.output import loss_metrics
from cliptrack.adapters.losses.recipe import recipe_of
from cliptrack.adapters.losses.registry import loss_spec
from cliptrack.adapters.shared.merge import (
    ForwardBackwardOutput,
    measured_sums,
    merge_outputs,
    worst_of_outputs,
)
from cliptrack.adapters.shared.stack import StackCall
from cliptrack.core import keys, measures
from cliptrack.core.recipe import Recipe
from cliptrack.core.sums import MeasuredSums
from torch import Tensor

__all__ = ["CookbookLogger", "TrackedTrainingClient"]


@dataclass
class _Step:
    """The ``forward_backward`` calls of one optimizer step and what has come back so far."""

    calls: int = 0
    outputs: dict[int, object] = field(default_factory=dict)
    failures: dict[int, BaseException] = field(default_factory=dict)
    closed: bool = False

    @property
    def complete(self) -> bool:
        return self.closed and len(self.outputs) + len(self.failures) == self.calls


class TrackedTrainingClient:
    """A tinker ``TrainingClient`` whose forward_backward outputs are logged per optimizer step.

    ``client``: the training client. ``tracker``: a :class:`cliptrack.Tracker` (or anything with
    its ``log_output(step, output)``). ``first_step``: the step of the first optimizer step;
    each ``optim_step`` call advances :attr:`step` by one, and the caller may set :attr:`step`
    itself before a step's first ``forward_backward`` (e.g. to the cookbook's batch index).

    Every other attribute is the client's own. ``forward`` (no backward) is not logged.
    ``declaration``: the measures the service's outputs carry, merged per step
    (:data:`cliptrack.core.measures.DEFAULT` unless given).
    """

    def __init__(
        self,
        client: Any,
        tracker: Any,
        *,
        first_step: int = 0,
        declaration: measures.Declaration = measures.DEFAULT,
    ) -> None:
        if isinstance(first_step, bool) or not isinstance(first_step, int) or first_step < 0:
            raise ValueError(f"first_step must be an int >= 0, got {first_step!r}")
        self._client = client
        self._tracker = tracker
        self._declaration = declaration
        self._step = first_step
        self._steps: dict[int, _Step] = {}
        self._changed = threading.Condition(threading.Lock())
        self._recipe: Recipe | None = None
        self.logged_steps: list[int] = []
        """Steps logged so far, in the order they were logged."""

    # ---- the client's own methods, observed --------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # own private state (absent before __init__, e.g. while unpickling)
            raise AttributeError(name)
        return getattr(self._client, name)

    @property
    def client(self) -> Any:
        """The wrapped training client."""
        return self._client

    @property
    def step(self) -> int:
        """The optimizer step the next ``forward_backward`` call belongs to."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"step must be an int >= 0, got {value!r}")
        with self._changed:
            current = self._steps.get(self._step)
            if current is not None and current.calls and not current.closed:
                raise ValueError(
                    f"step {self._step} has {current.calls} forward_backward call(s) but no optim_step yet; "
                    "set the step before a step's first forward_backward"
                )
            self._step = value

    def forward_backward(self, *args: Any, **kwargs: Any) -> Any:
        future = self._client.forward_backward(*args, **kwargs)
        self._record_recipe(args, kwargs)
        self._observe(future)
        return future

    async def forward_backward_async(self, *args: Any, **kwargs: Any) -> Any:
        future = await self._client.forward_backward_async(*args, **kwargs)
        self._record_recipe(args, kwargs)
        self._observe(future)
        return future

    def _record_recipe(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The run's config gets the recipe of a built-in loss call (``forward_backward(data, loss_fn,
        loss_fn_config)``) whenever it differs from the last one recorded; a loss cliptrack does not
        register, or a tracker without ``log_config``, records nothing."""
        loss_fn = kwargs.get("loss_fn", args[1] if len(args) > 1 else None)
        config = kwargs.get("loss_fn_config", args[2] if len(args) > 2 else None)
        log_config = getattr(self._tracker, "log_config", None)
        if not isinstance(loss_fn, str) or log_config is None:
            return
        try:
            recipe = recipe_of(loss_fn, config if isinstance(config, Mapping) else None)
        except (TypeError, ValueError):  # not one of ours: the client reports its own errors
            return
        if recipe != self._recipe:
            self._recipe = recipe
            log_config(recipe.as_config())

    def forward_backward_custom(self, *args: Any, **kwargs: Any) -> Any:
        future = self._client.forward_backward_custom(*args, **kwargs)
        self._observe(future)
        return future

    async def forward_backward_custom_async(self, *args: Any, **kwargs: Any) -> Any:
        future = await self._client.forward_backward_custom_async(*args, **kwargs)
        self._observe(future)
        return future

    def optim_step(self, *args: Any, **kwargs: Any) -> Any:
        future = self._client.optim_step(*args, **kwargs)
        self._close_step()
        return future

    async def optim_step_async(self, *args: Any, **kwargs: Any) -> Any:
        future = await self._client.optim_step_async(*args, **kwargs)
        self._close_step()
        return future

    # ---- bookkeeping -----------------------------------------------------------------------------
    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every step closed by an ``optim_step`` is logged; False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: not any(s.closed for s in self._steps.values()), timeout=timeout_s
            )

    @property
    def pending_steps(self) -> list[int]:
        """Steps with forward_backward calls not yet logged (open, or waiting for outputs)."""
        with self._changed:
            return sorted(self._steps)

    def _observe(self, future: Any) -> None:
        done = _concurrent_future(future)
        with self._changed:
            step = self._step
            record = self._steps.setdefault(step, _Step())
            index = record.calls
            record.calls += 1
        done.add_done_callback(lambda f: self._resolved(step, index, f))

    def _resolved(self, step: int, index: int, done: concurrent.futures.Future[Any]) -> None:
        try:
            output: object = done.result()
            failure: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - the caller sees it through its own future
            output, failure = None, exc
        with self._changed:
            record = self._steps[step]
            if failure is None:
                record.outputs[index] = output
            else:
                record.failures[index] = failure
            self._log_complete()

    def _close_step(self) -> None:
        with self._changed:
            record = self._steps.setdefault(self._step, _Step())
            record.closed = True
            self._step += 1
            self._log_complete()

    def _log_complete(self) -> None:
        """Log every complete step (caller holds the lock); steps may complete out of order."""
        for step in sorted(self._steps):
            record = self._steps[step]
            if not record.complete:
                continue
            del self._steps[step]
            if record.failures:
                first = min(record.failures)
                warnings.warn(
                    f"step {step}: forward_backward call {first} of {record.calls} failed "
                    f"({record.failures[first]!r}); the step's metrics are not logged",
                    RuntimeWarning,
                    stacklevel=2,
                )
            elif record.calls:
                outputs = [record.outputs[i] for i in range(record.calls)]
                try:
                    self._tracker.log_output(step, merge_outputs(outputs, self._declaration))
                    self.logged_steps.append(step)
                except Exception as exc:  # noqa: BLE001 - never break the client's callback thread
                    warnings.warn(
                        f"step {step}: could not log the merged output: {exc}", RuntimeWarning, stacklevel=2
                    )
                    continue
                try:  # the worst sequences apart: a diagnostic never costs the step's metrics
                    worst = _worst(outputs, step)
                    if worst is not None:
                        self._tracker.log_worst(step, worst)
                except Exception as exc:  # noqa: BLE001 - never break the client's callback thread
                    warnings.warn(
                        f"step {step}: its worst sequences are not logged: {exc}",
                        RuntimeWarning,
                        stacklevel=2,
                    )
        self._changed.notify_all()


def _worst(outputs: list[Any], step: int) -> Any:
    """The step's worst sequences among its outputs' datums, when they carry ids (``datum_id``: the
    Miles runtime behind a tinker service echoes them); ``None`` otherwise."""
    if not any(
        isinstance(d, Mapping) and keys.DATUM_ID in d
        for o in outputs
        for d in getattr(o, "loss_fn_outputs", ())
    ):
        return None
    return worst_of_outputs(outputs, step)


def _concurrent_future(future: Any) -> concurrent.futures.Future[Any]:
    """The ``concurrent.futures.Future`` behind a tinker ``APIFuture`` (or the future itself)."""
    if isinstance(future, concurrent.futures.Future):
        return future
    getter = getattr(future, "future", None)
    if callable(getter):
        inner = getter()
        if isinstance(inner, concurrent.futures.Future):
            return inner
    raise TypeError(
        f"forward_backward returned a {type(future).__name__}; TrackedTrainingClient needs a tinker "
        "APIFuture (with .future()) or a concurrent.futures.Future to observe"
    )


# ---- tinker-cookbook's metrics ----------------------------------------------------------------------

COOKBOOK_KEYS: dict[str, str] = {
    keys.COOKBOOK_REWARD: keys.REWARD,
    keys.COOKBOOK_STEP_TIME: keys.STEP_TIME,
}
"""The cookbook's metric names that have a cliptrack key -> that key."""


def cookbook_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The cookbook's per-step metrics under valid ``name:reduction`` keys.

    Names of :data:`COOKBOOK_KEYS` become cliptrack's keys (``env/all/reward/total`` ->
    ``reward:mean``, ``time/total`` -> ``step_time_s:mean``); ``tokens_per_second:mean`` is
    ``env/all/total_ac_tokens / time/total`` (sampled action tokens per second of the step's wall
    time) when both are there. Other names keep their spelling: one with exactly one colon
    (``time/sample_async:total``) as it is, one without gets ``:mean`` (``optim/kl_sample_train_v1``
    -> ``optim/kl_sample_train_v1:mean``), further colons become ``_``. Values that are not real
    numbers (strings, None, bools) are left out.
    """
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if hasattr(value, "item") and callable(value.item):
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(name, str):
            continue
        if name in COOKBOOK_KEYS:
            key = COOKBOOK_KEYS[name]
        elif name.count(":") == 1 and not name.startswith(":") and not name.endswith(":"):
            key = name
        else:
            key = name.replace(":", "_") + ":mean"
        out[key] = float(value)
    tokens, seconds = metrics.get(keys.COOKBOOK_AC_TOKENS), metrics.get(keys.COOKBOOK_STEP_TIME)
    if (
        isinstance(tokens, (int, float))
        and isinstance(seconds, (int, float))
        and seconds > 0
        and math.isfinite(seconds)
    ):
        out[keys.THROUGHPUT] = float(tokens) / float(seconds)
    return out


_COOKBOOK_LOGGER: type | None = None


def _cookbook_logger_class() -> type:
    """``CookbookLogger``: built on first use, subclassing tinker-cookbook's ``ml_log.Logger``."""
    global _COOKBOOK_LOGGER
    if _COOKBOOK_LOGGER is not None:
        return _COOKBOOK_LOGGER
    try:
        from tinker_cookbook.utils import ml_log
    except ImportError as exc:
        raise ImportError(
            f"CookbookLogger needs tinker-cookbook: pip install 'cliptrack[tinker]' ({exc})"
        ) from exc
    _COOKBOOK_LOGGER = _define_cookbook_logger(ml_log)
    return _COOKBOOK_LOGGER


def _define_cookbook_logger(ml_log: Any) -> type:
    """The ``CookbookLogger`` class over the imported ``tinker_cookbook.utils.ml_log`` module."""

    class CookbookLogger(ml_log.Logger):  # type: ignore[misc,valid-type]
        """A tinker-cookbook logger writing the cookbook's metrics into a cliptrack run.

        ``tracker``: the :class:`cliptrack.Tracker` of the run (the one a
        :class:`TrackedTrainingClient` logs the clip series to). Metrics are renamed by
        :func:`cookbook_metrics`; a ``step`` of None logs at the last step seen (0 at first).
        ``close()`` closes the tracker only with ``close_tracker=True``; ``sync()`` flushes it.
        """

        def __init__(self, tracker: Any, *, close_tracker: bool = False) -> None:
            self.tracker = tracker
            self.close_tracker = close_tracker
            self.last_step = 0

        def log_hparams(self, config: Any) -> None:
            dumped = ml_log.dump_config(config)
            self.tracker.log_config(dumped if isinstance(dumped, Mapping) else {"config": dumped})

        def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
            if step is not None:
                self.last_step = int(step)
            converted = cookbook_metrics(metrics)
            if converted:
                self.tracker.log(self.last_step, converted)

        def sync(self) -> None:
            self.tracker.flush()

        def close(self) -> None:
            if self.close_tracker:
                self.tracker.close()

    CookbookLogger.__module__ = __name__
    CookbookLogger.__qualname__ = "CookbookLogger"
    return CookbookLogger


@dataclass(frozen=True)
class TinkerStack:
    """Tinker as a :class:`cliptrack.adapters.shared.stack.Stack`: the loss hook is what a
    Tinker-compatible service computes for one chunk (the registered loss; its output's metrics are
    the exact sums, :func:`cliptrack.adapters.losses.output.loss_metrics`), the reduction the
    client's merge of a step's outputs (:func:`cliptrack.adapters.shared.merge.merge_outputs`, as
    :class:`TrackedTrainingClient` does), the read-back the output's measured sums; the measures:
    ``declaration``'s."""

    name: str = "tinker"
    declaration: measures.Declaration = measures.DEFAULT

    def loss_hook(
        self, loss_fn: str, logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]
    ) -> StackCall:
        spec = loss_spec(loss_fn)
        assert spec is not None
        spec.check_arguments(inputs, config)
        extra = {} if self.declaration is measures.DEFAULT else {"declaration": self.declaration}
        out = spec.check_output(spec.fn(logprobs, **inputs, **config, **extra))
        output = ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics=loss_metrics(out))
        return StackCall(out.loss, output)

    def reduce(self, reports: Sequence[Any]) -> ForwardBackwardOutput:
        return merge_outputs(reports, self.declaration)

    def read_back(self, output: object) -> MeasuredSums | None:
        return measured_sums(output, self.declaration)


STACK = TinkerStack()
"""Tinker as a stack (:class:`TinkerStack`)."""


def __getattr__(name: str) -> Any:
    if name == "CookbookLogger":
        return _cookbook_logger_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CookbookLogger: type
"""tinker-cookbook's ``ml_log.Logger`` writing into a cliptrack run (built on first use: :func:`_cookbook_logger_class`)."""
