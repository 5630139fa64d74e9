"""Multi-turn rollouts (pgjax.rollout.episodes) on a tiny model with a ChatML character tokenizer: each
episode's tokens are the chat template's rendering of its conversation, the policy's log-probs are
the cache-free forward's on those tokens, observation tokens carry mask 0 and get exactly zero
gradient under every algorithm, per-turn rewards sit on each turn's last policy token and flow
through the returns, a one-turn environment samples what the single-turn sampler does, and the
episode limits (turns, tokens, observation length, a cut reply) end or cut what they should; with
LoRA adapters, and on a simulated 8-device mesh (this file is also that subprocess's script),
episodes are the single-device ones."""
import dataclasses
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_chat_prompts import chatml_tokenizer
from test_sampler import forward, sharp_model

from pgjax import core
from pgjax.agents import Calculator
from pgjax.agents.environment import Step, ToolEnvironment
from pgjax.rollout.collect import PromptFormat, decode_responses, encode_prompts
from pgjax.rollout.episodes import (
    CUT_MARK,
    EnvironmentFailure,
    EpisodeError,
    EpisodeLimits,
    checked_step,
    episode_limits,
    episode_rollout,
    error_id,
    run_episodes,
)
from pgjax.sample import SamplingConfig, generate

EXAMPLES = [{"prompt": "1+2=?"}, {"prompt": "what is 7"}]
CHAT = PromptFormat(chat=True)
WIDTH = 32


class Scripted:
    """Answers turn t's reply with ``observations[t]`` (a user message) and reward ``rewards[t]``; done
    after ``len(observations)`` turns with the last reward."""

    def __init__(self, observations=("ok", "more"), rewards=(0.5, None, 1.0)):
        self.observations, self.rewards, self.turn = observations, rewards, 0

    def reset(self, example):
        self.turn = 0
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        turn, self.turn = self.turn, self.turn + 1
        if turn >= len(self.observations):
            return Step(reward=self.rewards[turn], done=True)
        return Step(observation=[{"role": "user", "content": self.observations[turn]}], reward=self.rewards[turn])


def ending_model(end: int):
    """The tiny Qwen 3 with the end-of-turn token's output row pointed along its mean final hidden state,
    so that about a quarter of its tokens end the turn: episodes of several turns."""
    model = sharp_model("qwen3")
    tokens = jnp.asarray(np.random.default_rng(0).integers(2, end, size=(8, 20)))
    direction = np.asarray(model(tokens, return_hidden=True)).reshape(-1, model.config.hidden_size).mean(0)
    model.lm_head.set_value(model.lm_head[...].at[:, end].set(2.5 * direction / np.linalg.norm(direction)))
    return model


class Graded(Scripted):
    """Scripted, its rewards depending on the replies' lengths, so a group's episodes differ."""

    def step(self, reply):
        step = super().step(reply)
        return Step(step.observation, float(len(reply) % 3) if step.reward is not None else None, step.done)


@pytest.fixture(scope="module")
def setup():
    tokenizer = chatml_tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return ending_model(end), tokenizer, end


LIMITS = EpisodeLimits(max_turns=4, max_tokens=200, max_observation_tokens=32)


def play(setup, environment, limits=LIMITS, max_new_tokens=6, n=3, temperature=1.0, key=0, width=WIDTH,
         examples=EXAMPLES, mesh=None):
    model, tokenizer, end = setup
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, eos_ids=(end,), n=n)
    return run_episodes(model, tokenizer, environment, examples, jax.random.key(key), sampling, limits, CHAT, width,
                        mesh)


