"""pgjax.tasks.word_math: English arithmetic prompts, their demonstrations, the boxed verifier and format rule."""
import collections
import hashlib
import json
import re

import numpy as np
import pytest
from helpers import tiny_experiment

from pgjax import tasks as R
from pgjax.config import ConfigError, Experiment, TaskSection, override
from pgjax.tasks import word_math as W
from pgjax.train.trainer import Trainer


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
    ("\\boxed{71", 0, 0),                                 # a cut-off last box: no answer
    ("\\boxed{71} then \\boxed{12", 0, 0),                # (not the earlier box, not the last number)
    ("\\boxed 71.", 1, 1),                                # a bare-token box
    ("\\boxed{142/2}", 1, 1),                              # a fraction is one number, of value 71
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


def test_answer_numbers():
    def number(text, **options):
        return R.extract_answer(text, number_only=True, **options)

    assert number("48 - 71 = -23") == "-23"
    assert number("5-3=2") == "2" and number("(5)-3") == "3"
    assert number("The total is 1,104 pencils.") == "1,104"
    assert number("\\boxed{1,104}") == "1,104" and number("\\boxed{\\$2.5}") == "2.5"
    assert number("\\boxed{\\boxed{7}}") == "7"
    assert number("it is 71", answer_from="boxed") is None
    assert score(R.word_math_reward, ["-23"], -23) == [1.0]
    with pytest.raises(ValueError, match="answer_from"):
        R.extract_answer("1", answer_from="last")


# completion, integer answer, reward: the same through word_math's and jsonl_math's reward functions,
# since both read the answer with math_answers.extract_answer (word_math with number_only=True)
SHARED_ANSWER_CASES = [
    ("\\boxed{}", 0, 0),                                   # an empty box is no answer ...
    ("The answer is \\boxed{}. It is 12", 12, 1),           # ... and is passed over
    ("\\boxed{12} and \\boxed{ }", 12, 1),
    ("\\boxed 5", 5, 1),                                   # a bare-token box
    ("So $\\boxed 5$.", 5, 1),
    ("\\boxed 5, not 6", 5, 1),
    ("\\boxed{3/4}", 4, 0),                                 # a fraction is one number ...
    ("\\boxed{3/4}", 3, 0),
    ("\\boxed{6/2}", 3, 1),
    ("x = \\frac{3}{4}", 4, 0),                             # ... never its denominator
    ("x = \\frac{6}{2}", 3, 1),
    ("\\boxed{\\dfrac{6}{2}}", 3, 1),
    ("48 - 71 = -23", -23, 1),                              # negative numbers
    ("\\boxed{-23}", 23, 0),
    ("5-3=2", 2, 1),                                        # a "-" after a digit is not a sign
    ("The total is 1,104 pencils.", 1104, 1),               # thousands commas
    ("\\boxed{1,104}", 1104, 1),
    ("1,2,3", 3, 1),                                        # a list is not one number
    ("23 + 48 = 71", 71, 1),                                # no box: the last number
    ("71 is wrong, it is 72", 71, 0),
    ("71, no wait: \\boxed{70}", 71, 0),                    # a box beats the last number
    ("\\boxed{71", 71, 0),                                  # a cut-off last box is no answer
    ("\\boxed{71} then \\boxed{12", 71, 0),
    ("I don't know.", 0, 0),
]


@pytest.mark.parametrize("completion,answer,reward", SHARED_ANSWER_CASES)
def test_word_math_and_math_rewards_read_the_same_answer(completion, answer, reward):
    assert score(R.word_math_reward, [completion], answer) == [reward]
    assert R.math_reward(["p"], [completion], answer=[str(answer)]).tolist() == [reward]


def test_number_only_is_where_the_tasks_differ():
    # word_math's answer is one number; jsonl_math's an expression that answers_equal compares
    assert R.extract_answer("\\boxed{23 + 48}") == "23 + 48"
    assert R.extract_answer("\\boxed{23 + 48}", number_only=True) is None
    assert score(R.word_math_reward, ["\\boxed{23 + 48}"], 71) == [0.0]
    assert R.math_reward(["p"], ["\\boxed{23 + 48}"], answer=["71"]).tolist() == [1.0]
    assert R.extract_answer("\\boxed{71 apples}", number_only=True) == "71"


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
    section = TaskSection(name="word_math", options={"digits": 3, "ops": "+*"})
    assert R.make_task(section.name, section.options) == R.WordMathTask(digits=3, ops="+*")
    for bad in ({"digits": 0}, {"ops": "+/"}, {"answer_from": "last"}, {"word_share": 1.5}):
        with pytest.raises(ValueError):
            R.WordMathTask(**bad)


def template_pattern(template: str) -> str:
    """A regex that a prompt of ``template`` (instruction removed) fully matches, whatever its operands and name."""
    return (re.escape(template).replace(r"\{a\}", r"\d+").replace(r"\{b\}", r"\d+")
            .replace(r"\{sym\}", "[+×-]").replace(r"\{name\}", "[A-Z][a-z]+"))


