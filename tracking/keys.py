"""The one home of every metric key name cliptrack reads or writes (meanings: docs/CONTRACT.md).

Keys follow the Tinker convention ``name:reduction`` with exactly one colon. Values are plain
floats; token counts are integers carried as floats (exact below 2**53 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

LOSS_SUM = "loss:sum"
"""Sum of per-token losses over eligible tokens (unchanged by cliptrack)."""
LOSS_TOKENS = "loss_tokens:sum"
"""Number of eligible tokens (``mask != 0``), in tokens."""
CLIPPED_TOKENS = "clipped_tokens:sum"
"""Eligible tokens where clipping bites (PPO) or the coefficient departs from the ratio (CISPO)."""
CLIPPED_LOW_TOKENS = "clipped_low_tokens:sum"
"""Clipped tokens on the low side of the band (ratio < clip_low_threshold); optional, with its pair."""
CLIPPED_HIGH_TOKENS = "clipped_high_tokens:sum"
"""Clipped tokens on the high side of the band (ratio > clip_high_threshold); optional, with its pair."""
CLIP_FRACTION = "clip_fraction:mean"
"""``clipped_tokens:sum / loss_tokens:sum``; absent when no token was eligible."""

REWARD = "reward:mean"
"""Mean sequence reward of the step's sampled completions."""
THROUGHPUT = "tokens_per_second:mean"
"""Training throughput of the step, in loss tokens per second of wall time."""
STEP_TIME = "step_time_s:mean"
"""Wall time of the step, in seconds."""

SPLIT_KEYS = (CLIPPED_LOW_TOKENS, CLIPPED_HIGH_TOKENS)
"""The low/high split of ``clipped_tokens:sum``: optional (absent from the stacks' own outputs),
both or neither, and only beside ``clipped_tokens:sum``."""
CLIP_COUNT_KEYS = (CLIPPED_TOKENS, *SPLIT_KEYS)
"""Integer count keys of a loss that clips (``clipped_tokens:sum`` always, the split when known)."""
TOKEN_COUNT_KEYS = (LOSS_TOKENS, *CLIP_COUNT_KEYS)
"""Every key holding an exact token count (summed, never averaged)."""
CLIP_SERIES_KEYS = (CLIP_FRACTION, CLIPPED_TOKENS, LOSS_TOKENS, CLIPPED_LOW_TOKENS, CLIPPED_HIGH_TOKENS)
"""The per-step clip series the tracker records, in display order."""

# Keys of the per-datum Miles/Tinker wire form (``loss_fn_outputs[i]``), without reduction suffix.
DATUM_LOSS_TOKENS = "loss_tokens"
DATUM_CLIPPED_TOKENS = "clipped_tokens"
DATUM_CLIPPED_LOW_TOKENS = "clipped_low_tokens"
DATUM_CLIPPED_HIGH_TOKENS = "clipped_high_tokens"
DATUM_LOGPROBS = "logprobs"
DATUM_CLIP_FIELDS = (DATUM_CLIPPED_TOKENS, DATUM_CLIPPED_LOW_TOKENS, DATUM_CLIPPED_HIGH_TOKENS)
"""Per-datum count fields of a loss that clips (``clipped_tokens`` always, the split when known)."""


def split_key(key: str) -> tuple[str, str]:
    """Split ``name:reduction``; raise ValueError naming the key unless it has exactly one colon."""
    if not isinstance(key, str):
        raise TypeError(f"metric key {key!r} is a {type(key).__name__}, expected str 'name:reduction'")
    parts = key.split(":")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise ValueError(
            f"metric key {key!r} must have exactly one colon, as 'name:reduction' (e.g. 'loss:sum'); "
            f"it has {key.count(':')}"
        )
    return parts[0], parts[1]


# ---- Run metadata: how a run's backend and time axis are stored in each sink -------------------
TAG_BACKEND = "cliptrack.backend"
"""MLflow tag, W&B config key and W&B group naming the training stack (e.g. "megatron", "miles")."""
TAG_RUN_KIND = "cliptrack.kind"
"""MLflow tag: :data:`RUN_KIND_TRAINING` for logged runs, :data:`RUN_KIND_COMPARISON` for comparisons."""
RUN_KIND_TRAINING = "training"
RUN_KIND_COMPARISON = "comparison"
WANDB_STEP_METRIC = "trainer/step"
"""W&B column holding the trainer's own step; every metric is declared against it."""
WANDB_WALL_TIME = "trainer/wall_time"
"""W&B column holding the point's wall time (unix seconds) as handed to the tracker."""

# ---- JSONL spool / local run layout -------------------------------------------------------------
# <dir>/<run_id>/run.json     {"run_id", "run_name", "backend", "config", "started", "status"}
# <dir>/<run_id>/points.jsonl one line per point: {"step": int, "wall_time": float, "metrics": {...}}
RUN_META_FILE = "run.json"
POINTS_FILE = "points.jsonl"

