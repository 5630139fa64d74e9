"""Exact audit of a gradient estimator: its mean and covariance over the sampling
distribution, by enumerating every K-tuple of trajectories of every prompt.

The estimate for one batch (one prompt p ~ p_0 and K responses sampled from
pi_theta) is ``-jax.grad`` of the library's own loss, ``pgjax.core.loss``, on
that batch: log-probs from the policy, masks and rewards of the MDP, on-policy
(theta_old = theta). Nothing is re-derived here. Then

  E[g]   = sum_p p0(p) sum_{tau_1..tau_K} prod_k pi(tau_k | p) g(p, tau_1..tau_K)
  Cov[g] = E[g g^T] - E[g] E[g]^T

and against the true gradient grad J (``mdp.objective``): the scale
c = <E[g], grad J> / |grad J|^2, the direction bias |E[g] - c grad J| / |grad J|,
the cosine, and the total variance trace(Cov[g]).

Off-policy (``behaviour_logits``, the sampler's policy mu): the K responses are drawn from mu,

  E_mu[g] = sum_p p0(p) sum_{tau_1..tau_K} prod_k mu(tau_k | p) g(p, tau_1..tau_K),

and the batch carries mu's log-probs (``Batch.behaviour_logp``) for the spec's correction; the
estimate is still taken at theta with pi_old = pi (``old_logp`` None: an update's first minibatch).
The same enumeration also gives the moments of the correction's token weights c_t for Kish's
effective sample size (``AuditResult.ess_fraction``).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from pgjax import core, markdown
from pgjax.plugins import named_estimator
from pgjax.theory import mdp as mdp_lib


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """Exact moments of one estimator (flattened parameters)."""
    mean: np.ndarray
    second_moment_trace: float
    true_grad: np.ndarray
    token_count: float = float("nan")       # E[sum_t 1] over the batch's response tokens
    weight_sum: float = float("nan")        # E[sum_t c_t], c_t = ``spec_correction_weights``
    weight_sq_sum: float = float("nan")     # E[sum_t c_t^2]

    @property
    def scale(self) -> float:
        return float(self.mean @ self.true_grad / (self.true_grad @ self.true_grad))

    @property
    def direction_bias(self) -> float:
        return float(np.linalg.norm(self.mean - self.scale * self.true_grad) / np.linalg.norm(self.true_grad))

    @property
    def cosine(self) -> float:
        return float(self.mean @ self.true_grad / (np.linalg.norm(self.mean) * np.linalg.norm(self.true_grad)))

    @property
    def total_variance(self) -> float:
        return float(self.second_moment_trace - self.mean @ self.mean)

    @property
    def ess_fraction(self) -> float:
        """Kish's effective sample size of the token weights over the token count, in (0, 1]:
        (E[sum_t c_t])^2 / (E[sum_t 1] E[sum_t c_t^2]); 1 when every c_t = 1."""
        return float(self.weight_sum ** 2 / (self.token_count * self.weight_sq_sum))


def _tuples(num_trajectories: int, k: int) -> np.ndarray:
    """Every K-tuple of trajectory indices, [N^K, K]."""
    grids = np.meshgrid(*[np.arange(num_trajectories)] * k, indexing="ij")
    return np.stack([g.reshape(-1) for g in grids], axis=1)


def _tables(mdp: mdp_lib.TokenMDP) -> tuple:
    """What a batch reads of the MDP, as arrays: the loss mask [N, T], the rewards the estimator sees
    [P, N, T] (outcome rewards on the last token, or per-step ones) and each step's state [N, T]."""
    rewards = mdp.outcome_rewards if mdp.outcome else mdp.rewards
    return jnp.asarray(mdp_lib.loss_mask(mdp)), jnp.asarray(rewards), jnp.asarray(mdp.states)


