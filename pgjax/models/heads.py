"""A scalar head on a ``CausalLM`` trunk: s_t = w . h_t + b at every position, in float32, with h_t
the trunk's final hidden state. The critic's V(s_t) (``pgjax.train.critic``) reads it at every
response token; a reward model reads it at each row's last real token (``RewardModel.scores``), a
process reward model at each step's last token (its logits). w and b start at 0: every score 0.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from pgjax.models.transformer import CausalLM


class ScalarHead(nnx.Module):
    """s_t = w . h_t + b on ``trunk``'s final hidden states."""

    def __init__(self, trunk: CausalLM):
        size = trunk.config.hidden_size
        self.trunk = trunk
        self.head = nnx.Param(jnp.zeros((size,), jnp.float32), logical_axes=("embed",))
        self.bias = nnx.Param(jnp.zeros((), jnp.float32), logical_axes=())

    @classmethod
    def from_policy(cls, policy: CausalLM):
        """A head whose trunk starts as a copy of ``policy``'s weights."""
        graphdef, state = nnx.split(policy)
        return cls(nnx.merge(graphdef, jax.tree.map(jnp.copy, state)))

    def __call__(self, tokens, attention_mask, mesh=None) -> jax.Array:
        """s at every position [B, T], float32 (``mesh``: see ``CausalLM.__call__``)."""
        hidden = self.trunk(tokens, attention_mask, return_hidden=True, mesh=mesh).astype(jnp.float32)
        return hidden @ self.head[...] + self.bias[...]


def last_real_index(attention_mask) -> jax.Array:
    """[B] the position of each row's last token with attention mask 1 (left or right padding)."""
    mask = jnp.asarray(attention_mask) > 0
    width = mask.shape[1]
    return width - 1 - jnp.argmax(mask[:, ::-1], axis=1)


class RewardModel(ScalarHead):
    """A learned reward: r(x) = w . h(x) (+ b), the head at the last real token of the prompt and
    response ``x``. Trained on preferences (Bradley-Terry, ``core.bradley_terry_loss``: b gets no
    gradient and stays 0) or, as a process reward model, on step labels at each step's last token
    (``core.step_classification_loss`` on ``__call__``'s logits)."""

    def scores(self, tokens, attention_mask, mesh=None) -> jax.Array:
        """r of each row [B], float32."""
        values = self(tokens, attention_mask, mesh)
        return jnp.take_along_axis(values, last_real_index(attention_mask)[:, None], axis=1)[:, 0]
