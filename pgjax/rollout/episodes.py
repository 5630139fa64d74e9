"""Multi-turn rollouts: a policy and its environments (``pgjax.agents.environment``), the KV cache
carried across turns (``pgjax.sample.sampler``: ``start``, ``decode_turn``, ``append``).

``run_episodes`` plays one episode per row: K rows per example (row p * K + k, the group layout),
each with an environment of its own. The examples' opening messages (``Environment.reset``) are
rendered by the prompt format and prefilled once per example. Then, turn by turn, every live row
samples a reply up to its end-of-turn token, the host hands the reply's text to the row's
environment, and the environment's observation, rendered as the chat template renders it
(``PromptFormat.continuation``), is appended to the row's cache in one pass: no turn prefills the
history again. An episode ends when its environment says done, at ``EpisodeLimits.max_turns``, when
its tokens after the prompt would pass ``max_tokens``, or when a reply is cut by the turn's token
limit before its end of turn (``truncated``). A longer observation than ``max_observation_tokens``
has its content cut to fit, the cut marked and counted.

The environment is the user's code and sees what the policy wrote: a ``step`` that raises, returns
something that is not a ``Step`` (or one whose reward is not a number, whose observation is not a
list of ``{"role": str, "content": str}`` messages) ends that episode with ``ended="error"`` and its
message in ``Episodes.errors`` (``checked_step``), never the run; a non-finite reward is set to 0 and
named in ``Episodes.nonfinite``. ``episode_rollout`` leaves the prompt groups of such episodes out of
the update and counts them; the same error in every episode of a batch, on replies that differ
(``EnvironmentFailure``), stops the run, as does one repeating step after step (``Pipeline``). A
``RewardError`` from the task's verifier is not the environment's: it stops the run as in a
single-turn rollout.

``Episodes`` lays each episode out for the learner: the prompt left-padded, then the episode's
tokens in order, gap-free. Only the policy's tokens count (``mask``; they alone have sampler
log-probs): the environment's tokens are context. Each turn's reward sits on the turn's last
policy token, a token-level reward (``core.Batch.rewards`` [B, T]) that returns, GAE and the group
baselines treat as the paper's process rewards; the masked tokens between turns are not steps
(``core.returns``).
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import zlib
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from pgjax import core
from pgjax.agents.environment import Environment, Step
from pgjax.models.transformer import CausalLM
from pgjax.parallel.multihost import largest, to_global, to_host
from pgjax.rollout.batch import Rollout
from pgjax.rollout.collect import PromptFormat, RolloutConfig, left_pad, pad_id, trim_padding
from pgjax.sample.sampler import SamplingConfig, append, decode_turn, start
from pgjax.tasks import Conversation, RewardError, described_value, raised_text

CUT_MARK = " [cut]"
EPISODE_TALLIES = ("turns", "calls", "valid_calls", "observation_tokens", "cuts")     # per-episode, in ``Episodes``
# per-row statistics (environment_error_ids: the CRC-32 of the row's environment error, 0 if none)
EPISODE_STATS = (*EPISODE_TALLIES, "environment_errors", "environment_error_ids")
BLOCK_UNIT = 8                  # appended blocks are padded to a multiple of this (fewer compiled shapes)
ENDINGS = ("done", "turns", "tokens", "truncated", "error")
ENVIRONMENT_ERROR_REPEATS = 3   # steps in a row the same environment error may end episodes in before the run stops


class EpisodeError(Exception):
    """An environment's step raised, or returned something that is not a valid ``Step``: the episode
    ends there, recorded (``Episodes.errors``); the run goes on."""


class EnvironmentFailure(RewardError):
    """The environment failed the same way in every episode of a batch: the run stops (one line)."""


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """At most ``max_turns`` replies; at most ``max_tokens`` tokens after the prompt (replies and
    observations); an observation's content cut to fit ``max_observation_tokens`` tokens."""

    max_turns: int = 4
    max_tokens: int = 512
    max_observation_tokens: int = 128

    def __post_init__(self):
        for field in ("max_turns", "max_tokens", "max_observation_tokens"):
            if not (isinstance(getattr(self, field), int) and getattr(self, field) >= 1):
                raise ValueError(f"EpisodeLimits.{field} must be an integer >= 1, got {getattr(self, field)!r}")


