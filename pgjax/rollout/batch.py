"""The batch a rollout hands the learner (``Rollout``): prompt and response tokens with the ``core.Batch``
of the response tokens, filled in stages by the rollout and ``Learner.prepare``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import numpy as np

from pgjax import core


@flax.struct.dataclass
class Rollout:
    """One step's responses and everything the update needs; rows ``p * K + k``.

    tokens, attention_mask [B, W + N]: prompt and response. ``batch``: the ``core.Batch`` of the
    response tokens, filled in stages: the rollout gives ``mask`` [B, N] (the tokens that count),
    ``rewards`` [B], ``greedy_rewards`` (ReMax) and ``group_size`` (``logp`` is None);
    ``Learner.prepare`` adds ``old_logp``, ``ref_logp``, ``values``, ``bootstrap`` and
    ``advantages`` [B, N], and the critic's value ``targets`` [B, N]. Fields an algorithm does not use
    are None. ``budget`` (static): the response token budget L when N is narrower (padding trimmed,
    ``rollout.trim_padding``); the constant length of ``seq_mean_const_len`` (None: N).
    """
    tokens: jax.Array
    attention_mask: jax.Array
    batch: core.Batch
    targets: jax.Array | None = None
    budget: int | None = flax.struct.field(pytree_node=False, default=None)

    if TYPE_CHECKING:       # added by flax.struct.dataclass (dataclasses.replace)
        def replace(self, **changes: Any) -> Rollout: ...

    @property
    def mask(self) -> jax.Array:
        return self.batch.mask

    def with_mask(self, mask) -> Rollout:
        """The same rollout counting only the tokens of ``mask`` (advantages and old log-probs kept)."""
        return self.replace(batch=self.batch.replace(mask=mask))


def placeholder_rollout(rows: int, prompt_width: int, budget: int, group_size: int, greedy_rewards: bool,
                        array=np.zeros, token_rewards: bool = False) -> Rollout:
    """A rollout with the layout the sampler hands ``Learner.prepare`` at full width: ``rows`` rows of
    ``prompt_width`` prompt and ``budget`` response tokens, response mask, outcome rewards (per token
    with ``token_rewards``: multi-turn episodes), the sampler's log-probs and (``greedy_rewards``,
    ReMax) the greedy rewards. ``array(shape, dtype)`` makes each leaf: ``np.zeros`` (a checkpoint's
    restore target) or a ``jax.ShapeDtypeStruct`` maker (the memory planner's abstract batch)."""
    width = prompt_width + budget
    rewards = array((rows, budget) if token_rewards else (rows,), np.float32)
    batch = core.Batch(mask=array((rows, budget), np.float32), rewards=rewards, logp=None,
                       behaviour_logp=array((rows, budget), np.float32),
                       greedy_rewards=array((rows,), np.float32) if greedy_rewards else None, group_size=group_size)
    return Rollout(tokens=array((rows, width), np.int32), attention_mask=array((rows, width), np.int32), batch=batch)
