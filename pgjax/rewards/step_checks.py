"""Step labels for a process reward model, from per-step checks of a response's arithmetic.

A response's steps are its lines (``separator``); a blank line joins the step after it, so the steps
joined by the separator are the response again (but for blank lines at its end, which come after
every step and change none of a causal model's step scores), and its steps are those a process
reward model in the RL loop scores (``LearnedReward.step_logits``: the non-blank parts between
separators). A step's
label says whether the solution up to and including it is still right:

- every equation it writes, ``<arithmetic> = <number>`` (digits, ``+ - * / x ×``, parentheses,
  decimals; ``1,000`` read as 1000), holds exactly (``pgjax.rewards.expressions``), and so did every
  equation of the steps before it (the first error makes every later step wrong, as in
  Math-Shepherd's labels);
- for the last step, also the answer is right (the task's verifier, ``answer_correct``).

A line without an equation is right while no error came before it. Equations whose left side is
not plain arithmetic (a word between numbers, a unit) are not checked.
"""
from __future__ import annotations

import re
from fractions import Fraction

from pgjax.rewards.expressions import CALCULATOR, ExpressionError, evaluate

NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
# an arithmetic left side (numbers and operators, at least one operator) = a number
EQUATION = re.compile(rf"((?:\(\s*)*{NUMBER}(?:\s*\)*\s*[-+*/x×]\s*\(*\s*{NUMBER}\s*\)*)+)\s*=\s*({NUMBER})")


def _value(text: str) -> Fraction:
    return evaluate(text.replace(",", "").replace("×", "*").replace("x", "*"), CALCULATOR)[0]


def equations_hold(line: str) -> bool:
    """Whether every checkable equation of ``line`` holds exactly (True for a line without one)."""
    for left, right in EQUATION.findall(line):
        try:
            if _value(left) != _value(right):
                return False
        except (ExpressionError, ZeroDivisionError):
            continue                         # not plain arithmetic after all: not checked
    return True


def checked_steps(response: str, answer_correct: bool, separator: str = "\n") -> tuple[list[str], list[bool]] | None:
    """(the steps of ``response``, each one's label) as the module docstring says; None for a
    response without a step that is not blank."""
    steps, pending = [], ""
    for part in response.split(separator):
        if part.strip():
            steps.append(pending + part)
            pending = ""
        else:
            pending += part + separator
    if not steps:
        return None
    labels, right = [], True
    for step in steps:
        right = right and equations_hold(step)
        labels.append(right)
    labels[-1] = labels[-1] and bool(answer_correct)
    return steps, labels
