"""The KV-cache sampler against the cache-free forward pass and NumPy references."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from pgjax.checks import ConfigError
from pgjax.core import token_logprobs
from pgjax.models.scoring import response_logprobs
from pgjax.models.transformer import CausalLM, ModelConfig, _matmul
from pgjax.sample import SamplingConfig, generate, sampling_logprobs
from pgjax.sample.sampler import stage_sizes

VOCAB = 48


# Gemma 3: a local layer with a window of 3 slots (shorter than the prompts) before a global one
GEMMA = dict(layer_types=("sliding_attention", "full_attention"), sliding_window=3, rope_local_theta=100.0,
             query_pre_attn_scalar=12)


def sharp_model(family):
    config = ModelConfig(family=family, vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         rope_scaling=(("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
                                       ("original_max_position_embeddings", 8), ("rope_type", "llama3"))
                         if family == "llama" else None, **(GEMMA if family == "gemma3" else {}))
    m = CausalLM(config, nnx.Rngs(1))
    for variable in jax.tree.leaves(nnx.state(m, nnx.Param), is_leaf=lambda x: isinstance(x, nnx.Variable)):
        if variable[...].ndim > 1:   # sharper logits than the 0.02 init, so samples differ visibly
            variable.set_value(variable[...] * 10)
    return m


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gemma3"])
def model(request):
    """Each family, for the tests that compare against the cache-free forward."""
    return sharp_model(request.param)


@pytest.fixture(scope="module")
def qwen():
    return sharp_model("qwen3")


@nnx.jit
def forward(model, tokens, mask):
    return model(tokens, mask)


@nnx.jit
def decode(model, tokens, key_mask, cache, index):
    return model.decode(tokens, key_mask, cache, index)


def left_padded_prompts():
    prompts = np.random.default_rng(0).integers(1, VOCAB, size=(3, 6))
    mask = np.ones((3, 6), np.int64)
    mask[1, :2] = 0
    mask[2, :5] = 0
    return prompts * mask, mask


def first_eos(response, eos_ids):
    hits = np.isin(response, eos_ids)
    return np.where(hits.any(1), hits.argmax(1), -1)


def test_kv_cache_logits_equal_the_full_forward(model):
    prompts, mask = left_padded_prompts()
    continuation = np.random.default_rng(1).integers(0, VOCAB, size=(3, 5))
    tokens = np.concatenate([prompts, continuation], 1)
    full_mask = np.concatenate([mask, np.ones_like(continuation)], 1)
    want = np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(full_mask)))
    key_mask = jnp.asarray(np.concatenate([mask, np.ones((3, 7))], 1))   # two spare slots stay unused
    cache = model.init_cache(3, 13)
    logits, cache = decode(model, jnp.asarray(prompts), key_mask, cache, 0)
    got = [np.asarray(logits)]
    for start, stop in ((6, 7), (7, 9), (9, 10), (10, 11)):       # one and two tokens at a time
        logits, cache = decode(model, jnp.asarray(tokens[:, start:stop]), key_mask, cache, start)
        got.append(np.asarray(logits))
    got = np.concatenate(got, 1)
    np.testing.assert_allclose(got[full_mask > 0], want[full_mask > 0], atol=1e-5)
    last, _ = nnx.jit(lambda m, t, k, c: m.decode(t, k, c, 0, last_only=True))(
        model, jnp.asarray(prompts), key_mask, model.init_cache(3, 13))
    np.testing.assert_allclose(np.asarray(last)[:, 0], want[:, 5], atol=1e-5)   # the prefill's last position


def test_greedy_equals_step_by_step_argmax_of_the_full_forward(model):
    prompts, mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=7, eos_ids=(VOCAB - 1,), greedy=True)
    samples = generate(model, prompts, mask, jax.random.key(0), config)
    tokens = np.concatenate([prompts, np.zeros((3, 7), np.int64)], 1)
    full_mask = np.concatenate([mask, np.zeros((3, 7), np.int64)], 1)   # slots not yet generated are masked
    for t in range(6, 13):
        logits = np.asarray(forward(model, jnp.asarray(tokens), jnp.asarray(full_mask)))[:, t - 1]
        tokens[:, t], full_mask[:, t] = logits.argmax(-1), 1
    ends = first_eos(tokens[:, 6:], [VOCAB - 1])
    for row, end in enumerate(ends):
        n = 7 if end < 0 else end + 1
        np.testing.assert_array_equal(np.asarray(samples.response[row, :n]), tokens[row, 6:6 + n])
    assert len(set(map(tuple, np.asarray(samples.response)))) > 1
    np.testing.assert_array_equal(np.asarray(samples.logprobs), 0.0)


@pytest.mark.slow
def test_temperature_one_logprobs_equal_a_teacher_forced_recompute(model):
    prompts, mask = left_padded_prompts()
    samples = generate(model, prompts, mask, jax.random.key(3), SamplingConfig(max_new_tokens=9, eos_ids=(0,), n=2))
    recomputed, _ = response_logprobs(model, samples.tokens, samples.attention_mask, samples.prompt_length)
    m = np.asarray(samples.response_mask) > 0
    assert m.sum() > 20
    np.testing.assert_allclose(np.asarray(samples.logprobs)[m], np.asarray(recomputed)[m], atol=1e-5)
    np.testing.assert_allclose(np.asarray(samples.policy_logprobs), np.asarray(samples.logprobs), atol=1e-6)


@pytest.mark.slow
def test_truncated_sampling_returns_behaviour_and_tempered_policy_logprobs(qwen):
    prompts, mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=6, eos_ids=(0,), temperature=0.7, top_k=20, top_p=0.8)
    samples = generate(qwen, prompts, mask, jax.random.key(4), config)
    m = np.asarray(samples.response_mask) > 0
    tempered, _ = response_logprobs(qwen, samples.tokens, samples.attention_mask, samples.prompt_length, 0.7)
    np.testing.assert_allclose(np.asarray(samples.policy_logprobs)[m], np.asarray(tempered)[m], atol=1e-5)
    logits = forward(qwen, samples.tokens, samples.attention_mask)[:, samples.prompt_length - 1:-1]
    logq = sampling_logprobs(logits, 0.7, 20, 0.8)
    behaviour = jnp.take_along_axis(logq, samples.response[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(samples.logprobs)[m], np.asarray(behaviour)[m], atol=1e-5)
    assert (np.asarray(samples.logprobs - samples.policy_logprobs)[m] > 1e-3).all()   # q = pi / Z_kept


def test_eos_stops_a_row_and_masks_the_rest(qwen):
    prompts, mask = left_padded_prompts()
    eos = tuple(range(0, VOCAB, 3))
    config = SamplingConfig(max_new_tokens=12, eos_ids=eos, pad_id=1, n=4)
    samples = generate(qwen, prompts, mask, jax.random.key(5), config)
    response = np.asarray(samples.response)
    ends = first_eos(response, eos)
    assert (ends >= 0).any() and (ends > 0).any()
    for row, end in enumerate(ends):
        length = 12 if end < 0 else end + 1
        np.testing.assert_array_equal(np.asarray(samples.response_mask[row]), np.arange(12) < length)
        assert (response[row, length:] == 1).all()
        assert samples.lengths[row] == length and bool(samples.truncated[row]) == (end < 0)
        assert (np.asarray(samples.logprobs[row, length:]) == 0).all()
    np.testing.assert_array_equal(np.asarray(samples.attention_mask[:, samples.prompt_length:]),
                                  np.asarray(samples.response_mask))


def test_the_loop_stops_once_every_row_has_ended(qwen):
    prompts, mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=30, eos_ids=tuple(range(1, VOCAB)), pad_id=0)
    samples = generate(qwen, prompts, mask, jax.random.key(6), config)
    assert not samples.truncated.any()
    assert int(samples.lengths.max()) < 30


def test_compacting_the_decode_batch_gives_the_same_samples(qwen):
    """Halving the decode batch once at most half its rows are unfinished changes the work, not the
    samples: each row draws its own uniforms, whichever slot it sits in."""
    prompts, mask = left_padded_prompts()
    eos = tuple(range(0, VOCAB, 5))
    full, compacted = (generate(qwen, prompts, mask, jax.random.key(9),
                                SamplingConfig(max_new_tokens=24, eos_ids=eos, n=16, compaction=c)) for c in (0, 3))
    assert stage_sizes(48, 3) == (48, 24, 12) and stage_sizes(64, 3) == (64, 32, 16, 8)
    assert stage_sizes(64, 0) == (64,) and stage_sizes(12, 3) == (12,)
    lengths = np.asarray(full.lengths)
    last_stage = min(t for t in range(24) if (lengths > t).sum() <= 12)   # step where <= 12 rows are left
    assert lengths.max() > last_stage + 2                      # ... and the 12-row stage decoded some steps
    for name in ("response", "response_mask", "lengths", "truncated", "tokens", "attention_mask"):
        np.testing.assert_array_equal(np.asarray(getattr(compacted, name)), np.asarray(getattr(full, name)), name)
    for name in ("logprobs", "policy_logprobs"):
        np.testing.assert_allclose(np.asarray(getattr(compacted, name)), np.asarray(getattr(full, name)), atol=1e-5)


def test_the_same_key_gives_the_same_samples_and_rows_follow_the_group_layout(qwen):
    prompts, mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=8, eos_ids=(0,), n=3)
    a = generate(qwen, prompts, mask, jax.random.key(7), config)
    b = generate(qwen, prompts, mask, jax.random.key(7), config)
    c = generate(qwen, prompts, mask, jax.random.key(8), config)
    jax.tree.map(np.testing.assert_array_equal, a, b)
    assert not np.array_equal(np.asarray(a.response), np.asarray(c.response))
    np.testing.assert_array_equal(np.asarray(a.tokens[:, :6]), np.repeat(prompts, 3, 0))
    assert len({tuple(r) for r in np.asarray(a.response[:3])}) > 1   # samples of one prompt differ


def test_first_tokens_follow_the_truncated_distribution(qwen):
    """Empirical frequencies of 4000 first tokens against q (top-k then top-p) computed in NumPy."""
    prompts, mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=1, eos_ids=(0,), n=4000, temperature=1.5, top_k=12, top_p=0.9)
    samples = generate(qwen, prompts[:1], mask[:1], jax.random.key(9), config)
    logits = np.asarray(forward(qwen, jnp.asarray(prompts[:1]), jnp.asarray(mask[:1])), np.float64)[0, -1]
    q = np.exp(reference_sampling_logprobs(logits, 1.5, 12, 0.9))
    freq = np.bincount(np.asarray(samples.response[:, 0]), minlength=VOCAB) / 4000
    assert ((q > 0) | (freq == 0)).all()                       # nothing outside the support
    assert np.abs(freq - q).max() < 4 * np.sqrt(q.max() / 4000)


def reference_sampling_logprobs(logits, temperature, top_k, top_p):
    """float64 NumPy: softmax(z/T), keep the top_k largest, then the smallest top mass >= top_p."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_k:
        p = np.where(p >= np.sort(p)[-top_k], p, 0.0)
        p /= p.sum()
    order = np.argsort(-p, kind="stable")
    mass_before = np.cumsum(p[order]) - p[order]
    keep = np.zeros_like(p, bool)
    keep[order[mass_before < top_p]] = True
    keep |= p >= p[keep].min()                                  # ties at the threshold stay
    p = np.where(keep, p, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(p / p.sum())


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.0, 5, 1.0),
                                                     (1.0, 0, 0.6), (2.0, 7, 0.75), (1.0, 3, 0.999)])
