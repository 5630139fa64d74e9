"""Tests for pgjax.core.returns: token rewards, discounted returns (eq. 3), GAE and lambda-returns (eq. 17).

References are independent float64 NumPy loops written from the definitions; pgjax (float32) is compared
to them at rtol/atol 1e-5. Conventions (docs/design.md): B rows, right-padded responses, float masks with 1.0 on
response tokens, a zero-length response is legal; after the last response token the next-state value is
``bootstrap[b]`` (0 when None).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax.core.returns import as_token_rewards, discounted_returns, gae, lambda_returns, outcome_to_token_rewards

RTOL = ATOL = 1e-5

# Eager lax.scan re-traces and re-compiles on every call; the many parametrised reference comparisons use one
# jitted copy each (gamma, lam traced) to stay fast. Eager == jit is checked in test_jit_matches_eager, and the
# hand-computed examples call the functions eagerly.
gae_j = jax.jit(gae)
discounted_returns_j = jax.jit(discounted_returns)
lambda_returns_j = jax.jit(lambda_returns)
T = 7
# Row lengths: a zero-length row, two full-length (truncated) rows, and assorted partial rows.
LENGTHS = (0, 7, 3, 1, 5, 7, 2)
GAMMAS = (1.0, 0.9)
LAMS = (1.0, 0.95, 0.0)
BOOTSTRAPS = ("none", "truncated", "random")


# ----------------------------------------------------------------------------- float64 references

def _response_positions(mask_row):
    """Indices of the response tokens of one row, in order (contiguous under the conventions)."""
    return [t for t in range(len(mask_row)) if mask_row[t] > 0]


def ref_outcome_to_token_rewards(rewards, mask):
    rewards, mask = np.asarray(rewards, np.float64), np.asarray(mask, np.float64)
    out = np.zeros(mask.shape, np.float64)
    for b in range(mask.shape[0]):
        pos = _response_positions(mask[b])
        if pos:
            out[b, pos[-1]] = rewards[b]
    return out


def ref_discounted_returns(token_rewards, mask, gamma, bootstrap=None):
    """G_t = sum_{i=t}^{L-1} gamma^{i-t} r_i + gamma^{L-t} bootstrap, by the explicit double sum."""
    r, mask = np.asarray(token_rewards, np.float64), np.asarray(mask, np.float64)
    nb = mask.shape[0]
    boot = np.zeros(nb) if bootstrap is None else np.asarray(bootstrap, np.float64)
    out = np.zeros(mask.shape, np.float64)
    for b in range(nb):
        pos = _response_positions(mask[b])
        n = len(pos)
        for j in range(n):
            total = 0.0
            for i in range(j, n):
                total += gamma ** (i - j) * r[b, pos[i]]
            total += gamma ** (n - j) * boot[b]
            out[b, pos[j]] = total
    return out


def _float64_inputs(token_rewards, values, mask, bootstrap):
    """The reference functions' inputs as float64 NumPy arrays; a missing bootstrap is 0."""
    mask = np.asarray(mask, np.float64)
    boot = np.zeros(mask.shape[0]) if bootstrap is None else np.asarray(bootstrap, np.float64)
    return np.asarray(token_rewards, np.float64), np.asarray(values, np.float64), mask, boot


def ref_gae(token_rewards, values, mask, gamma, lam, bootstrap=None):
    """delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}; V_L = bootstrap, A_L = 0.

    Returns (advantages, lambda_returns = A + V), both 0 off the mask.
    """
    r, v, mask, boot = _float64_inputs(token_rewards, values, mask, bootstrap)
    nb = mask.shape[0]
    adv = np.zeros(mask.shape, np.float64)
    ret = np.zeros(mask.shape, np.float64)
    for b in range(nb):
        pos = _response_positions(mask[b])
        n = len(pos)
        next_adv = 0.0
        for j in reversed(range(n)):
            t = pos[j]
            next_v = v[b, pos[j + 1]] if j + 1 < n else boot[b]
            delta = r[b, t] + gamma * next_v - v[b, t]
            a = delta + gamma * lam * next_adv
            adv[b, t] = a
            ret[b, t] = a + v[b, t]
            next_adv = a
    return adv, ret


