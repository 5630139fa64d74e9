"""GRPO (eq. 18) on 2-digit addition, after a supervised warm start.

    python -m pgjax.run experiments/arithmetic_grpo.py
"""
from pgjax.config import Experiment


def experiment() -> Experiment:
    return Experiment(name="arithmetic_grpo", algorithm="grpo")