def test_episode_tokens_are_the_templates_rendering_of_the_conversation(setup):
    model, tokenizer, end = setup
    episodes = play(setup, Scripted, max_new_tokens=12, key=1)
    assert (episodes.turns >= 1).all() and "done" in episodes.ended
    for r, replies in enumerate(episodes.replies):
        turns = [{"role": "user", "content": EXAMPLES[r // 3]["prompt"]}]
        for t, reply in enumerate(replies):
            turns.append({"role": "assistant", "content": reply})
            if t < len(Scripted().observations) and t < len(replies) - 1:
                turns.append({"role": "user", "content": Scripted().observations[t]})
        text = tokenizer.decode(episodes.tokens[r][episodes.attention_mask[r] > 0])
        rendered = tokenizer.apply_chat_template(turns, tokenize=False)
        assert rendered.startswith(text) and rendered[len(text):] in ("\n", "<|im_end|>\n")   # a cut last reply


def test_policy_logprobs_are_the_forwards_on_the_assembled_episode(setup):
    model, _, _ = setup
    episodes = play(setup, Scripted, key=2)
    logits = np.asarray(forward(model, jnp.asarray(episodes.tokens), jnp.asarray(episodes.attention_mask)))
    width = episodes.tokens.shape[1] - episodes.mask.shape[1]
    expected = np.asarray(core.token_logprobs(jnp.asarray(logits[:, width - 1:-1]),
                                              jnp.asarray(episodes.tokens[:, width:]), 1.0))
    on = episodes.mask > 0
    np.testing.assert_allclose(episodes.policy_logprobs[on], expected[on], atol=2e-5)
    assert (episodes.policy_logprobs[~on] == 0).all() and (episodes.logprobs[~on] == 0).all()
    assert episodes.observation_tokens.sum() > 0 and ((episodes.attention_mask[:, width:] > 0) & ~on).sum() > 0


def test_the_cache_carries_across_turns(setup):
    """The model read each prompt once and each observation once: the prefilled tokens are the prompts'
    and the observations', where re-prefilling each turn's history would read them again every turn."""
    episodes = play(setup, Scripted, key=3)
    width = episodes.tokens.shape[1] - episodes.mask.shape[1]
    prompts = episodes.attention_mask[::3, :width].sum()
    assert episodes.prefill_tokens == prompts + episodes.observation_tokens.sum()


@pytest.mark.parametrize("name", ["reinforce", "rloo", "grpo", "dr_grpo", "dapo", "reinforce_pp", "gspo"])
def test_observation_positions_get_exactly_zero_gradient(setup, name):
    """d loss / d logits at every position predicting an environment token (or padding) is exactly 0,
    with a KL term on: the mask keeps the environment's tokens out of every part of the loss."""
    model, _, _ = setup
    episodes = play(setup, Graded, key=4)
    width = episodes.tokens.shape[1] - episodes.mask.shape[1]
    algorithm = core.preset(name)
    hparams = algorithm.hparams.replace(kl_coef=0.1)
    logits = forward(model, jnp.asarray(episodes.tokens), jnp.asarray(episodes.attention_mask))[:, width - 1:-1]
    targets = jnp.asarray(episodes.tokens[:, width:])

    def loss(logits):
        logp = core.token_logprobs(logits, targets, 1.0)
        batch = core.Batch(mask=jnp.asarray(episodes.mask), rewards=jnp.asarray(episodes.rewards), logp=logp,
                           old_logp=jax.lax.stop_gradient(logp) + 0.05, ref_logp=jax.lax.stop_gradient(logp) - 0.1,
                           group_size=3)
        return algorithm.loss(batch, hparams)[0]

    grad = np.asarray(jax.grad(loss)(logits))
    environment = (episodes.mask == 0) & (episodes.attention_mask[:, width:] > 0)
    assert environment.sum() > 0 and np.abs(grad[episodes.mask == 0]).max() == 0.0
    assert np.abs(grad[episodes.mask > 0]).max() > 0


def test_per_turn_rewards_sit_on_each_turns_last_policy_token_and_flow_through_the_returns(setup):
    episodes = play(setup, Scripted, max_new_tokens=12, key=5)
    returns = np.asarray(core.discounted_returns(jnp.asarray(episodes.rewards), jnp.asarray(episodes.mask)))
    for r in range(len(episodes.replies)):
        policy = np.flatnonzero(episodes.mask[r])
        turn_of = np.cumsum(np.diff(np.concatenate([[-2], policy])) > 1) - 1      # turn index of each policy token
        rewarded = np.flatnonzero(episodes.rewards[r])
        expected_rewards = [v for v in Scripted().rewards[:episodes.turns[r]] if v is not None]
        assert list(episodes.rewards[r, rewarded]) == expected_rewards
        assert all(policy[turn_of == turn_of[policy == i][0]].max() == i for i in rewarded)   # each turn's last
        future = [sum(episodes.rewards[r, j] for j in rewarded if j >= i) for i in policy]
        np.testing.assert_allclose(returns[r, policy], future, atol=1e-6)
        assert episodes.returns[r] == pytest.approx(sum(expected_rewards))


class OneTurn:
    def reset(self, example):
        return [{"role": "user", "content": example["prompt"]}]

    def step(self, reply):
        return Step(reward=float(reply.startswith("1")), done=True)


@pytest.mark.parametrize("max_turns", [1, 4])
def test_a_one_turn_environment_samples_what_the_single_turn_sampler_does(setup, max_turns):
    """The same tokens, rewards and truncation; the same log-probs to the last bit when the episode's
    cache is as long as generate's (max_turns = 1), to float rounding when it is longer (the attention
    sums over more, masked, slots)."""
    model, tokenizer, end = setup
    episodes = play(setup, OneTurn, EpisodeLimits(max_turns=max_turns, max_tokens=200, max_observation_tokens=32),
                    max_new_tokens=8, n=4, temperature=0.9, key=6)
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.9, eos_ids=(end,), n=4)
    tokens, mask = encode_prompts(tokenizer, [e["prompt"] for e in EXAMPLES], WIDTH, CHAT)
    samples = generate(model, tokens, mask, jax.random.key(6), sampling)
    width = WIDTH
    np.testing.assert_array_equal(episodes.tokens[:, :width + 8], np.asarray(samples.tokens))
    np.testing.assert_array_equal(episodes.attention_mask[:, :width + 8], np.asarray(samples.attention_mask))
    np.testing.assert_array_equal(episodes.mask[:, :8], np.asarray(samples.response_mask))
    same = np.testing.assert_array_equal if max_turns == 1 else (
        lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6))
    same(episodes.logprobs[:, :8], np.asarray(samples.logprobs))
    same(episodes.policy_logprobs[:, :8], np.asarray(samples.policy_logprobs))
    assert (episodes.mask[:, 8:] == 0).all()
    texts = decode_responses(tokenizer, samples.response, samples.lengths, (end,))
    assert [r[0] for r in episodes.replies] == texts
    np.testing.assert_array_equal(episodes.returns, [float(t.startswith("1")) for t in texts])
    np.testing.assert_array_equal(episodes.truncated, np.asarray(samples.truncated))


def test_limits_end_and_cut_episodes(setup):
    long = type("Long", (Scripted,), {"__init__": lambda self: Scripted.__init__(self, ("x" * 80, "y"), (0, 0, 1))})
    episodes = play(setup, long, limits=EpisodeLimits(max_turns=4, max_tokens=200, max_observation_tokens=40),
                    max_new_tokens=12, key=7)
    width = episodes.tokens.shape[1] - episodes.mask.shape[1]
    continued = [r for r in range(6) if episodes.turns[r] > 1]
    assert continued and all(episodes.cuts[r] >= 1 for r in continued)
    for r in continued:
        text, count = _environment_text(episodes, r, width, setup[1])
        assert "xxxx <pad>cut<pad><|im_end|>" in text and count <= 40    # the tokenizer has no [ or ]
        assert CUT_MARK == " [cut]"
    few = play(setup, Scripted, limits=EpisodeLimits(max_turns=1, max_tokens=200), max_new_tokens=12, key=7)
    assert (few.turns == 1).all() and set(few.ended) <= {"turns", "truncated"}
    tight = play(setup, Scripted, limits=EpisodeLimits(max_turns=4, max_tokens=8), max_new_tokens=6, key=7)
    assert (tight.mask.sum(1) + tight.observation_tokens <= 8).all() and "tokens" in tight.ended
    cut = play(setup, Scripted, max_new_tokens=1, key=7)
    assert all(e in ("truncated", "done", "turns") for e in cut.ended) and cut.truncated.any()


def _environment_text(episodes, r, width, tokenizer) -> tuple[str, int]:
    """The row's first run of environment tokens, decoded, and how many there are."""
    attention, mask = episodes.attention_mask[r, width:], episodes.mask[r]
    environment = np.flatnonzero((attention > 0) & (mask == 0))
    first = environment[:np.argmax(np.diff(np.concatenate([environment, [10**9]])) > 1) + 1]
    return tokenizer.decode(episodes.tokens[r, width + first]), len(first)


def test_environments_must_open_alike_and_return_steps(setup):
    class Random(OneTurn):
        count = 0

        def reset(self, example):
            Random.count += 1
            return [{"role": "user", "content": f"{example['prompt']} {Random.count}"}]

    with pytest.raises(ValueError, match="opened with different messages"):
        play(setup, Random)

    class Bad(OneTurn):
        def step(self, reply):
            return 1.0

    with pytest.raises(EnvironmentFailure, match=r"failed in every episode: Bad.step returned a float \(1.0\), not a "
                                                 r"pgjax.agents.Step"):
        play(setup, Bad)


# what a broken environment does, row by row: the episodes of row r % 8 == i fail the i-th way
FAULTS = [lambda reply: Step(reward=1.0, done=True),
          lambda reply: 1 / 0,
          lambda reply: "a string",
          lambda reply: Step(reward="1.0", done=True),
          lambda reply: Step(observation=[{"role": "user", "content": 3}]),
          lambda reply: Step(observation="text"),
          lambda reply: Step(reward=float("nan"), done=True),
          lambda reply: Step(reward=1.0, done=True, info={"calls": "two"})]
FAULT_TEXTS = [None, "Broken.step raised ZeroDivisionError: division by zero (tests/test_episodes.py:",
               "Broken.step returned a str ('a string'), not a pgjax.agents.Step",
               "Broken.step returned reward a str ('1.0'): a reward is a number or None",
               "Broken.step returned observation a list ([{'role': 'user', 'content': 3}]): a list of",
               "Broken.step returned observation a str ('text'): a list of", None,
               "Broken.step returned info a dict ({'calls': 'two'}): a dict whose calls"]


class Broken(OneTurn):
    """Fails the ``FAULTS`` way of its row (rows counted as they are made)."""
    made = 0

    def __init__(self):
        self.fault, Broken.made = FAULTS[Broken.made % len(FAULTS)], Broken.made + 1

    def step(self, reply):
        return self.fault(reply)


def test_an_environment_that_fails_ends_its_episode_not_the_run(setup):
    """Each way an environment's step can fail ends that episode with ``ended="error"`` and its message,
    the other episodes play on; a NaN reward is 0 and named; the rollout leaves the groups of failed
    or non-finite episodes out, counts them, or stops on a NaN with nonfinite_rewards="error"."""
    from pgjax.parallel.mesh import single_device_mesh
    from pgjax.rollout.collect import RolloutConfig
    from pgjax.tasks import RewardError
    Broken.made = 0
    model, tokenizer, end = setup
    examples = [{"prompt": f"{i}+1=?"} for i in range(4)]
    episodes = play(setup, Broken, n=2, examples=examples)
    for r, (error, expected) in enumerate(zip(episodes.errors, FAULT_TEXTS, strict=True)):
        assert (error is None) if expected is None else error.startswith(expected), (r, error)
        assert episodes.ended[r] == ("error" if expected else "done")
    assert episodes.nonfinite == [None] * 6 + ["Broken.step returned reward nan at turn 1", None]
    assert episodes.returns[6] == 0.0 and episodes.returns[0] == 1.0
    config = RolloutConfig(samples_per_prompt=2, max_new_tokens=6, max_turns=4, trim_padding=False)
    with pytest.raises(RewardError, match="returned reward nan at turn 1 .rollout.nonfinite_rewards=mask"):
        episode_rollout(episodes, examples, tokenizer, config, single_device_mesh())
    config = dataclasses.replace(config, nonfinite_rewards="mask")
    rollout, stats = episode_rollout(episodes, examples, tokenizer, config, single_device_mesh())
    assert stats["kept"].tolist() == [False] * 8                      # every group holds a failed episode
    assert stats["environment_errors"].tolist() == [e is not None for e in FAULT_TEXTS]
    assert stats["nonfinite"].tolist() == [False] * 6 + [True, False]
    assert (stats["environment_error_ids"] != 0).tolist() == stats["environment_errors"].tolist()
    assert float(np.asarray(rollout.batch.mask).sum()) == 0.0


def test_a_tool_that_raises_or_returns_no_result_is_an_environment_error(setup):
    """A custom tool's own failure (an exception, not a ToolResult) is the environment's error,
    recorded; a malformed call of the policy's is an observation (test_environment)."""
    class Exploding:
        name, description, parameter = "boom", "explodes", "text"

        def __call__(self, arguments):
            raise RuntimeError("the tool broke")

    class Silent(Exploding):
        def __call__(self, arguments):
            return "not a result"

    for tool, message in ((Exploding(), "RuntimeError: the tool broke"),
                          (Silent(), "TypeError: the tool 'boom' returned str, not a ToolResult")):
        environment = ToolEnvironment([tool], lambda example, reply: 1.0)
        environment.reset({"prompt": "x"})
        with pytest.raises(EpisodeError, match=message):
            checked_step(environment, "<boom>go</boom>")


def test_a_step_that_never_returns_ends_its_episode_at_the_timeout(setup):
    """``task.reward.timeout`` covers environments (``context.TimedEnvironment``): a step that hangs
    ends its episode with the timeout named; the others play on; demonstrations pass through."""
    import time

    from pgjax.train.context import TimedEnvironment

    class Sleepy(OneTurn):
        made = 0

        def __init__(self):
            self.sleeps, Sleepy.made = Sleepy.made % 2 == 0, Sleepy.made + 1

        def step(self, reply):
            if self.sleeps:
                time.sleep(30)
            return super().step(reply)

        def demonstration(self, example):
            return ["1"]

    start = time.monotonic()
    episodes = play(setup, lambda: TimedEnvironment(Sleepy(), 0.2), n=2)
    assert time.monotonic() - start < 10
    assert episodes.errors[0::2] == ["Sleepy.step did not return within task.reward.timeout=0.2 s"] * 2
    assert episodes.errors[1::2] == [None, None] and episodes.ended[1::2] == ["done", "done"]
    assert TimedEnvironment(Sleepy(), 0.2).demonstration({}) == ["1"]


def test_the_same_environment_error_step_after_step_stops_the_run():
    """``EnvironmentErrors``: an error id present in 3 steps in a row stops the run, naming the
    message; a step without it resets its streak."""
    from pgjax.errors import RunStopped
    from pgjax.train.pipeline import EnvironmentErrors
    tracker, message = EnvironmentErrors(), "Env.step raised KeyError: 'x' (env.py:3)"
    ids = lambda *messages: {"environment_error_ids": np.array([error_id(m) for m in messages])}     # noqa: E731
    assert tracker.check(1, ids(message, None), [message, None]) == message
    assert tracker.check(2, ids(message), [message]) == message
    assert tracker.check(3, ids(None, None), [None, None]) == ""                # the streak ends
    tracker.check(4, ids(message), [message])
    tracker.check(5, ids(message), [message])
    with pytest.raises(RunStopped, match=r"step 6: the same environment error ended episodes in 3 steps in a row: "
                                         r"Env.step raised KeyError"):
        tracker.check(6, ids(None, message), [None, None])


def test_a_tool_environment_runs_in_episodes(setup):
    """The calculator environment with the tiny model: whatever it writes, every episode ends, each
    turn that calls no tool is a final answer, and the counts add up."""
    environment = lambda: ToolEnvironment([Calculator()], lambda example, reply: float("3" in reply))  # noqa: E731
    episodes = play(setup, environment, key=8, width=400)
    assert all(e in ("done", "turns", "tokens", "truncated") for e in episodes.ended)
    assert (episodes.valid_calls <= episodes.calls).all()


# ---------------------------------------------------------------- worked episodes (the warm start's demonstrations)

WORKED = [{"prompt": "what is 12*7", "answer": "84", "target": "84",
           "tool_calls": [{"name": "calculator", "arguments": "12*7"}]},
          {"prompt": "what is 3", "answer": "3", "target": "3"}]               # no call: the answer alone
WORKED_LIMITS = EpisodeLimits(max_turns=2, max_tokens=90, max_observation_tokens=48)


def worked_episodes(examples=WORKED, limits=WORKED_LIMITS, reply_tokens=40, environment=None):
    from helpers import TOOL_ALPHABET

    from pgjax.train.sft import episode_demonstrations
    tokenizer = chatml_tokenizer(chars=TOOL_ALPHABET)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    environment = environment or (lambda: ToolEnvironment([Calculator()], lambda e, reply: float(reply == e["target"])))
    return tokenizer, end, episode_demonstrations(tokenizer, environment, examples, 400, limits, reply_tokens, CHAT,
                                                  end)


def test_a_worked_episode_is_the_templates_conversation_with_only_the_replies_trained():
    """The warm start's demonstration of a tool episode: the opening left-padded, then the call, the
    calculator's real result as the template renders it, and the answer; the mask 1 on the two
    replies and their ends of turn, 0 on the observation and the template's tokens between them."""
    from pgjax.agents import TaggedCalls
    tokenizer, end, (tokens, attention, mask) = worked_episodes()
    assert tokens.shape == attention.shape == (2, 490) and mask.shape == (2, 90)
    turns = [{"role": "system", "content": TaggedCalls().tool_prompt([Calculator()])},
             {"role": "user", "content": "what is 12*7"},
             {"role": "assistant", "content": "<calculator>12*7</calculator>"},
             {"role": "user", "content": "<result>84</result>"}, {"role": "assistant", "content": "84"}]
    assert tokenizer.decode(tokens[0][attention[0] > 0]) + "\n" == tokenizer.apply_chat_template(turns, tokenize=False)
    assert tokenizer.decode(tokens[0, 400:][mask[0] > 0]) == "<calculator>12*7</calculator><|im_end|>84<|im_end|>"
    assert tokenizer.decode(tokens[1, 400:][mask[1] > 0]) == "3<|im_end|>" == tokenizer.decode(tokens[1, 400:][
        attention[1, 400:] > 0])
    assert (mask <= attention[:, 400:]).all() and (attention[:, :400].sum(1) > 300).all()   # the tool prompt


def test_json_calls_write_what_they_parse():
    from pgjax.agents import JsonCalls, TaggedCalls
    from pgjax.agents.environment import ToolCall
    call = ToolCall("calculator", "2 * (3 + 4)")
    for convention in (JsonCalls(), TaggedCalls()):
        assert convention.parse(convention.write(call, Calculator()), [Calculator()]) == ([call], [])


def test_a_demonstration_that_does_not_play_out_is_an_error():
    wrong = [{**WORKED[0], "answer": "85"}]
    with pytest.raises(ValueError, match="example 0's demonstration \\(2 replies\\) does not end its episode correct"):
        worked_episodes(wrong)
    with pytest.raises(ValueError, match="reply 1 of 2: it takes 30 tokens with its end, more than 20 a turn"):
        worked_episodes(reply_tokens=20)
    with pytest.raises(ValueError, match="reply 2 of 2: the episode ended before it \\(max_turns is 1\\)"):
        worked_episodes(limits=dataclasses.replace(WORKED_LIMITS, max_turns=1))
    with pytest.raises(ValueError, match="reply 2 of 2: the episode ended before it \\(the observation passes its 60 "):
        worked_episodes(limits=dataclasses.replace(WORKED_LIMITS, max_tokens=60))
    with pytest.raises(ValueError, match="reply 2 of 2: the episode passes its 70 tokens"):
        worked_episodes(limits=dataclasses.replace(WORKED_LIMITS, max_tokens=70))
    with pytest.raises(ValueError, match="the example's tool call .* is not"):
        worked_episodes([{**WORKED[0], "tool_calls": [{"name": "python", "arguments": "print(1)"}]}])
    with pytest.raises(ValueError, match="Scripted has no demonstration\\(example\\)"):
        worked_episodes(environment=Scripted)


@pytest.mark.slow
def test_a_warm_start_on_worked_episodes_teaches_the_tool_convention(tmp_path):
    """task.tools.names=calculator with a warm start: the Trainer's supervised steps run on worked episodes, and
    the tiny model, which never calls the calculator before, calls it (validly) in every greedy episode
    after 60 steps; a budget too small for the demonstrations is a configuration error up front."""
    from helpers import tiny_experiment

    from pgjax.config import ConfigError, OptimConfig, TaskSection, WarmStartSection
    from pgjax.train.trainer import Trainer
    exp = tiny_experiment(tmp_path, task=TaskSection(name="helpers:SumWithCalculator", tools="calculator"),
                          warm_start=WarmStartSection(steps=60, batch_size=8, optim=OptimConfig(lr=1e-2)))
    exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, max_prompt_tokens=360, max_new_tokens=32,
                                                               max_turns=2, max_observation_tokens=24))
    trainer = Trainer(exp)
    examples = trainer.task.examples(16, seed=99)

    def greedy_episodes():
        sampling = SamplingConfig(max_new_tokens=32, eos_ids=tuple(trainer.context.eos_ids), n=1, greedy=True)
        return run_episodes(trainer.policy, trainer.tokenizer, trainer.context.environment, examples,
                            jax.random.key(0), sampling, episode_limits(exp.rollout), trainer.context.prompt_format,
                            360)
    assert greedy_episodes().calls.sum() == 0
    trainer.warm_start()
    after = greedy_episodes()
    assert (after.calls == 1).all() and (after.valid_calls == 1).all() and (after.turns == 2).all()
    short = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, max_new_tokens=16))
    with pytest.raises(ConfigError, match="warm_start.steps=60 \\(rollout.max_new_tokens=16, max_turns=2, max_episode_"
                                          "tokens=0\\): example 0's demonstration, reply 1 of 2: it takes 29 tokens"):
        Trainer(short)
    game = dataclasses.replace(exp, task=TaskSection(name="helpers:EmitXGame"), rollout=dataclasses.replace(
        exp.rollout, max_prompt_tokens=4, max_new_tokens=3))
    with pytest.raises(ConfigError, match="warm_start.steps=60 .*: XGame has no demonstration\\(example\\)"):
        Trainer(game)