def ref_lambda_returns_recursive(token_rewards, values, mask, gamma, lam, bootstrap=None):
    """G^lam_t = r_t + gamma [(1 - lam) V_{t+1} + lam G^lam_{t+1}], with V_L = G^lam_L = bootstrap."""
    r, v, mask, boot = _float64_inputs(token_rewards, values, mask, bootstrap)
    nb = mask.shape[0]
    out = np.zeros(mask.shape, np.float64)
    for b in range(nb):
        pos = _response_positions(mask[b])
        n = len(pos)
        next_g = boot[b]
        for j in reversed(range(n)):
            next_v = v[b, pos[j + 1]] if j + 1 < n else boot[b]
            g = r[b, pos[j]] + gamma * ((1.0 - lam) * next_v + lam * next_g)
            out[b, pos[j]] = g
            next_g = g
    return out


def ref_td_error(token_rewards, values, mask, gamma, bootstrap=None):
    """One-step TD error r_t + gamma V_{t+1} - V_t with V_L = bootstrap."""
    r, v, mask, boot = _float64_inputs(token_rewards, values, mask, bootstrap)
    nb = mask.shape[0]
    out = np.zeros(mask.shape, np.float64)
    for b in range(nb):
        pos = _response_positions(mask[b])
        for j, t in enumerate(pos):
            next_v = v[b, pos[j + 1]] if j + 1 < len(pos) else boot[b]
            out[b, t] = r[b, t] + gamma * next_v - v[b, t]
    return out


# ----------------------------------------------------------------------------- fixtures

def make_mask(lengths=LENGTHS, t=T):
    mask = np.zeros((len(lengths), t), np.float32)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1.0
    return mask


def make_batch(seed=0, lengths=LENGTHS, t=T, junk_off_mask=True):
    """Random per-token rewards, outcome rewards, values and bootstraps.

    Off-mask entries of rewards and values hold junk (a critic emits values at padding too); every
    function must ignore them.
    """
    rng = np.random.default_rng(seed)
    mask = make_mask(lengths, t)
    tok_r = rng.normal(size=mask.shape).astype(np.float32)
    values = rng.normal(size=mask.shape).astype(np.float32)
    if not junk_off_mask:
        tok_r *= mask
        values *= mask
    outcome = rng.normal(size=(len(lengths),)).astype(np.float32)
    boot_random = rng.normal(size=(len(lengths),)).astype(np.float32)
    # "truncated": only rows that hit the token budget (full length) get a critic bootstrap, EOS rows get 0.
    full = np.array([n == t for n in lengths])
    boot_truncated = np.where(full, boot_random, 0.0).astype(np.float32)
    return dict(mask=mask, tok_r=tok_r, values=values, outcome=outcome,
                boot={"none": None, "truncated": boot_truncated, "random": boot_random})


def _j(x):
    return None if x is None else jnp.asarray(x)


def assert_close(actual, expected, rtol=RTOL, atol=ATOL):
    actual = np.asarray(actual)
    assert np.all(np.isfinite(actual)), actual
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------- outcome -> token rewards

def test_outcome_to_token_rewards_hand_example():
    rewards = jnp.array([2.0, -1.0, 3.0, 4.0])
    mask = jnp.array([[1.0, 1.0, 0.0],
                      [0.0, 0.0, 0.0],      # zero-length response: reward reaches no token
                      [1.0, 1.0, 1.0],
                      [1.0, 0.0, 0.0]])
    out = outcome_to_token_rewards(rewards, mask)
    assert out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), [[0.0, 2.0, 0.0],
                                                    [0.0, 0.0, 0.0],
                                                    [0.0, 0.0, 3.0],
                                                    [4.0, 0.0, 0.0]])


def test_outcome_to_token_rewards_matches_reference():
    d = make_batch(1)
    out = outcome_to_token_rewards(jnp.asarray(d["outcome"]), jnp.asarray(d["mask"]))
    assert out.shape == d["mask"].shape
    assert_close(out, ref_outcome_to_token_rewards(d["outcome"], d["mask"]), rtol=0, atol=0)


