"""The paired probe: the same batch through two stacks, compared per datum, with a verdict.

:func:`compare_outputs` takes two ``ForwardBackwardOutput`` s (any of their three forms,
:func:`cliptrack.core.outputs.read_output`) computed on the same datums — the same tokens, sampling
log-probs and advantages, at the same weights — by two stacks, each with per-datum outputs
(``loss_fn_outputs``: the Miles runtime's ``forward_backward_loss(..., probe=True)``, the Megatron
path's ``make_loss_func(..., probe=True)``). Since everything but the stacks' numerics is shared,
any difference is the numerics'. It compares, per datum (the unit of every interval, statistics in
:mod:`cliptrack.compare.stats.probe`):

- ``logprob_gap``: the mean ``|logprobs_b - logprobs_a|`` over the datums' tokens (nats per token):
  the stacks' own disagreement, 0 for equal numerics; judged against an absolute margin;
- ``clip_fraction``: clipped tokens per eligible token, with McNemar's exact test on the tokens one
  stack clips and the other does not (from the datums' ``clip_sides``; without them, from the
  per-datum counts alone, no exact test);
- ``kl_k3`` and ``abs_log_ratio``: the on-policy gauge (nats per eligible token);
- ``loss``: ``loss:sum`` per eligible token (from the datums' ``loss``).

Each quantity present in both outputs gets a verdict against a margin ``max(floor, relative *
scale)`` (:data:`MARGINS`, docs/STATISTICS.md "The paired probe"), and the probe's verdict is
``different`` if any is, ``equivalent`` if all are, ``insufficient data`` if any has too few datums,
``inconclusive`` otherwise. Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from cliptrack.compare.probe_input import Datums, read_datums
from cliptrack.compare.quantities import Margin, absolute, relative
from cliptrack.compare.stats import probe as ps
from cliptrack.compare.stats.estimate import DIFFERENT, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT
from cliptrack.core import keys
from cliptrack.core.jsonready import json_ready
from cliptrack.core.secrets import redact
from cliptrack.core.text import printable

__all__ = [
    "MARGINS",
    "QUANTITIES",
    "ProbeQuantity",
    "ProbeResult",
    "compare_outputs",
    "probe_verdict",
]

LOGPROB_GAP = "logprob_gap"
CLIP_FRACTION = "clip_fraction"
KL_K3 = "kl_k3"
ABS_LOG_RATIO = "abs_log_ratio"
LOSS = "loss"
QUANTITIES = (LOGPROB_GAP, CLIP_FRACTION, KL_K3, ABS_LOG_RATIO, LOSS)
"""The probe's quantities, in display order."""

UNITS = {
    LOGPROB_GAP: "nats per token",
    CLIP_FRACTION: "fraction of eligible tokens",
    KL_K3: "nats per eligible token",
    ABS_LOG_RATIO: "nats per eligible token",
    LOSS: "loss per eligible token",
}


MARGINS: dict[str, Margin] = {
    LOGPROB_GAP: absolute(1e-3),
    CLIP_FRACTION: relative(0.10, 1e-3),
    KL_K3: relative(0.10, 1e-6),
    ABS_LOG_RATIO: relative(0.10, 1e-4),
    LOSS: relative(0.10, 1e-4),
}
"""Default margins (:class:`cliptrack.compare.quantities.Margin`, the comparison's own), taken as
``Margin.near(size)``: ``max(floor, relative * size)`` on the paired difference, ``size`` the
quantity's mean size in the two stacks (for the loss: the mean ``|loss|`` of a datum per eligible
token). Relative (10 %) where the quantity spans orders of magnitude over training (the
clip fraction, the gauge, the loss), with a floor near the float32 rounding of the quantity below
which both stacks count as 0; the log-prob gap, 0 for equal numerics, against 1e-3 nats per token
(a tenth of bfloat16's rounding of a log-prob near -3)."""


@dataclass(frozen=True)
class ProbeQuantity:
    """One quantity of a probe: each stack's value (``value_a``, ``value_b``; for ``logprob_gap``
    both are 0 and ``difference`` is the gap), ``difference`` (b minus a) with its interval
    ``low``/``high`` (the hull of the clustered and the exact interval for the clip fraction),
    ``margin`` (the quantity's units), ``verdict``, ``datums`` and ``tokens`` used, and for the clip
    fraction the exact test (``clip_test``); ``reason``: why there is no verdict."""

    name: str
    units: str
    value_a: float
    value_b: float
    difference: float
    low: float
    high: float
    margin: float
    verdict: str
    datums: int
    tokens: float
    clip_test: ps.ClipTest | None = None
    reason: str = ""


