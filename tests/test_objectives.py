"""Tests of pgjax.core.objectives against float64 NumPy references written from the
formulas of the paper (eq. 15 clipped objective, eq. 16 modified ratio rho-hat) and
the docstrings (GSPO sequence ratio, CISPO truncated IS weight, KL k1/k2/k3, value loss).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax.core.objectives import (
    KL_ESTIMATORS,
    clipped_mask,
    clipped_objective,
    importance_ratio,
    kl_estimate,
    modified_ratio,
    on_policy_ratio,
    sequence_ratio,
    truncated_is_weight,
    value_loss,
)

B, T, V = 6, 7, 5

# (eps_low, eps_high, dual_clip): symmetric, clip-higher, dual clip, all together.
CLIP_SETTINGS = [(0.2, 0.2, 0.0), (0.2, 0.28, 0.0), (0.2, 0.2, 3.0), (0.1, 0.3, 1.5)]


@pytest.fixture
def f64():
    with jax.enable_x64(True):
        yield


# ----------------------------------------------------------------------------------------
# Independent NumPy references (float64), written case by case from eq. (15)/(16).


def np_clip_active(r, a, eps_low, eps_high, c):
    """1 where eq. (16) sets rho-hat to 0 (plus the dual clip: A < 0 and rho > c > 1)."""
    out = np.zeros(np.broadcast(r, a).shape)
    for idx in np.ndindex(out.shape):
        ri, ai = r[idx], a[idx]
        if ai > 0 and ri > 1 + eps_high:
            out[idx] = 1.0
        elif ai < 0 and ri < 1 - eps_low:
            out[idx] = 1.0
        elif c > 1 and ai < 0 and ri > c:
            out[idx] = 1.0
    return out


def np_clipped_objective(r, a, eps_low, eps_high, c):
    """Eq. (15) piecewise: the value of min(rho A, clip(rho) A) (then max(., c A) for A < 0)."""
    out = np.zeros(np.broadcast(r, a).shape)
    for idx in np.ndindex(out.shape):
        ri, ai = r[idx], a[idx]
        if ai > 0:
            out[idx] = min(ri, 1 + eps_high) * ai
        elif ai < 0:
            v = max(ri, 1 - eps_low) * ai          # min(rho A, clip(rho) A) for A < 0
            if c > 1:
                v = max(v, c * ai)
            out[idx] = v
        else:
            out[idx] = 0.0
    return out


def np_log_softmax(theta):
    z = theta - theta.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def token_logp(theta, taken):
    """logp_bt = log_softmax(theta_bt)[taken_bt]: log-probs as a function of parameters."""
    return jnp.take_along_axis(jax.nn.log_softmax(theta, -1), taken[..., None], -1)[..., 0]


def random_inputs(seed, shape=(B, T), scale=0.6):
    """Ratios spread inside and outside [1 - eps, 1 + eps] (and above c = 3), advantages with
    A > 0, A < 0 and A = 0 exactly."""
    rng = np.random.default_rng(seed)
    r = np.exp(rng.normal(scale=scale, size=shape))
    a = rng.normal(size=shape)
    a[rng.random(shape) < 0.15] = 0.0
    return r, a


def coverage(r, a, eps_low, eps_high, c):
    """Count each regime so tests can assert that random inputs exercise all of them."""
    return dict(
        upper=np.sum((a > 0) & (r > 1 + eps_high)),
        lower=np.sum((a < 0) & (r < 1 - eps_low)),
        dual=np.sum((a < 0) & (r > c)) if c > 1 else 1,
        inside=np.sum((r > 1 - eps_low) & (r < 1 + eps_high) & (a != 0)),
        zero=np.sum(a == 0),
        outside_unclipped=np.sum(((a > 0) & (r < 1 - eps_low)) | ((a < 0) & (r > 1 + eps_high)
                                                                  & ((c <= 1) | (r < c)))),
    )


# ----------------------------------------------------------------------------------------
# Hand-computed examples.


@pytest.mark.parametrize(
    "rho, adv, eps_low, eps_high, c, objective, rho_hat",
    [
        (1.5, 2.0, 0.2, 0.2, 0.0, 2.4, 0.0),      # A > 0, rho > 1 + eps: clipped at 1.2 * 2
        (1.1, 2.0, 0.2, 0.2, 0.0, 2.2, 1.1),      # inside the trust region
        (0.5, 2.0, 0.2, 0.2, 0.0, 1.0, 0.5),      # A > 0, rho < 1 - eps: not clipped (min picks rho A)
        (0.5, -1.0, 0.2, 0.2, 0.0, -0.8, 0.0),    # A < 0, rho < 1 - eps: clipped at 0.8 * (-1)
        (1.5, -1.0, 0.2, 0.2, 0.0, -1.5, 1.5),    # A < 0, rho > 1 + eps: not clipped (no dual clip)
        (1.25, 1.0, 0.2, 0.28, 0.0, 1.25, 1.25),  # clip-higher: 1.25 < 1.28 is inside
        (1.25, 1.0, 0.2, 0.2, 0.0, 1.2, 0.0),     # ... but clipped with symmetric eps
        (0.75, -2.0, 0.2, 0.28, 0.0, -1.6, 0.0),  # eps_low = 0.2 still clips below 0.8
        (3.5, -1.0, 0.2, 0.2, 3.0, -3.0, 0.0),    # dual clip: max(-3.5, 3 * -1) = -3
        (2.5, -1.0, 0.2, 0.2, 3.0, -2.5, 2.5),    # rho < c: dual clip inactive
        (3.5, 1.0, 0.2, 0.2, 3.0, 1.2, 0.0),      # dual clip only concerns A < 0
        (3.5, 0.0, 0.2, 0.2, 3.0, 0.0, 3.5),      # A = 0: objective 0, rho-hat = rho
    ],
)
def test_hand_computed_clipped_objective_and_rho_hat(rho, adv, eps_low, eps_high, c, objective, rho_hat):
    r, a = jnp.array([[rho]]), jnp.array([[adv]])
    np.testing.assert_allclose(clipped_objective(r, a, eps_low, eps_high, c), [[objective]], rtol=1e-6)
    np.testing.assert_allclose(modified_ratio(r, a, eps_low, eps_high, c), [[rho_hat]], rtol=1e-6)
    expected_mask = 1.0 if (rho_hat == 0.0) else 0.0
    np.testing.assert_array_equal(clipped_mask(r, a, eps_low, eps_high, c), [[expected_mask]])


def test_hand_computed_ratios_kl_value_loss():
    # importance ratio: exp(log 3 - log 2) = 1.5
    np.testing.assert_allclose(importance_ratio(jnp.log(jnp.array([[3.0]])), jnp.log(jnp.array([[2.0]]))),
                               [[1.5]], rtol=1e-6)
    # KL with logp = log 0.5, ref_logp = log 0.25: log r = -log 2
    lp, ref = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
    ln2 = np.log(2.0)
    np.testing.assert_allclose(kl_estimate(lp, ref, "k1"), [[ln2]], rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(lp, ref, "k2"), [[0.5 * ln2 ** 2]], rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(lp, ref, "k3"), [[0.5 - 1.0 + ln2]], rtol=1e-5)
    # value loss: V = 1, G = 0, V_old = 0, eps = 0.2 -> max(1, 0.04) / 2 = 0.5
    v, g, vo = jnp.array([[1.0, 0.1]]), jnp.array([[0.0, 0.0]]), jnp.array([[0.0, 1.0]])
    np.testing.assert_allclose(value_loss(v, vo, g), [[0.5, 0.005]], rtol=1e-6)
    # second entry: V = 0.1, V_old = 1 -> clipped 1 - 0.2 = 0.8 -> max(0.01, 0.64) / 2 = 0.32
    np.testing.assert_allclose(value_loss(v, vo, g, 0.2), [[0.5, 0.32]], rtol=1e-6)
    # truncated IS weight: min(1.5, 1.28) = 1.28, min(0.5, 1.28) = 0.5
    np.testing.assert_allclose(truncated_is_weight(jnp.array([[1.5, 0.5]]), 0.28), [[1.28, 0.5]], rtol=1e-6)
    # GSPO: row logp - old = [0.2, 0.4, junk], mask [1, 1, 0] -> s = exp(0.3) on every token
    s = sequence_ratio(jnp.array([[0.2, 0.4, 5.0]]), jnp.zeros((1, 3)), jnp.array([[1.0, 1.0, 0.0]]))
    np.testing.assert_allclose(s, np.full((1, 3), np.exp(0.3)), rtol=1e-6)


# ----------------------------------------------------------------------------------------
# Random inputs against the NumPy references (float64).


@pytest.mark.parametrize("eps_low, eps_high, c", CLIP_SETTINGS)
def test_clipped_objective_mask_and_rho_hat_match_reference(f64, eps_low, eps_high, c):
    r, a = random_inputs(0, shape=(40, 30), scale=0.8)
    cov = coverage(r, a, eps_low, eps_high, c)
    assert all(n > 0 for n in cov.values()), cov
    jr, ja = jnp.asarray(r), jnp.asarray(a)
    active = np_clip_active(r, a, eps_low, eps_high, c)
    np.testing.assert_allclose(clipped_objective(jr, ja, eps_low, eps_high, c),
                               np_clipped_objective(r, a, eps_low, eps_high, c), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(clipped_mask(jr, ja, eps_low, eps_high, c), active)
    np.testing.assert_allclose(modified_ratio(jr, ja, eps_low, eps_high, c), r * (1 - active),
                               rtol=1e-12, atol=0)
    # eq. (16): rho-hat A has the same gradient as eq. (15); where not clipped their values agree too.
    np.testing.assert_allclose(np.where(active == 0, r * a, 0.0),
                               np.where(active == 0, np_clipped_objective(r, a, eps_low, eps_high, c), 0.0),
                               rtol=1e-12, atol=1e-12)


def test_clipped_mask_stops_gradient_and_matches_in_float32():
    r, a = random_inputs(1)
    jr, ja = jnp.asarray(r, jnp.float32), jnp.asarray(a, jnp.float32)
    g = jax.grad(lambda x: jnp.sum(clipped_mask(x, ja, 0.2, 0.28, 3.0)))(jr)
    np.testing.assert_array_equal(g, np.zeros_like(r))
    np.testing.assert_array_equal(clipped_mask(jr, ja, 0.2, 0.28, 3.0), np_clip_active(r, a, 0.2, 0.28, 3.0))
    np.testing.assert_allclose(clipped_objective(jr, ja, 0.2, 0.28, 3.0),
                               np_clipped_objective(r, a, 0.2, 0.28, 3.0), rtol=1e-6, atol=1e-6)


def test_importance_ratio_value_and_gradient(f64):
    rng = np.random.default_rng(2)
    lp, old = rng.normal(size=(B, T)) - 2, rng.normal(size=(B, T)) - 2
    rho = np.exp(lp - old)
    np.testing.assert_allclose(importance_ratio(jnp.asarray(lp), jnp.asarray(old)), rho, rtol=1e-12)
    g = jax.grad(lambda x: jnp.sum(importance_ratio(x, jnp.asarray(old))))(jnp.asarray(lp))
    np.testing.assert_allclose(g, rho, rtol=1e-12)   # d rho / d logp = rho


def np_sequence_ratio(lp, old, m):
    length = np.maximum(m.sum(1), 1.0)
    s = np.exp(((lp - old) * m).sum(1) / length)
    return np.broadcast_to(s[:, None], lp.shape), s


def _mask_with_lengths(lengths, t):
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float64)


def test_sequence_ratio_value_and_token_gradient(f64):
    rng = np.random.default_rng(3)
    theta = rng.normal(size=(B, T, V))
    taken = rng.integers(0, V, size=(B, T))
    old = np_log_softmax(theta + rng.normal(scale=0.4, size=theta.shape))
    old = np.take_along_axis(old, taken[..., None], -1)[..., 0]
    m = _mask_with_lengths([0, T, 3, 1, 5, 6], T)         # includes an empty and a full response
    a = rng.normal(size=(B, T))
    jt, jtaken, jold, jm, ja = map(jnp.asarray, (theta, taken, old, m, a))

    lp = np.take_along_axis(np_log_softmax(theta), taken[..., None], -1)[..., 0]
    expected, s = np_sequence_ratio(lp, old, m)
    value = sequence_ratio(token_logp(jt, jtaken), jold, jm)
    np.testing.assert_allclose(value, expected, rtol=1e-12)   # s_b on every token of row b
    assert np.all(np.isfinite(value)) and np.allclose(value[0], 1.0)   # empty row: exp(0)

    # d s_bt / d logp_b't' = s_b if (b, t) == (b', t') else 0 (token gradient, not the sequence's).
    jac = jax.jacrev(lambda x: sequence_ratio(x, jold, jm))(jnp.asarray(lp))
    expected_jac = np.zeros((B, T, B, T))
    for b in range(B):
        for t in range(T):
            expected_jac[b, t, b, t] = s[b]
    np.testing.assert_allclose(jac, expected_jac, rtol=1e-12, atol=1e-12)

    # Through parameters: grad sum m A s_bt = sum m A s_b (onehot - softmax).
    g = jax.grad(lambda th: jnp.sum(sequence_ratio(token_logp(th, jtaken), jold, jm) * ja * jm))(jt)
    p = np.exp(np_log_softmax(theta))
    onehot = np.eye(V)[taken]
    expected_g = (m * a * s[:, None])[..., None] * (onehot - p)
    np.testing.assert_allclose(g, expected_g, rtol=1e-10, atol=1e-12)


def test_truncated_is_weight_value_and_no_gradient(f64):
    r, a = random_inputs(4)
    for eps_high in (0.0, 0.28, 1.0):
        np.testing.assert_allclose(truncated_is_weight(jnp.asarray(r), eps_high), np.minimum(r, 1 + eps_high),
                                   rtol=1e-12)
    rng = np.random.default_rng(4)
    lp, old = rng.normal(size=(B, T)), rng.normal(size=(B, T))
    jold, ja = jnp.asarray(old), jnp.asarray(a)
    g = jax.grad(lambda x: jnp.sum(truncated_is_weight(importance_ratio(x, jold), 0.28)))(jnp.asarray(lp))
    np.testing.assert_array_equal(g, np.zeros_like(lp))
    # CISPO per-token objective sg(min(rho, 1 + eps)) A log pi: every token keeps a gradient.
    g = jax.grad(lambda x: jnp.sum(truncated_is_weight(importance_ratio(x, jold), 0.28) * ja * x))(
        jnp.asarray(lp))
    np.testing.assert_allclose(g, np.minimum(np.exp(lp - old), 1.28) * a, rtol=1e-12)


def np_kl(lp, ref, estimator):
    log_r = ref - lp
    return {"k1": -log_r, "k2": 0.5 * log_r ** 2, "k3": (np.exp(log_r) - 1.0) - log_r}[estimator]


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_estimate_matches_reference(f64, estimator):
    rng = np.random.default_rng(5)
    lp, ref = rng.normal(size=(B, T)) - 1, rng.normal(size=(B, T)) - 1
    np.testing.assert_allclose(kl_estimate(jnp.asarray(lp), jnp.asarray(ref), estimator),
                               np_kl(lp, ref, estimator), rtol=1e-12, atol=1e-14)


def test_kl_k1_k3_unbiased_by_enumeration(f64):
    """sum_a p(a) k(a) == KL(p || q) exactly for k1 and k3; k2 is biased."""
    rng = np.random.default_rng(6)
    for n in (2, 5, 11):
        p, q = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(n))
        kl = np.sum(p * np.log(p / q))
        lp, ref = jnp.asarray(np.log(p))[None], jnp.asarray(np.log(q))[None]
        for est in ("k1", "k3"):
            np.testing.assert_allclose(np.sum(p * np.asarray(kl_estimate(lp, ref, est))[0]), kl, rtol=1e-10)
        assert abs(np.sum(p * np.asarray(kl_estimate(lp, ref, "k2"))[0]) - kl) > 1e-6


def test_kl_k2_k3_nonnegative_k1_can_be_negative():
    rng = np.random.default_rng(7)
    lp = rng.normal(scale=3.0, size=(50, 40)).astype(np.float32)
    ref = (lp + rng.normal(scale=3.0, size=lp.shape) * rng.choice([1e-7, 1e-3, 1.0, 5.0], size=lp.shape)
           ).astype(np.float32)
    jl, jr = jnp.asarray(lp), jnp.asarray(ref)
    assert np.all(np.asarray(kl_estimate(jl, jr, "k3")) >= 0)
    assert np.all(np.asarray(kl_estimate(jl, jr, "k2")) >= 0)
    assert np.any(np.asarray(kl_estimate(jl, jr, "k1")) < 0)
    np.testing.assert_array_equal(kl_estimate(jl, jl, "k3"), np.zeros_like(lp))


def test_unknown_kl_estimator_raises():
    x = jnp.zeros((2, 3))
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(x, x, "k4")
    with pytest.raises(ValueError, match="K1"):
        kl_estimate(x, x, "K1")


@pytest.mark.parametrize("clip_eps", [0.0, 0.2, 0.5])
def test_value_loss_matches_reference(f64, clip_eps):
    rng = np.random.default_rng(8)
    v, vo, g = (rng.normal(size=(B, T)) for _ in range(3))
    plain = 0.5 * (v - g) ** 2
    if clip_eps > 0:
        v_clip = vo + np.clip(v - vo, -clip_eps, clip_eps)
        expected = 0.5 * np.maximum((v - g) ** 2, (v_clip - g) ** 2)
        assert np.any(expected > plain)   # the clipped branch matters somewhere
    else:
        expected = plain
    np.testing.assert_allclose(value_loss(*map(jnp.asarray, (v, vo, g)), clip_eps), expected, rtol=1e-12)
    # gradient of the plain loss is V - G
    if clip_eps == 0.0:
        grad = jax.grad(lambda x: jnp.sum(value_loss(x, jnp.asarray(vo), jnp.asarray(g))))(jnp.asarray(v))
        np.testing.assert_allclose(grad, v - g, rtol=1e-12)


def test_bfloat16_inputs_computed_in_at_least_float32():
    lp = jnp.full((2, 3), -1.0, jnp.bfloat16)
    assert importance_ratio(lp, lp - 0.01).dtype == jnp.float32
    assert kl_estimate(lp, lp - 0.01, "k3").dtype == jnp.float32


def test_mismatched_shapes_raise():
    a, b = jnp.zeros((2, 3)), jnp.zeros((2, 4))
    errors = (AssertionError, ValueError)
    with pytest.raises(errors):
        importance_ratio(a, b)
    with pytest.raises(errors):
        sequence_ratio(a, a, b)
    with pytest.raises(errors):
        sequence_ratio(a, b, a)
    with pytest.raises(errors):
        kl_estimate(a, b, "k3")
    with pytest.raises(errors):
        value_loss(a, a, b)


# ----------------------------------------------------------------------------------------
# The paper's identity: grad (rho-hat A) == grad of eq. (15).


def _params_and_data(seed, old_scale=0.7):
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(B, T, V))
    taken = rng.integers(0, V, size=(B, T))
    theta_old = theta + rng.normal(scale=old_scale, size=theta.shape)
    a = rng.normal(size=(B, T))
    a[rng.random((B, T)) < 0.15] = 0.0
    return theta, taken, theta_old, a


@pytest.mark.parametrize("eps_low, eps_high, c", CLIP_SETTINGS)
@pytest.mark.parametrize("seed", [10, 11])
def test_grad_modified_ratio_equals_grad_clipped_objective(f64, seed, eps_low, eps_high, c):
    theta, taken, theta_old, a = _params_and_data(seed)
    jt, jtaken, ja = jnp.asarray(theta), jnp.asarray(taken), jnp.asarray(a)
    old = token_logp(jnp.asarray(theta_old), jtaken)
    ratio = lambda th: importance_ratio(token_logp(th, jtaken), old)  # noqa: E731
    j_hat = lambda th: jnp.sum(modified_ratio(ratio(th), ja, eps_low, eps_high, c) * ja)  # noqa: E731
    j_ppo = lambda th: jnp.sum(clipped_objective(ratio(th), ja, eps_low, eps_high, c))  # noqa: E731
    g_hat, g_ppo = jax.grad(j_hat)(jt), jax.grad(j_ppo)(jt)
    np.testing.assert_allclose(g_hat, g_ppo, rtol=1e-6, atol=1e-6)

    # Independent closed form: unclipped tokens contribute rho A (onehot - softmax), clipped ones 0.
    r = np.exp(np.take_along_axis(np_log_softmax(theta), taken[..., None], -1)[..., 0] - np.asarray(old))
    active = np_clip_active(r, a, eps_low, eps_high, c)
    assert 0 < active.sum() < active.size
    expected = ((1 - active) * r * a)[..., None] * (np.eye(V)[taken] - np.exp(np_log_softmax(theta)))
    np.testing.assert_allclose(g_ppo, expected, rtol=1e-6, atol=1e-10)
    assert np.abs(g_ppo).max() > 1e-3


def test_dual_clip_zeroes_gradient_of_large_ratios(f64):
    """With c = 3, A < 0 tokens whose ratio exceeds 3 get no gradient; without it they do."""
    rng = np.random.default_rng(12)
    lp = jnp.asarray(rng.normal(size=(B, T)))
    old = lp - jnp.asarray(rng.uniform(1.5, 2.0, size=(B, T)))     # rho in (4.5, 7.4)
    a = -jnp.abs(jnp.asarray(rng.normal(size=(B, T)))) - 0.1
    f = lambda x, c: jnp.sum(clipped_objective(importance_ratio(x, old), a, 0.2, 0.2, c))  # noqa: E731
    np.testing.assert_array_equal(jax.grad(f)(lp, 3.0), np.zeros((B, T)))
    np.testing.assert_allclose(jax.grad(f)(lp, 0.0), np.exp(lp - old) * a, rtol=1e-12)


@pytest.mark.parametrize("eps_low, eps_high, c", CLIP_SETTINGS)
def test_on_policy_ratio_and_ppo_at_theta_old_is_reinforce(f64, eps_low, eps_high, c):
    theta, taken, _, a = _params_and_data(13)
    jt, jtaken, ja = jnp.asarray(theta), jnp.asarray(taken), jnp.asarray(a)
    logp = lambda th: token_logp(th, jtaken)  # noqa: E731
    np.testing.assert_array_equal(on_policy_ratio(logp(jt)), np.ones((B, T)))
    g_reinforce = jax.grad(lambda th: jnp.sum(ja * logp(th)))(jt)
    assert np.abs(g_reinforce).max() > 1e-3
    g_on = jax.grad(lambda th: jnp.sum(on_policy_ratio(logp(th)) * ja))(jt)
    np.testing.assert_allclose(g_on, g_reinforce, rtol=1e-12, atol=1e-14)

    def ppo(th):
        lp = logp(th)
        rho = importance_ratio(lp, jax.lax.stop_gradient(lp))
        return jnp.sum(modified_ratio(rho, ja, eps_low, eps_high, c) * ja)

    np.testing.assert_allclose(jax.grad(ppo)(jt), g_reinforce, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ppo(jt), np.sum(a), rtol=1e-12)


# ----------------------------------------------------------------------------------------
# jit and vmap equal eager loops.


def test_jit_equals_eager():
    r, a = random_inputs(14)
    jr, ja = jnp.asarray(r, jnp.float32), jnp.asarray(a, jnp.float32)
    lp, old = jnp.log(jr), jnp.zeros_like(jr)
    m = jnp.asarray(_mask_with_lengths([0, 7, 3, 2, 5, 1], T), jnp.float32)
    for fn, args in [
        (clipped_objective, (jr, ja, 0.2, 0.28, 3.0)),
        (modified_ratio, (jr, ja, 0.2, 0.28, 3.0)),
        (clipped_mask, (jr, ja, 0.2, 0.28, 3.0)),
        (importance_ratio, (lp, old)),
        (sequence_ratio, (lp, old, m)),
        (truncated_is_weight, (jr, 0.28)),
        (value_loss, (jr, ja, lp, 0.2)),
        (on_policy_ratio, (lp,)),
    ]:
        np.testing.assert_allclose(jax.jit(fn)(*args), fn(*args), rtol=1e-6, atol=1e-7, err_msg=fn.__name__)
    for est in KL_ESTIMATORS:
        np.testing.assert_allclose(jax.jit(kl_estimate, static_argnames="estimator")(lp, old, estimator=est),
                                   kl_estimate(lp, old, est), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("fn", [clipped_objective, modified_ratio, clipped_mask])
def test_vmap_over_eps_and_dual_clip_equals_loop(fn):
    r, a = random_inputs(15, scale=0.8)
    jr, ja = jnp.asarray(r, jnp.float32), jnp.asarray(a, jnp.float32)
    eps_low = np.array([0.0, 0.1, 0.2, 0.3], np.float32)
    eps_high = np.array([0.2, 0.28, 0.2, 0.5], np.float32)
    duals = np.array([0.0, 1.5, 3.0, 0.5], np.float32)   # 0 and 0.5 disable the dual clip
    batched = jax.jit(jax.vmap(lambda el, eh, c: fn(jr, ja, el, eh, c)))(eps_low, eps_high, duals)
    looped = np.stack([fn(jr, ja, float(el), float(eh), float(c))
                       for el, eh, c in zip(eps_low, eps_high, duals, strict=True)])
    np.testing.assert_allclose(batched, looped, rtol=1e-6, atol=1e-7)
    # the settings give different results, so the vmap really sweeps them
    assert len({np.asarray(x).tobytes() for x in looped}) == len(eps_low)
    # vmap over the dual clip alone
    batched = jax.vmap(lambda c: fn(jr, ja, 0.2, 0.2, c))(duals)
    looped = np.stack([fn(jr, ja, 0.2, 0.2, float(c)) for c in duals])
    np.testing.assert_allclose(batched, looped, rtol=1e-6, atol=1e-7)


def test_vmap_over_value_clip_and_truncation_equals_loop():
    rng = np.random.default_rng(16)
    v, vo, g = (jnp.asarray(rng.normal(size=(B, T)), jnp.float32) for _ in range(3))
    eps = np.array([0.0, 0.1, 0.2, 1.0], np.float32)
    np.testing.assert_allclose(jax.vmap(lambda e: value_loss(v, vo, g, e))(eps),
                               np.stack([value_loss(v, vo, g, float(e)) for e in eps]), rtol=1e-6)
    r = jnp.exp(v)
    np.testing.assert_allclose(jax.vmap(lambda e: truncated_is_weight(r, e))(eps),
                               np.stack([truncated_is_weight(r, float(e)) for e in eps]), rtol=1e-6)


def test_vmap_grad_identity_over_settings(f64):
    """vmap over a grid of (eps_low, eps_high, c) of the gradient identity."""
    theta, taken, theta_old, a = _params_and_data(17)
    jt, jtaken, ja = jnp.asarray(theta), jnp.asarray(taken), jnp.asarray(a)
    old = token_logp(jnp.asarray(theta_old), jtaken)
    ratio = lambda th: importance_ratio(token_logp(th, jtaken), old)  # noqa: E731
    grid = jnp.asarray(np.array(CLIP_SETTINGS))

    def grads(s):
        el, eh, c = s[0], s[1], s[2]
        g_hat = jax.grad(lambda th: jnp.sum(modified_ratio(ratio(th), ja, el, eh, c) * ja))(jt)
        g_ppo = jax.grad(lambda th: jnp.sum(clipped_objective(ratio(th), ja, el, eh, c)))(jt)
        return g_hat, g_ppo

    g_hat, g_ppo = jax.jit(jax.vmap(grads))(grid)
    np.testing.assert_allclose(g_hat, g_ppo, rtol=1e-6, atol=1e-6)
    for i, (el, eh, c) in enumerate(CLIP_SETTINGS):
        np.testing.assert_allclose(g_ppo[i], grads(jnp.asarray([el, eh, c]))[1], rtol=1e-10, atol=1e-12)
