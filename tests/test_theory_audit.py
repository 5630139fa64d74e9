"""The paper's claims about each estimator, computed exactly (float64, no sampling) with
the library's own losses on enumerable token MDPs."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax import core
from pgjax.theory import mdp as mdp_lib
from pgjax.theory.audit import audit

TOL = 1e-6


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _setup(policy="tabular", reward="outcome", prompts=3, seed=0):
    mdp = mdp_lib.make_mdp(vocab=3, horizon=3, prompts=prompts, reward=reward, seed=seed)
    pol = mdp_lib.tabular_policy(mdp) if policy == "tabular" else mdp_lib.shared_policy(mdp)
    theta = jnp.asarray(np.random.default_rng(seed + 1).normal(size=pol[1]) * 0.5)
    return mdp, pol, theta


def _single_prompt(mdp, p):
    probs = np.zeros(mdp.num_prompts)
    probs[p] = 1.0
    return mdp_lib.TokenMDP(**{**mdp.__dict__, "prompt_probs": probs})


def test_enumeration_counts_and_exact_objective():
    mdp, (logits_fn, _), theta = _setup()
    assert mdp.num_trajectories == 15 and mdp.num_states == 7
    probs = np.exp(np.asarray(mdp_lib.trajectory_logprobs(mdp, logits_fn(theta))).sum(2))
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-12)      # a distribution per prompt
    # J by a plain loop over prompts and trajectories
    j = sum(mdp.prompt_probs[p] * probs[p, n] * mdp.outcome_rewards[p, n]
            for p in range(3) for n in range(15))
    np.testing.assert_allclose(float(mdp_lib.objective(mdp, logits_fn(theta))), j, rtol=1e-12)
    # V(s_0) of each prompt is its expected reward
    np.testing.assert_allclose(np.asarray(mdp_lib.state_values(mdp, logits_fn(theta)))[:, 0],
                               (probs * mdp.outcome_rewards).sum(1), rtol=1e-12)


@pytest.mark.parametrize("policy", ["tabular", "shared"])
@pytest.mark.parametrize("reward", ["outcome", "process"])
@pytest.mark.parametrize("name", ["reinforce", "reinforce_baseline", "remax", "rloo", "ppo_multi_sample"])
@pytest.mark.parametrize("k", [2, 4])
def test_unbiased_estimators(name, k, policy, reward):
    """REINFORCE (eq. 10), with a state baseline (eq. 12), ReMax (eq. 13), RLOO (eq. 14) and
    eq. 19 (group mean with 1/(K-1)): E[g] = grad J."""
    mdp, pol, theta = _setup(policy, reward)
    result = audit(mdp, pol, theta, core.preset(name), k=k)
    assert abs(result.scale - 1.0) < TOL, result.scale
    assert result.direction_bias < TOL


@pytest.mark.parametrize("k", [2, 3, 4])
def test_group_mean_with_1_over_k_is_biased_by_k_minus_1_over_k(k):
    mdp, pol, theta = _setup()
    result = audit(mdp, pol, theta, core.preset("rloo"), core.HParams(leave_one_out=0.0), k=k)
    assert abs(result.scale - (k - 1) / k) < TOL
    assert result.direction_bias < TOL


@pytest.mark.parametrize("k", [2, 4])
def test_dr_grpo_is_k_minus_1_times_grad_j(k):
    mdp, pol, theta = _setup()
    result = audit(mdp, pol, theta, core.preset("dr_grpo"), k=k)
    assert abs(result.scale - (k - 1)) < TOL
    assert result.direction_bias < TOL


def test_ppo_at_theta_old_equals_reinforce_with_the_same_advantages():
    mdp, pol, theta = _setup()
    ppo = core.preset("ppo")
    hp = ppo.hparams.replace(lam=1.0, whiten=0.0)   # advantages G_t - V(s_t), as reinforce_baseline
    a = audit(mdp, pol, theta, ppo, hp, k=2)
    b = audit(mdp, pol, theta, core.preset("reinforce_baseline"), hp, k=2)
    np.testing.assert_allclose(a.mean, b.mean, atol=1e-12)
    assert abs(a.total_variance - b.total_variance) < 1e-10


def test_state_baseline_reduces_variance():
    mdp, pol, theta = _setup()
    plain = audit(mdp, pol, theta, core.preset("reinforce"), k=2)
    baseline = audit(mdp, pol, theta, core.preset("reinforce_baseline"), k=2)
    assert baseline.total_variance < 0.5 * plain.total_variance   # 0.131 vs 0.360 on this MDP


GRPO_NO_KL = core.preset("grpo").hparams.replace(kl_coef=0.0)


def test_grpo_is_biased_in_direction_on_prompts_of_mixed_difficulty():
    mdp, pol, theta = _setup()
    result = audit(mdp, pol, theta, core.preset("grpo"), GRPO_NO_KL, k=4)
    assert result.direction_bias > 0.1


def test_std_division_reweights_questions_toward_easy_and_hard_ones():
    """The paper, question-level difficulty bias. With binary outcome rewards, dividing by the group
    std only rescales each prompt's gradient (no direction bias on one prompt), but by a factor
    that grows as the prompt gets easier or harder (lower std): so on several prompts the
    direction is biased, and the up-weighting is largest for the most extreme prompt."""
    mdp, pol, theta = _setup()
    logits = pol[0](theta)
    probs = np.exp(np.asarray(mdp_lib.trajectory_logprobs(mdp, logits)).sum(2))
    success = (probs * mdp.outcome_rewards).sum(1)
    std_only = GRPO_NO_KL.replace(divide_by_length=0.0)
    no_std = std_only.replace(divide_by_std=0.0)
    algo = core.preset("grpo")
    weights = []
    for p in range(mdp.num_prompts):
        one = _single_prompt(mdp, p)
        with_std = audit(one, pol, theta, algo, std_only, k=4)
        without = audit(one, pol, theta, algo, no_std, k=4)
        assert with_std.direction_bias < TOL and without.direction_bias < TOL
        weights.append(with_std.scale / without.scale)
    extremeness = np.abs(success - 0.5)
    assert np.argmax(weights) == np.argmax(extremeness), (weights, success)
    assert np.argmin(weights) == np.argmin(extremeness), (weights, success)
    assert audit(mdp, pol, theta, algo, std_only, k=4).direction_bias > 1e-2


def _expected_length(mdp, logits, correct: bool):
    """E[|o| 1{r = correct}] under the policy, for one-prompt MDPs."""
    probs = jnp.exp(mdp_lib.trajectory_logprobs(mdp, logits).sum(2))
    selected = (mdp.outcome_rewards > 0) == correct
    return jnp.sum(jnp.asarray(mdp.prompt_probs)[:, None] * probs * selected * mdp.lengths)


def test_length_normalisation_shortens_correct_and_lengthens_incorrect_responses():
    """The paper, response-level length bias. Dividing by |o| (without the std division) biases the
    direction even on one prompt; compared with the unbiased update of the same size along
    grad J, it lowers the expected length of correct responses and raises that of incorrect ones
    (directional derivatives of E[|o| 1{correct}] and E[|o| 1{incorrect}])."""
    mdp, pol, theta = _setup()
    logits_fn = pol[0]
    one = _single_prompt(mdp, 1)
    length_only = GRPO_NO_KL.replace(divide_by_std=0.0)
    biased = audit(one, pol, theta, core.preset("grpo"), length_only, k=4)
    assert biased.direction_bias > 1e-2
    unbiased_direction = biased.scale * biased.true_grad
    for correct, sign in ((True, -1.0), (False, 1.0)):
        f = lambda th, correct=correct: _expected_length(one, logits_fn(th), correct)  # noqa: E731
        grad = np.asarray(jax.grad(f)(theta)).reshape(-1)
        change = grad @ biased.mean - grad @ unbiased_direction
        assert sign * change > 0, (correct, change)


def test_per_step_greedy_baseline_is_unbiased():
    """The paper's ReMax b_t = G-hat_t, the greedy completion's return from every s_t: a state function."""
    mdp, pol, theta = _setup(reward="process")
    greedy = mdp_lib.greedy_state_values(mdp, pol[0](theta))
    assert np.ptp(greedy) > 0
    result = audit(mdp, pol, theta, core.preset("reinforce_baseline"), k=2, state_baseline=greedy)
    assert abs(result.scale - 1.0) < TOL and result.direction_bias < TOL


def test_per_step_rloo_moments_match_brute_force_enumeration():
    """Enumerate one trajectory and one extra continuation from every s_t (K = 2, one prompt)."""
    from pgjax.theory.audit import per_step_rloo_audit
    mdp = mdp_lib.make_mdp(vocab=3, horizon=2, prompts=1, reward="process", seed=3)
    pol = mdp_lib.tabular_policy(mdp)
    theta = jnp.asarray(np.random.default_rng(4).normal(size=pol[1]))
    logits_fn = pol[0]
    logp = np.asarray(mdp_lib.trajectory_logprobs(mdp, logits_fn(theta)))[0]          # [N, T]
    jac = np.asarray(jax.jacrev(lambda th: mdp_lib.trajectory_logprobs(mdp, logits_fn(th)))(theta))[0]
    jac = jac.reshape(jac.shape[0], jac.shape[1], -1)                                  # [N, T, D]
    prob = np.exp(logp.sum(1))
    rewards = mdp.rewards[0]
    returns = np.flip(np.cumsum(np.flip(rewards, 1), 1), 1)                            # G_t
    lengths = mdp.lengths

    def continuations(n, t):
        """(probability, return from t) of every trajectory sharing trajectory n's prefix before t."""
        out = []
        for m in range(mdp.num_trajectories):
            if lengths[m] > t and np.array_equal(mdp.tokens[m, :t], mdp.tokens[n, :t]):
                out.append((np.exp(logp[m, t:lengths[m]].sum()), returns[m, t]))
        return out

    mean = np.zeros(jac.shape[2])
    second = 0.0
    for n in range(mdp.num_trajectories):
        options = [continuations(n, t) for t in range(lengths[n])]
        for combo in itertools.product(*options):
            weight = prob[n] * np.prod([c[0] for c in combo])
            g = sum((returns[n, t] - combo[t][1]) * jac[n, t] for t in range(lengths[n]))
            mean += weight * g
            second += weight * g @ g
    # K = 2 independent such trajectories per prompt: the covariance of their average halves
    result = per_step_rloo_audit(mdp, pol, theta, k=2)
    np.testing.assert_allclose(result.mean, mean, atol=1e-10)
    np.testing.assert_allclose(result.second_moment_trace, mean @ mean + (second - mean @ mean) / 2, rtol=1e-10)
    assert result.direction_bias < TOL


