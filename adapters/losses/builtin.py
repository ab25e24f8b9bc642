"""Tinker's built-in losses, their registry and their packing, in one import.

The parts (docs/ARCHITECTURE.md): the output type (:mod:`cliptrack.adapters.losses.output`:
``LossOutput``), the losses (:mod:`cliptrack.adapters.losses.objectives`: ``ppo``, ``cispo``,
``importance_sampling``, ``dro``, ``cross_entropy``), their input checks
(:mod:`cliptrack.adapters.losses.inputs`), the registry (:mod:`cliptrack.adapters.losses.registry`:
``LossSpec``, ``register_loss``, ``LOSSES``) and the packing every stack shares
(:mod:`cliptrack.adapters.shared.packing`: ``pack``, ``combine_packed``, ``unpack``).

Every loss takes per-token tensors of one shape (1-D packed ``[tokens]`` or ``[batch, seq]``) and
returns a :class:`LossOutput` whose ``loss`` is the **sum** of per-token losses over eligible tokens
(``mask != 0``), as Tinker's ``loss:sum``. Counting adds detached int64 0-dim tensors on the input's
device; it never changes the loss value or any gradient, and never synchronises with the host.

Input values are checked on the device too, in the same no-sync spirit: one cheap flag per call
for non-finite logprobs / sampling_logprobs / advantages / weights (NaN or inf propagate into the
loss or into the sum of ``logprobs - sampling_logprobs``), an exact count of mask entries that
are not 0/1, and a count of bad tensor-threshold entries. They are carried in
``LossOutput.invalid`` and raised as a ``ValueError`` the first time counts reach the host
(:meth:`LossOutput.check`, :func:`cliptrack.adapters.losses.output.loss_metrics`, the stacks'
reductions). A ``LossOutput`` keeps its inputs (detached) so that error names each bad tensor and
its number of bad entries. Shapes, Python-number thresholds and ``beta`` are checked at once.
"""

from __future__ import annotations

from cliptrack.adapters.losses.inputs import LossInputs, Threshold, check_inputs, check_ratio_outside
from cliptrack.adapters.losses.objectives import (
    CISPO_CLIP_HIGH,
    CISPO_CLIP_LOW,
    K3_SERIES_BELOW,
    PPO_CLIP_HIGH,
    PPO_CLIP_LOW,
    RATIO_OUTSIDE_HIGH,
    RATIO_OUTSIDE_LOW,
    cispo,
    cross_entropy,
    dro,
    gauge_of,
    importance_sampling,
    k3_terms,
    ppo,
)
from cliptrack.adapters.losses.output import LossOutput
from cliptrack.adapters.losses.registry import (
    CLIPPING_LOSSES,
    GAUGE_OPTIONS,
    LOSSES,
    REQUIRED,
    LossSpec,
    Option,
    TensorInput,
    loss_spec,
    register_loss,
    unregister_loss,
)
from cliptrack.adapters.shared import packing as _packing
from cliptrack.adapters.shared.packing import (
    INPUT_CHECKS,
    PACKED_DTYPE,
    PackedSums,
    Sources,
    combine_packed,
    pack,
    pack_rows,
    present_groups,
    raise_invalid,
    unpack,
)

__all__ = [
    "CISPO_CLIP_HIGH",
    "CISPO_CLIP_LOW",
    "CLIPPING_LOSSES",
    "GAUGE_OPTIONS",
    "INPUT_CHECKS",
    "K3_SERIES_BELOW",
    "LOSSES",
    "PACKED_DTYPE",
    "PPO_CLIP_HIGH",
    "PPO_CLIP_LOW",
    "RATIO_OUTSIDE_HIGH",
    "RATIO_OUTSIDE_LOW",
    "REQUIRED",
    "LossInputs",
    "LossOutput",
    "LossSpec",
    "Option",
    "PackedSums",
    "Sources",
    "TensorInput",
    "Threshold",
    "check_inputs",
    "check_ratio_outside",
    "cispo",
    "combine_packed",
    "cross_entropy",
    "dro",
    "gauge_of",
    "importance_sampling",
    "k3_terms",
    "loss_spec",
    "pack",
    "pack_rows",
    "ppo",
    "present_groups",
    "raise_invalid",
    "register_loss",
    "unpack",
    "unregister_loss",
]


PACKED_FIELDS: tuple[str, ...] = _packing.PACKED_FIELDS
"""Layout of a packed :class:`LossOutput` under the default declaration
(:data:`cliptrack.core.measures.PACKED_FIELDS`; another declaration's: its ``packed_fields``)."""
PACKED_ADDED: int = _packing.PACKED_ADDED
"""Number of leading packed fields that add under the default declaration; the rest combine by max."""
