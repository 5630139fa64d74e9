"""Sequence packing in the update: the plan (first-fit decreasing, bounded shapes), segment-aware
positions and attention (each packed sequence's hidden states are those of the sequence alone, with
Gemma 3's sliding window too), and a packed update equal to the unpacked one."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import tiny_learner

from pgjax import core
from pgjax.config import UpdateConfig
from pgjax.models.lora import LoRAConfig
from pgjax.models.transformer import CausalLM, ModelConfig, positions_in_segments
from pgjax.rollout.batch import Rollout
from pgjax.train.learner import Learner
from pgjax.train.packing import first_fit_decreasing, most_packed_rows, pack, packed_rows_quantum


def test_first_fit_decreasing_fills_bins_within_capacity_and_places_every_sequence_once():
    lengths = [7, 2, 5, 3, 3, 9, 1]                 # 30 tokens in bins of 10: 3 bins suffice
    bins = first_fit_decreasing(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(7))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert [[lengths[i] for i in b] for b in bins] == [[9, 1], [7, 3], [5, 3, 2]]
    with pytest.raises(ValueError, match="a sequence of 11 tokens does not fit a packed row of 10"):
        first_fit_decreasing([11], 10)


def test_the_packed_row_count_is_a_multiple_of_an_eighth_and_of_the_devices_and_bounded():
    assert [packed_rows_quantum(rows) for rows in (4, 16, 64)] == [1, 2, 8]
    assert packed_rows_quantum(16, devices=4) == 4 and packed_rows_quantum(8, devices=4) == 4
    assert packed_rows_quantum(64, width_factor=2) == 4
    assert [most_packed_rows(16, f) for f in (1, 2, 3, 4)] == [16, 8, 6, 4]
    assert most_packed_rows(16, 3, devices=4) == 8 and most_packed_rows(6, 1, devices=4) == 6
    rng = np.random.default_rng(3)          # the bound holds for any lengths up to a rollout row's
    for factor in (1, 2, 3):
        for _ in range(50):
            lengths = rng.integers(1, 11, 16)
            assert len(first_fit_decreasing(lengths, 10 * factor)) <= -(-16 // factor)


def test_positions_restart_at_each_sequence_and_are_zero_on_padding():
    segments = np.array([[1, 1, 1, 2, 2, 0, 0], [0, 0, 1, 1, 2, 3, 3], [1, 2, 2, 2, 2, 2, 0]])
    want = np.zeros_like(segments)
    for r, row in enumerate(segments):             # reference: count within each run of a segment id
        for t in range(1, len(row)):
            if row[t] > 0 and row[t] == row[t - 1]:
                want[r, t] = want[r, t - 1] + 1
    np.testing.assert_array_equal(positions_in_segments(jnp.asarray(segments)), want)
    # one segment per row after left padding: the unpacked positions
    np.testing.assert_array_equal(positions_in_segments(jnp.asarray([[0, 0, 1, 1, 1]])), [[0, 0, 0, 1, 2]])


def ragged_rows(rng, rows=6, prompt_width=5, budget=6, vocab=60):
    """Left-padded prompts of 1..prompt_width and right-padded responses of 1..budget tokens."""
    tokens = rng.integers(2, vocab, (rows, prompt_width + budget))
    mask = np.zeros_like(tokens)
    for r in range(rows):
        mask[r, prompt_width - rng.integers(1, prompt_width + 1):prompt_width + rng.integers(1, budget + 1)] = 1
    return tokens * mask, mask


def test_the_predictors_point_at_the_token_before_each_response_token():
    tokens, mask = ragged_rows(np.random.default_rng(0), rows=8)
    rows = np.array([3, 1, 0, 2, 7, 6, 5, 4])
    packing = pack(tokens, mask, 5, rows, micro_batches=2)
    assert packing.tokens.shape[:2] == packing.segment_ids.shape[:2] and packing.tokens.shape[0] == 2
    assert packing.tokens.shape[1] < 4 and packing.predictors.shape == (2, 4, 6)
    for m, part in enumerate(rows.reshape(2, 4)):
        flat = packing.tokens[m].reshape(-1)
        assert (packing.segment_ids[m] > 0).sum() == mask[part].sum()       # every real token, once
        for b, row in enumerate(part):
            n = mask[row, 5:].sum()
            np.testing.assert_array_equal(flat[packing.predictors[m, b, :n] + 1], tokens[row, 5:5 + n])
            prompt = mask[row, :5].sum()
            assert flat[packing.predictors[m, b, 0] - prompt + 1] == tokens[row, 5 - prompt]
    with pytest.raises(ValueError, match="at least one prompt token"):
        pack(tokens, np.pad(mask[:, 5:], ((0, 0), (5, 0))), 5, rows, micro_batches=2)


GEMMA = dict(family="gemma3", head_dim=8, query_pre_attn_scalar=12, sliding_window=3, rope_local_theta=1000.0,
             layer_types=("sliding_attention", "full_attention"))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_each_packed_sequence_has_the_hidden_states_of_the_sequence_alone(family):
    """Five sequences in two rows twice the rollout's width, longer than Gemma's 3-slot window:
    every real position's hidden state equals the left-padded unpacked forward of its own row."""
    extra = GEMMA if family == "gemma3" else dict(family=family, head_dim=8)
    config = ModelConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, **extra)
    model = CausalLM(config, nnx.Rngs(0))
    tokens, mask = ragged_rows(np.random.default_rng(1), rows=5)
    packing = pack(tokens, mask, 5, np.arange(5), micro_batches=1, width_factor=2)
    packed = np.asarray(model(jnp.asarray(packing.tokens[0]), segment_ids=jnp.asarray(packing.segment_ids[0]),
                              return_hidden=True)).reshape(-1, 16)
    unpacked = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask), return_hidden=True))
    assert packing.tokens.shape[1:] == (2, 22)
    for row in range(5):
        n = mask[row, 5:].sum()
        # the predictor positions (the prompt's last token, then all but the last response token)
        np.testing.assert_allclose(packed[packing.predictors[0, row, :n]], unpacked[row, 4:4 + n], atol=2e-5)
    with pytest.raises(ValueError, match="not both"):
        model(jnp.asarray(tokens), jnp.asarray(mask), segment_ids=jnp.asarray(mask))


