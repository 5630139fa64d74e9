"""pgjax.rewards.word_math: English arithmetic prompts, their demonstrations, the boxed verifier and format rule."""
import collections
import re

import numpy as np
import pytest

from pgjax import rewards as R
from pgjax.rewards import word_math as W
from pgjax.train.experiment import TaskSection


def score(fn, completions, target):
    """``fn`` on ``completions``, all answering one prompt whose answer is ``target``."""
    return fn(["p"] * len(completions), completions, target=[target] * len(completions)).tolist()


def operands(example):
    """The two operands of an example, read from its demonstration ``"a op b = v. ..."``."""
    a, _, b = example["answer"].split(" = ")[0].split(" ")
    return int(a), int(b)


def test_examples_are_deterministic_per_seed():
    task = R.WordMathTask(digits=3)
    assert task.examples(50, seed=7) == task.examples(50, seed=7)
    assert task.examples(50, seed=7) != task.examples(50, seed=8)
    assert task.examples(20, seed=7) == task.examples(50, seed=7)[:20]
    assert task.tokenizer() is None and task.name == "word_math"


def test_digit_mix_equal_shares_and_operand_sizes():
    examples = R.WordMathTask(digits=3).examples(600, seed=1)
    assert [e["difficulty"] for e in examples[:6]] == [1, 2, 3, 1, 2, 3]
    assert collections.Counter(e["difficulty"] for e in examples) == {1: 200, 2: 200, 3: 200}
    smaller_digits = collections.Counter()
    for e in examples:
        a, b = operands(e)
        assert len(str(max(a, b))) == e["difficulty"] and min(a, b) >= 2
        smaller_digits[(e["difficulty"], len(str(min(a, b))))] += 1
        if e["op"] == "-":
            assert a >= b and e["target"] >= 0
    # the smaller operand has 1..d digits, each well represented
    assert all(smaller_digits[(3, k)] > 30 for k in (1, 2, 3))
    assert collections.Counter(e["op"] for e in examples).keys() == {"+", "-", "*"}
    words = sum("Calculate" not in e["prompt"] and "Compute" not in e["prompt"] and "What is" not in e["prompt"]
                for e in examples)
    assert 240 < words < 360   # word_share=0.5
    assert all(not re.search(r"\b1 [a-z]+s\b", e["prompt"]) for e in examples)  # no "1 pages"


def test_every_template_states_an_answer_equal_to_its_target():
    seen = set()
    for op in "+-*":
        for word_share in (0.0, 1.0):
            task = R.WordMathTask(digits=2, ops=op, word_share=word_share)
            for e in task.examples(200, seed=3):
                assert e["prompt"].endswith(" " + W.INSTRUCTION) and e["op"] == op
                a, b = operands(e)
                value = a + b if op == "+" else a - b if op == "-" else a * b
                assert e["target"] == value and e["answer"].endswith(f"\\boxed{{{value}}}.")
                templates = W.WORD_TEMPLATES[op] if word_share else W.EXPRESSION_TEMPLATES
                matches = [t for t in templates if re.fullmatch(
                    re.escape(t).replace(r"\{a\}", str(a)).replace(r"\{b\}", str(b))
                    .replace(r"\{sym\}", re.escape(W.SYMBOLS[op])).replace(r"\{name\}", "[A-Z][a-z]+"),
                    e["prompt"].removesuffix(" " + W.INSTRUCTION))]
                assert len(matches) == 1, e["prompt"]
                seen.add((op, matches[0]))
    assert len(seen) == 3 * len(W.EXPRESSION_TEMPLATES) + sum(len(t) for t in W.WORD_TEMPLATES.values())


def test_demonstrations_get_reward_one_and_format_one():
    for answer_from in W.ANSWER_FROM:
        task = R.WordMathTask(digits=3, answer_from=answer_from)
        examples = task.examples(300, seed=0)
        prompts, answers = [e["prompt"] for e in examples], [e["answer"] for e in examples]
        fields = R.batch_fields(examples)
        np.testing.assert_array_equal(task.reward_fn(prompts, answers, **fields), 1.0)
        np.testing.assert_array_equal(R.format_reward(task.format_pattern)(prompts, answers, **fields), 1.0)
        np.testing.assert_array_equal(R.word_math_format_reward(prompts, answers, **fields), 1.0)
        # a wrong target scores 0
        wrong = {**fields, "target": [t + 1 for t in fields["target"]]}
        np.testing.assert_array_equal(task.reward_fn(prompts, answers, **wrong), 0.0)


