"""The agents' calculator tool (pgjax.agents.tools): its printed numbers against Python's decimal
module rounding the same values to 12 significant digits (an independent reference), its answers on
expressions a model writes, and errors that are observations, never exceptions."""
import decimal
from fractions import Fraction

import numpy as np
import pytest

from pgjax.agents.tools import SIGNIFICANT_DIGITS, Calculator, ToolResult, format_number


def decimal_reference(value: Fraction) -> Fraction:
    """``value`` rounded half-even to 12 significant digits by the decimal module."""
    context = decimal.Context(prec=SIGNIFICANT_DIGITS, rounding=decimal.ROUND_HALF_EVEN)
    return Fraction(context.divide(decimal.Decimal(value.numerator), decimal.Decimal(value.denominator)))


def test_printed_numbers_are_the_decimal_modules_rounding():
    rng = np.random.default_rng(0)
    for _ in range(3000):
        scale = Fraction(10) ** int(rng.integers(-12, 16))
        value = Fraction(int(rng.integers(-10**9, 10**9)), int(rng.integers(1, 10**6))) * scale
        printed = format_number(value)
        assert Fraction(printed) == (value if value.denominator == 1 else decimal_reference(value)), (value, printed)
        assert ("e" in printed) == (value.denominator != 1 and not (Fraction(1, 10**6) <= abs(decimal_reference(value))
                                                                   < 10**12)), printed


@pytest.mark.parametrize("value, printed", [
    (Fraction(1, 8), "0.125"), (Fraction(1, 3), "0.333333333333"), (Fraction(2, 3), "0.666666666667"),
    (Fraction(-1, 7), "-0.142857142857"), (Fraction(3, 2 * 10**20), "1.5e-20"), (Fraction(10**20 * 2 + 1, 2), "1e+20"),
    (Fraction(9999999999997, 10**13), "1"), (Fraction(1, 10**6), "0.000001"), (Fraction(1, 10**7), "1e-07"),
    (Fraction(2**100), str(2**100)), (Fraction(-5), "-5"), (Fraction(0), "0"),
])
def test_printed_by_hand(value, printed):
    assert format_number(value) == printed


@pytest.mark.parametrize("call, answer", [
    ("12*(3+4)/5", "16.8"), ("  347 * 29 ", "10063"), ("1,234 + 1", "1235"), ("6 × 7", "42"), ("84 ÷ 4", "21"),
    ("2^10 - 1", "1023"), ("-3 - -4", "1"), ("1/3", "0.333333333333"), ("1,234,567*2", "2469134"),
    ("98765 * 4321", str(98765 * 4321)),
])
def test_answers(call, answer):
    assert Calculator()(call) == ToolResult(answer, ok=True)


@pytest.mark.parametrize("call, error", [
    ("1/0", "error: division by zero"), ("1,2", "error: unexpected ','"), ("2*x", "error: expected a number"),
    ("import os", "error: expected a number"), ("", "error: expected a number"), ("9^9^9", "error: the exponent"),
    ("(" * 50 + "1" + ")" * 50, "error: nested more than 32 deep"),
])
def test_bad_calls_are_observations_not_exceptions(call, error):
    result = Calculator()(call)
    assert not result.ok and result.text.startswith(error)
