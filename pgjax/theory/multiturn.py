"""Multi-turn episodes as enumerable token MDPs, and what masking the environment's tokens does.

The paper's token-level MDP has deterministic transitions: s_{t+1} = s_t | a_t. A multi-turn episode
is the same MDP with the environment taking steps too: after the policy's end-of-turn token (or
``horizon`` tokens) the environment appends an observation token o drawn from a known q(o | s), which
the policy's parameters do not change, then the policy's next turn begins; ``turns`` turns in all.
The policy gradient sums grad log pi over the policy's actions only:

    grad J = E[ sum_{t: action} grad log pi(a_t | s_t) G_t ]          (q has no theta in it)

A library that trains on the observation tokens adds sum_{t: observation} A_t grad log pi(o_t | s_t),
whose expectation is not 0: under q, E_q[grad log pi(o | s)] = -grad KL(q || pi)(s), which pulls pi
towards imitating the environment, and A_t is correlated with o. ``masking_table`` measures that
bias exactly for each estimator of the paper, with outcome and per-turn rewards, by enumerating every
K-tuple of episodes (``pgjax.theory.audit``, the library's own ``core.loss``). Masked, every estimator
keeps the bias it has in the single-turn audit (none for REINFORCE, its baselines, RLOO and, up to its
scale K - 1, Dr. GRPO); included, every one is biased in direction.

``make_multiturn_mdp`` builds the MDP: a turn is a sequence of the single-turn token tree (EOT = 0);
an observation is one of the tokens 1..``observations`` (the same vocabulary, as a tool's output is
in the language model's), q(o | s) a random distribution for each (prompt, history); the outcome
reward is 1 when the last turn opens with the token the prompt maps the last observation to (the
policy must read the observation to be right), and per-turn rewards add 0.5 for every turn but the
last that ends with its end-of-turn token (a well-formed call).
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from pgjax import core, markdown
from pgjax.theory import audit as audit_lib
from pgjax.theory import mdp as mdp_lib

EOT = 0
TURN_REWARD = 0.5


def _episodes(vocab: int, horizon: int, turns: int, observations: int) -> list[tuple[tuple, ...]]:
    """Every episode as its parts: turn, observation, turn, ..., turn."""
    replies = [tuple(int(t) for t in row[mask > 0]) for row, mask in
               zip(*mdp_lib.enumerate_trajectories(vocab, horizon, EOT)[:2], strict=True)]
    parts = [replies] + [[(o,) for o in range(1, observations + 1)], replies] * (turns - 1)
    return list(itertools.product(*parts))


def make_multiturn_mdp(vocab: int = 3, horizon: int = 2, turns: int = 2, observations: int = 2, prompts: int = 2,
                       reward: str = "outcome", seed: int = 0) -> mdp_lib.TokenMDP:
    """The multi-turn MDP of the module docstring (``reward``: ``outcome`` or ``per_turn``)."""
    if not 1 <= observations < vocab or turns < 2:
        raise ValueError(f"need 1 <= observations < vocab and turns >= 2; got {observations=}, {vocab=}, {turns=}")
    if reward not in ("outcome", "per_turn"):
        raise ValueError(f"unknown reward kind {reward!r}; expected 'outcome' or 'per_turn'")
    episodes = _episodes(vocab, horizon, turns, observations)
    length = turns * horizon + turns - 1
    histories: dict[tuple, int] = {}
    n = len(episodes)
    tokens, states = np.zeros((n, length), np.int32), np.zeros((n, length), np.int32)
    mask, env_mask = np.zeros((n, length)), np.zeros((n, length))
    rng = np.random.default_rng(seed)
    q_table: dict[tuple, np.ndarray] = {}
    env_logprobs = np.zeros((prompts, n, length))
    rewards = np.zeros((prompts, n, length))
    for e, parts in enumerate(episodes):
        flat = [t for part in parts for t in part]
        tokens[e, :len(flat)] = flat
        at = 0
        for index, part in enumerate(parts):
            environment = index % 2 == 1
            for token in part:
                history = tuple(flat[:at])
                states[e, at] = histories.setdefault(history, len(histories))
                (env_mask if environment else mask)[e, at] = 1.0
                if environment:
                    if history not in q_table:
                        q_table[history] = rng.dirichlet(np.ones(observations), size=prompts)
                    env_logprobs[:, e, at] = np.log(q_table[history][:, token - 1])
                at += 1
            if not environment and index < len(parts) - 1 and reward == "per_turn" and part[-1] == EOT:
                rewards[:, e, at - 1] += TURN_REWARD
        last_observation, answer = parts[-2][0], parts[-1][0]
        for p in range(prompts):
            rewards[p, e, at - 1] += float(answer == 1 + (last_observation - 1 + p) % (vocab - 1))
    order = sorted(histories, key=histories.__getitem__)
    return mdp_lib.TokenMDP(vocab=vocab, horizon=length, eos=EOT, tokens=tokens, mask=mask, states=states,
                            state_depth=np.array([len(h) for h in order]),
                            state_last=np.array([h[-1] if h else -1 for h in order]),
                            prompt_probs=np.full(prompts, 1.0 / prompts), rewards=rewards, outcome=reward == "outcome",
                            env_mask=env_mask, env_logprobs=env_logprobs)


# (label, preset, hyperparameter changes): the estimators of the paper the masking table audits
ESTIMATORS: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("REINFORCE (eq. 10)", "reinforce", {}),
    ("REINFORCE + V(s_t) baseline (eq. 12)", "reinforce_baseline", {}),
    ("ReMax, greedy baseline (eq. 13)", "remax", {}),
    ("RLOO, 1/(K-1) (eq. 14)", "rloo", {}),
    ("GRPO, / std and / |o| (eq. 18, no KL)", "grpo", {"kl_coef": 0.0}),
    ("Dr. GRPO (eq. 21)", "dr_grpo", {}),
)


def masking_audit(mdp: mdp_lib.TokenMDP, policy, theta, name: str, changes: dict, k: int, included: bool):
    """``audit.audit`` of one estimator with the environment's tokens masked out of its loss, or
    wrongly included (``TokenMDP.env_in_loss``)."""
    algo = core.preset(name)
    view = mdp_lib.TokenMDP(**{**mdp.__dict__, "env_in_loss": included})
    return audit_lib.audit(view, policy, theta, algo, algo.hparams.replace(**changes), k=k)


def masking_table(mdp: mdp_lib.TokenMDP, policy, theta, k: int) -> str:
    """Markdown: each estimator's exact scale c and direction bias against grad J (``audit.AuditResult``:
    c = 1 and no direction bias is unbiased), the environment's tokens masked and wrongly included,
    and the cosine of the included one's expected gradient with grad J."""
    rows = []
    for label, name, changes in ESTIMATORS:
        masked = masking_audit(mdp, policy, theta, name, changes, k, included=False)
        wrong = masking_audit(mdp, policy, theta, name, changes, k, included=True)
        rows.append([label, f"{masked.scale:.4f}", audit_lib.bias_cell(masked.direction_bias, ".4f"),
                     f"{wrong.scale:.4f}", audit_lib.bias_cell(wrong.direction_bias, ".4f"), f"{wrong.cosine:.4f}"])
    return markdown.table(["estimator", "masked: scale c", "masked: direction bias", "included: scale c",
                           "included: direction bias", "included: cosine"], rows)


