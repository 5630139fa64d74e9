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


def scored_index(tokens, attention_mask, pad_token_id: int | None) -> jax.Array:
    """[B] the position a sequence classifier reads in each row, as transformers' do: the rightmost
    token with attention mask 1 that is not ``pad_token_id`` (None: the rightmost with mask 1), with
    left or right padding; 0 for a row without one."""
    keep = jnp.asarray(attention_mask) > 0
    if pad_token_id is not None:
        keep = keep & (jnp.asarray(tokens) != pad_token_id)
    width = keep.shape[1]
    return jnp.where(keep.any(axis=1), width - 1 - jnp.argmax(keep[:, ::-1], axis=1), 0)


class RewardModel(ScalarHead):
    """A learned reward: r(x) = w . h(x) (+ b), the head at the last token of the prompt and response
    ``x`` that is not the trunk's ``pad_token_id`` (``scored_index``: where transformers' sequence
    classifiers read it, so an exported model scores alike). Trained on preferences (Bradley-Terry,
    ``core.bradley_terry_loss``: b stays 0) or, as a process reward model, on step labels at each
    step's last token (``core.step_classification_loss`` on ``__call__``'s logits)."""

    def scores(self, tokens, attention_mask, mesh=None) -> jax.Array:
        """r of each row [B], float32."""
        values = self(tokens, attention_mask, mesh)
        index = scored_index(tokens, attention_mask, self.trunk.config.pad_token_id)
        return jnp.take_along_axis(values, index[:, None], axis=1)[:, 0]
