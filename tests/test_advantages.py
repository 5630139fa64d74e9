"""Tests for pgjax.core.advantages: group mean / leave-one-out (eq. 14) / group std (eq. 18, 20) baselines,
group advantages, ReMax (eq. 13), whitening, the broadcast over tokens and sequence scores.

References are independent float64 NumPy loops written from the definitions; pgjax (float32) is compared
to them at rtol/atol 1e-5. Groups: B = P * K rows, row p*K + k is sample k of prompt p.
"""
import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax.core.advantages import (
    broadcast_over_tokens,
    greedy_baseline_advantages,
    group_advantages,
    group_mean,
    group_std,
    leave_one_out_mean,
    sequence_scores,
    whiten,
)

RTOL = ATOL = 1e-5
KS = (2, 3, 5)
BAD = (AssertionError, ValueError, TypeError)

# Many eager calls are slow (one dispatch per op); the bulk parametrised comparisons use a jitted copy with
# K static and the hyperparameters traced. Eager == jit is checked in test_jit_matches_eager, and the
# hand-computed examples call the functions eagerly.
group_advantages_j = jax.jit(group_advantages, static_argnums=1)


# ----------------------------------------------------------------------------- float64 references

def ref_group_mean(scores, k):
    s = np.asarray(scores, np.float64)
    out = np.zeros_like(s)
    for p in range(len(s) // k):
        total = 0.0
        for i in range(k):
            total += s[p * k + i]
        for i in range(k):
            out[p * k + i] = total / k
    return out


def ref_leave_one_out_mean(scores, k):
    s = np.asarray(scores, np.float64)
    out = np.zeros_like(s)
    for p in range(len(s) // k):
        for j in range(k):
            total = 0.0
            for i in range(k):
                if i != j:
                    total += s[p * k + i]
            out[p * k + j] = total / (k - 1)
    return out


def ref_group_std(scores, k, ddof=1.0):
    s = np.asarray(scores, np.float64)
    mean = ref_group_mean(s, k)
    out = np.zeros_like(s)
    for p in range(len(s) // k):
        ss = 0.0
        for i in range(k):
            ss += (s[p * k + i] - mean[p * k + i]) ** 2
        for i in range(k):
            out[p * k + i] = np.sqrt(ss / (k - ddof))
    return out


def ref_group_advantages(scores, k, leave_one_out=0.0, divide_by_std=0.0, std_eps=1e-6, std_ddof=1.0):
    """A = (G - b) / ((1 - s) + s (std + eps)), b = (1 - l) mean + l loo-mean; exactly 0 for all-equal groups."""
    s = np.asarray(scores, np.float64)
    mean, loo = ref_group_mean(s, k), ref_leave_one_out_mean(s, k)
    std = ref_group_std(s, k, std_ddof)
    out = np.zeros_like(s)
    for p in range(len(s) // k):
        group = s[p * k:(p + 1) * k]
        if all(x == group[0] for x in group):
            continue  # exactly 0
        for i in range(k):
            j = p * k + i
            baseline = (1 - leave_one_out) * mean[j] + leave_one_out * loo[j]
            denom = (1 - divide_by_std) + divide_by_std * (std[j] + std_eps)
            out[j] = (s[j] - baseline) / denom
    return out


def ref_whiten(x, mask, eps=1e-8, ddof=1.0):
    """(x - mean) / (std + eps) over masked entries (std with ddof; 0 when n <= ddof), 0 off the mask."""
    x, mask = np.asarray(x, np.float64), np.asarray(mask, np.float64)
    vals = [x[idx] for idx in np.ndindex(x.shape) if mask[idx] > 0]
    n = len(vals)
    out = np.zeros_like(x)
    if n == 0:
        return out
    mean = sum(vals) / n
    ss = sum((v - mean) ** 2 for v in vals)
    std = np.sqrt(ss / (n - ddof)) if n > ddof else 0.0
    for idx in np.ndindex(x.shape):
        if mask[idx] > 0:
            out[idx] = (x[idx] - mean) / (std + eps)
    return out


def ref_broadcast(seq_adv, mask):
    seq_adv, mask = np.asarray(seq_adv, np.float64), np.asarray(mask, np.float64)
    out = np.zeros_like(mask)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t] > 0:
                out[b, t] = seq_adv[b]
    return out


def ref_sequence_scores(rewards, mask):
    rewards, mask = np.asarray(rewards, np.float64), np.asarray(mask, np.float64)
    if rewards.ndim == 1:
        return rewards.copy()
    out = np.zeros(mask.shape[0])
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t] > 0:
                out[b] += rewards[b, t]
    return out


# ----------------------------------------------------------------------------- fixtures

def random_scores(k, p=4, seed=0):
    return np.random.default_rng(seed).normal(size=(p * k,)).astype(np.float32)


def make_mask(lengths, t):
    mask = np.zeros((len(lengths), t), np.float32)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1.0
    return mask


LENGTHS = (0, 6, 3, 1, 5, 6)  # a zero-length row and full-length rows
T = 6


def assert_close(actual, expected, rtol=RTOL, atol=ATOL):
    actual = np.asarray(actual)
    assert np.all(np.isfinite(actual)), actual
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- group statistics

def test_group_statistics_hand_examples():
    s = jnp.array([1.0, 2.0, 3.0, 6.0])  # K = 2: groups {1, 2}, {3, 6}
    np.testing.assert_allclose(np.asarray(group_mean(s, 2)), [1.5, 1.5, 4.5, 4.5], rtol=0, atol=1e-7)
    np.testing.assert_allclose(np.asarray(leave_one_out_mean(s, 2)), [2.0, 1.0, 6.0, 3.0], rtol=0, atol=1e-7)
    r2 = np.sqrt(2.0)
    np.testing.assert_allclose(np.asarray(group_std(s, 2)), [1 / r2, 1 / r2, 3 / r2, 3 / r2], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(group_std(s, 2, ddof=0.0)), [0.5, 0.5, 1.5, 1.5], rtol=1e-6)

    s = jnp.array([0.0, 1.0, 5.0])  # K = 3: mean 2, loo [3, 2.5, 0.5], std (ddof 1) sqrt(14 / 2) = sqrt(7)
    np.testing.assert_allclose(np.asarray(group_mean(s, 3)), [2.0, 2.0, 2.0], rtol=1e-7)
    np.testing.assert_allclose(np.asarray(leave_one_out_mean(s, 3)), [3.0, 2.5, 0.5], rtol=1e-7)
    np.testing.assert_allclose(np.asarray(group_std(s, 3)), [np.sqrt(7.0)] * 3, rtol=1e-6)


def test_group_advantages_hand_examples():
    s = jnp.array([0.0, 1.0, 5.0])
    np.testing.assert_allclose(np.asarray(group_advantages(s, 3)), [-2.0, -1.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(group_advantages(s, 3, leave_one_out=1.0)), [-3.0, -1.5, 4.5],
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(group_advantages(s, 3, divide_by_std=1.0, std_eps=0.0)),
                               np.array([-2.0, -1.0, 3.0]) / np.sqrt(7.0), rtol=1e-6)
    # GRPO with binary rewards, K = 4: mean .25, std (ddof 1) = sqrt(.75 / 3) = .5 -> [1.5, -.5, -.5, -.5]
    s = jnp.array([1.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(np.asarray(group_advantages(s, 4, divide_by_std=1.0, std_eps=0.0)),
                               [1.5, -0.5, -0.5, -0.5], rtol=1e-6)
    # leave-one-out (RLOO, eq. 14): [1 - 0, 0 - 1/3, ...]
    np.testing.assert_allclose(np.asarray(group_advantages(s, 4, leave_one_out=1.0)),
                               [1.0, -1 / 3, -1 / 3, -1 / 3], rtol=1e-6)
    # half-way settings interpolate the baseline and the denominator linearly
    np.testing.assert_allclose(
        np.asarray(group_advantages(s, 4, leave_one_out=0.5, divide_by_std=0.5, std_eps=0.0)),
        np.array([1.0 - (0.5 * 0.25 + 0.5 * 0.0), -(0.5 * 0.25 + 0.5 / 3), -(0.5 * 0.25 + 0.5 / 3),
                  -(0.5 * 0.25 + 0.5 / 3)]) / (0.5 + 0.5 * 0.5), rtol=1e-6)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("ddof", [0.0, 1.0])
def test_group_statistics_match_reference(k, ddof):
    s = random_scores(k, seed=k)
    assert_close(group_mean(jnp.asarray(s), k), ref_group_mean(s, k))
    assert_close(leave_one_out_mean(jnp.asarray(s), k), ref_leave_one_out_mean(s, k))
    out = group_std(jnp.asarray(s), k, ddof)
    assert out.dtype == jnp.float32 and out.shape == s.shape
    assert_close(out, ref_group_std(s, k, ddof))


@pytest.mark.parametrize("k", KS)
def test_leave_one_out_identity(k):
    # eq. 14's derivation: G_k - mean_{i != k} G_i = K/(K-1) (G_k - mean_i G_i)
    s = random_scores(k, p=6, seed=10 + k)
    lhs = s - np.asarray(leave_one_out_mean(jnp.asarray(s), k))
    rhs = k / (k - 1) * (s - np.asarray(group_mean(jnp.asarray(s), k)))
    assert_close(lhs, rhs)
    # the same through group_advantages: l = 1 is the l = 0 advantage scaled by K/(K-1) (also with std)
    for sd in (0.0, 1.0):
        a_loo = group_advantages_j(jnp.asarray(s), k, leave_one_out=1.0, divide_by_std=sd)
        a_mean = group_advantages_j(jnp.asarray(s), k, leave_one_out=0.0, divide_by_std=sd)
        assert_close(a_loo, k / (k - 1) * np.asarray(a_mean))


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("loo,std", list(itertools.product([0.0, 0.5, 1.0], [0.0, 0.5, 1.0])))
def test_group_advantages_match_reference(k, loo, std):
    s = random_scores(k, p=5, seed=20 + k)
    s[:k] = 0.7           # an all-equal group (first)
    s[2 * k:3 * k] = 1.0  # and another in the middle
    for ddof, eps in [(1.0, 1e-6), (0.0, 1e-3)]:
        out = group_advantages_j(jnp.asarray(s), k, leave_one_out=loo, divide_by_std=std, std_eps=eps, std_ddof=ddof)
        assert out.dtype == jnp.float32 and out.shape == s.shape
        assert_close(out, ref_group_advantages(s, k, loo, std, eps, ddof))
        np.testing.assert_array_equal(np.asarray(out)[:k], 0.0)
        np.testing.assert_array_equal(np.asarray(out)[2 * k:3 * k], 0.0)


def test_group_advantages_sum_to_zero_within_group():
    k = 5
    s = random_scores(k, p=4, seed=3)
    for loo, std in itertools.product([0.0, 1.0], [0.0, 1.0]):
        a = np.asarray(group_advantages_j(jnp.asarray(s), k, leave_one_out=loo, divide_by_std=std))
        np.testing.assert_allclose(a.reshape(-1, k).sum(axis=1), 0.0, atol=1e-5)


# ----------------------------------------------------------------------------- all-equal groups

@pytest.mark.parametrize("k", [2, 3, 5, 10])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, 0.7])
def test_all_equal_groups_are_exactly_zero(k, value):
    # 0.1 repeated: the float32 group mean is not exactly 0.1 for K = 3 (and the std is ~1e-8, not 0),
    # so without special handling (G - b) / (std + eps) would be rounding noise amplified by 1/eps.
    s = jnp.full((3 * k,), value, jnp.float32)
    for loo, std, eps in itertools.product([0.0, 0.5, 1.0], [0.0, 1.0], [1e-6, 0.0]):
        out = np.asarray(group_advantages_j(s, k, leave_one_out=loo, divide_by_std=std, std_eps=eps))
        assert np.all(np.isfinite(out))
        np.testing.assert_array_equal(out, 0.0)


def test_all_equal_rounding_case_is_real():
    # guards the previous test: this input really has a rounding error in the float32 group mean / std.
    s = jnp.full((3,), 0.1, jnp.float32)
    assert float(group_mean(s, 3)[0]) != float(s[0]) or float(group_std(s, 3)[0]) != 0.0


def test_all_equal_group_next_to_unequal_group():
    s = jnp.array([0.1, 0.1, 0.1, 0.0, 1.0, 0.0], jnp.float32)
    out = np.asarray(group_advantages(s, 3, divide_by_std=1.0))
    np.testing.assert_array_equal(out[:3], 0.0)
    assert_close(out[3:], ref_group_advantages(np.asarray(s), 3, 0.0, 1.0)[3:])
    assert np.all(out[3:] != 0.0)


# ----------------------------------------------------------------------------- ReMax, broadcast, sequence scores

def test_greedy_baseline_advantages():
    out = greedy_baseline_advantages(jnp.array([1.0, 0.0, 0.5]), jnp.array([0.0, 1.0, 0.5]))
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), [1.0, -1.0, 0.0])
    rng = np.random.default_rng(0)
    g, gh = rng.normal(size=8).astype(np.float32), rng.normal(size=8).astype(np.float32)
    assert_close(greedy_baseline_advantages(jnp.asarray(g), jnp.asarray(gh)),
                 np.array([float(a) - float(b) for a, b in zip(g, gh, strict=True)]))


def test_broadcast_over_tokens():
    mask = jnp.array([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    out = broadcast_over_tokens(jnp.array([2.0, 5.0, -1.0]), mask)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), [[2, 2, 0], [0, 0, 0], [-1, -1, -1]])
    mask = make_mask(LENGTHS, T)
    a = np.random.default_rng(1).normal(size=len(LENGTHS)).astype(np.float32)
    assert_close(broadcast_over_tokens(jnp.asarray(a), jnp.asarray(mask)), ref_broadcast(a, mask), rtol=0, atol=0)


def test_sequence_scores():
    rewards = jnp.array([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    out = sequence_scores(rewards, mask)
    assert out.dtype == jnp.float32 and out.shape == (3,)
    np.testing.assert_array_equal(np.asarray(out), [3.0, 3.0, 0.0])
    outcome = jnp.array([1, 0, 1], jnp.int32)
    out = sequence_scores(outcome, mask)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), [1.0, 0.0, 1.0])
    rng = np.random.default_rng(2)
    m = make_mask(LENGTHS, T)
    r = rng.normal(size=m.shape).astype(np.float32)
    assert_close(sequence_scores(jnp.asarray(r), jnp.asarray(m)), ref_sequence_scores(r, m))


# ----------------------------------------------------------------------------- whitening

@pytest.mark.parametrize("ddof", [0.0, 1.0])
def test_whiten_matches_reference(ddof):
    rng = np.random.default_rng(4)
    mask = make_mask(LENGTHS, T)
    x = (3.0 + 2.0 * rng.normal(size=mask.shape)).astype(np.float32)  # junk off the mask, too
    for eps in (1e-8, 0.1):
        out = whiten(jnp.asarray(x), jnp.asarray(mask), eps=eps, ddof=ddof)
        assert out.dtype == jnp.float32 and out.shape == mask.shape
        assert_close(out, ref_whiten(x, mask, eps, ddof))
    out = np.asarray(whiten(jnp.asarray(x), jnp.asarray(mask), ddof=ddof))
    vals = out[mask > 0]
    np.testing.assert_allclose(vals.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(vals.std(ddof=int(ddof)), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(out[mask == 0], 0.0)


def test_whiten_hand_example():
    # masked entries [1, 2, 3] (mean 2, std ddof 1 = 1) -> [-1, 0, 1]; the 100 is padding.
    out = whiten(jnp.array([[1.0, 2.0], [3.0, 100.0]]), jnp.array([[1.0, 1.0], [1.0, 0.0]]), eps=0.0)
    np.testing.assert_allclose(np.asarray(out), [[-1.0, 0.0], [1.0, 0.0]], rtol=0, atol=1e-6)


def test_whiten_degenerate_masks_no_nan():
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    for ddof in (0.0, 1.0):
        out = np.asarray(whiten(x, jnp.zeros((2, 2)), ddof=ddof))             # nothing masked
        np.testing.assert_array_equal(out, 0.0)
        out = np.asarray(whiten(x, jnp.array([[0.0, 1.0], [0.0, 0.0]]), ddof=ddof))  # one entry
        assert np.all(np.isfinite(out))
        np.testing.assert_array_equal(out, 0.0)
        out = np.asarray(whiten(jnp.full((2, 2), 0.1), jnp.ones((2, 2)), ddof=ddof))  # constant
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, 0.0, atol=1e-5)


# ----------------------------------------------------------------------------- zero-length responses end to end

def test_outcome_pipeline_with_zero_length_rows_has_no_nan():
    k = 3
    lengths = (0, 4, 2, 0, 0, 0)  # the second group has only empty responses
    mask = jnp.asarray(make_mask(lengths, 4))
    rewards = jnp.array([1.0, 0.0, 0.5, 0.0, 0.0, 0.0])
    scores = sequence_scores(rewards, mask)
    for loo, std in itertools.product([0.0, 1.0], [0.0, 1.0]):
        a = group_advantages(scores, k, leave_one_out=loo, divide_by_std=std)
        tok = broadcast_over_tokens(a, mask)
        w = whiten(tok, mask)
        for out in (a, tok, w):
            assert np.all(np.isfinite(np.asarray(out)))
        np.testing.assert_array_equal(np.asarray(tok)[[0, 3, 4, 5]], 0.0)
        np.testing.assert_array_equal(np.asarray(w)[[0, 3, 4, 5]], 0.0)
        np.testing.assert_array_equal(np.asarray(a)[3:], 0.0)
    # per-token rewards: an empty response scores 0
    scores = sequence_scores(jnp.ones((6, 4)), mask)
    np.testing.assert_array_equal(np.asarray(scores), [0.0, 4.0, 2.0, 0.0, 0.0, 0.0])


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("fn", [group_mean, leave_one_out_mean, group_std, group_advantages])
def test_group_size_one_raises(fn):
    with pytest.raises(ValueError):
        fn(jnp.ones((4,)), 1)
    with pytest.raises(ValueError):
        fn(jnp.ones((4,)), 0)


@pytest.mark.parametrize("fn", [group_mean, leave_one_out_mean, group_std, group_advantages])
def test_batch_not_divisible_by_k_raises(fn):
    with pytest.raises(ValueError, match="K"):
        fn(jnp.ones((7,)), 3)
    with pytest.raises(ValueError, match="3"):
        fn(jnp.ones((7,)), 3)


@pytest.mark.parametrize("fn", [group_mean, leave_one_out_mean, group_std, group_advantages])
def test_group_functions_reject_rank_2(fn):
    with pytest.raises(BAD):
        fn(jnp.ones((3, 3)), 3)  # rows divisible by K, so only the rank check can catch it
    with pytest.raises(BAD):
        fn(jnp.ones((6, 1)), 3)


def test_mismatched_shapes_raise():
    with pytest.raises(BAD):
        greedy_baseline_advantages(jnp.ones((3,)), jnp.ones((4,)))
    with pytest.raises(BAD):
        greedy_baseline_advantages(jnp.ones((3, 2)), jnp.ones((3, 2)))
    with pytest.raises(BAD):
        whiten(jnp.ones((3, 4)), jnp.ones((3, 5)))
    with pytest.raises(BAD):
        broadcast_over_tokens(jnp.ones((3,)), jnp.ones((4, 5)))
    with pytest.raises(BAD):
        broadcast_over_tokens(jnp.ones((3, 1)), jnp.ones((3, 5)))
    with pytest.raises(BAD):
        sequence_scores(jnp.ones((3, 4)), jnp.ones((3, 5)))


# ----------------------------------------------------------------------------- jit and vmap

def test_jit_matches_eager():
    k = 3
    s = jnp.asarray(random_scores(k, p=4, seed=50)).at[:k].set(0.1)
    mask = jnp.asarray(make_mask((0, 6, 3, 1, 5, 6, 2, 4, 6, 6, 0, 1), T))
    x = jnp.asarray(np.random.default_rng(51).normal(size=mask.shape).astype(np.float32))
    tok_r = jnp.asarray(np.random.default_rng(52).normal(size=mask.shape).astype(np.float32))
    cases = [
        (functools.partial(group_mean, group_size=k), (s,)),
        (functools.partial(leave_one_out_mean, group_size=k), (s,)),
        (lambda sc, dd: group_std(sc, k, dd), (s, jnp.float32(0.0))),
        (functools.partial(group_advantages, group_size=k), (s,)),
        # hyperparameters traced under jit
        (lambda sc, lo, sd, e, dd: group_advantages(sc, k, lo, sd, e, dd),
         (s, jnp.float32(1.0), jnp.float32(1.0), jnp.float32(1e-6), jnp.float32(1.0))),
        (lambda sc, lo, sd: group_advantages(sc, k, lo, sd), (s, jnp.float32(0.5), jnp.float32(0.5))),
        (greedy_baseline_advantages, (s, s[::-1])),
        (whiten, (x, mask)),
        (whiten, (x, mask, jnp.float32(0.1), jnp.float32(0.0))),
        (broadcast_over_tokens, (s, mask)),
        (sequence_scores, (tok_r, mask)),
        (sequence_scores, (s, mask)),
    ]
    for fn, args in cases:
        eager = fn(*args)
        jitted = jax.jit(fn)(*args)
        chex.assert_trees_all_close(jitted, eager, rtol=1e-6, atol=1e-6)
    # group_size as a static argument of jit
    out = jax.jit(group_advantages, static_argnums=1)(s, k, 1.0, 1.0)
    assert_close(out, ref_group_advantages(np.asarray(s), k, 1.0, 1.0))
    np.testing.assert_array_equal(np.asarray(out)[:k], 0.0)


def test_vmap_over_stack_of_batches_equals_loop():
    k, n = 3, 4
    rng = np.random.default_rng(60)
    scores = rng.normal(size=(n, 4 * k)).astype(np.float32)
    scores[1, :k] = 0.1  # an all-equal group in one of the batches
    masks = np.stack([make_mask(tuple(rng.integers(0, T + 1, size=4 * k)), T) for _ in range(n)])
    xs = rng.normal(size=masks.shape).astype(np.float32)
    s, m, x = jnp.asarray(scores), jnp.asarray(masks), jnp.asarray(xs)

    outs = {
        "mean": jax.vmap(lambda a: group_mean(a, k))(s),
        "loo": jax.vmap(lambda a: leave_one_out_mean(a, k))(s),
        "std": jax.vmap(lambda a: group_std(a, k))(s),
        "adv": jax.vmap(lambda a: group_advantages(a, k, 1.0, 1.0))(s),
        "greedy": jax.vmap(greedy_baseline_advantages)(s, s[::-1]),
        "whiten": jax.vmap(whiten)(x, m),
        "bcast": jax.vmap(broadcast_over_tokens)(s, m),
        "seq": jax.vmap(sequence_scores)(x, m),
    }
    for i in range(n):
        loop = {
            "mean": group_mean(s[i], k), "loo": leave_one_out_mean(s[i], k), "std": group_std(s[i], k),
            "adv": group_advantages(s[i], k, 1.0, 1.0), "greedy": greedy_baseline_advantages(s[i], s[::-1][i]),
            "whiten": whiten(x[i], m[i]), "bcast": broadcast_over_tokens(s[i], m[i]),
            "seq": sequence_scores(x[i], m[i]),
        }
        for key in outs:
            chex.assert_trees_all_close(outs[key][i], loop[key], rtol=1e-6, atol=1e-6)
        # each batch is whitened on its own statistics (float64 reference)
        assert_close(outs["whiten"][i], ref_whiten(xs[i], masks[i]))
        assert_close(outs["adv"][i], ref_group_advantages(scores[i], k, 1.0, 1.0))


@pytest.mark.parametrize("k", KS)
def test_vmap_over_traced_hyperparameters_equals_loop(k):
    s = random_scores(k, p=4, seed=70 + k)
    s[k:2 * k] = 0.1  # all-equal group
    # every (lo, s) pair; eps and ddof vary along the grid too
    grid = [(lo, sd, [1e-6, 1e-2][i % 2], [1.0, 0.0][(i // 2) % 2])
            for i, (lo, sd) in enumerate(itertools.product([0.0, 0.5, 1.0], [0.0, 0.5, 1.0]))]
    loo, std, eps, ddof = (jnp.array(col, jnp.float32) for col in zip(*grid, strict=True))
    out = jax.vmap(lambda lo, sd, e, dd: group_advantages(jnp.asarray(s), k, lo, sd, e, dd))(loo, std, eps, ddof)
    assert out.shape == (len(grid), len(s))
    for i, (lo, sd, e, dd) in enumerate(grid):
        chex.assert_trees_all_close(out[i], group_advantages_j(jnp.asarray(s), k, lo, sd, e, dd), rtol=1e-6, atol=1e-6)
        assert_close(out[i], ref_group_advantages(s, k, lo, sd, e, dd))


def test_vmap_over_traced_whiten_hyperparameters_equals_loop():
    mask = make_mask(LENGTHS, T)
    x = np.random.default_rng(71).normal(size=mask.shape).astype(np.float32)
    eps_v, ddof_v = jnp.array([1e-8, 0.1, 1e-8]), jnp.array([1.0, 1.0, 0.0])
    w = jax.vmap(lambda e, dd: whiten(jnp.asarray(x), jnp.asarray(mask), e, dd))(eps_v, ddof_v)
    for i, (e, dd) in enumerate([(1e-8, 1.0), (0.1, 1.0), (1e-8, 0.0)]):
        chex.assert_trees_all_close(w[i], whiten(jnp.asarray(x), jnp.asarray(mask), e, dd), rtol=1e-6, atol=1e-6)
        assert_close(w[i], ref_whiten(x, mask, e, dd))


# ----------------------------------------------------------------------------- dtypes (pgjax.core.dtypes rule)

def test_float64_inputs_stay_float64_under_x64(x64):
    k = 3
    s = random_scores(k, p=4, seed=90).astype(np.float64)
    s[:k] = 0.1
    for loo, std in itertools.product([0.0, 1.0], [0.0, 1.0]):
        out = group_advantages(jnp.asarray(s), k, loo, std)
        assert out.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(out), ref_group_advantages(s, k, loo, std), rtol=1e-12, atol=1e-12)
    mask = make_mask(LENGTHS, T).astype(np.float64)
    x = np.random.default_rng(91).normal(size=mask.shape)
    w = whiten(jnp.asarray(x), jnp.asarray(mask))
    assert w.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(w), ref_whiten(x, mask), rtol=1e-12, atol=1e-12)


def test_bfloat16_inputs_are_upcast():
    bf = jnp.bfloat16
    s = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0], bf)
    assert group_advantages(s, 3, 1.0, 1.0).dtype == jnp.float32
    assert group_mean(s, 3).dtype == jnp.float32
    mask = jnp.ones((6, 2), bf)
    assert whiten(jnp.ones((6, 2), bf), mask).dtype == jnp.float32
    assert broadcast_over_tokens(s, mask).dtype == jnp.float32
    assert sequence_scores(jnp.ones((6, 2), bf), mask).dtype == jnp.float32
    assert greedy_baseline_advantages(s, s).dtype == jnp.float32


def test_padding_holding_nan_or_inf_does_not_leak():
    mask = jnp.asarray([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    x = jnp.asarray([[1.0, 2.0, jnp.nan], [jnp.inf, 0.0, 0.0]])
    np.testing.assert_allclose(np.asarray(whiten(x, mask)), [[-0.7071068, 0.7071068, 0.0], [0.0, 0.0, 0.0]],
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(sequence_scores(x, mask)), [3.0, 0.0])
    out = broadcast_over_tokens(jnp.asarray([1.0, jnp.inf]), mask)
    np.testing.assert_array_equal(np.asarray(out), [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
