"""Multi-digit arithmetic: ``"37+45="`` -> ``"82"``, generated offline from a seed.

Each operand has exactly ``digits`` digits (0-9 when ``digits=1``), so all
prompts of a task have the same length. The operator is drawn uniformly from
``ops`` (a subset of ``"+-*"``); a difference may be negative (``"12-45="`` ->
``"-33"``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from pgjax.rewards.base import per_example
from pgjax.rewards.tokenizer import char_tokenizer

ALPHABET = "0123456789+-*="
INTEGER = r"-?\d+"
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
        if not (isinstance(self.digits, int) and 1 <= self.digits <= 18):
            raise ValueError(f"digits must be an int in [1, 18], got {self.digits!r}")
        if not self.ops or set(self.ops) - set("+-*") or len(set(self.ops)) != len(self.ops):
            raise ValueError(f"ops must be distinct characters from '+-*', got {self.ops!r}")

    @property
    def reward_fn(self):
        return arithmetic_reward

    def tokenizer(self):
        """The character-level tokenizer over ``ALPHABET`` (the same for every ``digits`` / ``ops``)."""
        return char_tokenizer(self.alphabet)

    def examples(self, n: int, seed: int = 0) -> list[dict[str, Any]]:
        """``n`` examples, a deterministic function of ``seed`` (numpy Generator)."""
        rng = np.random.default_rng(seed)
        low = 0 if self.digits == 1 else 10 ** (self.digits - 1)
        high = 10 ** self.digits
        a = rng.integers(low, high, size=n)
        b = rng.integers(low, high, size=n)
        ops = rng.integers(0, len(self.ops), size=n)
        out = []
        for x, y, k in zip(a.tolist(), b.tolist(), ops.tolist()):
            op = self.ops[k]
            value = x + y if op == "+" else x - y if op == "-" else x * y
            out.append({"prompt": f"{x}{op}{y}=", "answer": str(value), "target": value})
        return out