VERIFIER_CASES = [  # completion, target 71: (boxed_or_last_number reward, boxed reward)
    ("23 + 48 = 71. The answer is \\boxed{71}.", 1, 1),
    ("\\boxed{71}", 1, 1),
    ("$\\boxed{ 71 }$", 1, 1),
    ("The answer is \\boxed{71 apples}.", 1, 1),          # the box's only number
    ("So x = \\boxed{x = 71}", 1, 1),
    ("\\boxed{71.0}", 1, 1),
    ("23 + 48 = 71", 1, 0),                               # unboxed: the last number
    ("23 + 48 = 71. The answer is 71.", 1, 0),
    ("23 + 48 = 71. The answer is \\boxed{}.", 1, 0),      # an empty box is passed over
    ("The answer is \\boxed{ }. It is 71", 1, 0),
    ("\\boxed{12} then \\boxed{71}", 1, 1),                 # the last non-blank box decides
    ("\\boxed{71} then \\boxed{12}", 0, 0),
    ("\\boxed{71} and \\boxed{}", 1, 1),
    ("71, no wait: \\boxed{70}", 0, 0),                   # a box beats a later-read number
    ("\\boxed{23 + 48}", 0, 0),                           # two numbers in the box: no answer
    ("\\boxed{23 + 48 = 71}", 0, 0),
    ("\\boxed{seventy-one}", 0, 0),
    ("The answer is 72.", 0, 0),
    ("71 is wrong, it is 72", 0, 0),
    ("", 0, 0),
    ("I don't know.", 0, 0),
    ("\\boxed{71", 1, 0),                                 # truncated box: not a box; 71 is the last number
    ("\\boxed{71} then \\boxed{12", 1, 1),
    ("{ so \\boxed {71}", 1, 1),
    ("\\boxed{-71}", 0, 0),
    ("7" * 100, 0, 0),                                     # too long to be a number
]


@pytest.mark.parametrize("completion,unboxed_ok,boxed_only", VERIFIER_CASES)
def test_verifier_both_answer_from_modes(completion, unboxed_ok, boxed_only):
    assert score(R.word_math_reward, [completion], 71) == [unboxed_ok]
    assert score(R.boxed_answer_reward, [completion], 71) == [boxed_only]
    assert R.WordMathTask(answer_from="boxed").reward_fn is R.boxed_answer_reward
    assert R.WordMathTask().reward_fn is R.word_math_reward


def test_final_answer_numbers():
    assert R.final_answer("48 - 71 = -23") == -23
    assert R.final_answer("5-3=2") == 2 and R.final_answer("(5)-3") == 3
    assert R.final_answer("The total is 1,104 pencils.") == 1104
    assert R.final_answer("\\boxed{1,104}") == 1104 and R.final_answer("\\boxed{\\$2.5}") == 2.5
    assert R.final_answer("\\boxed{\\boxed{7}}") == 7
    assert R.final_answer("it is 71", answer_from="boxed") is None
    assert score(R.word_math_reward, ["-23"], -23) == [1.0]
    with pytest.raises(ValueError, match="answer_from"):
        R.final_answer("1", answer_from="last")


FORMAT_CASES = [
    ("23 + 48 = 71. The answer is \\boxed{71}.", 1),
    ("\\boxed{71}", 1),
    ("\\boxed {71}", 1),
    ("  The answer is $\\boxed{ 1,104 }$.  \n", 1),
    ("\\[\\boxed{-3}\\]", 1),
    ("**\\boxed{2.5}**!", 1),
    ("First 23 + 48.\nThen \\boxed{71})", 1),
    ("The answer is 71.", 0),                           # no box
    ("The answer is \\boxed{}.", 0),                    # empty box
    ("\\boxed{ }", 0),
    ("\\boxed{71} and \\boxed{71}", 0),                 # two boxes
    ("\\boxed{} so \\boxed{71}", 0),
    ("\\boxed{71 apples}", 0),                          # not only a number
    ("\\boxed{23 + 48}", 0),
    ("\\boxed{71}. Let me check: 23 + 48 = 71", 0),     # text after the box
    ("\\boxed{71", 0),
]


@pytest.mark.parametrize("completion,ok", FORMAT_CASES)
def test_format_reward_rule(completion, ok):
    assert score(R.word_math_format_reward, [completion], 71) == [ok]
    assert (re.fullmatch(W.FORMAT_PATTERN, completion.strip()) is not None) == bool(ok)


def test_registry_and_task_section():
    task = R.make_task("word_math", digits=2)
    assert task == R.WordMathTask(digits=2) and R.TASKS["word_math"] is R.WordMathTask
    section = TaskSection(name="word_math", digits=3, ops="+*")
    assert R.make_task(section.name, **section.options()) == R.WordMathTask(digits=3, ops="+*")
    for bad in ({"digits": 0}, {"ops": "+/"}, {"answer_from": "last"}, {"word_share": 1.5}):
        with pytest.raises(ValueError):
            R.WordMathTask(**bad)
