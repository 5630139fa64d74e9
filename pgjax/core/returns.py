"""Returns (eq. 3), lambda-returns and GAE (eq. 17) over masked, right-padded responses.

All three come from one reverse ``lax.scan`` (``gae``): the discounted return
G_t is GAE with lambda = 1 and V = 0, and the lambda-return is GAE + V.

End-of-response rule: after the last response token the next-state value is
``bootstrap[b]``: 0 for a response that ended with EOS (a terminal state), the
critic's V(s_T) for one truncated by the token budget.

Masked positions are not steps: the scan carries the next value and advantage
across them unchanged. So right padding ends the response, and a gap inside a
response (say a tool's output in a multi-turn episode) is skipped: the token
before the gap bootstraps from the token after it.
"""
import chex
import jax
import jax.numpy as jnp

from pgjax.core.dtypes import at_least_f32

Array = jax.Array


def outcome_to_token_rewards(rewards: Array, mask: Array) -> Array:
    """Place an outcome reward r_b on the last response token of each row.

    ``[B]`` -> ``[B, T]``; a row with an empty response gets all zeros
    (its reward then reaches no token and no gradient).
    """
    chex.assert_rank([rewards, mask], [1, 2])
    chex.assert_equal_shape_prefix([rewards, mask], 1)
    t = mask.shape[1]
    positions = jnp.arange(t)
    last = jnp.max(jnp.where(mask > 0, positions, -1), axis=1)
    return jnp.where(positions[None, :] == last[:, None], at_least_f32(rewards)[:, None], 0.0)


def as_token_rewards(rewards: Array, mask: Array) -> Array:
    """Outcome rewards ``[B]`` or per-token rewards ``[B, T]`` as ``[B, T]`` floats (at least float32)."""
    if rewards.ndim == 1:
        return outcome_to_token_rewards(rewards, mask)
    chex.assert_equal_shape([rewards, mask])
    return at_least_f32(rewards)


def gae(rewards: Array, values: Array, mask: Array, gamma=1.0, lam=1.0,
        bootstrap: Array | None = None) -> tuple[Array, Array]:
    """Generalised advantage estimation (GAE, eq. 17) and the lambda-return.

      delta_t = r_t + gamma V(s_{t+1}) - V(s_t)
      A_t     = delta_t + gamma lambda A_{t+1}          (A = 0 past the response)
      G^lambda_t = A_t + V(s_t)

    where V(s_{t+1}) is ``bootstrap`` after the last response token.

    Args:
      rewards: ``[B, T]`` per-token rewards R(s_t, a_t) (see ``as_token_rewards``).
      values: ``[B, T]`` critic values V(s_t).
      mask: ``[B, T]`` 1.0 on response tokens.
      gamma, lam: discount and GAE lambda, scalars in [0, 1] (may be traced).
      bootstrap: ``[B]`` value after the response; None means 0 (terminated).
    Returns:
      ``(advantages, lambda_returns)``, both ``[B, T]`` (at least float32), 0 off the mask.
    """
    chex.assert_rank([rewards, values, mask], 2)
    chex.assert_equal_shape([rewards, values, mask])
    b = rewards.shape[0]
    given = (rewards, values) if bootstrap is None else (rewards, values, bootstrap)
    dtype = jnp.result_type(*(at_least_f32(x) for x in given))
    rewards, values, mask = (x.astype(dtype) for x in (rewards, values, mask))
    bootstrap = jnp.zeros((b,), dtype) if bootstrap is None else bootstrap.astype(dtype)
    gamma, lam = jnp.asarray(gamma, dtype), jnp.asarray(lam, dtype)
    chex.assert_shape(bootstrap, (b,))

    def step(carry, xs):
        next_value, next_adv = carry
        r, v, m = xs
        adv = r + gamma * next_value - v + gamma * lam * next_adv
        on = m > 0
        carry = (jnp.where(on, v, next_value), jnp.where(on, adv, next_adv))
        return carry, jnp.where(on, adv, 0.0)

    init = (bootstrap, jnp.zeros_like(bootstrap))
    _, adv = jax.lax.scan(step, init, (rewards.T, values.T, mask.T), reverse=True)
    adv = adv.T
    return adv, jnp.where(mask > 0, adv + values, 0.0)


def discounted_returns(rewards: Array, mask: Array, gamma=1.0,
                       bootstrap: Array | None = None) -> Array:
    """G_t = sum_{i=t}^{T-1} gamma^{i-t} R(s_i, a_i) (+ gamma^{T-t} bootstrap), eq. (3).

    ``rewards`` ``[B]`` (outcome) or ``[B, T]``; returns ``[B, T]``, 0 off the mask.
    """
    token_rewards = as_token_rewards(rewards, mask)
    advantages, _ = gae(token_rewards, jnp.zeros_like(token_rewards), mask, gamma, 1.0, bootstrap)
    return advantages


def lambda_returns(rewards: Array, values: Array, mask: Array, gamma=1.0, lam=1.0,
                   bootstrap: Array | None = None) -> Array:
    """G^lambda_t = r_t + gamma [(1 - lambda) V(s_{t+1}) + lambda G^lambda_{t+1}] (used in eq. 17)."""
    return gae(as_token_rewards(rewards, mask), values, mask, gamma, lam, bootstrap)[1]
