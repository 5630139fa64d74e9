"""A learned reward, exactly: what each estimator's expected gradient follows when the reward is a
reward model's r-hat = r + e, with e a known error, and how the KL coefficient trades that error off.

The reward model is the true reward plus an error of a known kind (``ERRORS``), per prompt p and
trajectory tau:

    r-hat(p, tau) = r(p, tau) + e(p, tau)

``noise``: e ~ N(0, scale^2), fixed once drawn (a reward model's random mistakes); ``length``:
e = scale (|tau| - 1) / (H - 1) (it prefers long answers, the bias the paper attributes to GRPO's
length normalisation, here in the reward itself); ``exploit``: one wrong trajectory of every prompt
scores e = scale (a hack the policy can find).

**The gradient.** Every estimator that is unbiased for grad J-hat (the objective under r-hat, eq. 6)
follows grad J-hat, not grad J: its expected gradient's cosine with the true grad J is
cos(grad J-hat, grad J), the same for all of them, and the biased ones (GRPO's / std and / |o|) add
their own bias on top. ``gradient_table`` enumerates it (``pgjax.theory.audit``, the library's own
``core.loss`` on r-hat).

**The KL coefficient.** At the reference policy the KL term's gradient is 0, so it changes nothing
there; it acts once the policy has moved. Where it stops the policy is exact: the maximiser of
J-hat(pi) - beta KL(pi || pi_ref) over every distribution of responses to a prompt is

    pi_beta(tau | p) = pi_ref(tau | p) exp(r-hat(p, tau) / beta) / Z_beta(p),

which a tabular policy represents (``tabular_logits``), and the expected gradient of REINFORCE with
the k1 KL in the reward (classic RLHF PPO's reward, ``Spec.kl_placement='reward'``) is exactly
grad (J-hat - beta KL) (``tests/test_theory_learned_reward.py``). ``kl_table`` follows the optimum
from large beta (pi_ref) to small (argmax r-hat): KL(pi_beta || pi_ref), J-hat and the true J of
pi_beta, the same for the optimum under the true reward, and cos(grad J-hat, grad J) at pi_beta. With
an error the policy can exploit, J rises, peaks and falls as beta shrinks: optimising the learned
reward past that point hurts the true one.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from pgjax import core, markdown
from pgjax.theory import audit as audit_lib
from pgjax.theory import mdp as mdp_lib

ERRORS = ("noise", "length", "exploit")
BETAS = (10.0, 1.0, 0.5, 0.3, 0.2, 0.1, 0.03)
SCALE = 1.5


def reward_error(mdp: mdp_lib.TokenMDP, kind: str, scale: float, seed: int = 0) -> np.ndarray:
    """e [P, N], the reward model's error on each trajectory of each prompt (module docstring)."""
    if mdp.env_mask is not None:
        raise ValueError("a learned reward is defined here for single-turn MDPs (env_mask None)")
    if not scale >= 0:
        raise ValueError(f"the error's scale must be >= 0, got {scale}")
    shape = (mdp.num_prompts, mdp.num_trajectories)
    if kind == "noise":
        return scale * np.random.default_rng(seed).normal(size=shape)
    if kind == "length":
        return np.broadcast_to(scale * (mdp.lengths - 1) / max(mdp.horizon - 1, 1), shape).copy()
    if kind == "exploit":
        error = np.zeros(shape)
        rng = np.random.default_rng(seed)
        for p in range(mdp.num_prompts):
            wrong = np.flatnonzero(mdp.outcome_rewards[p] == 0)
            if wrong.size:
                error[p, rng.choice(wrong)] = scale
        return error
    raise ValueError(f"unknown error kind {kind!r}; expected one of {ERRORS}")


def learned_mdp(mdp: mdp_lib.TokenMDP, error: np.ndarray) -> mdp_lib.TokenMDP:
    """The MDP whose reward is r-hat = r + e: e [P, N] added at each trajectory's last token (an
    outcome reward model scores the whole response)."""
    if error.shape != (mdp.num_prompts, mdp.num_trajectories) or not np.all(np.isfinite(error)):
        raise ValueError(f"the error must be finite, of shape {(mdp.num_prompts, mdp.num_trajectories)}, "
                         f"got {error.shape}")
    rewards = mdp.rewards.copy()
    rewards[:, np.arange(mdp.num_trajectories), mdp.lengths - 1] += error
    return dataclasses.replace(mdp, rewards=rewards)


