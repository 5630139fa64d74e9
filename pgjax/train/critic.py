"""The critic V(s_t) of PPO and REINFORCE with a baseline.

A separate model, not a value head on the policy: a copy of the policy's
transformer trunk plus a linear head (zero-initialised, so V = 0 at the start),
trained by its own optimizer on the value loss. Keeping it separate means the
value regression never pulls on the policy's features and the two learning
rates are independent (the PPO-for-LLM setups of the paper's references train a
separate critic); the cost is a second set of trunk weights in memory.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from pgjax.models.transformer import CausalLM


class ValueModel(nnx.Module):
    """V(s) = w . h(s) + b, with h the final hidden state of a ``CausalLM`` trunk."""

    def __init__(self, trunk: CausalLM):
        size = trunk.config.hidden_size
        self.trunk = trunk
        self.head = nnx.Param(jnp.zeros((size,), jnp.float32), logical_axes=("embed",))
        self.bias = nnx.Param(jnp.zeros((), jnp.float32), logical_axes=())

    @classmethod
    def from_policy(cls, policy: CausalLM) -> ValueModel:
        """A critic whose trunk starts as a copy of ``policy``'s weights."""
        graphdef, state = nnx.split(policy)
        return cls(nnx.merge(graphdef, jax.tree.map(jnp.copy, state)))

    def __call__(self, tokens, attention_mask, mesh=None) -> jax.Array:
        """V at every position [B, T], float32: the value of the state ending at that token (``mesh``:
        see ``CausalLM.__call__``)."""
        hidden = self.trunk(tokens, attention_mask, return_hidden=True, mesh=mesh).astype(jnp.float32)
        return hidden @ self.head[...] + self.bias[...]

    def response_values(self, tokens, attention_mask, prompt_length: int, mesh=None):
        """V(s_t) for each response token t [B, N] (the state before it), and V after the last slot [B]."""
        values = self(tokens, attention_mask, mesh)
        return values[:, prompt_length - 1:-1], values[:, -1]