def _batch(tables, prompt, rows, logp, values_all, greedy, k, behaviour_all=None, reference_all=None):
    """The library's Batch for K responses ``rows`` to ``prompt`` whose log-probs are ``logp`` [K, T]
    (``tables``: ``_tables`` of the MDP; with mu's and the reference policy's log-probs when given)."""
    mask_all, rewards_all, states = tables
    mask, rewards = mask_all[rows], rewards_all[prompt, rows]
    values = values_all[prompt][states[rows]]
    behaviour = None if behaviour_all is None else behaviour_all[prompt, rows]
    reference = None if reference_all is None else reference_all[prompt, rows]
    return core.Batch(mask=mask, rewards=rewards, logp=logp, values=values,
                      greedy_rewards=jnp.full((k,), greedy[prompt]), group_size=k, behaviour_logp=behaviour,
                      ref_logp=reference)


def correction_weights(algo: core.Estimator, hp, batch: core.Batch):
    """c_t [B, T] of ``spec_correction_weights`` for a preset; for an estimator of the user's, whose
    correction (if any) is its own, 1 on every response token (its ESS fraction is then 1)."""
    if isinstance(algo, core.Algorithm):
        return spec_correction_weights(algo.spec, hp, batch)
    return batch.mask


def spec_correction_weights(spec: core.Spec, hp: core.HParams, batch: core.Batch):
    """c_t [B, T], the factor the spec's off-policy correction puts on token t's term A_t grad log pi
    of the estimate at theta with pi_old = pi (0 on padding), for every ``Spec.correction``
    (``core.CORRECTIONS``); ``core.correction_weights`` covers only the importance-sampling levels:

      ignore                         1
      token, sequence, geometric     the limited weight of ``core.correction_weights`` (pi / mu)
      behaviour_ratio                the ratio's own factor against mu: rho-hat_t (eq. 16), i.e.
                                     rho_t = pi(a_t|s_t) / mu(a_t|s_t), or 0 where the clip is active
                                     (GSPO's sequence ratio for ratio 'sequence'; CISPO's
                                     min(rho_t, 1 + eps_high) for 'truncated_is')
    """
    mask = batch.mask
    if spec.correction == "ignore":
        return mask
    behaviour_logp = batch.behaviour_logp
    if batch.logp is None or behaviour_logp is None:
        raise ValueError(f"{spec.name}: correction {spec.correction!r} needs batch.logp and batch.behaviour_logp")
    logp = jax.lax.stop_gradient(batch.logp)
    if spec.correction != "behaviour_ratio":
        return core.correction_weights(logp, behaviour_logp, mask, spec.correction, spec.correction_mode,
                                       hp.is_cap, hp.is_floor)[0]
    if spec.ratio == "sequence":
        rho = core.sequence_ratio(logp, behaviour_logp, mask)
    else:
        rho = core.importance_ratio(logp, behaviour_logp)
    if spec.ratio == "truncated_is":
        return core.truncated_is_weight(rho, hp.clip_eps_high) * mask
    adv = core.advantages(spec, batch, hp)
    return core.modified_ratio(rho, adv, hp.clip_eps_low, hp.clip_eps_high, hp.dual_clip) * mask


_COMPILED: dict = {}


