"""The toy lab: whole training runs on an enumerable token MDP, each one function of a
PRNG key, a learning rate and the initial parameters, so one jitted call runs
every algorithm x seed x learning rate at once (a ``jax.vmap`` over seeds and
learning rates per algorithm) and returns learning curves of exact J.

Each step samples K responses to every prompt from pi_theta (exactly, from the
enumerated trajectory distribution), computes the algorithm's loss with
``pgjax.core.loss`` and takes ``epochs`` plain gradient steps on it
(theta <- theta - lr grad loss), the first with theta_old = theta. Algorithms
differ in static ``Spec``s, so each gets its own vmapped program inside the one
jitted call (a traced algorithm index under ``vmap`` would run every
algorithm's branch for every run: measured 2x slower than a plain loop).

Critic: value-baseline algorithms use the exact V_pi(s_t) of the current
policy (an oracle critic: the lab compares estimators, not critic learning).
ReMax's baseline is the exact reward of the current greedy response.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from pgjax import core
from pgjax.theory import mdp as mdp_lib


@dataclasses.dataclass(frozen=True)
class LabAlgorithm:
    """One algorithm of the lab: a label, a preset, its hyperparameters and update epochs per batch."""
    label: str
    algo: core.Algorithm
    hparams: core.HParams
    epochs: int = 1


def default_algorithms() -> tuple[LabAlgorithm, ...]:
    """The paper's algorithms (KL off) plus GRPO's single-switch ablations and DAPO."""
    def entry(label, name, epochs=1, **changes):
        algo = core.preset(name)
        return LabAlgorithm(label, algo, algo.hparams.replace(**changes), epochs)
    return (
        entry("REINFORCE", "reinforce"),
        entry("REINFORCE+V", "reinforce_baseline"),
        entry("ReMax", "remax"),
        entry("RLOO", "rloo"),
        entry("PPO", "ppo", epochs=4, kl_coef=0.0),
        entry("GRPO", "grpo", epochs=4, kl_coef=0.0),
        entry("Dr. GRPO", "dr_grpo", epochs=4),
        entry("GRPO std only", "grpo", epochs=4, kl_coef=0.0, divide_by_length=0.0),
        entry("GRPO |o| only", "grpo", epochs=4, kl_coef=0.0, divide_by_std=0.0),
        entry("DAPO", "dapo", epochs=4),
    )


def make_train(mdp: mdp_lib.TokenMDP, policy, entry: LabAlgorithm, *, k: int = 4, steps: int = 50):
    """``train(key, learning_rate, theta0) -> J`` of shape [steps + 1] for one algorithm, jittable and vmappable."""
    logits_fn, _ = policy
    p = mdp.num_prompts
    mask = jnp.asarray(mdp.mask)
    rewards_all = jnp.asarray(mdp.outcome_rewards if mdp.outcome else mdp.rewards)
    states = jnp.asarray(mdp.states)

    def batch_for(theta, rows, old_logp, values, greedy):
        logp = mdp_lib.trajectory_logprobs(mdp, logits_fn(theta))                # [P, N, T]
        prompt_of_row = jnp.repeat(jnp.arange(p), k)
        flat_rows = rows.reshape(-1)
        return core.Batch(mask=mask[flat_rows], rewards=rewards_all[prompt_of_row, flat_rows],
                          logp=logp[prompt_of_row, flat_rows], old_logp=old_logp,
                          values=values[prompt_of_row[:, None], states[flat_rows]],
                          greedy_rewards=greedy[prompt_of_row], group_size=k)

    def train(key, learning_rate, theta0):
        def step(theta, key):
            logits = logits_fn(theta)
            traj_logp = jnp.sum(mdp_lib.trajectory_logprobs(mdp, logits), axis=2)      # [P, N]
            rows = jax.random.categorical(key, traj_logp, axis=-1, shape=(k, p)).T      # [P, K]
            values = jax.lax.stop_gradient(mdp_lib.state_values(mdp, logits))
            greedy = mdp_lib.greedy_rewards(mdp, logits)
            prompt_of_row = jnp.repeat(jnp.arange(p), k)
            old_logp = mdp_lib.trajectory_logprobs(mdp, logits)[prompt_of_row, rows.reshape(-1)]

            def epoch_update(theta, _):
                def loss(th):
                    return core.loss(entry.algo.spec, batch_for(th, rows, old_logp, values, greedy), entry.hparams)[0]
                return theta - learning_rate * jax.grad(loss)(theta), None

            theta, _ = jax.lax.scan(epoch_update, theta, None, length=entry.epochs)
            return theta, mdp_lib.objective(mdp, logits_fn(theta))

        j0 = mdp_lib.objective(mdp, logits_fn(theta0))
        _, curve = jax.lax.scan(step, theta0, jax.random.split(key, steps))
        return jnp.concatenate([j0[None], curve])
    return train


def run_grid(mdp, policy, algorithms, learning_rates, seeds: int, *, k: int = 4, steps: int = 50,
             init_scale: float = 0.0):
    """Every algorithm x learning rate x seed in one jitted call: J curves [A, L, S, steps + 1].

    Seed s uses key ``split(PRNGKey(0), S)[s]`` and theta0 = init_scale * N(0, 1)
    from that key, the same for every algorithm and learning rate.
    """
    trains = [make_train(mdp, policy, entry, k=k, steps=steps) for entry in algorithms]
    keys, lrs, theta0 = grid_inputs(policy, learning_rates, seeds, init_scale)

    @jax.jit
    def all_runs(keys, lrs, theta0):
        return jnp.stack([jax.vmap(train)(keys, lrs, theta0) for train in trains])

    curves = all_runs(keys, lrs, theta0)
    return np.asarray(curves).reshape(len(algorithms), len(learning_rates), seeds, steps + 1)


def grid_inputs(policy, learning_rates, seeds: int, init_scale: float = 0.0):
    """Flattened (learning rate, seed) grid: keys [L*S], learning rates [L*S], theta0 [L*S, ...]."""
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    theta0 = init_scale * jax.vmap(lambda key: jax.random.normal(key, policy[1]))(keys)
    lr_grid, seed_grid = np.meshgrid(np.asarray(learning_rates, np.float32), np.arange(seeds), indexing="ij")
    seed_idx = seed_grid.reshape(-1)
    return keys[seed_idx], jnp.asarray(lr_grid.reshape(-1)), theta0[seed_idx]
