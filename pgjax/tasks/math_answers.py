"""Final answers of math problems (GSM8K / MATH style): extraction and equivalence.

``extract_answer``, the answer extractor of both math tasks (``jsonl_math``'s
``math_reward`` and ``word_math``), takes the content of the last non-blank ``\\boxed{...}`` of a
completion, else the text after GSM8K's ``####``, else the last number (a
fraction is one number); ``answer_from="boxed"`` reads boxes only and
``number_only=True`` reduces the answer to its one number.

``answers_equal`` normalises both answers (``normalize_answer``) and compares
them as strings, then as exact numbers (with a 1e-6 relative tolerance), then
symbolically with sympy after a small LaTeX-to-sympy rewrite of our own
(``\\frac``, ``\\sqrt``, ``^``, ``\\cdot``, ``\\times``, ``\\pi``, ...; no
``sympy.parsing.latex``): equal when their difference is 0, or, with
symbols, when they agree at 5 fixed random points (a probabilistic identity
test; ``sympy.simplify`` can hang). Implicit multiplication is understood
(``2\\sqrt{2}`` equals ``\\sqrt{8}``, ``2x`` is ``2*x``, ``xy`` is ``x*y``).

Percent rule: the percent sign is dropped, so ``50\\%`` equals ``50`` (as
GSM8K / MATH graders do) and does not equal ``0.5``. A trailing unit in
``\\text{...}`` (``5\\text{ cm}``) and a degree sign are dropped as well.

Safety: sympy only ever sees text of at most 200 characters made of digits,
letters (split into one-letter symbols unless a whitelisted function name),
``+ - * / ( ) .`` and spaces, and powers are checked before evaluation
(numeric exponents at most 100 in size, nested numeric powers at most 10^4
in all), so no input can run code or hang the comparison. Any failure means
"not equal".
"""
from __future__ import annotations

import math
import random
import re
import string
import unicodedata
import warnings
from fractions import Fraction

from pgjax.tasks import expressions
from pgjax.tasks.base import per_example

MAX_CHARS = 200  # longer answers are compared as strings only
REL_TOL = Fraction(1, 10**6)

ANSWER_FROM = ("boxed_or_last_number", "boxed")  # where ``extract_answer`` reads an answer
# A plain number: 71, 1,104 (thousands commas), 2.5. Also the number of word_math's format rule.
NUMBER_BODY = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?"
# One number: an optional "-" (a sign unless after a letter, digit or ")": "5-3" holds 5 and 3), then
# \frac{a}{b} (\dfrac, \tfrac), a/b, a plain number or .5; a fraction is one number, not two.
_NUMBER = re.compile(r"(?:(?<![\w)])-)?(?:\\[dt]?frac\{\s*-?\d+(?:\.\d+)?\s*\}\{\s*\d+(?:\.\d+)?\s*\}"
                     r"|\d+/\d+(?!\.\d)|" + NUMBER_BODY + r"|(?<!\w)\.\d+)")
_BOX = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")
_UNCLOSED = object()  # a box whose braces never close