def test_outcome_reward_on_last_token_of_prompt_offset_mask():
    # DESIGN: the mask is 0 on the prompt too; the reward goes on the last response token.
    mask = jnp.array([[0.0, 0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0, 1.0]])
    out = outcome_to_token_rewards(jnp.array([5.0, 7.0]), mask)
    np.testing.assert_array_equal(np.asarray(out), [[0, 0, 0, 5, 0], [0, 0, 0, 0, 7]])


def test_as_token_rewards_both_forms():
    d = make_batch(2)
    mask = jnp.asarray(d["mask"])
    from_outcome = as_token_rewards(jnp.asarray(d["outcome"]), mask)
    assert_close(from_outcome, ref_outcome_to_token_rewards(d["outcome"], d["mask"]), rtol=0, atol=0)
    per_token = as_token_rewards(jnp.asarray(d["tok_r"]), mask)
    assert per_token.dtype == jnp.float32 and per_token.shape == mask.shape
    np.testing.assert_array_equal(np.asarray(per_token), d["tok_r"])
    # integer rewards come back as float32
    assert as_token_rewards(jnp.array([1, 0, 2, 1, 0, 1, 1], jnp.int32), mask).dtype == jnp.float32


# ----------------------------------------------------------------------------- discounted returns (eq. 3)

def test_discounted_returns_hand_examples():
    # rewards [0, 0, 1], gamma 0.5 -> G = [0.25, 0.5, 1]
    g = discounted_returns(jnp.array([[0.0, 0.0, 1.0]]), jnp.ones((1, 3)), gamma=0.5)
    np.testing.assert_allclose(np.asarray(g), [[0.25, 0.5, 1.0]], rtol=0, atol=1e-7)
    # truncated row with bootstrap 8: G_2 = 0 + .5*8 = 4, G_1 = 0 + .5*4 = 2, G_0 = 1 + .5*2 = 2; padding 0.
    g = discounted_returns(jnp.array([[1.0, 0.0, 0.0, 9.0]]), jnp.array([[1.0, 1.0, 1.0, 0.0]]),
                           gamma=0.5, bootstrap=jnp.array([8.0]))
    np.testing.assert_allclose(np.asarray(g), [[2.0, 2.0, 4.0, 0.0]], rtol=0, atol=1e-6)
    # outcome reward 3 on a length-2 response, gamma 0.9: G = [2.7, 3, 0]
    g = discounted_returns(jnp.array([3.0]), jnp.array([[1.0, 1.0, 0.0]]), gamma=0.9)
    np.testing.assert_allclose(np.asarray(g), [[2.7, 3.0, 0.0]], rtol=1e-6, atol=1e-6)
    # gamma = 1 outcome: every response token sees the outcome (the paper, below eq. 18: G_t = R(s_{T-1}, a_{T-1}))
    g = discounted_returns(jnp.array([1.0, -2.0]), jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
    np.testing.assert_array_equal(np.asarray(g), [[1.0, 1.0, 1.0], [-2.0, 0.0, 0.0]])


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("boot", BOOTSTRAPS)
@pytest.mark.parametrize("kind", ["per_token", "outcome"])
def test_discounted_returns_match_reference(gamma, boot, kind):
    d = make_batch(3 if kind == "per_token" else 4)
    bootstrap = d["boot"][boot]
    rewards = d["tok_r"] if kind == "per_token" else d["outcome"]
    out = discounted_returns_j(jnp.asarray(rewards), jnp.asarray(d["mask"]), gamma, _j(bootstrap))
    assert out.dtype == jnp.float32 and out.shape == d["mask"].shape
    token_r = rewards if kind == "per_token" else ref_outcome_to_token_rewards(rewards, d["mask"])
    assert_close(out, ref_discounted_returns(token_r, d["mask"], gamma, bootstrap))


# ----------------------------------------------------------------------------- GAE and lambda-returns (eq. 17)

def test_gae_hand_example():
    # r = [1, 0, 2], V = [.5, 1, .5], gamma = lam = .5, terminal (bootstrap 0):
    # delta = [1 + .5*1 - .5, 0 + .5*.5 - 1, 2 + 0 - .5] = [1, -.75, 1.5]
    # A_2 = 1.5, A_1 = -.75 + .25*1.5 = -.375, A_0 = 1 + .25*(-.375) = .90625; G^lam = A + V.
    r = jnp.array([[1.0, 0.0, 2.0]])
    v = jnp.array([[0.5, 1.0, 0.5]])
    adv, ret = gae(r, v, jnp.ones((1, 3)), gamma=0.5, lam=0.5)
    np.testing.assert_allclose(np.asarray(adv), [[0.90625, -0.375, 1.5]], rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), [[1.40625, 0.625, 2.0]], rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(lambda_returns(r, v, jnp.ones((1, 3)), 0.5, 0.5)),
                               [[1.40625, 0.625, 2.0]], rtol=0, atol=1e-6)