def trajectory_probs(mdp: mdp_lib.TokenMDP, logits) -> np.ndarray:
    """pi(tau | p) [P, N] of every trajectory."""
    return np.exp(np.asarray(jnp.sum(mdp_lib.trajectory_logprobs(mdp, logits), axis=2)))


def tabular_logits(mdp: mdp_lib.TokenMDP, probs: np.ndarray) -> np.ndarray:
    """Tabular logits [P, S, V] whose policy gives trajectory probabilities ``probs`` [P, N] (> 0):
    pi(a | s) = P(prefix s|a) / P(prefix s), the mass of the trajectories through s then a."""
    if np.any(probs <= 0):
        raise ValueError("tabular_logits needs every trajectory's probability > 0")
    mass = np.zeros((mdp.num_prompts, mdp.num_states, mdp.vocab))
    rows, positions = np.nonzero(mdp.mask)
    for p in range(mdp.num_prompts):
        np.add.at(mass[p], (mdp.states[rows, positions], mdp.tokens[rows, positions]), probs[p, rows])
    with np.errstate(divide="ignore"):
        return np.where(mass > 0, np.log(np.where(mass > 0, mass, 1.0)), -1e9)


def kl_optimum(reference_probs: np.ndarray, rewards: np.ndarray, beta: float) -> np.ndarray:
    """pi_beta(tau | p) [P, N] = pi_ref(tau | p) exp(r(p, tau) / beta) / Z_beta(p), the maximiser of
    E_pi[r] - beta KL(pi || pi_ref) per prompt (computed in log space)."""
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    scores = np.log(reference_probs) + rewards / beta
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    return weights / weights.sum(axis=1, keepdims=True)


def expected_reward(mdp: mdp_lib.TokenMDP, probs: np.ndarray, rewards: np.ndarray) -> float:
    """sum_p p0(p) sum_tau pi(tau | p) r(p, tau)."""
    return float(mdp.prompt_probs @ (probs * rewards).sum(axis=1))


def sequence_kl(mdp: mdp_lib.TokenMDP, probs: np.ndarray, reference_probs: np.ndarray) -> float:
    """KL(pi || pi_ref) over whole responses, averaged over p0."""
    return float(mdp.prompt_probs @ (probs * (np.log(probs) - np.log(reference_probs))).sum(axis=1))


def _gradient(mdp: mdp_lib.TokenMDP, policy, theta) -> np.ndarray:
    """grad J(theta) of ``mdp``'s own reward, flattened."""
    return np.asarray(jax.grad(lambda th: mdp_lib.objective(mdp, policy[0](th)))(theta)).reshape(-1)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def gradient_table(mdp: mdp_lib.TokenMDP, error: np.ndarray, policy, theta, k: int) -> str:
    """Markdown: each estimator of ``audit.ESTIMATORS`` run on r-hat: its exact expected gradient's
    scale c and direction bias against grad J-hat (what it is unbiased for, or not) and its cosine
    with the true grad J; the first row is grad J-hat itself."""
    learned = learned_mdp(mdp, error)
    true_grad = _gradient(mdp, policy, theta)
    rows = [["grad J-hat itself", "1.0000", "0", f"{_cosine(_gradient(learned, policy, theta), true_grad):.4f}"]]
    for label, name, changes in audit_lib.ESTIMATORS:
        algo = core.preset(name)
        result = audit_lib.audit(learned, policy, theta, algo, algo.hparams.replace(**changes), k=k)
        rows.append([label, f"{result.scale:.4f}", audit_lib.bias_cell(result.direction_bias, ".4f"),
                     f"{_cosine(result.mean, true_grad):.4f}"])
    return markdown.table(["estimator (on r-hat)", "scale c against grad J-hat", "direction bias against grad J-hat",
                           "cosine with the true grad J"], rows)


