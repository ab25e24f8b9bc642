"""A sink lane's acknowledgement: how far into the journal its sink has taken the points.

The acknowledgement is a journal position (``spool.Ack``: lines and byte offset). In memory it
always advances, so that one process never sends a batch twice; on disk
(``acked-<sink>.json``) it is saved after each batch, and

- a save the disk refuses is warned about once and retried with the next batch;
- a position past what the journal holds on disk (points the local disk refused, delivered from
  memory) is not saved until the journal has caught up (``journal_advanced``): a saved
  acknowledgement never lies past the journal's end, even after a crash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cliptrack.core.text import printable
from cliptrack.store.spool import Ack, RunDir

LOG = logging.getLogger("cliptrack")


class AckBook:
    """The acknowledgement of sink ``name`` in ``run_dir``; ``durable`` answers the journal's
    on-disk end (bytes), past which nothing is saved. Not thread-safe: the lane serialises calls."""

    def __init__(self, name: str, run_dir: RunDir, durable: Callable[[], int] | None = None) -> None:
        self.name = name
        self.run_dir = run_dir
        self._durable = durable
        self.current: Ack = run_dir.read_ack(name)
        """What the sink has taken (in memory)."""
        self.saved: Ack = self.current
        """What ``acked-<sink>.json`` says."""
        self.error: str | None = None
        """The last save failure (``None`` once a save succeeds)."""

    def advance(self, ack: Ack) -> None:
        """The sink has taken the journal up to ``ack``; save it when the journal holds it."""
        self.current = ack
        self.save()

    def reset(self, ack: Ack) -> None:
        """Start over from ``ack`` (what the backend really holds, read back), saved at once."""
        self.current = ack
        self.save(force=True)

    def journal_advanced(self) -> None:
        """The journal's on-disk end moved: save what could not be saved before."""
        if self.saved != self.current:
            self.save()

    def save(self, *, force: bool = False) -> None:
        ack = self.current
        if not force and self._durable is not None and ack.offset > self._durable():
            return  # delivered from memory: saved once the journal holds it
        try:
            self.run_dir.write_ack(self.name, ack)
        except OSError as exc:
            self.disk_warning(f"cannot save its progress to {self.run_dir.ack_path(self.name)}: {exc}")
        else:
            self.saved = ack
            self.error = None

    def disk_warning(self, text: str) -> None:
        """Warn once per streak of local-disk failures (acknowledgement or run.json saves)."""
        if self.error is None:
            LOG.warning(
                "%s: %s; progress is kept in memory and saved again later", self.name, printable(text)
            )
        self.error = text