def test_gae_hand_example_truncated_with_bootstrap():
    # full-length row r = [0, 1], V = [2, 3], bootstrap 4, gamma = lam = 1:
    # A_1 = 1 + 4 - 3 = 2, A_0 = 0 + 3 - 2 + 2 = 3; G^lam = [5, 5] = discounted return incl. bootstrap.
    # second row: same rewards, length 1, terminal: A_0 = 0 - 2 = -2, G^lam = [0, 0] (padding 0).
    r = jnp.array([[0.0, 1.0], [0.0, 1.0]])
    v = jnp.array([[2.0, 3.0], [2.0, 3.0]])
    m = jnp.array([[1.0, 1.0], [1.0, 0.0]])
    adv, ret = gae(r, v, m, gamma=1.0, lam=1.0, bootstrap=jnp.array([4.0, 0.0]))
    np.testing.assert_allclose(np.asarray(adv), [[3.0, 2.0], [-2.0, 0.0]], rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), [[5.0, 5.0], [0.0, 0.0]], rtol=0, atol=1e-6)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("lam", LAMS)
@pytest.mark.parametrize("boot", BOOTSTRAPS)
def test_gae_matches_reference(gamma, lam, boot):
    d = make_batch(5)
    bootstrap = d["boot"][boot]
    adv, ret = gae_j(jnp.asarray(d["tok_r"]), jnp.asarray(d["values"]), jnp.asarray(d["mask"]),
                   gamma, lam, _j(bootstrap))
    assert adv.dtype == jnp.float32 and ret.dtype == jnp.float32
    assert adv.shape == ret.shape == d["mask"].shape
    ref_adv, ref_ret = ref_gae(d["tok_r"], d["values"], d["mask"], gamma, lam, bootstrap)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)
    # lambda-return by its own recursion (the lambda_returns docstring) agrees with A + V
    assert_close(ref_ret, ref_lambda_returns_recursive(d["tok_r"], d["values"], d["mask"], gamma, lam,
                                                       bootstrap), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("lam", LAMS)
@pytest.mark.parametrize("outcome", [False, True])
def test_lambda_returns_matches_reference(gamma, lam, outcome):
    d = make_batch(6)
    bootstrap = d["boot"]["truncated"]
    rewards = d["outcome"] if outcome else d["tok_r"]
    token_r = ref_outcome_to_token_rewards(d["outcome"], d["mask"]) if outcome else d["tok_r"]
    out = lambda_returns_j(jnp.asarray(rewards), jnp.asarray(d["values"]), jnp.asarray(d["mask"]),
                         gamma, lam, jnp.asarray(bootstrap))
    assert_close(out, ref_lambda_returns_recursive(token_r, d["values"], d["mask"], gamma, lam, bootstrap))


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("boot", BOOTSTRAPS)
def test_gae_lambda_one_is_returns_minus_values(gamma, boot):
    d = make_batch(7)
    bootstrap = _j(d["boot"][boot])
    mask = jnp.asarray(d["mask"])
    adv, ret = gae_j(jnp.asarray(d["tok_r"]), jnp.asarray(d["values"]), mask, gamma, 1.0, bootstrap)
    g = discounted_returns_j(jnp.asarray(d["tok_r"]), mask, gamma, bootstrap)
    assert_close(adv, (np.asarray(g) - d["values"]) * d["mask"])
    assert_close(ret, g)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("boot", BOOTSTRAPS)
def test_gae_lambda_zero_is_td_error(gamma, boot):
    d = make_batch(8)
    bootstrap = d["boot"][boot]
    adv, _ = gae_j(jnp.asarray(d["tok_r"]), jnp.asarray(d["values"]), jnp.asarray(d["mask"]),
                 gamma, 0.0, _j(bootstrap))
    assert_close(adv, ref_td_error(d["tok_r"], d["values"], d["mask"], gamma, bootstrap))


def test_gae_with_zero_values_is_discounted_return():
    d = make_batch(9)
    mask = jnp.asarray(d["mask"])
    boot = jnp.asarray(d["boot"]["random"])
    adv, _ = gae_j(jnp.asarray(d["tok_r"]), jnp.zeros_like(mask), mask, 0.9, 1.0, boot)
    assert_close(adv, ref_discounted_returns(d["tok_r"], d["mask"], 0.9, d["boot"]["random"]))


def test_prompt_offset_mask_matches_reference():
    # mask 0 on a prompt prefix, 1 on a contiguous response, 0 on right padding.
    mask = np.array([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], np.float32)
    rng = np.random.default_rng(10)
    r = rng.normal(size=mask.shape).astype(np.float32)
    v = rng.normal(size=mask.shape).astype(np.float32)
    boot = np.array([0.0, 1.5, 2.0], np.float32)
    adv, ret = gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(mask), 0.9, 0.95, jnp.asarray(boot))
    ref_adv, ref_ret = ref_gae(r, v, mask, 0.9, 0.95, boot)
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)