@dataclasses.dataclass(frozen=True)
class Episodes:
    """R = P * K episodes as arrays (host NumPy), row p * K + k:

    tokens, attention_mask [R, W + N]: the prompt left-padded to W, then the episode's tokens (replies
    and observations in order), right-padded; mask [R, N] float: 1 on the policy's tokens;
    logprobs, policy_logprobs [R, N]: the sampler's log-probs of the policy's tokens (``Samples``'
    two kinds), 0 elsewhere; rewards [R, N]: each turn's reward on its last policy token;
    ``returns`` [R]: their sum; per episode: ``turns``, ``calls`` and ``valid_calls`` (summed from the
    steps' ``info``), ``correct`` (the last ``info["correct"]`` an environment gave, NaN if none),
    ``observation_tokens``, ``cuts`` (observations cut to fit), ``ended`` (one of
    ``ENDINGS``), ``truncated`` (the last reply cut before its end of turn); ``replies``: the texts;
    ``prefill_tokens``: the prompt and observation tokens the model read in (what re-prefilling each
    turn's whole history would have multiplied); ``errors``: per episode, the environment error that
    ended it (None: none); ``nonfinite``: per episode, the first non-finite reward its environment
    gave (None: none)."""

    tokens: np.ndarray
    attention_mask: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    policy_logprobs: np.ndarray
    rewards: np.ndarray
    returns: np.ndarray
    turns: np.ndarray
    calls: np.ndarray
    valid_calls: np.ndarray
    correct: np.ndarray
    observation_tokens: np.ndarray
    cuts: np.ndarray
    ended: list[str]
    truncated: np.ndarray
    replies: list[list[str]]
    prefill_tokens: int
    errors: list[str | None]
    nonfinite: list[str | None]


@dataclasses.dataclass
class _Row:
    """One episode in progress: its messages so far, its token segments (policy: ids, logq, logp;
    environment: ids), each turn's reward at its segment, and its counts."""

    turns: list[dict]
    segments: list[tuple] = dataclasses.field(default_factory=list)
    rewards: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    replies: list[str] = dataclasses.field(default_factory=list)
    used: int = 0
    calls: int = 0
    valid_calls: int = 0
    correct: float = float("nan")
    cuts: int = 0
    ended: str | None = None
    truncated: bool = False
    error: str | None = None
    nonfinite: str | None = None


def opening_turns(prompt_format: PromptFormat, messages: list[dict]) -> list[dict]:
    """An environment's opening messages as the prompt format renders them: through a chat template
    a ``Conversation`` (system prompt and the last user turn's template applied); as plain text one
    user turn of their contents, a blank line between."""
    if prompt_format.chat:
        return prompt_format.turns(Conversation(messages, name="reset()"))
    return prompt_format.turns("\n\n".join(str(m["content"]) for m in messages))


def opening_ids(tokenizer, prompt_format: PromptFormat, openings: list[list[dict]]) -> list[list[int]]:
    """The token ids the model reads for each of ``openings`` (environments' opening messages,
    ``opening_turns``): what an episode's prompt is."""
    texts = [prompt_format.render_turns(tokenizer, opening_turns(prompt_format, messages)) for messages in openings]
    return tokenizer(texts, add_special_tokens=prompt_format.special_tokens)["input_ids"]