# ---- Miles' own train-step log dict (``{"keys": [...], "values": [count, *sums]}``) -----------
MILES_PG_CLIPFRAC = "pg_clipfrac"
"""Miles' log-dict key for PPO clipping: per token ``clamp(r)*A < r*A``, reduced by Miles' loss
reducer (a token sum with ``--calculate-per-token-loss``, a sum of per-sample means without)."""
MILES_COUNT_SCALE = "count_scale"
"""Entry of cliptrack's Miles loss (``adapters.miles.custom_loss``): per micro-batch its samples on
CP rank 0, 0 elsewhere; each count entry divided by it is the exact token sum, in any form of the log."""

# ---- tinker-cookbook's own metric names (``rl/metric_util.py``, ``utils/trace.py``) --------------
COOKBOOK_REWARD = "env/all/reward/total"
"""The cookbook's mean total reward of the step's trajectories (logged by cliptrack as :data:`REWARD`)."""
COOKBOOK_STEP_TIME = "time/total"
"""The cookbook's wall time of the step, in seconds (logged as :data:`STEP_TIME`)."""
COOKBOOK_AC_TOKENS = "env/all/total_ac_tokens"
"""The cookbook's sampled action tokens of the step (with :data:`COOKBOOK_STEP_TIME`: :data:`THROUGHPUT`)."""

# ---- Other trackers' spellings: the one table of aliases the comparison loads through -----------
DUAL_CLIP_FRACTION = "dual_clip_fraction:mean"
"""verl's ``pg_clipfrac_lower``: tokens with A < 0 where dual-clip PPO's bound ``clip_ratio_c``
bites (a different rule from the low side of the band), as a fraction of eligible tokens."""


@dataclass(frozen=True)
class Alias:
    """How another tracker spells one of our keys.

    ``approximate``: the logged value is a mean of per-sample or per-micro-batch means (or a token
    fraction over a count that is not the eligible tokens), never the ratio of token sums our key
    means; the comparison shows it as approximate. ``source``: who logs it.
    """

    key: str
    approximate: bool
    source: str


MILES_STEP = "train/step"
"""Miles' tracker: the step column its ``train/*`` series are plotted against (W&B)."""
FOREIGN_STEP_COLUMNS = (MILES_STEP, "_step")
"""W&B step columns tried, in order, for rows without :data:`WANDB_STEP_METRIC` (``_step``: verl)."""


def _miles_spellings() -> dict[str, Alias]:
    """Our keys logged through Miles' tracker: ``train/<key>`` (W&B keeps ``:``, its MLflow backend
    rewrites every character outside ``[A-Za-z0-9_-./ ]`` to ``_``). Exact: they are our numbers."""
    ours = (LOSS_SUM, *TOKEN_COUNT_KEYS, CLIP_FRACTION, REWARD, THROUGHPUT, STEP_TIME)
    table = {}
    for key in ours:
        table[f"train/{key}"] = Alias(key, False, "miles tracker")
        table[f"train/{key.replace(':', '_')}"] = Alias(key, False, "miles tracker")
    return table


ALIASES: dict[str, Alias] = {
    **_miles_spellings(),
    f"train/{MILES_PG_CLIPFRAC}": Alias(CLIP_FRACTION, True, "miles"),  # per-sample means, or clipped / count
    "actor/pg_clipfrac": Alias(CLIP_FRACTION, True, "verl"),  # mean of micro-batch token means
    "actor/pg_clipfrac_lower": Alias(DUAL_CLIP_FRACTION, True, "verl"),
    "critic/score/mean": Alias(REWARD, False, "verl"),  # mean sequence score of the step's batch
}
"""Foreign metric name -> our key. Loaders rename through this table only; our own spelling of a
key wins over an alias, an exact alias over an approximate one."""

MILES_SCALED_COUNTS = {
    f"train/{name}": key
    for name, key in (
        ("loss_tokens", LOSS_TOKENS),
        ("clipped_tokens", CLIPPED_TOKENS),
        ("clipped_low_tokens", CLIPPED_LOW_TOKENS),
        ("clipped_high_tokens", CLIPPED_HIGH_TOKENS),
    )
}
"""The count entries of ``adapters.miles.custom_loss`` as Miles' tracker logs them; each divided by
``train/count_scale`` (:data:`MILES_COUNT_SCALE`) is the exact token count of our key."""

# ---- Appended by the tracking layer -------------------------------------------------------------
TAG_RUN_ID = "cliptrack.run_id"
"""MLflow tag (and W&B run id) holding cliptrack's own run id: the JSONL run directory's name."""

# ---- Comparison runs (MLflow) ---------------------------------------------------------------------
TAG_COMPARED_RUNS = "cliptrack.compared_runs"
"""MLflow tag on a comparison run: comma-separated run ids of the compared runs, reference first."""
TAG_COMPARED_IN = "cliptrack.compared_in"
"""MLflow tag on a compared training run: comma-separated ids of the comparison runs that include it."""
TAG_VERDICT = "cliptrack.verdict"
"""MLflow tag on a comparison run: the clip-fraction verdict ("equivalent", "different", "inconclusive")."""