# ----------------------------------------------------------------------------- zero-length responses, no NaN

def test_zero_length_rows_are_zero_and_finite():
    d = make_batch(11)
    mask = jnp.asarray(d["mask"])
    boot = jnp.asarray(d["boot"]["random"])  # even with a nonzero bootstrap on the empty row
    zero_rows = [b for b, n in enumerate(LENGTHS) if n == 0]
    outs = [
        outcome_to_token_rewards(jnp.asarray(d["outcome"]), mask),
        discounted_returns(jnp.asarray(d["outcome"]), mask, 0.9, boot),
        discounted_returns(jnp.asarray(d["tok_r"]), mask, 1.0, boot),
        *gae(jnp.asarray(d["tok_r"]), jnp.asarray(d["values"]), mask, 0.9, 0.95, boot),
        lambda_returns(jnp.asarray(d["outcome"]), jnp.asarray(d["values"]), mask, 1.0, 1.0, boot),
    ]
    for out in outs:
        out = np.asarray(out)
        assert np.all(np.isfinite(out))
        np.testing.assert_array_equal(out[zero_rows], 0.0)
        np.testing.assert_array_equal(out * (1 - d["mask"]), 0.0)  # 0 off the mask everywhere


def test_all_rows_empty_batch():
    mask = jnp.zeros((3, 4))
    r = jnp.ones((3,))
    v = jnp.ones((3, 4))
    for out in [outcome_to_token_rewards(r, mask), discounted_returns_j(r, mask, 0.9),
                *gae_j(jnp.ones((3, 4)), v, mask, 0.9, 0.95, jnp.ones((3,))), lambda_returns_j(r, v, mask)]:
        np.testing.assert_array_equal(np.asarray(out), np.zeros((3, 4)))


def test_gradients_finite_with_zero_length_rows():
    d = make_batch(12)
    mask = jnp.asarray(d["mask"])

    def f(values, rewards):
        adv, ret = gae(rewards, values, mask, 0.9, 0.95, jnp.asarray(d["boot"]["random"]))
        return jnp.sum(adv ** 2) + jnp.sum(ret)

    gv, gr = jax.jit(jax.grad(f, argnums=(0, 1)))(jnp.asarray(d["values"]), jnp.asarray(d["tok_r"]))
    assert np.all(np.isfinite(np.asarray(gv))) and np.all(np.isfinite(np.asarray(gr)))
    # nothing flows to padding / empty rows
    np.testing.assert_array_equal(np.asarray(gv) * (1 - d["mask"]), 0.0)
    np.testing.assert_array_equal(np.asarray(gr) * (1 - d["mask"]), 0.0)


# ----------------------------------------------------------------------------- bad input

