"""Tools an agent calls: the interface, and the calculator.

A tool is any object with a ``name``, a one-line ``description`` (what a tool prompt shows the model),
the name of its one ``parameter`` (for the chat templates that take tools as JSON schemas) and
``__call__(arguments: str) -> ToolResult``. A tool never raises for what the model wrote: a
malformed or failing call is a ``ToolResult`` with ``ok=False`` whose text says what went wrong, an
observation the policy sees and can learn from. ``pgjax.agents.sandbox.PythonSandbox`` is the other
tool pgjax ships.
"""
from __future__ import annotations

import dataclasses
import re
from fractions import Fraction
from typing import Protocol

from pgjax.tasks import expressions

SIGNIFICANT_DIGITS = 12
THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one call gave the policy (``text``), whether the call was well formed and ran (``ok``), and
    whether the text was cut to the tool's output limit (``truncated``)."""

    text: str
    ok: bool
    truncated: bool = False


class Tool(Protocol):
    name: str
    description: str
    parameter: str

    def __call__(self, arguments: str) -> ToolResult: ...


def format_number(value: Fraction) -> str:
    """A Fraction as the calculator prints it: an integer exactly, however long; any other value rounded
    half-even to ``SIGNIFICANT_DIGITS`` significant digits with trailing zeros dropped (``1/8`` ->
    ``0.125``, ``1/3`` -> ``0.333333333333``), as Python writes floats: in scientific notation
    (``1.5e-20``, ``1e+20``) below 1e-6 or from 1e12 on in size."""
    if value.denominator == 1:
        return str(value.numerator)
    sign, magnitude = ("-" if value < 0 else ""), abs(value)
    exponent = _decimal_exponent(magnitude)
    digits = str(round(magnitude * Fraction(10) ** (SIGNIFICANT_DIGITS - 1 - exponent)))   # half to even
    if len(digits) > SIGNIFICANT_DIGITS:               # rounding carried to a new leading digit
        digits, exponent = digits[:SIGNIFICANT_DIGITS], exponent + 1
    if exponent < -6 or exponent >= SIGNIFICANT_DIGITS:
        mantissa = (digits[0] + "." + digits[1:]).rstrip("0").rstrip(".")
        return f"{sign}{mantissa}e{exponent:+03d}"
    if exponent >= 0:
        whole, fraction = digits[:exponent + 1], digits[exponent + 1:]
    else:
        whole, fraction = "0", "0" * (-exponent - 1) + digits
    fraction = fraction.rstrip("0")
    return f"{sign}{whole}{'.' + fraction if fraction else ''}"


def _decimal_exponent(magnitude: Fraction) -> int:
    """floor(log10(magnitude)) of a positive Fraction, exactly."""
    exponent = len(str(magnitude.numerator)) - len(str(magnitude.denominator))
    if magnitude < Fraction(10) ** exponent:
        exponent -= 1
    return exponent


@dataclasses.dataclass(frozen=True)
class Calculator:
    """Exact arithmetic for the policy: ``+ - * /``, powers (``^`` or ``**``, integer exponents),
    signs, decimals and parentheses, through ``pgjax.tasks.expressions`` (a parser, never ``eval``;
    its limits bound the work any text can ask for). ``×`` and ``÷`` are read as ``*`` and ``/``, and a
    ``,`` followed by a group of exactly three digits as a thousands separator (``1,234,567``; ``1,2``
    is an error). The result is ``format_number``'s; a malformed
    expression or a division by zero is an ``ok=False`` result naming the problem."""

    name: str = "calculator"
    description: str = "evaluates an arithmetic expression exactly: + - * / ^ and parentheses, e.g. 12*(3+4)/5"
    parameter: str = "expression"

    def __call__(self, arguments: str) -> ToolResult:
        text = arguments.strip().replace("×", "*").replace("÷", "/")
        text = THOUSANDS.sub("", text)
        try:
            value, _ = expressions.evaluate(text, expressions.CALCULATOR)
        except (expressions.ExpressionError, ZeroDivisionError) as error:
            return ToolResult(f"error: {error}", ok=False)
        return ToolResult(format_number(value), ok=True)
