"""Natural-language arithmetic for an instruct model: ``"What is 23 + 48? ..."`` -> ``"... \\boxed{71}."``.

A generated task for a pretrained chat model, which brings its own tokenizer
(``tokenizer()`` is None; the chat template is applied elsewhere): each prompt
is an English user message, either a bare expression (``"What is 23 + 48?"``)
or a one-step word problem (apples, coins, pages, ...), followed by
``INSTRUCTION`` (put the final answer in ``\\boxed{}``). The demonstration is
one short line, ``"23 + 48 = 71. The answer is \\boxed{71}."``.

Difficulty mix: example ``i`` has difficulty ``d = i % digits + 1`` (equal
shares of 1, 2, ..., ``digits``); ``d`` is the number of digits of the larger
operand, the other operand has 1..``d`` digits (uniform); a one-digit
operand is 2-9. The operator is drawn uniformly from ``ops``
(``"+-*"``); a difference is always the larger minus the smaller, so every
target is a non-negative integer. Each prompt is a word problem with
probability ``word_share`` (default 0.5), its template drawn from those of the
operator, else a bare expression. Each example is tagged with its ``difficulty``,
``op`` and ``kind`` (``"word"`` or ``"expression"``), which evaluation groups by.

Held-out phrasings (``held_out``): training draws only ``EXPRESSION_TEMPLATES``
and ``WORD_TEMPLATES``, with operands below ``10 ** digits``. ``held_out=
"templates"`` draws from a second set, ``HELD_OUT_EXPRESSION_TEMPLATES`` and
``HELD_OUT_WORD_TEMPLATES`` (other verbs, objects and sentence shapes), that
training never sees; ``"numbers"`` keeps the training templates but gives every
example difficulty ``digits + 1``: its larger operand has one digit more than
training's largest (so it lies outside the training range, ``>= 10 ** digits``),
the other 1..``digits + 1`` digits as usual; ``"both"`` does both. These splits
are for evaluation (``python -m pgjax.eval ... --set task.options.held_out=templates``);
the Trainer refuses to train on them. ``held_out="none"`` (the default) draws
exactly the examples it drew before the splits existed.

Answers: the verifier reads the only number of the last ``\\boxed{}`` with
non-blank content, or, with ``answer_from="boxed_or_last_number"`` (the
default) and no such box, the last number of the text, since an untrained
model rarely boxes; ``answer_from="boxed"`` reads boxes only. It is
``pgjax.tasks.math_answers.extract_answer(..., number_only=True)``, the
extractor ``jsonl_math`` uses too (its docstring has the full rule). The
format reward asks for exactly one boxed number at the end
(``FORMAT_PATTERN``). Whether a response ended
properly (EOS / end of turn rather than cut off at ``max_new_tokens``) is not
visible to a reward function, which sees the decoded text with EOS stripped:
that is the rollout's ``mask_truncated`` / overlong penalty
(``pgjax.rollout.collect``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pgjax.tasks.arithmetic import _validate_arithmetic
from pgjax.tasks.base import format_reward, per_example
from pgjax.tasks.math_answers import ANSWER_FROM, NUMBER_BODY, extract_answer, normalize_answer, parse_number

INSTRUCTION = "Put your final answer within \\boxed{}."
SYMBOLS = {"+": "+", "-": "-", "*": "×"}
NAMES = ("Mia", "Leo", "Ana", "Sam", "Zoe", "Omar", "Lily", "Ben")

# {name}, {a}, {b}: the first and second operand; a difference always has a >= b.
EXPRESSION_TEMPLATES = ("What is {a} {sym} {b}?", "Calculate {a} {sym} {b}.", "Compute {a} {sym} {b}.")
WORD_TEMPLATES = {
    "+": ("{name} has {a} apples and picks {b} more. How many apples does {name} have now?",
          "{name} read {a} pages on Monday and {b} pages on Tuesday. How many pages did {name} read in all?",
          "A shop sold {a} pens in the morning and {b} pens in the afternoon. How many pens did it sell?"),
    "-": ("{name} had {a} coins and spent {b} of them. How many coins does {name} have left?",
          "A baker made {a} cookies and sold {b}. How many cookies are left?",
          "A book has {a} pages. {name} has read {b} of them. How many pages are left to read?"),
    "*": ("There are {a} boxes with {b} pencils in each box. How many pencils are there in total?",
          "A garden has {a} rows of {b} flowers. How many flowers are in the garden?",
          "{name} buys {a} bags with {b} marbles in each. How many marbles does {name} buy?"),
}

# The held-out phrasings: no template of these is one of the above, and no prompt of one set matches a
# template of the other (tested); the same placeholders and operand order.
HELD_OUT_EXPRESSION_TEMPLATES = ("Find {a} {sym} {b}.", "Evaluate {a} {sym} {b}.", "How much is {a} {sym} {b}?")
HELD_OUT_WORD_TEMPLATES = {
    "+": ("{name} collected {a} shells and then found {b} more. How many shells does {name} have altogether?",
          "A train carries {a} passengers, and {b} more get on at the next station. How many passengers are on "
          "the train now?",
          "A farm has {a} sheep and {b} goats. How many animals does the farm have?"),
    "-": ("A tank holds {a} liters of water and {b} liters leak out. How many liters remain in the tank?",
          "{name} had {a} stickers and gave away {b}. How many stickers does {name} still have?",
          "A school has {a} students, and {b} of them are away on a trip. How many students are at school?"),
    "*": ("Each of {a} shelves holds {b} books. How many books are on the shelves?",
          "{name} saves {b} dollars a week for {a} weeks. How many dollars does {name} save?",
          "A theater has {a} rows with {b} seats in each row. How many seats does the theater have?"),
}
HELD_OUT = ("none", "templates", "numbers", "both")

# Exactly one \boxed, holding only a number (spaces around it allowed), then only whitespace, punctuation
# (. , ; : ! ?), closing brackets, $ or * (markdown bold), or the LaTeX math closers \) and \].
FORMAT_PATTERN = r"(?s)(?:(?!\\boxed).)*\\boxed\s*\{\s*-?" + NUMBER_BODY + r"\s*\}(?:[\s.,;:!?)\]$*]|\\[)\]])*"


def is_word_math_answer(completion: str, target: int, answer_from: str = "boxed_or_last_number") -> bool:
    """True iff the completion's answer, ``extract_answer(completion, answer_from=answer_from,
    number_only=True)`` (one number; ``pgjax.tasks.math_answers``), has the exact value of the integer
    ``target``: for 71, ``71``, ``71.0``, ``142/2`` and ``\\frac{142}{2}`` do; a number of over 64
    characters is no answer."""
    answer = extract_answer(completion, answer_from=answer_from, number_only=True)
    value = None if answer is None else parse_number(normalize_answer(answer))
    return value is not None and value == int(target)


@per_example
def word_math_reward(prompt: str, completion: str, *, target, **_) -> float:
    """Row rule: 1.0 if the completion's answer is ``target`` (field), else 0.0; the answer is the last
    non-blank ``\\boxed{}``, else the last number of the text (``is_word_math_answer`` with
    ``answer_from="boxed_or_last_number"``)."""
    return float(is_word_math_answer(completion, target, "boxed_or_last_number"))


@per_example
def boxed_answer_reward(prompt: str, completion: str, *, target, **_) -> float:
    """Row rule: 1.0 if the last non-blank ``\\boxed{}`` of the completion holds ``target`` (field), else
    0.0; an unboxed answer scores 0.0 (``answer_from="boxed"``)."""
    return float(is_word_math_answer(completion, target, "boxed"))


# 1.0 where the stripped completion holds exactly one \boxed{}, whose content is a number (-?, digits with
# optional thousands commas and decimals, spaces around it), followed by nothing but whitespace,
# . , ; : ! ? ) ] $ * or \) \]; else 0.0. The text before the box is free. (The trainer's format term,
# format_reward(task.format_pattern), is the same function.)
word_math_format_reward = format_reward(FORMAT_PATTERN)


def _operands(d: int, rng: np.random.Generator) -> tuple[int, int]:
    """(larger, smaller) operands: the larger has exactly ``d`` digits, the other a uniform 1..``d`` digits;
    each is uniform over the numbers of its digit count, 2-9 for one digit (no "1 pages", no "× 1")."""
    first = int(rng.integers(max(2, 10 ** (d - 1)), 10 ** d))
    e = int(rng.integers(1, d + 1))
    second = int(rng.integers(max(2, 10 ** (e - 1)), 10 ** e))
    return max(first, second), min(first, second)


def _value_of(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


@dataclasses.dataclass(frozen=True)
class WordMathTask:
    """English arithmetic prompts for a chat model, answered in ``\\boxed{}`` (see the module docstring).

    ``digits``: the hardest difficulty (operands of up to ``digits`` digits; difficulties 1..``digits`` in
    equal shares); ``ops``: operators drawn uniformly (a subset of ``"+-*"``); ``answer_from``: where the
    verifier reads the answer (``ANSWER_FROM``); ``word_share``: the probability of a word problem rather
    than a bare expression; ``held_out``: ``"none"`` (training's phrasings and numbers), ``"templates"``,
    ``"numbers"`` or ``"both"``, the held-out evaluation splits (module docstring; ``digits`` <= 17 for
    held-out numbers). ``tokenizer()`` is None: use the model's tokenizer.

    Example: ``{"prompt": "What is 23 + 48? Put your final answer within \\boxed{}.",
    "answer": "23 + 48 = 71. The answer is \\boxed{71}.", "target": 71, "difficulty": 2, "op": "+",
    "kind": "expression", "tool_calls": [{"name": "calculator", "arguments": "23 + 48"}]}``; ``tool_calls``
    is the worked episode's call with ``task.tools.names=calculator`` (``ToolEnvironment.demonstration``).
    """

    digits: int = 2
    ops: str = "+-*"
    answer_from: str = "boxed_or_last_number"
    word_share: float = 0.5
    held_out: str = "none"
    name: str = dataclasses.field(default="word_math", init=False)
    format_pattern: str = dataclasses.field(default=FORMAT_PATTERN, init=False)

    def __post_init__(self):
        _validate_arithmetic(self.digits, self.ops)
        if self.answer_from not in ANSWER_FROM:
            raise ValueError(f"answer_from must be one of {ANSWER_FROM}, got {self.answer_from!r}")
        if not 0.0 <= self.word_share <= 1.0:
            raise ValueError(f"word_share must be in [0, 1], got {self.word_share!r}")
        if self.held_out not in HELD_OUT:
            raise ValueError(f"held_out must be one of {', '.join(HELD_OUT)}, got {self.held_out!r}")
        if self.held_out in ("numbers", "both") and self.digits > 17:
            raise ValueError(f"held-out numbers have digits + 1 digits, at most 18: digits must be <= 17, "
                             f"got {self.digits}")

    @property
    def reward_fn(self):
        return word_math_reward if self.answer_from == "boxed_or_last_number" else boxed_answer_reward

    def tokenizer(self):
        """None: the task is for a pretrained model, which brings its own tokenizer."""
        return None

    def examples(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` examples, a deterministic function of ``seed``; example ``i`` has difficulty ``i % digits + 1``
        (``digits + 1`` for all with held-out numbers)."""
        rng = np.random.default_rng(seed)
        numbers = self.held_out in ("numbers", "both")
        return [self._example(self.digits + 1 if numbers else i % self.digits + 1, rng) for i in range(n)]

    def _example(self, difficulty: int, rng: np.random.Generator) -> dict[str, Any]:
        """One example of the given difficulty: operator, operands (larger first for ``-``, else in random
        order), form (word problem with probability ``word_share``), template and name, drawn in that order."""
        op = self.ops[int(rng.integers(len(self.ops)))]
        a, b = _operands(difficulty, rng)
        if op != "-" and rng.integers(2):
            a, b = b, a
        held_out = self.held_out in ("templates", "both")
        kind = "word" if rng.random() < self.word_share else "expression"
        if kind == "word":
            templates = (HELD_OUT_WORD_TEMPLATES if held_out else WORD_TEMPLATES)[op]
        else:
            templates = HELD_OUT_EXPRESSION_TEMPLATES if held_out else EXPRESSION_TEMPLATES
        template = templates[int(rng.integers(len(templates)))]
        name = NAMES[int(rng.integers(len(NAMES)))]
        value = _value_of(a, op, b)
        question = template.format(a=a, b=b, sym=SYMBOLS[op], name=name)
        return {"prompt": f"{question} {INSTRUCTION}",
                "answer": f"{a} {SYMBOLS[op]} {b} = {value}. The answer is \\boxed{{{value}}}.",
                "target": value, "difficulty": difficulty, "op": op, "kind": kind,
                "tool_calls": [{"name": "calculator", "arguments": f"{a} {op} {b}"}]}
