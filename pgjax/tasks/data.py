"""A user's dataset: records loaded by field name and checked, and a math task over them.

The file's format (``file_format``; ``auto``: by its suffix, ``.parquet``, ``.arrow`` or
``.csv``, any other JSON Lines):

- ``jsonl``: one JSON object per line (blank lines skipped, a UTF-8 BOM allowed), read here; a
  record's place in messages is its line;
- ``parquet``, ``arrow`` (Arrow IPC, as ``datasets`` saves it), ``csv`` (a header row, then one
  row per record) and ``json`` (JSON Lines or one JSON array): read by the Hugging Face
  ``datasets`` package (the ``data`` extra; ``reader_format`` names it when it is missing), from
  the local file only, streamed (nothing is fetched, cached or copied); a record's place is its
  1-based row (a CSV's header is not a row).

``load_jsonl`` returns dicts with ``prompt`` (from ``prompt_field``), ``answer`` (from
``answer_field``) and any ``extra_fields`` under their own names. The prompt field holds a
string, or a conversation: a list of ``{"role", "content"}`` chat messages, which becomes a
``Conversation`` (rendered by the model's chat template; as a string, its last user turn). A
missing file is FileNotFoundError. Every record is checked as it is read; a bad one is a
ValueError ``"{path}:{place}: {reason}"`` naming the field at fault:

- a line is UTF-8 text, valid JSON (the column of an error is counted within the line), an
  object, and holds no ``NaN`` / ``Infinity`` / ``-Infinity``; a table row's fields asked for hold no NaN or
  infinity;
- it has every field asked for;
- the prompt is a string that is not blank, or a list of messages ``Conversation`` accepts (its
  errors name the message: ``messages[2].role: ...``);
- the answer (after ``answer_transform``, if any; None from the transform is an
  error) is a finite number, kept as it is read, or a string from which the
  verifier gets a final answer: ``normalize_answer(reference_answer(answer))``
  is not empty (so ``""``, ``"#### "``, ``"\\boxed{}"`` cannot be scored).

``JsonlMathTask.fit_prompts(tokenizer, max_tokens, render, special_tokens)`` then requires every prompt, as
rendered for the model, to have 1..``max_tokens`` tokens (and a conversation to be renderable:
without a chat template only a single user message is). With ``skip_invalid=True`` bad
records are left out instead and listed (``JsonlMathTask.skipped``,
``JsonlMathTask.summary()``). A file without a valid record is always a
ValueError.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
import pathlib
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from pgjax.tasks.base import error_text
from pgjax.tasks.math_answers import math_reward, normalize_answer, reference_answer

FILE_FORMATS = ("auto", "jsonl", "json", "parquet", "arrow", "csv")
_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv"}     # auto: any other suffix is JSON Lines
DATA_EXTRA = "pip install -e '.[data]'"
ROLES = ("system", "user", "assistant")
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")    # a byte that is not UTF-8, as ``surrogateescape`` reads it
_NEXT_ROLES = {None: ("system", "user"), "system": ("user",), "user": ("assistant",), "assistant": ("user",)}


def reader_format(path: str | os.PathLike, file_format: str = "auto") -> str:
    """The format ``path`` is read in: ``file_format``, or for ``auto`` its suffix's (``.parquet``,
    ``.arrow``, ``.csv``; any other is ``jsonl``). ValueError for a format not in ``FILE_FORMATS``;
    ImportError naming the ``data`` extra when the format needs the ``datasets`` package and it
    is not installed."""
    if file_format not in FILE_FORMATS:
        raise ValueError(f"file_format={file_format!r} is unknown; valid: {', '.join(FILE_FORMATS)}")
    if file_format == "auto":
        file_format = _SUFFIXES.get(pathlib.PurePath(path).suffix.lower(), "jsonl")
    if file_format != "jsonl" and importlib.util.find_spec("datasets") is None:
        raise ImportError(f"reading {os.fspath(path)!r} as {file_format} needs the datasets package: {DATA_EXTRA}")
    return file_format


def field_names(fields: str | Iterable[str]) -> tuple[str, ...]:
    """Field names as a tuple: ``"id, level"`` (comma-separated, as ``task.options.extra_fields``) or a sequence."""
    if isinstance(fields, str):
        return tuple(name.strip() for name in fields.split(",") if name.strip())
    return tuple(fields)


def _turns(messages, name: str) -> tuple[dict[str, str], ...]:
    """The ``{"role", "content"}`` turns of the chat messages ``messages`` (the field ``name``) up to
    the last user turn; ValueError ``"{name}[i].role: ..."`` naming the first message at fault."""
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"{name}: expected a list of chat messages, got {type(messages).__name__}")
    if not messages:
        raise ValueError(f"{name}: the list of messages is empty")
    turns: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        where = f"{name}[{i}]"
        if not isinstance(message, dict):
            raise ValueError(f"{where}: expected an object with 'role' and 'content', got {type(message).__name__}")
        lacking = [key for key in ("role", "content") if key not in message]
        if lacking:
            raise ValueError(f"{where}: the message lacks {' and '.join(map(repr, lacking))}")
        role, content = message["role"], message["content"]
        if not (isinstance(role, str) and role in ROLES):
            raise ValueError(f"{where}.role: {role!r} is not one of {', '.join(ROLES)}")
        expected = _NEXT_ROLES[turns[-1]["role"] if turns else None]
        if role == "system" and role not in expected:
            raise ValueError(f"{where}.role: a system message can only be the first")
        if role not in expected:
            raise ValueError(f"{where}.role: {role!r} where {' or '.join(map(repr, expected))} is expected "
                             "(an optional system message, then user and assistant turns in turn)")
        if not isinstance(content, str):
            raise ValueError(f"{where}.content: must be a string, got {type(content).__name__}")
        if not content.strip():
            raise ValueError(f"{where}.content: the message is empty")
        turns.append({"role": role, "content": content})
    if turns[-1]["role"] == "assistant":       # the record's own reply: not part of the prompt
        turns.pop()
    if turns[-1]["role"] != "user":
        raise ValueError(f"{name}: no user message")
    return tuple(turns)


class Conversation(str):
    """A chat prompt: ``messages``, the ``{"role", "content"}`` turns of a conversation up to and
    including its last user turn, which the model's chat template renders
    (``pgjax.rollout.collect.PromptFormat``); as a string, the content of that last user turn (the
    prompt reward functions see; ``prompts[i].messages`` holds the rest).

    Built from a list of messages (dicts; keys other than ``role`` and ``content`` are dropped): an
    optional system message first, then user and assistant turns in turn, starting with a user turn;
    every role one of ``ROLES`` and every content a string that is not blank. A final assistant turn
    (a record's own reply) is left out. Anything else is a ValueError naming the message,
    ``"messages[2].role: 'tool' is not one of system, user, assistant"`` (``name``: the field's name
    in messages). Two conversations with the same last user turn compare equal as strings."""

    messages: tuple[dict[str, str], ...]

    def __new__(cls, messages, name: str = "messages"):
        turns = _turns(messages, name)
        conversation = super().__new__(cls, turns[-1]["content"])
        conversation.messages = turns
        return conversation

    def __getnewargs__(self):      # copy and pickle rebuild it from its messages, not from its text
        return (list(self.messages),)


class _Invalid(Exception):
    """A record's problem (the message, without file and place)."""


class _Constant:
    """What ``json.loads`` gives for ``NaN``, ``Infinity`` or ``-Infinity`` here, so they can be reported."""

    def __init__(self, name: str):
        self.name = name


def _leaf(value, test: Callable[[Any], bool]):
    """The first value anywhere in ``value`` (through dict values and list items) that passes ``test``, or None."""
    if test(value):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((leaf for leaf in (_leaf(item, test) for item in items) if leaf is not None), None)


def _parse(line: str) -> dict[str, Any]:
    """The JSON object of one line (without its newline, bytes that are not UTF-8 escaped: ``_lines``);
    _Invalid if it is not one."""
    undecodable = _ESCAPED_BYTE.search(line)
    if undecodable:
        raise _Invalid(f"not UTF-8 text: byte 0x{ord(undecodable.group()) - 0xdc00:02x} at column "
                       f"{undecodable.start() + 1}")
    try:
        record = json.loads(line, parse_constant=_Constant)
    except json.JSONDecodeError as err:  # pos, not colno: colno restarts after a newline in the text
        raise _Invalid(f"invalid JSON ({err.msg} at column {err.pos + 1})") from None
    pairs = record.items() if isinstance(record, dict) else [(None, record)]
    for key, value in pairs:
        constant = _leaf(value, lambda v: isinstance(v, _Constant))
        if constant:
            where = "" if key is None else f"field {key!r}: "
            raise _Invalid(f"{where}the non-standard JSON constant {constant.name} is not allowed")
    if not isinstance(record, dict):
        raise _Invalid(f"expected a JSON object, got {type(record).__name__}")
    return record


def _finite(row: dict[str, Any], fields: Sequence[str]) -> dict[str, Any]:
    """A table's ``row`` if none of ``fields`` holds a NaN or an infinity; _Invalid naming the field otherwise."""
    for key in fields:
        bad = _leaf(row.get(key), lambda v: isinstance(v, float) and not math.isfinite(v))
        if bad is not None:
            raise _Invalid(f"field {key!r}: {bad} is not a finite number")
    return row


def _check_prompt(prompt, field: str) -> str:
    """``prompt`` if it is a string that is not blank; a ``Conversation`` of a list of messages."""
    if isinstance(prompt, (list, tuple)):
        try:
            return Conversation(prompt, field)
        except ValueError as error:
            raise _Invalid(str(error)) from None
    if not isinstance(prompt, str):
        raise _Invalid(f"field {field!r}: the prompt must be a string or a list of chat messages, "
                       f"got {type(prompt).__name__}")
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
    """(1-based line number, text without its newline) of each non-blank line; a byte that is not UTF-8
    is kept as a lone surrogate (``surrogateescape``), for ``_parse`` to name its line."""
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if line.strip():
                yield lineno, line


def _rows(path: str, file_format: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) of each row of a local ``parquet``, ``arrow``, ``csv`` or ``json`` file,
    read by ``datasets`` streaming (no copy, no hub: only the local file is opened; the builder's lock
    files go to a temporary directory, not the user's cache); ValueError naming the file when it
    cannot be read in that format."""
    import datasets  # the data extra; reader_format has named it if it is missing
    try:
        with tempfile.TemporaryDirectory(prefix="pgjax-datasets-") as cache:
            rows = list(datasets.load_dataset(file_format, data_files=[path], split="train", streaming=True,
                                              cache_dir=cache,
                                              download_config=datasets.DownloadConfig(local_files_only=True)))
    except Exception as error:      # pyarrow's and datasets' own errors for a file that is not of this format
        raise ValueError(f"{path}: cannot be read as {file_format}: {error_text(error)}") from None
    return enumerate(rows, start=1)


def _listing(skipped: Sequence[tuple[int, str]], unit: str, limit: int = 2) -> str:
    """``"line 4: reason; line 9: reason; and 3 more"`` (``unit``: line or row)."""
    shown = [f"{unit} {place}: {reason}" for place, reason in skipped[:limit]]
    if len(skipped) > limit:
        shown.append(f"and {len(skipped) - limit} more")
    return "; ".join(shown)


@dataclasses.dataclass
class _Dataset:
    """A file's valid records, the place (line or row, ``unit``) of each, and the (place, reason) of
    each record left out."""
    path: str
    unit: str
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    places: list[int] = dataclasses.field(default_factory=list)
    skipped: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    def reject(self, place: int, reason: str, skip: bool) -> None:
        """Note a bad record: ValueError ``"{path}:{place}: {reason}"``, or with ``skip`` only listed."""
        if not skip:
            raise ValueError(f"{self.path}:{place}: {reason}")
        self.skipped.append((place, reason))

    def keep(self, indices: Sequence[int]) -> None:
        """Keep only the records at ``indices``; the reasons left out in file order."""
        self.records[:] = [self.records[i] for i in indices]
        self.places[:] = [self.places[i] for i in indices]
        self.skipped.sort()

    def listing(self) -> str:
        """The first records left out, ``"line 4: reason; ...; and 3 more"``."""
        return _listing(self.skipped, self.unit)

    def require_records(self, what: str = "valid records") -> None:
        """ValueError if no record is left, listing the first records left out."""
        if not self.records:
            if not self.skipped:
                raise ValueError(f"dataset file {self.path!r} holds no records")
            raise ValueError(f"dataset file {self.path!r} holds no {what}: {len(self.skipped)} skipped "
                             f"({self.listing()})")


def _load(path: str | os.PathLike, prompt_field: str, answer_field: str, extra_fields: str | Sequence[str],
          answer_transform: Callable[[Any], Any] | None, skip_invalid: bool, file_format: str = "auto") -> _Dataset:
    """The checked records of a file with their places (``load_jsonl``'s rules)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file not found: {path!r}")
    file_format = reader_format(path, file_format)
    extra_fields = field_names(extra_fields)
    clash = [k for k in extra_fields if k in ("prompt", "answer")]
    if clash:
        raise ValueError(f"extra_fields {clash}: an example's own keys (the prompt and answer fields' values), "
                         "not extra fields")
    fields = (prompt_field, answer_field, *extra_fields)
    rows: Iterator[tuple[int, Any]]
    parse: Callable[[Any], dict[str, Any]]
    row: Any    # a line for _parse or a record for _finite
    if file_format == "jsonl":
        data, rows, parse = _Dataset(path, "line"), _lines(path), _parse
    else:
        data, rows, parse = _Dataset(path, "row"), _rows(path, file_format), functools.partial(_finite, fields=fields)
    for place, row in rows:
        try:
            record = parse(row)
            missing = [k for k in fields if k not in record]
            if missing:
                raise _Invalid(f"record lacks field(s) {missing}; fields present: {sorted(record)}")
            prompt = _check_prompt(record[prompt_field], prompt_field)
            raw = record[answer_field]
            answer = _check_answer(raw if answer_transform is None else answer_transform(raw), answer_field, raw)
        except _Invalid as err:
            data.reject(place, str(err), skip_invalid)
            continue
        data.records.append({"prompt": prompt, "answer": answer, **{k: record[k] for k in extra_fields}})
        data.places.append(place)
    data.require_records()
    return data


def load_jsonl(path: str | os.PathLike, prompt_field: str = "question", answer_field: str = "answer",
               extra_fields: str | Sequence[str] = (), answer_transform: Callable[[Any], Any] | None = None,
               skip_invalid: bool = False, file_format: str = "auto") -> list[dict[str, Any]]:
    """Valid records of a dataset file (JSON Lines, or by ``file_format`` or its suffix parquet,
    arrow, csv or json) as ``{"prompt", "answer", *extra_fields}`` dicts, in file order.

    ``extra_fields``: names, or one comma-separated string. ``answer_transform`` (e.g.
    ``extract_answer``, to keep only the final answer of a GSM8K solution ``"... #### 72"``) is
    applied to each answer before it is checked. Answers are kept as read otherwise (``72`` stays
    an int; ``math_reward`` compares ``str(answer)``). A prompt field that holds chat messages
    gives a ``Conversation``. A bad record is a ValueError ``"{path}:{line or row}: ..."`` (the
    rules are in the module docstring), or with ``skip_invalid`` left out (``JsonlMathTask`` lists
    what was left out).
    """
    return _load(path, prompt_field, answer_field, extra_fields, answer_transform, skip_invalid, file_format).records


@dataclasses.dataclass(frozen=True)
class JsonlMathTask:
    """A user's math dataset (GSM8K / MATH style) scored by ``math_reward``.

    The file (``file_format``: see ``reader_format``) is read and checked (``load_jsonl``) on
    first use. ``examples(n, seed)`` draws ``n`` records in a random order fixed by ``seed``
    (cycling through fresh permutations when ``n`` exceeds the file); ``n=None`` gives every
    record in file order. Each example holds ``prompt`` (a string, or a ``Conversation`` when
    the prompt field holds chat messages), ``answer`` and the ``extra_fields`` (names, or one
    comma-separated string), which reward functions receive as columns of the same names. The
    reference ``answer`` may be a full solution (it serves as the demonstration;
    ``math_reward`` compares its final ``\\boxed{}`` / ``####`` answer). ``tokenizer()`` is
    None: use the model's own tokenizer. With ``skip_invalid`` bad records (and prompts
    ``fit_prompts`` rejects) are left out: ``skipped`` lists them, ``summary()`` says so in one
    line.
    """

    path: str
    prompt_field: str = "question"
    answer_field: str = "answer"
    extra_fields: str | tuple[str, ...] = ""
    skip_invalid: bool = False
    file_format: str = "auto"
    name: str = dataclasses.field(default="jsonl_math", init=False)
    format_pattern: str = dataclasses.field(default=r"(?s).*\\boxed\{.+\}.*", init=False)

    def __post_init__(self):
        object.__setattr__(self, "extra_fields", field_names(self.extra_fields))

    @functools.cached_property
    def _data(self) -> _Dataset:
        return _load(self.path, self.prompt_field, self.answer_field, self.extra_fields, None, self.skip_invalid,
                     self.file_format)

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records kept, in file order."""
        return self._data.records

    @property
    def skipped(self) -> list[str]:
        """``"{path}:{line or row}: {reason}"`` for each record left out, in file order."""
        return [f"{self.path}:{place}: {reason}" for place, reason in self._data.skipped]

    def summary(self) -> str | None:
        """One line for the log, ``"data.jsonl: 97 records, 3 skipped (line 4: ...; ...; and 1 more)"``;
        None when nothing was skipped."""
        data = self._data
        if not data.skipped:
            return None
        return f"{self.path}: {len(data.records)} records, {len(data.skipped)} skipped ({data.listing()})"

    def fit_prompts(self, tokenizer, max_tokens: int, render=None, special_tokens: bool = False) -> None:
        """Check that every prompt, as ``render`` turns a list of prompts into the model's input texts
        (default: unchanged; a chat template), can be rendered (``render`` raises ValueError for one
        that cannot: a conversation without a chat template) and has 1..``max_tokens`` tokens
        (``tokenizer(texts, add_special_tokens=special_tokens)["input_ids"]``, one batch; the
        rollout's ``PromptFormat.special_tokens``): ValueError naming
        the file, line or row, field and problem (the token count and limit) for the first that does
        not, or with ``skip_invalid`` leave those out (ValueError if none is left). ``examples``
        then draws from the records kept."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        data, texts, problems = self._data, {}, {}
        for i, record in enumerate(data.records):
            try:
                texts[i] = record["prompt"] if render is None else render([record["prompt"]])[0]
            except ValueError as error:
                problems[i] = str(error)
        encoded = tokenizer(list(texts.values()), add_special_tokens=special_tokens)["input_ids"] if texts else []
        ids = dict(zip(texts, encoded, strict=True))
        keep = []
        for i, place in enumerate(data.places):
            if i in ids and 1 <= len(ids[i]) <= max_tokens:
                keep.append(i)
                continue
            problem = problems[i] if i in problems else (f"the prompt has {len(ids[i])} tokens; "
                                                         f"rollout.max_prompt_tokens={max_tokens}")
            data.reject(place, f"field {self.prompt_field!r}: {problem}", self.skip_invalid)
        data.keep(keep)
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
