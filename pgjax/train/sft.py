"""Supervised warm start: cross-entropy on demonstrations, for tasks a random policy never solves.

  L(theta) = - sum_{b,t} m_bt log pi_theta(a_bt | s_bt) / sum_{b,t} m_bt

over the demonstration tokens (the answer and its end token: EOS, or the chat
template's end of turn) of each batch, the prompt given. One jitted AdamW step per batch.

With an environment (multi-turn episodes) a demonstration is a worked episode
(``episode_demonstrations``): the environment's ``demonstration(example)`` replies
played through it, and m_bt is 1 on the replies' tokens alone, the observations
and the template's tokens between turns context, as in the RL loss (docs/agents.md).
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from pgjax.models.scoring import response_logprobs
from pgjax.rollout.collect import PLAIN, PromptFormat, encode_prompts, pad_id, right_pad
from pgjax.rollout.episodes import EpisodeLimits, demonstrated_episodes, widened


def demonstrations(tokenizer, examples: list[dict], prompt_width: int, response_width: int,
                   prompt_format: PromptFormat = PLAIN, end_id: int | None = None):
    """tokens, attention_mask [B, W + N] and the response mask [B, N] of prompt (rendered by
    ``prompt_format``) + answer + ``end_id`` (default: EOS)."""
    end_id = tokenizer.eos_token_id if end_id is None else end_id
    prompt_tokens, prompt_mask = encode_prompts(tokenizer, [e["prompt"] for e in examples], prompt_width,
                                                prompt_format)
    answers = [tokenizer(example["answer"], add_special_tokens=False)["input_ids"] + [end_id] for example in examples]
    for example, ids in zip(examples, answers, strict=True):
        if len(ids) > response_width:
            raise ValueError(f"demonstration {example['answer']!r} needs {len(ids)} tokens with its end token; "
                             f"max_new_tokens is {response_width}")
    response, mask = right_pad(tokenizer, answers, response_width)
    return (np.concatenate([prompt_tokens, response], 1), np.concatenate([prompt_mask, mask], 1),
            mask.astype(np.float32))


def episode_demonstrations(tokenizer, environment, examples: list[dict], prompt_width: int, limits: EpisodeLimits,
                           reply_tokens: int, prompt_format: PromptFormat, end_id: int):
    """``demonstrations``' tokens, attention_mask [B, W + N] and mask [B, N] (N = ``limits.max_tokens``)
    of the examples' worked episodes (``episodes.demonstrated_episodes``): the opening left-padded to W,
    then the replies, each closed with ``end_id``, and the observations between them; the mask 1 on
    the replies' tokens only."""
    episodes = demonstrated_episodes(tokenizer, environment, examples, limits, prompt_format, prompt_width, end_id,
                                     reply_tokens)
    width, budget = prompt_width, limits.max_tokens
    tokens, attention = (np.concatenate([x[:, :width], widened(x[:, width:], budget)], axis=1)
                         for x in (episodes.tokens, episodes.attention_mask))
    tokens[attention == 0] = pad_id(tokenizer)
    return tokens.astype(np.int32), attention.astype(np.int32), widened(episodes.mask, budget).astype(np.float32)


@partial(jax.jit, static_argnames=("graphdef", "optimizer", "mesh"), donate_argnames=("params", "opt_state"))
def sft_step(graphdef, optimizer, params, opt_state, frozen, tokens, attention_mask, mask, mesh=None):
    """One AdamW step on the mean negative log-likelihood of the masked response tokens, updating
    ``params`` (all of the model's, or with LoRA its adapters, the ``frozen`` base weights beside);
    ``mesh``: the one the batch is split over."""
    def loss_fn(p):
        model = nnx.merge(graphdef, p) if frozen is None else nnx.merge(graphdef, p, frozen)
        logp, _ = response_logprobs(model, tokens, attention_mask, tokens.shape[1] - mask.shape[1], mesh=mesh)
        return -jnp.sum(logp * mask) / jnp.maximum(jnp.sum(mask), 1.0)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
