"""Tests for pgjax.core.logprobs: plain log-probs/entropy and the chunked custom_vjp path."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax.core.logprobs import (
    chunked_logprobs_and_entropy,
    entropy_from_logits,
    token_logprobs,
)

# ---------------------------------------------------------------------------
# Independent float64 NumPy references.
# ---------------------------------------------------------------------------

def np_log_softmax(logits, temperature):
    z = np.asarray(logits, np.float64) / np.float64(temperature)
    m = np.max(z, axis=-1, keepdims=True)
    shifted = z - m
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def np_token_logprobs(logits, tokens, temperature):
    logp = np_log_softmax(logits, temperature)
    return np.take_along_axis(logp, np.asarray(tokens)[..., None], axis=-1)[..., 0]


def np_entropy(logits, temperature):
    logp = np_log_softmax(logits, temperature)
    return -np.sum(np.exp(logp) * logp, axis=-1)


def to_f64(x):
    """Exact float64 copy of a (possibly bfloat16) JAX array."""
    return np.asarray(jnp.asarray(x, jnp.float32), np.float64)


def normal(seed, shape, dtype=jnp.float32):
    # NumPy RNG: no per-op XLA compilation, keeps the file fast.
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def randint(seed, shape, high):
    return jnp.asarray(np.random.default_rng(seed).integers(0, high, shape), jnp.int32)


def make_problem(seed, lead, hidden, vocab, dtype=jnp.float32, scale=1.0):
    h = normal(seed, lead + (hidden,), jnp.float32) * scale
    w = normal(seed + 1000, (hidden, vocab), jnp.float32) / math.sqrt(hidden)
    tok = randint(seed + 2000, lead, vocab)
    return h.astype(dtype), w.astype(dtype), tok


def plain(h, w, tok, temperature=1.0):
    logits = h @ w
    return token_logprobs(logits, tok, temperature), entropy_from_logits(logits, temperature)


# ---------------------------------------------------------------------------
# token_logprobs / entropy_from_logits against NumPy.
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("temperature", [0.7, 1.6])
def test_plain_matches_numpy_reference(dtype, temperature):
    vocab = 97
    logits = (3.0 * normal(0, (3, 5, vocab))).astype(dtype)
    tokens = randint(1, (3, 5), vocab)
    ref_in = to_f64(logits)  # bf16 values, upcast exactly

    logp = token_logprobs(logits, tokens, temperature)
    ent = entropy_from_logits(logits, temperature)

    assert logp.dtype == jnp.float32
    assert ent.dtype == jnp.float32
    assert logp.shape == tokens.shape
    assert ent.shape == tokens.shape
    np.testing.assert_allclose(np.asarray(logp), np_token_logprobs(ref_in, tokens, temperature),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), np_entropy(ref_in, temperature),
                               rtol=1e-5, atol=1e-5)
    # Sanity of the reference itself: entropy within [0, log V], logp <= 0.
    assert np.all(np.asarray(logp) <= 1e-6)
    assert np.all(np.asarray(ent) >= -1e-6) and np.all(np.asarray(ent) <= math.log(vocab) + 1e-5)


def test_temperature_actually_changes_result():
    logits = jnp.array([[0.0, 1.0, 2.0]])
    tok = jnp.array([2])
    a = token_logprobs(logits, tok, 1.0)
    b = token_logprobs(logits, tok, 0.5)
    assert not np.allclose(a, b)
    # temperature 0.5 doubles the logits
    np.testing.assert_allclose(b, token_logprobs(2.0 * logits, tok, 1.0), rtol=1e-6)


def test_hand_computed_example():
    logits = jnp.array([[0.0, math.log(3.0)]], jnp.float32)
    logp1 = token_logprobs(logits, jnp.array([1]))
    logp0 = token_logprobs(logits, jnp.array([0]))
    np.testing.assert_allclose(logp1, [math.log(3 / 4)], rtol=1e-6)
    np.testing.assert_allclose(logp0, [math.log(1 / 4)], rtol=1e-6)
    # H = -(1/4 log 1/4 + 3/4 log 3/4)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    np.testing.assert_allclose(entropy_from_logits(logits), [h], rtol=1e-6)
    # temperature 2: logits [0, log3/2] -> probs 1/(1+sqrt3), sqrt3/(1+sqrt3)
    s3 = math.sqrt(3.0)
    np.testing.assert_allclose(token_logprobs(logits, jnp.array([1]), 2.0),
                               [math.log(s3 / (1 + s3))], rtol=1e-6)
    # uniform distribution over 4 tokens: entropy log 4
    np.testing.assert_allclose(entropy_from_logits(jnp.full((4,), 5.0)), math.log(4.0), rtol=1e-6)


def test_entropy_ignores_masked_logits():
    """-inf logits (a masked vocabulary) have p = 0 and must not turn the entropy into nan."""
    masked = jnp.array([[0.0, math.log(3.0), -jnp.inf, -jnp.inf]])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    np.testing.assert_allclose(entropy_from_logits(masked, 0.5),
                               np_entropy([[0.0, math.log(3.0)]], 0.5), rtol=1e-6)
    np.testing.assert_allclose(entropy_from_logits(masked), [h], rtol=1e-6)
    np.testing.assert_allclose(token_logprobs(masked, jnp.array([1])), [math.log(0.75)], rtol=1e-6)


def test_entropy_grad_with_masked_logits_is_finite():
    finite = jnp.array([0.3, math.log(3.0), -1.0])
    masked = jnp.concatenate([finite, jnp.array([-jnp.inf])])
    g = jax.grad(lambda z: entropy_from_logits(z, 0.7))(masked)
    g_ref = jax.grad(lambda z: entropy_from_logits(z, 0.7))(finite)
    np.testing.assert_allclose(g, np.append(g_ref, 0.0), rtol=1e-6, atol=1e-7)


def test_large_logits_are_stable():
    # Without max-subtraction exp(1000) overflows.
    logits = jnp.array([[1000.0, 1000.0 + math.log(3.0)]], jnp.float32)
    # logp = z_a - lse(z) subtracts two numbers ~1000, so float32 gives an absolute error of
    # about one ulp(1000) = 6e-5; an overflowing implementation would give nan/inf.
    ref = to_f64(logits)
    np.testing.assert_allclose(token_logprobs(logits, jnp.array([1])),
                               np_token_logprobs(ref, [1], 1.0), rtol=0, atol=1.5e-4)
    np.testing.assert_allclose(entropy_from_logits(logits), np_entropy(ref, 1.0), rtol=0, atol=1.5e-4)


# ---------------------------------------------------------------------------
# chunked path == plain path, value and gradient.
# ---------------------------------------------------------------------------

def _loss_fns(tok, temperature_is_arg=True, chunk_size=8):
    lead = tok.shape
    c1 = normal(11, lead)
    c2 = normal(12, lead)

    def loss_plain(h, w, t):
        lp, ent = plain(h, w, tok, t)
        return jnp.sum(c1 * lp) + jnp.sum(c2 * ent)

    def loss_chunk(h, w, t):
        lp, ent = chunked_logprobs_and_entropy(h, w, tok, t, chunk_size)
        return jnp.sum(c1 * lp) + jnp.sum(c2 * ent)

    return loss_plain, loss_chunk


def _assert_tree_close(a, b, tol=1e-5):
    """Close to ``tol`` relative to each leaf's largest magnitude (float32 round-off in sums
    of many terms is relative to the largest terms, not to each element)."""
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.shape == y.shape
        y = np.asarray(y, np.float64)
        scale = max(1.0, float(np.abs(y).max(initial=0.0)))
        np.testing.assert_allclose(np.asarray(x, np.float64), y, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("lead", [(37,), (3, 13)], ids=["flat37", "batched3x13"])
@pytest.mark.parametrize("chunk_size", [1, 8, 64])
def test_chunked_matches_plain_value_and_grad(lead, chunk_size):
    hidden, vocab, temperature = 16, 50, 0.7
    h, w, tok = make_problem(1, lead, hidden, vocab, scale=2.0)

    lp_ref, ent_ref = jax.jit(plain)(h, w, tok, temperature)
    lp, ent = jax.jit(chunked_logprobs_and_entropy, static_argnums=4)(h, w, tok, temperature,
                                                                      chunk_size)
    assert lp.shape == lead and ent.shape == lead
    assert lp.dtype == jnp.float32 and ent.dtype == jnp.float32
    _assert_tree_close((lp, ent), (lp_ref, ent_ref))

    loss_plain, loss_chunk = _loss_fns(tok, chunk_size=chunk_size)
    t = jnp.float32(temperature)
    v_ref, g_ref = jax.jit(jax.value_and_grad(loss_plain, argnums=(0, 1, 2)))(h, w, t)
    v, g = jax.jit(jax.value_and_grad(loss_chunk, argnums=(0, 1, 2)))(h, w, t)
    np.testing.assert_allclose(v, v_ref, rtol=1e-5, atol=1e-5)
    # gradients must be non-trivial for the comparison to mean anything
    for x in g_ref:
        assert np.abs(np.asarray(x)).max() > 1e-3
    for x, y in zip(g, (h, w, t), strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
    _assert_tree_close(g, g_ref)


def test_chunked_gradients_match_finite_differences():
    """Independent of the plain path: central differences on tiny shapes."""
    h, w, tok = make_problem(5, (5,), 3, 7, scale=1.5)
    _, loss_chunk = _loss_fns(tok, chunk_size=2)
    t = jnp.float32(0.8)
    g = jax.jit(jax.grad(loss_chunk, argnums=(0, 1, 2)))(h, w, t)
    eps = 1e-2
    loss = jax.jit(loss_chunk)

    def fd(i):
        args = [np.asarray(a, np.float64) for a in (h, w, t)]
        x = args[i]
        out = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            vals = []
            for sign in (1, -1):
                xs = x.copy()
                xs[idx] += sign * eps
                a = list(args)
                a[i] = xs
                vals.append(float(loss(*(jnp.asarray(v, jnp.float32) for v in a))))
            out[idx] = (vals[0] - vals[1]) / (2 * eps)
        return out

    for i in range(3):
        np.testing.assert_allclose(g[i], fd(i), rtol=2e-2, atol=2e-3)


def test_chunked_only_logp_or_only_entropy_grad():
    """Cotangent of one output zero: each output's gradient must match on its own."""
    h, w, tok = make_problem(2, (21,), 8, 30)
    for which in (0, 1):
        def f_plain(h, w):
            return jnp.sum(plain(h, w, tok, 1.3)[which])  # noqa: B023 - called at once

        def f_chunk(h, w):
            return jnp.sum(chunked_logprobs_and_entropy(h, w, tok, 1.3, 4)[which])  # noqa: B023 - called at once

        _assert_tree_close(jax.jit(jax.grad(f_chunk, argnums=(0, 1)))(h, w),
                           jax.jit(jax.grad(f_plain, argnums=(0, 1)))(h, w))


