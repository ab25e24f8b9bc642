"""Progress of a loop: a live bar on a terminal, plain periodic lines anywhere else.

Redirected to a file or a pipe (``cliptrack demo > demo.out``, CI logs, notebooks), a live bar is
a stream of ``\\r`` frames; there ``Progress`` writes one line per quarter of the loop and at most
one every ``every_s`` seconds in between, each complete and readable alone::

    megatron: step 75/150 (50%), 12.3 s, 6.1 steps/s, clip=0.031 reward=0.072

On a terminal it is a ``tqdm`` bar (when tqdm is installed).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")

EVERY_S = 30.0
"""Default seconds between two plain lines (besides the quarter marks)."""
QUARTERS = (0.25, 0.5, 0.75, 1.0)


def is_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is an interactive terminal."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class Progress:
    """Report ``advance()`` calls of a loop of ``total`` steps to ``stream`` (default stdout).

    ``enabled=False`` reports nothing; ``bar=None`` decides by ``is_terminal(stream)``.
    """

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        stream: IO[str] | None = None,
        enabled: bool = True,
        bar: bool | None = None,
        every_s: float = EVERY_S,
        run_steps: int | None = None,
    ) -> None:
        if total < 0:
            raise ValueError(f"Progress total must be >= 0, got {total}")
        if run_steps is not None and (run_steps < 1 or total % run_steps):
            raise ValueError(f"Progress run_steps must be >= 1 and divide the total {total}, got {run_steps}")
        self.total = total
        self.run_steps = run_steps
        self.desc = desc
        self.stream = stream if stream is not None else sys.stdout
        self.enabled = enabled
        self.every_s = every_s
        self.done = 0
        self.fields: dict[str, str] = {}
        self._started = time.perf_counter()
        self._last_line = self._started
        self._marks = [int(q * total) for q in QUARTERS if int(q * total) > 0]
        self._bar: Any = None
        if enabled and (is_terminal(self.stream) if bar is None else bar):
            self._bar = _tqdm_bar(total, desc, self.stream)

    def advance(self, steps: int = 1, **fields: object) -> None:
        """``steps`` more done; ``fields`` (e.g. ``clip=0.031``) are shown beside the count."""
        self.done += steps
        self.fields.update({k: f"{v:.3f}" if isinstance(v, float) else str(v) for k, v in fields.items()})
        if not self.enabled:
            return
        if self._bar is not None:
            at = self.run_at()
            where = {} if at is None else {"run": f"{at[0]}/{at[1]}"}
            self._bar.set_postfix({**where, **self.fields}, refresh=False)
            self._bar.update(steps)
            return
        now = time.perf_counter()
        at_mark = bool(self._marks) and self.done >= self._marks[0]
        while self._marks and self.done >= self._marks[0]:
            self._marks.pop(0)
        if at_mark or now - self._last_line >= self.every_s:
            self._last_line = now
            self.stream.write(self.line(now - self._started) + "\n")
            self.stream.flush()

    def run_at(self) -> tuple[int, int, int] | None:
        """``(run, runs, step in that run)`` over several runs of ``run_steps`` steps each (1-based;
        the run being trained), else None."""
        if not self.run_steps or self.total == self.run_steps:
            return None
        runs = self.total // self.run_steps
        run = min(max(self.done - 1, 0) // self.run_steps + 1, runs)
        return run, runs, self.done - (run - 1) * self.run_steps

    def position(self) -> str:
        """Where the loop is: ``run 2/3, step 15/20`` over several runs, else ``step 35/60``."""
        at = self.run_at()
        if at is None:
            return f"step {self.done}/{self.total}"
        run, runs, step = at
        return f"run {run}/{runs}, step {step}/{self.run_steps}"

    def line(self, elapsed_s: float) -> str:
        """The plain line for the current count after ``elapsed_s`` seconds."""
        share = f" ({100 * self.done // self.total}%)" if self.total else ""
        rate = f", {self.done / elapsed_s:.1f} steps/s" if elapsed_s > 0 else ""
        extra = " ".join(f"{k}={v}" for k, v in self.fields.items())
        return f"{self.desc}: {self.position()}{share}, {elapsed_s:.1f} s{rate}" + (
            f", {extra}" if extra else ""
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(iterable: Iterable[T], total: int, desc: str, **options: Any) -> Iterator[T]:
    """Iterate ``iterable``, reporting one step per item (``options`` as for ``Progress``)."""
    with Progress(total, desc, **options) as report:
        for item in iterable:
            yield item
            report.advance()


def _tqdm_bar(total: int, desc: str, stream: IO[str]) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="step", file=stream, leave=True, dynamic_ncols=True)
