"""Where clip counts come from: the losses and the Megatron-Core / Miles-runtime backends.

Submodules import torch; import them explicitly (``from cliptrack.adapters.losses.builtin import ppo``).
"""