def _moments_fn(algo: core.Estimator, hp, k: int):
    """The jitted chunk moments (sum_i w_i g_i, sum_i w_i |g_i|^2 and the weighted sums of E[sum_t 1],
    E[sum_t c_t], E[sum_t c_t^2]) for one (estimator, hyperparameters, K); kept, so that audits of MDPs of
    the same shapes, at other parameters, policies or behaviour policies, reuse its compilation (a preset
    is known by its spec, any other estimator by its identity). ``hp`` stays a constant of the program
    (as the loss sees it eagerly: its concrete checks still raise).

    theta enters a batch only through its log-probs, so one tuple's estimate is, by the chain rule,

      g = -sum_{k,t} dL/dlogp_{k,t} J[p, tau_k, t],      J = d logp / d theta [P, N, T, D],

    and with the Gram matrix G[p, n, t, m, u] = <J[p, n, t], J[p, m, u]>, both taken once per audit,

      sum_i w_i g_i   = -sum_{n,t} (sum_i w_i sum_k [tau_ik = n] dL_i/dlogp_{k,t}) J[p, n, t],
      |g_i|^2         = sum_{k,t,l,u} dL_i/dlogp_{k,t} dL_i/dlogp_{l,u} G[p, tau_ik, t, tau_il, u]:

    a tuple costs the loss's gradient in its own K x T log-probs, not a backward pass through the policy."""
    hp_key = tuple(np.asarray(x, np.float64).tobytes() for x in jax.tree.leaves(hp))
    static = algo.spec if isinstance(algo, core.Algorithm) else id(algo)
    key = (static, hp_key, k)
    hit = _COMPILED.get(key)
    if hit is not None and (isinstance(algo, core.Algorithm) or hit[1] is algo):
        return hit[0]

    def estimate(tables, logp_all, gram, values_all, greedy, behaviour_all, reference_all, prompt, rows):
        def batch(logp):
            return _batch(tables, prompt, rows, logp, values_all, greedy, k, behaviour_all, reference_all)
        logp = logp_all[prompt, rows]                                                     # [K, T]
        c = correction_weights(algo, hp, batch(logp))
        sums = jnp.stack([jnp.sum(tables[0][rows]), jnp.sum(c), jnp.sum(c * c)])
        dloss = jax.grad(lambda lp: estimate_loss(algo, batch(lp), hp))(logp)            # [K, T]
        pairs = gram[prompt][rows[:, None], :, rows[None, :], :]                       # [K, K, T, T]
        square = jnp.einsum("kt,kltu,lu->", dloss, pairs, dloss)
        return dloss, square, sums

    @jax.jit
    def moments(tables, logp_all, jacobian, gram, values_all, greedy, behaviour_all, reference_all, prompt, rows,
                weights):
        dloss, square, sums = jax.vmap(estimate, in_axes=(None,) * 8 + (0,))(
            tables, logp_all, gram, values_all, greedy, behaviour_all, reference_all, prompt, rows)
        weighted = jnp.zeros(logp_all.shape[1:], dloss.dtype).at[rows].add(weights[:, None, None] * dloss)
        return -jnp.einsum("nt,ntd->d", weighted, jacobian[prompt]), weights @ square, weights @ sums

    if len(_COMPILED) >= 64:
        _COMPILED.clear()
    _COMPILED[key] = (moments, algo)
    return moments


def estimate_loss(algo: core.Estimator, batch: core.Batch, hp):
    """The estimator's loss on one batch as training computes it: advantages on that batch (the whole
    rollout), then the loss with that batch's normaliser."""
    prepared = batch.replace(advantages=algo.advantages(batch.replace(logp=jax.lax.stop_gradient(batch.logp)), hp))
    return algo.loss(prepared, hp, core.loss_normalizer(batch.mask, batch.group_size))[0]