@dataclass(frozen=True)
class ProbeResult:
    """What :func:`compare_outputs` found: ``verdict`` over ``quantities`` (by name), the number of
    ``datums`` compared, the interval's ``confidence``, the stacks' labels and notes (sentences)."""

    verdict: str
    quantities: dict[str, ProbeQuantity]
    datums: int
    confidence: float
    label_a: str = "a"
    label_b: str = "b"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        """A few lines: the verdict, then one line per quantity, then the notes."""
        return describe(self)

    def to_dict(self) -> dict[str, Any]:
        """Every number, JSON-ready (NaN as None)."""
        return json_ready(asdict(self))


# ---- the per-datum columns (read and checked by cliptrack.compare.probe_input) -------------------


def _scalars(values: list[np.ndarray]) -> np.ndarray:
    """One number per datum: a count's single entry, a float pair's ``hi + lo``."""
    return np.asarray([float(v.reshape(-1).sum()) for v in values], dtype=np.float64)


def _check_same_datums(a: Datums, b: Datums) -> None:
    if len(a.logprobs) != len(b.logprobs):
        raise ValueError(
            f"{a.where} has {len(a.logprobs)} datums but {b.where} has {len(b.logprobs)}: a probe needs "
            "the same datums through both stacks"
        )
    for i, (x, y) in enumerate(zip(a.logprobs, b.logprobs, strict=True)):
        if x.shape != y.shape:
            raise ValueError(
                f"datum {i}: {a.where}'s logprobs have shape {list(x.shape)} but {b.where}'s {list(y.shape)}: "
                "not the same tokens"
            )
    tokens_a = _scalars(a.fields[keys.DATUM_LOSS_TOKENS] or [])
    tokens_b = _scalars(b.fields[keys.DATUM_LOSS_TOKENS] or [])
    differ = np.flatnonzero(tokens_a != tokens_b)
    if differ.size:
        i = int(differ[0])
        raise ValueError(
            f"datum {i}: {a.where} counts {int(tokens_a[i])} eligible tokens but {b.where} {int(tokens_b[i])}: "
            "not the same datums (or not the same mask)"
        )
    for name in (keys.DATUM_CLIPPED_TOKENS, "kl_k3"):
        if (a.fields[name] is None) != (b.fields[name] is None):
            has = a.where if a.fields[name] is not None else b.where
            raise ValueError(
                f"only {has} carries per-datum {name!r}: the two outputs are not of the same loss"
            )


# ---- the comparison ------------------------------------------------------------------------------


def _quantity(
    name: str, pair: ps.PairedRatio, margin: float, verdict: str, test: ps.ClipTest | None = None
) -> ProbeQuantity:
    low, high = pair.low, pair.high
    if test is not None and math.isfinite(low):
        low, high = min(low, test.low), max(high, test.high)
    return ProbeQuantity(
        name,
        UNITS[name],
        pair.value_a,
        pair.value_b,
        pair.difference,
        low,
        high,
        margin,
        verdict,
        pair.datums,
        pair.denominator,
        test,
        pair.reason,
    )


def _tolerance(name: str, margin: Margin, size: float) -> float:
    """``margin`` as an absolute tolerance near ``size`` (``Margin.near``; a relative margin without a
    floor of its own takes the default's); ValueError when that is not > 0."""
    tolerance = margin.near(size, MARGINS[name].floor)
    if not tolerance > 0:
        raise ValueError(
            f"the {name} margin {margin} is 0 at size {size:g}: give it a floor (10%,0.001) or "
            "an absolute margin"
        )
    return tolerance


def _ratio(
    name: str,
    num_a: np.ndarray,
    num_b: np.ndarray,
    den: np.ndarray,
    scale_of: np.ndarray | None,
    margin: Margin,
    confidence: float,
) -> ProbeQuantity:
    pair = ps.paired_ratio(num_a, num_b, den, confidence)
    if scale_of is None:
        scale = 0.5 * (abs(pair.value_a) + abs(pair.value_b)) if pair.denominator > 0 else 0.0
    else:
        scale = float(scale_of.sum()) / (2 * pair.denominator) if pair.denominator > 0 else 0.0
    m = _tolerance(name, margin, scale)
    return _quantity(name, pair, m, ps.hull_verdict(pair.low, pair.high, m, pair.reason))