def test_mismatched_shapes_raise():
    m = jnp.ones((3, 4))
    bad = (AssertionError, ValueError, TypeError)
    with pytest.raises(bad):
        outcome_to_token_rewards(jnp.ones((2,)), m)          # B mismatch
    with pytest.raises(bad):
        outcome_to_token_rewards(jnp.ones((3, 4)), m)        # rank of outcome rewards
    with pytest.raises(bad):
        as_token_rewards(jnp.ones((3, 5)), m)                # T mismatch
    with pytest.raises(bad):
        gae(jnp.ones((3, 4)), jnp.ones((3, 5)), m)           # values shape
    with pytest.raises(bad):
        gae(jnp.ones((3, 4)), jnp.ones((3, 4)), jnp.ones((2, 4)))  # mask shape
    with pytest.raises(bad):
        gae(jnp.ones((3, 4)), jnp.ones((3, 4)), m, bootstrap=jnp.ones((4,)))  # bootstrap shape
    with pytest.raises(bad):
        gae(jnp.ones((3, 4)), jnp.ones((3, 4)), m, bootstrap=jnp.ones((3, 1)))
    with pytest.raises(bad):
        gae(jnp.ones((3,)), jnp.ones((3,)), jnp.ones((3,)))  # rank 1
    with pytest.raises(bad):
        discounted_returns(jnp.ones((3, 5)), m)
    with pytest.raises(bad):
        discounted_returns(jnp.ones((4,)), m)
    with pytest.raises(bad):
        lambda_returns(jnp.ones((3,)), jnp.ones((3, 5)), m)


# ----------------------------------------------------------------------------- jit and vmap

def test_jit_matches_eager():
    d = make_batch(13)
    mask = jnp.asarray(d["mask"])
    tok_r, out_r, v = jnp.asarray(d["tok_r"]), jnp.asarray(d["outcome"]), jnp.asarray(d["values"])
    boot = jnp.asarray(d["boot"]["truncated"])
    gamma, lam = jnp.float32(0.9), jnp.float32(0.95)  # traced under jit
    cases = [
        (outcome_to_token_rewards, (out_r, mask)),
        (as_token_rewards, (out_r, mask)),
        (as_token_rewards, (tok_r, mask)),
        (discounted_returns, (tok_r, mask, gamma, boot)),
        (discounted_returns, (out_r, mask, gamma, boot)),
        (discounted_returns, (out_r, mask)),
        (gae, (tok_r, v, mask, gamma, lam, boot)),
        (gae, (tok_r, v, mask, gamma, lam)),
        (lambda_returns, (out_r, v, mask, gamma, lam, boot)),
    ]
    for fn, args in cases:
        eager = fn(*args)
        jitted = jax.jit(fn)(*args)
        chex.assert_trees_all_close(jitted, eager, rtol=1e-6, atol=1e-6)


def test_jit_gae_matches_reference():
    d = make_batch(14)
    adv, ret = jax.jit(gae)(jnp.asarray(d["tok_r"]), jnp.asarray(d["values"]), jnp.asarray(d["mask"]),
                            0.9, 0.95, jnp.asarray(d["boot"]["random"]))
    ref_adv, ref_ret = ref_gae(d["tok_r"], d["values"], d["mask"], 0.9, 0.95, d["boot"]["random"])
    assert_close(adv, ref_adv)
    assert_close(ret, ref_ret)


