"""pgjax.tasks: verifiers on hand-written answers, generators that agree with them, tokenizers, datasets."""
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

from pgjax import tasks as R
from pgjax.models import hf
from pgjax.tasks.arithmetic import ALPHABET, SCRATCHPAD_ALPHABET
from pgjax.tasks.math_answers import answers_equal, extract_answer

# --- the reward interface ------------------------------------------------------------------------


def test_combine_weights_and_components():
    prompts = ["1+1=", "2+2=", "3+3="]
    completions = ["2", "5", "x"]
    fmt = R.format_reward(r"-?\d+")
    fn = R.combine((R.arithmetic_reward, 1.0), (fmt, 0.25))
    fields = {"target": [2, 4, 6], "answer": ["2", "4", "6"]}  # extra fields are ignored
    np.testing.assert_allclose(fn(prompts, completions, **fields), [1.25, 0.25, 0.0])
    parts = fn.components(prompts, completions, **fields)
    assert list(parts) == ["arithmetic_reward", "format_reward"]
    np.testing.assert_array_equal(parts["arithmetic_reward"], [1, 0, 0])
    np.testing.assert_array_equal(parts["format_reward"], [1, 1, 0])
    assert fn.weights == {"arithmetic_reward": 1.0, "format_reward": 0.25}
    # a bare function has weight 1; repeated names get a suffix
    twice = R.combine(fmt, (fmt, -1.0))
    assert list(twice.components(prompts, completions)) == ["format_reward", "format_reward_2"]
    np.testing.assert_array_equal(twice(prompts, completions), [0, 0, 0])
    with pytest.raises(ValueError):
        R.combine()
    with pytest.raises(ValueError, match="finite"):
        R.combine((fmt, float("nan")))


def test_length_mismatch_and_missing_field_raise():
    with pytest.raises(ValueError, match="2 prompts but 3 completions"):
        R.arithmetic_reward(["a", "b"], ["1", "2", "3"], target=[1, 2, 3])
    with pytest.raises(ValueError, match="field 'target' has 2 entries"):
        R.arithmetic_reward(["a", "b", "c"], ["1", "2", "3"], target=[1, 2])
    with pytest.raises(ValueError, match="'target' must be a sequence"):
        R.arithmetic_reward(["a"], ["1"], target=1)
    with pytest.raises(ValueError, match="'completions' must be a sequence"):
        R.arithmetic_reward(["a"], "1", target=[1])
    with pytest.raises(TypeError, match=r"needs the field\(s\) \['numbers'\]"):
        R.countdown_reward(["a"], ["1"], target=[1])
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        R.combine(R.format_reward("x"))(["a", "b"], ["x"])


def test_numbers_of_every_kind_are_rewards():
    """A reward function may return bools, ints, floats, NumPy or JAX arrays (what it may not:
    tests/test_rollout.py)."""
    for values in ([True, False, True], np.arange(3), jnp.arange(3.0), [1, 2.5, np.float32(3)], (0, 1, 2)):
        rewards = R.as_rewards(values, 3, "f")
        assert rewards.dtype == np.float32 and rewards.shape == (3,)
        np.testing.assert_array_equal(rewards, np.asarray(values, dtype=np.float32))


