"""pgjax.tasks.math_answers.parse_number: which texts are one number and their exact values, pinned case by
case (every grade of the math tasks rests on them), and hostile texts that must be refused at once."""
import random
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


ZEROS = (ord("0"), 0x660, 0xFF10, 0x1D7CE)       # the digit 0 of ASCII, Arabic-Indic, fullwidth, bold maths


def random_number(rng: random.Random) -> tuple[str, Fraction | None]:
    """A random number text of one of ``parse_number``'s shapes and the value it is written with (None for a
    zero denominator), computed from its parts; its digits of one random script."""
    def decimal() -> tuple[str, Fraction]:
        whole, places = rng.randrange(10 ** rng.randint(0, 6)), rng.randint(0, 4)
        part = rng.randrange(10 ** places) if places else 0
        text = f"{whole}.{part:0{places}d}" if places else str(whole)
        return text, whole + Fraction(part, 10 ** places)
    sign = rng.choice(["", "-", "+"])
    shape = rng.choice(["plain", "leading point", "trailing point", "ratio", "frac"])
    if shape == "plain":
        text, value = decimal()
    elif shape == "leading point":
        part = rng.randrange(1, 10 ** 4)
        text, value = f".{part:04d}", Fraction(part, 10 ** 4)
    elif shape == "trailing point":
        whole = rng.randrange(10 ** 5)
        text, value = f"{whole}.", Fraction(whole)
    elif shape == "ratio":
        a, b = rng.randrange(10 ** 4), rng.randrange(10 ** 3)
        text, value = f"{a}/{b}", Fraction(a, b) if b else None
    else:
        (numerator, top), (denominator, bottom), inner = decimal(), decimal(), rng.choice(["", "-", "+"])
        text, value = f"\\frac{{{inner}{numerator}}}{{{denominator}}}", (top / bottom if bottom else None)
        value = -value if value is not None and inner == "-" else value
    value = -value if value is not None and sign == "-" else value
    zero = rng.choice(ZEROS)
    return sign + "".join(chr(zero + int(c)) if c.isdigit() else c for c in text), value


def test_random_numbers_of_every_shape_have_the_values_they_are_written_with():
    rng = random.Random(0)
    for _ in range(3000):
        text, value = random_number(rng)
        assert parse_number(text) == value, text


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