def test_a_lora_policy_plays_the_episodes_of_its_merged_weights(setup):
    """Adapters in the forward (the sampler's LoRA path) give what their merged weights give."""
    from flax import nnx

    from pgjax.models import lora
    from pgjax.models.transformer import CausalLM
    model, tokenizer, end = setup
    adapted = CausalLM(dataclasses.replace(model.config, lora=lora.LoRAConfig(rank=2, alpha=4.0)), nnx.Rngs(0))
    nnx.update(adapted, nnx.state(model, nnx.Param))
    for variable in jax.tree.leaves(nnx.state(adapted, lora.LoRAParam), is_leaf=lambda x: isinstance(x, nnx.Variable)):
        variable.set_value(jnp.asarray(np.random.default_rng(0).normal(size=variable[...].shape) * 0.3,
                                       variable[...].dtype))
    plain = lora.merged(adapted)
    with_adapters = play((adapted, tokenizer, end), Scripted, key=9)
    merged = play((plain, tokenizer, end), Scripted, key=9)
    np.testing.assert_array_equal(with_adapters.tokens, merged.tokens)
    np.testing.assert_allclose(with_adapters.logprobs, merged.logprobs, atol=1e-5)
    assert with_adapters.replies != play(setup, Scripted, key=9).replies          # the adapters do act


