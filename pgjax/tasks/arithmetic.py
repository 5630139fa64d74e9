"""Multi-digit arithmetic: ``"37+45="`` -> ``"82"``, generated offline from a seed.

Each operand has exactly ``digits`` digits (0-9 when ``digits=1``), so all
prompts of a task have the same length. The operator is drawn uniformly from
``ops`` (a subset of ``"+-*"``); a difference may be negative (``"12-45="`` ->
``"-33"``).

``ScratchpadArithmeticTask`` has the same prompts but a free-length working
area before the answer: ``"37+45="`` -> ``"...:82"``, scored on the text after
the last ``':'`` only, so a response's length can change without changing its
correctness.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from pgjax.tasks.base import per_example
from pgjax.tasks.tokenizer import char_tokenizer

ALPHABET = "0123456789+-*="
SCRATCHPAD_ALPHABET = ALPHABET + ".:"  # ALPHABET itself stays fixed: other results depend on its vocabulary
INTEGER = r"-?\d+"
SCRATCHPAD_PATTERN = r".*:\s*-?\d+"  # any working area, then the last ":" and the integer answer
TRAILING_PATTERN = r"\s*-?\d+:.*"     # the integer answer, the first ":", then any text
_INTEGER = re.compile(INTEGER)
_MAX_CHARS = 64  # longer "integers" are malformed (and too long for int() to be cheap)


def is_arithmetic_answer(completion: str, target: int) -> bool:
    """True iff ``completion.strip()`` is an integer (``-?\\d+``, leading zeros allowed) equal to ``target``."""
    text = completion.strip()
    return len(text) <= _MAX_CHARS and _INTEGER.fullmatch(text) is not None and int(text) == int(target)


@per_example
def arithmetic_reward(prompt: str, completion: str, *, target, **_) -> float:
    """Row rule: 1.0 if the stripped completion is the integer ``target`` (field), else 0.0 (malformed -> 0.0).

    The completion is the decoded response with EOS already stripped.
    """
    return float(is_arithmetic_answer(completion, target))


def is_scratchpad_answer(completion: str, target: int) -> bool:
    """True iff ``completion`` contains ``':'`` and the text after its LAST ``':'`` is the integer ``target``.

    The text after the last ``':'`` follows ``is_arithmetic_answer`` (stripped, ``-?\\d+``, leading zeros
    allowed); the working area before it is free text and is ignored. No ``':'`` -> False.
    """
    _, sep, answer = completion.rpartition(":")
    return bool(sep) and is_arithmetic_answer(answer, target)


def is_answer_then_text(completion: str, target: int) -> bool:
    """True iff ``completion`` contains ``':'`` and the text before its FIRST ``':'`` is the integer
    ``target`` (``is_arithmetic_answer``); whatever follows is free text. No ``':'`` -> False."""
    answer, sep, _ = completion.partition(":")
    return bool(sep) and is_arithmetic_answer(answer, target)


@per_example
def trailing_scratch_reward(prompt: str, completion: str, *, target, **_) -> float:
    """Row rule: 1.0 if the text before the first ``':'`` of the completion is the integer ``target``,
    else 0.0; the text after it does not count (``ScratchpadArithmeticTask(working="after")``)."""
    return float(is_answer_then_text(completion, target))


@per_example
def scratchpad_reward(prompt: str, completion: str, *, target, **_) -> float:
    """Row rule: 1.0 if the text after the last ``':'`` of the completion is the integer ``target`` (field),
    else 0.0 (no ``':'`` or a malformed answer -> 0.0); the working area before it does not count.

    The completion is the decoded response with EOS already stripped.
    """
    return float(is_scratchpad_answer(completion, target))


def _validate_arithmetic(digits, ops) -> None:
    if not (isinstance(digits, int) and 1 <= digits <= 18):
        raise ValueError(f"digits must be an int in [1, 18], got {digits!r}")
    if not ops or set(ops) - set("+-*") or len(set(ops)) != len(ops):
        raise ValueError(f"ops must be distinct characters from '+-*', got {ops!r}")


def _arithmetic_problems(digits: int, ops: str, n: int, rng: np.random.Generator) -> list[tuple[str, int]]:
    """``n`` (prompt, value) pairs drawn from ``rng``: operands first, then operators (advances ``rng``)."""
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = 10 ** digits
    a = rng.integers(low, high, size=n)
    b = rng.integers(low, high, size=n)
    picks = rng.integers(0, len(ops), size=n)
    out = []
    for x, y, k in zip(a.tolist(), b.tolist(), picks.tolist(), strict=True):
        op = ops[k]
        value = x + y if op == "+" else x - y if op == "-" else x * y
        out.append((f"{x}{op}{y}=", value))
    return out


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
    """``a op b =`` with ``digits``-digit operands and ``op`` drawn from ``ops``.

    Examples: ``{"prompt": "37+45=", "answer": "82", "target": 82}``.
    """

    digits: int = 2
    ops: str = "+"
    name: str = dataclasses.field(default="arithmetic", init=False)
    alphabet: str = dataclasses.field(default=ALPHABET, init=False)
    format_pattern: str = dataclasses.field(default=INTEGER, init=False)

    def __post_init__(self):
        _validate_arithmetic(self.digits, self.ops)

    @property
    def reward_fn(self):
        return arithmetic_reward

    def tokenizer(self):
        """The character-level tokenizer over ``ALPHABET`` (the same for every ``digits`` / ``ops``)."""
        return char_tokenizer(self.alphabet)

    def examples(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` examples, a deterministic function of ``seed`` (numpy Generator)."""
        rng = np.random.default_rng(seed)
        return [{"prompt": prompt, "answer": str(value), "target": value}
                for prompt, value in _arithmetic_problems(self.digits, self.ops, n, rng)]