def test_uncomputable_rewards_are_zero_never_nan():
    @R.per_example
    def flaky(prompt, completion, **_):
        if completion == "raise":
            raise RuntimeError("boom")
        return {"nan": float("nan"), "inf": float("inf")}.get(completion, 0.5)

    out = flaky(["p"] * 4, ["raise", "nan", "inf", "ok"])
    assert out.dtype == np.float32 and out.shape == (4,)
    np.testing.assert_array_equal(out, [0, 0, 0, 0.5])
    # a custom batched function's NaN passes through combine, to the one check before training
    nan_fn = lambda prompts, completions, **_: np.array([np.nan, 1.0])  # noqa: E731
    total = R.combine((nan_fn, 2.0), R.format_reward("x"))
    summed = total(["a", "b"], ["x", "y"])
    np.testing.assert_array_equal(summed, [np.nan, 2.0])
    with pytest.raises(R.RewardError, match=r"reward function 2 \* <lambda> \+ format_reward returned nan for row 0 "
                                            r"of 2 \(1 non-finite; prompt 'a', completion 'x'\)"
                                            r".*nonfinite_rewards='mask'"):
        R.finite_rewards(summed, R.reward_name(total), ["a", "b"], ["x", "y"])
    cleaned, bad = R.finite_rewards(summed, "r", ["a", "b"], ["x", "y"], nonfinite="mask")
    np.testing.assert_array_equal(cleaned, [0.0, 2.0])
    np.testing.assert_array_equal(bad, [True, False])
    with pytest.raises(ValueError, match="nonfinite must be one of"):
        R.finite_rewards(summed, "r", ["a", "b"], ["x", "y"], nonfinite="zero")
    with pytest.raises(ValueError, match="shape"):
        R.combine(lambda p, c, **_: np.zeros(3))(["a"], ["x"])
    # empty batch
    assert R.math_reward([], [], answer=[]).shape == (0,)


def test_per_example_passes_only_accepted_fields():
    @R.per_example
    def exact(prompt, completion, *, target):  # no **_: other fields are not passed
        return float(completion == target)

    np.testing.assert_array_equal(exact(["p", "p"], ["a", "b"], target=["a", "a"], answer=["x", "y"]), [1, 0])
    with pytest.raises(ValueError, match="clash"):
        exact(["p"], ["a"], target=["a"], completion=["a"])


def test_batch_fields_repeat_matches_group_layout():
    examples = [{"prompt": "1+1=", "answer": "2", "target": 2}, {"prompt": "2+3=", "answer": "5", "target": 5}]
    fields = R.batch_fields(examples, repeat=3)
    assert fields == {"answer": ["2"] * 3 + ["5"] * 3, "target": [2] * 3 + [5] * 3}
    prompts = [ex["prompt"] for ex in examples for _ in range(3)]
    out = R.arithmetic_reward(prompts, ["2", "3", "02", "5", "-5", ""], **fields)
    np.testing.assert_array_equal(out, [1, 0, 1, 1, 0, 0])


def test_format_reward():
    fn = R.format_reward(r"-?\d+")
    np.testing.assert_array_equal(fn(["p"] * 5, ["42", " -7\n", "4 2", "", "42abc"]), [1, 1, 0, 0, 0])


# --- arithmetic ---------------------------------------------------------------------------------


def test_arithmetic_verifier_on_hand_written_answers():
    cases = [("37+45=", "82", 82, 1.0), ("37+45=", " 82 ", 82, 1.0), ("12-45=", "-33", -33, 1.0),
             ("37+45=", "83", 82, 0.0), ("12-45=", "33", -33, 0.0),
             ("37+45=", "82.0", 82, 0.0), ("37+45=", "8 2", 82, 0.0), ("37+45=", "eighty-two", 82, 0.0),
             ("37+45=", "", 82, 0.0), ("37+45=", "+82", 82, 0.0), ("37+45=", "9" * 5000, 82, 0.0)]
    prompts, completions, targets, expected = zip(*cases, strict=True)
    np.testing.assert_array_equal(R.arithmetic_reward(prompts, completions, target=targets), expected)


@pytest.mark.parametrize("digits,ops", [(1, "+"), (2, "+"), (3, "+-*"), (5, "-")])
def test_arithmetic_examples_agree_with_verifier_and_are_deterministic(digits, ops):
    task = R.ArithmeticTask(digits=digits, ops=ops)
    for seed in range(5):
        examples = task.examples(200, seed=seed)
        prompts = [ex["prompt"] for ex in examples]
        np.testing.assert_array_equal(task.reward_fn(prompts, [ex["answer"] for ex in examples],
                                                     **R.batch_fields(examples)), 1.0)
        assert task.examples(200, seed=seed) == examples
        for ex in examples:
            a, op, b = ex["prompt"][:digits], ex["prompt"][digits], ex["prompt"][digits + 1:-1]
            assert len(a) == len(b) == digits and op in ops and ex["prompt"].endswith("=")
            assert ex["target"] == eval(ex["prompt"][:-1])  # trusted, generated text
    assert task.examples(50, seed=0) != task.examples(50, seed=1)


