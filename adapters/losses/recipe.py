"""The recipe of a call of a registered loss: its name and options as a
:class:`cliptrack.core.recipe.Recipe`, defaults filled in from the loss's registration, for the run
to record (``tracker.log_config(recipe_of("ppo", loss_fn_config).as_config())``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cliptrack.adapters.losses.registry import REQUIRED, loss_spec
from cliptrack.core import measures
from cliptrack.core.recipe import Recipe


def _number(value: Any) -> float | None:
    """A plain number option as a float; ``None`` for anything else (a per-datum tensor, unset)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def recipe_of(
    loss_fn: str | Callable[..., Any],
    loss_fn_config: Mapping[str, Any] | None = None,
    *,
    aggregation: str = "sum",
) -> Recipe:
    """The recipe of ``loss_fn`` (a registered loss's name, spec or function) called with
    ``loss_fn_config``: its clip band, dual clip and clip reference (a loss that clips), its
    ratio-outside bounds (a loss with the gauge), each option's registered default where the config
    leaves it out. ``aggregation``: how the caller turns the summed loss into the step's (``sum``:
    Tinker's). A per-datum threshold (a tensor) is recorded as unknown (``None``). ValueError names
    an unknown loss or option (:meth:`LossSpec.check_config`)."""
    spec = loss_spec(loss_fn)  # type: ignore[arg-type]
    if spec is None:
        raise ValueError(
            f"loss_fn {loss_fn!r} is not a registered loss: name its recipe with cliptrack.core.recipe.Recipe"
        )
    config = dict(loss_fn_config or {})
    spec.check_config(config)
    options = {name: default for name, default in spec.option_defaults.items() if default is not REQUIRED}
    options.update(config)
    clips, gauge = spec.clips, spec.gauge
    reference = options.get("clip_reference") if clips else None
    return Recipe(
        loss=spec.name,
        clip_low=_number(options.get("clip_low_threshold")) if clips else None,
        clip_high=_number(options.get("clip_high_threshold")) if clips else None,
        dual_clip=_number(options.get("dual_clip")) if clips else None,
        clip_reference=reference if isinstance(reference, str) else None,
        ratio_outside_low=_number(options.get(measures.RATIO_OUTSIDE_LOW_OPTION)) if gauge else None,
        ratio_outside_high=_number(options.get(measures.RATIO_OUTSIDE_HIGH_OPTION)) if gauge else None,
        aggregation=aggregation,
    )
