"""pgjax.core.reward_models against float64 NumPy references (log1p / exp written out), under jit
and vmap: the Bradley-Terry loss with margins and padding weights, its gradient sigma(-gap), the
pairwise wins with ties, the PRM's step classification loss and the step rewards it gives."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax import core


def np_bt(chosen, rejected, margin, weights):
    gap = chosen - rejected - margin
    per_pair = np.log1p(np.exp(-gap))
    return float(np.sum(weights * per_pair) / np.sum(weights))


def test_bradley_terry_loss_and_its_gradient_match_numpy():
    rng = np.random.default_rng(0)
    chosen, rejected, margin = rng.normal(size=8), rng.normal(size=8), rng.uniform(0, 1, size=8)
    weights = np.array([1, 1, 1, 1, 1, 1, 0, 0], float)
    got = jax.jit(core.bradley_terry_loss)(chosen, rejected, margin, weights)
    assert float(got) == pytest.approx(np_bt(chosen, rejected, margin, weights), rel=1e-6)
    assert float(core.bradley_terry_loss(chosen, rejected)) == pytest.approx(
        np_bt(chosen, rejected, 0.0, np.ones(8)), rel=1e-6)
    # d L / d s_i^+ = -w_i sigma(-(gap_i)) / sum w: pushes the chosen score up, never a padding pair's
    grad = jax.grad(core.bradley_terry_loss)(jnp.asarray(chosen), jnp.asarray(rejected), margin, weights)
    gap = chosen - rejected - margin
    np.testing.assert_allclose(grad, -weights / (1 + np.exp(gap)) / weights.sum(), rtol=1e-5, atol=1e-7)
    assert np.all(np.asarray(grad)[:6] < 0) and np.all(np.asarray(grad)[6:] == 0)


def test_bradley_terry_loss_stays_finite_at_huge_gaps_and_vmaps_over_margins():
    big = jnp.array([1e4, -1e4])
    assert np.isfinite(float(core.bradley_terry_loss(big, -big)))
    assert float(core.bradley_terry_loss(jnp.array([-1e4]), jnp.array([1e4]))) == pytest.approx(2e4)
    chosen, rejected = jnp.array([1.0, 0.5, -0.2]), jnp.array([0.0, 0.7, -0.4])
    margins = jnp.array([0.0, 0.5, 1.0])
    losses = jax.vmap(lambda m: core.bradley_terry_loss(chosen, rejected, m))(margins)
    for m, value in zip(np.asarray(margins), np.asarray(losses), strict=True):
        assert value == pytest.approx(np_bt(np.asarray(chosen), np.asarray(rejected), m, np.ones(3)), rel=1e-6)
    assert np.all(np.diff(np.asarray(losses)) > 0)             # a larger margin is harder to win


def test_pairwise_wins_count_a_tie_as_half_and_a_nan_as_nan():
    wins = core.pairwise_wins(jnp.array([1.0, 0.0, 2.0, jnp.nan]), jnp.array([0.0, 1.0, 2.0, 1.0]))
    np.testing.assert_array_equal(wins, [1.0, 0.0, 0.5, np.nan])


def test_step_classification_loss_matches_numpy():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 6)) * 3
    labels = rng.integers(0, 2, size=(3, 6)).astype(float)
    mask = np.zeros((3, 6))
    mask[0, [1, 4]] = mask[1, [5]] = mask[2, [0, 2, 3]] = 1
    p = 1 / (1 + np.exp(-logits))
    want = -np.sum(mask * (labels * np.log(p) + (1 - labels) * np.log(1 - p))) / mask.sum()
    assert float(jax.jit(core.step_classification_loss)(logits, labels, mask)) == pytest.approx(want, rel=1e-6)
    assert float(core.step_classification_loss(logits, labels, np.zeros((3, 6)))) == 0.0      # no step: 0, no NaN


def test_step_rewards_sit_on_the_step_boundaries():
    logits = jnp.array([[0.0, 2.0, -1.0, 3.0]])
    mask = jnp.array([[0.0, 1.0, 0.0, 1.0]])
    np.testing.assert_allclose(core.step_rewards(logits, mask), [[0, 1 / (1 + np.exp(-2)), 0, 1 / (1 + np.exp(-3))]],
                               rtol=1e-6)
    np.testing.assert_allclose(core.step_rewards(logits, mask, "logit"), [[0, 2, 0, 3]])
    with pytest.raises(ValueError, match="unknown step reward"):
        core.step_rewards(logits, mask, "sum")