def _clip(a: Datums, b: Datums, den: np.ndarray, margin: Margin, confidence: float) -> ProbeQuantity:
    num_a = _scalars(a.fields[keys.DATUM_CLIPPED_TOKENS] or [])
    num_b = _scalars(b.fields[keys.DATUM_CLIPPED_TOKENS] or [])
    pair = ps.paired_ratio(num_a, num_b, den, confidence)
    scale = 0.5 * (pair.value_a + pair.value_b) if pair.denominator > 0 else 0.0
    m = _tolerance(CLIP_FRACTION, margin, scale)
    test = None
    if a.clipped is not None and b.clipped is not None:  # one mark per token, as many as the counts
        clipped_a, clipped_b = np.concatenate(a.clipped), np.concatenate(b.clipped)
        test = ps.clip_test(
            int((clipped_a & ~clipped_b).sum()),
            int((clipped_b & ~clipped_a).sum()),
            int((clipped_a & clipped_b).sum()),
            int(den.sum()),
            confidence,
        )
    quantity = _quantity(CLIP_FRACTION, pair, m, INSUFFICIENT, test)
    verdict = ps.hull_verdict(quantity.low, quantity.high, m, pair.reason)
    return ProbeQuantity(**{**quantity.__dict__, "verdict": verdict})


def _gap(a: Datums, b: Datums, margin: Margin, confidence: float) -> ProbeQuantity:
    gaps = np.asarray([np.abs(y - x).sum() for x, y in zip(a.logprobs, b.logprobs, strict=True)])
    sizes = np.asarray([x.size for x in a.logprobs], dtype=np.float64)
    pair = ps.paired_ratio(np.zeros_like(gaps), gaps, sizes, confidence)
    m = _tolerance(LOGPROB_GAP, margin, 0.0)
    low = max(0.0, pair.low) if math.isfinite(pair.low) else pair.low
    verdict = ps.upper_verdict(low, pair.high, m, pair.reason)
    quantity = _quantity(LOGPROB_GAP, pair, m, verdict)
    return ProbeQuantity(**{**quantity.__dict__, "value_a": 0.0, "value_b": 0.0, "low": low})


def probe_verdict(verdicts: Sequence[str]) -> str:
    """The probe's verdict from its quantities': ``different`` if any is, else ``insufficient
    data`` if any is, else ``equivalent`` if all are, else ``inconclusive``."""
    if not verdicts:
        return INSUFFICIENT
    if DIFFERENT in verdicts:
        return DIFFERENT
    if INSUFFICIENT in verdicts:
        return INSUFFICIENT
    return EQUIVALENT if all(v == EQUIVALENT for v in verdicts) else INCONCLUSIVE


