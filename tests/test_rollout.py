"""The user's reward functions and verifiers as a rollout calls them (``sample_and_score``, the one
path from samples to rewards, through ``tasks.call_reward``): one that raises, never returns
(``task.reward.timeout``) or returns anything but one number per completion is a ``RewardError``
naming the function, what it returned and, for an exception, the file and line in the user's code;
``pgjax run`` and ``pgjax eval`` stop with one line. Functions and tasks defined here are
addressable as ``test_rollout:NAME``."""
import dataclasses
import itertools
import os
import pathlib
import re
import threading

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import (
    TINY_MODEL,
    EmitX,
    experiment_file,
    save_tiny_checkpoint,
)

from pgjax import eval as eval_cli
from pgjax import run as cli
from pgjax.models.transformer import CausalLM
from pgjax.parallel.mesh import single_device_mesh
from pgjax.rollout.collect import dispatch_samples, pad_id, sample_and_score
from pgjax.sample import Decoding
from pgjax.tasks import RewardError, with_timeout

ROOT = pathlib.Path(__file__).parent.parent


# ---------------------------------------------------------------- the user's own code: reward functions and verifiers
# A reward function (or a task's verifier) that raises, never returns (``task.reward.timeout``) or returns
# something that is not one number per completion is a ``RewardError`` naming the function, what it
# returned and, for an exception, the file and line in the user's code; ``python -m pgjax.run`` stops
# with one line (exit 1), ``python -m pgjax.eval`` too.

RELEASE = threading.Event()     # what a hanging function waits for (a new one per test: the ``release`` fixture)


def line_of(fn) -> str:
    """``file:line`` of the first line of ``fn``'s body, as messages name it (the file relative to the
    working directory when it lies below it)."""
    relative = os.path.relpath(__file__)
    return f"{os.path.abspath(__file__) if relative.startswith('..') else relative}:{fn.__code__.co_firstlineno + 1}"


def divides_by_zero(prompts, completions, **_):
    return [1 / 0 for _ in completions]


def too_few(prompts, completions, **_):
    return np.zeros(3)


def numeric_strings(prompts, completions, **_):
    return ["1.0"] * len(completions)


def none_in_row_2(prompts, completions, **_):
    return [None if i == 2 else 1.0 for i in range(len(completions))]


def a_dict(prompts, completions, **_):
    return {"x": 1.0}


def lists_of_lists(prompts, completions, **_):
    return [[1.0] for _ in completions]


def forgets_to_return(prompts, completions, **_):
    [1.0 for _ in completions]


def hangs(prompts, completions, **_):
    RELEASE.wait(60)
    return np.zeros(len(completions))


@pytest.fixture
def release():
    """A new ``RELEASE`` for the test's hanging functions, set when it ends (their threads then return)."""
    global RELEASE
    RELEASE = threading.Event()
    yield
    RELEASE.set()


@pytest.fixture(scope="module")
def score():
    """``score(fn)``: the scores of ``fn`` on 16 responses of a tiny policy to EmitX's prompts, through
    ``sample_and_score`` (the one path from samples to rewards), sampled once."""
    tokenizer = EmitX().tokenizer()
    policy = CausalLM(TINY_MODEL.config(len(tokenizer)), nnx.Rngs(0))
    examples, mesh, key = EmitX().examples(4), single_device_mesh(), jax.random.key(0)
    sampling = Decoding(max_new_tokens=3).sampling((tokenizer.eos_token_id,), pad_id(tokenizer), n=4)
    samples = dispatch_samples(policy, tokenizer, examples, 4, key, sampling, mesh)
    return lambda fn: sample_and_score(policy, tokenizer, examples, 4, key, sampling, {"reward": fn}, mesh,
                                       samples=samples).scores["reward"]