def audit(mdp: mdp_lib.TokenMDP, policy, theta, algo: core.Estimator, hp=None,
          k: int = 2, chunk: int = 4096, state_baseline=None, behaviour_logits=None,
          reference_logits=None) -> AuditResult:
    """Exact E[g] and trace E[g g^T] of ``algo``'s gradient estimate with K samples per prompt
    (``algo``: a preset or any ``core.Estimator``; ``hp`` its hyperparameters, default its own).

    ``policy`` is ``(logits_fn, shape)`` from ``mdp.tabular_policy`` / ``shared_policy``.
    The value baseline b(s_t) is ``state_baseline`` ([P, S]), by default the exact
    V_pi(s_t); ReMax's is the greedy trajectory's reward. ``behaviour_logits`` ([P, S, V]):
    the sampler's policy mu, which draws the responses and gives ``Batch.behaviour_logp``
    (None: on-policy, mu = pi). ``reference_logits`` ([P, S, V]): the reference policy of the spec's
    KL term (``Batch.ref_logp``; None: none, and the term must be off; ``true_grad`` stays grad J of the
    MDP's reward, without the KL term, whatever the estimator regularises). The result also holds
    E[sum_t 1], E[sum_t c_t] and E[sum_t c_t^2] of the correction's token weights
    (``spec_correction_weights``). Memory: the log-probs' Jacobian [P, N, T, D] and its Gram matrix
    [P, N, T, N, T] (``_moments_fn``) are held for the whole audit, and each of the N^K / ``chunk``
    programs' calls handles ``chunk`` tuples.
    """
    logits_fn, _ = policy
    hp = algo.hparams if hp is None else hp
    theta = jnp.asarray(theta)
    logits = logits_fn(theta)
    values_all = mdp_lib.state_values(mdp, logits) if state_baseline is None else jnp.asarray(state_baseline)
    values_all = jax.lax.stop_gradient(values_all)
    greedy = jnp.asarray(mdp_lib.greedy_rewards(mdp, logits))
    sampler = logits if behaviour_logits is None else jnp.asarray(behaviour_logits, theta.dtype)
    behaviour_all = None if behaviour_logits is None else mdp_lib.loss_logprobs(mdp, sampler)
    reference_all = None if reference_logits is None else \
        mdp_lib.loss_logprobs(mdp, jnp.asarray(reference_logits, theta.dtype))
    traj_logp = np.asarray(jnp.sum(mdp_lib.step_logprobs(mdp, sampler), axis=2))         # [P, N]
    tuples = _tuples(mdp.num_trajectories, k)
    true_grad = np.asarray(jax.grad(lambda th: mdp_lib.objective(mdp, logits_fn(th)))(theta)).reshape(-1)
    moments = _moments_fn(algo, hp, k)
    tables = _tables(mdp)
    loss_logp = lambda th: mdp_lib.loss_logprobs(mdp, logits_fn(th))                     # noqa: E731
    logp_all = loss_logp(theta)                                                            # [P, N, T]
    jacobian = jax.jacfwd(loss_logp)(theta).reshape(logp_all.shape + (-1,))               # [P, N, T, D]
    gram = jnp.einsum("pntd,pmud->pntmu", jacobian, jacobian)                            # [P, N, T, N, T]

    algo.check_hparams(hp, k)
    mean = np.zeros(true_grad.shape)
    second = 0.0
    sums = np.zeros(3)
    for p in range(mdp.num_prompts):
        weights = np.exp(traj_logp[p][tuples].sum(axis=1)) * mdp.prompt_probs[p]
        for start in range(0, len(tuples), chunk):
            rows, w = tuples[start:start + chunk], weights[start:start + chunk]
            if len(rows) < chunk:  # pad with zero-weight tuples so one compiled shape serves all chunks
                pad = chunk - len(rows)
                rows = np.concatenate([rows, np.zeros((pad, k), rows.dtype)])
                w = np.concatenate([w, np.zeros(pad)])
            m, s, c = moments(tables, logp_all, jacobian, gram, values_all, greedy, behaviour_all, reference_all, p,
                              jnp.asarray(rows), jnp.asarray(w, theta.dtype))
            mean += np.asarray(m)
            second += float(s)
            sums += np.asarray(c)
    return AuditResult(mean=mean, second_moment_trace=second, true_grad=true_grad, token_count=float(sums[0]),
                       weight_sum=float(sums[1]), weight_sq_sum=float(sums[2]))