def kl_path(mdp: mdp_lib.TokenMDP, error: np.ndarray, reference_logits, betas=BETAS) -> list[dict]:
    """Per beta: the KL-regularised optimum under r-hat and under the true r (``kl_optimum``), with
    KL(pi_beta || pi_ref), J-hat and the true J of each, and cos(grad J-hat, grad J) at pi_beta for a
    tabular policy."""
    learned = learned_mdp(mdp, error)
    reference = trajectory_probs(mdp, reference_logits)
    true, hat = mdp.outcome_rewards, learned.outcome_rewards
    policy = mdp_lib.tabular_policy(mdp)
    out = []
    for beta in betas:
        optimum, oracle = kl_optimum(reference, hat, beta), kl_optimum(reference, true, beta)
        theta = jnp.asarray(tabular_logits(mdp, optimum))
        out.append(dict(beta=beta, kl=sequence_kl(mdp, optimum, reference), learned=expected_reward(mdp, optimum, hat),
                        true=expected_reward(mdp, optimum, true), oracle_true=expected_reward(mdp, oracle, true),
                        oracle_kl=sequence_kl(mdp, oracle, reference),
                        cosine=_cosine(_gradient(learned, policy, theta), _gradient(mdp, policy, theta))))
    return out


def kl_table(mdp: mdp_lib.TokenMDP, error: np.ndarray, reference_logits, betas=BETAS) -> str:
    """Markdown of ``kl_path``, and the reference policy's row."""
    reference = trajectory_probs(mdp, reference_logits)
    hat = learned_mdp(mdp, error).outcome_rewards
    rows = [["pi_ref", "0", f"{expected_reward(mdp, reference, hat):.4f}",
             f"{expected_reward(mdp, reference, mdp.outcome_rewards):.4f}",
             f"{expected_reward(mdp, reference, hat - mdp.outcome_rewards):+.4f}", "", ""]]
    rows += [[f"{row['beta']:g}", f"{row['kl']:.3f}", f"{row['learned']:.4f}", f"{row['true']:.4f}",
              f"{row['learned'] - row['true']:+.4f}", f"{row['oracle_true']:.4f}", f"{row['cosine']:.4f}"]
             for row in kl_path(mdp, error, reference_logits, betas)]
    return markdown.table(["beta", "KL(pi_beta || pi_ref)", "J-hat(pi_beta)", "true J(pi_beta)", "J-hat - J",
                           "true J, optimum of the true reward at beta", "cos(grad J-hat, grad J) at pi_beta"], rows,
                          align="r" * 7)


def report(k: int = 2, vocab: int = 3, horizon: int = 3, prompts: int = 3, scale: float = SCALE, seed: int = 0,
           errors=ERRORS) -> str:
    """For each error kind: the gradient table at pi_ref and the KL path (tabular policy, outcome
    rewards, pi_ref drawn as in ``audit.report``)."""
    mdp = mdp_lib.make_mdp(vocab, horizon, prompts, "outcome", seed)
    policy = mdp_lib.tabular_policy(mdp)
    theta = jnp.asarray(np.random.default_rng(seed + 1).normal(size=policy[1]) * 0.5, jnp.float64)
    lines = [f"Token MDP: vocabulary {vocab} (EOS = 0), horizon {horizon}, {mdp.num_trajectories} trajectories per "
             f"prompt, {prompts} prompts, outcome rewards, tabular policy pi_ref = pi_theta, K = {k}, seed {seed}; "
             f"the error's scale {scale:g}.", ""]
    for kind in errors:
        error = reward_error(mdp, kind, scale, seed)
        lines += [f"**{kind}** error: the estimators at pi_ref", "", gradient_table(mdp, error, policy, theta, k), "",
                  f"**{kind}** error: the KL-regularised optimum against beta", "",
                  kl_table(mdp, error, policy[0](theta)), ""]
    return "\n".join(lines).strip()


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(description="Exactly what a learned reward with a known error does to each "
                                                 "estimator's gradient, and the KL coefficient's trade-off.")
    parser.add_argument("--k", type=int, default=2, help="samples per prompt")
    parser.add_argument("--vocab", type=int, default=3)
    parser.add_argument("--horizon", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--scale", type=float, default=SCALE, help="the error's size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--errors", nargs="+", choices=ERRORS, default=list(ERRORS))
    args = parser.parse_args(argv)
    with jax.enable_x64(True):
        print(report(args.k, args.vocab, args.horizon, args.prompts, args.scale, args.seed, args.errors))


if __name__ == "__main__":
    main()
