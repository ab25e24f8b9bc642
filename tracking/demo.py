"""``cliptrack demo``: placeholder until the end-to-end demo lands."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=20, help="training steps per run")


def run(args: argparse.Namespace) -> int:
    print(
        "cliptrack demo: the end-to-end demo is not built yet. Available now: adapters.losses "
        "(ppo, cispo, cross_entropy, importance_sampling, dro with exact clip counts) and "
        "adapters.output (ForwardBackwardOutput, merge_outputs, clip_counts)."
    )
    return 0