def per_step_rloo_audit(mdp: mdp_lib.TokenMDP, policy, theta, k: int) -> AuditResult:
    """The paper's per-time-step RLOO with K trajectories per prompt, each of which gets at
    every s_t the baseline b_t = mean return of K - 1 more continuations sampled from s_t.

    b_t does not depend on a_t and E[b_t | s_t] = V(s_t), so one trajectory's E[g]
    is that of the V(s_t) baseline (the library's loss, ``reinforce_baseline``), and
    the extra draws add, independently at every t, Var[b_t | s_t] = Var[G | s_t] / (K - 1):

      E|g_1|^2 = E|sum_t (G_t - V(s_t)) u_t|^2 + E[sum_t Var[G | s_t] / (K - 1) |u_t|^2],

    with u_t = grad log pi(a_t | s_t), exactly by enumeration. The K trajectories of a
    prompt are independent, so per prompt Cov of their average is Cov[g_1] / K.
    """
    if k < 2:
        raise ValueError(f"per-step RLOO needs K >= 2, got K={k}")
    logits_fn, _ = policy
    theta = jnp.asarray(theta)
    logits = logits_fn(theta)
    values = mdp_lib.state_values(mdp, logits)
    variance = mdp_lib.return_second_moments(mdp, logits) - values ** 2                 # [P, S]
    per_token = jax.jacrev(lambda th: mdp_lib.trajectory_logprobs(mdp, logits_fn(th)))(theta)
    u_sq = jnp.sum(per_token.reshape(per_token.shape[:3] + (-1,)) ** 2, axis=-1)         # [P, N, T]
    traj_p = jnp.exp(jnp.sum(mdp_lib.step_logprobs(mdp, logits), axis=2))               # [P, N]
    extra_per_traj = jnp.sum(variance[:, mdp.states] / (k - 1) * u_sq * jnp.asarray(mdp.mask)[None], axis=2)
    extra = np.asarray(jnp.sum(traj_p * extra_per_traj, axis=1))                         # [P]
    mean: np.ndarray | float = 0.0
    second = 0.0
    for p in range(mdp.num_prompts):
        one = dataclasses.replace(mdp, prompt_probs=np.eye(mdp.num_prompts)[p])
        single = audit(one, policy, theta, core.preset("reinforce_baseline"), k=1)
        single_second = single.second_moment_trace + extra[p]
        mean_sq = single.mean @ single.mean
        mean = mean + mdp.prompt_probs[p] * single.mean
        second += mdp.prompt_probs[p] * (mean_sq + (single_second - mean_sq) / k)
    true_grad = np.asarray(jax.grad(lambda th: mdp_lib.objective(mdp, logits_fn(th)))(theta)).reshape(-1)
    return AuditResult(mean=np.asarray(mean), second_moment_trace=second, true_grad=true_grad)


# (label, preset, hyperparameter changes): the paper's estimators and its GRPO ablations
# (labels are markdown: | is escaped).
ESTIMATORS: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("REINFORCE (eq. 10)", "reinforce", {}),
    ("REINFORCE + V(s_t) baseline (eq. 12)", "reinforce_baseline", {}),
    ("ReMax, greedy baseline (eq. 13)", "remax", {}),
    ("RLOO, 1/(K-1) (eq. 14)", "rloo", {}),
    ("group mean, 1/K", "rloo", {"leave_one_out": 0.0}),
    ("PPO, multiple sampling (eq. 19)", "ppo_multi_sample", {}),
    ("GRPO, / std and / |o| (eq. 18, no KL)", "grpo", {"kl_coef": 0.0}),
    ("GRPO without / |o| (std only)", "grpo", {"kl_coef": 0.0, "divide_by_length": 0.0}),
    ("GRPO without / std (|o| only)", "grpo", {"kl_coef": 0.0, "divide_by_std": 0.0}),
    ("Dr. GRPO (eq. 21)", "dr_grpo", {}),
    ("PPO at theta_old, GAE(0.95), whitened", "ppo", {}),
)