def test_arithmetic_task_rejects_bad_config():
    with pytest.raises(ValueError):
        R.ArithmeticTask(digits=0)
    with pytest.raises(ValueError):
        R.ArithmeticTask(ops="/")


# --- scratchpad arithmetic ----------------------------------------------------------------------


@pytest.mark.parametrize("completion,target,ok", [
    ("82", 82, False),                                    # no ':' -> incorrect
    (":82", 82, True),                                    # empty working
    ("....:82", 82, True),
    ("1+2:82", 82, True),                                 # the working is free text
    ("..:83", 82, False),
    ("..:82:", 82, False),                                # the answer is after the LAST ':'
    ("..:82:82", 82, True),
    ("a:b:c:82", 82, True),
    ("..: 82 ", 82, True),                                # the answer is stripped, as in is_arithmetic_answer
    ("  ..:82\n", 82, True),
    ("..:082", 82, True),                                 # leading zeros, as in is_arithmetic_answer
    ("..:-33", -33, True),                                # negative targets
    (":-33", -33, True),
    ("..:33", -33, False),
    ("..:--33", -33, False),
    ("..:+82", 82, False),
    ("..:82.0", 82, False),
    ("..:8 2", 82, False),
    ("82:", 82, False),
    (":", 82, False),
    ("", 82, False),
    ("..:" + "9" * 5000, 82, False),                       # a very long malformed number: 0, not an exception
    ("9" * 5000 + ":82", 82, True),                       # a very long working area is fine
    ("..:" + "0" * 100 + "82", 82, False),                # over is_arithmetic_answer's length limit
])
def test_scratchpad_verifier_on_hand_written_answers(completion, target, ok):
    assert R.is_scratchpad_answer(completion, target) is ok
    out = R.scratchpad_reward(["37+45="], [completion], target=[target])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [float(ok)])


@pytest.mark.parametrize("digits,ops,max_scratch", [(1, "+", 0), (2, "+", 8), (3, "+-*", 3), (2, "-", 20)])
def test_scratchpad_examples_agree_with_verifier_and_are_deterministic(digits, ops, max_scratch):
    task = R.ScratchpadArithmeticTask(digits=digits, ops=ops, max_scratch=max_scratch)
    plain = R.ArithmeticTask(digits=digits, ops=ops)
    for seed in range(3):
        examples = task.examples(500, seed=seed)
        prompts = [ex["prompt"] for ex in examples]
        answers = [ex["answer"] for ex in examples]
        np.testing.assert_array_equal(task.reward_fn(prompts, answers, **R.batch_fields(examples)), 1.0)
        assert task.examples(500, seed=seed) == examples
        # the same problems as ArithmeticTask for the same seed
        reference = plain.examples(500, seed=seed)
        assert prompts == [ex["prompt"] for ex in reference]
        assert [ex["target"] for ex in examples] == [ex["target"] for ex in reference]
        lengths = set()
        for ex, ref in zip(examples, reference, strict=True):
            working, answer = ex["answer"].split(":")
            assert set(working) <= {"."} and answer == ref["answer"]
            assert ex["answer"] == "." * len(working) + ":" + str(ex["target"])
            lengths.add(len(working))
        assert lengths == set(range(max_scratch + 1))    # uniform on 0..max_scratch: all lengths appear
        assert all(re.fullmatch(task.format_pattern, a) for a in answers)
    assert task.examples(50, seed=0) != task.examples(50, seed=1)