def test_chunked_bf16_inputs():
    h, w, tok = make_problem(3, (2, 9), 16, 40, dtype=jnp.bfloat16)
    lp, ent = jax.jit(lambda h, w: chunked_logprobs_and_entropy(h, w, tok, 0.9, chunk_size=4))(h, w)
    assert lp.dtype == jnp.float32 and ent.dtype == jnp.float32
    # reference: bf16 values upcast, float32 math (the chunked path accumulates in f32)
    logits = to_f64(h) @ to_f64(w)
    np.testing.assert_allclose(lp, np_token_logprobs(logits, tok, 0.9), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ent, np_entropy(logits, 0.9), rtol=1e-4, atol=1e-4)
    gh, gw = jax.jit(jax.grad(
        lambda h, w: jnp.sum(chunked_logprobs_and_entropy(h, w, tok, 0.9, 4)[0]),
        argnums=(0, 1)))(h, w)
    assert gh.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16


def test_chunked_float64_matches_numpy_and_plain(x64):
    """With jax_enable_x64, float64 inputs stay float64: a much tighter check of the formulas."""
    h, w, tok = make_problem(6, (2, 7), 5, 11, scale=2.0)
    h, w = np.asarray(h, np.float64), np.asarray(w, np.float64)
    h, w = jnp.asarray(h), jnp.asarray(w)
    t = jnp.float64(0.7)
    lp, ent = jax.jit(lambda h, w, t: chunked_logprobs_and_entropy(h, w, tok, t, 3))(h, w, t)
    assert lp.dtype == jnp.float64 and ent.dtype == jnp.float64
    logits = np.asarray(h) @ np.asarray(w)
    np.testing.assert_allclose(lp, np_token_logprobs(logits, tok, 0.7), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ent, np_entropy(logits, 0.7), rtol=1e-12, atol=1e-12)
    loss_plain, loss_chunk = _loss_fns(tok, chunk_size=3)
    g = jax.jit(jax.grad(loss_chunk, argnums=(0, 1, 2)))(h, w, t)
    g_ref = jax.jit(jax.grad(loss_plain, argnums=(0, 1, 2)))(h, w, t)
    for x in g:
        assert x.dtype == jnp.float64
    _assert_tree_close(g, g_ref, tol=1e-10)


