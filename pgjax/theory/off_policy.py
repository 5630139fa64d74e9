"""Off-policy corrections, exactly: what each weight of ``pgjax.core.off_policy`` costs in bias,
variance and effective sample size when the responses come from a behaviour policy mu != pi.

Setting. The learner's policy is pi = pi_theta; the sampler draws the K responses of a prompt from
mu: a copy of theta some updates old (asynchronous rollouts) or pi's own logits computed with other
numerics (bfloat16, other kernels: here rounding or Gaussian noise on the logits). The estimate is
``-jax.grad`` of ``core.loss`` at theta with pi_old = pi (the first minibatch of an update) and the
batch's ``behaviour_logp`` = log mu; ``pgjax.theory.audit`` enumerates every K-tuple under mu:

  E_mu[g] = sum_p p0(p) sum_{tau_1..tau_K} prod_k mu(tau_k | p) g(p, tau_1..tau_K).

Why per-token weights are biased: with w_t = pi(a_t|s_t) / mu(a_t|s_t), the token-weighted
REINFORCE term has mean sum_t sum_s d_mu,t(s) sum_a pi(a|s) Q_mu(s, a) grad log pi(a|s): the right
action distribution at each state, but mu's state distribution d_mu and mu's returns Q_mu (the
importance-sampled gradient of "From REINFORCE to Dr. GRPO", PPO section before eq. 15, with
pi_old = mu).
Only the whole trajectory's ratio W = prod_t w_t turns E_mu into E_pi; it is unbiased for any
estimator whose baseline of response k does not depend on tau_k (RLOO, eq. 19, Dr. GRPO), but
its variance grows like E_mu[W^2] = 1 / (trajectory ESS). Truncating (min(W, C)) or masking
(W outside [f, C] -> 0) trades that variance for a bias of exactly the mass removed:
E_mu[min(W, C) X] - E_pi[X] = -sum_tau (pi(tau) - min(pi(tau), C mu(tau))) X(tau).

Reported per (behaviour, correction), all exact:
  relative bias  |E_mu[g] - E_pi[g]| / |E_pi[g]|   (E_pi[g]: the same estimator on-policy)
  cosine         of E_mu[g] with grad J(pi)
  variance       trace Cov_mu[g]
  ESS fraction   Kish's (E_mu[sum_t c_t])^2 / (E_mu[sum_t 1] E_mu[sum_t c_t^2]) of the token weights
and per behaviour KL(pi || mu) over trajectories and the trajectory ESS 1 / E_mu[(pi / mu)^2].
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from pgjax import core, markdown
from pgjax.theory import mdp as mdp_lib
from pgjax.theory.audit import AuditResult, audit, bias_cell

INF = math.inf


@dataclasses.dataclass(frozen=True)
class Correction:
    """One off-policy correction: ``Spec.correction`` / ``correction_mode`` and ``HParams.is_cap`` /
    ``is_floor`` (see ``pgjax.core.off_policy``)."""
    label: str
    correction: str = "ignore"
    mode: str = "truncate"
    cap: float = INF
    floor: float = 0.5

    def apply(self, algo: core.Algorithm, hp: core.HParams | None = None) -> tuple[core.Algorithm, core.HParams]:
        """``algo`` with this correction in its spec, and ``hp`` (default: algo's) with its limits."""
        spec = algo.spec.replace(correction=self.correction, correction_mode=self.mode)
        hp = (algo.hparams if hp is None else hp).replace(is_cap=self.cap, is_floor=self.floor)
        return dataclasses.replace(algo, spec=spec, hparams=hp), hp


# The corrections the audit compares, one row each: every ``core.CORRECTIONS`` name, the token and
# sequence levels plain (IS), truncated (TIS, min(c, C)) and masked (MIS, 0 outside [f, C]).
AUDITED_CORRECTIONS = (
    Correction("ignore"),
    Correction("token IS", "token"),
    Correction("token TIS, C = 2", "token", cap=2.0),
    Correction("token MIS, [0.5, 2]", "token", "mask", cap=2.0),
    Correction("sequence IS", "sequence"),
    Correction("sequence TIS, C = 2", "sequence", cap=2.0),
    Correction("sequence MIS, [0.5, 2]", "sequence", "mask", cap=2.0),
    Correction("geometric TIS, C = 2", "geometric", cap=2.0),
    Correction("behaviour ratio (PPO clip vs mu)", "behaviour_ratio"),
)


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """A sampler's policy mu: its logits [P, S, V]."""
    label: str
    logits: np.ndarray


def ascent_path(mdp: mdp_lib.TokenMDP, policy, theta0, lr: float, steps: int) -> list:
    """theta_0, ..., theta_steps of exact gradient ascent: theta_{i+1} = theta_i + lr grad J(theta_i)."""
    logits_fn, _ = policy
    grad = jax.jit(jax.grad(lambda th: mdp_lib.objective(mdp, logits_fn(th))))
    path = [jnp.asarray(theta0)]
    for _ in range(steps):
        path.append(path[-1] + lr * grad(path[-1]))
    return path


def stale_behaviours(policy, path, staleness=(1, 2, 4)) -> list[Behaviour]:
    """mu = theta_{S-s} for each staleness s, with pi = theta_S the path's last point."""
    logits_fn, _ = policy
    return [Behaviour(f"stale {s}", np.asarray(logits_fn(path[-1 - s]))) for s in staleness]


def perturbed_behaviours(logits, noise_scales=(0.1, 0.3, 1.0), seed: int = 0) -> list[Behaviour]:
    """pi's logits as a low-precision sampler might compute them: rounded to bfloat16, and
    logits + sigma z for each scale sigma (one fixed standard-normal draw z [P, S, V])."""
    logits = np.asarray(logits)
    rounded = np.asarray(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32), logits.dtype)
    z = np.random.default_rng(seed).normal(size=logits.shape)
    return [Behaviour("bf16 logits", rounded)] + [Behaviour(f"noise {s:g}", logits + s * z) for s in noise_scales]


