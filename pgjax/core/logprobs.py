"""Per-token log-probabilities and entropies of a causal LM's sampled tokens.

Convention: ``logits[b, t]`` is the distribution over the token ``tokens[b, t]``
(the caller has already shifted by one position). All reductions run in at
least float32 (``dtypes.at_least_f32``) whatever the dtype of the logits or
hidden states: a bf16 log-sum-exp over a 150k vocabulary loses ~3 significant
digits.

With temperature tau the policy is pi(a|s) = softmax(z(s) / tau)_a, the
distribution the sampler draws from; its log-probs are what the importance
ratio rho_t of eq. (15) needs.
"""
from functools import partial

import chex
import jax
import jax.numpy as jnp

from pgjax.core.dtypes import at_least_f32

Array = jax.Array


def token_logprobs(logits: Array, tokens: Array, temperature=1.0) -> Array:
    """log pi(a_t | s_t) = z_{a_t} / tau - logsumexp(z / tau), for every position.

    Args:
      logits: ``[..., V]`` unnormalised scores z, any float dtype.
      tokens: ``[...]`` integer ids a_t of the taken tokens.
      temperature: tau > 0 (a scalar, may be traced).
    Returns:
      ``[...]`` log-probabilities, float32 (float64 for float64 logits).
    """
    chex.assert_equal_shape_prefix([logits, tokens], tokens.ndim)
    chex.assert_rank(logits, tokens.ndim + 1)
    chex.assert_type(tokens, int)
    z = at_least_f32(logits) / temperature
    taken = jnp.take_along_axis(z, tokens[..., None], axis=-1)[..., 0]
    return taken - jax.nn.logsumexp(z, axis=-1)


def entropy_from_logits(logits: Array, temperature=1.0) -> Array:
    """H(pi(.|s_t)) = logsumexp(z/tau) - sum_a pi(a|s_t) z_a/tau, ``[...]``.

    Tokens with logit -inf (a masked vocabulary) have p = 0 and add nothing."""
    z = at_least_f32(logits) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jax.nn.softmax(z, axis=-1)
    return lse - jnp.sum(p * jnp.where(p > 0, z, 0.0), axis=-1)  # where inside: finite gradient too


def _chunk_stats(h, w, tok, temperature):
    """Scaled logits z = h W / tau of one chunk ``[C, V]`` (at least float32), p = softmax(z),
    the log-sum-exp of z, the mean score E_p[z] and the taken token's score z_a."""
    dtype = jnp.promote_types(jnp.result_type(h, w), jnp.float32)
    z = jnp.dot(h, w, preferred_element_type=dtype) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    p = jnp.exp(z - lse[:, None])
    mean_z = jnp.sum(p * z, axis=-1)
    taken = jnp.take_along_axis(z, tok[:, None], axis=-1)[:, 0]
    return z, p, lse, mean_z, taken


def _split_chunks(x, chunk_size):
    n = x.shape[0]
    pad = (-n) % chunk_size
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((-1, chunk_size) + x.shape[1:])


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _flat_logprobs_entropy(hidden, unembed, tokens, temperature, chunk_size):
    out, _ = _flat_forward(hidden, unembed, tokens, temperature, chunk_size)
    return out


def _flat_forward(hidden, unembed, tokens, temperature, chunk_size):
    n = hidden.shape[0]

    def one_chunk(args):
        h, tok = args
        _, _, lse, mean_z, taken = _chunk_stats(h, unembed, tok, temperature)
        return taken - lse, lse - mean_z

    logp, ent = jax.lax.map(one_chunk, (_split_chunks(hidden, chunk_size), _split_chunks(tokens, chunk_size)))
    logp, ent = (x.reshape(-1)[:n] for x in (logp, ent))
    return (logp, ent), (hidden, unembed, tokens, temperature)