def test_scratchpad_task_config_and_errors():
    task = R.ScratchpadArithmeticTask()
    assert (task.name, task.digits, task.ops, task.max_scratch) == ("scratchpad_arithmetic", 2, "+", 8)
    assert task.alphabet == SCRATCHPAD_ALPHABET == ALPHABET + ".:" and ALPHABET == "0123456789+-*="
    assert R.ArithmeticTask().alphabet == "0123456789+-*="       # the plain task's vocabulary is unchanged
    assert R.make_task("scratchpad_arithmetic", digits=3, ops="+-", max_scratch=2) == \
        R.ScratchpadArithmeticTask(digits=3, ops="+-", max_scratch=2)
    assert R.TASKS["scratchpad_arithmetic"] is R.ScratchpadArithmeticTask
    for bad in (-1, 1.5, "8", None, True):
        with pytest.raises(ValueError, match="max_scratch"):
            R.ScratchpadArithmeticTask(max_scratch=bad)
    with pytest.raises(ValueError, match="digits"):
        R.ScratchpadArithmeticTask(digits=0)
    with pytest.raises(ValueError, match="ops"):
        R.ScratchpadArithmeticTask(ops="/")
    fmt = R.format_reward(task.format_pattern)
    np.testing.assert_array_equal(fmt(["p"] * 7, ["..:82", ":-3", " ..:82\n", "82", "..:", "a:b:1", "..:8x"]),
                                  [1, 1, 1, 0, 0, 1, 0])  # the format accepts whatever the reward accepts


def test_every_task_builds_from_an_experiment_task_section():
    from pgjax.config import TaskSection

    build = lambda section: R.make_task(section.name, section.options)  # noqa: E731
    assert build(TaskSection(name="scratchpad_arithmetic")) == R.ScratchpadArithmeticTask(digits=2, ops="+",
                                                                                            max_scratch=8)
    section = TaskSection(
        name="scratchpad_arithmetic", options={"digits": 3, "ops": "+-", "max_scratch": 4, "working": "after"}
    )
    assert build(section) == R.ScratchpadArithmeticTask(digits=3, ops="+-", max_scratch=4, working="after")
    assert build(TaskSection()) == R.ArithmeticTask()  # the default task is unchanged
    assert build(TaskSection(name="arithmetic_mix", options={"digits": 3})) == R.MixedArithmeticTask(digits=3)
    assert build(TaskSection(name="countdown", options={"count": 4})) == R.CountdownTask(count=4)
    assert build(TaskSection(name="jsonl_math", options={"path": "x.jsonl", "prompt_field": "q"})) == R.JsonlMathTask(
        "x.jsonl", "q"
    )
    assert set(R.TASKS) == {"arithmetic", "arithmetic_mix", "scratchpad_arithmetic", "countdown", "jsonl_math",
                            "word_math"}


def user_task(digits, path="", **options):
    """A user's task factory (imported by path in the test below): takes the options it names."""
    return R.ArithmeticTask(digits=digits, ops=options["ops"])


def test_a_users_task_plugs_in_by_import_path():
    task = R.make_task("test_rewards:user_task", digits=3, ops="-", count=9)
    assert task == R.ArithmeticTask(digits=3, ops="-")
    for name, message in [("test_rewards:no_such", "cannot be imported"), ("no.such.module:f", "cannot be imported"),
                          ("test_rewards:", "not an import path"), ("test_rewards:ROWS_NOT_CALLABLE", "not callable")]:
        with pytest.raises(ValueError, match=message):
            R.task_factory(name)


ROWS_NOT_CALLABLE = 3


# --- countdown ----------------------------------------------------------------------------------


