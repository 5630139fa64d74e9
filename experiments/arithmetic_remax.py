"""ReMax: greedy-rollout baseline (eq. 13) on 2-digit addition, after a supervised warm start.

    python -m pgjax.run experiments/arithmetic_remax.py
"""
from pgjax.config import Experiment


def experiment() -> Experiment:
    return Experiment(name="arithmetic_remax", algorithm="remax")
