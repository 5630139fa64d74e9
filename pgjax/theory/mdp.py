"""Token-level MDPs small enough to enumerate every trajectory (the paper's token-level MDP).

A prompt p is the initial state; the state s_t is the prompt plus the tokens
generated so far; the transition is deterministic (s_{t+1} = s_t | a_t); an
episode ends when the EOS token is emitted or after ``horizon`` tokens
(truncation). With V tokens and horizon H there are
sum_{l<H} (V-1)^l states per prompt and sum_{l=1..H} (V-1)^(l-1) + (V-1)^H
trajectories (V = 3, H = 3: 7 states, 15 trajectories).

Arrays (N trajectories, S states, T = H positions):
  tokens [N, T] int, mask [N, T] float (1 on generated tokens, EOS included),
  states [N, T] int (index of the prefix each token was sampled from; 0 off the mask).
A policy is any function ``theta -> logits [P, S, V]``; ``tabular_policy``
has one logit vector per (prompt, prefix), ``shared_policy`` shares parameters
across prefixes (logits from the prompt, the position and the last token).
"""
from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TokenMDP:
    """An enumerated token MDP with P prompts.

    prompt_probs: [P] p_0 over prompts.
    rewards: [P, N, T] per-token rewards R(s_t, a_t) (an outcome reward sits on the last token).
    outcome: whether the rewards are outcome rewards (a single non-zero per trajectory).
    state_depth, state_last: [S] position t and last token of each prefix (-1 for the empty prefix).

    Environment steps (multi-turn episodes, ``pgjax.theory.multiturn``): ``env_mask`` [N, T] marks the
    tokens the environment appended (an observation after the policy's end of turn) and
    ``env_logprobs`` [P, N, T] their known log-probabilities log q(o_t | s_t), which the policy does not
    change; ``mask`` marks the policy's actions only. None: every token is the policy's (single turn).
    ``env_in_loss``: the estimator is handed the environment's tokens as if they were actions, mask 1
    and log pi(o_t | s_t), the mistake a library makes when it trains on observation tokens
    (``loss_mask``, ``loss_logprobs``); the trajectories are still drawn with q.
    """
    vocab: int
    horizon: int
    eos: int
    tokens: np.ndarray
    mask: np.ndarray
    states: np.ndarray
    state_depth: np.ndarray
    state_last: np.ndarray
    prompt_probs: np.ndarray
    rewards: np.ndarray
    outcome: bool
    env_mask: np.ndarray | None = None
    env_logprobs: np.ndarray | None = None
    env_in_loss: bool = False

    @property
    def num_prompts(self) -> int:
        return self.rewards.shape[0]

    @property
    def num_trajectories(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_states(self) -> int:
        return self.state_depth.shape[0]

    @property
    def lengths(self) -> np.ndarray:
        return self.mask.sum(axis=1).astype(int)

    @property
    def outcome_rewards(self) -> np.ndarray:
        """[P, N] total reward of each trajectory (the outcome reward r_k for outcome MDPs)."""
        return self.rewards.sum(axis=2)


def enumerate_trajectories(vocab: int, horizon: int, eos: int = 0):
    """Every trajectory and prefix of the token tree: (tokens, mask, states, state_depth, state_last)."""
    if vocab < 2 or horizon < 1 or not 0 <= eos < vocab:
        raise ValueError(f"need vocab >= 2, horizon >= 1 and 0 <= eos < vocab; got {vocab=}, {horizon=}, {eos=}")
    others = [a for a in range(vocab) if a != eos]
    prefixes: list[tuple[int, ...]] = [()]
    for depth in range(1, horizon):
        prefixes += [p for p in itertools.product(others, repeat=depth)]
    index = {p: i for i, p in enumerate(prefixes)}
    trajectories = [p + (eos,) for p in prefixes] + list(itertools.product(others, repeat=horizon))
    n = len(trajectories)
    tokens = np.zeros((n, horizon), np.int32)
    mask = np.zeros((n, horizon))
    states = np.zeros((n, horizon), np.int32)
    for i, traj in enumerate(trajectories):
        tokens[i, :len(traj)] = traj
        mask[i, :len(traj)] = 1.0
        states[i, :len(traj)] = [index[traj[:t]] for t in range(len(traj))]
    state_depth = np.array([len(p) for p in prefixes])
    last = np.array([p[-1] if p else -1 for p in prefixes])
    return tokens, mask, states, state_depth, last


def make_mdp(vocab: int = 3, horizon: int = 3, prompts: int = 3, reward: str = "outcome", seed: int = 0,
             eos: int = 0) -> TokenMDP:
    """A random MDP whose prompts differ in difficulty.

    ``reward="outcome"``: each prompt p marks a random subset of trajectories
    correct (r = 1, else 0); prompt p's subset has about a fraction
    (p + 1) / (P + 1) of the trajectories, so prompts range from hard to easy,
    and correct and incorrect responses of every prompt have different lengths.
    ``reward="process"``: R(s_t, a_t) ~ N(0, 1) per (prompt, prefix, token).
    """
    tokens, mask, states, depth, last = enumerate_trajectories(vocab, horizon, eos)
    rng = np.random.default_rng(seed)
    n, s = tokens.shape[0], depth.shape[0]
    if reward == "outcome":
        rewards = np.zeros((prompts, n, horizon))
        last_pos = mask.sum(1).astype(int) - 1
        for p in range(prompts):
            correct = rng.random(n) < (p + 1) / (prompts + 1)
            correct[rng.integers(n)] = True  # every prompt is solvable
            rewards[p, np.arange(n), last_pos] = correct.astype(float)
    elif reward == "process":
        table = rng.normal(size=(prompts, s, vocab))
        rewards = table[:, states, tokens] * mask[None]
    else:
        raise ValueError(f"unknown reward kind {reward!r}; expected 'outcome' or 'process'")
    return TokenMDP(vocab=vocab, horizon=horizon, eos=eos, tokens=tokens, mask=mask, states=states,
                    state_depth=depth, state_last=last, prompt_probs=np.full(prompts, 1.0 / prompts),
                    rewards=rewards, outcome=reward == "outcome")


def tabular_policy(mdp: TokenMDP):
    """theta [P, S, V] are the logits themselves: one logit vector per (prompt, prefix)."""
    def logits(theta):
        return theta
    return logits, (mdp.num_prompts, mdp.num_states, mdp.vocab)


def shared_policy(mdp: TokenMDP):
    """Logits from shared parameters: prompt[p] + position[t] + last_token[a_{t-1}] (BOS for t = 0).

    theta is a flat vector of P*V + H*V + (V+1)*V parameters.
    """
    p, h, v = mdp.num_prompts, mdp.horizon, mdp.vocab
    depth, last = jnp.asarray(mdp.state_depth), jnp.asarray(np.where(mdp.state_last < 0, v, mdp.state_last))

    def logits(theta):
        prompt = theta[:p * v].reshape(p, v)
        position = theta[p * v:(p + h) * v].reshape(h, v)
        previous = theta[(p + h) * v:].reshape(v + 1, v)
        return prompt[:, None, :] + (position[depth] + previous[last])[None]
    return logits, ((p + h + v + 1) * v,)


def _token_logprobs(mdp: TokenMDP, logits: Array, mask) -> Array:
    """log pi(token_t | s_t) [P, N, T] at the positions of ``mask`` [N, T], 0 elsewhere."""
    logpi = jax.nn.log_softmax(logits, axis=-1)                    # [P, S, V]
    per_token = logpi[:, mdp.states, mdp.tokens]                   # [P, N, T]
    return jnp.where(jnp.asarray(mask)[None] > 0, per_token, 0.0)


def trajectory_logprobs(mdp: TokenMDP, logits: Array) -> Array:
    """log pi(a_t | s_t) of every action of every trajectory, [P, N, T], 0 off the mask."""
    return _token_logprobs(mdp, logits, mdp.mask)


def step_mask(mdp: TokenMDP) -> np.ndarray:
    """[N, T] 1 on every step of a trajectory: the policy's actions and the environment's tokens."""
    return mdp.mask if mdp.env_mask is None else mdp.mask + mdp.env_mask


def step_logprobs(mdp: TokenMDP, logits: Array) -> Array:
    """The log-probability of every step of every trajectory, [P, N, T]: log pi(a_t | s_t) at the
    policy's actions, log q(o_t | s_t) at the environment's tokens; their sum over t is the
    trajectory's log-probability under the policy and the environment."""
    logp = trajectory_logprobs(mdp, logits)
    return logp if mdp.env_logprobs is None else logp + jnp.asarray(mdp.env_logprobs, logp.dtype)


def loss_mask(mdp: TokenMDP) -> np.ndarray:
    """[N, T] the tokens an estimator's loss counts: the policy's actions, and the environment's
    tokens too when ``env_in_loss`` (the mistake the multi-turn audit measures)."""
    return step_mask(mdp) if mdp.env_in_loss else mdp.mask


def loss_logprobs(mdp: TokenMDP, logits: Array) -> Array:
    """log pi(token_t | s_t) [P, N, T] at ``loss_mask``'s tokens: what the estimator differentiates."""
    return _token_logprobs(mdp, logits, loss_mask(mdp))


def objective(mdp: TokenMDP, logits: Array) -> Array:
    """J(theta) = sum_p p0(p) sum_tau P_theta(tau | p) R(tau) (eq. 6), exactly; P_theta is pi's
    probability of the trajectory's actions times the environment's of its tokens."""
    probs = jnp.exp(jnp.sum(step_logprobs(mdp, logits), axis=2))    # [P, N]
    return jnp.sum(jnp.asarray(mdp.prompt_probs) * jnp.sum(probs * jnp.asarray(mdp.outcome_rewards), axis=1))


def _suffix_weighted(mdp: TokenMDP, logits: Array, power: int) -> Array:
    """sum over trajectories through s of P(rest of tau | s) G_s^power, [P, S], at every step's state."""
    logp = step_logprobs(mdp, logits)
    suffix_logp = jnp.flip(jnp.cumsum(jnp.flip(logp, 2), axis=2), 2)            # log P(steps t.. | s_t)
    returns_to_go = jnp.flip(jnp.cumsum(jnp.flip(jnp.asarray(mdp.rewards), 2), axis=2), 2)      # G_t
    weight = jnp.exp(suffix_logp) * returns_to_go ** power * jnp.asarray(step_mask(mdp))[None]
    return jnp.zeros((mdp.num_prompts, mdp.num_states), weight.dtype).at[:, mdp.states].add(weight)


def state_values(mdp: TokenMDP, logits: Array) -> Array:
    """V_pi(s) of every (prompt, prefix), [P, S], undiscounted (eq. 2), exactly.

    V(s) = sum over trajectories through s of P(rest of tau | s) * (return from s).
    """
    return _suffix_weighted(mdp, logits, 1)


def return_second_moments(mdp: TokenMDP, logits: Array) -> Array:
    """E_pi[G^2 | s] of every (prompt, prefix), [P, S]; Var[G | s] = this - V(s)^2."""
    return _suffix_weighted(mdp, logits, 2)


def greedy_state_values(mdp: TokenMDP, logits) -> Array:
    """[P, S] return of the greedy completion from every prefix (the paper's ReMax b_t = G-hat_t, eq. 13).

    Trajectory n is the greedy completion of its prefix at t when every action from t on
    is the argmax of its state's logits (a reverse cumulative AND); its return-to-go
    G_t is then the prefix's greedy value. Where the environment takes steps the greedy
    completion is random: its value is the expectation over the environment's tokens
    (each greedy trajectory weighted by q of its tokens after t). Jittable.
    """
    best = jnp.argmax(logits, axis=-1)                                               # [P, S]
    mask = jnp.asarray(mdp.mask)[None] > 0
    agrees = (best[:, mdp.states] == mdp.tokens) | ~mask                              # [P, N, T]
    steps = jnp.asarray(step_mask(mdp))[None] > 0
    greedy_from = jnp.flip(jnp.cumprod(jnp.flip(agrees, 2), axis=2), 2).astype(bool) & steps
    rewards = jnp.asarray(mdp.rewards)
    returns_to_go = jnp.flip(jnp.cumsum(jnp.flip(rewards, 2), axis=2), 2)
    if mdp.env_logprobs is not None:
        env = jnp.asarray(mdp.env_logprobs, returns_to_go.dtype)
        returns_to_go = returns_to_go * jnp.exp(jnp.flip(jnp.cumsum(jnp.flip(env, 2), axis=2), 2))
    out = jnp.zeros((mdp.num_prompts, mdp.num_states), returns_to_go.dtype)
    return out.at[:, mdp.states].add(jnp.where(greedy_from, returns_to_go, 0.0))


def greedy_rewards(mdp: TokenMDP, logits) -> Array:
    """[P] total reward of the greedy trajectory of each prompt (ReMax's baseline from s_0, eq. 13)."""
    return greedy_state_values(mdp, logits)[:, 0]