def check_mesh():
    """On a 2x2x2 mesh of 8 simulated devices the episodes are the single-device ones."""
    from flax import nnx

    from pgjax.parallel import mesh as mesh_lib
    tokenizer = chatml_tokenizer()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model = ending_model(end)
    examples = EXAMPLES + [{"prompt": "2+2=?"}, {"prompt": "and 9"}]          # 4 prompts: split 4 ways
    single = play((model, tokenizer, end), Scripted, n=2, key=10, examples=examples)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(2, 2, 2))
    sharded_model = nnx.merge(nnx.graphdef(model), mesh_lib.shard(nnx.state(model), mesh))
    sharded = play((sharded_model, tokenizer, end), Scripted, n=2, key=10, examples=examples, mesh=mesh)
    for field in ("tokens", "attention_mask", "mask", "rewards", "turns", "observation_tokens"):
        np.testing.assert_array_equal(getattr(sharded, field), getattr(single, field), field)
    np.testing.assert_allclose(sharded.logprobs, single.logprobs, atol=1e-5)
    assert sharded.replies == single.replies and (single.turns > 1).any()
    print("episodes on the mesh ok", flush=True)


@pytest.mark.slow
def test_episodes_on_a_simulated_mesh_equal_the_single_device_ones():
    from helpers import XLA_COLLECTIVE_HANG, simulated_devices
    env = {**os.environ, "XLA_FLAGS": simulated_devices(8), "JAX_PLATFORMS": "cpu"}
    for _ in range(3):       # only XLA's CPU collective hang (helpers.simulated_devices) is retried
        done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900)
        if done.returncode == 0 or XLA_COLLECTIVE_HANG not in done.stderr:
            break
    assert done.returncode == 0, done.stdout + done.stderr
    assert "episodes on the mesh ok" in done.stdout


