"""OPO (a length-weighted group baseline, not a preset) on the main job: an estimator of your own,
written in the experiment file (docs/estimators.md).

    python -m pgjax.run experiments/arithmetic_opo.py
"""
import dataclasses

import jax
import jax.numpy as jnp

from pgjax import core
from pgjax.config import AlgorithmSection, Experiment


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OPOHParams:
    length_power: float = 1.0       # the baseline weighs response j by |o_j|^p: 1 is OPO, 0 the group mean


class OPO(core.Estimator):
    """OPO: A_i = r_i - sum_j |o_j|^p r_j / sum_j |o_j|^p over a prompt's K responses; on-policy, token mean."""
    name = "opo"
    min_group_size = 2

    def __init__(self, hparams: OPOHParams = OPOHParams()):
        self.hparams = hparams

    def advantages(self, batch, hp):
        k = batch.group_size
        rewards = core.sequence_scores(batch.rewards, batch.mask).reshape(-1, k)
        weights = jnp.maximum(batch.mask.sum(axis=1), 1.0).reshape(-1, k) ** hp.length_power
        baseline = (weights * rewards).sum(axis=1, keepdims=True) / weights.sum(axis=1, keepdims=True)
        return core.broadcast_over_tokens((rewards - baseline).reshape(-1), batch.mask)

    def loss(self, batch, hp, norm):
        logp = jnp.where(batch.mask > 0, batch.logp, 0.0)
        objective = core.aggregate(batch.advantages * logp, batch.mask, "token_mean", norm)
        return -objective, {"advantage_abs_sum": jnp.sum(jnp.abs(batch.advantages) * batch.mask)}


def experiment() -> Experiment:
    return Experiment(name="arithmetic_opo", algorithm=AlgorithmSection(estimator=OPO()))
