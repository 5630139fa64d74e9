"""Dr. GRPO (eq. 21), the main job on 2-digit addition, after a supervised warm start.

    python -m pgjax.run experiments/arithmetic_dr_grpo.py
"""
from pgjax.config import Experiment


def experiment() -> Experiment:
    return Experiment(name="arithmetic_dr_grpo", algorithm="dr_grpo")