# Regression: in logprobs.py as committed in 20b6f44, at_least_f32 made a Python-float
# temperature float64 under x64, so float32 inputs gave float64 outputs and the backward scan's
# float32 carry became float64 (TypeError).
def test_chunked_float32_inputs_under_x64_python_temperature(x64):
    h, w, tok = make_problem(6, (9,), 5, 11)
    assert h.dtype == jnp.float32

    def loss_chunk(h, w):
        lp, ent = chunked_logprobs_and_entropy(h, w, tok, 0.7, 4)
        assert lp.dtype == jnp.float32, lp.dtype  # as the docstring promises (and the plain path)
        return jnp.sum(lp) + jnp.sum(ent)

    g = jax.grad(loss_chunk, argnums=(0, 1))(h, w)
    g_ref = jax.grad(lambda h, w: sum(jnp.sum(x) for x in plain(h, w, tok, 0.7)), argnums=(0, 1))(h, w)
    _assert_tree_close(g, g_ref)


# ---------------------------------------------------------------------------
# jit / vmap.
# ---------------------------------------------------------------------------

def test_chunked_under_jit():
    h, w, tok = make_problem(4, (2, 11), 8, 24)
    f = jax.jit(chunked_logprobs_and_entropy, static_argnames=("chunk_size",))
    _assert_tree_close(f(h, w, tok, 0.7, chunk_size=5), plain(h, w, tok, 0.7))
    loss_plain, loss_chunk = _loss_fns(tok, chunk_size=5)
    t = jnp.float32(0.7)
    g = jax.jit(jax.grad(loss_chunk, argnums=(0, 1, 2)))(h, w, t)
    _assert_tree_close(g, jax.jit(jax.grad(loss_plain, argnums=(0, 1, 2)))(h, w, t))