def ragged_rollout(rng, prompts=4, group_size=4):
    tokens, mask = ragged_rows(rng, rows=prompts * group_size, vocab=12)
    rewards = rng.integers(0, 2, prompts * group_size).astype(np.float32)
    return Rollout(tokens=jnp.asarray(tokens), attention_mask=jnp.asarray(mask),
                   batch=core.Batch(mask=jnp.asarray(mask[:, 5:], jnp.float32), rewards=jnp.asarray(rewards),
                                    logp=None, group_size=group_size))


@pytest.mark.parametrize("algorithm,update", [("dr_grpo", dict(micro_batches=2)),
                                              ("ppo", dict(minibatches=2, micro_batches=2))])
def test_a_packed_update_equals_the_unpacked_one(algorithm, update):
    """Plain SGD with lr 1 (the parameter change is the gradient): the same parameters, critic and
    loss metrics with and without packing, over minibatches (each packed on its own) and
    micro-batches. (Rounding differences grow with each lr-1 step: 6e-8 after one, 1e-6 after two,
    4e-5 after four, so the test stops at two.)"""
    results = []
    for packed in (False, True):
        config = UpdateConfig(pack_width=2 if packed else 0, **update)
        policy, algo, learner = tiny_learner(algorithm, config, optimizer=optax.sgd(1.0))
        state = learner.init_state(policy, jax.random.PRNGKey(0))
        rollout = learner.prepare(state, ragged_rollout(np.random.default_rng(2)), algo.hparams)
        state, metrics = learner.update(state, rollout, algo.hparams)
        results.append(jax.device_get((state.params, state.critic_params, metrics)))
    (params, critic, metrics), (packed_params, packed_critic, packed_metrics) = results
    close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=1e-5)  # noqa: E731
    jax.tree.map(close, packed_params, params)
    jax.tree.map(close, packed_critic, critic)
    assert packed_metrics.keys() == metrics.keys()
    for key in metrics:
        np.testing.assert_allclose(packed_metrics[key], metrics[key], atol=1e-5, rtol=1e-5, err_msg=key)
    start = jax.device_get(nnx.state(policy))
    assert max(float(np.abs(a - b).max())
               for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(start), strict=True)) > 1e-3


def test_a_packed_lora_update_equals_the_unpacked_one():
    """LoRA (no dropout: with dropout the masks are drawn over the packed positions, so the two
    updates agree in distribution only): the same adapter update with and without packing."""
    config = ModelConfig(family="qwen2", vocab_size=12, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, lora=LoRAConfig(rank=2, alpha=4.0))
    results = []
    for width in (0, 2):
        policy = CausalLM(config, nnx.Rngs(0))
        algo = core.preset("dr_grpo")
        learner = Learner(policy, algo, 4, UpdateConfig(micro_batches=2, pack_width=width), optax.sgd(1.0),
                          optax.sgd(1.0), use_reference=False)
        state = learner.init_state(policy, jax.random.PRNGKey(0))
        rollout = learner.prepare(state, ragged_rollout(np.random.default_rng(4)), algo.hparams)
        results.append(jax.device_get(learner.update(state, rollout, algo.hparams)[0].params))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6, rtol=1e-5), results[1], results[0])
    start = jax.device_get(nnx.state(CausalLM(config, nnx.Rngs(0))))
    assert max(float(np.abs(a - b).max())
               for a, b in zip(jax.tree.leaves(results[0]), jax.tree.leaves(start), strict=True)) > 1e-4