# ---------------------------------------------------------------- through the Trainer

def episode_experiment(tmp_path, task: str, **rollout):
    from helpers import tiny_experiment

    from pgjax.config import PromptSection, TaskSection

    exp = tiny_experiment(
        tmp_path, task=TaskSection(name=f"helpers:{task}", prompt=PromptSection(stop_text="a")), steps=3
    )
    return dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, **rollout))


def test_the_trainer_trains_on_multi_turn_episodes(tmp_path):
    """A task with an environment trains on its episodes: the records count turns and tokens, the
    losses are finite, and the environment's per-turn rewards are the step's rewards."""
    from pgjax.train.sinks import read_records
    from pgjax.train.trainer import train
    exp = episode_experiment(tmp_path, "EmitXGame", max_turns=2, max_observation_tokens=4)
    train(exp, progress=False)
    records = [r for r in read_records(exp.run_dir) if r.get("turns") is not None]
    assert len(records) == 3 and any(r["turns"] > 1 for r in records)
    for r in records:
        assert 1 <= r["turns"] <= 2 and r["episode_tokens"] >= r["length"] and r["calls"] == 0
        assert np.isfinite(r["policy_loss"]) and 0 <= r["accuracy"] <= 1 and 0 <= r["reward"] <= 1.5


def test_a_run_goes_on_past_an_environment_error_until_it_repeats(tmp_path):
    """An environment that raises on some replies: the run goes on, each record counting the episodes
    the error ended and naming it, their groups left out of the update, until the same error has ended
    episodes in 3 steps in a row: then one line stops it. One that raises on every reply stops the run
    at the first step (its every episode failed alike on different replies; the greedy evaluation's
    replies to one prompt are all the same, so it does not count), nothing trained on it."""
    from pgjax.errors import RunStopped
    from pgjax.train.sinks import read_records
    from pgjax.train.trainer import train
    exp = episode_experiment(tmp_path / "flaky", "EmitXFlaky", max_turns=2, max_observation_tokens=4)
    message = r"FlakyXGame.step raised KeyError: 'b' \(tests/helpers.py:\d+\)"
    with pytest.raises(RunStopped, match=f"step 3: the same environment error ended episodes in 3 steps in a row: "
                                         f"{message}"):
        train(exp, progress=False)
    records = [r for r in read_records(exp.run_dir) if r.get("turns") is not None]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["environment_errors"] > 0 and re.fullmatch(message, r["environment_error"])
        assert r["kept"] < 1 and (r["policy_loss"] is None or np.isfinite(r["policy_loss"]))
    broken = episode_experiment(tmp_path / "broken", "EmitXBroken", max_turns=2, max_observation_tokens=4)
    with pytest.raises(RunStopped, match=r"step 1: the environment failed in every episode: "
                                         r"BrokenXGame.step raised RuntimeError: the environment is broken"):
        train(broken, progress=False)
    assert not any(r.get("policy_loss") is not None for r in read_records(broken.run_dir))


