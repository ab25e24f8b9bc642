"""The field's own metric names, read as cliptrack's quantities: the one translation table.

Each entry says how a framework names and reduces one metric (read from the framework's source, at
the version and line given in docs/FRAMEWORKS.md) and what it is to cliptrack:

- :data:`EXACT`: our quantity, reduced as we reduce it (a ratio of token sums over the step);
- :data:`APPROXIMATE`: our quantity, reduced otherwise (a mean of per-sample, per-micro-batch or
  per-micro-step means), or measured before the update (the trainer's old log-probs against the
  sampler's: the engine part of the mismatch, without the step's drift); shown as approximate;
- :data:`DIFFERENT`: another quantity (probabilities vs log-probs, sequence vs token level, the
  ratio outside the band whatever the advantage's sign): kept under the name it was logged with and
  never compared as one of ours.

A different quantity that several frameworks log (k1 rather than k3, the dual clip rather than the
clip) is read under a labelled key of its own (:data:`LABELLED`: ``kl_k1:mean``,
``dual_clip_fraction:mean``), exact or approximate as above, and never compared as one of ours
either.

Loaders rename through :data:`ALIASES` only (``cliptrack.store.aliases``); :func:`detect` names the
framework a run was logged by from its metric names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cliptrack.core import keys, measures

EXACT = "exact"
APPROXIMATE = "approximate"
DIFFERENT = "different"
AGREEMENTS = (EXACT, APPROXIMATE, DIFFERENT)
LABELLED = tuple(k for k in (keys.KL_K1, keys.DUAL_CLIP_FRACTION) if k not in {m.key for m in measures.MEANS})
"""Keys of quantities that are not ours, under which several frameworks' values are read alike
(``dual_clip_fraction:mean`` only until cliptrack's losses measure it: then it is ours, and verl's
``pg_clipfrac_lower`` its approximate twin)."""


@dataclass(frozen=True)
class Framework:
    """A training framework whose own logged runs cliptrack reads: ``name`` (its id, the backend
    label of its runs when they carry none), ``title`` (as written in sentences), ``version`` read
    (a release, or the commit after one) and ``loggers`` (the stores it writes that cliptrack reads)."""

    name: str
    title: str
    version: str
    loggers: str


@dataclass(frozen=True)
class ForeignMetric:
    """One metric as a framework logs it.

    ``name``: the key as it lands in the store; ``framework``: :attr:`Framework.name`; ``key``: the
    key it is read under (one of ours for exact and approximate entries, a labelled foreign
    quantity of :data:`LABELLED`, or None: kept under ``name``); ``agreement``: one of
    :data:`AGREEMENTS`, of the value against ``key`` (or against our quantity no key of ours
    carries, the value then kept under ``name``: TRL's one-sided fractions); ``reduction``: how the framework reduces it over tokens, micro-batches,
    ranks and the logging window; ``why``: the clause an audit row gives for a gap
    ("TRL averages micro-steps"); ``source``: file and line in the framework's source.
    """

    name: str
    framework: str
    key: str | None
    agreement: str
    reduction: str
    why: str
    source: str

    def __post_init__(self) -> None:
        if self.agreement not in AGREEMENTS:
            raise ValueError(f"{self.name}: agreement {self.agreement!r} is not one of {AGREEMENTS}")
        if self.agreement == DIFFERENT and self.key is not None:
            raise ValueError(f"{self.name}: a different quantity is kept under its own name (no key)")

    @property
    def different(self) -> bool:
        """Whether it is another quantity than ours (kept under its own name or a labelled key)."""
        return self.key is None or self.key in LABELLED


FRAMEWORKS: tuple[Framework, ...] = (
    Framework("verl", "verl", "0.9.1 (PyPI release)", "W&B, MLflow, file and console logs (--jsonl)"),
    Framework(
        "trl",
        "TRL",
        "1.16.0 (PyPI release)",
        "W&B, MLflow (transformers' callbacks), trainer_state.json (--jsonl)",
    ),
    Framework("openrlhf", "OpenRLHF", "0.11.0 (commit 3c3be62)", "W&B"),
    Framework("nemo-rl", "NeMo-RL", "0.6.0 (commit 7ea279a)", "W&B, MLflow"),
    Framework("miles", "slime/Miles", "slime 0.3.1 (commit 624b824); Miles' tracker", "W&B, MLflow (Miles)"),
    Framework("areal", "AReaL", "1.0.4 (commit 4aef98d)", "W&B"),
    Framework("prime-rl", "prime-rl", "0.8.0 (commit 559b447)", "W&B"),
    Framework("skyrl", "SkyRL", "0.3.0 (commit a956457)", "W&B, MLflow"),
    Framework("roll", "ROLL", "0.3.0 (commit 8eb27cc)", "W&B"),
)
BY_NAME = {f.name: f for f in FRAMEWORKS}

_M = ForeignMetric
_TRL_LOG = "trl/trainer/grpo_trainer.py:3302-3312 (log: the mean of the window's values, NaN left out)"
_NO_DRIFT = "the trainer's log-probs before the update against the sampler's (no drift of the step)"


def _trl(name: str, key: str | None, agreement: str, reduction: str, why: str, line: str) -> tuple[_M, _M]:
    """TRL's metric as MLflow and the log history hold it (``name``) and as W&B holds it
    (``train/<name>``: transformers' ``rewrite_logs``)."""
    source = f"trl/trainer/grpo_trainer.py:{line}; {_TRL_LOG}"
    return (
        _M(name, "trl", key, agreement, reduction, why, source),
        _M(f"train/{name}", "trl", key, agreement, reduction, why, source),
    )


_PER_STEP_MEAN = "mean over the logging window's micro-steps"

METRICS: tuple[ForeignMetric, ...] = (
    # ---- verl: each loss metric a token mean per micro-batch (Metric MEAN,
    # verl/workers/utils/losses.py:116), the mean over DP ranks and micro-batches
    # (verl/workers/engine_workers.py:330, verl/utils/metric/utils.py:139-154 aggregate_dp), then
    # np.mean over mini-batches (verl/trainer/ppo/ray_trainer.py:1718, verl/utils/metric/utils.py:25
    # reduce_metrics); rollout_corr/* a token mean over the step's batch, once on the driver before
    # the update (verl/trainer/ppo/ray_trainer.py:1658, decoupled mode)
    _M(
        "actor/pg_clipfrac",
        "verl",
        keys.CLIP_FRACTION,
        APPROXIMATE,
        "token mean per micro-batch, then the mean over micro-batches, ranks and mini-batches",
        "verl averages micro-batch means",
        "verl/trainer/ppo/core_algos.py:1353,1372; verl/workers/utils/losses.py:116",
    ),
    _M(
        "actor/pg_clipfrac_lower",
        "verl",
        keys.DUAL_CLIP_FRACTION,
        APPROXIMATE,
        "dual-clip fraction (A < 0 and the bound clip_ratio_c bites), micro-batch means averaged",
        "verl averages micro-batch means",
        "verl/trainer/ppo/core_algos.py:1357-1359,1374",
    ),
    _M(
        "critic/score/mean",
        "verl",
        keys.REWARD,
        EXACT,
        "mean sequence score of the step's batch (aborted sequences left out)",
        "",
        "verl/trainer/ppo/metric_utils.py:475,556",
    ),
    _M(
        "rollout_corr/k3_kl",
        "verl",
        keys.KL_K3_MEAN,
        APPROXIMATE,
        f"k3 token mean over the step's batch of {_NO_DRIFT}",
        "verl measures the old log-probs",
        "verl/trainer/ppo/rollout_corr_helper.py:964-966; ray_trainer.py:1658",
    ),
    _M(
        "rollout_corr/kl",
        "verl",
        keys.KL_K1,
        APPROXIMATE,
        "k1: token mean over the step's batch of log pi_rollout - log pi_old (it may be negative)",
        "k1, not k3",
        "verl/trainer/ppo/rollout_corr_helper.py:959",
    ),
    _M(
        "rollout_corr/chi2_token",
        "verl",
        None,
        DIFFERENT,
        "chi-squared E[rho^2] - 1 of the clamped token ratio old/rollout",
        "chi-squared, not k3",
        "verl/trainer/ppo/rollout_corr_helper.py:997-1001",
    ),
    _M(
        "rollout_corr/rollout_is_eff_sample_size",
        "verl",
        None,
        DIFFERENT,
        "1 / mean of the squared normalised importance weights, clamped to the thresholds",
        "of clamped weights",
        "verl/trainer/ppo/rollout_corr_helper.py:754-759",
    ),
    _M(
        "rollout_corr/rollout_is_ratio_fraction_high",
        "verl",
        None,
        DIFFERENT,
        "tokens whose raw importance weight exceeds rollout_is_threshold (cliptrack's ratio outside [1/2, 2])",
        "another bound",
        "verl/trainer/ppo/rollout_corr_helper.py:726-730 (token level), 717 (sequence level)",
    ),
    _M(
        "actor/ppo_kl",
        "verl",
        None,
        DIFFERENT,
        "k1 between the current and the old policy (not the sampler)",
        "current vs old policy",
        "verl/trainer/ppo/core_algos.py:1340,1373",
    ),
    # ---- TRL GRPOTrainer: clip ratios exact across processes within one micro-step
    # (global_masked_mean), then log() averages the micro-steps and the logging window
    *_trl(
        "clip_ratio/region_mean",
        keys.CLIP_FRACTION,
        APPROXIMATE,
        f"exact across processes within one micro-step, then the {_PER_STEP_MEAN}",
        "TRL averages micro-steps",
        "3259-3265,3276,3279",
    ),
    *_trl(
        "clip_ratio/low_mean",
        None,
        APPROXIMATE,
        f"low side (ratio < 1 - epsilon_low, A < 0) per micro-step, then the {_PER_STEP_MEAN}",
        "TRL averages micro-steps",
        "3274,3277",
    ),
    *_trl(
        "clip_ratio/high_mean",
        None,
        APPROXIMATE,
        f"high side (ratio > 1 + epsilon_high, A > 0) per micro-step, then the {_PER_STEP_MEAN}",
        "TRL averages micro-steps",
        "3275,3278",
    ),
    *_trl(
        "clip_ratio/low_min",
        None,
        DIFFERENT,
        "the least per-sequence low-side fraction (sequence level)",
        "sequence level",
        "3280-3281",
    ),
    *_trl(
        "clip_ratio/high_max",
        None,
        DIFFERENT,
        "the largest per-sequence high-side fraction (sequence level)",
        "sequence level",
        "3282-3283",
    ),
    *_trl(
        "cispo_clip_ratio",
        None,
        DIFFERENT,
        "CISPO tokens with ratio > epsilon_high and A > 0 (cliptrack counts every departing coefficient)",
        "A > 0 only",
        "3285-3286",
    ),
    *_trl(
        "sampling/sampling_logp_difference/mean",
        keys.ABS_LOG_RATIO_MEAN,
        APPROXIMATE,
        f"per-process token mean of |{_NO_DRIFT}|, averaged over processes and the window",
        "TRL averages per-process means of the old log-probs",
        "2861-2870",
    ),
    *_trl(
        "sampling/sampling_logp_difference/max",
        None,
        DIFFERENT,
        "largest |log pi_old - log pi_sampler|",
        "an unsigned extreme of the old log-probs",
        "2867,2871-2873",
    ),
    *_trl(
        "sampling/importance_sampling_ratio/min",
        None,
        DIFFERENT,
        "least truncated importance weight pi_old / pi_sampler over processes",
        "a truncated weight",
        "2879-2881,2888-2890",
    ),
    *_trl(
        "sampling/importance_sampling_ratio/max",
        None,
        DIFFERENT,
        "largest truncated importance weight pi_old / pi_sampler over processes",
        "a truncated weight",
        "2885-2887,2894-2896",
    ),
    *_trl(
        "sampling/importance_sampling_ratio/mean",
        None,
        DIFFERENT,
        "mean truncated importance weight pi_old / pi_sampler per process",
        "a truncated weight",
        "2882-2884,2891-2893",
    ),
    # ---- OpenRLHF: token-weighted across micro-batches, ranks and epochs
    # (openrlhf/trainer/ray/ppo_actor.py:205-222, 255); W&B keys train/<name> against train/global_step
    _M(
        "train/ppo_clip_ratio",
        "openrlhf",
        keys.CLIP_FRACTION,
        EXACT,
        "token fraction per micro-batch, weighted by its tokens across micro-batches, ranks and epochs",
        "",
        "openrlhf/models/loss.py:228; openrlhf/trainer/ray/ppo_actor.py:314,205-222,255",
    ),
    _M(
        "train/vllm_kl",
        "openrlhf",
        keys.KL_K1,
        EXACT,
        "k1: token mean of log pi_rollout - log pi_old, token-weighted",
        "k1, not k3",
        "openrlhf/models/loss.py:218; openrlhf/trainer/ray/ppo_actor.py:317",
    ),
    _M(
        "train/logprobs_diff",
        "openrlhf",
        None,
        DIFFERENT,
        "log pi - log pi_reference (the reference model)",
        "policy vs reference model",
        "openrlhf/trainer/ray/ppo_actor.py:326-333",
    ),
    # ---- NeMo-RL ClippedPGLossFn: each micro-batch's sum over the step's global valid tokens,
    # summed over micro-batches (nemo_rl/algorithms/grpo.py:3469-3491); keys train/<name>
    _M(
        "train/gen_kl_error",
        "nemo-rl",
        keys.KL_K3_MEAN,
        APPROXIMATE,
        f"k3 (reference_policy_kl_type, default k3) token mean of {_NO_DRIFT}, exact over the step",
        "NeMo-RL measures the old log-probs",
        "nemo_rl/algorithms/loss/loss_functions.py:344,414-427",
    ),
    _M(
        "train/token_mult_prob_error",
        "nemo-rl",
        None,
        DIFFERENT,
        "token mean of exp|log pi_gen - log pi_old|",
        "probabilities, not log-probs",
        "nemo_rl/algorithms/loss/loss_functions.py:343,404-411",
    ),
    _M(
        "train/probs_ratio_clamped_max",
        "nemo-rl",
        None,
        DIFFERENT,
        "largest clamped ratio pi / pi_old",
        "a ratio against the old policy",
        "nemo_rl/algorithms/loss/loss_functions.py:363",
    ),
    # ---- slime / Miles: sum_of_sample_mean (per-sample means; per-token only with
    # --calculate-per-token-loss, which the log does not say); W&B/MLflow keys train/<name>
    _M(
        "train/pg_clipfrac",
        "miles",
        keys.CLIP_FRACTION,
        APPROXIMATE,
        "sum of per-sample token means over the samples (per-token sums with --calculate-per-token-loss)",
        "Miles averages per-sample means",
        "slime/backends/megatron_utils/loss.py:1106; cp_utils.py:47",
    ),
    _M(
        "train/train_rollout_logprob_abs_diff",
        "miles",
        keys.ABS_LOG_RATIO_MEAN,
        APPROXIMATE,
        f"per-sample means of |{_NO_DRIFT}|",
        "Miles averages per-sample means of the old log-probs",
        "slime/backends/megatron_utils/loss.py:1140",
    ),
    _M(
        "train/train_rollout_kl",
        "miles",
        keys.KL_K3_MEAN,
        APPROXIMATE,
        f"k3 of {_NO_DRIFT}, each token's term clamped to [-10, 10], per-sample means",
        "Miles averages per-sample means of the old log-probs",
        "Miles loss_hub/losses.py policy_loss_function",
    ),
    # ---- AReaL stats_tracker: AVG is sum(x * mask) / sum(mask) over micro-batches and ranks,
    # SUM a sum (areal/utils/stats_tracker.py:186-260); keys under ppo_actor/update/
    _M(
        "ppo_actor/update/clipped_tokens",
        "areal",
        keys.CLIPPED_TOKENS,
        EXACT,
        "count of clipped tokens, summed over micro-batches and ranks",
        "",
        "areal/trainer/ppo/actor.py:515-520; areal/utils/functional/functional.py:524",
    ),
    _M(
        "ppo_actor/update/n_valid_tokens",
        "areal",
        keys.LOSS_TOKENS,
        EXACT,
        "count of loss tokens, summed over micro-batches and ranks",
        "",
        "areal/trainer/ppo/actor.py:515-520",
    ),
    _M(
        "ppo_actor/update/clip_ratio/avg",
        "areal",
        keys.CLIP_FRACTION,
        EXACT,
        "sum of clipped tokens over sum of valid tokens",
        "",
        "areal/trainer/ppo/actor.py:528-537",
    ),
    _M(
        "ppo_actor/update/dual_clip_ratio/avg",
        "areal",
        keys.DUAL_CLIP_FRACTION,
        EXACT,
        "dual-clip tokens (the bound c_clip bites) over valid tokens, a ratio of sums",
        "dual clip, not clip",
        "areal/trainer/ppo/actor.py:536; areal/utils/functional/functional.py:529",
    ),
    _M(
        "ppo_actor/update/behave_approx_kl/avg",
        "areal",
        None,
        DIFFERENT,
        "mean of log pi_proximal - log pi_behave (signed, k1-like) over tokens the rejection kept",
        "a signed k1 over kept tokens",
        "areal/trainer/ppo/actor.py:539-545; functional.py:536-538",
    ),
    _M(
        "ppo_actor/update/version_stats/sample_staleness_theta_avg",
        "areal",
        keys.WEIGHT_LAG_MEAN,
        APPROXIMATE,
        "token mean of current - behaviour version per micro-batch, averaged over micro-batches (SCALAR)",
        "AReaL averages micro-batch means",
        "areal/trainer/ppo/actor.py:1078-1105",
    ),
    # ---- prime-rl: every token's value gathered over micro-batches and ranks, then the mean
    # (src/prime_rl/trainer/utils.py:245-275 compute_stats)
    _M(
        "mismatch_kl/all/mean",
        "prime-rl",
        keys.KL_K3_MEAN,
        EXACT,
        "k3 of the current trainer log-probs against the inference engine's, mean over every token",
        "",
        "src/prime_rl/trainer/rl/train.py:509-512; src/prime_rl/trainer/rl/loss.py:100-106",
    ),
    _M(
        "mismatch_kl/all/max",
        "prime-rl",
        None,
        DIFFERENT,
        "largest per-token k3 term",
        "a per-token extreme",
        "src/prime_rl/trainer/utils.py:274",
    ),
    _M(
        "is_masked/mean",
        "prime-rl",
        None,
        DIFFERENT,
        "DPPO mask: probability difference pi - pi_inference beyond a bound (advantage-signed)",
        "probabilities, not a ratio",
        "src/prime_rl/trainer/rl/loss.py:130-156",
    ),
    # ---- SkyRL: micro-batch means averaged, then the mean over DP ranks
    # (skyrl/backends/skyrl_train/workers/worker_utils.py:61-124); keys policy/<name>
    _M(
        "policy/clip_ratio",
        "skyrl",
        keys.CLIP_FRACTION,
        APPROXIMATE,
        "token mean per micro-batch, mean over micro-batches, then over ranks",
        "SkyRL averages micro-batch means",
        "skyrl/backends/skyrl_train/utils/ppo_utils.py:571; trainer.py:1578",
    ),
    _M(
        "policy/rollout_train_logprobs_abs_diff_mean",
        "skyrl",
        keys.ABS_LOG_RATIO_MEAN,
        APPROXIMATE,
        f"token mean over the step of |{_NO_DRIFT}|",
        "SkyRL measures the old log-probs",
        "skyrl/train/trainer.py:1383-1404",
    ),
    _M(
        "policy/rollout_train_logprobs_abs_diff_max",
        "skyrl",
        None,
        DIFFERENT,
        "largest |log pi_rollout - log pi_old|",
        "an unsigned extreme",
        "skyrl/train/trainer.py:1401",
    ),
    # ---- ROLL: metric name suffix @sum / _max / ... picks the reduction over micro-batches
    # (roll/utils/functionals.py:385-445); token-mean with the global token count (agg_loss:229-256)
    _M(
        "actor/clipfrac",
        "roll",
        keys.CLIP_FRACTION,
        APPROXIMATE,
        "loss_agg_mode mean (per-sequence under seq-mean-*) per micro-batch, np.mean over micro-batches",
        "ROLL averages micro-batch means",
        "roll/pipeline/base_worker.py:296-303",
    ),
    _M(
        "actor/ppo_ratio_clipfrac@sum",
        "roll",
        None,
        DIFFERENT,
        "tokens with the ratio outside [1 - clip_low, 1 + clip_high] whatever the advantage's sign",
        "the ratio outside the band, not where clipping bites",
        "roll/pipeline/rlvr/actor_pg_worker.py:200,488",
    ),
    _M(
        "actor/ppo_ratio_clipfrac",
        "roll",
        None,
        DIFFERENT,
        "the ratio outside the band whatever the advantage's sign, over every position of the batch",
        "the ratio outside the band, padding included",
        "roll/pipeline/base_worker.py:290-292",
    ),
    _M(
        "actor/train_infer_ratio_token_mean@sum",
        "roll",
        None,
        DIFFERENT,
        "sequence-weighted mean of the token ratio pi_old / pi_infer",
        "a sequence-weighted ratio",
        "roll/utils/train_infer_corrections.py:98-103",
    ),
)
"""Every framework metric cliptrack knows, by framework (docs/FRAMEWORKS.md renders it)."""

TRAINER_STEP_COLUMNS = ("train/global_step",)
"""W&B step columns of other frameworks (transformers' callbacks for TRL; OpenRLHF), tried after
Miles' ``train/step`` and before W&B's own ``_step``."""


def _aliases() -> dict[str, keys.Alias]:
    """Foreign name -> the key it is read under, for entries that rename (a different quantity
    under a labelled key included); each name renamed by one framework only."""
    out: dict[str, keys.Alias] = {}
    for m in METRICS:
        if m.key is None:
            continue
        if m.name in out:
            raise AssertionError(f"{m.name!r} is renamed twice in cliptrack.core.frameworks.METRICS")
        out[m.name] = keys.Alias(m.key, m.agreement == APPROXIMATE, m.framework)
    return out


ALIASES: dict[str, keys.Alias] = {**keys.TRACKER_ALIASES, **_aliases()}
"""Foreign metric name -> our key (or a labelled foreign quantity's), the one table loaders rename
through: cliptrack's own keys as Miles' tracker spells them, then :data:`METRICS`."""

BY_FOREIGN = {m.name: m for m in METRICS}
"""Foreign name -> its entry (a name two frameworks share maps to the first)."""
_OWNERS: dict[str, set[str]] = {}
for _m in METRICS:
    _OWNERS.setdefault(_m.name, set()).add(_m.framework)
SIGNATURES = {name: owners.pop() for name, owners in _OWNERS.items() if len(owners) == 1}
"""Foreign names logged by exactly one framework: a run holding one was logged by it."""


def detect(names: Iterable[str]) -> Framework | None:
    """The framework whose own metric names a run holds most of (:data:`SIGNATURES`); None for none."""
    counts: dict[str, int] = {}
    for name in names:
        owner = SIGNATURES.get(str(name))
        if owner is not None:
            counts[owner] = counts.get(owner, 0) + 1
    if not counts:
        return None
    order = [f.name for f in FRAMEWORKS]
    best = max(counts, key=lambda f: (counts[f], -order.index(f)))
    return BY_NAME[best]


def of(framework: str) -> tuple[ForeignMetric, ...]:
    """The entries of ``framework`` (:attr:`Framework.name`), in table order."""
    if framework not in BY_NAME:
        raise KeyError(f"no framework {framework!r}; known: {sorted(BY_NAME)}")
    return tuple(m for m in METRICS if m.framework == framework)


def _check() -> None:
    unknown = sorted({m.framework for m in METRICS} - set(BY_NAME))
    if unknown:
        raise AssertionError(f"cliptrack.core.frameworks.METRICS names unknown frameworks {unknown}")


_check()