@pytest.mark.parametrize("policy", ["tabular", "shared"])
@pytest.mark.parametrize("name, correction", [("grpo", None), ("rloo", "token"), ("ppo", None)])
def test_audit_moments_are_each_pairs_own_gradient_weighted_by_its_probability(policy, name, correction):
    """E[g], E|g|^2 and the token weights' sums by a plain loop over every pair of responses to every
    prompt, each g = -jax.grad in theta of ``core.loss`` on a Batch built here, its rows sampled from
    pi or (with an off-policy correction) from a behaviour policy mu; the audit's chain rule through the
    log-probs' Jacobian must give the same numbers."""
    from pgjax.theory import off_policy as op
    from pgjax.theory.audit import correction_weights
    mdp = mdp_lib.make_mdp(vocab=3, horizon=2, prompts=2, reward="process", seed=5)
    pol = mdp_lib.tabular_policy(mdp) if policy == "tabular" else mdp_lib.shared_policy(mdp)
    rng = np.random.default_rng(6)
    theta = jnp.asarray(rng.normal(size=pol[1]))
    algo = core.preset(name)
    hp = algo.hparams.replace(kl_coef=0.0)
    mu_logits = None
    if correction is not None:
        algo, hp = op.Correction(correction, correction).apply(algo)
        mu_logits = pol[0](theta) + jnp.asarray(rng.normal(size=(mdp.num_prompts, mdp.num_states, mdp.vocab)))
    logits = pol[0](theta)
    sampler = logits if mu_logits is None else mu_logits
    values = np.asarray(mdp_lib.state_values(mdp, logits))
    greedy = np.asarray(mdp_lib.greedy_rewards(mdp, logits))
    draw_logp = np.asarray(mdp_lib.trajectory_logprobs(mdp, sampler))                     # [P, N, T]

    def batch(th, p, rows):
        logp = mdp_lib.trajectory_logprobs(mdp, pol[0](th))[p, rows]
        return core.Batch(mask=jnp.asarray(mdp.mask)[rows], rewards=jnp.asarray(mdp.rewards)[p, rows], logp=logp,
                          values=jnp.asarray(values)[p][jnp.asarray(mdp.states)[rows]],
                          greedy_rewards=jnp.full((2,), greedy[p]), group_size=2,
                          behaviour_logp=None if mu_logits is None else jnp.asarray(draw_logp)[p, rows])

    def loss(th, p, rows):
        b = batch(th, p, rows)
        b = b.replace(advantages=algo.advantages(b.replace(logp=jax.lax.stop_gradient(b.logp)), hp))
        return algo.loss(b, hp, core.loss_normalizer(b.mask, 2))[0]

    gradient = jax.jit(jax.grad(loss), static_argnums=1)
    weights = jax.jit(lambda th, p, rows: correction_weights(algo, hp, batch(th, p, rows)), static_argnums=1)
    mean, second, sums = 0.0, 0.0, np.zeros(3)
    for p in range(mdp.num_prompts):
        for rows in itertools.product(range(mdp.num_trajectories), repeat=2):
            weight = mdp.prompt_probs[p] * np.exp(draw_logp[p, list(rows)].sum())
            g = -np.asarray(gradient(theta, p, jnp.asarray(rows))).reshape(-1)
            c = np.asarray(weights(theta, p, jnp.asarray(rows)))
            mean, second = mean + weight * g, second + weight * g @ g
            sums += weight * np.array([mdp.mask[list(rows)].sum(), c.sum(), (c * c).sum()])
    result = audit(mdp, pol, theta, algo, hp, k=2, behaviour_logits=mu_logits)
    np.testing.assert_allclose(result.mean, mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(result.second_moment_trace, second, rtol=1e-10)
    np.testing.assert_allclose([result.token_count, result.weight_sum, result.weight_sq_sum], sums, rtol=1e-10)
    assert np.linalg.norm(mean) > 1e-3 and (correction is None or sums[2] - sums[0] > 1e-3)   # not trivial


def test_greedy_values_follow_the_argmax_from_every_prefix():
    """A plain walk down the token tree from each prefix, taking the argmax token each step."""
    mdp, pol, theta = _setup(reward="process")
    logits = np.asarray(pol[0](theta))
    got = np.asarray(mdp_lib.greedy_state_values(mdp, pol[0](theta)))
    prefix_state = {tuple(mdp.tokens[n, :t]): mdp.states[n, t]
                    for n in range(mdp.num_trajectories) for t in range(mdp.lengths[n])}
    trajectory = {tuple(mdp.tokens[n, :mdp.lengths[n]]): n for n in range(mdp.num_trajectories)}
    for p in range(mdp.num_prompts):
        for start, s in prefix_state.items():
            prefix = start
            while prefix in prefix_state and (not prefix or prefix[-1] != mdp.eos):
                prefix = prefix + (int(np.argmax(logits[p, prefix_state[prefix]])),)
            want = mdp.rewards[p, trajectory[prefix], len(start):].sum()
            np.testing.assert_allclose(got[p, s], want, rtol=1e-12, err_msg=str((p, start)))
