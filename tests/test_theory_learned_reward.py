"""A learned reward r-hat = r + e, exactly (pgjax.theory.learned_reward): each error kind against its
definition; tabular logits that reproduce any trajectory distribution; the closed-form KL optimum
against its maximum beta log Z and random rivals; the library's REINFORCE with the k1 KL in the
reward unbiased for grad (J-hat - beta KL) (an autodiff of the exact regularised objective); every
unbiased estimator's cosine with the true grad J is grad J-hat's; and the over-optimisation an
exploitable error causes: the true J of the optimum rises, peaks and falls as beta shrinks."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax import core
from pgjax.theory import audit as audit_lib
from pgjax.theory import learned_reward as lr
from pgjax.theory import mdp as mdp_lib

pytestmark = pytest.mark.usefixtures("x64")          # conftest's: float64, as the audits compute


@pytest.fixture(scope="module")
def mdp():
    return mdp_lib.make_mdp(vocab=3, horizon=3, prompts=2, reward="outcome", seed=0)


def random_theta(shape, seed=1, scale=0.5):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale, jnp.float64)


def test_each_error_kind_is_its_definition(mdp):
    length = lr.reward_error(mdp, "length", 1.5)
    for n in range(mdp.num_trajectories):                       # (|tau| - 1) / (H - 1), by hand
        assert length[1, n] == pytest.approx(1.5 * (int(mdp.mask[n].sum()) - 1) / 2)
    exploit = lr.reward_error(mdp, "exploit", 2.0, seed=3)
    for p in range(mdp.num_prompts):
        (hacked,) = np.flatnonzero(exploit[p])
        assert exploit[p, hacked] == 2.0 and mdp.outcome_rewards[p, hacked] == 0
    noise = lr.reward_error(mdp, "noise", 0.5, seed=4)
    assert np.array_equal(noise, lr.reward_error(mdp, "noise", 0.5, seed=4)) and 0.3 < noise.std() < 0.7
    learned = lr.learned_mdp(mdp, noise)
    np.testing.assert_allclose(learned.outcome_rewards, mdp.outcome_rewards + noise)
    assert np.count_nonzero(learned.rewards * (1 - mdp.mask)[None]) == 0       # only on response tokens


@pytest.mark.parametrize("call, message", [
    (lambda m: lr.reward_error(m, "bribe", 1.0), "unknown error kind"),
    (lambda m: lr.reward_error(m, "noise", -1.0), "scale must be >= 0"),
    (lambda m: lr.reward_error(m, "noise", float("nan")), "scale must be >= 0"),
    (lambda m: lr.learned_mdp(m, np.zeros((1, 2))), "of shape"),
    (lambda m: lr.learned_mdp(m, np.full((2, m.num_trajectories), np.inf)), "finite"),
    (lambda m: lr.kl_optimum(np.full((1, 2), 0.5), np.zeros((1, 2)), 0.0), "beta must be > 0"),
    (lambda m: lr.tabular_logits(m, np.zeros((2, m.num_trajectories))), "probability > 0"),
])
def test_bad_input_is_refused(mdp, call, message):
    with pytest.raises(ValueError, match=message):
        call(mdp)


def test_tabular_logits_reproduce_any_trajectory_distribution(mdp):
    probs = np.random.default_rng(0).dirichlet(np.ones(mdp.num_trajectories), size=mdp.num_prompts)
    np.testing.assert_allclose(lr.trajectory_probs(mdp, jnp.asarray(lr.tabular_logits(mdp, probs))), probs,
                               rtol=1e-10)


@pytest.mark.parametrize("beta", [3.0, 0.3, 0.05])
def test_the_kl_optimum_attains_beta_log_z_and_beats_random_rivals(beta):
    """max_pi E_pi[r] - beta KL(pi || pi_ref) = beta log sum_tau pi_ref(tau) exp(r(tau) / beta)."""
    rng = np.random.default_rng(1)
    reference, rewards = rng.dirichlet(np.ones(7), size=2), rng.normal(size=(2, 7))

    def value(pi):
        return (pi * rewards).sum(1) - beta * (pi * np.log(pi / reference)).sum(1)
    optimum = lr.kl_optimum(reference, rewards, beta)
    np.testing.assert_allclose(value(optimum), beta * np.log((reference * np.exp(rewards / beta)).sum(1)), rtol=1e-10)
    for _ in range(200):
        rival = rng.dirichlet(np.ones(7) * rng.choice([0.3, 1.0, 5.0]), size=2)
        assert np.all(value(rival) <= value(optimum) + 1e-12)
    near = optimum * np.exp(1e-3 * rng.normal(size=optimum.shape))
    assert np.all(value(near / near.sum(1, keepdims=True)) <= value(optimum) + 1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.2, 1.0])
def test_reinforce_with_the_k1_kl_in_the_reward_follows_the_regularised_objective(mdp, beta):
    """E[g] of the library's REINFORCE loss, k1 KL in the reward against pi_ref != pi, equals
    grad [J-hat(theta) - beta KL(pi_theta || pi_ref)], the exact sequence-level objective differentiated."""
    learned = lr.learned_mdp(mdp, lr.reward_error(mdp, "noise", 0.7, seed=2))
    policy = mdp_lib.tabular_policy(mdp)
    theta, reference_theta = random_theta(policy[1], 1), random_theta(policy[1], 5)
    algo = core.preset("reinforce")
    algo = dataclasses.replace(algo, spec=dataclasses.replace(algo.spec, kl_placement="reward", kl_estimator="k1"))
    result = audit_lib.audit(learned, policy, theta, algo, algo.hparams.replace(kl_coef=beta), k=1,
                             reference_logits=reference_theta)

    def regularised(th):
        logp = jnp.sum(mdp_lib.trajectory_logprobs(mdp, th), axis=2)                 # [P, N]
        ref = jnp.sum(mdp_lib.trajectory_logprobs(mdp, reference_theta), axis=2)
        per_prompt = jnp.sum(jnp.exp(logp) * (learned.outcome_rewards - beta * (logp - ref)), axis=1)
        return jnp.sum(jnp.asarray(mdp.prompt_probs) * per_prompt)
    np.testing.assert_allclose(result.mean, np.asarray(jax.grad(regularised)(theta)).reshape(-1), atol=1e-12)


def test_an_unbiased_estimator_follows_grad_j_hat_whose_cosine_with_grad_j_the_error_sets(mdp):
    error = lr.reward_error(mdp, "length", 1.5)
    learned = lr.learned_mdp(mdp, error)
    policy = mdp_lib.tabular_policy(mdp)
    theta = random_theta(policy[1])
    hat, true = lr._gradient(learned, policy, theta), lr._gradient(mdp, policy, theta)
    rloo = audit_lib.audit(learned, policy, theta, core.preset("rloo"), k=2)
    np.testing.assert_allclose(rloo.mean, hat, atol=1e-12)
    assert lr._cosine(hat, true) < 0.99
    table = lr.gradient_table(mdp, error, policy, theta, k=2)
    cosine = f"{lr._cosine(hat, true):.4f}"
    assert f"| RLOO, 1/(K-1) (eq. 14) | 1.0000 | < 1e-12 | {cosine} |" in table
    assert f"| Dr. GRPO (eq. 21) | 1.0000 | < 1e-12 | {cosine} |" in table
    grpo = next(line for line in table.splitlines() if line.startswith("| GRPO, / std"))
    assert grpo.split("|")[4].strip() != cosine                       # biased: its own direction


def test_an_exploitable_error_makes_the_true_reward_of_the_optimum_peak_then_fall(mdp):
    """With the hack worth more than a correct answer, the optimum under r-hat gains true reward at
    first and then gives it all up for the hack (over-optimisation); under the true reward it never falls."""
    error = lr.reward_error(mdp, "exploit", 1.5)
    reference = random_theta(mdp_lib.tabular_policy(mdp)[1])
    path = lr.kl_path(mdp, error, reference, betas=(10.0, 1.0, 0.3, 0.1, 0.01))
    true = [row["true"] for row in path]
    start = lr.expected_reward(mdp, lr.trajectory_probs(mdp, reference), mdp.outcome_rewards)
    assert max(true) > start + 0.05 and true[-1] < 0.01                     # rises, then the hack wins
    assert np.all(np.diff([row["oracle_true"] for row in path]) > 0)
    assert np.all(np.diff([row["learned"] for row in path]) > 0) and np.all(np.diff([row["kl"] for row in path]) > 0)
    assert path[-1]["cosine"] < 0 < path[0]["cosine"]                       # grad J-hat ends against grad J
