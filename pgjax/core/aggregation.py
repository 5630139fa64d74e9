"""Loss aggregation: how per-token terms x_bt become one scalar.

The choice is always an explicit argument. Every denominator comes from a
``Normalizer`` computed once on the *global* batch, so that summing the
aggregates of micro-batches (or of devices) gives exactly the full-batch value
and gradient. Modes, with m the mask, B sequences, P = B / K prompts and
w_b the per-sequence length weight:

  prompt_mean          (1/P) sum_b w_b sum_t m x      eq. (21): sum over a prompt's K
                                                      responses and their tokens, mean
                                                      over prompts (the token sum for P = 1)
  token_mean           sum_b w_b sum_t m x / sum m    DAPO's token-level mean
  seq_mean             (1/B) sum_b w_b sum_t m x      w_b = 1/|o_b|: sequence-mean of
                                                      token-means (GRPO, eq. 18);
                                                      w_b = 1: of token-sums (eq. 19)
  seq_mean_const_len   (1/B) sum_b w_b sum_t m x / L  Dr. GRPO in practice: a constant L
                                                      (the token budget) instead of |o_b|

w_b = s / |o_b| + (1 - s) with s = ``divide_by_length``, the paper's 1/|o|
switch (a traced float, so one compiled loss sweeps it); it applies in every
mode, though only ``seq_mean`` with it is a named algorithm (GRPO). An empty
response (|o_b| = 0) contributes 0. L is the token budget: pass it to
``loss_normalizer``; it defaults to the padded width T.
"""
import dataclasses

import chex
import jax
import jax.numpy as jnp

from pgjax.core.advantages import check_group_size
from pgjax.core.dtypes import at_least_f32

Array = jax.Array

AGGREGATIONS = ("prompt_mean", "token_mean", "seq_mean", "seq_mean_const_len")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Normalizer:
    """Global-batch denominators (float scalars): tokens sum m, sequences B, prompts P, length L."""
    num_tokens: Array
    num_sequences: Array
    num_prompts: Array
    max_length: Array


def loss_normalizer(mask: Array, group_size: int, max_length=None) -> Normalizer:
    """Denominators of the global batch ``mask`` ``[B, T]`` with K = ``group_size``
    responses per prompt (1 without groups); L defaults to T."""
    chex.assert_rank(mask, 2)
    b, t = mask.shape
    mask = at_least_f32(mask)
    check_group_size(b, group_size)
    f = lambda x: jnp.asarray(x, mask.dtype)  # noqa: E731
    return Normalizer(num_tokens=f(jnp.sum(mask)), num_sequences=f(b), num_prompts=f(b // group_size),
                      max_length=f(t if max_length is None else max_length))


def length_weights(mask: Array, divide_by_length=0.0) -> Array:
    """w_b = s / max(|o_b|, 1) + (1 - s), ``[B]``: the paper's 1/|o| switch (eq. 18)."""
    length = jnp.sum(at_least_f32(mask), axis=1)
    return divide_by_length / jnp.maximum(length, 1.0) + (1.0 - divide_by_length)


def aggregate(per_token: Array, mask: Array, mode: str, norm: Normalizer,
              divide_by_length=0.0) -> Array:
    """Scalar aggregate of ``per_token`` ``[B, T]`` under ``mode`` (see the module docstring)."""
    chex.assert_rank([per_token, mask], 2)
    chex.assert_equal_shape([per_token, mask])
    mask = at_least_f32(mask)
    masked = jnp.where(mask > 0, at_least_f32(per_token) * mask, 0.0)  # padding may hold inf / NaN
    weighted = jnp.sum(masked, axis=1) * length_weights(mask, divide_by_length)
    total = jnp.sum(weighted)
    if mode == "prompt_mean":
        return total / norm.num_prompts
    if mode == "token_mean":
        return total / jnp.maximum(norm.num_tokens, 1.0)
    if mode == "seq_mean":
        return total / norm.num_sequences
    if mode == "seq_mean_const_len":
        return total / (norm.num_sequences * norm.max_length)
    raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")