@pytest.mark.parametrize("expression,numbers,target,ok", [
    ("3*5+7", [3, 5, 7], 22, True),
    (" 7 + 3 * 5 ", [3, 5, 7], 22, True),                 # any order, spaces
    ("(25-5)*(3+2)", [2, 3, 5, 25], 100, True),
    ("(4-2/3)*3", [2, 3, 3, 4], 10, True),                # a fractional intermediate, exact
    ("8/(3-8/3)", [3, 3, 8, 8], 24, True),
    ("3*5+8", [3, 5, 7], 22, False),                      # a number not given
    ("3*5+7+7", [3, 5, 7], 29, False),                    # a number used twice
    ("3*5", [3, 5, 7], 15, False),                        # a number missing
    ("3*5+7", [3, 5, 7], 23, False),                      # wrong value
    ("7/(5-5)+3", [3, 5, 5, 7], 3, False),                # division by zero
    ("(3*5+7", [3, 5, 7], 22, False),                     # unbalanced
    ("3*5+7)", [3, 5, 7], 22, False),
    ("3**5+7", [3, 5, 7], 250, False),                    # not an operator here
    ("-3+5+7", [3, 5, 7], 9, False),                      # no unary minus
    ("3 5 7", [3, 5, 7], 22, False),
    ("", [3, 5, 7], 22, False),
    ("3*5+7=22", [3, 5, 7], 22, False),
    ("__import__('os')", [3, 5, 7], 22, False),
    ("(" * 100 + "3" + ")" * 100, [3], 3, False),         # nested too deeply
])
def test_countdown_verifier_on_hand_written_answers(expression, numbers, target, ok):
    assert R.is_countdown_solution(expression, numbers, target) is ok
    out = R.countdown_reward(["prompt"], [expression], numbers=[numbers], target=[target])
    np.testing.assert_array_equal(out, [float(ok)])


def test_evaluate_expression_is_exact_and_rejects_division_by_zero():
    from fractions import Fraction

    assert R.evaluate_expression("1/3+1/6") == (Fraction(1, 2), [1, 3, 1, 6])
    assert R.evaluate_expression("2-3-4") == (Fraction(-5), [2, 3, 4])
    assert R.evaluate_expression("12/2/3")[0] == 2
    with pytest.raises(ZeroDivisionError):
        R.evaluate_expression("1/(2-2)")
    with pytest.raises(ValueError):
        R.evaluate_expression("1+")


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_countdown_examples_agree_with_verifier_and_are_deterministic(count):
    task = R.CountdownTask(count=count, max_number=20, max_target=100)
    for seed in range(5):
        examples = task.examples(200, seed=seed)
        prompts = [ex["prompt"] for ex in examples]
        answers = [ex["answer"] for ex in examples]
        np.testing.assert_array_equal(task.reward_fn(prompts, answers, **R.batch_fields(examples)), 1.0)
        assert task.examples(200, seed=seed) == examples
        for ex in examples:
            assert len(ex["numbers"]) == count and all(1 <= x <= 20 for x in ex["numbers"])
            assert 1 <= ex["target"] <= 100
            assert ex["prompt"] == " ".join(map(str, ex["numbers"])) + f">{ex['target']}:"
    # a demonstration with one number swapped out is no longer a solution
    ex = task.examples(1, seed=0)[0]
    wrong = [*ex["numbers"][:-1], ex["numbers"][-1] + 1]
    assert R.countdown_reward([ex["prompt"]], [ex["answer"]], numbers=[wrong], target=[ex["target"]])[0] == 0


# --- tokenizers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("task", [R.ArithmeticTask(3, "+-*"), R.CountdownTask(4),
                                  R.ScratchpadArithmeticTask(3, "+-*", 12)], ids=lambda t: t.name)
def test_char_tokenizer_roundtrip_and_save_load(task, tmp_path):
    from transformers import AutoTokenizer

    tok = task.tokenizer()
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (R.PAD_ID, R.EOS_ID, R.UNK_ID) == (0, 1, 2)
    assert tok.bos_token_id is None and len(tok) == 3 + len(task.alphabet)
    texts = [s for ex in task.examples(50, seed=0) for s in (ex["prompt"], ex["answer"])]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert len(ids) == len(text) and R.UNK_ID not in ids
        assert tok.decode(ids) == text
    assert tok.decode([*tok(texts[0])["input_ids"], R.EOS_ID, R.PAD_ID], skip_special_tokens=True) == texts[0]
    batch = tok(["1", "12+3"], padding=True)
    assert batch["input_ids"][0][:3] == [R.PAD_ID] * 3 and batch["attention_mask"][0] == [0, 0, 0, 1]

    tok.save_pretrained(tmp_path)
    for loaded in (AutoTokenizer.from_pretrained(tmp_path, local_files_only=True), hf.load_tokenizer(tmp_path)):
        assert loaded.get_vocab() == tok.get_vocab()
        assert loaded.padding_side == "left"
        assert (loaded.pad_token_id, loaded.eos_token_id) == (0, 1)
        for text in texts:
            assert loaded(text)["input_ids"] == tok(text)["input_ids"]
            assert loaded.decode(loaded(text)["input_ids"]) == text