def test_vmap_over_stack_of_batches_equals_loop():
    n = 3
    batches = [make_batch(20 + i) for i in range(n)]
    # different masks per batch, too
    for i, bt in enumerate(batches):
        bt["mask"] = np.roll(bt["mask"], i, axis=0)
    stack = lambda key: jnp.stack([jnp.asarray(bt[key]) for bt in batches])  # noqa: E731
    mask, tok_r, out_r, v = stack("mask"), stack("tok_r"), stack("outcome"), stack("values")
    boot = jnp.stack([jnp.asarray(bt["boot"]["random"]) for bt in batches])

    vm_adv, vm_ret = jax.vmap(lambda r, vv, m, bb: gae(r, vv, m, 0.9, 0.95, bb))(tok_r, v, mask, boot)
    vm_g = jax.vmap(lambda r, m, bb: discounted_returns(r, m, 0.9, bb))(out_r, mask, boot)
    vm_lr = jax.vmap(lambda r, vv, m: lambda_returns(r, vv, m, 1.0, 0.95))(tok_r, v, mask)
    vm_tok = jax.vmap(outcome_to_token_rewards)(out_r, mask)
    for i in range(n):
        a, r = gae_j(tok_r[i], v[i], mask[i], 0.9, 0.95, boot[i])
        chex.assert_trees_all_close((vm_adv[i], vm_ret[i]), (a, r), rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(vm_g[i], discounted_returns_j(out_r[i], mask[i], 0.9, boot[i]),
                                    rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(vm_lr[i], lambda_returns_j(tok_r[i], v[i], mask[i], 1.0, 0.95),
                                    rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_equal(vm_tok[i], outcome_to_token_rewards(out_r[i], mask[i]))
        # and against the float64 reference
        ref_adv, ref_ret = ref_gae(batches[i]["tok_r"], batches[i]["values"], batches[i]["mask"], 0.9, 0.95,
                                   batches[i]["boot"]["random"])
        assert_close(vm_adv[i], ref_adv)
        assert_close(vm_ret[i], ref_ret)


def test_vmap_over_traced_gamma_and_lambda_equals_loop():
    d = make_batch(30)
    mask, r, v = jnp.asarray(d["mask"]), jnp.asarray(d["tok_r"]), jnp.asarray(d["values"])
    boot = jnp.asarray(d["boot"]["random"])
    grid = [(g, lam) for g in GAMMAS for lam in LAMS]
    gammas = jnp.array([g for g, _ in grid], jnp.float32)
    lams = jnp.array([lam for _, lam in grid], jnp.float32)

    vm_adv, vm_ret = jax.jit(jax.vmap(lambda g, lam: gae(r, v, mask, g, lam, boot)))(gammas, lams)
    vm_g = jax.vmap(lambda g: discounted_returns(jnp.asarray(d["outcome"]), mask, g, boot))(gammas)
    vm_lr = jax.vmap(lambda g, lam: lambda_returns(r, v, mask, g, lam))(gammas, lams)
    for i, (g, lam) in enumerate(grid):
        a, ret = gae_j(r, v, mask, g, lam, boot)
        chex.assert_trees_all_close((vm_adv[i], vm_ret[i]), (a, ret), rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(vm_lr[i], lambda_returns_j(r, v, mask, g, lam), rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(vm_g[i], discounted_returns_j(jnp.asarray(d["outcome"]), mask, g, boot),
                                    rtol=1e-6, atol=1e-6)
        ref_adv, ref_ret = ref_gae(d["tok_r"], d["values"], d["mask"], g, lam, d["boot"]["random"])
        assert_close(vm_adv[i], ref_adv)
        assert_close(vm_ret[i], ref_ret)


def test_vmap_over_hyperparameters_and_batches_nested():
    d0, d1 = make_batch(40), make_batch(41)
    r = jnp.stack([jnp.asarray(d0["tok_r"]), jnp.asarray(d1["tok_r"])])
    v = jnp.stack([jnp.asarray(d0["values"]), jnp.asarray(d1["values"])])
    m = jnp.stack([jnp.asarray(d0["mask"]), jnp.asarray(d1["mask"])])
    lams = jnp.array([1.0, 0.95, 0.0])
    f = jax.vmap(jax.vmap(lambda rr, vv, mm, lam: gae(rr, vv, mm, 0.9, lam)[0],
                          in_axes=(0, 0, 0, None)), in_axes=(None, None, None, 0))
    out = f(r, v, m, lams)
    assert out.shape == (3, 2) + d0["mask"].shape
    for i, lam in enumerate([1.0, 0.95, 0.0]):
        for j, dd in enumerate([d0, d1]):
            assert_close(out[i, j], ref_gae(dd["tok_r"], dd["values"], dd["mask"], 0.9, lam)[0])


# ----------------------------------------------------------------------------- dtypes (pgjax.core.dtypes rule)

def test_float64_inputs_stay_float64_under_x64(x64):
    # "compute in at least float32 but keep float64": with x64 on, float64 inputs give float64 results that
    # match the float64 reference to double precision.
    d = make_batch(80)
    f64 = lambda a: jnp.asarray(a, jnp.float64)  # noqa: E731
    mask, r, v, boot = f64(d["mask"]), f64(d["tok_r"]), f64(d["values"]), f64(d["boot"]["random"])
    adv, ret = gae(r, v, mask, 0.9, 0.95, boot)
    assert adv.dtype == ret.dtype == jnp.float64
    ref_adv, ref_ret = ref_gae(d["tok_r"], d["values"], d["mask"], 0.9, 0.95, d["boot"]["random"])
    np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(ret), ref_ret, rtol=1e-12, atol=1e-12)
    g = discounted_returns(f64(d["outcome"]), mask, 0.9)
    assert g.dtype == jnp.float64
    np.testing.assert_allclose(
        np.asarray(g), ref_discounted_returns(ref_outcome_to_token_rewards(d["outcome"], d["mask"]), d["mask"], 0.9),
        rtol=1e-12, atol=1e-12)


def test_bfloat16_inputs_are_upcast():
    d = make_batch(81)
    bf = lambda a: jnp.asarray(a, jnp.bfloat16)  # noqa: E731
    adv, ret = gae(bf(d["tok_r"]), bf(d["values"]), bf(d["mask"]), 0.9, 0.95)
    assert adv.dtype == ret.dtype == jnp.float32
    assert discounted_returns(bf(d["outcome"]), bf(d["mask"]), 0.9).dtype == jnp.float32
    # the computation itself runs in float32 on the bf16-rounded inputs
    r, v = np.asarray(bf(d["tok_r"]), np.float64), np.asarray(bf(d["values"]), np.float64)
    ref_adv, _ = ref_gae(r, v, d["mask"], 0.9, 0.95)
    assert_close(adv, ref_adv)


def test_gae_mixed_dtypes_under_x64_promote_instead_of_failing(x64):
    m = jnp.ones((2, 3))
    adv, ret = gae(jnp.ones((2, 3), jnp.float32), jnp.ones((2, 3), jnp.float64), m,
                   bootstrap=jnp.ones(2, jnp.float32), gamma=np.float64(0.9))
    assert adv.dtype == ret.dtype == jnp.float64
    # r = 1, V = 1 everywhere, bootstrap 1: delta = 1 + 0.9 - 1 = 0.9 at every step, lambda = 1
    np.testing.assert_allclose(np.asarray(adv[0]), [0.9 * (1 + 0.9 + 0.81), 0.9 * 1.9, 0.9], rtol=1e-12)


def test_lambda_returns_ignore_nan_values_in_padding():
    mask = jnp.asarray([[1.0, 1.0, 0.0]])
    values = jnp.asarray([[0.5, 0.5, jnp.nan]])
    ret = lambda_returns(jnp.asarray([1.0]), values, mask, 1.0, 0.9)
    # t=1: delta = 1 - 0.5, G = 1; t=0: delta = 0, A = 0.9 * 0.5, G = 0.45 + 0.5
    np.testing.assert_allclose(np.asarray(ret), [[0.95, 1.0, 0.0]], rtol=1e-6)


def test_a_gap_inside_the_response_is_skipped_not_an_episode_end():
    """Masked positions are not steps: the reward after a gap (e.g. a tool's output) reaches the
    tokens before it, discounted once per response token."""
    rewards = jnp.asarray([[0.0, 0.0, 0.0, 1.0]])
    mask = jnp.asarray([[1.0, 0.0, 1.0, 1.0]])
    np.testing.assert_allclose(np.asarray(discounted_returns(rewards, mask, 0.5)), [[0.25, 0.0, 0.5, 1.0]])
    values = jnp.asarray([[0.1, 9.0, 0.2, 0.3]])
    adv, _ = gae(rewards, values, mask, 1.0, 0.0)
    # one-step TD errors, where the step after token 0 is token 2 (value 0.2), not the gap's 9.0
    np.testing.assert_allclose(np.asarray(adv), [[0.2 - 0.1, 0.0, 0.3 - 0.2, 1.0 - 0.3]], rtol=1e-6)
