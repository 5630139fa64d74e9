"""The critic V(s_t) of PPO and REINFORCE with a baseline.

A separate model, not a value head on the policy: a copy of the policy's
transformer trunk plus a linear head (zero-initialised, so V = 0 at the start),
trained by its own optimizer on the value loss. Keeping it separate means the
value regression never pulls on the policy's features and the two learning
rates are independent (the PPO-for-LLM setups of the paper's references train a
separate critic); the cost is a second set of trunk weights in memory.
"""
from __future__ import annotations

from pgjax.models.heads import ScalarHead


class ValueModel(ScalarHead):
    """V(s) = w . h(s) + b, with h the final hidden state of a ``CausalLM`` trunk."""

    def response_values(self, tokens, attention_mask, prompt_length: int, mesh=None):
        """V(s_t) for each response token t [B, N] (the state before it), and V after the last slot [B]."""
        values = self(tokens, attention_mask, mesh)
        return values[:, prompt_length - 1:-1], values[:, -1]
