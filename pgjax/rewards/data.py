"""A user's JSONL dataset: records loaded by field name and checked, and a math task over them.

One JSON object per line (blank lines skipped, a UTF-8 BOM allowed). ``load_jsonl``
returns dicts with ``prompt`` (from ``prompt_field``), ``answer`` (from
``answer_field``) and any ``extra_fields`` under their own names. A missing file
is FileNotFoundError. Every record is checked as it is read; a bad one is a
ValueError ``"{path}:{line}: {reason}"`` naming the field at fault:

- the line is valid JSON (the column of an error is counted within the line),
  an object, and holds no ``NaN`` / ``Infinity`` / ``-Infinity``;
- it has every field asked for;
- the prompt is a string that is not blank;
- the answer (after ``answer_transform``, if any; None from the transform is an
  error) is a finite number, kept as JSON gives it, or a string from which the
  verifier gets a final answer: ``normalize_answer(reference_answer(answer))``
  is not empty (so ``""``, ``"#### "``, ``"\\boxed{}"`` cannot be scored).

``JsonlMathTask.fit_prompts(tokenizer, max_tokens)`` then requires every
prompt to have 1..``max_tokens`` tokens. With ``skip_invalid=True`` bad
records are left out instead and listed (``JsonlMathTask.skipped``,
``JsonlMathTask.summary()``). A file without a valid record is always a
ValueError.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pgjax.rewards.math_answers import math_reward, normalize_answer, reference_answer


class _Invalid(Exception):
    """A record's problem (the message, without file and line)."""


class _Constant:
    """What ``json.loads`` gives for ``NaN``, ``Infinity`` or ``-Infinity`` here, so they can be reported."""

    def __init__(self, name: str):
        self.name = name


def _constant_in(value) -> str | None:
    """The first non-standard constant anywhere in a parsed JSON value, or None."""
    if isinstance(value, _Constant):
        return value.name
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((name for name in map(_constant_in, items) if name), None)


def _parse(line: str) -> dict[str, Any]:
    """The JSON object of one line (without its newline); _Invalid if it is not one."""
    try:
        record = json.loads(line, parse_constant=_Constant)
    except json.JSONDecodeError as err:  # pos, not colno: colno restarts after a newline in the text
        raise _Invalid(f"invalid JSON ({err.msg} at column {err.pos + 1})") from None
    pairs = record.items() if isinstance(record, dict) else [(None, record)]
    for key, value in pairs:
        name = _constant_in(value)
        if name:
            where = "" if key is None else f"field {key!r}: "
            raise _Invalid(f"{where}the non-standard JSON constant {name} is not allowed")
    if not isinstance(record, dict):
        raise _Invalid(f"expected a JSON object, got {type(record).__name__}")
    return record


def _check_prompt(prompt, field: str) -> str:
    """``prompt`` if it is a string that is not blank."""
    if not isinstance(prompt, str):
        raise _Invalid(f"field {field!r}: the prompt must be a string, got {type(prompt).__name__}")
    if not prompt.strip():
        raise _Invalid(f"field {field!r}: the prompt is empty")
    return prompt


def _check_answer(answer, field: str, raw) -> str | int | float:
    """``answer`` if the verifier can score it; ``raw`` is the field's value before any transform."""
    if answer is None:
        if raw is None:
            raise _Invalid(f"field {field!r}: the answer is null")
        raise _Invalid(f"no answer could be extracted from field {field!r}: {raw!r:.80}")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise _Invalid(f"field {field!r}: the answer must be a string or a number, got {type(answer).__name__}")
    if isinstance(answer, float) and not math.isfinite(answer):
        raise _Invalid(f"field {field!r}: the answer {answer} is not a finite number")
    if isinstance(answer, str) and not normalize_answer(reference_answer(answer)):
        raise _Invalid(f"field {field!r}: the answer cannot be scored (no final answer in {answer!r:.80})")
    return answer


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its newline) of each non-blank line."""
    with open(path, encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield lineno, line


def _listing(skipped: Sequence[tuple[int, str]], limit: int = 2) -> str:
    """``"line 4: reason; line 9: reason; and 3 more"``."""
    shown = [f"line {lineno}: {reason}" for lineno, reason in skipped[:limit]]
    if len(skipped) > limit:
        shown.append(f"and {len(skipped) - limit} more")
    return "; ".join(shown)


@dataclasses.dataclass
class _Dataset:
    """A file's valid records, the line of each, and the (line, reason) of each record left out."""
    path: str
    records: list[dict[str, Any]]
    lines: list[int]
    skipped: list[tuple[int, str]]

    def reject(self, lineno: int, reason: str, skip: bool) -> None:
        """Note a bad record: ValueError ``"{path}:{line}: {reason}"``, or with ``skip`` only listed."""
        if not skip:
            raise ValueError(f"{self.path}:{lineno}: {reason}")
        self.skipped.append((lineno, reason))

    def require_records(self, what: str = "valid records") -> None:
        """ValueError if no record is left, listing the first records left out."""
        if not self.records:
            if not self.skipped:
                raise ValueError(f"dataset file {self.path!r} holds no records")
            raise ValueError(f"dataset file {self.path!r} holds no {what}: {len(self.skipped)} skipped "
                             f"({_listing(self.skipped)})")


