"""Teacher-forced log-probs of sampled responses under a ``CausalLM`` (logp, old_logp, ref_logp)."""
from __future__ import annotations

import jax

from pgjax.core import chunked_logprobs_and_entropy
from pgjax.models.transformer import CausalLM


def response_logprobs(model: CausalLM, tokens, attention_mask, prompt_length: int, temperature=1.0,
                      chunk_size: int = 1024, dropout_key=None, mesh=None):
    """log pi(a_t | s_t) and H(pi(.|s_t)) of each response token, [B, N] each, N = T - prompt_length.

    ``tokens``, ``attention_mask`` [B, T] are a left-padded prompt of width
    ``prompt_length`` followed by the response (``Samples.tokens`` and
    ``Samples.attention_mask``). Token t is predicted from the hidden state at t - 1
    (logits / temperature); the [B, N, V] logits are never built
    (``chunked_logprobs_and_entropy``). Values at masked response slots are
    meaningless: multiply by the response mask. ``dropout_key``: the LoRA adapters' dropout (training);
    ``mesh``: the device mesh the batch is split over (``CausalLM.__call__``).
    """
    hidden = model(tokens, attention_mask, return_hidden=True, dropout_key=dropout_key, mesh=mesh)
    predictors = jax.lax.slice_in_dim(hidden, prompt_length - 1, tokens.shape[1] - 1, axis=1)
    return chunked_logprobs_and_entropy(predictors, model.unembedding(), tokens[:, prompt_length:],
                                        temperature, chunk_size)


def packed_response_logprobs(model: CausalLM, packing, response_tokens, temperature=1.0, chunk_size: int = 1024,
                             dropout_key=None, mesh=None):
    """``response_logprobs`` of rows whose sequences are packed several to a row (``packing``: one
    micro-batch of a ``pgjax.train.packing.Packing``, tokens [P, L]); ``response_tokens`` [B, N] the
    rows' response slots. The hidden state of each response token's predictor is gathered from the
    packed forward into the [B, N] layout, so the result is the unpacked one up to float rounding."""
    hidden = model(packing.tokens, segment_ids=packing.segment_ids, return_hidden=True, dropout_key=dropout_key,
                   mesh=mesh)
    predictors = hidden.reshape(-1, hidden.shape[-1])[packing.predictors]
    return chunked_logprobs_and_entropy(predictors, model.unembedding(), response_tokens, temperature, chunk_size)
