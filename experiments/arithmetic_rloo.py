"""RLOO: leave-one-out baseline (eq. 14) on 2-digit addition, after a supervised warm start.

    python -m pgjax.run experiments/arithmetic_rloo.py
"""
from pgjax.config import Experiment


def experiment() -> Experiment:
    return Experiment(name="arithmetic_rloo", algorithm="rloo")
