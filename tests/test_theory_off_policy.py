"""Off-policy corrections, audited exactly (float64, every K-tuple of responses drawn from the
behaviour policy mu): pgjax.theory.off_policy and audit(..., behaviour_logits=...). Where a claim
has a closed form, it is computed here independently, by trajectory or by state, in NumPy with the
tabular policy's score grad log pi(a|s) = e_a - pi(.|s) (not through core.loss)."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax import core
from pgjax.theory import off_policy as op
from pgjax.theory.audit import audit

K = 3


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def lab():
    """The report's setting: (mdp, policy, theta = pi, behaviours) and its cells for eq. 19, K = 3."""
    with jax.enable_x64(True):
        mdp, policy, theta, behaviours = op.setting()
        reference, cells = op.off_policy_audit(mdp, policy, theta, core.preset("ppo_multi_sample"), behaviours, k=K)
        yield dataclasses.make_dataclass("Lab", ["mdp", "policy", "theta", "behaviours", "reference", "cells"])(
            mdp, policy, theta, behaviours, reference, {(c.behaviour, c.correction): c for c in cells})


def _label(name):
    return next(c for c in op.AUDITED_CORRECTIONS if c.label.startswith(name)).label


# ---- NumPy references for the tabular policy -------------------------------------------------------

def _softmax(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _token_probs(mdp, logits):
    """pi(a_t | s_t) of every token, [P, N, T], 1 off the mask."""
    probs = _softmax(np.asarray(logits))[:, mdp.states, mdp.tokens]
    return np.where(mdp.mask[None] > 0, probs, 1.0)


def _scores(mdp, logits):
    """grad_theta log pi(a_t | s_t) of every token for theta = logits [P, S, V]: [P, N, T, P*S*V]."""
    pi = _softmax(np.asarray(logits))
    p_, s_, v_ = pi.shape
    out = np.zeros((p_, mdp.num_trajectories, mdp.horizon, p_, s_, v_))
    for p in range(p_):
        for n in range(mdp.num_trajectories):
            for t in range(mdp.lengths[n]):
                s = mdp.states[n, t]
                out[p, n, t, p, s] = -pi[p, s]
                out[p, n, t, p, s, mdp.tokens[n, t]] += 1.0
    return out.reshape(p_, mdp.num_trajectories, mdp.horizon, -1)


def _reinforce_mean(mdp, pi_logits, mu_logits, factor):
    """sum_p p0 sum_tau mu(tau) factor(pi(tau), mu(tau)) R(tau) grad log pi(tau) (K = 1, no baseline)."""
    pi, mu = _token_probs(mdp, pi_logits).prod(2), _token_probs(mdp, mu_logits).prod(2)
    score = _scores(mdp, pi_logits).sum(2)                                            # [P, N, D]
    weight = mdp.prompt_probs[:, None] * mu * factor(pi, mu) * mdp.outcome_rewards   # [P, N]
    return np.einsum("pn,pnd->d", weight, score)


def _state_action_mean(mdp, pi_logits, mu_logits):
    """sum_s d_mu(s) sum_a pi(a|s) Q_mu(s, a) grad log pi(a|s), by state: d_mu(s) is mu's probability
    of reaching prefix s, Q_mu(s, a) = E_mu[R | s, a] (outcome rewards)."""
    pi_tab = _softmax(np.asarray(pi_logits))
    mu_traj = _token_probs(mdp, mu_logits).prod(2)
    p_, s_, v_ = pi_tab.shape
    grad = np.zeros((p_, s_, v_))
    for p in range(p_):
        reach = np.zeros(s_)                   # d_mu(s)
        mass, value = np.zeros((s_, v_)), np.zeros((s_, v_))  # mu(s, a) and E_mu[R 1{s, a}]
        for n in range(mdp.num_trajectories):
            for t in range(mdp.lengths[n]):
                s, a = mdp.states[n, t], mdp.tokens[n, t]
                reach[s] += mu_traj[p, n]
                mass[s, a] += mu_traj[p, n]
                value[s, a] += mu_traj[p, n] * mdp.outcome_rewards[p, n]
        for s in range(s_):
            for a in range(v_):
                if mass[s, a] > 0:
                    q = value[s, a] / mass[s, a]
                    grad[p, s] += mdp.prompt_probs[p] * reach[s] * pi_tab[p, s, a] * q * (np.eye(v_)[a] - pi_tab[p, s])
    return grad.reshape(-1)


def _reinforce(correction: op.Correction):
    return correction.apply(core.preset("reinforce"))


# ---- mu = pi -------------------------------------------------------------------------------------

@pytest.mark.parametrize("correction", op.AUDITED_CORRECTIONS, ids=lambda c: c.label)
def test_staleness_zero_is_the_on_policy_audit(lab, correction):
    """mu = pi: every weight is 1 and the tuples are drawn from pi: mean, variance and ESS as on-policy."""
    algo, hp = correction.apply(core.preset("ppo_multi_sample"))
    result = audit(lab.mdp, lab.policy, lab.theta, algo, hp, k=K, behaviour_logits=lab.policy[0](lab.theta))
    np.testing.assert_allclose(result.mean, lab.reference.mean, rtol=0, atol=1e-12)
    assert abs(result.total_variance - lab.reference.total_variance) < 1e-12
    assert abs(result.ess_fraction - 1.0) < 1e-12 and abs(lab.reference.ess_fraction - 1.0) < 1e-15


def test_policy_pair_distances_at_mu_equal_pi():
    mdp, policy, theta, _ = op.setting()
    logits = policy[0](theta)
    assert abs(op.trajectory_kl(mdp, logits, logits)) < 1e-15
    assert abs(op.trajectory_ess(mdp, logits, logits) - 1.0) < 1e-12


# ---- unbiasedness of the full trajectory ratio ------------------------------------------------------

@pytest.mark.parametrize("name", ["rloo", "dr_grpo"])
def test_sequence_is_is_unbiased_for_every_behaviour_and_group_estimator(lab, name):
    """The baseline of response k does not depend on tau_k, so E_mu[W_k A_k grad log pi(tau_k)] = E_pi[...]."""
    algo = core.preset(name)
    on_policy = audit(lab.mdp, lab.policy, lab.theta, algo, k=K)
    fixed, hp = op.Correction("sequence IS", "sequence").apply(algo)
    for b in lab.behaviours:
        result = audit(lab.mdp, lab.policy, lab.theta, fixed, hp, k=K, behaviour_logits=b.logits)
        np.testing.assert_allclose(result.mean, on_policy.mean, rtol=0, atol=1e-10, err_msg=b.label)


def test_sequence_is_is_unbiased_for_eq_19_and_token_is_is_not(lab):
    """Sequence IS: E_mu[g] = E_pi[g] = grad J for every mu. Token IS: biased under staleness, already at
    one ascent step (KL 0.02): relative bias 0.115, and 0.53 at four; less than ignoring mu (0.20, 0.65),
    by a shrinking margin."""
    for b in lab.behaviours:
        cell = lab.cells[b.label, _label("sequence IS")]
        np.testing.assert_allclose(cell.result.mean, lab.reference.mean, rtol=0, atol=1e-10, err_msg=b.label)
        np.testing.assert_allclose(cell.result.mean, cell.result.true_grad, rtol=0, atol=1e-10)
    token = [lab.cells[f"stale {s}", _label("token IS")].relative_bias for s in (1, 2, 4)]
    ignore = [lab.cells[f"stale {s}", "ignore"].relative_bias for s in (1, 2, 4)]
    assert token[0] > 0.1 and token[2] > 0.5, token
    assert all(t < 0.85 * i for t, i in zip(token, ignore, strict=True)), (token, ignore)
    assert np.all(np.diff(token) > 0)


def test_dr_grpo_is_k_minus_1_times_eq_19_under_every_correction(lab):
    """Per batch, Dr. GRPO's estimate is (K - 1) times eq. 19's (A = (K-1)/K (r - leave-one-out mean), sum
    over K vs mean): the weights and the clip's sign test leave that alone, so its off-policy table is
    eq. 19's with the variance times (K - 1)^2."""
    b = next(b for b in lab.behaviours if b.label == "stale 2")
    for correction in op.AUDITED_CORRECTIONS:
        algo, hp = correction.apply(core.preset("dr_grpo"))
        result = audit(lab.mdp, lab.policy, lab.theta, algo, hp, k=K, behaviour_logits=b.logits)
        cell = lab.cells[b.label, correction.label].result
        np.testing.assert_allclose(result.mean, (K - 1) * cell.mean, rtol=1e-10, atol=1e-13)
        assert result.total_variance == pytest.approx((K - 1) ** 2 * cell.total_variance, rel=1e-10)


# ---- the bias, computed independently ---------------------------------------------------------------

def _k1_setting(lab, staleness):
    b = next(b for b in lab.behaviours if b.label == staleness)
    return np.asarray(lab.policy[0](lab.theta)), b.logits


@pytest.mark.parametrize("behaviour", ["stale 2", "stale 4", "noise 1"])
def test_sequence_truncation_bias_is_the_mass_above_the_cap(lab, behaviour):
    """K = 1 REINFORCE with sequence TIS: E_mu[min(W, C) R grad log pi] - grad J
    = -sum_tau (pi(tau) - min(pi(tau), C mu(tau))) R(tau) grad log pi(tau); masking drops W outside [f, C]."""
    pi_logits, mu_logits = _k1_setting(lab, behaviour)
    cap = 2.0
    for correction, kept in ((op.Correction("TIS", "sequence", cap=cap), lambda pi, mu: np.minimum(pi, cap * mu)),
                             (op.Correction("MIS", "sequence", "mask", cap=cap, floor=0.5),
                              lambda pi, mu: np.where((pi <= cap * mu) & (pi >= 0.5 * mu), pi, 0.0))):
        algo, hp = _reinforce(correction)
        result = audit(lab.mdp, lab.policy, lab.theta, algo, hp, k=1, behaviour_logits=mu_logits)
        bias = -_reinforce_mean(lab.mdp, pi_logits, mu_logits, lambda pi, mu, kept=kept: (pi - kept(pi, mu)) / mu)
        assert np.linalg.norm(bias) > 1e-3
        np.testing.assert_allclose(result.mean - result.true_grad, bias, rtol=0, atol=1e-10)


@pytest.mark.parametrize("behaviour", ["stale 1", "stale 4", "bf16 logits", "noise 1"])
def test_ignoring_mu_is_the_score_weighted_by_mu(lab, behaviour):
    """K = 1 REINFORCE, correction ignore: E_mu[g] = sum_tau mu(tau) R(tau) grad log pi(tau)."""
    pi_logits, mu_logits = _k1_setting(lab, behaviour)
    result = audit(lab.mdp, lab.policy, lab.theta, *_reinforce(op.AUDITED_CORRECTIONS[0]), k=1,
                   behaviour_logits=mu_logits)
    want = _reinforce_mean(lab.mdp, pi_logits, mu_logits, lambda pi, mu: np.ones_like(pi))
    np.testing.assert_allclose(result.mean, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("behaviour", ["stale 1", "stale 4", "noise 1"])
def test_token_is_is_the_policy_gradient_under_mus_states_and_returns(lab, behaviour):
    """K = 1 REINFORCE, token IS (C = inf): E_mu[sum_t w_t R grad log pi(a_t|s_t)]
    = sum_s d_mu(s) sum_a pi(a|s) Q_mu(s, a) grad log pi(a|s): pi's actions, mu's state distribution and
    returns (grad J is the same sum with d_pi, Q_pi; the difference is token IS's bias)."""
    pi_logits, mu_logits = _k1_setting(lab, behaviour)
    result = audit(lab.mdp, lab.policy, lab.theta, *_reinforce(op.AUDITED_CORRECTIONS[1]), k=1,
                   behaviour_logits=mu_logits)
    np.testing.assert_allclose(result.mean, _state_action_mean(lab.mdp, pi_logits, mu_logits), rtol=0, atol=1e-10)
    np.testing.assert_allclose(result.true_grad, _state_action_mean(lab.mdp, pi_logits, pi_logits), rtol=0, atol=1e-10)
    assert np.linalg.norm(result.mean - result.true_grad) > 1e-3


def test_behaviour_ratio_is_the_clip_against_mu_by_enumeration(lab):
    """Eq. 19 with K = 2 and PPO's ratio against mu: g = (1/2) sum_b sum_t rho-hat_bt A_b grad log pi(a_bt|s_bt),
    A_1 = r_1 - r_2 = -A_2, rho_bt = pi / mu, rho-hat = 0 where A > 0 and rho > 1.2 or A < 0 and rho < 0.8;
    enumerated over pairs of trajectories from mu."""
    mdp = lab.mdp
    pi_logits, mu_logits = _k1_setting(lab, "stale 2")
    algo, hp = op.AUDITED_CORRECTIONS[-1].apply(core.preset("ppo_multi_sample"))
    result = audit(mdp, lab.policy, lab.theta, algo, hp, k=2, behaviour_logits=mu_logits)
    rho = _token_probs(mdp, pi_logits) / _token_probs(mdp, mu_logits)                  # [P, N, T]
    mu = _token_probs(mdp, mu_logits).prod(2)
    scores = _scores(mdp, pi_logits)
    want, second = 0.0, 0.0
    for p in range(mdp.num_prompts):
        r = mdp.outcome_rewards[p]
        for i in range(mdp.num_trajectories):
            for j in range(mdp.num_trajectories):
                g = 0.0
                for b, a in ((i, r[i] - r[j]), (j, r[j] - r[i])):
                    clipped = ((a > 0) & (rho[p, b] > 1.2)) | ((a < 0) & (rho[p, b] < 0.8))
                    factor = np.where(clipped, 0.0, rho[p, b]) * mdp.mask[b]
                    g = g + 0.5 * a * np.einsum("t,td->d", factor, scores[p, b])
                weight = mdp.prompt_probs[p] * mu[p, i] * mu[p, j]
                want = want + weight * g
                second += weight * g @ g
    np.testing.assert_allclose(result.mean, want, rtol=0, atol=1e-10)
    assert result.second_moment_trace == pytest.approx(second, rel=1e-10)


# ---- what truncation and masking trade ------------------------------------------------------------

def test_truncation_and_masking_trade_sequence_is_variance_for_bias(lab):
    """The enumeration (eq. 19, K = 3): at staleness 4 (KL 0.38) sequence IS has variance 0.265 (on-policy
    0.124); C = 2 halves it (0.134) for a relative bias of 0.47, masking cuts it to 0.043 but drops the
    trajectories pi now prefers (bias 1.17: E_mu[g] is orthogonal to grad J). Below the cap nothing
    changes: at staleness 1 no trajectory has W > 2, so sequence TIS is exactly unbiased there."""
    cell = lambda b, name: lab.cells[b, _label(name)]  # noqa: E731
    full, tis, mis = (cell("stale 4", n) for n in ("sequence IS", "sequence TIS", "sequence MIS"))
    assert full.total_variance > 2.0 * lab.reference.total_variance
    assert 0.45 < tis.total_variance / full.total_variance < 0.55
    assert mis.total_variance < 0.2 * full.total_variance
    assert 0.4 < tis.relative_bias < 0.55 and mis.relative_bias > 1.0 and abs(mis.cosine) < 0.05
    noisy = [cell("noise 1", n).total_variance for n in ("sequence IS", "sequence TIS", "token IS", "token TIS")]
    assert noisy[1] < 0.4 * noisy[0] and noisy[3] < 0.8 * noisy[2], noisy
    assert cell("stale 1", "sequence TIS").relative_bias < 1e-12
    assert cell("stale 2", "sequence TIS").relative_bias < 0.01          # 0.0078: little mass above C = 2


def test_the_trajectories_beyond_the_band_are_the_improvement(lab):
    """Why masking is so biased under staleness: pi moved toward the correct responses, so every
    trajectory with W > 2 is correct (40% of pi's mass four steps stale) and every one with W < 0.5 is not."""
    mdp = lab.mdp
    pi_logits, mu_logits = _k1_setting(lab, "stale 4")
    pi, mu = _token_probs(mdp, pi_logits).prod(2), _token_probs(mdp, mu_logits).prod(2)
    w, r = pi / mu, mdp.outcome_rewards
    assert np.all(r[w > 2] == 1.0) and np.all(r[w < 0.5] == 0.0)
    assert 0.35 < np.sum(mdp.prompt_probs[:, None] * pi * (w > 2)) < 0.45


def test_clip_against_a_stale_mu_drops_the_improving_tokens(lab):
    """PPO's clip against mu (no recomputed pi_old): the tokens pi already moved up (A > 0, rho > 1.2)
    get no gradient, so two steps stale E_mu[g] is orthogonal to grad J (cosine -0.04)."""
    cos = [lab.cells[f"stale {s}", _label("behaviour ratio")].cosine for s in (1, 2, 4)]
    assert 0.7 < cos[0] < 0.9 and abs(cos[1]) < 0.1 and cos[2] < -0.3, cos


def test_ess_fractions_are_in_zero_one_and_fall_with_distance(lab):
    for cell in lab.cells.values():
        assert 0.0 < cell.ess_fraction <= 1.0 + 1e-12, (cell.behaviour, cell.correction)
    logits = lab.policy[0](lab.theta)
    ess = [op.trajectory_ess(lab.mdp, logits, b.logits) for b in lab.behaviours[:3]]
    kl = [op.trajectory_kl(lab.mdp, logits, b.logits) for b in lab.behaviours[:3]]
    assert all(0 < e < 1 for e in ess) and np.all(np.diff(ess) < 0) and np.all(np.diff(kl) > 0)
    ignore = [lab.cells[b.label, "ignore"].ess_fraction for b in lab.behaviours]
    np.testing.assert_allclose(ignore, 1.0, rtol=0, atol=1e-15)


def test_kish_ess_of_sequence_is_by_trajectory(lab):
    """c_t = W on every token of tau: Kish = E_pi[|o|]^2 / (E_mu[|o|] E_pi[|o| W]); and 1 / E_mu[W^2]."""
    mdp = lab.mdp
    pi_logits, mu_logits = _k1_setting(lab, "stale 4")
    pi, mu = _token_probs(mdp, pi_logits).prod(2), _token_probs(mdp, mu_logits).prod(2)
    expect = lambda q, x: float(np.sum(mdp.prompt_probs[:, None] * q * x))  # noqa: E731
    length = mdp.lengths[None].astype(float)
    kish = expect(pi, length) ** 2 / (expect(mu, length) * expect(pi, length * pi / mu))
    assert lab.cells["stale 4", _label("sequence IS")].ess_fraction == pytest.approx(kish, rel=1e-10)
    assert op.trajectory_ess(mdp, pi_logits, mu_logits) == pytest.approx(1 / expect(mu, (pi / mu) ** 2), rel=1e-10)
    assert op.trajectory_kl(mdp, pi_logits, mu_logits) == pytest.approx(expect(pi, np.log(pi / mu)), rel=1e-10)


def test_behaviours_are_what_the_module_says():
    mdp, policy, theta, behaviours = op.setting()
    logits = np.asarray(policy[0](theta))
    labels = [b.label for b in behaviours]
    assert labels == ["stale 1", "stale 2", "stale 4", "bf16 logits", "noise 0.1", "noise 0.3", "noise 1"]
    stale = op.trajectory_kl(mdp, logits, behaviours[0].logits)
    assert 1e-2 < stale < 1e-1                                    # one exact ascent step moves pi visibly
    bf16 = behaviours[3].logits
    assert 0 < np.max(np.abs(bf16 - logits)) <= np.max(np.abs(logits)) * 2.0 ** -8
    np.testing.assert_array_equal(np.asarray(jnp.asarray(bf16, jnp.bfloat16), np.float64), bf16)  # representable
    assert math.isclose(np.std(behaviours[6].logits - logits), 1.0, rel_tol=0.3)
