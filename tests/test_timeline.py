"""The multi-turn sampler's timeline (pgjax.sample.sampler: start, decode_turn, append): turns decoded
against a cache carried across them, with blocks appended between turns and gaps where rows wait,
give each row what the cache-free forward of its gap-free sequence gives (greedy tokens and
log-probs), for every family including Gemma 3's sliding window; one turn of a timeline is
``generate``; the cursor and capacity checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_sampler import VOCAB, forward, left_padded_prompts, sharp_model

from pgjax.core import token_logprobs
from pgjax.sample import SamplingConfig, generate
from pgjax.sample.sampler import append, decode_turn, start

EOS = (3,)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gemma3"])
def model(request):
    return sharp_model(request.param)


def blocks(rng, rows: int, width: int, lengths):
    """Left-padded random blocks [rows, width] of the given lengths (0: nothing appended)."""
    tokens = rng.integers(4, VOCAB, size=(rows, width))
    mask = (np.arange(width)[None, :] >= width - np.asarray(lengths)[:, None]).astype(np.int32)
    return np.where(mask > 0, tokens, 0), mask


def real_sequences(timeline, tokens_by_slot):
    """Each row's real tokens in slot order (the gap-free sequence) from a slot-indexed token array."""
    key_mask = np.asarray(timeline.key_mask)
    return [tokens_by_slot[r][key_mask[r] > 0] for r in range(key_mask.shape[0])]


def run_turns(model, config, key, limits_per_turn, block_lengths, n=2):
    """Three turns with two appended blocks; returns the timeline, each slot's token, and for every
    sampled token (row, slot, token, policy log-prob)."""
    prompts, prompt_mask = left_padded_prompts()
    rows = prompts.shape[0] * n
    capacity = prompts.shape[1] + len(limits_per_turn) * config.max_new_tokens + sum(w for w, _ in block_lengths)
    timeline = start(model, prompts, prompt_mask, n, capacity)
    slots = np.zeros((rows, capacity), np.int64)
    slots[:, :prompts.shape[1]] = np.repeat(prompts, n, axis=0)
    sampled, rng = [], np.random.default_rng(1)
    for turn, limits in enumerate(limits_per_turn):
        cursor = int(timeline.cursor)
        timeline, out = decode_turn(model, timeline, jax.random.fold_in(key, turn), limits, config)
        response, mask = np.asarray(out.response), np.asarray(out.response_mask)
        steps = int(timeline.cursor) - cursor
        assert steps == max(int(np.asarray(out.lengths).max()), 0) and (np.asarray(out.lengths) <= limits).all()
        slots[:, cursor:cursor + steps] = response[:, :steps]
        for r, t in zip(*np.nonzero(mask), strict=True):
            sampled.append((r, cursor + t, response[r, t], float(out.policy_logprobs[r, t])))
        if turn < len(block_lengths):
            width, lengths = block_lengths[turn]
            tokens, block_mask = blocks(rng, rows, width, lengths)
            cursor = int(timeline.cursor)
            timeline = append(model, timeline, tokens, block_mask)
            slots[:, cursor:cursor + width] = tokens
            assert int(timeline.cursor) == cursor + width
    return timeline, slots, sampled


def check_against_the_forward(model, timeline, slots, sampled, temperature):
    """Every sampled token's log-prob equals the cache-free forward's on the row's gap-free sequence."""
    key_mask = np.asarray(timeline.key_mask)
    sequences = real_sequences(timeline, slots)
    width = max(len(s) for s in sequences)
    tokens = np.zeros((len(sequences), width), np.int32)
    mask = np.zeros_like(tokens)
    for r, sequence in enumerate(sequences):                       # left-padded, gap-free
        tokens[r, width - len(sequence):] = sequence
        mask[r, width - len(sequence):] = 1
    logits = np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(mask)))
    checked = 0
    for r, slot, token, logp in sampled:
        index = width - len(sequences[r]) + int(key_mask[r, :slot].sum())     # the token's place in the row
        assert tokens[r, index] == token
        expected = float(token_logprobs(jnp.asarray(logits[r, index - 1][None]), jnp.asarray([token]), temperature)[0])
        assert logp == pytest.approx(expected, abs=2e-5)
        checked += 1
    return checked


