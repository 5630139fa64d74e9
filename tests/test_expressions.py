"""The shared exact-arithmetic parser (pgjax.tasks.expressions): random expression trees rendered
as text evaluate to the value the tree computes directly (an independent reference: no parsing), every
optional part of the grammar and every limit, and Countdown's restricted grammar."""
from fractions import Fraction

import numpy as np
import pytest

from pgjax.tasks import expressions as E

OPS = ("+", "-", "*", "/", "^")


def random_tree(rng, depth):
    """A random expression tree: a Fraction leaf, ("neg", t) or (op, left, right); powers get small
    integer exponents and nonzero divisors keep every value finite."""
    if depth == 0 or rng.random() < 0.3:
        if rng.random() < 0.3:
            return Fraction(int(rng.integers(0, 1000)), 10 ** int(rng.integers(1, 3)))
        return Fraction(int(rng.integers(0, 50)))
    if rng.random() < 0.15:
        return ("neg", random_tree(rng, depth - 1))
    op = OPS[rng.integers(len(OPS))]
    if op == "^":
        return (op, random_tree(rng, 0), Fraction(int(rng.integers(-3, 4))))
    return (op, random_tree(rng, depth - 1), random_tree(rng, depth - 1))


def value(tree):
    """The tree's value by direct Fraction arithmetic (raises ZeroDivisionError like the parser)."""
    if isinstance(tree, Fraction):
        return tree
    if tree[0] == "neg":
        return -value(tree[1])
    op, a, b = tree[0], value(tree[1]), value(tree[2])
    if op == "^":
        if a == 0 and b < 0:
            raise ZeroDivisionError
        return a ** int(b)
    if op == "/":
        return a / b                                   # Fraction raises ZeroDivisionError for b = 0
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def render(tree, rng):
    """Fully parenthesised text of the tree, with random spaces, ``^`` or ``**``, and decimal leaves."""
    space = lambda: " " * int(rng.integers(0, 2))       # noqa: E731
    if isinstance(tree, Fraction):
        if tree.denominator == 1:
            return str(tree.numerator)
        places = 1 if (tree * 10).denominator == 1 else 2
        return f"{float(tree):.{places}f}"
    if tree[0] == "neg":
        return f"-({render(tree[1], rng)})"
    op = tree[0] if tree[0] != "^" else ("^", "**")[int(rng.integers(2))]
    return f"({render(tree[1], rng)}{space()}{op}{space()}{render(tree[2], rng)})"


def test_random_expressions_evaluate_to_the_trees_values():
    rng = np.random.default_rng(0)
    checked = zero_divisions = 0
    for _ in range(600):
        tree = random_tree(rng, 4)
        text = render(tree, rng)
        if len(text) > E.MAX_CHARS:
            continue
        try:
            expected = value(tree)
        except ZeroDivisionError:
            with pytest.raises(ZeroDivisionError):
                E.evaluate(text, E.CALCULATOR)
            zero_divisions += 1
            continue
        assert E.evaluate(text, E.CALCULATOR)[0] == expected, text
        checked += 1
    assert checked > 400 and zero_divisions > 5


@pytest.mark.parametrize("text, expected", [
    ("1+2*3", 7), ("(1+2)*3", 9), ("2-3-4", -5), ("12/2/3", 2), ("1/3+1/6", Fraction(1, 2)),
    ("-2^2", -4), ("(-2)^2", 4), ("2^3^2", 512), ("2**3**2", 512), ("2^-1", Fraction(1, 2)),
    ("2*-3", -6), ("--3", 3), ("+4", 4), ("1.5*2", 3), ("0.1+0.2", Fraction(3, 10)), ("2 ^ 10", 1024),
    ("-2^-2", Fraction(-1, 4)), ("(1/2)^-3", 8), (" 7 ", 7), ("10^1000", 10 ** 1000),
])
def test_precedence_associativity_signs_decimals_and_powers(text, expected):
    assert E.evaluate(text, E.CALCULATOR)[0] == expected


@pytest.mark.parametrize("text, message", [
    ("1+", "expected a number or '\\(' at position 2"), ("(1+2", "expected '\\)' at position 4"),
    ("1 2", "unexpected '2' at position 2"), ("1.", "expected digits after the '.' at position 1"),
    (".5", "expected a number"), ("2^0.5", "exponent at position 1 is not an integer"),
    ("2^1025", "larger than 1024"), ("9^2000", "larger than 1024"),
    ("1" * 31, "more than 30 digits"), ("(" * 40 + "1" + ")" * 40, "nested more than 32 deep"),
    ("-" * 40 + "1", "nested more than 32 deep"), ("1+" * 130 + "1", "longer than 256 characters"),
    ("2*x", "expected a number"), ("__import__('os')", "expected a number"), ("", "expected a number"),
])
def test_bad_texts_and_limits_are_errors_naming_the_position(text, message):
    with pytest.raises(E.ExpressionError, match=message):
        E.evaluate(text, E.CALCULATOR)


def test_powers_are_refused_before_they_are_computed():
    """2^1024 * ... fits; (2^1024)^1024 would need a million bits and is refused at once."""
    assert E.evaluate("2^1024", E.CALCULATOR)[0] == 2 ** 1024
    with pytest.raises(E.ExpressionError, match="too large"):
        E.evaluate("(2^1000)^1000", E.CALCULATOR)
    with pytest.raises(ZeroDivisionError):
        E.evaluate("0^-1", E.CALCULATOR)
    with pytest.raises(ZeroDivisionError):
        E.evaluate("1/(2-2)", E.CALCULATOR)


@pytest.mark.parametrize("text, value", [(".5", Fraction(1, 2)), ("5.", 5), ("-.25*4.", -1), ("3./.5", 6)])
def test_a_bare_point_is_read_only_where_the_syntax_allows_it(text, value):
    assert E.evaluate(text, E.Syntax(signs=True, decimals=True, bare_point=True))[0] == value
    with pytest.raises(E.ExpressionError, match="expected"):
        E.evaluate(text, E.CALCULATOR)


def test_a_point_alone_is_no_number_even_with_bare_points():
    with pytest.raises(E.ExpressionError, match="expected digits after the '.' at position 2"):
        E.evaluate("1+.", E.Syntax(decimals=True, bare_point=True))


@pytest.mark.parametrize("text", ["-3+4", "1.5*2", "2^3", "2**3"])
def test_countdown_grammar_has_no_signs_decimals_or_powers(text):
    with pytest.raises(E.ExpressionError):
        E.evaluate(text, E.COUNTDOWN)


def test_the_numbers_are_listed_in_order():
    assert E.evaluate("(3+5)*7-2", E.COUNTDOWN) == (Fraction(54), [3, 5, 7, 2])
    assert E.evaluate("-1.5^2", E.CALCULATOR) == (Fraction(-9, 4), [Fraction(3, 2), 2])
