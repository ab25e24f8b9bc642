"""The one home of every metric key name cliptrack reads or writes (meanings: docs/CONTRACT.md).

Keys follow the Tinker convention ``name:reduction`` with exactly one colon. Values are plain
floats; token counts are integers carried as floats (exact below 2**53 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from cliptrack.core import measures as _measures

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

_BUILTIN = _measures.DEFAULT
SPLIT_KEYS = tuple(m.key for m in _BUILTIN.members[_measures.SPLIT])
"""The low/high split of ``clipped_tokens:sum``: optional (absent from the stacks' own outputs),
both or neither, and only beside ``clipped_tokens:sum``."""
CLIP_COUNT_KEYS = (*(m.key for m in _BUILTIN.members[_measures.CLIP]), *SPLIT_KEYS)
"""Integer count keys of a loss that clips (``clipped_tokens:sum`` always, the split when known)."""
TOKEN_COUNT_KEYS = (LOSS_TOKENS, *CLIP_COUNT_KEYS)
"""The built-in token counts of every loss and of clipping ones (summed, never averaged)."""
CLIP_SERIES_KEYS = (CLIP_FRACTION, CLIPPED_TOKENS, LOSS_TOKENS, CLIPPED_LOW_TOKENS, CLIPPED_HIGH_TOKENS)
"""The per-step clip series the tracker records, in display order."""

# ---- The on-policy gauge (cliptrack.core.measures, group "gauge"; docs/CONTRACT.md) -------------------
# Over eligible tokens, l = logprobs - sampling_logprobs (the trained policy against the sampler).
LOG_RATIO_SUM = "log_ratio:sum"
"""Sum of l over eligible tokens, in nats."""
ABS_LOG_RATIO_SUM = "abs_log_ratio:sum"
"""Sum of |l| over eligible tokens, in nats."""
KL_K3_SUM = "kl_k3:sum"
"""Sum of exp(l) - 1 - l (the k3 estimator of KL(sampler || trainer)) over eligible tokens, in nats."""
LOG_RATIO_MAX = "log_ratio:max"
"""Largest l over eligible tokens (merged by max); absent when no token was eligible."""
LOG_RATIO_MIN = "log_ratio:min"
"""Smallest l over eligible tokens (merged by min); absent when no token was eligible."""
RATIO_OUTSIDE_TOKENS = "ratio_outside_tokens:sum"
"""Eligible tokens with exp(l) outside [ratio_outside_low, ratio_outside_high] (default [1/2, 2])."""
IS_WEIGHT_SUM = "is_weight:sum"
"""Sum of the importance weights exp(l) over eligible tokens."""
IS_WEIGHT_SQ_SUM = "is_weight_sq:sum"
"""Sum of exp(2 l) over eligible tokens (ESS = is_weight:sum**2 / (loss_tokens:sum * is_weight_sq:sum))."""
ABS_LOG_RATIO_MEAN = "abs_log_ratio:mean"
"""``abs_log_ratio:sum / loss_tokens:sum``, formed once from merged sums; absent when no token was eligible."""
KL_K3_MEAN = "kl_k3:mean"
"""``kl_k3:sum / loss_tokens:sum``, formed once from merged sums; absent when no token was eligible."""

# ---- The gauge's causes (group "causes"), given the trainer's log-probs at the sampling weights ---
# Per eligible token, l = e + d: e = old_logprobs - sampling_logprobs (engine), d = l - e (drift).
ENGINE_LOG_RATIO_SUM = "engine_log_ratio:sum"
"""Sum of e = old_logprobs - sampling_logprobs over eligible tokens (the engine part of l), in nats."""
ENGINE_ABS_LOG_RATIO_SUM = "engine_abs_log_ratio:sum"
"""Sum of |e| over eligible tokens, in nats."""
ENGINE_KL_K3_SUM = "engine_kl_k3:sum"
"""Sum of exp(e) - 1 - e over eligible tokens (k3 KL(sampler || trainer at the sampling weights)), in nats."""
DRIFT_LOG_RATIO_SUM = "drift_log_ratio:sum"
"""Sum of d = l - e over eligible tokens (the drift part of l), in nats; log_ratio:sum = engine + drift."""
DRIFT_ABS_LOG_RATIO_SUM = "drift_abs_log_ratio:sum"
"""Sum of |d| over eligible tokens, in nats."""
DRIFT_KL_K3_SUM = "drift_kl_k3:sum"
"""Sum of exp(d) - 1 - d over eligible tokens (k3 KL(trainer at the sampling weights || trainer)), in nats."""
ENGINE_KL_K3_MEAN = "engine_kl_k3:mean"
"""``engine_kl_k3:sum / loss_tokens:sum``: the engine part's KL per eligible token, in nats."""
DRIFT_KL_K3_MEAN = "drift_kl_k3:mean"
"""``drift_kl_k3:sum / loss_tokens:sum``: the drift part's KL per eligible token, in nats."""
ENGINE_ABS_LOG_RATIO_MEAN = "engine_abs_log_ratio:mean"
"""``engine_abs_log_ratio:sum / loss_tokens:sum``, in nats."""
DRIFT_ABS_LOG_RATIO_MEAN = "drift_abs_log_ratio:mean"
"""``drift_abs_log_ratio:sum / loss_tokens:sum``, in nats."""
WEIGHT_LAG_SUM = "weight_lag:sum"
"""Sum over eligible tokens of their datum's weight-version lag, in versions x tokens."""
WEIGHT_LAG_MAX = "weight_lag:max"
"""Largest weight-version lag of an eligible token, in versions."""
WEIGHT_LAG_MEAN = "weight_lag:mean"
"""``weight_lag:sum / loss_tokens:sum``: the mean lag per eligible token, in versions."""
CAUSES_KEYS = tuple(m.key for m in _measures.CAUSES_MEASURES)
"""The engine and drift parts' sums, in declaration order; all present or none."""
STALENESS_KEYS = tuple(m.key for m in _measures.STALENESS_MEASURES)
"""The weight-version lag's sum and max."""
CAUSES_SERIES_KEYS = (
    ENGINE_KL_K3_MEAN,
    DRIFT_KL_K3_MEAN,
    ENGINE_ABS_LOG_RATIO_MEAN,
    DRIFT_ABS_LOG_RATIO_MEAN,
)
"""The per-step series of the gauge's causes, in display order."""

GAUGE_MEASURED_KEYS = tuple(m.key for m in _measures.GAUGE_MEASURES)
"""The gauge's measured keys (sums and extremes), in declaration order; all present or none."""
GAUGE_MEAN_KEYS = tuple(m.key for m in _measures.GAUGE_MEANS)
"""The gauge's derived means."""
GAUGE_KEYS = (*GAUGE_MEASURED_KEYS, *GAUGE_MEAN_KEYS)
"""Every key of the on-policy gauge."""
GAUGE_SERIES_KEYS = (KL_K3_MEAN, ABS_LOG_RATIO_MEAN, RATIO_OUTSIDE_TOKENS, LOG_RATIO_MAX, LOG_RATIO_MIN)
"""The per-step gauge series the tracker records beside the clip series, in display order."""

# Keys of the per-datum Miles/Tinker wire form (``loss_fn_outputs[i]``), without reduction suffix
# (:attr:`cliptrack.core.measures.Measure.field`).
DATUM_LOSS_TOKENS = _BUILTIN.by_key[LOSS_TOKENS].field
DATUM_CLIPPED_TOKENS = _BUILTIN.by_key[CLIPPED_TOKENS].field
DATUM_CLIPPED_LOW_TOKENS = _BUILTIN.by_key[CLIPPED_LOW_TOKENS].field
DATUM_CLIPPED_HIGH_TOKENS = _BUILTIN.by_key[CLIPPED_HIGH_TOKENS].field
DATUM_LOGPROBS = "logprobs"
DATUM_LOSS = "loss"
"""Optional per-datum field (a paired probe's): the datum's ``loss:sum``, a float32 ``[hi, lo]`` pair."""
DATUM_CLIP_SIDES = "clip_sides"
"""Optional per-token field of a clipping loss (a paired probe's): int64, the shape of the datum's
``logprobs``; -1 where clipping bites below the band, +1 above it, 0 elsewhere (and on tokens that
are not eligible)."""
DATUM_PROBE_FIELDS = (DATUM_LOSS, DATUM_CLIP_SIDES)
DATUM_ID = "datum_id"
"""Optional per-datum field, in ``loss_fn_inputs`` and echoed in the output: the datum's integer id
(unique within a step; ``[1]`` int64), which names it among the step's worst sequences."""
DATUM_WORST_TOKEN = "worst_token"
"""Per-datum output field beside :data:`DATUM_ID` (a loss with sampling log-probs): the position of
the datum's eligible token with the largest ``|l|`` (``-1`` without one), int64 ``[1]``."""
"""The per-datum fields a paired probe adds to ``logprobs`` and the measured fields."""
DATUM_CLIP_FIELDS = tuple(_BUILTIN.by_key[key].field for key in CLIP_COUNT_KEYS)
"""Per-datum count fields of a loss that clips (``clipped_tokens`` always, the split when known)."""
DATUM_GAUGE_FIELDS = tuple(m.field for m in _measures.GAUGE_MEASURES)
"""Per-datum gauge fields of a loss with sampling log-probs (``log_ratio``, ``abs_log_ratio``,
``kl_k3``, ``ratio_outside_tokens``, ``is_weight``, ``is_weight_sq``, ``log_ratio_max``,
``log_ratio_min``): each datum's own sums and extremes (a datum is a sequence)."""

MEASURED_KEYS: tuple[str, ...] = tuple(m.key for m in _BUILTIN.measures)
"""Every measured key of the default declaration (:data:`cliptrack.core.measures.MEASURES`),
``loss:sum`` first (another declaration's: its ``measures``)."""
MEAN_KEYS: tuple[str, ...] = tuple(m.key for m in _BUILTIN.means)
"""Every derived mean of the default declaration (``clip_fraction:mean``, the gauge's), formed from merged sums."""
EXTREME_KEYS: tuple[str, ...] = tuple(m.key for m in _BUILTIN.extreme_measures)
"""Measured keys merged by max or min, never added."""
DATUM_MEASURE_FIELDS: tuple[str, ...] = tuple(m.field for m in _BUILTIN.datum_measures)
"""Every per-datum measured field of the default declaration, in declaration order."""


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

# ---- tinker-cookbook's own metric names (``rl/metric_util.py``, ``utils/trace.py``) --------------
COOKBOOK_REWARD = "env/all/reward/total"
"""The cookbook's mean total reward of the step's trajectories (logged by cliptrack as :data:`REWARD`)."""
COOKBOOK_STEP_TIME = "time/total"
"""The cookbook's wall time of the step, in seconds (logged as :data:`STEP_TIME`)."""
COOKBOOK_AC_TOKENS = "env/all/total_ac_tokens"
"""The cookbook's sampled action tokens of the step (with :data:`COOKBOOK_STEP_TIME`: :data:`THROUGHPUT`)."""

# ---- Other trackers' spellings: the one table of aliases the comparison loads through -----------
DUAL_CLIPPED_TOKENS = "dual_clipped_tokens:sum"
"""Eligible tokens with A < 0 where dual-clip PPO's bound ``-A * c`` (``dual_clip``, verl's
``clip_ratio_c``) lies strictly below PPO's per-token loss, in tokens; counted apart from
``clipped_tokens:sum`` (a token clipped by the band counts there whatever the dual clip does)."""
DUAL_CLIP_FRACTION = "dual_clip_fraction:mean"
"""``dual_clipped_tokens:sum / loss_tokens:sum``, formed once from the sums; verl's
``pg_clipfrac_lower`` is the same quantity as a mean of micro-batch means (approximate)."""
KL_K1 = "kl_k1:mean"
"""verl's ``rollout_corr/kl``: the k1 estimator of KL(sampler || trainer), the mean over eligible
tokens of ``log pi_sampler - log pi_trainer = -l``; with cliptrack's sums it is
``-log_ratio:sum / loss_tokens:sum`` (it may be negative, unlike ``kl_k3:mean``). Never produced by
cliptrack's losses: the key under which a verl run's value is read."""


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


FOREIGN_STEP_COLUMNS = ("train/step", "train/global_step", "_step")
"""W&B step columns tried, in order, for rows without :data:`WANDB_STEP_METRIC` (``train/step``:
Miles' tracker, which plots its ``train/*`` series against it; ``train/global_step``:
transformers' callbacks (TRL) and OpenRLHF; ``_step``: verl and the others)."""

_TRACKER_PREFIX = "train/"
"""Miles' tracker logs the entries of its step's log dict as ``train/<entry>``."""


def _tracker_spellings() -> dict[str, Alias]:
    """Our keys logged through Miles' tracker: ``train/<key>`` (W&B keeps ``:``, its MLflow backend
    rewrites every character outside ``[A-Za-z0-9_-./ ]`` to ``_``). Exact: they are our numbers."""
    ours = (LOSS_SUM, *TOKEN_COUNT_KEYS, CLIP_FRACTION, *GAUGE_KEYS, REWARD, THROUGHPUT, STEP_TIME)
    table = {}
    for key in ours:
        table[f"{_TRACKER_PREFIX}{key}"] = Alias(key, False, "miles tracker")
        table[f"{_TRACKER_PREFIX}{key.replace(':', '_')}"] = Alias(key, False, "miles tracker")
    return table


TRACKER_ALIASES: dict[str, Alias] = _tracker_spellings()
"""cliptrack's own keys as Miles' tracker spells them (exact). The field's own metric names are in
:data:`cliptrack.core.frameworks.METRICS`; :data:`cliptrack.core.frameworks.ALIASES` is both, the
one table loaders rename through (our own spelling of a key wins over an alias, an exact alias over
an approximate one)."""

SCALED_ALIASES_DIVISOR = f"{_TRACKER_PREFIX}count_scale"
"""The entry (as Miles' tracker logs it) dividing :data:`SCALED_ALIASES`: cliptrack's Miles loss
writes each sum entry scaled, and the scale beside them (``cliptrack.adapters.miles.keys``)."""
SCALED_ALIASES = {
    f"{_TRACKER_PREFIX}{m.field}": m.key for m in _BUILTIN.datum_measures if m.reduction == _measures.SUM
}
"""Sums of cliptrack's Miles loss as Miles' tracker logs them, ``train/<field>`` -> our key; each
divided by :data:`SCALED_ALIASES_DIVISOR` is our sum (a count rounded to the token, a float sum as
it is). Extremes have no entry: Miles adds its log values over micro-batches and ranks."""

# ---- Appended by the tracking layer -------------------------------------------------------------
TAG_RUN_ID = "cliptrack.run_id"
"""MLflow tag (and W&B run id) holding cliptrack's own run id: the JSONL run directory's name."""
TAG_WATCH = "cliptrack.watch"
"""Prefix of the MLflow tags holding each watched key's last breach: ``cliptrack.watch.<key>``."""

# ---- Comparison runs (MLflow) ---------------------------------------------------------------------
TAG_COMPARED_RUNS = "cliptrack.compared_runs"
"""MLflow tag on a comparison run: comma-separated run ids of the compared runs, reference first."""
TAG_COMPARED_IN = "cliptrack.compared_in"
"""MLflow tag on a compared training run: comma-separated ids of the comparison runs that include it."""
TAG_VERDICT = "cliptrack.verdict"
"""MLflow tag on a comparison run: the clip-fraction verdict ("equivalent", "different", "inconclusive")."""


def _check_declared() -> None:
    """The named constants above are keys of the declaration (cliptrack.core.measures)."""
    named = (LOSS_SUM, *TOKEN_COUNT_KEYS, *GAUGE_MEASURED_KEYS, LOG_RATIO_SUM, ABS_LOG_RATIO_SUM, KL_K3_SUM)
    named += (RATIO_OUTSIDE_TOKENS, IS_WEIGHT_SUM, IS_WEIGHT_SQ_SUM, LOG_RATIO_MAX, LOG_RATIO_MIN)
    unknown = [key for key in named if key not in _BUILTIN.by_key]
    means = {m.key for m in _BUILTIN.means}
    unknown += [key for key in (CLIP_FRACTION, ABS_LOG_RATIO_MEAN, KL_K3_MEAN) if key not in means]
    if unknown:
        raise AssertionError(
            f"cliptrack.core.keys names {unknown}, which cliptrack.core.measures does not declare"
        )


_check_declared()
