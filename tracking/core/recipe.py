"""The recipe a run's counts were measured under: which loss, clipping where, against what.

Two runs' clip fractions are comparable only if both counted with the same rule: the same loss, the
same clip band, the same clip reference (the sampler's log-probs or the trainer's old ones), the
same dual clip; their ratio-outside counts only with the same bounds. A :class:`Recipe` is that
rule as data. It is recorded in the run's config under :data:`CONFIG_KEY` (MLflow params
``loss_recipe.<field>``, W&B config, run.json), and read back from it — or from the configuration
verl and TRL log themselves (:func:`recipe_from_config`) — so that a comparison can name any
difference and withhold the verdict of a quantity defined differently in the runs
(:func:`quantities_defined_differently`).

Units: ``clip_low`` / ``clip_high`` / ``dual_clip`` are absolute ratio bounds (Tinker style: PPO's
``[0.8, 1.2]``, not verl's ``clip_ratio`` 0.2); ``ratio_outside_low`` / ``ratio_outside_high`` are the
bounds of ``ratio_outside_tokens:sum`` on ``exp(logprobs - sampling_logprobs)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = [
    "CONFIG_KEY",
    "Recipe",
    "differing_fields",
    "quantities_defined_differently",
    "recipe_from_config",
]

CONFIG_KEY = "loss_recipe"
"""The run config's key holding the recipe (a mapping of :class:`Recipe`'s fields)."""

SAMPLER = "sampler"
"""Clip reference: ``r = exp(logprobs - sampling_logprobs)`` (Tinker's built-in PPO)."""
OLD = "old"
"""Clip reference: ``r = exp(logprobs - old_logprobs)``, the trainer's own log-probs at the weights
that sampled (verl, TRL, OpenRLHF, AReaL: decoupled PPO)."""
CLIP_REFERENCES = (SAMPLER, OLD)


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """How a run's clip counts and gauge were measured. ``None``: not applicable (a loss that never
    clips has no band) or not known."""

    loss: str
    """The loss's name: ``ppo``, ``cispo``, ... or a framework's own (``verl:vanilla``, ``trl:dapo``)."""
    clip_low: float | None = None
    clip_high: float | None = None
    dual_clip: float | None = None
    """verl's ``clip_ratio_c``: for negative advantages each token's loss is at most ``-A * c``."""
    clip_reference: str | None = None
    """``"sampler"`` or ``"old"`` (see the module's constants)."""
    ratio_outside_low: float | None = 0.5
    ratio_outside_high: float | None = 2.0
    aggregation: str | None = None
    """How per-token losses become the step's loss: ``sum`` (Tinker), verl's ``loss_agg_mode``, TRL's
    ``loss_type`` normalisation. It changes the gradient's weights, not what a count counts."""

    def __post_init__(self) -> None:
        if not isinstance(self.loss, str) or not self.loss:
            raise ValueError(f"recipe loss must be a non-empty name, got {self.loss!r}")
        for name in ("clip_low", "clip_high", "dual_clip", "ratio_outside_low", "ratio_outside_high"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            ):
                raise ValueError(f"recipe {name} must be a finite number or None, got {value!r}")
        if self.clip_reference is not None and self.clip_reference not in CLIP_REFERENCES:
            raise ValueError(
                f"recipe clip_reference must be one of {CLIP_REFERENCES} or None, got {self.clip_reference!r}"
            )

    def as_config(self) -> dict[str, dict[str, Any]]:
        """``{CONFIG_KEY: {field: value}}`` for ``Tracker(config=...)`` / ``Tracker.log_config`` (fields
        that are ``None`` left out)."""
        return {CONFIG_KEY: {k: v for k, v in asdict(self).items() if v is not None}}

    def band_text(self) -> str:
        """The clip band in words: ``[0.8, 1.2]`` (``, dual clip 3`` when set); ``no clipping``."""
        if self.clip_low is None and self.clip_high is None:
            return "no clipping"
        text = f"[{_number(self.clip_low)}, {_number(self.clip_high)}]"
        return text + (f", dual clip {_number(self.dual_clip)}" if self.dual_clip is not None else "")

    def outside_text(self) -> str:
        """The ratio-outside bounds in words: ``[1/2, 2]``."""
        return f"[{_number(self.ratio_outside_low)}, {_number(self.ratio_outside_high)}]"


def _number(value: float | None) -> str:
    if value is None:
        return "?"
    if value == 0.5:
        return "1/2"
    return f"{value:g}"


DEFINITIONS: dict[str, tuple[str, ...]] = {
    "clip_fraction": ("loss", "clip_low", "clip_high", "clip_reference"),
    "clip_low_fraction": ("loss", "clip_low", "clip_reference"),
    "clip_high_fraction": ("loss", "clip_high", "clip_reference"),
    "dual_clip_fraction": ("dual_clip", "clip_reference"),
    "ratio_outside_fraction": ("ratio_outside_low", "ratio_outside_high"),
}
"""A comparison quantity -> the recipe fields its definition depends on. Quantities not named here
(the mismatch KL, mean |log ratio|, reward, throughput) measure the same thing under any recipe."""


# ---- reading a recipe back ---------------------------------------------------------------------


def _flat(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested mappings joined with ``.`` (how MLflow params spell a nested config)."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _flat(value, name + ".")
        else:
            yield name, value


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _text(value: Any) -> str | None:
    return None if value is None or str(value) in ("", "None", "null") else str(value)


def _ours(flat: Mapping[str, Any]) -> Recipe | None:
    prefix = CONFIG_KEY + "."
    entries = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
    loss = _text(entries.get("loss"))
    if loss is None:
        return None
    numbers = {
        f.name: _float(entries.get(f.name))
        for f in fields(Recipe)
        if f.name not in ("loss", "clip_reference", "aggregation")
    }
    reference = _text(entries.get("clip_reference"))
    return Recipe(
        loss=loss,
        clip_reference=reference if reference in CLIP_REFERENCES else None,
        aggregation=_text(entries.get("aggregation")),
        **numbers,
    )


def _lookup(flat: Mapping[str, Any], suffix: str) -> Any:
    """The value of the one key that is ``suffix`` or ends with ``.suffix`` (None if none or several differ)."""
    found = {str(v) for k, v in flat.items() if k == suffix or k.endswith("." + suffix)}
    if len(found) != 1:
        return None
    return next(v for k, v in flat.items() if k == suffix or k.endswith("." + suffix))


def _verl(flat: Mapping[str, Any]) -> Recipe | None:
    """verl's actor config (``actor_rollout_ref.actor.*``): ``clip_ratio_low``/``clip_ratio_high``
    (falling back to ``clip_ratio``) as ``1 - low``, ``1 + high``; ``clip_ratio_c`` the dual clip;
    ``policy_loss.loss_mode``; ``loss_agg_mode``. verl clips against the old log-probs."""
    actor = {
        k.split("actor_rollout_ref.actor.", 1)[1]: v
        for k, v in flat.items()
        if "actor_rollout_ref.actor." in k
    }
    if not actor:
        return None
    mode = _text(actor.get("policy_loss.loss_mode")) or "vanilla"
    both = _float(actor.get("clip_ratio"))
    low = _float(actor.get("clip_ratio_low"))
    high = _float(actor.get("clip_ratio_high"))
    low, high = (both if low is None else low), (both if high is None else high)
    dual = _float(actor.get("clip_ratio_c"))
    return Recipe(
        loss=mode if mode.startswith("cliptrack") else f"verl:{mode}",
        clip_low=None if low is None else 1 - low,
        clip_high=None if high is None else 1 + high,
        dual_clip=dual if mode in ("vanilla", "cliptrack_vanilla") else None,
        clip_reference=OLD,
        aggregation=_text(actor.get("loss_agg_mode")),
    )


TRL_CLIPPING = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo")


def _trl(flat: Mapping[str, Any]) -> Recipe | None:
    """TRL's ``GRPOConfig`` as its ``report_to`` logs it: ``loss_type``, ``epsilon`` and
    ``epsilon_high`` (``1 - epsilon``, ``1 + epsilon_high``; CISPO clips above only, at
    ``epsilon_high`` itself, which TRL 1.16 uses as the bound of the ratio), against the old
    log-probs."""
    loss_type = _text(flat.get("loss_type"))
    if loss_type is None or "epsilon" not in flat:
        return None
    eps = _float(flat.get("epsilon"))
    eps_high = _float(flat.get("epsilon_high"))
    eps_high = eps if eps_high is None else eps_high
    low = None if eps is None or loss_type == "cispo" else 1 - eps
    return Recipe(
        loss=f"trl:{loss_type}",
        clip_low=low,
        clip_high=None if eps_high is None else eps_high if loss_type == "cispo" else 1 + eps_high,
        clip_reference=OLD,
        aggregation=loss_type,
    )


def recipe_from_config(config: Mapping[str, Any]) -> Recipe | None:
    """The recipe recorded in a run's config (nested, or flattened with ``.`` as MLflow params are, or
    with ``/`` as verl's are):
    cliptrack's own :data:`CONFIG_KEY`, else verl's actor config, else TRL's ``GRPOConfig``; ``None``
    when the run records none of them."""
    # verl's MLflow params join its nested config with "/" (verl.utils.tracking: _flatten_dict(sep="/"))
    flat = {key.replace("/", "."): value for key, value in _flat(config)}
    return _ours(flat) or _verl(flat) or _trl(flat)


# ---- comparing recipes -----------------------------------------------------------------------------


def differing_fields(recipes: Mapping[str, Recipe | None]) -> dict[str, dict[str, Any]]:
    """Field -> {run: value} for every field whose value differs between the runs that record a
    recipe (runs without one are not compared here)."""
    known = {run: recipe for run, recipe in recipes.items() if recipe is not None}
    out: dict[str, dict[str, Any]] = {}
    for f in fields(Recipe):
        values = {run: getattr(recipe, f.name) for run, recipe in known.items()}
        if len(set(values.values())) > 1:
            out[f.name] = values
    return out


def quantities_defined_differently(recipes: Mapping[str, Recipe | None]) -> dict[str, tuple[str, ...]]:
    """Quantity name -> the recipe fields that differ between the runs and define it (see
    :data:`DEFINITIONS`): such a quantity measures different things in the runs and gets no verdict."""
    differ = differing_fields(recipes)
    out = {}
    for quantity, defining in DEFINITIONS.items():
        fields_ = tuple(f for f in defining if f in differ)
        if fields_:
            out[quantity] = fields_
    return out
