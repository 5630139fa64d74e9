"""Losses of learned rewards: the Bradley-Terry loss of a reward model on preference pairs and the
per-step classification loss of a process reward model (PRM), with the PRM's step scores as the
token-level process rewards of the paper's MDP (its per-token R(s_t, a_t), eq. 1).

Scores are the models' raw outputs (float, any real): a reward model's s(x, y) per response, a PRM's
logit z_j per step boundary.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from pgjax.core.dtypes import at_least_f32

Array = jax.Array
STEP_REWARDS = ("probability", "logit")


def bradley_terry_loss(chosen: Array, rejected: Array, margin=0.0, weights: Array | None = None) -> Array:
    """The mean negative log-likelihood of the preferences under Bradley-Terry:

        L = sum_i w_i softplus(-(s_i^+ - s_i^- - m_i)) / sum_i w_i = - mean_i log sigma(s_i^+ - s_i^- - m_i)

    ``chosen`` s^+ and ``rejected`` s^- [P]; ``margin`` m (a scalar or [P]: the pair must be won by
    at least m, Llama 2's margin loss; 0 is the plain loss); ``weights`` w [P] (None: 1; 0 leaves a
    padding pair out). softplus keeps it finite for any score gap."""
    chex.assert_equal_shape([chosen, rejected])
    gap = at_least_f32(chosen) - at_least_f32(rejected) - margin
    weights = jnp.ones_like(gap) if weights is None else at_least_f32(weights)
    return jnp.sum(weights * jax.nn.softplus(-gap)) / jnp.maximum(jnp.sum(weights), 1e-12)


def pairwise_wins(chosen: Array, rejected: Array) -> Array:
    """1 where the chosen response scores higher, 0 where lower, 1/2 on a tie, NaN where a score is
    NaN (a diverged model's accuracy is NaN, not a tie's 1/2), [P]: its mean is the pairwise accuracy."""
    chex.assert_equal_shape([chosen, rejected])
    wins = jnp.where(chosen > rejected, 1.0, jnp.where(chosen < rejected, 0.0, 0.5))
    return jnp.where(jnp.isnan(chosen) | jnp.isnan(rejected), jnp.nan, wins)


def step_classification_loss(logits: Array, labels: ArrayLike, step_mask: ArrayLike) -> Array:
    """The PRM's loss: binary cross-entropy of every step's label y_j in {0, 1} (the step is correct)
    against sigma(z_j), averaged over the steps of the batch:

        L = sum_{b,t} m_bt [y_bt softplus(-z_bt) + (1 - y_bt) softplus(z_bt)] / sum_{b,t} m_bt

    ``logits`` z, ``labels`` y and ``step_mask`` m [B, T]: m is 1 at each step's last token, where
    the step is scored."""
    chex.assert_equal_shape([logits, labels, step_mask])
    z, y, m = at_least_f32(logits), at_least_f32(labels), at_least_f32(step_mask)
    per_step = y * jax.nn.softplus(-z) + (1.0 - y) * jax.nn.softplus(z)
    return jnp.sum(m * per_step) / jnp.maximum(jnp.sum(m), 1.0)


def step_rewards(logits: Array, step_mask: Array, kind: str = "probability") -> Array:
    """Token-level process rewards [B, T] from a PRM's step logits: r_t = f(z_t) at each step's last
    token (``step_mask`` 1), 0 elsewhere; ``kind``: ``probability`` f = sigma (the PRM's estimate that
    the step is correct, in [0, 1]) or ``logit`` f = z. They enter returns and GAE as the paper's
    per-token rewards (``Batch.rewards`` [B, T])."""
    chex.assert_equal_shape([logits, step_mask])
    z = at_least_f32(logits)
    if kind == "probability":
        values = jax.nn.sigmoid(z)
    elif kind == "logit":
        values = z
    else:
        raise ValueError(f"unknown step reward {kind!r}; expected one of {STEP_REWARDS}")
    return jnp.where(step_mask > 0, values, 0.0)
