"""Step labels for a process reward model, from per-step checks of a response's arithmetic.

A response's steps are its lines (``separator``); a blank line joins the step after it, so the steps
joined by the separator are the response again (but for blank lines at its end, which come after
every step and change none of a causal model's step scores), and its steps are those a process
reward model in the RL loop scores (``LearnedReward.step_logits``: the non-blank parts between
separators). A step's
label says whether the solution up to and including it is still right:

- every equation it writes, ``<arithmetic> = <number>`` (digits, ``+ - * / x ×``, parentheses,
  decimals; ``1,000`` read as 1000), holds exactly (``pgjax.tasks.expressions``), and so did every
  equation of the steps before it (the first error makes every later step wrong, as in
  Math-Shepherd's labels);
- for the last step, also the answer is right (the task's verifier, ``answer_correct``).

A line without an equation is right while no error came before it. Equations whose left side is
not plain arithmetic (a word between numbers, a unit, a product written ``2(3 + 4)``) are not
checked; a result written with decimals may be rounded to them (``10 / 3 = 3.33`` holds).
"""
from __future__ import annotations

import re
from fractions import Fraction

from pgjax.tasks.expressions import CALCULATOR, ExpressionError, evaluate

NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
# an arithmetic left side (numbers and operators, at least one operator) = a number
EQUATION = re.compile(rf"((?:\(\s*)*{NUMBER}(?:\s*\)*\s*[-+*/x×]\s*\(*\s*{NUMBER}\s*\)*)+)\s*=\s*({NUMBER})")
# characters that, just before an equation's left side, show it to be the end of a longer expression
CONTINUES = set("0123456789.,^\\÷−*/+-×()")


def _cut_short(before: str) -> bool:
    """Whether the text ``before`` an equation's left side shows the left side cut short: it ends
    (spaces aside) in a digit, an operator, a bracket, ``^`` or ``\\``, in a LaTeX command
    (``3 \\times 4 + 1``), or in a letter touching it; not after ``=`` (a chain) or a word and a space."""
    stripped = before.rstrip()
    if not stripped or stripped[-1] == "=":
        return False
    if stripped[-1] in CONTINUES:
        return True
    return stripped.split()[-1].startswith("\\") or (stripped == before and stripped[-1].isalnum())


def _value(text: str) -> Fraction:
    return evaluate(text.replace(",", "").replace("×", "*").replace("x", "*"), CALCULATOR)[0]


def _holds(left: str, right: str) -> bool | None:
    """Whether ``left`` = ``right``, exactly, or to the decimals ``right`` is written with (a rounded
    result); None when ``left`` is not plain arithmetic."""
    try:
        value, claimed = _value(left), _value(right)
    except (ExpressionError, ZeroDivisionError):
        return None
    decimals = len(right.partition(".")[2])
    return value == claimed if not decimals else abs(value - claimed) <= Fraction(1, 2 * 10 ** decimals)


def equations_hold(line: str) -> bool:
    """Whether every checkable equation of ``line`` holds (True for a line without one). An equation
    is checked only when its left side is whole (``_cut_short``: ``5 boxes * 4 + 2 = 22`` is not
    checked as ``4 + 2 = 22``); a chain ``a = b = c`` is checked link by link (``b = c`` when ``b``
    is arithmetic)."""
    at = 0
    while (match := EQUATION.search(line, at)) is not None:
        left, right = match.groups()
        if not _cut_short(line[:match.start(1)]) and _holds(left, right) is False:
            return False
        at = match.start(1) + 1                      # the next equation may start inside this one's right side
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