def test_turns_with_appended_blocks_and_gaps_equal_the_forward_of_the_gap_free_sequence(model):
    """Rows sit turns out (limit 0), stop at EOS or their limit at different steps, and get blocks
    of different lengths (none for some): all of it leaves gaps in the timeline, and each sampled
    token's log-prob is still the forward's on the row's real tokens."""
    config = SamplingConfig(max_new_tokens=5, temperature=1.0, eos_ids=EOS)
    limits = [np.array([5, 3, 5, 0, 2, 5]), np.array([4, 5, 0, 5, 5, 1]), np.array([5, 5, 5, 5, 5, 5])]
    block_lengths = [(4, [4, 2, 0, 3, 1, 4]), (3, [1, 3, 3, 0, 2, 3])]
    timeline, slots, sampled = run_turns(model, config, jax.random.key(0), limits, block_lengths)
    assert check_against_the_forward(model, timeline, slots, sampled, 1.0) > 20
    assert np.asarray(timeline.key_mask)[3, 6 + 0:6 + 5].sum() == 0          # row 3 sat turn 0 out: a gap


def test_greedy_turns_take_the_forwards_argmax(model):
    config = SamplingConfig(max_new_tokens=4, greedy=True, eos_ids=())
    limits = [np.full(6, 4), np.array([4, 2, 4, 1, 4, 3])]
    timeline, slots, sampled = run_turns(model, config, jax.random.key(0), limits, [(3, [3, 1, 0, 2, 3, 3])])
    key_mask = np.asarray(timeline.key_mask)
    sequences = real_sequences(timeline, slots)
    for r, slot, token, _ in sampled:
        prefix = sequences[r][:int(key_mask[r, :slot].sum())]
        logits = np.asarray(forward(model, jnp.asarray(prefix[None]), jnp.ones((1, len(prefix)), jnp.int32)))
        assert token == int(np.argmax(logits[0, -1]))


def test_one_turn_of_a_timeline_is_generate(model):
    prompts, prompt_mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=6, temperature=0.8, top_k=10, eos_ids=EOS, n=2)
    key = jax.random.key(3)
    samples = generate(model, prompts, prompt_mask, key, config)
    timeline = start(model, prompts, prompt_mask, 2, prompts.shape[1] + 6)
    _, turn = decode_turn(model, timeline, key, np.full(6, 6), config)
    for field in ("response", "response_mask", "logprobs", "policy_logprobs", "lengths"):
        np.testing.assert_array_equal(np.asarray(getattr(turn, field)), np.asarray(getattr(samples, field)), field)
    np.testing.assert_array_equal(np.asarray(turn.ended), ~np.asarray(samples.truncated))


def test_the_timeline_refuses_what_does_not_fit():
    model = sharp_model("qwen3")
    prompts, prompt_mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=4, eos_ids=EOS)
    with pytest.raises(ValueError, match="capacity \\(6\\) must exceed the prompt width"):
        start(model, prompts, prompt_mask, 1, 6)
    timeline = start(model, prompts, prompt_mask, 1, 9)
    with pytest.raises(ValueError, match="3 free slots, fewer than max_new_tokens = 4"):
        decode_turn(model, timeline, jax.random.key(0), np.full(3, 4), config)
    with pytest.raises(ValueError, match="fewer than the 4 appended"):
        append(model, timeline, np.ones((3, 4), np.int32), np.ones((3, 4), np.int32))
    with pytest.raises(ValueError, match="left-padded"):
        append(model, timeline, np.ones((3, 2), np.int32), np.array([[1, 0]] * 3))
    with pytest.raises(ValueError, match="must both be \\[R=3, O\\]"):
        append(model, timeline, np.ones((2, 2), np.int32), np.ones((2, 2), np.int32))
