"""Miles' own names: its log-dict entries, and the entries cliptrack's Miles loss adds to them.

Miles' training step logs a dict ``{"keys": [...], "values": [count, *sums]}`` whose entries its
tracker writes as ``train/<entry>``. cliptrack's Miles loss (:mod:`cliptrack.adapters.miles.custom_loss`)
adds one entry per measured sum it carries (:data:`ENTRIES`, its own mapping from a measure's
metric key to its entry) and :data:`COUNT_SCALE`; :mod:`cliptrack.adapters.miles.train_log` reads them
back. The comparison reads the same entries as logged by Miles' tracker through the aliases of
:mod:`cliptrack.core.keys` (``SCALED_ALIASES``), which this module checks it agrees with at import.
"""

from __future__ import annotations

from cliptrack.core import frameworks, keys, measures

__all__ = [
    "COUNT_ENTRIES",
    "COUNT_KEYS",
    "COUNT_SCALE",
    "ENTRIES",
    "GAUGE_ENTRIES",
    "GAUGE_KEYS",
    "PG_CLIPFRAC",
    "ROLLOUT_ABS_DIFF",
    "ROLLOUT_KL",
    "TRACKER_PREFIX",
]

PG_CLIPFRAC = "pg_clipfrac"
"""Miles' log-dict key for PPO clipping: per token ``clamp(r)*A < r*A``, reduced by Miles' loss
reducer (a token sum with ``--calculate-per-token-loss``, a sum of per-sample means without)."""
ROLLOUT_ABS_DIFF = "train_rollout_logprob_abs_diff"
"""Miles' mean of ``|log pi_old - log pi_rollout|`` (per-sample means in its default mode)."""
ROLLOUT_KL = "train_rollout_kl"
"""Miles' mean of the k3 KL(rollout || trainer), each token's term clamped to [-10, 10]."""
TRACKER_PREFIX = "train/"
"""Prefix Miles' ``log_train_step`` puts before each entry of the aggregated dict."""
COUNT_SCALE = "count_scale"
"""Entry of cliptrack's Miles loss: per micro-batch its samples on CP rank 0, 0 elsewhere; each
entry of :data:`ENTRIES` divided by it is the exact token sum, in any form of the log."""

COUNT_KEYS = (keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS)
"""The token counts cliptrack's Miles loss logs (from Miles' own clip decision), in order."""
GAUGE_KEYS = tuple(m.key for m in measures.GAUGE_MEASURES if m.reduction == measures.SUM)
"""The gauge's sums it logs (Miles adds its log values over micro-batches and ranks: no extreme)."""
ENTRIES: dict[str, str] = {key: measures.DEFAULT.by_key[key].field for key in (*COUNT_KEYS, *GAUGE_KEYS)}
"""Metric key -> the entry of cliptrack's Miles loss in a Miles log dict (a sum's wire field)."""
COUNT_ENTRIES = tuple(ENTRIES[key] for key in COUNT_KEYS)
"""cliptrack's token-count entries in a Miles log dict, in order."""
GAUGE_ENTRIES = tuple(ENTRIES[key] for key in GAUGE_KEYS)
"""The gauge's entries in a Miles log dict (its sums)."""


def _check_aliases() -> None:
    """The comparison reads these entries, as Miles' tracker logs them, through core's aliases."""
    if keys.SCALED_ALIASES_DIVISOR != f"{TRACKER_PREFIX}{COUNT_SCALE}":
        raise AssertionError("cliptrack.core.keys.SCALED_ALIASES_DIVISOR is not Miles' count_scale entry")
    for key, entry in ENTRIES.items():
        if keys.SCALED_ALIASES.get(f"{TRACKER_PREFIX}{entry}") != key:
            raise AssertionError(
                f"cliptrack.core.keys.SCALED_ALIASES does not read Miles' entry {entry!r} as {key!r}"
            )
    for entry, key in ((PG_CLIPFRAC, keys.CLIP_FRACTION), (ROLLOUT_ABS_DIFF, keys.ABS_LOG_RATIO_MEAN)):
        alias = frameworks.ALIASES.get(f"{TRACKER_PREFIX}{entry}")
        if alias is None or alias.key != key:
            raise AssertionError(
                f"cliptrack.core.frameworks.ALIASES does not read Miles' {entry!r} as {key!r}"
            )
    alias = frameworks.ALIASES.get(f"{TRACKER_PREFIX}{ROLLOUT_KL}")
    if alias is None or alias.key != keys.KL_K3_MEAN:
        raise AssertionError(f"cliptrack.core.frameworks.ALIASES does not read Miles' {ROLLOUT_KL!r}")


_check_aliases()
