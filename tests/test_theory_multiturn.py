"""Multi-turn episodes as enumerable MDPs (pgjax.theory.multiturn): the episodes' probabilities under
the policy and the environment sum to 1; grad J and REINFORCE's expected gradient, with the
environment's tokens masked or wrongly included, against an independent NumPy enumeration (plain
loops over episodes, grad log softmax by hand); masked REINFORCE and RLOO unbiased in the policy's
parameters, tabular and shared, outcome and per-turn rewards; included ones biased."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax.theory import mdp as mdp_lib
from pgjax.theory import multiturn


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module", params=["outcome", "per_turn"])
def mdp(request):
    return multiturn.make_multiturn_mdp(vocab=3, horizon=2, turns=2, observations=2, prompts=2, reward=request.param)


def theta_for(shape, seed=1):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * 0.7, jnp.float64)


def numpy_reference(mdp, theta):
    """grad J and E[sum_t G_t grad log pi(token_t | s_t)] over the policy's actions (``masked``) and
    over the environment's tokens (``extra``: what including them adds), by loops over episodes."""
    theta = np.asarray(theta)
    grad, masked, extra = np.zeros_like(theta), np.zeros_like(theta), np.zeros_like(theta)
    for p in range(mdp.num_prompts):
        pi = np.exp(theta[p] - theta[p].max(1, keepdims=True))
        pi /= pi.sum(1, keepdims=True)
        for e in range(mdp.num_trajectories):
            actions = np.flatnonzero(mdp.mask[e])
            observations = np.flatnonzero(mdp.env_mask[e])
            probability = np.prod([pi[mdp.states[e, t], mdp.tokens[e, t]] for t in actions]) * np.exp(
                sum(mdp.env_logprobs[p, e, t] for t in observations))
            rewards = mdp.rewards[p, e]
            for positions, out, returns in ((actions, masked, True), (observations, extra, True),
                                            (actions, grad, False)):
                for t in positions:
                    score = -pi[mdp.states[e, t]].copy()
                    score[mdp.tokens[e, t]] += 1.0
                    weight = rewards[t:].sum() if returns else rewards.sum()
                    out[p, mdp.states[e, t]] += mdp.prompt_probs[p] * probability * weight * score
    return grad.reshape(-1), masked.reshape(-1), extra.reshape(-1)


def test_episode_probabilities_sum_to_one(mdp):
    policy = mdp_lib.tabular_policy(mdp)
    probabilities = np.exp(np.asarray(mdp_lib.step_logprobs(mdp, policy[0](theta_for(policy[1])))).sum(2))
    np.testing.assert_allclose(probabilities.sum(1), 1.0, atol=1e-12)
    assert mdp.num_trajectories == 7 * 2 * 7 and (mdp.mask * mdp.env_mask == 0).all()
    assert (mdp.env_mask.sum(1) == 1).all()                      # one observation between the two turns


def test_reinforce_masked_and_included_against_the_numpy_enumeration(mdp):
    policy = mdp_lib.tabular_policy(mdp)
    theta = theta_for(policy[1])
    grad, masked_mean, extra = numpy_reference(mdp, theta)
    masked = multiturn.masking_audit(mdp, policy, theta, "reinforce", {}, k=1, included=False)
    included = multiturn.masking_audit(mdp, policy, theta, "reinforce", {}, k=1, included=True)
    np.testing.assert_allclose(masked.true_grad, grad, atol=1e-12)
    np.testing.assert_allclose(masked_mean, grad, atol=1e-12)                # the reference is unbiased too
    np.testing.assert_allclose(masked.mean, grad, atol=1e-12)
    np.testing.assert_allclose(included.mean, grad + extra, atol=1e-12)
    assert np.linalg.norm(extra) > 0.05 * np.linalg.norm(grad)


@pytest.mark.parametrize("kind", ["tabular", "shared"])
@pytest.mark.parametrize("name", ["reinforce", "rloo"])
def test_masked_reinforce_and_rloo_are_unbiased_and_included_are_not(mdp, kind, name):
    policy = (mdp_lib.tabular_policy if kind == "tabular" else mdp_lib.shared_policy)(mdp)
    theta = theta_for(policy[1], seed=2)
    masked = multiturn.masking_audit(mdp, policy, theta, name, {}, k=2, included=False)
    assert masked.scale == pytest.approx(1.0, abs=1e-10) and masked.direction_bias < 1e-10
    included = multiturn.masking_audit(mdp, policy, theta, name, {}, k=2, included=True)
    assert included.direction_bias > 0.01


def test_grad_j_of_the_shared_policy_is_the_finite_difference_of_the_numpy_objective(mdp):
    """The objective as loops over episodes (policy and environment probabilities), differenced."""
    policy = mdp_lib.shared_policy(mdp)
    theta = np.asarray(theta_for(policy[1], seed=3))

    def objective(th):
        logits = np.asarray(policy[0](jnp.asarray(th)))
        total = 0.0
        for p in range(mdp.num_prompts):
            logpi = logits[p] - np.log(np.exp(logits[p]).sum(1, keepdims=True))
            for e in range(mdp.num_trajectories):
                logp = sum(logpi[mdp.states[e, t], mdp.tokens[e, t]] for t in np.flatnonzero(mdp.mask[e]))
                logp += mdp.env_logprobs[p, e].sum()
                total += mdp.prompt_probs[p] * np.exp(logp) * mdp.rewards[p, e].sum()
        return total

    audit = multiturn.masking_audit(mdp, policy, jnp.asarray(theta), "reinforce", {}, k=1, included=False)
    step = 1e-6
    for i in np.random.default_rng(0).choice(theta.size, 6, replace=False):
        bump = np.zeros_like(theta)
        bump[i] = step
        assert (objective(theta + bump) - objective(theta - bump)) / (2 * step) == pytest.approx(
            audit.true_grad[i], abs=1e-7)


def test_bad_settings_are_errors():
    with pytest.raises(ValueError, match="observations < vocab"):
        multiturn.make_multiturn_mdp(vocab=3, observations=3)
    with pytest.raises(ValueError, match="unknown reward kind"):
        multiturn.make_multiturn_mdp(reward="process")
