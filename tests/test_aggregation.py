"""Tests of pgjax.core.aggregation against a float64 NumPy reference written from the
module docstring's formulas, and of micro-batch invariance with a global Normalizer."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax.core.aggregation import AGGREGATIONS, Normalizer, aggregate, length_weights, loss_normalizer

V = 5


@pytest.fixture
def f64():
    with jax.enable_x64(True):
        yield


def np_aggregate(x, m, mode, group_size=1, divide_by_length=0.0, max_length=None):
    """The docstring's table, one row at a time, in float64:
    w_b = s / |o_b| + (1 - s) (an empty row contributes 0), P = B / K, L = T by default."""
    x, m = np.asarray(x, np.float64), np.asarray(m, np.float64)
    b, t = x.shape
    s = float(divide_by_length)
    total = 0.0
    for i in range(b):
        length = m[i].sum()
        if length == 0:
            continue
        w = s / length + (1.0 - s)
        total += w * sum(m[i, j] * x[i, j] for j in range(t))
    if mode == "prompt_mean":
        return total / (b / group_size)
    if mode == "token_mean":
        return total / m.sum() if m.sum() > 0 else 0.0
    if mode == "seq_mean":
        return total / b
    if mode == "seq_mean_const_len":
        return total / (b * (t if max_length is None else max_length))
    raise AssertionError(mode)


def make_mask(lengths, t):
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float64)


def random_case(seed, b=8, t=6, empty_rows=(1,)):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, t + 1, size=b)
    lengths[list(empty_rows)] = 0
    lengths[0] = t
    x = rng.normal(size=(b, t))
    return x, make_mask(lengths, t)


# ----------------------------------------------------------------------------------------
# Values against the reference.


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("divide_by_length", [0.0, 1.0])
@pytest.mark.parametrize("group_size", [1, 2, 4])
def test_aggregate_matches_reference(f64, mode, divide_by_length, group_size):
    x, m = random_case(0)
    norm = loss_normalizer(jnp.asarray(m), group_size)
    got = aggregate(jnp.asarray(x), jnp.asarray(m), mode, norm, divide_by_length)
    np.testing.assert_allclose(got, np_aggregate(x, m, mode, group_size, divide_by_length), rtol=1e-12)


def test_aggregate_hand_computed():
    # rows: [1, 2 | pad], [3 | pad, pad], [] (empty), K = 1, T = 3
    x = jnp.array([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0], [100.0, 100.0, 100.0]])
    m = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    norm = loss_normalizer(m, 1)
    # token sums 3, 3, 0 (total 6); with 1/|o|: 1.5 + 3 = 4.5. B = 3, P = 3 (K = 1), sum m = 3, L = T = 3.
    expected = {  # (s = 0, s = 1)
        "prompt_mean": (6.0 / 3, 4.5 / 3),
        "token_mean": (6.0 / 3, 4.5 / 3),
        "seq_mean": (6.0 / 3, 4.5 / 3),
        "seq_mean_const_len": (6.0 / 9, 4.5 / 9),
    }
    for mode, (e0, e1) in expected.items():
        np.testing.assert_allclose(aggregate(x, m, mode, norm, 0.0), e0, rtol=1e-6, err_msg=mode)
        np.testing.assert_allclose(aggregate(x, m, mode, norm, 1.0), e1, rtol=1e-6, err_msg=mode)
    # prompt_mean with K = 3: one prompt, P = 1 -> the total itself; 3 masked ones / P = 3 -> 1
    np.testing.assert_allclose(aggregate(x, m, "prompt_mean", loss_normalizer(m, 3)), 6.0, rtol=1e-6)
    np.testing.assert_allclose(aggregate(x * 0 + 1, m, "prompt_mean", loss_normalizer(m, 1)), 1.0, rtol=1e-6)
    # constant length L = 4 instead of T = 3
    np.testing.assert_allclose(aggregate(x, m, "seq_mean_const_len", loss_normalizer(m, 1, 4)), 6.0 / 12,
                               rtol=1e-6)


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("divide_by_length", [0.0, 1.0])
def test_prompt_mean_divides_by_prompts_not_sequences(f64, mode, divide_by_length):
    x, m = random_case(1)
    b = x.shape[0]
    jx, jm = jnp.asarray(x), jnp.asarray(m)
    v1 = aggregate(jx, jm, mode, loss_normalizer(jm, 1), divide_by_length)
    v4 = aggregate(jx, jm, mode, loss_normalizer(jm, 4), divide_by_length)
    if mode == "prompt_mean":   # P = B / K: K = 4 divides by 2 instead of 8
        np.testing.assert_allclose(v4, 4 * v1, rtol=1e-12)
        np.testing.assert_allclose(v4, np_aggregate(x, m, mode, 4, divide_by_length), rtol=1e-12)
        assert not np.isclose(v1, v4)
    else:                     # K does not enter the other modes
        np.testing.assert_allclose(v4, v1, rtol=1e-12)
    assert b % 4 == 0


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("divide_by_length", [0.0, 1.0])
def test_zero_length_rows_contribute_nothing_and_no_nan(mode, divide_by_length):
    x, m = random_case(2, empty_rows=(1, 5))
    jm = jnp.asarray(m, jnp.float32)
    norm = loss_normalizer(jm, 2)
    f = lambda xx: aggregate(xx, jm, mode, norm, divide_by_length)  # noqa: E731
    x2 = x.copy()
    x2[1], x2[5] = 1e3, -7.0                         # change only the empty rows
    v, v2 = f(jnp.asarray(x, jnp.float32)), f(jnp.asarray(x2, jnp.float32))
    np.testing.assert_allclose(v, v2, rtol=1e-6)
    np.testing.assert_allclose(v, np_aggregate(x, m, mode, 2, divide_by_length), rtol=1e-5)
    g = jax.grad(f)(jnp.asarray(x, jnp.float32))
    assert np.all(np.isfinite(g)) and np.all(np.asarray(g)[m == 0] == 0)
    # an all-empty batch: every mode gives 0, no NaN, finite gradient
    empty = jnp.zeros_like(jm)
    zero_norm = loss_normalizer(empty, 2)
    f0 = lambda xx: aggregate(xx, empty, mode, zero_norm, divide_by_length)  # noqa: E731
    assert float(f0(jnp.asarray(x, jnp.float32))) == 0.0
    assert np.all(np.asarray(jax.grad(f0)(jnp.asarray(x, jnp.float32))) == 0)


@pytest.mark.parametrize("divide_by_length", [0.0, 0.5, 1.0])
def test_length_weights(f64, divide_by_length):
    m = make_mask([0, 1, 4, 6], 6)
    lengths = m.sum(1)
    expected = divide_by_length / np.maximum(lengths, 1) + (1 - divide_by_length)   # empty row: w = 1, sum 0
    np.testing.assert_allclose(length_weights(jnp.asarray(m), divide_by_length), expected, rtol=1e-12)


# ----------------------------------------------------------------------------------------
# Micro-batch invariance with the global Normalizer, in value and gradient.


def _per_token_fn(seed, b, t):
    """per_token = A * log_softmax(theta)[taken] + 0.1 * tanh(theta[..., 0]): a function of theta."""
    rng = np.random.default_rng(seed)
    theta = jnp.asarray(rng.normal(size=(b, t, V)), jnp.float32)
    taken = jnp.asarray(rng.integers(0, V, size=(b, t)))
    adv = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)

    def per_token(th):
        lp = jnp.take_along_axis(jax.nn.log_softmax(th, -1), taken[..., None], -1)[..., 0]
        return adv * lp + 0.1 * jnp.tanh(th[..., 0])

    return theta, per_token


@pytest.mark.parametrize("mode", AGGREGATIONS)
@pytest.mark.parametrize("divide_by_length", [0.0, 1.0])
def test_micro_batch_sum_equals_full_batch(mode, divide_by_length):
    b, t, k = 8, 6, 2
    _, m = random_case(3, b=b, t=t, empty_rows=(3,))
    m = jnp.asarray(m, jnp.float32)
    theta, per_token = _per_token_fn(4, b, t)
    norm = loss_normalizer(m, k)

    def full(th):
        return aggregate(per_token(th), m, mode, norm, divide_by_length)

    def micro(th, n):
        size = b // n
        assert size % k == 0   # split on group boundaries
        x = per_token(th)
        return sum(aggregate(x[i * size:(i + 1) * size], m[i * size:(i + 1) * size], mode, norm,
                             divide_by_length) for i in range(n))

    v_full, g_full = jax.value_and_grad(full)(theta)
    assert np.abs(np.asarray(g_full)).max() > 1e-3
    for n in (1, 2, 4):
        v, g = jax.value_and_grad(lambda th, n=n: micro(th, n))(theta)
        np.testing.assert_allclose(v, v_full, rtol=1e-5, atol=1e-5, err_msg=f"{n} micro-batches")
        np.testing.assert_allclose(g, g_full, rtol=1e-5, atol=1e-5, err_msg=f"{n} micro-batches")

    # micro-batches as separate per-slice gradient computations (the accumulation loop), summed
    size = b // 4
    g_acc = np.zeros(theta.shape, np.float32)
    for i in range(4):
        sl = slice(i * size, (i + 1) * size)
        g_i = jax.grad(lambda th_i, sl=sl: aggregate(per_token_slice(th_i, sl), m[sl], mode, norm, divide_by_length))(
            theta[sl])
        g_acc[sl] += np.asarray(g_i)
    np.testing.assert_allclose(g_acc, g_full, rtol=1e-5, atol=1e-5)


def per_token_slice(th_slice, sl):
    """per_token of _per_token_fn(4, 8, 6) on the rows ``sl`` only, given their parameters."""
    theta, per_token = _per_token_fn(4, 8, 6)
    return per_token(theta.at[sl].set(th_slice))[sl]


@pytest.mark.parametrize("mode", ["token_mean", "prompt_mean"])
def test_local_normalizer_breaks_invariance(mode):
    """Sanity check that the invariance test is sensitive: micro-batch-local denominators differ."""
    b, t, k = 8, 6, 2
    x, m = random_case(3, b=b, t=t, empty_rows=(3,))
    jx, jm = jnp.asarray(x, jnp.float32), jnp.asarray(m, jnp.float32)
    full = aggregate(jx, jm, mode, loss_normalizer(jm, k))
    local = sum(aggregate(jx[i:i + 2], jm[i:i + 2], mode, loss_normalizer(jm[i:i + 2], k)) for i in range(0, b, 2))
    assert not np.isclose(full, local, rtol=1e-3)


# ----------------------------------------------------------------------------------------
# Normalizer and errors.


def test_loss_normalizer_values():
    m = make_mask([0, 3, 5, 1, 2, 4], 5)
    n = loss_normalizer(jnp.asarray(m, jnp.float32), 3)
    assert isinstance(n, Normalizer)
    assert float(n.num_tokens) == 15.0
    assert float(n.num_sequences) == 6.0
    assert float(n.num_prompts) == 2.0
    assert float(n.max_length) == 5.0
    n = loss_normalizer(jnp.asarray(m, jnp.float32), 1, max_length=4096)
    assert (float(n.num_prompts), float(n.max_length)) == (6.0, 4096.0)
    n = loss_normalizer(jnp.asarray(m, jnp.float32), 6)
    assert float(n.num_prompts) == 1.0
    for leaf in jax.tree.leaves(n):
        assert jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.shape == ()


def test_loss_normalizer_float64_keeps_double(f64):
    m = jnp.asarray(make_mask([2, 3], 4))
    n = loss_normalizer(m, 1)
    assert all(leaf.dtype == jnp.float64 for leaf in jax.tree.leaves(n))


def test_loss_normalizer_counts_exact_for_bfloat16_mask():
    m = jnp.ones((1, 257), jnp.bfloat16)
    n = loss_normalizer(m, 1)
    assert float(n.num_tokens) == 257.0 and float(n.max_length) == 257.0


def test_aggregate_sums_bfloat16_inputs_in_float32():
    x = jnp.ones((1, 3000), jnp.bfloat16)
    m = jnp.ones((1, 3000), jnp.bfloat16)
    norm = loss_normalizer(jnp.ones((1, 3000), jnp.float32), 1)
    assert float(aggregate(x, m, "prompt_mean", norm)) == 3000.0


@pytest.mark.parametrize("b, k", [(6, 4), (5, 2), (4, 0), (3, -1)])
def test_indivisible_or_invalid_group_size_raises(b, k):
    with pytest.raises(ValueError, match=f"K={k}"):
        loss_normalizer(jnp.ones((b, 3)), k)


def test_unknown_mode_raises_listing_valid_modes():
    m = jnp.ones((2, 3))
    with pytest.raises(ValueError, match="token_average") as info:
        aggregate(m, m, "token_average", loss_normalizer(m, 1))
    for mode in AGGREGATIONS:
        assert mode in str(info.value)


def test_shape_mismatch_raises():
    with pytest.raises((AssertionError, ValueError)):
        aggregate(jnp.ones((2, 3)), jnp.ones((2, 4)), "token_mean", loss_normalizer(jnp.ones((2, 4)), 1))
    with pytest.raises((AssertionError, ValueError)):
        loss_normalizer(jnp.ones((2, 3, 1)), 1)


# ----------------------------------------------------------------------------------------
# jit and vmap.


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_jit_equals_eager(mode):
    x, m = random_case(5)
    jx, jm = jnp.asarray(x, jnp.float32), jnp.asarray(m, jnp.float32)
    norm = loss_normalizer(jm, 2)
    jitted = jax.jit(aggregate, static_argnames="mode")
    for s in (0.0, 1.0):
        np.testing.assert_allclose(jitted(jx, jm, mode=mode, norm=norm, divide_by_length=s),
                                   aggregate(jx, jm, mode, norm, s), rtol=1e-6)
        np.testing.assert_allclose(jitted(jx, jm, mode=mode, norm=norm, divide_by_length=s),
                                   np_aggregate(x, m, mode, 2, s), rtol=1e-5)
    # the normalizer itself under jit
    n_jit = jax.jit(loss_normalizer, static_argnums=1)(jm, 2)
    for a, b in zip(jax.tree.leaves(n_jit), jax.tree.leaves(norm), strict=True):
        assert float(a) == float(b)


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_vmap_over_divide_by_length_equals_loop(mode):
    x, m = random_case(6)
    jx, jm = jnp.asarray(x, jnp.float32), jnp.asarray(m, jnp.float32)
    norm = loss_normalizer(jm, 2)
    switches = np.array([0.0, 0.25, 1.0], np.float32)
    batched = jax.jit(jax.vmap(lambda s: aggregate(jx, jm, mode, norm, s)))(switches)
    looped = np.array([aggregate(jx, jm, mode, norm, float(s)) for s in switches])
    np.testing.assert_allclose(batched, looped, rtol=1e-6)
    np.testing.assert_allclose(batched, [np_aggregate(x, m, mode, 2, s) for s in switches], rtol=1e-5)
    assert not np.isclose(looped[0], looped[-1])
    # gradients under vmap too
    g_batched = jax.vmap(lambda s: jax.grad(lambda xx: aggregate(xx, jm, mode, norm, s))(jx))(switches)
    g_looped = np.stack([jax.grad(lambda xx, s=s: aggregate(xx, jm, mode, norm, float(s)))(jx) for s in switches])
    np.testing.assert_allclose(g_batched, g_looped, rtol=1e-6)


def test_padding_holding_inf_or_nan_does_not_leak_into_the_aggregate():
    mask = jnp.asarray(make_mask([2, 3], 4))
    per_token = jnp.where(mask > 0, 1.0, jnp.nan)
    for mode in AGGREGATIONS:
        assert np.isfinite(float(aggregate(per_token, mask, mode, loss_normalizer(mask, 1)))), mode