BAD_RETURNS = {
    divides_by_zero: "reward function divides_by_zero raised ZeroDivisionError: division by zero ({line})",
    too_few: "reward function too_few returned shape (3,) for 16 completions, expected (16,)",
    numeric_strings: "reward function numeric_strings returned a str ('1.0') at row 0: a reward must be a number "
                     "(int, float or bool)",
    none_in_row_2: "reward function none_in_row_2 returned None at row 2: a reward must be a number (int, float or "
                   "bool)",
    a_dict: "reward function a_dict returned a dict ({'x': 1.0}) for 16 completions, expected an array of shape (16,)",
    lists_of_lists: "reward function lists_of_lists returned shape (16, 1) for 16 completions, expected (16,)",
    forgets_to_return: "reward function forgets_to_return returned None for 16 completions, expected an array of "
                       "shape (16,)",
}


@pytest.mark.parametrize("fn", BAD_RETURNS, ids=lambda fn: fn.__name__)
def test_a_reward_function_that_raises_or_returns_no_numbers_is_one_line_naming_it(score, fn):
    with pytest.raises(RewardError) as error:
        score(fn)
    assert str(error.value) == BAD_RETURNS[fn].replace("{line}", line_of(fn))


def test_a_reward_function_that_does_not_return_in_time_is_named(score, release):
    with pytest.raises(RewardError, match=re.escape("reward function hangs did not return within "
                                                    "task.reward.timeout=0.2 s (called on 16 completions)")):
        score(with_timeout(hangs, 0.2))
    # in time, the timed function is the function: its value, or its exception and where it was raised
    np.testing.assert_array_equal(score(with_timeout(lambda p, completions, **_: np.ones(len(completions)), 5.0)),
                                  1.0)
    with pytest.raises(RewardError, match=re.escape(f"raised ZeroDivisionError: division by zero "
                                                    f"({line_of(divides_by_zero)})")):
        score(with_timeout(divides_by_zero, 5.0))


# ---------------------------------------------------------------- what the command lines print

def assert_one_line(err: str, line: str) -> None:
    """``line`` is on stderr, the only line from the command, with no traceback."""
    assert "Traceback" not in err, err
    assert [text for text in err.splitlines() if text.startswith("pgjax.")] == [line], err


def test_the_run_stops_in_one_line_naming_the_reward_function_and_its_line(tmp_path, capsys):
    code = cli.main([str(experiment_file(tmp_path)), "--no-progress",
                     "--set", "task.reward.function=test_rollout:divides_by_zero"])
    assert code == 1
    assert_one_line(capsys.readouterr().err, "pgjax.run: stopped: step 1: reward function divides_by_zero raised "
                                             f"ZeroDivisionError: division by zero ({line_of(divides_by_zero)})")


VERIFIER_CALLS = itertools.count()


@dataclasses.dataclass(frozen=True)
class SlowVerifier(EmitX):
    """EmitX whose verifier answers the step-0 evaluation, then never returns."""

    @staticmethod
    def reward_fn(prompts, completions, **_):
        if next(VERIFIER_CALLS) >= 1:
            RELEASE.wait(60)
        return np.zeros(len(completions))


def test_a_verifier_that_never_returns_stops_the_run_after_task_reward_timeout(tmp_path, capsys, release):
    global VERIFIER_CALLS
    VERIFIER_CALLS = itertools.count()
    code = cli.main([str(experiment_file(tmp_path)), "--no-progress", "--set",
                     "task.name=test_rollout:SlowVerifier", "--set", "task.reward.timeout=1"])
    assert code == 1
    assert_one_line(capsys.readouterr().err, "pgjax.run: stopped: step 1: reward function reward_fn did not return "
                                             "within task.reward.timeout=1.0 s (called on 16 completions)")


def missing_field(prompts, completions, **_):
    return {}["target"]


@dataclasses.dataclass(frozen=True)
class RaisingVerifier(EmitX):
    """EmitX on the checkpoint's tokenizer, whose verifier raises."""
    reward_fn = staticmethod(missing_field)

    def tokenizer(self):
        return None


def test_evaluation_stops_in_one_line_naming_the_verifier(tmp_path, capsys):
    save_tiny_checkpoint(tmp_path)
    code = eval_cli.main([str(tmp_path), "--task", "test_rollout:RaisingVerifier", "--samples", "0",
                          "--prompts", "4", "--max-new-tokens", "3"])
    assert code == 1
    assert_one_line(capsys.readouterr().err, "pgjax.eval: stopped: reward function missing_field raised KeyError: "
                                             f"'target' ({line_of(missing_field)})")
