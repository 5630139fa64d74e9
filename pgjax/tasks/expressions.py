"""Exact arithmetic expressions without ``eval``: one recursive-descent parser, shared by the
Countdown verifier (``pgjax.tasks.countdown``) and the agents' calculator tool
(``pgjax.agents.tools.Calculator``), and the value of a math answer that is one number
(``pgjax.tasks.math_answers.parse_number``).

The grammar, whose optional parts ``Syntax`` switches on::

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '/') unary)*
    unary  := ('+' | '-') unary | power           a leading sign: Syntax.signs
    power  := atom (('^' | '**') unary)?          Syntax.powers; right-associative, so 2^3^2 = 2^9,
                                                  and tighter than a sign on its left: -2^2 = -4
    atom   := NUMBER | '(' expr ')'
    NUMBER := DIGITS ('.' DIGITS)?                the decimal part: Syntax.decimals
            | DIGITS '.' | '.' DIGITS             a point with digits on one side only: Syntax.bare_point

Values are exact ``Fraction`` s, so ``(4-2/3)*3`` is exactly 10. Nothing a text says can make the
evaluation slow or large: a text is at most ``MAX_CHARS`` characters, parentheses nest at most
``MAX_DEPTH`` deep, a number has at most ``Syntax.max_digits`` digits, an exponent is an integer of
size at most ``MAX_EXPONENT``, and a power whose result would need more than ``MAX_BITS`` bits is
refused before it is computed. A text outside the grammar or the limits is an ``ExpressionError``
(a ``ValueError``) that names the position; a division by zero (also ``0^-1``) is a
``ZeroDivisionError``.
"""
from __future__ import annotations

import dataclasses
from fractions import Fraction

MAX_CHARS = 256
MAX_DEPTH = 32
MAX_EXPONENT = 1024
MAX_BITS = 4096          # about 1233 decimal digits


class ExpressionError(ValueError):
    """A text that is not an expression of the grammar, or exceeds its limits."""


@dataclasses.dataclass(frozen=True)
class Syntax:
    """The grammar's optional parts (module docstring) and the longest number, in digits.

    ``bare_point`` (with ``decimals``) also reads ``5.`` and ``.5``, as final answers are written
    (``math_answers.parse_number`` grades them as numbers). The calculator and the step checks refuse
    them: what they answer and label is part of the training records, which stay as they are."""

    signs: bool = False
    decimals: bool = False
    powers: bool = False
    bare_point: bool = False
    max_digits: int = 12


COUNTDOWN = Syntax()
CALCULATOR = Syntax(signs=True, decimals=True, powers=True, max_digits=30)


class _Parser:
    """One pass over ``text``: each method parses its grammar rule at ``pos`` and returns the value."""

    def __init__(self, text: str, syntax: Syntax):
        self.text, self.syntax, self.pos, self.depth = text, syntax, 0, 0
        self.numbers: list[Fraction] = []

    def peek(self, width: int = 1) -> str:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        return self.text[self.pos:self.pos + width]

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/") and not (self.syntax.powers and self.peek(2) == "**"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self.unary()
            if op == "/" and rhs == 0:
                raise ZeroDivisionError("division by zero")
            value = value * rhs if op == "*" else value / rhs
        return value

    def unary(self) -> Fraction:
        if self.syntax.signs and self.peek() in ("+", "-"):
            sign = self.text[self.pos]
            self.pos += 1
            self._nest()
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.atom()
        if not self.syntax.powers or not (self.peek() == "^" or self.peek(2) == "**"):
            return base
        at = self.pos
        self.pos += 1 if self.text[self.pos] == "^" else 2
        self._nest()
        exponent = self.unary()
        self.depth -= 1
        return _power(base, exponent, at)

    def atom(self) -> Fraction:
        if self.peek() == "(":
            self._nest()
            self.pos += 1
            value = self.expr()
            if self.peek() != ")":
                raise ExpressionError(f"expected ')' at position {self.pos}")
            self.pos += 1
            self.depth -= 1
            return value
        return self.number()

    def number(self) -> Fraction:
        start = self.pos
        digits = self._digits()
        value = Fraction(int(digits or "0"))
        if self.syntax.decimals and self.text[self.pos:self.pos + 1] == "." and (digits or self.syntax.bare_point):
            self.pos += 1
            decimals = self._digits()
            if not decimals and not (digits and self.syntax.bare_point):
                raise ExpressionError(f"expected digits after the '.' at position {self.pos - 1}")
            digits += decimals
            value += Fraction(int(decimals or "0"), 10 ** len(decimals))
        if not digits:
            raise ExpressionError(f"expected a number or '(' at position {start}")
        if len(digits) > self.syntax.max_digits:
            raise ExpressionError(f"the number at position {start} has more than {self.syntax.max_digits} digits")
        self.numbers.append(value)
        return value

    def _digits(self) -> str:
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        return self.text[start:self.pos]

    def _nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"nested more than {MAX_DEPTH} deep")


def _power(base: Fraction, exponent: Fraction, at: int) -> Fraction:
    """``base ** exponent`` for an integer exponent of size at most MAX_EXPONENT, refused (before it is
    computed) when the result would need more than MAX_BITS bits in its numerator or denominator."""
    if exponent.denominator != 1:
        raise ExpressionError(f"the exponent at position {at} is not an integer")
    if abs(exponent) > MAX_EXPONENT:
        raise ExpressionError(f"the exponent at position {at} is larger than {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise ZeroDivisionError("zero to a negative power")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length()) * abs(int(exponent))
    if bits > MAX_BITS:
        raise ExpressionError(f"the power at position {at} is too large (over {MAX_BITS} bits)")
    return base ** int(exponent)


def evaluate(text: str, syntax: Syntax = COUNTDOWN) -> tuple[Fraction, list[Fraction]]:
    """The exact value of expression ``text`` under ``syntax``, and the numbers it is written with, in
    order. Raises ``ExpressionError`` or ``ZeroDivisionError`` (module docstring)."""
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters")
    parser = _Parser(text, syntax)
    value = parser.expr()
    if parser.peek():
        raise ExpressionError(f"unexpected {parser.peek()!r} at position {parser.pos}")
    return value, parser.numbers