def test_chunked_vmap_over_problems_matches_loop():
    n_prob, n_tok, hidden, vocab = 3, 10, 8, 20
    hs = normal(7, (n_prob, n_tok, hidden))
    ws = normal(8, (n_prob, hidden, vocab))
    toks = randint(9, (n_prob, n_tok), vocab)
    temps = jnp.array([0.5, 1.0, 1.7])
    coef = normal(10, (2, n_tok))

    def fwd(h, w, tok, t):
        return chunked_logprobs_and_entropy(h, w, tok, t, 4)

    def loss(h, w, tok, t):
        lp, ent = fwd(h, w, tok, t)
        return jnp.sum(coef[0] * lp) + jnp.sum(coef[1] * ent)

    out = jax.jit(jax.vmap(fwd))(hs, ws, toks, temps)
    grads = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 3))))(hs, ws, toks, temps)
    fwd_1 = jax.jit(fwd)
    grad_1 = jax.jit(jax.grad(loss, argnums=(0, 1, 3)))
    plain_1 = jax.jit(plain)
    for i in range(n_prob):
        ref = plain_1(hs[i], ws[i], toks[i], temps[i])
        _assert_tree_close((out[0][i], out[1][i]), ref)
        _assert_tree_close((out[0][i], out[1][i]), fwd_1(hs[i], ws[i], toks[i], temps[i]))
        g_loop = grad_1(hs[i], ws[i], toks[i], temps[i])
        _assert_tree_close(tuple(g[i] for g in grads), g_loop)


def test_chunked_vmap_over_temperature_matches_loop():
    h, w, tok = make_problem(9, (13,), 8, 30)
    temps = jnp.array([0.3, 0.7, 1.0, 2.5])
    coef = normal(11, (2, 13))

    def loss(h, w, t):
        lp, ent = chunked_logprobs_and_entropy(h, w, tok, t, 6)
        return jnp.sum(coef[0] * lp) + jnp.sum(coef[1] * ent)

    lp, ent = jax.jit(jax.vmap(lambda t: chunked_logprobs_and_entropy(h, w, tok, t, 6)))(temps)
    assert lp.shape == (4, 13)
    # gradient w.r.t. (h, W, t) for every temperature; h, W unbatched inputs
    gh, gw, gt = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(None, None, 0)))(
        h, w, temps)
    assert gt.shape == (4,)
    grad_1 = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    plain_1 = jax.jit(lambda t: plain(h, w, tok, t))
    for i in range(len(temps)):
        _assert_tree_close((lp[i], ent[i]), plain_1(temps[i]))
        _assert_tree_close((gh[i], gw[i], gt[i]), grad_1(h, w, temps[i]))
    # different temperatures really give different results
    assert not np.allclose(lp[0], lp[-1])