def _braced(text: str, i: int) -> tuple[str, int] | None:
    """Content of the brace group opening at ``text[i] == '{'`` and the index after it; None if unbalanced."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j], j + 1
    return None


def _boxes(text: str) -> list:
    """The content of every box of ``text`` in order of its opening (``_UNCLOSED`` for a box whose braces
    never close, or a ``\\boxed`` ending the text): ``\\boxed{...}`` / ``\\fbox{...}`` with nested braces
    kept, or the bare token of ``\\boxed 5`` (up to whitespace or ``$``, without trailing ``.,;:!?``)."""
    boxes = []
    for match in _BOX.finditer(text):
        i = match.end()
        if text[i:i + 1] == "{":
            group = _braced(text, i)
            boxes.append(_UNCLOSED if group is None else group[0])
        elif i < len(text):
            bare = re.match(r"[^\s${}]*", text[i:])     # always matches, at worst the empty string
            boxes.append(bare.group().rstrip(".,;:!?") if bare else "")
        else:
            boxes.append(_UNCLOSED)
    return boxes


def _only_number(text: str) -> str | None:
    """The one number of ``text`` (``_NUMBER``), whatever surrounds it; None for none or several."""
    numbers = _NUMBER.findall(text)
    return numbers[0] if len(numbers) == 1 else None


def extract_answer(text: str, *, answer_from: str = "boxed_or_last_number", number_only: bool = False
                   ) -> str | None:
    """The final answer of a solution text, or None: the extractor of both math tasks (``math_reward``
    and ``reference_answer`` with the defaults; ``word_math`` with ``number_only=True`` and its
    ``answer_from``).

    Rule:
      1. Boxes: ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces handled) and ``\\boxed 5`` (one bare
         token). Blank boxes (``\\boxed{}``, ``\\boxed{ }``) are passed over. If a box is left, the last
         opened one decides: its content; None if its braces never close (a response cut off inside
         its final answer has none; an earlier box does not stand in for it).
      2. No box: with ``answer_from="boxed_or_last_number"`` the rest of the line after the last
         GSM8K ``####`` if there is one, else the last number of the text; with ``"boxed"`` None.

    Numbers (one syntax for every task): ``-`` is a sign unless it follows a letter, digit or ``)``
    (``-23``; ``5-3`` holds 5 and 3); thousands commas (``1,104``); decimals (``2.5``, ``.5``); a
    fraction ``3/4`` or ``\\frac{3}{4}`` (``\\dfrac``, ``\\tfrac``) is one number, so the last number of
    ``"... = \\frac{3}{4}"`` is 3/4, not 4.

    ``number_only=False``: the answer as written (an expression for ``answers_equal``).
    ``number_only=True``: the answer's only number, whatever text surrounds it (``x = 71``,
    ``71 apples``, ``\\$71``); None when it holds no number or several (``23 + 48``).

    These settle where the two former extractors (``math_answers`` and ``word_math``) disagreed: an
    empty box is passed over (the task's own instruction says ``\\boxed{}``; before, math read no
    answer); ``\\boxed 5`` is a box for both (word_math read it only as a last number); fractions are
    numbers for both (word_math read ``\\boxed{3/4}`` as two numbers); a cut-off last box is no answer
    for both (word_math passed over it to an earlier box or the last number).
    """
    if answer_from not in ANSWER_FROM:
        raise ValueError(f"answer_from must be one of {ANSWER_FROM}, got {answer_from!r}")
    text = str(text)
    boxes = [b for b in _boxes(text) if b is _UNCLOSED or b.strip()]
    if boxes:
        if boxes[-1] is _UNCLOSED:
            return None
        answer = boxes[-1].strip()
    elif answer_from == "boxed":
        return None
    elif "####" in text:
        lines = text.rsplit("####", 1)[1].strip().splitlines()
        answer = lines[0].strip() if lines else ""
    else:
        numbers = _NUMBER.findall(text)
        answer = numbers[-1] if numbers else ""
    if number_only:
        return _only_number(answer)
    return answer or None


def reference_answer(answer) -> str:
    """A dataset's reference answer: ``extract_answer`` of it if it holds ``\\boxed`` or ``####``
    (a MATH / GSM8K solution text), else the answer itself as a string."""
    text = str(answer)
    if "\\boxed" in text or "\\fbox" in text or "####" in text:
        return extract_answer(text) or ""
    return text.strip()


_UNIT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{[^{}]*\}(?:\^\{?\d+\}?)?\s*$")
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\s*\{([^{}]*)\}")


def normalize_answer(answer) -> str:
    """A canonical string for an answer.

    Drops ``$``, LaTeX spacing (``\\! \\, \\; \\:``), ``\\left`` / ``\\right``,
    ``\\displaystyle``, degree signs, percent signs (``\\%`` and ``%``), a
    trailing ``\\text{unit}`` after a value, a leading ``x =``, thousands
    separators (``1,000`` -> ``1000``), spaces (except between letters) and a
    trailing period; ``\\dfrac`` / ``\\tfrac`` become ``\\frac`` and
    ``\\text{X}`` becomes ``X``.
    """
    s = str(answer).strip().replace("$", "")
    for old, new in (("\\!", ""), ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "), ("~", " "),
                     ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\displaystyle", ""), ("\\%", ""),
                     ("%", ""), ("°", "")):
        s = s.replace(old, new)
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)
    unit = _UNIT.search(s)
    if unit and s[:unit.start()].strip():
        s = s[:unit.start()]
    s = _TEXT.sub(lambda m: m.group(1), s).strip()
    if s.count("=") == 1:
        s = re.sub(r"^[A-Za-z]\s*=\s*(?=\S)", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)
    s = re.sub(r"(?<![A-Za-z])\s+|\s+(?![A-Za-z])", "", s)
    return s.rstrip(".").strip()


_PLAIN = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_RATIO = re.compile(r"[-+]?\d+/\d+")
_FRAC = re.compile(r"([-+]?)\\frac\{([-+]?\d+(?:\.\d+)?)\}\{(\d+(?:\.\d+)?)\}")
MAX_NUMBER_CHARS = 64  # a longer answer is no number
_NUMBER_SYNTAX = expressions.Syntax(signs=True, decimals=True, bare_point=True, max_digits=MAX_NUMBER_CHARS)


def _ascii_digits(s: str) -> str:
    """``s`` with the decimal digits of every script (what ``\\d`` matches: ``٣``, ``３``) as ASCII digits."""
    return "".join(str(unicodedata.decimal(c)) if c.isdecimal() else c for c in s)


def parse_number(s: str) -> Fraction | None:
    """An exact number from a normalised answer, or None: a text of at most ``MAX_NUMBER_CHARS``
    characters with one of the shapes ``-2``, ``0.5``, ``.5``, ``5.``, ``3/4`` (integers) or
    ``\\frac{-1.5}{2}`` (no spaces; digits of any script), valued by ``pgjax.tasks.expressions``; a zero
    denominator is None."""
    if len(s) > MAX_NUMBER_CHARS:
        return None
    frac = _FRAC.fullmatch(s)
    if frac:
        sign, numerator, denominator = frac.groups()
        s = f"{sign}({numerator})/({denominator})"
    elif not (_PLAIN.fullmatch(s) or _RATIO.fullmatch(s)):
        return None
    try:
        return expressions.evaluate(_ascii_digits(s), _NUMBER_SYNTAX)[0]
    except ZeroDivisionError:
        return None


def numbers_close(a: Fraction, b: Fraction) -> bool:
    """Exactly equal, or within a relative tolerance of 1e-6."""
    return a == b or abs(a - b) <= REL_TOL * max(abs(a), abs(b))


# --- symbolic comparison -------------------------------------------------------------------------

_FUNCTIONS = ("sqrt", "log", "sin", "cos", "tan", "pi", "oo")
_COMMANDS = {"cdot": "*", "times": "*", "div": "/", "pi": " pi ", "infty": " oo ", "ln": " log ",
             "log": " log ", "sin": " sin ", "cos": " cos ", "tan": " tan "}


def _command(s: str, i: int) -> tuple[str, int]:
    """The name of the LaTeX command starting at ``s[i] == '\\'`` and the index after it."""
    j = i + 1
    while j < len(s) and s[j].isalpha():
        j += 1
    if j == i + 1:
        raise ValueError(f"bad LaTeX command at {i}")
    return s[i + 1:j], j


def _argument(s: str, i: int) -> tuple[str, int]:
    """One LaTeX argument at ``s[i]``: a brace group, a command, or a single character."""
    while i < len(s) and s[i].isspace():
        i += 1
    if i >= len(s):
        raise ValueError("missing argument")
    if s[i] == "{":
        group = _braced(s, i)
        if group is None:
            raise ValueError("unbalanced braces")
        return group
    if s[i] == "\\":
        name, j = _command(s, i)
        return "\\" + name, j
    return s[i], i + 1


def latex_to_python(s: str) -> str:
    """Rewrite a (normalised) LaTeX answer as a sympy-parsable expression; ValueError if it cannot.

    ``\\frac{a}{b}`` -> ``((a)/(b))``, ``\\sqrt{x}`` -> ``sqrt(x)``, ``\\sqrt[n]{x}`` ->
    ``((x)**(1/(n)))``, ``^`` -> ``**``, braces -> parentheses, ``\\cdot`` / ``\\times`` -> ``*``,
    ``\\pi`` -> ``pi``, ``\\infty`` -> ``oo``; other commands are errors.
    """
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            name, i = _command(s, i)
            if name == "frac":
                num, i = _argument(s, i)
                den, i = _argument(s, i)
                out.append(f"(({latex_to_python(num)})/({latex_to_python(den)}))")
            elif name == "sqrt":
                root = None
                if s[i:i + 1] == "[":
                    close = s.find("]", i)
                    if close < 0:
                        raise ValueError("unclosed \\sqrt[")
                    root, i = s[i + 1:close], close + 1
                arg, i = _argument(s, i)
                out.append(f" sqrt({latex_to_python(arg)})" if root is None
                           else f"(({latex_to_python(arg)})**(1/({latex_to_python(root)})))")
            elif name in _COMMANDS:
                out.append(_COMMANDS[name])
            else:
                raise ValueError(f"unsupported LaTeX command \\{name}")
            continue
        out.append({"^": "**", "{": "(", "}": ")"}.get(c, c))
        i += 1
    return "".join(out)


def _names(t: str) -> str:
    """Keep whitelisted function names; split any other run of letters into one-letter symbols."""
    def split(m: re.Match) -> str:
        word = m.group()
        return f" {word} " if word in _FUNCTIONS else " " + " ".join(word) + " "
    return re.sub(r"[A-Za-z]+", split, t)


def _abs(x: Fraction | float) -> Fraction | float:
    """``abs(x)``, typed as x is (mypy joins ``abs`` of the union to object)."""
    return abs(x) if isinstance(x, Fraction) else abs(x)


def _constant(e) -> Fraction | float:
    """The value of a small constant exponent; ValueError for anything larger or more complex."""
    import sympy

    value: Fraction | float
    if e.is_Rational:
        value = Fraction(int(e.p), int(e.q))
    elif e.is_Float or isinstance(e, sympy.NumberSymbol):
        value = float(e)
    elif e.is_Add or e.is_Mul:
        parts = [_constant(a) for a in e.args]
        value = parts[0]
        for p in parts[1:]:
            value = value + p if e.is_Add else value * p
    elif e.is_Pow and e.exp.is_Integer and abs(int(e.exp)) <= 4:
        base = _constant(e.base)
        if base == 0 and int(e.exp) < 0:
            raise ValueError("division by zero in an exponent")
        value = base ** int(e.exp)
    else:
        raise ValueError("exponent too complex")
    if _abs(value) > 10**6:
        raise ValueError("exponent too large")
    return value


def _check_powers(e, scale: float = 1.0) -> None:
    """Refuse numeric exponents above 100 and nested numeric powers whose exponents multiply past 10^4."""
    if e.is_Pow and not e.exp.free_symbols:
        size = _abs(_constant(e.exp))
        if size > 100 or scale * max(size, 1) > 10**4:
            raise ValueError("power too large")
        _check_powers(e.base, scale * max(float(size), 1.0))
        _check_powers(e.exp)
        return
    for arg in e.args:
        _check_powers(arg, scale)


def to_sympy(s: str):
    """A sympy expression for a normalised answer; ValueError (or a sympy error) if it is not one."""
    import sympy
    from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

    if len(s) > MAX_CHARS:
        raise ValueError("answer too long")
    t = _names(latex_to_python(s))
    if not re.fullmatch(r"[0-9A-Za-z+\-*/(). ]*", t) or re.search(r"\.(?![0-9])|[A-Za-z)]\s*\.", t):
        raise ValueError(f"not an expression: {s!r}")
    names = {c: sympy.Symbol(c) for c in string.ascii_letters}
    names.update(sqrt=sympy.sqrt, log=sympy.log, sin=sympy.sin, cos=sympy.cos, tan=sympy.tan,
                 pi=sympy.pi, oo=sympy.oo)
    transformations = standard_transformations + (implicit_multiplication_application,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _check_powers(parse_expr(t, local_dict=dict(names), transformations=transformations, evaluate=False))
        expr = parse_expr(t, local_dict=dict(names), transformations=transformations)
    if not isinstance(expr, sympy.Expr):
        raise ValueError(f"not an expression: {s!r}")
    return expr


def _close(x, y) -> bool:
    """Two finite sympy numbers within a relative tolerance of 1e-6."""
    x, y = complex(x), complex(y)
    return all(map(math.isfinite, (x.real, x.imag, y.real, y.imag))) and abs(x - y) <= 1e-6 * max(abs(x), abs(y))


def _sympy_equal(a: str, b: str) -> bool:
    """Symbolic equivalence: a zero difference, else agreement in value (1e-6 relative).

    Expressions with symbols are compared at 5 fixed pseudo-random points in
    (0.5, 1.5) (``sympy.simplify`` can run for minutes on short inputs such as
    ``(a+b+c+d)^{100}``); a constant difference left after the symbols cancel
    must be 0 to within 1e-12.
    """
    import sympy

    ea, eb = to_sympy(a), to_sympy(b)
    diff = ea - eb
    if diff == 0:
        return True
    symbols = sorted(ea.free_symbols | eb.free_symbols, key=str)
    if not symbols:
        return _close(sympy.N(ea, 30), sympy.N(eb, 30))
    if not diff.free_symbols:  # the symbols cancelled: a constant difference
        d = complex(sympy.N(diff, 30))
        return math.isfinite(abs(d)) and abs(d) < 1e-12
    rng = random.Random(0)
    for _ in range(5):
        point = {x: sympy.Rational(rng.randint(501, 1499), 1000) for x in symbols}
        if not _close(ea.evalf(30, subs=point), eb.evalf(30, subs=point)):
            return False
    return True


def answers_equal(a, b) -> bool:
    """Whether two final answers are equivalent; never raises (malformed or None -> False).

    Normalised strings equal (``normalize_answer``), else both exact numbers
    within 1e-6 relative (``0.5``, ``1/2``, ``\\frac{1}{2}``, ``1,000``), else
    sympy finds them equal (``\\sqrt{8}`` and ``2\\sqrt{2}``, ``x+1`` and ``1+x``).
    """
    if a is None or b is None:
        return False
    try:
        na, nb = normalize_answer(a), normalize_answer(b)
        if not na or not nb:
            return False
        if na == nb:
            return True
        fa, fb = parse_number(na), parse_number(nb)
        if fa is not None and fb is not None:
            return numbers_close(fa, fb)
        return _sympy_equal(na, nb)
    except Exception:  # unparsable, or a sympy failure: not equal
        return False


@per_example
def math_reward(prompt: str, completion: str, *, answer, **_) -> float:
    """Row rule: 1.0 if ``extract_answer(completion)`` equals ``reference_answer(answer)`` (field
    ``answer``: a final answer, or a GSM8K / MATH solution text) by ``answers_equal``, else 0.0
    (no answer found -> 0.0)."""
    return float(answers_equal(extract_answer(completion), reference_answer(answer)))