def report(k: int = 2, vocab: int = 3, horizon: int = 2, turns: int = 2, observations: int = 2, prompts: int = 2,
           seed: int = 0, policy_kind: str = "shared") -> str:
    """The masking tables for outcome and per-turn rewards (``policy_kind``: ``shared`` or ``tabular``,
    ``pgjax.theory.mdp``)."""
    lines: list[str] = []
    for reward in ("outcome", "per_turn"):
        mdp = make_multiturn_mdp(vocab, horizon, turns, observations, prompts, reward, seed)
        policy = (mdp_lib.shared_policy if policy_kind == "shared" else mdp_lib.tabular_policy)(mdp)
        theta = jnp.asarray(np.random.default_rng(seed + 1).normal(size=policy[1]) * 0.5, jnp.float64)
        value = float(mdp_lib.objective(mdp, policy[0](theta)))
        if not lines:
            lines += [f"Multi-turn token MDP: vocabulary {vocab} (end of turn = 0), {turns} turns of up to "
                      f"{horizon} tokens, one observation token of {observations} between turns, "
                      f"{mdp.num_trajectories} episodes per prompt, {prompts} prompts, {policy_kind} policy, K = {k}, "
                      f"seed {seed}.", ""]
        lines += [f"{reward.replace('_', '-')} rewards (J = {value:.3f}):", "",
                  masking_table(mdp, policy, theta, k), ""]
    return "\n".join(lines).strip()


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(description="Exact bias of each estimator with observation tokens masked or "
                                                 "wrongly included, on enumerable multi-turn MDPs.")
    parser.add_argument("--k", type=int, default=2, help="episodes per prompt")
    parser.add_argument("--vocab", type=int, default=3)
    parser.add_argument("--horizon", type=int, default=2, help="tokens per turn at most")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--observations", type=int, default=2, help="values an observation token takes")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", choices=["shared", "tabular"], default="shared")
    args = parser.parse_args(argv)
    with jax.enable_x64(True):
        print(report(args.k, args.vocab, args.horizon, args.turns, args.observations, args.prompts, args.seed,
                     args.policy))


if __name__ == "__main__":
    main()
