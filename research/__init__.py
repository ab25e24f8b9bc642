"""Simulations with known truth that validate the comparison's intervals and verdicts.

Not part of the installed package: run from a clone (``python -m research.simulation``,
``python -m research.probe_simulation``); the fixed-seed tests import them from here.
"""