# ---------------------------------------------------------------------------
# Input validation.
# ---------------------------------------------------------------------------

def _bad(hidden_shape, unembed_shape, tokens, chunk_size=4):
    return chunked_logprobs_and_entropy(jnp.zeros(hidden_shape), jnp.zeros(unembed_shape),
                                        tokens, 1.0, chunk_size)


def test_bad_hidden_unembed_mismatch():
    with pytest.raises(ValueError, match=r"hidden size 8 does not match unembed rows 9"):
        _bad((5, 8), (9, 20), jnp.zeros((5,), jnp.int32))


def test_bad_float_tokens():
    with pytest.raises(AssertionError, match=r"(?i)type|dtype"):
        _bad((5, 8), (8, 20), jnp.zeros((5,), jnp.float32))
    with pytest.raises(AssertionError, match=r"(?i)type|dtype"):
        token_logprobs(jnp.zeros((5, 20)), jnp.zeros((5,), jnp.float32))


def test_bad_ranks():
    # hidden has no feature axis relative to tokens
    with pytest.raises(AssertionError, match=r"(?i)rank"):
        _bad((5,), (8, 20), jnp.zeros((5,), jnp.int32))
    # unembed not a matrix
    with pytest.raises(AssertionError, match=r"(?i)rank"):
        _bad((5, 8), (8, 20, 1), jnp.zeros((5,), jnp.int32))
    # leading shapes disagree
    with pytest.raises(AssertionError, match=r"(?i)shape"):
        _bad((6, 8), (8, 20), jnp.zeros((5,), jnp.int32))
    # plain path: logits rank must be tokens rank + 1
    with pytest.raises(AssertionError, match=r"(?i)rank|shape"):
        token_logprobs(jnp.zeros((2, 5, 20)), jnp.zeros((2, 5, 1), jnp.int32))


@pytest.mark.parametrize("chunk_size", [0, -3])
def test_bad_chunk_size(chunk_size):
    with pytest.raises(ValueError, match=r"chunk_size must be >= 1"):
        _bad((5, 8), (8, 20), jnp.zeros((5,), jnp.int32), chunk_size=chunk_size)


# ---------------------------------------------------------------------------
# Memory: the chunked path must not materialise [N, V] logits.
# ---------------------------------------------------------------------------

def _compiled_temp_bytes(loss, *args):
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*args).compile()
    ma = compiled.memory_analysis()
    if ma is None or getattr(ma, "temp_size_in_bytes", None) is None:
        pytest.skip("compiled.memory_analysis() is unavailable on this backend")
    return ma.temp_size_in_bytes


def test_chunked_path_does_not_materialise_logits():
    n, hidden, vocab, chunk = 2048, 64, 8192, 256
    h = jax.ShapeDtypeStruct((n, hidden), jnp.float32)
    w = jax.ShapeDtypeStruct((hidden, vocab), jnp.float32)
    tok = jnp.zeros((n,), jnp.int32)

    def loss_plain(h, w):
        lp, ent = plain(h, w, tok, 0.7)
        return jnp.sum(lp) + 0.01 * jnp.sum(ent)

    def loss_chunk(h, w):
        lp, ent = chunked_logprobs_and_entropy(h, w, tok, 0.7, chunk)
        return jnp.sum(lp) + 0.01 * jnp.sum(ent)

    plain_bytes = _compiled_temp_bytes(loss_plain, h, w)
    chunk_bytes = _compiled_temp_bytes(loss_chunk, h, w)
    logits_bytes = n * vocab * 4
    # the plain path must hold at least one [N, V] float32 array, else the test is vacuous
    assert plain_bytes >= logits_bytes, (plain_bytes, logits_bytes)
    assert chunk_bytes < plain_bytes / 4, (chunk_bytes, plain_bytes)
    assert chunk_bytes < logits_bytes, (chunk_bytes, logits_bytes)
