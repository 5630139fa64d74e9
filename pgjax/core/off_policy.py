"""Off-policy corrections: the sampler's (behaviour) policy mu against the learner's pi.

The responses of a batch are drawn from mu: the sampler's own numerics (other kernels, a lower
precision) and, with asynchronous rollouts, parameters some updates old. The update's proximal
policy pi_old is the learner's policy at the parameters it starts from (``Batch.old_logp``, or the
current log-probs on the first minibatch). Per response token, with log-probs of the taken token,

  w_t = pi_old(a_t | s_t) / mu(a_t | s_t) = exp(old_logp_t - behaviour_logp_t)

and the corrections weight the policy term of each token (eq. 15's rho-hat A, or the on-policy
surrogate) by a stop-gradient weight c_t derived from w (the "decoupled" form: PPO's clip keeps the
update near pi_old, the weight moves the expectation from mu to pi_old):

  token       c_t = w_t
  sequence    c_t = W_b = prod_{t in o_b} w_t          (the trajectory ratio: full IS)
  geometric   c_t = W_b^(1/|o_b|) = exp(mean_t log w_t)

each then limited (``mode``) by the cap C and the floor f:

  truncate    c <- min(c, C)                            (truncated IS, TIS)
  mask        c <- c * 1[f <= c <= C]                   (masked IS: drop tokens / whole sequences)

C = inf with ``truncate`` is the plain (untruncated) weight. Only ``sequence`` with C = inf is
unbiased for every estimator: per-token weights ignore that mu also reached s_t with other
probabilities than pi_old (``pgjax.theory.off_policy`` measures the resulting bias exactly).
"""
import chex
import jax
import jax.numpy as jnp

from pgjax.core.dtypes import at_least_f32
from pgjax.core.objectives import kl_estimate

Array = jax.Array

IS_LEVELS = ("token", "sequence", "geometric")
IS_MODES = ("truncate", "mask")
MISMATCH_BAND = (0.5, 2.0)


def log_ratio(old_logp: Array, behaviour_logp: Array, mask: Array) -> Array:
    """log w_t = log pi_old(a_t) - log mu(a_t) on the response tokens, 0 on padding."""
    chex.assert_equal_shape([old_logp, behaviour_logp, mask])
    return jnp.where(mask > 0, at_least_f32(old_logp) - at_least_f32(behaviour_logp), 0.0)


def raw_weights(old_logp: Array, behaviour_logp: Array, mask: Array, level: str) -> Array:
    """The per-token weight c_t [B, T] of ``level`` before any limit (see the module docstring):
    w_t, the sequence ratio prod_t w_t, or its geometric mean, broadcast over the response."""
    log_w = log_ratio(old_logp, behaviour_logp, mask)
    if level == "token":
        return jnp.exp(log_w)
    if level not in IS_LEVELS:
        raise ValueError(f"unknown importance-sampling level {level!r}; expected one of {IS_LEVELS}")
    total = jnp.sum(log_w, axis=1, keepdims=True)
    if level == "geometric":
        total = total / jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
    return jnp.broadcast_to(jnp.exp(total), log_w.shape)


def limit_weights(weights: Array, mode: str, cap, floor) -> tuple[Array, Array]:
    """(the limited weights, 1.0 where the limit changed a weight): ``truncate`` min(c, C);
    ``mask`` c where f <= c <= C, else 0."""
    if mode == "truncate":
        return jnp.minimum(weights, cap), (weights > cap).astype(weights.dtype)
    if mode != "mask":
        raise ValueError(f"unknown importance-sampling mode {mode!r}; expected one of {IS_MODES}")
    outside = (weights > cap) | (weights < floor)
    return jnp.where(outside, 0.0, weights), outside.astype(weights.dtype)


def correction_weights(old_logp: Array, behaviour_logp: Array, mask: Array, level: str, mode: str, cap, floor
                       ) -> tuple[Array, Array]:
    """The stop-gradient weight c_t [B, T] of each token's policy term and the indicator of the
    tokens whose weight was truncated or masked (both 0 on padding)."""
    weights, limited = limit_weights(raw_weights(old_logp, behaviour_logp, mask, level), mode, cap, floor)
    on = mask > 0
    return jax.lax.stop_gradient(jnp.where(on, weights, 0.0)), jnp.where(on, limited, 0.0)


def mismatch_metrics(learner_logp: Array, sampler_logp: Array, mask: Array) -> dict:
    """How far the sampler's log-probs are from the learner's, as sums over the response tokens
    (``finalize_metrics`` turns ``*_sum`` into per-token means) and a max:

      mismatch_abs:     |log pi(a_t) - log mu(a_t)|                 (sum and max)
      mismatch_kl:      k3 = (r - 1) - log r, r = pi(a_t) / mu(a_t): an unbiased estimate of
                        KL(mu || pi) from the sampled tokens
      mismatch_outside: 1 where r leaves ``MISMATCH_BAND`` = [0.5, 2]
    """
    log_r = log_ratio(learner_logp, sampler_logp, mask)
    m = at_least_f32(mask)
    on = m > 0
    kl = kl_estimate(jnp.where(on, sampler_logp, 0.0), jnp.where(on, learner_logp, 0.0), "k3")
    low, high = MISMATCH_BAND
    outside = (log_r < jnp.log(low)) | (log_r > jnp.log(high))
    return {"mismatch_abs_sum": jnp.sum(jnp.abs(log_r) * m),
            "mismatch_abs_max": jnp.max(jnp.where(on, jnp.abs(log_r), -jnp.inf)),
            "mismatch_kl_sum": jnp.sum(kl * m),
            "mismatch_outside_sum": jnp.sum(outside * m)}