def test_an_environment_whose_reset_fails_is_a_configuration_error_before_anything_is_written(tmp_path):
    from pgjax.config import ConfigError
    from pgjax.train.trainer import Trainer
    exp = episode_experiment(tmp_path, "EmitXUnopened", max_turns=2, max_observation_tokens=4)
    with pytest.raises(ConfigError, match=r"task.name='helpers:EmitXUnopened': tests/helpers.py:\d+: LookupError: "
                                          r"no game for 'ab'$"):
        Trainer(exp)
    assert not os.path.exists(exp.run_dir)


def test_a_one_turn_environment_trains_line_for_line_as_the_single_turn_task(tmp_path):
    """EmitX as one-turn episodes (max_turns = 1) gives the single-turn run's records, every metric
    (losses, mismatch, accuracy, lengths), but the episode counts it adds."""
    from helpers import EMIT_X, comparable, tiny_experiment

    from pgjax.train.records import EPISODE_KEYS
    from pgjax.train.trainer import train
    single = tiny_experiment(tmp_path / "single", task=EMIT_X, steps=3)
    episodes = dataclasses.replace(single, run_dir=str(tmp_path / "episodes" / "run"),
                                   task=dataclasses.replace(single.task, name="helpers:EmitXOneTurn"))
    train(single, progress=False)
    train(episodes, progress=False)
    plain = comparable(f"{single.run_dir}/metrics.jsonl")
    played = [{k: v for k, v in r.items() if k not in EPISODE_KEYS}
              for r in comparable(f"{episodes.run_dir}/metrics.jsonl")]
    assert played == plain and len(plain) == 4