@dataclasses.dataclass(frozen=True)
class ScratchpadArithmeticTask:
    """``ArithmeticTask``'s prompts, answered as ``<working>:<answer>`` with a free-length working area.

    The reward (``scratchpad_reward``) reads only the integer after the last ``':'``, so the length of the
    working area is free: a response can grow or shrink without changing its correctness. Demonstrations are
    ``"." * k + ":" + answer`` with ``k`` uniform on ``0..max_scratch`` (inclusive), drawn from the same
    Generator after the problems, so the prompts equal ``ArithmeticTask(digits, ops)``'s for the same seed.

    Examples: ``{"prompt": "37+45=", "answer": "...:82", "target": 82}``.

    ``working="after"`` puts the free text after the answer: ``<answer>:<text>``, rewarded by
    ``trailing_scratch_reward`` (the integer before the first ``':'``), demonstrations ``"82:..."``.
    There the policy chooses the length after it has written its answer, so the length can depend
    on the answer (before it, the length is chosen blind to what the answer will be).
    """

    digits: int = 2
    ops: str = "+"
    max_scratch: int = 8
    working: str = "before"
    name: str = dataclasses.field(default="scratchpad_arithmetic", init=False)
    alphabet: str = dataclasses.field(default=SCRATCHPAD_ALPHABET, init=False)

    def __post_init__(self):
        _validate_arithmetic(self.digits, self.ops)
        if not (isinstance(self.max_scratch, int) and not isinstance(self.max_scratch, bool)
                and self.max_scratch >= 0):
            raise ValueError(f"max_scratch must be an int >= 0, got {self.max_scratch!r}")
        if self.working not in ("before", "after"):
            raise ValueError(f"working must be 'before' or 'after' the answer, got {self.working!r}")

    @property
    def format_pattern(self) -> str:
        return SCRATCHPAD_PATTERN if self.working == "before" else TRAILING_PATTERN

    @property
    def reward_fn(self):
        return scratchpad_reward if self.working == "before" else trailing_scratch_reward

    def tokenizer(self):
        """The character-level tokenizer over ``SCRATCHPAD_ALPHABET`` (``ALPHABET`` plus ``".:"``)."""
        return char_tokenizer(self.alphabet)

    def examples(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` examples, a deterministic function of ``seed`` (numpy Generator)."""
        rng = np.random.default_rng(seed)
        problems = _arithmetic_problems(self.digits, self.ops, n, rng)
        scratch = rng.integers(0, self.max_scratch + 1, size=n)
        write = ((lambda value, k: "." * k + ":" + str(value)) if self.working == "before"
                 else (lambda value, k: str(value) + ":" + "." * k))
        return [{"prompt": prompt, "answer": write(value, k), "target": value}
                for (prompt, value), k in zip(problems, scratch.tolist(), strict=True)]


@dataclasses.dataclass(frozen=True)
class MixedArithmeticTask(ArithmeticTask):
    """A controlled mix of difficulties: ``ArithmeticTask`` prompts with 1, 2, ..., ``digits``-digit
    operands in equal shares (row i has ``i % digits + 1`` digits), each example tagged with its
    ``difficulty`` (the number of digits). Reward and tokenizer are ``ArithmeticTask``'s.

    Examples: ``{"prompt": "3+4=", "answer": "7", "target": 7, "difficulty": 1}``,
    ``{"prompt": "37+45=", "answer": "82", "target": 82, "difficulty": 2}``.
    """

    digits: int = 3
    name: str = dataclasses.field(default="arithmetic_mix", init=False)

    def examples(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` examples, a deterministic function of ``seed``; difficulties cycle 1, 2, ..., ``digits``."""
        rng = np.random.default_rng(seed)
        levels = [i % self.digits + 1 for i in range(n)]
        problems = {d: iter(_arithmetic_problems(d, self.ops, levels.count(d), rng)) for d in sorted(set(levels))}
        out = []
        for d in levels:
            prompt, value = next(problems[d])
            out.append({"prompt": prompt, "answer": str(value), "target": value, "difficulty": d})
        return out
