"""Exact audit of a gradient estimator: its mean and covariance over the sampling
distribution, by enumerating every K-tuple of trajectories of every prompt.

The estimate for one batch (one prompt p ~ p_0 and K responses sampled from
pi_theta) is ``-jax.grad`` of the library's own loss, ``pgjax.core.loss``, on
that batch: log-probs from the policy, masks and rewards of the MDP, on-policy
(theta_old = theta). Nothing is re-derived here. Then

  E[g]   = sum_p p0(p) sum_{tau_1..tau_K} prod_k pi(tau_k | p) g(p, tau_1..tau_K)
  Cov[g] = E[g g^T] - E[g] E[g]^T

and against the true gradient grad J (``mdp.objective``): the scale
c = <E[g], grad J> / |grad J|^2, the direction bias |E[g] - c grad J| / |grad J|,
the cosine, and the total variance trace(Cov[g]).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from pgjax import core
from pgjax.theory import mdp as mdp_lib


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Exact moments of one estimator (flattened parameters)."""
    mean: np.ndarray
    second_moment_trace: float
    true_grad: np.ndarray

    @property
    def scale(self) -> float:
        return float(self.mean @ self.true_grad / (self.true_grad @ self.true_grad))

    @property
    def direction_bias(self) -> float:
        return float(np.linalg.norm(self.mean - self.scale * self.true_grad) / np.linalg.norm(self.true_grad))

    @property
    def cosine(self) -> float:
        return float(self.mean @ self.true_grad / (np.linalg.norm(self.mean) * np.linalg.norm(self.true_grad)))

    @property
    def total_variance(self) -> float:
        return float(self.second_moment_trace - self.mean @ self.mean)


def _tuples(num_trajectories: int, k: int) -> np.ndarray:
    """Every K-tuple of trajectory indices, [N^K, K]."""
    grids = np.meshgrid(*[np.arange(num_trajectories)] * k, indexing="ij")
    return np.stack([g.reshape(-1) for g in grids], axis=1)


def _batch(mdp, prompt, rows, logp_all, values_all, greedy, k):
    """The library's Batch for K responses ``rows`` to ``prompt``."""
    mask = jnp.asarray(mdp.mask)[rows]
    rewards = jnp.asarray(mdp.outcome_rewards)[prompt, rows] if mdp.outcome \
        else jnp.asarray(mdp.rewards)[prompt, rows]
    values = values_all[prompt][jnp.asarray(mdp.states)[rows]]
    return core.Batch(mask=mask, rewards=rewards, logp=logp_all[prompt, rows], values=values,
                      greedy_rewards=jnp.full((k,), greedy[prompt]), group_size=k)


def audit(mdp: mdp_lib.TokenMDP, policy, theta, algo: core.Algorithm, hp: core.HParams | None = None,
          k: int = 2, chunk: int = 4096) -> AuditResult:
    """Exact E[g] and trace E[g g^T] of ``algo``'s gradient estimate with K samples per prompt.

    ``policy`` is ``(logits_fn, shape)`` from ``mdp.tabular_policy`` / ``shared_policy``.
    The value baseline is the exact V_pi(s_t); ReMax's is the greedy trajectory's reward.
    """
    logits_fn, _ = policy
    hp = algo.hparams if hp is None else hp
    theta = jnp.asarray(theta)
    logits = logits_fn(theta)
    values_all = jax.lax.stop_gradient(mdp_lib.state_values(mdp, logits))
    greedy = jnp.asarray(mdp_lib.greedy_rewards(mdp, logits))
    traj_logp = np.asarray(jnp.sum(mdp_lib.trajectory_logprobs(mdp, logits), axis=2))   # [P, N]
    tuples = _tuples(mdp.num_trajectories, k)
    true_grad = np.asarray(jax.grad(lambda th: mdp_lib.objective(mdp, logits_fn(th)))(theta)).reshape(-1)

    def estimate(th, prompt, rows):
        def loss(t):
            logp_all = mdp_lib.trajectory_logprobs(mdp, logits_fn(t))
            return core.loss(algo.spec, _batch(mdp, prompt, rows, logp_all, values_all, greedy, k), hp)[0]
        return -jax.grad(loss)(th).reshape(-1)

    @jax.jit
    def moments(th, prompt, rows, weights):
        g = jax.vmap(estimate, in_axes=(None, None, 0))(th, prompt, rows)
        return weights @ g, weights @ jnp.sum(g * g, axis=1)

    core.check_hparams(hp, k)
    mean = np.zeros(true_grad.shape)
    second = 0.0
    for p in range(mdp.num_prompts):
        weights = np.exp(traj_logp[p][tuples].sum(axis=1)) * mdp.prompt_probs[p]
        for start in range(0, len(tuples), chunk):
            rows, w = tuples[start:start + chunk], weights[start:start + chunk]
            if len(rows) < chunk:  # pad with zero-weight tuples so one compiled shape serves all chunks
                pad = chunk - len(rows)
                rows = np.concatenate([rows, np.zeros((pad, k), rows.dtype)])
                w = np.concatenate([w, np.zeros(pad)])
            m, s = moments(theta, p, jnp.asarray(rows), jnp.asarray(w, theta.dtype))
            mean += np.asarray(m)
            second += float(s)
    return AuditResult(mean=mean, second_moment_trace=second, true_grad=true_grad)
