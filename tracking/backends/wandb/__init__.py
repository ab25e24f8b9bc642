"""The W&B backend: its sink, reader, listing and options. ``check_supported`` (the installed wandb
is a supported version) and ``own_service`` (this process starts its own wandb service) are the
seams anyone else who starts a W&B run goes through (the comparison's W&B run)."""

from cliptrack.backends.wandb._compat import check_supported, own_service

__all__ = ["check_supported", "own_service"]
