"""pgjax.tasks.math_answers.parse_number: which texts are one number and their exact values, pinned case by
case (every grade of the math tasks rests on them), and hostile texts that must be refused at once."""
import time
from fractions import Fraction

import pytest

from pgjax.tasks.math_answers import MAX_NUMBER_CHARS, answers_equal, parse_number

F = Fraction


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("-0", 0), ("+5", 5), ("1000", 1000), ("5.", 5), (".5", F(1, 2)), ("-.5", F(-1, 2)),
    ("+.5", F(1, 2)), ("-5.", -5), ("3/4", F(3, 4)), ("-3/4", F(-3, 4)), ("+3/4", F(3, 4)),
    ("\\frac{1}{2}", F(1, 2)), ("-\\frac{-1}{2}", F(1, 2)), ("+\\frac{1}{2}", F(1, 2)), ("\\frac{+1}{2}", F(1, 2)),
    ("\\frac{1.5}{2.5}", F(3, 5)), ("٣", 3), ("３", 3), ("𝟑", 3), ("٣/٤", F(3, 4)), ("٣.٥", F(7, 2)),
    ("9" * MAX_NUMBER_CHARS, 10 ** MAX_NUMBER_CHARS - 1),
])
def test_a_number_in_any_of_its_shapes_has_its_exact_value(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text", [
    "", ".", "--5", "5..", "1,000", " 5", "5 ", "3/-4", "3/0", "0/0", "3.5/4", "3/4/5", "1/2+1", "(1)", "2^3",
    "\\frac{1}{-2}", "\\frac{1}{0}", "\\frac{1}{0.0}", "\\frac{1.}{2}", "\\frac{.5}{2}", "\\frac {1}{2}",
    "\\frac{ 1}{2}", "\\frac12", "1e5", "inf", "nan", "1_000", "0x10", "²", "½", "9" * (MAX_NUMBER_CHARS + 1),
])
def test_a_text_that_is_not_one_number_or_divides_by_zero_is_none(text):
    assert parse_number(text) is None


@pytest.mark.parametrize("text", ["9" * 100_000, "(" * 100_000, "-" * 100_000 + "1", "\\frac{" * 10_000,
                                  "2^" * 50_000 + "2", "1/" * 50_000 + "1", "." * 100_000])
def test_hostile_texts_are_refused_at_once(text):
    start = time.perf_counter()
    assert parse_number(text) is None and answers_equal(text, "1") is False
    assert time.perf_counter() - start < 1.0


def test_numbers_compare_exactly_or_within_one_part_in_a_million():
    assert answers_equal(".5", "\\frac{1}{2}") and answers_equal("٣", "3") and answers_equal("5.", "5")
    assert answers_equal("1000000", "1000000.5") and not answers_equal("1000", "1000.5")
