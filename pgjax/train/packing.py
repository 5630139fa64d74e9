"""Sequence packing for the update: several (prompt, response) sequences per row of the policy's
forward pass, so the rows' padding is not computed.

A rollout's rows are a left-padded prompt and a right-padded response, as wide as the longest of
each (``rollout.trim_padding``); on SmolLM2's math task 26-53 % of those positions are padding.
Most sequences there are longer than half a row, so two rarely share a row of the same width:
packing moves each micro-batch's sequences into as few rows of ``width_factor`` times the rollout's
width as first-fit decreasing finds (each row's attention is then that much wider), with segment
ids: a token attends only to its own sequence and positions restart
at its first token (``CausalLM.__call__``'s ``segment_ids``), so each sequence's hidden states, and
every log-prob, advantage and loss term, are those of the unpacked row up to float rounding. The
loss still sees the ``[B, N]`` response layout: the hidden states that predict the response tokens
are gathered back into it (``scoring.packed_response_logprobs``).

Packing is planned on the host from the attention mask (0.15 ms for 32 rows); the number of
packed rows is rounded up to a multiple of ``packed_rows_quantum`` so that at most about 8 shapes
per rollout width are compiled.
"""
from __future__ import annotations

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class Packing:
    """One optimizer step's packed micro-batches (leading axis M, the micro-batch).

    tokens, segment_ids [M, P, L]: P packed rows of a multiple L of the rollout's width; segment_ids 0 on padding,
    k > 0 on the k-th sequence of a row. predictors [M, b, N]: for response slot n of the
    micro-batch's row b, the flat index (packed row * L + slot) of the token before it, whose hidden
    state predicts it; 0 past the response's end (those slots are masked out of every loss)."""
    tokens: jax.Array | np.ndarray     # host arrays from ``pack``; traced in the jitted update
    segment_ids: jax.Array | np.ndarray
    predictors: jax.Array | np.ndarray


def first_fit_decreasing(lengths, capacity: int) -> list[list[int]]:
    """Bins (lists of indices into ``lengths``) of total length <= ``capacity`` each: longest first,
    each into the first bin it fits, else a new one (at most 11/9 OPT + 6/9 bins)."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -int(lengths[i])):
        length = int(lengths[i])
        if length > capacity:
            raise ValueError(f"a sequence of {length} tokens does not fit a packed row of {capacity}")
        slot = next((j for j, free in enumerate(room) if free >= length), None)
        if slot is None:
            bins.append([i])
            room.append(capacity - length)
        else:
            bins[slot].append(i)
            room[slot] -= length
    return bins


def packed_rows_quantum(rows: int, width_factor: int = 1, devices: int = 1) -> int:
    """The multiple the packed row count of a micro-batch of ``rows`` rows, packed into rows
    ``width_factor`` times as wide, is rounded up to: an eighth of rows / width_factor (at least 1),
    itself a multiple of the ``devices`` the rows are split over."""
    eighth = max(1, rows // (8 * width_factor))
    return -(-eighth // devices) * devices


def most_packed_rows(rows: int, width_factor: int = 1, devices: int = 1) -> int:
    """The most packed rows ``pack`` gives a micro-batch of ``rows`` rows: any ``width_factor``
    sequences fit a packed row, so first-fit decreasing opens a row only when every open one holds
    that many (ceil(rows / width_factor) rows), rounded up to ``packed_rows_quantum``, at most ``rows``."""
    return _rounded_rows(-(-rows // width_factor), rows, width_factor, devices)


def _rounded_rows(needed: int, rows: int, width_factor: int, devices: int) -> int:
    """``needed`` packed rows rounded up to ``packed_rows_quantum``, at most ``rows``."""
    quantum = packed_rows_quantum(rows, width_factor, devices)
    return min(-(-needed // quantum) * quantum, rows)


def pack(tokens, attention_mask, prompt_width: int, rows, micro_batches: int, width_factor: int = 1,
         devices: int = 1) -> Packing:
    """The ``Packing`` of rollout rows ``rows`` (in order, ``micro_batches`` consecutive equal parts:
    ``Learner._micro_batches``' split) of ``tokens``, ``attention_mask`` [B, W + N] (host arrays; a
    left-padded prompt of width ``prompt_width``, then the response) into rows of ``width_factor``
    (W + N). Every micro-batch gets the same packed row count: the most any needs, rounded up to
    ``packed_rows_quantum`` (never more than its rows, which ``devices`` divides)."""
    tokens, attention_mask, rows = np.asarray(tokens), np.asarray(attention_mask) > 0, np.asarray(rows)
    budget = tokens.shape[1] - prompt_width
    width = width_factor * tokens.shape[1]
    prompt_lengths = attention_mask[:, :prompt_width].sum(1)
    response_lengths = attention_mask[:, prompt_width:].sum(1)
    if not prompt_lengths[rows].all():
        raise ValueError("every packed row needs at least one prompt token (the first response token's predictor)")
    parts = rows.reshape(micro_batches, -1)
    bins = [first_fit_decreasing(prompt_lengths[part] + response_lengths[part], width) for part in parts]
    packed_rows = _rounded_rows(max(map(len, bins)), parts.shape[1], width_factor, devices)
    assert packed_rows <= most_packed_rows(parts.shape[1], width_factor, devices)
    out_tokens = np.zeros((micro_batches, packed_rows, width), tokens.dtype)
    segment_ids = np.zeros((micro_batches, packed_rows, width), np.int32)
    predictors = np.zeros((micro_batches, parts.shape[1], budget), np.int32)
    for m, (part, part_bins) in enumerate(zip(parts, bins, strict=True)):
        for p, members in enumerate(part_bins):
            start = 0
            for segment, i in enumerate(members, 1):
                row, prompt, response = part[i], prompt_lengths[part[i]], response_lengths[part[i]]
                sequence = np.concatenate([tokens[row, prompt_width - prompt:prompt_width],
                                           tokens[row, prompt_width:prompt_width + response]])
                out_tokens[m, p, start:start + len(sequence)] = sequence
                segment_ids[m, p, start:start + len(sequence)] = segment
                predictors[m, i, :response] = p * width + start + prompt - 1 + np.arange(response)
                start += len(sequence)
    return Packing(tokens=out_tokens, segment_ids=segment_ids, predictors=predictors)