def test_sampling_logprobs_match_a_numpy_reference(temperature, top_k, top_p):
    logits = np.random.default_rng(2).normal(size=(4, 30)) * 2
    logits[1, :4] = logits[1, 4]                               # ties at a threshold
    got = np.asarray(sampling_logprobs(jnp.asarray(logits, jnp.float32), temperature, top_k, top_p))
    for row in range(4):
        want = reference_sampling_logprobs(logits[row], temperature, top_k, top_p)
        np.testing.assert_array_equal(np.isfinite(got[row]), np.isfinite(want))
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[row][finite], want[finite], atol=1e-5)


@pytest.mark.slow
def test_response_logprobs_match_token_logprobs_of_the_full_logits(qwen):
    prompts, mask = left_padded_prompts()
    tokens = np.concatenate([prompts, np.random.default_rng(3).integers(0, VOCAB, (3, 4))], 1)
    full_mask = np.concatenate([mask, np.ones((3, 4), np.int64)], 1)
    got, entropy = response_logprobs(qwen, jnp.asarray(tokens), jnp.asarray(full_mask), 6, temperature=0.9,
                                     chunk_size=5)
    logits = forward(qwen, jnp.asarray(tokens), jnp.asarray(full_mask))
    want = token_logprobs(logits[:, 5:-1], jnp.asarray(tokens[:, 6:]), 0.9)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
    assert entropy.shape == (3, 4) and (np.asarray(entropy) > 0).all()


