"""A sink's params and tags: what it should hold of a run beside its points, and what it has taken.

A sink that stores params and tags (MLflow) names them with ``Sink.attributes(run)``: name ->
value, each name spelled ``param:<key>`` or ``tag:<key>``. Like points, they are sent until
acknowledged: the lane sends what is not acknowledged after every (re)open and after each config
update (``Sink.send_attributes``), and this book records what the sink took or refused, in the run
directory (``params-<sink>.json``: name -> a digest of the value). So a resumed process or
``cliptrack replay`` sends only what is missing, nothing acknowledged is sent again, and a refused
value is not sent again either (the backend would refuse it again; a changed value is sent). A
refusal is reported once, in a warning and in the summary ("param 'x' refused by mlflow: why").
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping

from cliptrack.core.text import printable
from cliptrack.store.spool import RunDir

LOG = logging.getLogger("cliptrack")

PARAM = "param:"
TAG = "tag:"


def digest(value: str) -> str:
    """A short digest of ``value`` (16 hex digits of SHA-256): what the book keeps of a value."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def label(name: str) -> str:
    """``"param:lr"`` -> ``"param 'lr'"`` (a long key cut to 80 characters), for humans."""
    kind, _, key = name.partition(":")
    shown = printable(key if len(key) <= 80 else f"{key[:60]}... ({len(key)} characters)")
    return f"{kind} {shown!r}"


class ParamBook:
    """The params and tags sink ``name`` has taken (``taken``: name -> digest) or refused
    (``refused``: name -> (digest, why)) for the run in ``run_dir``. Not thread-safe: the lane
    serialises calls."""

    def __init__(self, name: str, run_dir: RunDir) -> None:
        self.name = name
        self.run_dir = run_dir
        record = run_dir.read_params_ack(name)
        taken, refused = record.get("taken"), record.get("refused")
        self.taken: dict[str, str] = {str(k): str(v) for k, v in (taken or {}).items()}
        self.refused: dict[str, tuple[str, str]] = {
            str(k): (str(v.get("digest")), str(v.get("why"))) for k, v in (refused or {}).items()
        }
        self.error: str | None = None

    def pending(self, wanted: Mapping[str, str]) -> dict[str, str]:
        """The entries of ``wanted`` neither taken nor refused with that value."""
        out = {}
        for name, value in wanted.items():
            value_digest = digest(value)
            if self.taken.get(name) == value_digest:
                continue
            refusal = self.refused.get(name)
            if refusal is not None and refusal[0] == value_digest:
                continue
            out[name] = value
        return out

    def record(self, sent: Mapping[str, str], refused: Mapping[str, str], run_id: str) -> None:
        """The sink took ``sent`` except ``refused`` (name -> why); each refusal warned about once."""
        for name, value in sent.items():
            value_digest = digest(value)
            why = refused.get(name)
            if why is None:
                self.taken[name] = value_digest
                self.refused.pop(name, None)
                continue
            self.taken.pop(name, None)
            if self.refused.get(name, ("", ""))[0] != value_digest:
                LOG.warning(
                    "%s refused %s of run %s: %s; the run's other params and tags are delivered, "
                    "the config is kept whole in run.json",
                    self.name,
                    label(name),
                    run_id,
                    printable(why),
                )
            self.refused[name] = (value_digest, why)
        self.save()

    def refusals(self, wanted: Mapping[str, str]) -> dict[str, str]:
        """The entries of ``wanted`` refused with their current value: name -> why."""
        return {
            name: why
            for name, (value_digest, why) in self.refused.items()
            if name in wanted and digest(wanted[name]) == value_digest
        }

    def reset(self) -> None:
        """The backend holds none of it (a run created anew, another store): start over."""
        self.taken.clear()
        self.refused.clear()
        self.save()

    def save(self) -> None:
        record = {
            "taken": dict(sorted(self.taken.items())),
            "refused": {k: {"digest": d, "why": w} for k, (d, w) in sorted(self.refused.items())},
        }
        try:
            self.run_dir.write_params_ack(self.name, record)
        except OSError as exc:
            if self.error is None:
                LOG.warning(
                    "%s: cannot save its params progress to %s: %s; kept in memory",
                    self.name,
                    printable(self.run_dir.params_path(self.name)),
                    printable(exc),
                )
            self.error = str(exc)
        else:
            self.error = None


def summary(sink: str, pending: int, refusals: Mapping[str, str]) -> str:
    """``""`` when every param and tag is in the sink, else e.g. ``"3 params or tags pending"`` and
    ``"param 'x' refused by mlflow: why"`` (each refusal named)."""
    parts = []
    if pending:
        plural = "s" if pending != 1 else ""
        parts.append(f"{pending} param{plural} or tag{plural} pending")
    parts.extend(
        f"{label(name)} refused by {sink}: {printable(why)}" for name, why in sorted(refusals.items())
    )
    return ", ".join(parts)