@pytest.mark.slow
def test_stale_episodes_resume_exactly(tmp_path):
    """With rollout.staleness = 1 the batch in flight is a batch of episodes (token-level rewards in
    the checkpoint): a run stopped after step 2 and resumed ends as the uninterrupted one."""
    from helpers import comparable

    from pgjax.train.trainer import train
    whole = episode_experiment(tmp_path / "whole", "EmitXGame", max_turns=2, max_observation_tokens=4, staleness=1)
    whole = dataclasses.replace(whole, steps=4)
    train(whole, progress=False)
    halves = dataclasses.replace(whole, run_dir=str(tmp_path / "halves" / "run"))
    train(dataclasses.replace(halves, steps=2), progress=False)
    train(halves, resume=True, progress=False)
    assert comparable(f"{halves.run_dir}/metrics.jsonl") == comparable(f"{whole.run_dir}/metrics.jsonl")


def test_episode_settings_are_checked():
    from helpers import tiny_experiment

    from pgjax.config import AlgorithmSection, ConfigError, TaskSection, validate
    from pgjax.parallel.mesh import single_device_mesh
    from pgjax.train.context import task_context
    exp = tiny_experiment(pathlib.Path("/nonexistent"), task=TaskSection(name="helpers:EmitX"))
    with pytest.raises(ConfigError, match="rollout.max_turns=3 needs an environment"):
        task_context(dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, max_turns=3)))
    with pytest.raises(ValueError, match="task.tools.names"):
        TaskSection(tools="shell")
    tools = dataclasses.replace(exp, task=TaskSection(name="word_math", tools="calculator"),
                                algorithm=AlgorithmSection(preset="remax"))
    with pytest.raises(ConfigError, match="remax \\(a greedy baseline\\) is not supported with task.tools.names"):
        validate(tools, single_device_mesh())
    with pytest.raises(ValueError, match="rollout.max_turns=0 is invalid: an integer >= 1"):
        dataclasses.replace(exp.rollout, max_turns=0)