def test_bfloat16_model_samples_with_a_bfloat16_cache():
    config = ModelConfig(family="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         param_dtype="bfloat16", compute_dtype="bfloat16")
    model = CausalLM(config, nnx.Rngs(0))
    assert model.init_cache(2, 5)[0][0].dtype == jnp.bfloat16
    prompts, mask = left_padded_prompts()
    samples = generate(model, prompts, mask, jax.random.key(0), SamplingConfig(max_new_tokens=4, eos_ids=(0,)))
    assert samples.logprobs.dtype == jnp.float32 and np.isfinite(np.asarray(samples.logprobs)).all()


def _with_matmul_dtype(model, dtype, rounded=False):
    """``model`` under a config with ``matmul_dtype``; ``rounded``: every weight rounded to it first."""
    changed = model.reconfigured(matmul_dtype=dtype)
    if rounded:
        graphdef, state = nnx.split(changed)
        changed = nnx.merge(graphdef, jax.tree.map(lambda w: w.astype(dtype) if jnp.issubdtype(w.dtype, jnp.floating)
                                                   else w, state))
    return changed


def test_the_weight_matmuls_multiply_in_bfloat16_and_sum_in_float32():
    """``_matmul`` with ``matmul_dtype=bfloat16``: both operands rounded to bfloat16 (ml_dtypes, round
    to nearest even), the products summed in float32: the float64 product of the rounded operands to
    float32 round-off, where the float32 product of the unrounded ones is off by bfloat16's 2^-8."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 64)).astype(np.float32), rng.standard_normal((64, 40)).astype(np.float32)
    rounded = lambda a: a.astype(ml_dtypes.bfloat16).astype(np.float64)      # noqa: E731
    want = np.einsum("btd,df->btf", rounded(x), rounded(w))
    got = jax.jit(lambda x, w: _matmul(x, w, "bfloat16"))(x, w)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-5 * np.abs(want).max())
    exact = np.einsum("btd,df->btf", x.astype(np.float64), w.astype(np.float64))
    assert np.abs(np.asarray(got) - exact).max() > 100 * np.abs(np.asarray(got) - want).max()


def test_a_sampler_with_bfloat16_weights_samples_as_a_model_that_holds_them(model):
    """``matmul_dtype=bfloat16`` on float32 weights: the sampler rounds every weight once before decoding
    (``prepare_decoding``), so its tokens and log-probs are bitwise those of the same model handed
    weights already in bfloat16, and its log-probs are that model's cache-free forward pass to float32
    round-off; they differ from the float32 model's by more than round-off."""
    prompts, mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=5, eos_ids=(), n=2)
    cast_once = generate(_with_matmul_dtype(model, "bfloat16"), prompts, mask, jax.random.key(3), config)
    held = _with_matmul_dtype(model, "bfloat16", rounded=True)
    holding = generate(held, prompts, mask, jax.random.key(3), config)
    np.testing.assert_array_equal(np.asarray(cast_once.tokens), np.asarray(holding.tokens))
    np.testing.assert_array_equal(np.asarray(cast_once.logprobs), np.asarray(holding.logprobs))
    logits = forward(held, cast_once.tokens, cast_once.attention_mask)
    want = token_logprobs(logits[:, 5:-1], cast_once.tokens[:, 6:])
    np.testing.assert_allclose(np.asarray(cast_once.logprobs), np.asarray(want), atol=2e-5)
    full = token_logprobs(forward(model, cast_once.tokens, cast_once.attention_mask)[:, 5:-1], cast_once.tokens[:, 6:])
    assert np.abs(np.asarray(full) - np.asarray(want)).max() > 1e-4