def compare_outputs(
    a: object,
    b: object,
    *,
    confidence: float = 0.90,
    margins: Mapping[str, Margin] | None = None,
    labels: tuple[str, str] = ("a", "b"),
) -> ProbeResult:
    """Compare two stacks' outputs of the same batch per datum (module docstring).

    ``a``, ``b``: ``ForwardBackwardOutput`` s (ours, tinker's, or their JSON dicts, or the paths of
    their JSON files: read one at a time, ``cliptrack.compare.probe_input``) with per-datum
    outputs of the same datums in the same order; ``a`` is the reference (differences are b minus
    a; swapping them negates every difference and keeps every verdict). ``confidence``: two-sided
    level of the intervals (0.90: TOST at 5 % per side). ``margins``: by quantity name, overriding
    :data:`MARGINS`. ``labels``: the stacks' names in the summary and the result (redacted: a
    label holds no credential; escaped for a terminal in the summary).

    ValueError naming the output (its label, or its file), the datum and the field for bad input:
    no per-datum outputs, a value out of its range (``probe_input``: counts whole, >= 0 and within
    the datum's tokens; the gauge's sums in their ranges; one clip side per token, as many clipped
    as counted), different datum counts, log-probs of different shapes, different eligible-token
    counts, a field one output carries and the other does not.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    chosen = {**MARGINS, **(margins or {})}
    unknown = sorted(set(chosen) - set(QUANTITIES))
    if unknown:
        raise ValueError(
            f"margins for unknown quantities {unknown}; the probe's quantities are {list(QUANTITIES)}"
        )
    labels = (redact(str(labels[0])), redact(str(labels[1])))
    da, db = read_datums(a, labels[0]), read_datums(b, labels[1])
    _check_same_datums(da, db)
    den = _scalars(da.fields[keys.DATUM_LOSS_TOKENS] or [])
    found: dict[str, ProbeQuantity] = {LOGPROB_GAP: _gap(da, db, chosen[LOGPROB_GAP], confidence)}
    notes: list[str] = []
    if da.fields[keys.DATUM_CLIPPED_TOKENS] is not None:
        found[CLIP_FRACTION] = _clip(da, db, den, chosen[CLIP_FRACTION], confidence)
        if found[CLIP_FRACTION].clip_test is None:
            notes.append(
                "the outputs carry no per-token clip_sides: the clip fraction is compared on per-datum "
                "counts only, without the exact paired test"
            )
    for name in (KL_K3, ABS_LOG_RATIO):
        fa, fb = da.fields[name], db.fields[name]
        if fa is not None and fb is not None:
            found[name] = _ratio(name, _scalars(fa), _scalars(fb), den, None, chosen[name], confidence)
    la, lb = da.fields[keys.DATUM_LOSS], db.fields[keys.DATUM_LOSS]
    if la is not None and lb is not None:
        loss_a, loss_b = _scalars(la), _scalars(lb)
        found[LOSS] = _ratio(
            LOSS, loss_a, loss_b, den, np.abs(loss_a) + np.abs(loss_b), chosen[LOSS], confidence
        )
    elif (la is None) != (lb is None):
        notes.append("only one output carries the per-datum loss: the loss is not compared")
    verdict = probe_verdict([q.verdict for q in found.values()])
    return ProbeResult(verdict, found, len(da.logprobs), confidence, labels[0], labels[1], tuple(notes))


# ---- wording -------------------------------------------------------------------------------------


def _number(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{value:.3g}"


def _shown(label: str) -> str:
    """A stack's label in the summary: without a credential, escaped for a terminal."""
    return printable(redact(label))


def _line(q: ProbeQuantity, label_a: str, label_b: str) -> str:
    if q.reason:
        return f"  {q.name}: {q.verdict} ({q.reason})"
    interval = f"[{_number(q.low)}, {_number(q.high)}]"
    if q.name == LOGPROB_GAP:
        head = f"  {q.name}: {q.verdict}: mean |Δ logprob| {_number(q.difference)} {interval}"
        return f"{head}, margin {_number(q.margin)} ({q.units})"
    head = (
        f"  {q.name}: {q.verdict}: {label_a} {_number(q.value_a)}, {label_b} {_number(q.value_b)}, "
        f"difference {_number(q.difference)} {interval}, margin ±{_number(q.margin)} ({q.units})"
    )
    if q.clip_test is not None:
        t = q.clip_test
        head += (
            f"; tokens clipped by one stack only: {t.a_only} by {label_a}, {t.b_only} by {label_b} "
            f"(exact McNemar p = {t.p_value:.3g})"
        )
    return head


_OPENING = {
    EQUIVALENT: "the same batch gives the same numbers in both stacks, within every margin",
    DIFFERENT: "the same batch gives different numbers: the stacks' numerics differ",
    INCONCLUSIVE: "not shown within the margins either way: more datums are needed",
    INSUFFICIENT: "too few datums for a verdict",
}


def describe(result: ProbeResult) -> str:
    """The probe in a few lines: the verdict and what it says, one line per quantity (each stack's
    value, the difference with its interval and margin), then the notes. The labels are redacted
    and escaped for a terminal (``_shown``)."""
    label_a, label_b = _shown(result.label_a), _shown(result.label_b)
    head = (
        f"paired probe, {label_b} vs {label_a} on {result.datums} datums "
        f"({result.confidence:.0%} intervals, clustered by datum): {result.verdict} — {_OPENING[result.verdict]}"
    )
    lines = [head, *(_line(q, label_a, label_b) for q in result.quantities.values())]
    lines += [f"  note: {note}" for note in result.notes]
    return "\n".join(lines)