def test_char_tokenizer_unknown_characters_and_bad_alphabets(tmp_path):
    tok = R.char_tokenizer("ab ")
    assert tok("a x b")["input_ids"] == [3, 5, R.UNK_ID, 5, 4]
    with pytest.raises(ValueError, match="repeats"):
        R.char_tokenizer("aba")
    with pytest.raises(ValueError):
        R.char_tokenizer("")
    with pytest.raises(FileNotFoundError):
        hf.load_tokenizer(tmp_path / "missing")


# --- math answers -------------------------------------------------------------------------------

EQUAL = [
    ("0.5", "1/2"), ("0.5", r"\frac{1}{2}"), ("1/2", r"\frac{1}{2}"), (r"\dfrac{1}{2}", r"\frac{1}{2}"),
    (r"\tfrac12", "0.5"), ("-0.5", r"-\frac{1}{2}"), ("1,000", "1000"), ("1,234,567", "1234567"),
    ("10", "10.0"), ("$5$", "5."), (r"\sqrt{4}", "2"), (r"2\sqrt{2}", r"\sqrt{8}"), (r"\sqrt[3]{8}", "2"),
    (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2"), (r"\left(\frac{1}{2}\right)", "0.5"), (r"50\%", "50"), ("50%", "50"),
    (r"5\text{ cm}", "5"), (r"90^\circ", "90"), ("x=5", "5"), ("x+1", "1+x"), ("x^2+2x+1", "(x+1)^2"),
    (r"\frac{1}{2}x", "x/2"), (r"2\pi r", r"2 r \pi"), (r"3 \cdot 4", "12"), (r"2 \times 3", "6"),
    (r"\text{Monday}", "Monday"), ("(1, 2)", "(1,2)"), (42, "42"),
]
NOT_EQUAL = [
    ("0.5", "0.51"), ("x+1", "x+2"), (r"50\%", "0.5"), ("1/3", "0.333"), ("1,2", "12"), ("2", "-2"),
    (r"\sqrt{2}", "1.41"), ("x", "y"), (r"\frac{1}{0}", "1"), ("0^{-1}", "1"),
]
MALFORMED = [None, "", "   ", r"\frac{1}{2", "}}{{", r"\unknowncommand{3}", "__import__('os').system('true')",
             "x.__class__", "lambda: 1", "9^{9^{9^{9}}}", "9**9**9**9", r"\sqrt{9^{99^{99}}}", "1" * 500,
             "((((9^{100})^{100})^{100})^{100})", "2^{x+9^{9^9}}", r"\sin(9^{9^9})",
             "(a+b+c+d)^{100}", "x^{x^{x^{x^{x^{x^{x^{x^{x^{x}}}}}}}}}", r"\log((99x)^{(99x)^{(99x)^{(99x)}}})"]


@pytest.mark.parametrize("a,b", EQUAL)
def test_answers_equal_on_equivalent_forms(a, b):
    assert answers_equal(a, b) and answers_equal(b, a)


@pytest.mark.parametrize("a,b", NOT_EQUAL)
def test_answers_not_equal(a, b):
    assert not answers_equal(a, b) and not answers_equal(b, a)


@pytest.mark.parametrize("bad", MALFORMED)
def test_malformed_answers_are_not_equal_and_do_not_raise_or_hang(bad):
    import time

    start = time.perf_counter()
    assert answers_equal(bad, "1") is False and answers_equal("2", bad) is False
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("text,expected", [
    (r"so the answer is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
    (r"\boxed{1} first, then \boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),  # last box, nested braces
    (r"\boxed 5$", "5"), (r"\fbox{7}", "7"),
    (r"\boxed{\frac{1}{2}", None),                       # unbalanced last box
    ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"), ("#### 1,000\n", "1,000"),
    ("The answer is 42.", "42"), ("costs -3 then 5-3", "3"), ("about 2.5 or -1.25", "-1.25"), ("3/4 of it", "3/4"),
    ("no number here", None), ("", None),
    (r"\boxed{}", None), (r"The answer is \boxed{ }. So 12", "12"),  # blank boxes are passed over
    (r"\boxed{1} then \boxed{2", None),                 # a cut-off last box: no answer
    (r"\boxed 5.", "5"), (r"x = \frac{3}{4}", r"\frac{3}{4}"), ("1,2,3", "3"),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_math_reward():
    completions = [r"... so $\boxed{\dfrac{1}{2}}$", "the answer is 0.5", r"\boxed{0.51}", "I don't know",
                   "#### 1,000", r"\boxed{\frac{1}{2}"]
    answers = ["1/2", r"\frac{1}{2}", "0.5", "0.5", "We get 10*100 = 1000.\n#### 1000", "0.5"]
    out = R.math_reward(["q"] * 6, completions, answer=answers)
    np.testing.assert_array_equal(out, [1, 1, 0, 0, 1, 0])
    assert np.isfinite(out).all() and out.dtype == np.float32


# --- JSONL datasets -----------------------------------------------------------------------------


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_jsonl_by_field_names(tmp_path):
    path = _write(tmp_path / "gsm.jsonl", [
        json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2", "id": 7}), "",
        json.dumps({"question": "Half of 1?", "answer": "#### 0.5", "id": 8})])
    records = R.load_jsonl(path, extra_fields=("id",))
    assert records == [{"prompt": "1+1?", "answer": "1+1=2\n#### 2", "id": 7},
                       {"prompt": "Half of 1?", "answer": "#### 0.5", "id": 8}]
    final = R.load_jsonl(path, answer_transform=extract_answer)
    assert [r["answer"] for r in final] == ["2", "0.5"]
    other = _write(tmp_path / "math.jsonl", [json.dumps({"problem": "p", "solution": r"so \boxed{3}"})])
    assert R.load_jsonl(other, "problem", "solution") == [{"prompt": "p", "answer": r"so \boxed{3}"}]

    task = R.make_task("jsonl_math", path=str(path), extra_fields=("id",))
    assert task.examples() == records and task.tokenizer() is None
    assert task.examples(5, seed=1) == task.examples(5, seed=1) and len(task.examples(5, seed=1)) == 5
    examples = task.examples(2, seed=0)
    rewards = task.reward_fn([e["prompt"] for e in examples], [e["answer"] for e in examples],
                             **R.batch_fields(examples))
    np.testing.assert_array_equal(rewards, [1, 1])  # the solutions are their own demonstrations


def test_load_jsonl_errors(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        R.load_jsonl(missing)
    with pytest.raises(FileNotFoundError):
        R.make_task("jsonl_math", path=str(missing)).examples(1)

    path = _write(tmp_path / "d.jsonl", [json.dumps({"question": "a", "answer": "1"}),
                                          json.dumps({"question": "b", "solution": "2"})])
    with pytest.raises(ValueError, match=r"d.jsonl:2: record lacks field\(s\) \['answer'\]; "
                                         r"fields present: \['question', 'solution'\]"):
        R.load_jsonl(path)
    with pytest.raises(ValueError, match=r":1: record lacks field\(s\) \['level'\]"):
        R.load_jsonl(path, extra_fields=("level",))

    bad = _write(tmp_path / "bad.jsonl", [json.dumps({"question": "a", "answer": "1"}), "{not json"])
    with pytest.raises(ValueError, match="bad.jsonl:2: invalid JSON"):
        R.load_jsonl(bad)
    for lines, message in [(["[1, 2]"], "expected a JSON object"), ([" "], "no records"),
                           ([json.dumps({"question": 3, "answer": "1"})], "must be a string")]:
        with pytest.raises(ValueError, match=message):
            R.load_jsonl(_write(tmp_path / "x.jsonl", lines))
    no_final = _write(tmp_path / "nf.jsonl", [json.dumps({"question": "a", "answer": "no number"})])
    with pytest.raises(ValueError, match="nf.jsonl:1: no answer could be extracted"):
        R.load_jsonl(no_final, answer_transform=extract_answer)


def test_make_task():
    assert R.make_task("countdown", count=4) == R.CountdownTask(count=4)
    assert R.make_task("arithmetic").name == "arithmetic"
    with pytest.raises(ValueError, match="'chess' is unknown; valid: arithmetic"):
        R.make_task("chess")


def test_rewards_never_nan_on_random_text():
    rng = np.random.default_rng(0)
    alphabet = list("0123456789+-*/()^=.,:{}\\ abcx$#%") + ["\\frac", "\\sqrt", "\\boxed{", "####"]
    texts = ["".join(rng.choice(alphabet, size=rng.integers(0, 20))) for _ in range(300)]
    n = len(texts)
    batches = [
        R.arithmetic_reward([""] * n, texts, target=[5] * n),
        R.scratchpad_reward([""] * n, texts, target=[5] * n),
        R.countdown_reward([""] * n, texts, numbers=[[1, 2, 3]] * n, target=[6] * n),
        R.math_reward([""] * n, texts, answer=texts[::-1]),
        R.format_reward(r"\d+")([""] * n, texts),
    ]
    for out in batches:
        assert out.shape == (n,) and out.dtype == np.float32 and np.isin(out, [0.0, 1.0]).all()


def test_mixed_arithmetic_cycles_difficulties_in_equal_shares_and_tags_them():
    task = R.make_task("arithmetic_mix", digits=3)
    examples = task.examples(30, seed=4)
    assert [e["difficulty"] for e in examples] == [1, 2, 3] * 10
    for e in examples:
        a, b = e["prompt"][:-1].split("+")
        assert len(a) == len(b) == e["difficulty"] and int(a) + int(b) == e["target"]
    fields = R.batch_fields(examples)
    assert (task.reward_fn([e["prompt"] for e in examples], [e["answer"] for e in examples], **fields) == 1).all()
    assert task.examples(30, seed=4) == examples and task.examples(30, seed=5) != examples
    assert task.tokenizer().get_vocab() == R.ArithmeticTask().tokenizer().get_vocab()
    with pytest.raises(ValueError, match="digits"):
        R.MixedArithmeticTask(digits=0)


def test_scratchpad_text_after_the_answer():
    task = R.make_task("scratchpad_arithmetic", digits=2, working="after")
    rows = [("82:...", 1), ("82:", 1), (" 82 :x:y", 1), ("83:..", 0), ("..:82", 0), ("82", 0), ("8x:..", 0)]
    got = task.reward_fn(["37+45="] * len(rows), [c for c, _ in rows], target=[82] * len(rows))
    np.testing.assert_array_equal(got, [r for _, r in rows])
    examples = task.examples(200, seed=3)
    assert all(re.fullmatch(r"-?\d+:\.*", e["answer"]) for e in examples)
    before = R.ScratchpadArithmeticTask(digits=2).examples(200, seed=3)
    assert [e["prompt"] for e in examples] == [e["prompt"] for e in before]
    fields = R.batch_fields(examples)
    assert (task.reward_fn([e["prompt"] for e in examples], [e["answer"] for e in examples], **fields) == 1).all()
    assert R.format_reward(task.format_pattern)(["p"] * 2, ["82:..", "..:82"]).tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="before' or 'after"):
        R.ScratchpadArithmeticTask(working="middle")