def test_a_bad_matmul_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="matmul_dtype='float16' is invalid: one of"):
        ModelConfig(family="qwen3", vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, matmul_dtype="float16")


def test_no_stop_token_runs_every_row_to_the_budget(model):
    """``eos_ids=()``: no token ends a row, even one a stop id elsewhere (0 here), so every response
    is exactly ``max_new_tokens`` long (what a forced-length benchmark compares)."""
    prompts, mask = left_padded_prompts()
    samples = generate(model, prompts, mask, jax.random.key(0), SamplingConfig(max_new_tokens=6, eos_ids=(), n=2))
    assert np.asarray(samples.lengths).tolist() == [6] * 2 * len(prompts)
    assert np.asarray(samples.truncated).all()          # no row ended: every one reached the budget


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_new_tokens=0), "max_new_tokens=0 is invalid: an integer >= 1"),
    (dict(n=0), "n=0 is invalid: an integer >= 1 \\(samples per prompt\\)"),
    (dict(temperature=0.0), "temperature=0.0 is invalid: a finite number > 0"),
    (dict(temperature=float("inf")), "temperature=inf is invalid: a finite number > 0"),
    (dict(top_k=-1), "top_k=-1 is invalid: an integer >= 0"),
    (dict(top_p=0.0), "top_p=0.0 is invalid: in \\(0, 1\\]"),
    (dict(top_p=1.5), "top_p=1.5 is invalid: in \\(0, 1\\]"),
])
def test_bad_sampling_configs_raise(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SamplingConfig(**{"max_new_tokens": 4, "eos_ids": (0,), **kwargs})


def test_bad_prompts_raise_clear_errors(qwen):
    prompts, mask = left_padded_prompts()
    config = SamplingConfig(max_new_tokens=2, eos_ids=(0,))
    key = jax.random.key(0)
    right_padded = mask[:, ::-1]
    empty = mask.copy()
    empty[0] = 0
    cases = [((prompts, mask[:, :5], config), ValueError, "must both be \\[B, P\\]"),
             ((prompts.astype(np.float32), mask, config), TypeError, "integer token ids"),
             ((prompts, right_padded, config), ValueError, "left-padded and non-empty"),
             ((prompts, empty, config), ValueError, "left-padded and non-empty"),
             ((prompts + VOCAB, mask, config), ValueError, "must lie in \\[0, 48\\)"),
             ((prompts, mask, SamplingConfig(max_new_tokens=2, eos_ids=(VOCAB,))), ValueError, "must lie in")]
    for (p, m, c), error, match in cases:
        with pytest.raises(error, match=match):
            generate(qwen, p, m, key, c)
