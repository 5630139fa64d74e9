"""PPO: clipped ratio, GAE critic, KL in the reward (eq. 15-17) on 2-digit addition, after a supervised warm start.

    python -m pgjax.run experiments/arithmetic_ppo.py
"""
from pgjax.config import Experiment, UpdateConfig


def experiment() -> Experiment:
    # two epochs of two minibatches per rollout: the clipped ratio matters after the first step
    return Experiment(name="arithmetic_ppo", algorithm="ppo", update=UpdateConfig(epochs=2, minibatches=2))