TRAIN = (*W.EXPRESSION_TEMPLATES, *(t for ts in W.WORD_TEMPLATES.values() for t in ts))
HELD_OUT = (*W.HELD_OUT_EXPRESSION_TEMPLATES, *(t for ts in W.HELD_OUT_WORD_TEMPLATES.values() for t in ts))


def templates_of(prompt: str, templates) -> list[str]:
    question = prompt.removesuffix(" " + W.INSTRUCTION)
    return [t for t in templates if re.fullmatch(template_pattern(t), question)]


def test_training_examples_are_those_drawn_before_the_held_out_splits():
    """held_out="none" draws exactly what WordMathTask drew before held-out phrasings, the kind tag and the
    worked episode's tool call existed (the SHA-256 of those examples, computed then)."""
    examples = [{k: v for k, v in e.items() if k not in ("kind", "tool_calls")}
                for e in R.WordMathTask(digits=3).examples(500, seed=1)]
    digest = hashlib.sha256(json.dumps(examples).encode()).hexdigest()
    assert digest == "4b65e57026bbfaec9b661602893053b76308d0dea1ef2482a1763e95a6cf3866"


def test_each_examples_calculator_call_computes_its_target():
    from pgjax.agents import Calculator
    calculator = Calculator()
    for held_out in ("none", "both"):
        for e in R.WordMathTask(digits=4, held_out=held_out).examples(300, seed=2):
            (call,) = e["tool_calls"]
            assert call["name"] == "calculator" and calculator(call["arguments"]).text == str(e["target"])


def test_training_never_draws_a_held_out_template_and_the_held_out_split_draws_only_those():
    assert len(HELD_OUT) == len(TRAIN) and not set(HELD_OUT) & set(TRAIN)
    used = {"none": set(), "templates": set()}
    for held_out, own, other in (("none", TRAIN, HELD_OUT), ("templates", HELD_OUT, TRAIN)):
        for word_share in (0.0, 0.5, 1.0):
            for seed in range(4):
                for e in R.WordMathTask(digits=2, word_share=word_share, held_out=held_out).examples(200, seed=seed):
                    (template,) = templates_of(e["prompt"], own)
                    assert not templates_of(e["prompt"], other), e["prompt"]
                    expression = template in W.EXPRESSION_TEMPLATES + W.HELD_OUT_EXPRESSION_TEMPLATES
                    assert e["kind"] == ("expression" if expression else "word")
                    used[held_out].add(template)
    assert used == {"none": set(TRAIN), "templates": set(HELD_OUT)}          # every template is drawn


def test_every_held_out_template_states_an_answer_equal_to_its_target():
    for op in "+-*":
        for word_share in (0.0, 1.0):
            for e in R.WordMathTask(digits=2, ops=op, word_share=word_share, held_out="both").examples(100, seed=5):
                a, b = operands(e)
                value = a + b if op == "+" else a - b if op == "-" else a * b
                assert e["target"] == value and e["op"] == op
                numbers = [int(n) for n in re.findall(r"\d+", e["prompt"])]
                assert sorted(numbers) == sorted((a, b)), e["prompt"]           # the operands, and no other number
                assert e["kind"] == ("word" if word_share else "expression")


@pytest.mark.parametrize("digits", [1, 2, 3, 17])
def test_held_out_numbers_lie_outside_the_training_range(digits):
    train = R.WordMathTask(digits=digits).examples(300, seed=2)
    assert max(max(operands(e)) for e in train) < 10 ** digits
    for held_out in ("numbers", "both"):
        for e in R.WordMathTask(digits=digits, held_out=held_out).examples(300, seed=2):
            a, b = operands(e)
            assert 10 ** digits <= max(a, b) < 10 ** (digits + 1) and min(a, b) >= 2
            assert e["difficulty"] == digits + 1
            templates = HELD_OUT if held_out == "both" else TRAIN
            assert len(templates_of(e["prompt"], templates)) == 1
    smaller = {len(str(min(operands(e)))) for e in R.WordMathTask(digits=digits, held_out="numbers").examples(300)}
    assert smaller <= set(range(1, digits + 2)) and (digits > 3 or smaller == set(range(1, digits + 2)))


def test_held_out_is_a_task_option_and_training_refuses_it(tmp_path):
    exp = override(Experiment(), ["task.name=word_math", "task.options.held_out=templates", "task.options.digits=3"])
    assert R.make_task(exp.task.name, exp.task.options) == R.WordMathTask(digits=3, held_out="templates")
    for bad, message in (({"held_out": "test"}, "held_out must be one of none, templates, numbers, both"),
                         ({"held_out": "numbers", "digits": 18}, "digits must be <= 17")):
        with pytest.raises(ValueError, match=message):
            R.WordMathTask(**bad)
    training = tiny_experiment(tmp_path, task=TaskSection(name="word_math", options={"held_out": "numbers"}))
    with pytest.raises(ConfigError, match="task.options.held_out='numbers' is a held-out evaluation split"):
        Trainer(training)