def test_task_tools_make_a_calculator_environment_scored_by_the_tasks_verifier(tmp_path):
    """task.tools.names=calculator on word_math: the context's environment answers calls with the calculator
    and scores the final reply with word_math's own verifier; a template without tools gets the
    plain-text convention; the same with a template that takes tools gets JSON calls and schemas."""
    from helpers import save_tiny_checkpoint, tiny_experiment

    from pgjax.agents import JsonCalls, TaggedCalls
    from pgjax.config import ConfigError, ModelSection, TaskSection
    from pgjax.train.context import task_context
    plain = save_tiny_checkpoint(tmp_path / "plain")
    exp = tiny_experiment(
        tmp_path,
        task=TaskSection(name="word_math", tools="calculator", options={"digits": 1, "ops": "+"}),
        model=ModelSection(path=str(plain)),
    )
    exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, max_prompt_tokens=400))
    context = task_context(exp)
    environment = context.environment()
    example = context.task.examples(1, seed=0)[0]
    opening = environment.reset(example)
    assert isinstance(environment.calls, TaggedCalls) and "<calculator>" in opening[0]["content"]
    assert environment.step("<calculator>2+3</calculator>").observation[0]["content"] == "<result>5</result>"
    final = environment.step(f"\\boxed{{{example['answer']}}}")
    assert final.done and final.reward == 1.0 and final.info["correct"] == 1.0
    assert environment.step("\\boxed{-12345}").reward == 0.0
    short = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, max_prompt_tokens=40))
    with pytest.raises(ConfigError, match="opening messages take up to .* tokens \\(with the tool prompt\\), more than "
                                          "rollout.max_prompt_tokens=40"):
        task_context(short, fit_to=40)                           # the Trainer's check, before a run writes
    from test_environment import TOOL_TEMPLATE
    with_tools = save_tiny_checkpoint(tmp_path / "tools", chat_template=TOOL_TEMPLATE)
    context = task_context(dataclasses.replace(exp, model=ModelSection(path=str(with_tools))))
    assert isinstance(context.environment().calls, JsonCalls) and '"calculator"' in context.prompt_format.tools


def test_evaluation_plays_episodes_and_reports_their_counts(setup):
    """evaluate with an environment: greedy and sampled passes are episodes, correct is the
    environment's verdict, and the report adds the call rate, valid-call rate, turns and tokens."""
    from pgjax.evaluation.held_out import evaluate
    from pgjax.sample import Decoding
    model, tokenizer, end = setup

    class Task:
        format_pattern = ".*"
        reward_fn = None

    environment = lambda: ToolEnvironment([Calculator()], lambda example, reply: float(len(reply) % 2))  # noqa: E731
    report = evaluate(model, tokenizer, Task, EXAMPLES * 2, samples=4, ks=(2,), decoding=Decoding(max_new_tokens=6),
                      max_prompt_tokens=400, eos_ids=(end,), key=jax.random.key(0), prompt_format=CHAT,
                      environment=environment, limits=EpisodeLimits(max_turns=3, max_tokens=64))
    metrics = report["metrics"]
    assert {"call_rate", "valid_call_rate", "mean_turns", "mean_episode_tokens", "pass@2"} <= set(metrics)
    assert 1 <= metrics["mean_turns"]["value"] <= 3 and metrics["mean_episode_tokens"]["value"] > 0
    correct = np.asarray(report["per_prompt"]["sampled_correct"])          # of 4 samples, per prompt
    assert metrics["pass@1"]["value"] == pytest.approx(correct.mean() / 4) and metrics["call_rate"]["ci95"] is not None
    assert report["strata"] == {} and len(report["per_prompt"]["sampled_correct"]) == 4
    # per prompt, the episodes' counts the totals come from, so that two models' call rates pair prompt by prompt
    per_prompt = report["per_prompt"]
    calling, calls, valid = (np.asarray(per_prompt[name]) for name in ("sampled_calling", "calls", "valid_calls"))
    assert np.all((0 <= calling) & (calling <= 4) & (calling <= calls) & (valid <= calls))
    assert metrics["call_rate"]["value"] == pytest.approx(calling.mean() / 4)
    assert metrics["mean_turns"]["value"] == pytest.approx(np.mean(per_prompt["turns"]) / 4)
    assert metrics["mean_episode_tokens"]["value"] == pytest.approx(np.mean(per_prompt["mean_episode_tokens"]))
    if calls.sum():
        assert metrics["valid_call_rate"]["value"] == pytest.approx(valid.sum() / calls.sum())


def test_the_evaluation_command_plays_tool_episodes(tmp_path, capsys):
    """python -m pgjax.eval on a checkpoint with --set task.tools.names and the episode limits: the report
    holds the episodes' settings and metrics; other rollout settings are refused."""
    import json

    from helpers import save_tiny_checkpoint

    from pgjax import eval as eval_cli

    checkpoint = save_tiny_checkpoint(tmp_path / "model")
    out = tmp_path / "report.json"
    common = [
        str(checkpoint),
        "--task",
        "word_math",
        "--set",
        "task.options.digits=1",
        "--set",
        "task.tools.names=calculator",
        "--prompts",
        "4",
        "--samples",
        "2",
        "--max-new-tokens",
        "6",
    ]
    assert eval_cli.main([*common, "--set", "rollout.max_turns=2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["episodes"] == {"tools": "calculator", "max_turns": 2, "max_tokens": 2 * 6 + 64,
                                  "max_observation_tokens": 64}
    assert {"call_rate", "mean_turns", "mean_episode_tokens"} <= set(report["metrics"])
    assert eval_cli.main([*common, "--set", "rollout.temperature=2"]) == 2
    assert "--set takes task options (task.KEY=VALUE) and the episode limits" in capsys.readouterr().err


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    check_mesh()