def _load(path: str | os.PathLike, prompt_field: str, answer_field: str, extra_fields: Sequence[str],
          answer_transform: Callable[[Any], Any] | None, skip_invalid: bool) -> _Dataset:
    """The checked records of a file with their lines (``load_jsonl``'s rules)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file not found: {path!r}")
    if isinstance(extra_fields, str):
        extra_fields = (extra_fields,)
    fields = (prompt_field, answer_field, *extra_fields)
    data = _Dataset(path, [], [], [])
    for lineno, line in _lines(path):
        try:
            record = _parse(line)
            missing = [k for k in fields if k not in record]
            if missing:
                raise _Invalid(f"record lacks field(s) {missing}; fields present: {sorted(record)}")
            prompt = _check_prompt(record[prompt_field], prompt_field)
            raw = record[answer_field]
            answer = _check_answer(raw if answer_transform is None else answer_transform(raw), answer_field, raw)
        except _Invalid as err:
            data.reject(lineno, str(err), skip_invalid)
            continue
        data.records.append({"prompt": prompt, "answer": answer, **{k: record[k] for k in extra_fields}})
        data.lines.append(lineno)
    data.require_records()
    return data


def load_jsonl(path: str | os.PathLike, prompt_field: str = "question", answer_field: str = "answer",
               extra_fields: Sequence[str] = (), answer_transform: Callable[[Any], Any] | None = None,
               skip_invalid: bool = False) -> list[dict[str, Any]]:
    """Valid records of a JSONL file as ``{"prompt", "answer", *extra_fields}`` dicts, in file order.

    ``answer_transform`` (e.g. ``extract_answer``, to keep only the final
    answer of a GSM8K solution ``"... #### 72"``) is applied to each answer
    before it is checked. Answers are kept as JSON gives them otherwise
    (``72`` stays an int; ``math_reward`` compares ``str(answer)``). A bad
    record is a ValueError ``"{path}:{line}: ..."`` (the rules are in the
    module docstring), or with ``skip_invalid`` left out (``JsonlMathTask``
    lists what was left out).
    """
    return _load(path, prompt_field, answer_field, extra_fields, answer_transform, skip_invalid).records


@dataclasses.dataclass(frozen=True)
class JsonlMathTask:
    """A user's math dataset (GSM8K / MATH style) scored by ``math_reward``.

    The file is read and checked (``load_jsonl``) on first use.
    ``examples(n, seed)`` draws ``n`` records in a random order fixed by
    ``seed`` (cycling through fresh permutations when ``n`` exceeds the file);
    ``n=None`` gives every record in file order. The reference ``answer`` may
    be a full solution (it serves as the demonstration; ``math_reward``
    compares its final ``\\boxed{}`` / ``####`` answer). ``tokenizer()`` is
    None: use the model's own tokenizer. With ``skip_invalid`` bad records
    (and prompts ``fit_prompts`` rejects) are left out: ``skipped`` lists
    them, ``summary()`` says so in one line.
    """

    path: str
    prompt_field: str = "question"
    answer_field: str = "answer"
    extra_fields: tuple[str, ...] = ()
    skip_invalid: bool = False
    name: str = dataclasses.field(default="jsonl_math", init=False)
    format_pattern: str = dataclasses.field(default=r"(?s).*\\boxed\{.+\}.*", init=False)

    @functools.cached_property
    def _data(self) -> _Dataset:
        return _load(self.path, self.prompt_field, self.answer_field, tuple(self.extra_fields), None,
                     self.skip_invalid)

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records kept, in file order."""
        return self._data.records

    @property
    def skipped(self) -> list[str]:
        """``"{path}:{line}: {reason}"`` for each record left out, in line order."""
        return [f"{self.path}:{lineno}: {reason}" for lineno, reason in self._data.skipped]

    def summary(self) -> str | None:
        """One line for the log, ``"data.jsonl: 97 records, 3 skipped (line 4: ...; ...; and 1 more)"``;
        None when nothing was skipped."""
        data = self._data
        if not data.skipped:
            return None
        return f"{self.path}: {len(data.records)} records, {len(data.skipped)} skipped ({_listing(data.skipped)})"

    def fit_prompts(self, tokenizer, max_tokens: int, render=None) -> None:
        """Check that every prompt, as ``render`` turns the list of prompts into the model's input texts
        (default: unchanged; a chat template), has 1..``max_tokens`` tokens (``tokenizer(texts,
        add_special_tokens=False)["input_ids"]``): ValueError naming the file, line, field, token
        count and limit for the first that does not, or with ``skip_invalid`` leave those out
        (ValueError if none is left). ``examples`` then draws from the records kept."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        data = self._data
        prompts = [r["prompt"] for r in data.records]
        ids = tokenizer(prompts if render is None else render(prompts), add_special_tokens=False)["input_ids"]
        keep = []
        for i, (lineno, tokens) in enumerate(zip(data.lines, ids)):
            if 1 <= len(tokens) <= max_tokens:
                keep.append(i)
            else:
                data.reject(lineno, f"field {self.prompt_field!r}: the prompt has {len(tokens)} tokens; "
                                    f"rollout.max_prompt_tokens={max_tokens}", self.skip_invalid)
        data.records[:] = [data.records[i] for i in keep]
        data.lines[:] = [data.lines[i] for i in keep]
        data.skipped.sort()
        data.require_records(f"prompt of 1..{max_tokens} tokens")

    @property
    def reward_fn(self):
        return math_reward

    def tokenizer(self):
        return None

    def examples(self, n: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
        records = self.records
        if n is None:
            return [dict(r) for r in records]
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = np.random.default_rng(seed)
        order = np.concatenate([rng.permutation(len(records)) for _ in range(max(1, -(-n // len(records))))])[:n]
        return [dict(records[i]) for i in order.tolist()]