def _sequence_logprobs(mdp, logits) -> np.ndarray:
    """log pi(tau | p), [P, N]."""
    return np.asarray(jnp.sum(mdp_lib.trajectory_logprobs(mdp, jnp.asarray(logits)), axis=2))


def trajectory_kl(mdp: mdp_lib.TokenMDP, pi_logits, mu_logits) -> float:
    """KL(pi || mu) = sum_p p0(p) sum_tau pi(tau|p) log(pi(tau|p) / mu(tau|p))."""
    lp, lm = _sequence_logprobs(mdp, pi_logits), _sequence_logprobs(mdp, mu_logits)
    return float(np.sum(mdp.prompt_probs[:, None] * np.exp(lp) * (lp - lm)))


def trajectory_ess(mdp: mdp_lib.TokenMDP, pi_logits, mu_logits) -> float:
    """The fraction 1 / E_mu[W^2] of the trajectory ratio W = pi(tau) / mu(tau), in (0, 1]:
    E_mu[W^2] = sum_p p0(p) sum_tau pi(tau|p)^2 / mu(tau|p) (1 iff mu = pi)."""
    lp, lm = _sequence_logprobs(mdp, pi_logits), _sequence_logprobs(mdp, mu_logits)
    return float(1.0 / np.sum(mdp.prompt_probs[:, None] * np.exp(2 * lp - lm)))


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (behaviour, correction) of the off-policy audit, and its exact moments."""
    behaviour: str
    correction: str
    result: AuditResult
    on_policy_mean: np.ndarray

    @property
    def relative_bias(self) -> float:
        """|E_mu[g] - E_pi[g]| / |E_pi[g]|."""
        return float(np.linalg.norm(self.result.mean - self.on_policy_mean) / np.linalg.norm(self.on_policy_mean))

    @property
    def cosine(self) -> float:
        return self.result.cosine

    @property
    def total_variance(self) -> float:
        return self.result.total_variance

    @property
    def ess_fraction(self) -> float:
        return self.result.ess_fraction


def off_policy_audit(mdp: mdp_lib.TokenMDP, policy, theta, algo: core.Algorithm, behaviours,
                     corrections=AUDITED_CORRECTIONS, k: int = 3,
                     hp: core.HParams | None = None) -> tuple[AuditResult, list[Cell]]:
    """The on-policy audit of ``algo`` and one ``Cell`` per (behaviour, correction), behaviours outer."""
    reference = audit(mdp, policy, theta, algo, hp, k=k)
    cells = []
    for b in behaviours:
        for c in corrections:
            fixed, fixed_hp = c.apply(algo, hp)
            result = audit(mdp, policy, theta, fixed, fixed_hp, k=k, behaviour_logits=b.logits)
            cells.append(Cell(b.label, c.label, result, reference.mean))
    return reference, cells


METRICS = (  # (title, Cell attribute, format)
    ("relative bias \\|E_mu[g] - E_pi[g]\\| / \\|E_pi[g]\\|", "relative_bias", lambda x: bias_cell(x, ".3g")),
    ("cosine of E_mu[g] with grad J(pi)", "cosine", lambda x: f"{x:.4f}"),
    ("total variance (trace of Cov_mu[g])", "total_variance", lambda x: f"{x:.4f}"),
    ("Kish ESS fraction of the token weights", "ess_fraction", lambda x: f"{x:.3f}"),
)


def behaviour_table(mdp: mdp_lib.TokenMDP, pi_logits, behaviours) -> str:
    """Markdown: each behaviour's KL(pi || mu) and trajectory ESS 1 / E_mu[(pi / mu)^2]."""
    return markdown.table(["behaviour mu", "KL(pi || mu)", "trajectory ESS 1 / E_mu[(pi/mu)^2]"],
                          [[b.label, f"{trajectory_kl(mdp, pi_logits, b.logits):.2e}",
                            f"{trajectory_ess(mdp, pi_logits, b.logits):.3f}"] for b in behaviours])


