"""Runs a framework logged itself: what the comparison says about them, and the aggregation audit.

A run whose metric names are a framework's own (``cliptrack.core.frameworks.detect``) gets a note
naming the framework and how each of its metrics was read: approximate (a mean of means, or the old
log-probs), exact per step without our token counts (compared as the mean over steps), or a
different quantity kept under its own name and not compared.

Where a run holds a framework's own number beside our exact one (``LoadedRun.audited``: verl's
``actor/pg_clipfrac`` beside cliptrack's counts, TRL's ``clip_ratio/region_mean``, Miles'
``train/pg_clipfrac``), :func:`audits` puts both side by side over the compared window, with the
gap and what the framework does differently (:class:`cliptrack.compare.findings.Audit`); the
comparison itself uses the exact one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from cliptrack.compare import reasons as r
from cliptrack.compare.align import unit_table
from cliptrack.compare.estimates import valid
from cliptrack.compare.findings import Audit, Note, RunEstimate
from cliptrack.compare.notes import audit_text, note
from cliptrack.compare.quantities import Estimand, Quantity
from cliptrack.compare.window import Window
from cliptrack.core import frameworks
from cliptrack.store.frame import RunSet

__all__ = ["audits", "framework_notes"]


def framework_notes(runset: RunSet, labels: Sequence[str]) -> list[Note]:
    """A note per run logged by a framework itself: which, and how its metrics were read."""
    notes = []
    for label in labels:
        info = runset.info(label)
        if not info.framework:
            continue
        found = frameworks.BY_NAME[info.framework]
        columns = set(runset.wide(label).columns)
        own = frameworks.of(found.name)
        different = tuple(
            m.name if m.key is None else f"{m.name} (as {m.key})"
            for m in own
            if m.different and (m.name in columns or (m.key is not None and m.key in columns))
        )
        reason = r.FrameworkRun(label, found.title, found.version, info.approximate, info.per_step, different)
        notes.append(note("", label, reason))
    return notes


def audits(
    runset: RunSet,
    labels: Sequence[str],
    quantities: Sequence[Quantity],
    estimates: Sequence[RunEstimate],
    align: str,
    window: Window,
) -> list[Audit]:
    """Every (run, quantity) where the run logged a framework's own number beside our exact one:
    both over the window's units that logged both (binned with every compared run, as the
    comparison's units), the framework's as its mean over steps, ours as the ratio of token sums."""
    by_key = {q.approximate_key: q for q in quantities if q.approximate_key}
    approximate = {(e.metric, e.run) for e in estimates if e.approximate}
    out = []
    for label in labels:
        for key, name in runset.info(label).audited:
            q = by_key.get(key)
            if q is None or (q.name, label) in approximate:
                continue
            found = _audit(runset, labels, label, q, name, align, window)
            if found is not None:
                out.append(found)
    return out


def _audit(
    runset: RunSet, labels: Sequence[str], label: str, q: Quantity, name: str, align: str, window: Window
) -> Audit | None:
    theirs_q = replace(q.using(Estimand(name)), name=f"{q.name} ({name})")
    table = unit_table(runset, labels, [q, theirs_q], by=align, window=window)[label]
    num, den, at = valid(table, q)
    t_num, t_den, t_at = valid(table, theirs_q)
    both = at.intersection(t_at)
    if len(both) == 0:
        return None
    mine, theirs = at.get_indexer(both), t_at.get_indexer(both)
    exact_den = float(np.sum(den[mine]))
    if exact_den <= 0:
        return None
    metric = frameworks.BY_FOREIGN[name]
    found = Audit(
        run=label,
        metric=q.name,
        framework=frameworks.BY_NAME[metric.framework].title,
        name=name,
        theirs=float(np.sum(t_num[theirs]) / np.sum(t_den[theirs])),
        exact=float(np.sum(num[mine]) / exact_den),
        steps=int(np.sum(t_den[theirs])),
        why=metric.why if metric.agreement == frameworks.APPROXIMATE else "",
        percent=q.percent,
    )
    return replace(found, text=audit_text(found))