def _flat_backward(chunk_size, res, cotangents):
    """Recompute each chunk's logits and push the cotangents through them.

    With z = h W / tau, p = softmax(z) and H = lse(z) - sum_a p_a z_a:
      d logp / dz = onehot(a) - p,      d H / dz = -p * (z - sum_a p_a z_a).
    So dL/dz = g_logp (onehot - p) - g_H p (z - E_p z), then
    dL/dh = dL/dz W^T / tau,  dL/dW = h^T dL/dz / tau,  dL/dtau = -sum dL/dz * z / tau.
    """
    hidden, unembed, tokens, temperature = res
    g_logp, g_ent = cotangents
    n = hidden.shape[0]
    chunks = tuple(_split_chunks(x, chunk_size) for x in (hidden, tokens, g_logp, g_ent))

    def body(carry, args):
        g_w, g_tau = carry
        h, tok, gl, ge = args
        z, p, _, mean_z, _ = _chunk_stats(h, unembed, tok, temperature)
        onehot = jax.nn.one_hot(tok, z.shape[-1], dtype=z.dtype)
        g_z = gl[:, None] * (onehot - p) - ge[:, None] * p * (z - mean_z[:, None])
        g_h = jnp.dot(g_z, at_least_f32(unembed).T) / temperature
        g_w = g_w + jnp.dot(at_least_f32(h).T, g_z) / temperature
        g_tau = g_tau - jnp.sum(g_z * z) / temperature
        return (g_w, g_tau), g_h

    dtype = jnp.promote_types(jnp.result_type(hidden, unembed), jnp.float32)
    init = (jnp.zeros(unembed.shape, dtype), jnp.zeros((), dtype))
    (g_w, g_tau), g_h = jax.lax.scan(body, init, chunks)
    g_h = g_h.reshape(-1, hidden.shape[-1])[:n].astype(hidden.dtype)
    g_tau = jnp.broadcast_to(g_tau, jnp.shape(temperature)).astype(jnp.result_type(temperature))
    return g_h, g_w.astype(unembed.dtype), None, g_tau


_flat_logprobs_entropy.defvjp(_flat_forward, _flat_backward)


def chunked_logprobs_and_entropy(hidden: Array, unembed: Array, tokens: Array,
                                 temperature=1.0, chunk_size: int = 1024):
    """Log-probs and entropies from final hidden states, never building ``[..., V]`` logits.

    Same values and gradients as ``token_logprobs(hidden @ unembed, tokens)`` and
    ``entropy_from_logits(hidden @ unembed)``, but the tokens are processed
    ``chunk_size`` at a time with a ``jax.custom_vjp`` whose backward pass
    recomputes each chunk's logits, so peak temporary memory is
    O(chunk_size * V + H * V) instead of O(N * V) for N tokens.

    Args:
      hidden: ``[..., H]`` final hidden states (after the final norm).
      unembed: ``[H, V]`` unembedding matrix (for tied embeddings pass ``embedding.T``).
      tokens: ``[...]`` integer ids of the taken tokens.
      temperature: tau > 0, scalar.
      chunk_size: tokens per chunk (static).
    Returns:
      ``(logp, entropy)`` with the shape of ``tokens``, float32 (float64 for float64 inputs).
    """
    chex.assert_rank(hidden, tokens.ndim + 1)
    chex.assert_equal_shape_prefix([hidden, tokens], tokens.ndim)
    chex.assert_rank(unembed, 2)
    chex.assert_type(tokens, int)
    if hidden.shape[-1] != unembed.shape[0]:
        raise ValueError(f"hidden size {hidden.shape[-1]} does not match unembed rows {unembed.shape[0]}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    lead = tokens.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    temperature = jnp.asarray(temperature, jnp.promote_types(jnp.result_type(hidden, unembed), jnp.float32))
    logp, ent = _flat_logprobs_entropy(flat_h, unembed, tokens.reshape(-1), temperature,
                                       min(chunk_size, max(flat_h.shape[0], 1)))
    return logp.reshape(lead), ent.reshape(lead)