def metric_table(cells: list[Cell], attribute: str, fmt) -> str:
    """Markdown: one row per correction, one column per behaviour, the cells' ``attribute``."""
    behaviours = list(dict.fromkeys(c.behaviour for c in cells))
    corrections = list(dict.fromkeys(c.correction for c in cells))
    value = {(c.behaviour, c.correction): getattr(c, attribute) for c in cells}
    return markdown.table(["correction", *behaviours],
                          [[name, *(fmt(value[b, name]) for b in behaviours)] for name in corrections])


def setting(vocab: int = 3, horizon: int = 3, prompts: int = 3, seed: int = 0, lr: float = 10.0, steps: int = 4,
            staleness=(1, 2, 4), noise_scales=(0.1, 0.3, 1.0)):
    """(mdp, policy, theta = theta_S, behaviours): the audit MDP and its tabular policy, theta_0 as in
    ``audit.report``, S exact ascent steps, and the stale and perturbed behaviour policies.

    Memoised per arguments and float width: callers share the objects, and so the audit's compiled
    programs (treat them as read-only)."""
    width = str(jax.dtypes.canonicalize_dtype(jnp.float64))
    return _setting(vocab, horizon, prompts, seed, lr, steps, tuple(staleness), tuple(noise_scales), width)


@functools.lru_cache(maxsize=8)
def _setting(vocab, horizon, prompts, seed, lr, steps, staleness, noise_scales, width):
    mdp = mdp_lib.make_mdp(vocab, horizon, prompts, "outcome", seed)
    policy = mdp_lib.tabular_policy(mdp)
    theta0 = jnp.asarray(np.random.default_rng(seed + 1).normal(size=policy[1]) * 0.5, width)
    path = ascent_path(mdp, policy, theta0, lr, steps)
    behaviours = stale_behaviours(policy, path, staleness) + perturbed_behaviours(policy[0](path[-1]), noise_scales,
                                                                                 seed)
    return mdp, policy, path[-1], behaviours


def report(estimator: str = "ppo_multi_sample", k: int = 3, vocab: int = 3, horizon: int = 3, prompts: int = 3,
           seed: int = 0, lr: float = 10.0) -> str:
    """The off-policy tables: behaviours, then bias, cosine, variance and ESS per correction."""
    mdp, policy, theta, behaviours = setting(vocab, horizon, prompts, seed, lr)
    algo = core.preset(estimator)
    reference, cells = off_policy_audit(mdp, policy, theta, algo, behaviours, k=k)
    pi_logits = policy[0](theta)
    header = (f"Token MDP: vocabulary {vocab}, horizon {horizon}, {prompts} prompts, outcome rewards, tabular policy; "
              f"pi = theta after 4 exact ascent steps of lr {lr:g} from theta_0 (J = "
              f"{float(mdp_lib.objective(mdp, pi_logits)):.3f}); estimator {estimator}, K = {k}, at pi_old = pi. "
              f"On-policy: cosine {reference.cosine:.4f}, total variance {reference.total_variance:.4f}.")
    lines = [header, "", behaviour_table(mdp, pi_logits, behaviours)]
    for title, attribute, fmt in METRICS:
        lines += ["", title + ":", "", metric_table(cells, attribute, fmt)]
    return "\n".join(lines)


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(description="Exact bias, variance and ESS of each off-policy correction.")
    parser.add_argument("--estimator", default="ppo_multi_sample", help="a preset with a clipped ratio")
    parser.add_argument("--k", type=int, default=3, help="samples per prompt")
    parser.add_argument("--vocab", type=int, default=3)
    parser.add_argument("--horizon", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=10.0, help="step size of the exact ascent that makes mu stale")
    args = parser.parse_args(argv)
    with jax.enable_x64(True):
        print(report(args.estimator, args.k, args.vocab, args.horizon, args.prompts, args.seed, args.lr))


if __name__ == "__main__":
    main()