def run_episodes(policy: CausalLM, tokenizer, environment: Callable[[], Environment], examples: Sequence[dict],
                 key, sampling: SamplingConfig, limits: EpisodeLimits, prompt_format: PromptFormat,
                 prompt_width: int, mesh: Mesh | None = None) -> Episodes:
    """Play ``sampling.n`` episodes of each of ``examples`` (module docstring), each row with its own
    ``environment()``; ``sampling.max_new_tokens`` bounds each reply and ``sampling.eos_ids`` end a
    turn. Turn t draws with ``key`` folded with t (turn 0 with ``key`` itself, so a one-turn episode
    samples what ``generate`` does: the same tokens, and with ``limits.max_turns`` = 1, whose cache is
    as long as ``generate``'s, the same log-probs to the last bit). On a ``mesh`` over several
    processes ``examples`` are this process's share: it plays its own rows, and the processes agree
    (``multihost.largest``) on whether a turn is left and on each observation block's width, so all
    call the same compiled decode and append."""
    n, rows = sampling.n, len(examples) * sampling.n
    environments = [_user_call(environment, "the environment factory") for _ in range(rows)]
    openings = [_user_call(lambda r=r, env=env: env.reset(examples[r // n]), f"{type(env).__name__}.reset")
                for r, env in enumerate(environments)]
    episodes = [_Row(opening_turns(prompt_format, messages)) for messages in openings]
    ids = opening_ids(tokenizer, prompt_format, openings)
    for r in range(rows):
        if ids[r] != ids[r - r % n]:
            raise ValueError(f"the environments of example {r // n} opened with different messages; reset(example) "
                             "must depend on the example alone")
    prompts, prompt_mask = left_pad(tokenizer, ids[::n], prompt_width)
    capacity = (prompt_width + limits.max_turns * sampling.max_new_tokens
                + (limits.max_turns - 1) * limits.max_observation_tokens)
    timeline = start(policy, prompts, prompt_mask, n, capacity, mesh)
    prefilled = int(prompt_mask.sum())
    for turn in range(limits.max_turns):
        budgets = np.array([0 if row.ended else min(sampling.max_new_tokens, limits.max_tokens - row.used)
                            for row in episodes])
        for row, budget in zip(episodes, budgets, strict=True):
            if not row.ended and budget <= 0:
                row.ended = "tokens"
        if not largest(any(row.ended is None for row in episodes), mesh):      # every process's rows
            break
        timeline, out = decode_turn(policy, timeline, key if turn == 0 else jax.random.fold_in(key, turn),
                                    np.where([row.ended is None for row in episodes], budgets, 0), sampling, mesh)
        fields = (out.response, out.lengths, out.ended, out.logprobs, out.policy_logprobs)
        host = jax.tree.map(np.asarray, fields) if mesh is None else to_host(fields, mesh)
        response, lengths, ended, logq, logp = host
        blocks = {}
        for r, row in enumerate(episodes):
            if row.ended is None:
                observation = _take_turn(row, environments[r], tokenizer, prompt_format, sampling.eos_ids, limits,
                                         response[r, :lengths[r]], logq[r, :lengths[r]], logp[r, :lengths[r]],
                                         bool(ended[r]), last_turn=turn == limits.max_turns - 1)
                if observation is not None:
                    blocks[r] = observation
        longest = largest(max(map(len, blocks.values()), default=0), mesh)    # one shape on every process
        if longest:
            width = min(-(-longest // BLOCK_UNIT) * BLOCK_UNIT, limits.max_observation_tokens)
            tokens, mask = np.full((rows, width), pad_id(tokenizer), np.int32), np.zeros((rows, width), np.int32)
            for r, block in blocks.items():
                tokens[r, width - len(block):], mask[r, width - len(block):] = block, 1
            timeline = append(policy, timeline, tokens, mask, mesh)
            prefilled += int(mask.sum())
    for row in episodes:
        row.ended = row.ended or "turns"
    _check_systematic(episodes, mesh)
    return _assemble(episodes, prompts.repeat(n, axis=0), prompt_mask.repeat(n, axis=0), prefilled)


def _user_call(call: Callable, what: str):
    """``call()``, the user's code that starts an episode (no reply of the policy's in it): any
    exception is an EnvironmentFailure naming ``what`` and the ``file:line`` it was raised at."""
    try:
        return call()
    except RewardError:
        raise
    except Exception as error:                     # the user's environment
        raise EnvironmentFailure(f"{what} raised {raised_text(error)}") from None


def _check_systematic(episodes: list[_Row], mesh: Mesh | None) -> None:
    """EnvironmentFailure when every episode of every process ended in the same environment error, on
    replies that differ: an environment broken for any reply, not one a reply found (greedy episodes
    of one prompt all find the same)."""
    errors = {row.error for row in episodes}
    alike = len(errors) == 1 and None not in errors
    varied = len({row.replies[-1] if row.replies else "" for row in episodes}) >= 2
    if not largest(int(not alike), mesh) and largest(int(varied), mesh):
        raise EnvironmentFailure(f"the environment failed in every episode: {errors.pop()}")


def checked_step(environment: Environment, reply: str) -> Step:
    """``environment.step(reply)``, checked (``step_problem``); EpisodeError naming the environment and
    what went wrong (an exception with the ``file:line`` it was raised at). A ``RewardError`` (the
    task's verifier) passes through."""
    name = type(environment).__name__
    try:
        step = environment.step(reply)
    except (RewardError, EpisodeError):
        raise
    except Exception as error:                     # the user's environment, on the policy's reply
        raise EpisodeError(f"{name}.step raised {raised_text(error)}") from None
    problem = step_problem(step)
    if problem:
        raise EpisodeError(f"{name}.step returned {problem}")
    return step


def step_problem(step) -> str | None:
    """What makes ``step`` unusable (None: nothing): not a ``Step``; a reward that is not a real number
    (a string, even ``"1.0"``, included); an observation that is not a list of ``{"role": str,
    "content": str}`` messages; ``info`` that is not a dict, or whose ``calls``, ``valid_calls`` or
    ``correct`` are not numbers; ``done`` that is not a bool."""
    if not isinstance(step, Step):
        return f"{described_value(step)}, not a pgjax.agents.Step"
    if step.reward is not None and not isinstance(step.reward, numbers.Real):
        return f"reward {described_value(step.reward)}: a reward is a number or None"
    messages = step.observation
    if messages is not None and not (isinstance(messages, list | tuple) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages)):
        return f"observation {described_value(messages)}: a list of {{'role': str, 'content': str}} messages, or None"
    if not isinstance(step.info, dict) or not all(isinstance(step.info.get(key, 0), numbers.Real)
                                                  for key in ("calls", "valid_calls", "correct")):
        return f"info {described_value(step.info)}: a dict whose calls, valid_calls and correct are numbers"
    if not isinstance(step.done, bool | np.bool_):
        return f"done {described_value(step.done)}: True or False"
    return None


def _take_turn(row: _Row, environment: Environment, tokenizer, prompt_format: PromptFormat, eos_ids,
               limits: EpisodeLimits, ids, logq, logp, ended: bool, last_turn: bool) -> np.ndarray | None:
    """Record the row's reply (``ids``, ending the turn if ``ended`` with one of ``eos_ids``), step its
    environment, and return the observation's token ids to append (None: the episode ended)."""
    row.segments.append(("policy", ids, logq, logp))
    row.used += len(ids)
    closing = ended and len(ids) and int(ids[-1]) in eos_ids
    reply = tokenizer.decode(ids[:-1] if closing else ids)
    reply_end = tokenizer.decode(ids[-1:]) if closing else ""
    row.replies.append(reply)
    try:
        step = checked_step(environment, reply)
    except EpisodeError as error:
        row.error, row.ended, row.truncated = str(error), "error", not ended
        return None
    if step.reward is not None:
        reward = float(step.reward)
        if not math.isfinite(reward):
            row.nonfinite = row.nonfinite or (f"{type(environment).__name__}.step returned reward {reward} at turn "
                                              f"{len(row.replies)}")
            reward = 0.0
        row.rewards.append((len(row.segments) - 1, reward))
    row.calls += int(step.info.get("calls", 0))
    row.valid_calls += int(step.info.get("valid_calls", 0))
    row.correct = float(step.info.get("correct", row.correct))
    row.ended = ("done" if step.done else "truncated" if not ended else "turns" if last_turn else None)
    row.truncated = not ended                   # the reply was cut by its token limit, as a single-turn one is
    if row.ended:
        return None
    observation = list(step.observation or [])
    continuation = _fitted(tokenizer, prompt_format, row.turns, reply, reply_end, observation, limits, row)
    row.turns = [*row.turns, {"role": "assistant", "content": reply}, *observation]
    if row.used + len(continuation) > limits.max_tokens:
        row.ended = "tokens"
        return None
    row.segments.append(("environment", continuation))
    row.used += len(continuation)
    return continuation


def _fitted(tokenizer, prompt_format: PromptFormat, turns, reply: str, reply_end: str, observation: list[dict],
            limits: EpisodeLimits, row: _Row) -> np.ndarray:
    """The observation's token ids (``PromptFormat.continuation``), its messages' contents cut from
    the end, ``CUT_MARK`` added, until they fit ``limits.max_observation_tokens`` (the messages in
    ``observation`` are replaced by the cut ones)."""
    for _ in range(4):
        text = prompt_format.continuation(tokenizer, turns, reply, reply_end, observation)
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)
        excess = len(ids) - limits.max_observation_tokens
        if excess <= 0:
            return ids
        longest = max(range(len(observation)), key=lambda i: len(str(observation[i]["content"])), default=None)
        content = tokenizer(str(observation[longest]["content"]), add_special_tokens=False)["input_ids"] \
            if longest is not None else []
        mark = len(tokenizer(CUT_MARK, add_special_tokens=False)["input_ids"])
        keep = len(content) - excess - mark - 1
        if longest is None or keep < 0:     # (no content to cut: keep < 0 too)
            raise ValueError(f"an observation's framing alone takes more than max_observation_tokens = "
                             f"{limits.max_observation_tokens} tokens: raise it")
        observation[longest] = {**observation[longest], "content": tokenizer.decode(content[:keep]) + CUT_MARK}
        row.cuts += 1
    raise ValueError("an observation could not be cut to max_observation_tokens (its tokenization keeps growing)")


def _assemble(episodes: list[_Row], prompts: np.ndarray, prompt_mask: np.ndarray, prefilled: int) -> Episodes:
    """``Episodes`` from the finished rows: each row's segments laid out after its prompt, gap-free."""
    ended = [row.ended for row in episodes if row.ended is not None]
    if len(ended) != len(episodes):
        raise ValueError("an episode to lay out has not ended")
    rows, width = prompts.shape
    length = max(1, max(sum(len(s[1]) for s in row.segments) for row in episodes))
    length = -(-length // BLOCK_UNIT) * BLOCK_UNIT
    tokens = np.concatenate([prompts, np.zeros((rows, length), prompts.dtype)], axis=1)
    attention = np.concatenate([prompt_mask, np.zeros((rows, length), np.int32)], axis=1)
    mask, logq, logp, rewards = (np.zeros((rows, length), np.float32) for _ in range(4))
    observation_tokens = np.zeros(rows, np.int32)
    for r, row in enumerate(episodes):
        at, ends = 0, []
        for segment in row.segments:
            ids = segment[1]
            tokens[r, width + at:width + at + len(ids)] = ids
            attention[r, width + at:width + at + len(ids)] = 1
            if segment[0] == "policy":
                mask[r, at:at + len(ids)] = 1.0
                logq[r, at:at + len(ids)], logp[r, at:at + len(ids)] = segment[2], segment[3]
            else:
                observation_tokens[r] += len(ids)
            at += len(ids)
            ends.append(at - 1)
        for index, reward in row.rewards:
            if len(row.segments[index][1]):
                rewards[r, ends[index]] += reward
    return Episodes(tokens=tokens, attention_mask=attention, mask=mask, logprobs=logq, policy_logprobs=logp,
                    rewards=rewards, returns=np.array([sum(v for _, v in row.rewards) for row in episodes], np.float32),
                    turns=np.array([sum(s[0] == "policy" for s in row.segments) for row in episodes], np.int32),
                    calls=np.array([row.calls for row in episodes], np.int32),
                    valid_calls=np.array([row.valid_calls for row in episodes], np.int32),
                    correct=np.array([row.correct for row in episodes], np.float32),
                    observation_tokens=observation_tokens, cuts=np.array([row.cuts for row in episodes], np.int32),
                    ended=ended, truncated=np.array([row.truncated for row in episodes]),
                    replies=[row.replies for row in episodes], prefill_tokens=prefilled,
                    errors=[row.error for row in episodes], nonfinite=[row.nonfinite for row in episodes])


def demonstrated_episodes(tokenizer, environment: Callable[[], Environment], examples: Sequence[dict],
                          limits: EpisodeLimits, prompt_format: PromptFormat, prompt_width: int, end_id: int,
                          reply_tokens: int) -> Episodes:
    """Each example's worked episode, one row each: its environment's ``demonstration(example)``
    replies played in turn as ``run_episodes`` plays sampled ones (each reply tokenized and closed with
    ``end_id``, the observations rendered, cut and counted alike), laid out as ``Episodes`` (log-probs
    0). ValueError for an environment without ``demonstration``, a reply longer than
    ``reply_tokens``, and a demonstration that does not end its episode (done, and correct where the
    environment says) within ``limits``."""
    environments = [environment() for _ in examples]
    openings = [env.reset(example) for env, example in zip(environments, examples, strict=True)]
    prompts, prompt_mask = left_pad(tokenizer, opening_ids(tokenizer, prompt_format, openings), prompt_width)
    episodes = [_Row(opening_turns(prompt_format, messages)) for messages in openings]
    for index, (row, env, example) in enumerate(zip(episodes, environments, examples, strict=True)):
        demonstration = getattr(env, "demonstration", None)
        if not callable(demonstration):
            raise ValueError(f"{type(env).__name__} has no demonstration(example): a warm start on episodes needs "
                             "the replies of a worked episode (docs/agents.md)")
        replies = demonstration(example)
        for turn, reply in enumerate(replies):
            ids = np.asarray(tokenizer(reply, add_special_tokens=False)["input_ids"] + [end_id], np.int32)
            problem = _unplayable(row, len(ids), limits, reply_tokens)
            if problem:
                raise ValueError(f"example {index}'s demonstration, reply {turn + 1} of {len(replies)}: {problem}")
            zeros = np.zeros(len(ids), np.float32)
            _take_turn(row, env, tokenizer, prompt_format, (end_id,), limits, ids, zeros, zeros, ended=True,
                       last_turn=turn == limits.max_turns - 1)
        if row.error or row.nonfinite:
            raise ValueError(f"example {index}'s demonstration: {row.error or row.nonfinite}")
        if row.ended != "done" or row.correct < 1.0:
            raise ValueError(f"example {index}'s demonstration ({len(replies)} replies) does not end its episode "
                             + ("correct" if row.ended == "done" else f"within {limits}"))
    return _assemble(episodes, prompts, prompt_mask, int(prompt_mask.sum()))


def _unplayable(row: _Row, length: int, limits: EpisodeLimits, reply_tokens: int) -> str | None:
    """Why a demonstrated reply of ``length`` tokens cannot be the row's next one (None: it can)."""
    if row.ended:
        why = {"done": "the environment ended it", "turns": f"max_turns is {limits.max_turns}", "error": row.error,
               "tokens": f"the observation passes its {limits.max_tokens} tokens"}[row.ended]
        return f"the episode ended before it ({why})"
    if length > reply_tokens:
        return f"it takes {length} tokens with its end, more than {reply_tokens} a turn"
    if row.used + length > limits.max_tokens:
        return f"the episode passes its {limits.max_tokens} tokens"
    return None


def widened(x: np.ndarray, width: int) -> np.ndarray:
    """``x`` [R, N] right-padded with zeros, or cut, to ``width`` columns."""
    return np.pad(x, ((0, 0), (0, max(width - x.shape[1], 0))))[:, :width]


def episode_limits(config: RolloutConfig) -> EpisodeLimits:
    """A training rollout's limits (``RolloutConfig``'s ``max_turns``, ``episode_budget()``,
    ``max_observation_tokens``)."""
    return EpisodeLimits(config.max_turns, config.episode_budget(), config.max_observation_tokens)


def collect_episodes(policy: CausalLM, tokenizer, examples: list[dict], environment: Callable[[], Environment], key,
                     config: RolloutConfig, eos_ids, mesh: Mesh, prompt_format: PromptFormat) -> Episodes:
    """A training step's episodes: ``config.samples_per_prompt`` of each of ``examples`` (this
    process's), drawn as ``config`` says."""
    sampling = config.sampling(eos_ids, pad_id(tokenizer), n=config.samples_per_prompt)
    return run_episodes(policy, tokenizer, environment, examples, key, sampling, episode_limits(config),
                        prompt_format, config.max_prompt_tokens, mesh)


def episode_rollout(episodes: Episodes, examples: list[dict], tokenizer, config: RolloutConfig, mesh: Mesh
                    ) -> tuple[Rollout, dict]:
    """The learner's ``Rollout`` of ``episodes`` and their per-row statistics, as ``rollout.collect``
    gives a single-turn batch's: the response columns widened to the episode budget
    (``config.episode_budget()``), the policy's tokens in the mask (groups whose K returns are equal
    left out with ``filter_equal_groups``, cut episodes with ``mask_truncated``), each turn's reward on
    its last policy token (``Batch.rewards`` [B, N]), the sampler's log-probs, padding trimmed with
    ``trim_padding``. Statistics: ``reward`` the return, ``correct`` the environment's (0 where it
    gave none), ``length`` the policy's tokens, ``truncated``, ``kept``, ``turns``, ``calls``,
    ``valid_calls``, ``observation_tokens``, ``cuts``, and the episode's text after the prompt as its
    ``completion``."""
    k, budget = config.samples_per_prompt, config.episode_budget()
    width = episodes.tokens.shape[1] - episodes.mask.shape[1]
    tokens, attention = (np.concatenate([x[:, :width], widened(x[:, width:], budget)], axis=1)
                         for x in (episodes.tokens, episodes.attention_mask))
    failed = np.array([error is not None for error in episodes.errors])
    nonfinite = np.array([reward is not None for reward in episodes.nonfinite])
    if nonfinite.any() and config.nonfinite_rewards == "error":
        raise RewardError(f"{next(r for r in episodes.nonfinite if r)} (rollout.nonfinite_rewards=mask leaves such "
                          "prompt groups out)")
    keep = ~np.repeat((failed | nonfinite).reshape(-1, k).any(1), k)       # a group baseline needs all K returns
    if config.mask_truncated:
        keep &= ~episodes.truncated
    if config.filter_equal_groups:
        groups = episodes.returns.reshape(-1, k)
        keep &= np.repeat(groups.max(1) > groups.min(1), k)
    columns = {"mask": episodes.mask * keep[:, None], "rewards": episodes.rewards, "behaviour_logp": episodes.logprobs}
    host = to_global({"tokens": tokens, "attention_mask": attention,
                      **{name: widened(x, budget) for name, x in columns.items()}}, mesh)
    rollout = Rollout(tokens=host["tokens"], attention_mask=host["attention_mask"],
                      batch=core.Batch(mask=host["mask"], rewards=host["rewards"], logp=None,
                                       behaviour_logp=host["behaviour_logp"], group_size=k))
    lengths = np.asarray(attention[:, width:].sum(1))              # gap-free: the episode's last column + 1
    if config.trim_padding:            # to the longest episode of every process's rows: one shape everywhere
        rollout = trim_padding(rollout, np.array([largest(lengths.max(initial=0), mesh)]))
    texts = [tokenizer.decode(row[width:width + n]) for row, n in zip(tokens, lengths, strict=True)]
    correct = np.nan_to_num(episodes.correct, nan=0.0)
    stats = {"reward": episodes.returns, "correct": correct, "length": episodes.mask.sum(1).astype(np.int32),
             "truncated": episodes.truncated, "kept": keep, "nonfinite": nonfinite,
             "completions": texts, "prompts": [e["prompt"] for e in examples for _ in range(k)],
             "environment_errors": failed, "environment_error_ids": np.array([error_id(e) for e in episodes.errors]),
             "environment_error_texts": episodes.errors,
             **{name: getattr(episodes, name) for name in EPISODE_TALLIES}}
    return rollout, stats


def error_id(message: str | None) -> int:
    """A number for an environment error's message that processes can compare (CRC-32; 0: none)."""
    return 0 if message is None else zlib.crc32(message.encode("utf-8", "replace")) or 1
