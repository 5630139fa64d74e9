"""REINFORCE with a critic baseline (eq. 11-12) on 2-digit addition, after a supervised warm start.

    python -m pgjax.run experiments/arithmetic_reinforce_baseline.py
"""
from pgjax.config import Experiment


def experiment() -> Experiment:
    return Experiment(name="arithmetic_reinforce_baseline", algorithm="reinforce_baseline")