def audit_table(mdp: mdp_lib.TokenMDP, policy, theta, k: int, extra: tuple = ()) -> str:
    """Markdown table of every estimator in ``ESTIMATORS`` on ``mdp``, then ``extra``'s ((label,
    estimator) pairs: estimators of the user's, at their own hyperparameters)."""
    results = []
    for label, name, changes in ESTIMATORS:
        algo = core.preset(name)
        results.append((label, audit(mdp, policy, theta, algo, algo.hparams.replace(**changes), k=k)))
    results += [(label, audit(mdp, policy, theta, estimator, k=k)) for label, estimator in extra]
    greedy_table = mdp_lib.greedy_state_values(mdp, policy[0](jnp.asarray(theta)))
    results.append(("per-step greedy baseline G-hat_t from every s_t (eq. 13)",
                    audit(mdp, policy, theta, core.preset("reinforce_baseline"), k=k, state_baseline=greedy_table)))
    results.append((f"per-step RLOO: K-1 = {k - 1} continuations from every s_t",
                    per_step_rloo_audit(mdp, policy, theta, k)))
    return markdown.table(["estimator", "scale c", "direction bias", "cosine", "total variance"],
                          [[label, f"{r.scale:.4f}", bias_cell(r.direction_bias), f"{r.cosine:.4f}",
                            f"{r.total_variance:.4f}"] for label, r in results])


def bias_cell(x: float, fmt: str = ".2e") -> str:
    """A direction bias as the exact tables show it: ``x`` in the format ``fmt``, or ``< 1e-12`` (zero up
    to float64 rounding)."""
    return f"{x:{fmt}}" if x > 1e-12 else "< 1e-12"


def report(k: int = 4, vocab: int = 3, horizon: int = 3, prompts: int = 3, reward: str = "outcome",
           policy: str = "tabular", seed: int = 0, extra: tuple = ()) -> str:
    """The audit tables for one prompt and for ``prompts`` prompts of mixed difficulty (``extra``: rows
    of the user's estimators, ``audit_table``)."""
    mdp = mdp_lib.make_mdp(vocab, horizon, prompts, reward, seed)
    pol = mdp_lib.tabular_policy(mdp) if policy == "tabular" else mdp_lib.shared_policy(mdp)
    theta = jnp.asarray(np.random.default_rng(seed + 1).normal(size=pol[1]) * 0.5, jnp.float64)
    probs = np.exp(np.asarray(jnp.sum(mdp_lib.trajectory_logprobs(mdp, pol[0](theta)), axis=2)))
    success = (probs * mdp.outcome_rewards).sum(axis=1)
    first = np.eye(prompts)[0]
    single = dataclasses.replace(mdp, prompt_probs=first)
    lines = [f"Token MDP: vocabulary {vocab} (EOS = 0), horizon {horizon}, {mdp.num_trajectories} trajectories "
             f"per prompt, {reward} rewards, {policy} policy, K = {k}, seed {seed}.",
             f"Expected reward of each prompt under theta: {np.array2string(success, precision=3)}.", "",
             "One prompt (prompt 0):", "", audit_table(single, pol, theta, k, extra), "",
             f"{prompts} prompts of mixed difficulty, uniform p_0:", "", audit_table(mdp, pol, theta, k, extra)]
    return "\n".join(lines)


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(prog="python -m pgjax.theory.audit",
                                     description="Exact bias and variance of every estimator of the paper.")
    parser.add_argument("--k", type=int, default=4, help="samples per prompt")
    parser.add_argument("--vocab", type=int, default=3)
    parser.add_argument("--horizon", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--reward", choices=["outcome", "process"], default="outcome")
    parser.add_argument("--policy", choices=["tabular", "shared"], default="tabular")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--estimator", action="append", default=[], metavar="PACKAGE.MODULE:NAME",
                        help="also audit this estimator of your own (an import path, as algorithm.preset takes; "
                             "repeatable), at its default hyperparameters")
    args = parser.parse_args(argv)
    try:
        extra = tuple((path, named_estimator(path, "--estimator")) for path in args.estimator)
    except ValueError as error:
        parser.error(str(error))
    with jax.enable_x64(True):
        print(report(args.k, args.vocab, args.horizon, args.prompts, args.reward, args.policy, args.seed, extra))


if __name__ == "__main__":
    main()
