"""Per-token policy objectives: importance ratios, the clipped objective (eq. 15),
the modified ratio rho-hat (eq. 16), GSPO's sequence ratio, CISPO's truncated
IS weight, the on-policy REINFORCE surrogate, KL estimators and the value loss.

Every function here returns per-token ``[B, T]`` terms; ``aggregation`` turns
them into a scalar. Objectives are to be *maximised*; the loss is their negative.
"""
import chex
import jax
import jax.numpy as jnp

from pgjax.core.dtypes import at_least_f32

Array = jax.Array

KL_ESTIMATORS = ("k1", "k2", "k3")


def importance_ratio(logp: Array, old_logp: Array) -> Array:
    """rho_t(theta) = pi_theta(a_t|s_t) / pi_old(a_t|s_t) = exp(logp - old_logp)."""
    chex.assert_equal_shape([logp, old_logp])
    return jnp.exp(at_least_f32(logp) - at_least_f32(old_logp))


def on_policy_ratio(logp: Array) -> Array:
    """exp(logp - stop_gradient(logp)): value 1, gradient grad log pi.

    With it, ratio * A is the REINFORCE surrogate of eq. (10)-(14): its value is
    A and its gradient A grad log pi, the same as PPO at theta = theta_old.
    """
    logp = at_least_f32(logp)
    return jnp.exp(logp - jax.lax.stop_gradient(logp))


def sequence_ratio(logp: Array, old_logp: Array, mask: Array) -> Array:
    """GSPO's sequence ratio, per token with token gradients (GSPO-token form).

      s_b = exp( (1/|o_b|) sum_t (logp_bt - old_logp_bt) )
      s_bt = sg(s_b) * pi(a_t) / sg(pi(a_t))

    The value of s_bt is s_b at every token; its gradient is s_b grad log pi(a_t).
    With the sequence-mean / |o| aggregation this is GSPO's objective.
    """
    chex.assert_equal_shape([logp, old_logp, mask])
    logp, old_logp, mask = (at_least_f32(x) for x in (logp, old_logp, mask))
    length = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
    log_ratio = jnp.where(mask > 0, logp - old_logp, 0.0)
    seq_log_ratio = jnp.sum(log_ratio, axis=1, keepdims=True) / length
    return jnp.exp(jax.lax.stop_gradient(seq_log_ratio) + logp - jax.lax.stop_gradient(logp))


def clipped_mask(ratio: Array, advantages: Array, eps_low, eps_high, dual_clip=0.0) -> Array:
    """1.0 where the clipped branch of eq. (15) is active (its gradient is 0), else 0.0.

    Active when A > 0 and rho > 1 + eps_high, or A < 0 and rho < 1 - eps_low
    (eq. 16 with clip-higher's asymmetric epsilons), or, with dual clip
    c > 1, when A < 0 and rho > c. ``dual_clip`` = 0 disables the dual clip.
    """
    chex.assert_equal_shape([ratio, advantages])
    ratio = jax.lax.stop_gradient(ratio)
    upper = (advantages > 0) & (ratio > 1.0 + eps_high)
    lower = (advantages < 0) & (ratio < 1.0 - eps_low)
    dual = (dual_clip > 1.0) & (advantages < 0) & (ratio > dual_clip)
    return (upper | lower | dual).astype(ratio.dtype)


def modified_ratio(ratio: Array, advantages: Array, eps_low, eps_high, dual_clip=0.0) -> Array:
    """rho-hat_t of eq. (16): 0 where the clip is active, rho_t elsewhere.

    grad (rho-hat A) equals the gradient of the clipped objective (eq. 15).
    """
    return ratio * (1.0 - clipped_mask(ratio, advantages, eps_low, eps_high, dual_clip))


def clipped_objective(ratio: Array, advantages: Array, eps_low, eps_high, dual_clip=0.0) -> Array:
    """PPO's clipped surrogate (eq. 15), per token, with asymmetric eps and dual clip:

      min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), and for A < 0 and c > 1
      max(that, c A)  (dual clip).
    """
    chex.assert_equal_shape([ratio, advantages])
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    obj = jnp.minimum(ratio * advantages, clipped * advantages)
    dual = jnp.maximum(obj, dual_clip * advantages)
    return jnp.where((dual_clip > 1.0) & (advantages < 0), dual, obj)


def truncated_is_weight(ratio: Array, eps_high) -> Array:
    """CISPO's weight sg(min(rho, 1 + eps_high)): the per-token objective is
    weight * A * log pi, so every token keeps a gradient, scaled by the truncated ratio."""
    return jax.lax.stop_gradient(jnp.minimum(ratio, 1.0 + eps_high))


def kl_estimate(logp: Array, ref_logp: Array, estimator: str) -> Array:
    """Per-token estimate of KL(pi_theta || pi_ref) from a sample a_t ~ pi_theta.

    With log r = log pi_ref(a_t) - log pi_theta(a_t):
      k1 = -log r                   unbiased value, high variance, can be negative
      k2 = (log r)^2 / 2            biased value, low variance, >= 0
      k3 = (r - 1) - log r          unbiased value, low variance, >= 0 (GRPO's choice)

    "Unbiased" is about the value. As a *loss term* differentiated through the
    sample's log-prob (kl_placement="loss"), the expected gradients are:
    k1 -> 0 (E[grad log pi] = 0: k1 in the loss does nothing on average);
    k2 -> grad KL(pi || ref); k3 -> grad KL(ref || pi) (the reverse KL).
    In the reward (kl_placement="reward") the value is what matters.
    """
    chex.assert_equal_shape([logp, ref_logp])
    log_r = at_least_f32(ref_logp) - at_least_f32(logp)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r ** 2
    if estimator == "k3":
        return jnp.expm1(log_r) - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def value_loss(values: Array, old_values: Array, returns: Array, clip_eps=0.0) -> Array:
    """Per-token critic loss 0.5 (V - G)^2; with clip_eps > 0 PPO's clipped form

      0.5 max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) - G)^2).
    """
    chex.assert_equal_shape([values, old_values, returns])
    values, old_values, returns = (at_least_f32(x) for x in (values, old_values, returns))
    plain = (values - returns) ** 2
    clipped = (old_values + jnp.clip(values - old_values, -clip_eps, clip_eps) - returns) ** 2
    return 0.5 * jnp.where(clip_eps > 0, jnp.maximum(plain, clipped), plain)
