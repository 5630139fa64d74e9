"""Baselines and advantages: group mean, leave-one-out (eq. 14), group std (eq. 18/20),
greedy rollout (eq. 13), batch whitening, and the broadcast of outcome advantages.

Groups: a batch of B = P * K rows holds K responses to each of P prompts,
row ``p * K + k``; K is a static Python int. Group baselines need K >= 2
(with one sample there is nothing to compare against): K = 1 raises.
"""
import chex
import jax
import jax.numpy as jnp

from pgjax.core.dtypes import at_least_f32

Array = jax.Array


def check_group_size(rows: int, group_size: int, minimum: int = 1) -> None:
    """Raise a ValueError unless ``group_size`` >= ``minimum`` and divides ``rows``."""
    if group_size < minimum:
        raise ValueError(f"group_size K must be >= {minimum} here, got K={group_size}")
    if rows % group_size:
        raise ValueError(f"batch of {rows} rows is not divisible by group_size K={group_size}")


def _groups(x: Array, group_size: int) -> Array:
    chex.assert_rank(x, 1)
    check_group_size(x.shape[0], group_size, minimum=2)
    return at_least_f32(x).reshape(-1, group_size)


def group_mean(scores: Array, group_size: int) -> Array:
    """b_k = (1/K) sum_i G_i over the K samples of row k's prompt (GRPO, eq. 18-21), ``[B]``."""
    g = _groups(scores, group_size)
    return jnp.broadcast_to(jnp.mean(g, axis=1, keepdims=True), g.shape).reshape(-1)


def leave_one_out_mean(scores: Array, group_size: int) -> Array:
    """b_k = (1/(K-1)) sum_{i != k} G_i (RLOO, eq. 14), ``[B]``.

    Note G_k - b_k = K/(K-1) (G_k - mean_i G_i): the leave-one-out baseline is
    the group mean with the 1/(K-1) scaling of eq. (14) and (19).
    """
    g = _groups(scores, group_size)
    return ((jnp.sum(g, axis=1, keepdims=True) - g) / (group_size - 1)).reshape(-1)


def group_std(scores: Array, group_size: int, ddof=1.0) -> Array:
    """std[r] over the K samples of row k's prompt, sqrt(sum_i (r_i - mean)^2 / (K - ddof)), ``[B]``."""
    g = _groups(scores, group_size)
    var = jnp.sum((g - jnp.mean(g, axis=1, keepdims=True)) ** 2, axis=1, keepdims=True)
    return jnp.broadcast_to(jnp.sqrt(var / (group_size - ddof)), g.shape).reshape(-1)


def group_advantages(scores: Array, group_size: int, leave_one_out=0.0, divide_by_std=0.0,
                     std_eps=1e-6, std_ddof=1.0) -> Array:
    """Group-relative advantages of the paper's group family, ``[B]``.

      b_k = (1 - l) mean_i G_i + l (1/(K-1)) sum_{i != k} G_i
      A_k = (G_k - b_k) / ((1 - s) + s (std[G] + eps))

    l = ``leave_one_out``: 0 is the plain group mean with the paper's 1/K (GRPO,
    eq. 18; biased by (K-1)/K), 1 the leave-one-out baseline, i.e. the 1/(K-1)
    scaling of RLOO (eq. 14) and eq. (19). s = ``divide_by_std``: 1 divides by
    the group std (eq. 18, 20). Both are floats so ``vmap`` can sweep them.

    A group whose scores are all exactly equal gets A = 0 exactly (not 0/eps
    noise). Scores that differ by rounding only are not equal: with
    divide_by_std they are scaled up like any other group.
    """
    g = _groups(scores, group_size).reshape(-1)
    baseline = (1.0 - leave_one_out) * group_mean(g, group_size) \
        + leave_one_out * leave_one_out_mean(g, group_size)
    denom = (1.0 - divide_by_std) + divide_by_std * (group_std(g, group_size, std_ddof) + std_eps)
    grouped = g.reshape(-1, group_size)
    all_equal = jnp.repeat(jnp.max(grouped, axis=1) == jnp.min(grouped, axis=1), group_size)
    return jnp.where(all_equal, 0.0, (g - baseline) / denom)


def greedy_baseline_advantages(scores: Array, greedy_scores: Array) -> Array:
    """ReMax (eq. 13): A = G - G_hat, with G_hat the return of the greedy rollout
    from the same prompt, ``[B]``.

    The paper's b_t = G_hat_t is the greedy return from every s_t; as in ReMax's
    implementation we use the greedy return from s_0 for every t.
    """
    chex.assert_rank([scores, greedy_scores], 1)
    chex.assert_equal_shape([scores, greedy_scores])
    return at_least_f32(scores) - at_least_f32(greedy_scores)


def whiten(x: Array, mask: Array, eps=1e-8, ddof=1.0) -> Array:
    """(A - E[A]) / (std[A] + eps) over the masked entries of the whole batch (PPO, REINFORCE++).

    E and std are over every masked token of the batch (the usual practice;
    the paper's PPO note writes the same normalisation over one trajectory's
    T steps), std with ``ddof`` (the paper uses 1). Off-mask entries are 0. With fewer than ddof + 1
    masked entries the divisor n - ddof is replaced by 1 (no NaN). Off-mask
    entries may hold anything (they are selected away, not multiplied).
    """
    chex.assert_equal_shape([x, mask])
    on = at_least_f32(mask) > 0
    x = jnp.where(on, at_least_f32(x), 0.0)
    n = jnp.sum(on)
    mean = jnp.sum(x) / jnp.maximum(n, 1)
    centered = jnp.where(on, x - mean, 0.0)
    var = jnp.sum(centered ** 2) / jnp.maximum(n - ddof, 1.0)
    return centered / (jnp.sqrt(var) + eps)


def broadcast_over_tokens(seq_advantages: Array, mask: Array) -> Array:
    """Outcome-level A_k ``[B]`` -> per-token ``[B, T]``: A_{k,t} = A_k on response tokens."""
    chex.assert_rank([seq_advantages, mask], [1, 2])
    chex.assert_equal_shape_prefix([seq_advantages, mask], 1)
    return jnp.where(at_least_f32(mask) > 0, at_least_f32(seq_advantages)[:, None], 0.0)


def sequence_scores(rewards: Array, mask: Array) -> Array:
    """The scalar score of each response: the outcome reward ``[B]`` itself, or the
    undiscounted sum of per-token rewards over the response for ``[B, T]``.

    An empty response keeps its outcome reward, so it still counts in its
    group's statistics (it has no token to receive a gradient)."""
    if rewards.ndim == 1:
        return at_least_f32(rewards)
    chex.assert_equal_shape([rewards, mask])
    return jnp.sum(jnp.where(mask > 0, at_least_f32(rewards), 0.0), axis=1)
