"""The data of learned rewards, read from a user's file and checked like every dataset
(``pgjax.tasks.data``: the same formats, ``"{path}:{line}: ..."`` errors naming the field,
``skip_invalid`` to leave bad records out and list them): preference pairs for a reward model
(``load_preferences``) and step labels for a process reward model (``load_step_labels``, at the end).

A preference record holds, by field name (``prompt_field``, ``chosen_field``, ``rejected_field``):

- **plain**: the prompt (a string, or chat messages up to the last user turn, a ``Conversation``),
  and the chosen and rejected responses as strings (the assistant's reply);
- **conversational** (TRL's format): ``chosen`` and ``rejected`` as lists of chat messages that end
  with the assistant's reply. The prompt field may then be left out: the prompt is the messages
  before the reply, which must be the same in both (an implicit prompt).

``margin_field`` (optional): a finite number per pair, the margin its score gap must exceed
(``core.bradley_terry_loss``). A reply must not be blank, and the chosen and rejected replies must
differ (a pair of equal texts teaches nothing and scores a tie).
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

from pgjax.tasks.data import (
    Conversation,
    _check_prompt,
    _Dataset,
    _finite,
    _Invalid,
    _lines,
    _parse,
    _rows,
    reader_format,
)


def _reply(value, field: str) -> tuple[list | None, str]:
    """(the messages before the reply, or None for a plain string; the reply's text) of a response field."""
    if isinstance(value, str):
        if not value.strip():
            raise _Invalid(f"field {field!r}: the response is empty")
        return None, value
    if not isinstance(value, (list, tuple)) or not value:
        raise _Invalid(f"field {field!r}: expected a string or a list of chat messages ending with the assistant's "
                       f"reply, got {type(value).__name__ if value != [] else 'an empty list'}")
    last = value[-1]
    if not (isinstance(last, dict) and last.get("role") == "assistant"):
        raise _Invalid(f"field {field!r}: the last message must be the assistant's reply")
    content = last.get("content")
    if not isinstance(content, str) or not content.strip():
        raise _Invalid(f"field {field!r}: the assistant's reply must be a string that is not blank")
    return list(value[:-1]), content


def _prompt(record: dict, fields: "PreferenceFields", before_chosen, before_rejected):
    """The pair's prompt: its prompt field, or the conversation both responses share before their reply."""
    if fields.prompt in record:
        return _check_prompt(record[fields.prompt], fields.prompt)
    if before_chosen is None or before_rejected is None:
        raise _Invalid(f"record lacks field {fields.prompt!r} (needed unless {fields.chosen!r} and {fields.rejected!r} "
                       "are chat messages that hold the prompt); fields present: " + repr(sorted(record)))
    if before_chosen != before_rejected:
        raise _Invalid(f"fields {fields.chosen!r} and {fields.rejected!r}: their messages before the reply differ, so "
                       "the pair has no one prompt")
    if not before_chosen:
        raise _Invalid(f"field {fields.chosen!r}: no messages before the reply (no prompt)")
    try:
        return Conversation(before_chosen, fields.chosen)
    except ValueError as error:
        raise _Invalid(str(error)) from None


@dataclasses.dataclass(frozen=True)
class PreferenceFields:
    """The field names of a preference record (``margin``: empty for none)."""
    prompt: str = "prompt"
    chosen: str = "chosen"
    rejected: str = "rejected"
    margin: str = ""


def _record(record: dict, fields: PreferenceFields) -> dict[str, Any]:
    """One checked pair ``{"prompt", "chosen", "rejected", "margin"}``; _Invalid naming the field at fault."""
    missing = [k for k in (fields.chosen, fields.rejected, fields.margin) if k and k not in record]
    if missing:
        raise _Invalid(f"record lacks field(s) {missing}; fields present: {sorted(record)}")
    before_chosen, chosen = _reply(record[fields.chosen], fields.chosen)
    before_rejected, rejected = _reply(record[fields.rejected], fields.rejected)
    prompt = _prompt(record, fields, before_chosen, before_rejected)
    if chosen == rejected:
        raise _Invalid(f"fields {fields.chosen!r} and {fields.rejected!r}: the two responses are the same text")
    margin = 0.0
    if fields.margin:
        margin = record[fields.margin]
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
            raise _Invalid(f"field {fields.margin!r}: the margin must be a finite number, got {margin!r:.40}")
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "margin": float(margin)}


def load_preferences(path: str | os.PathLike, fields: PreferenceFields = PreferenceFields(), skip_invalid: bool = False,
                     file_format: str = "auto") -> _Dataset:
    """The checked pairs of a file (module docstring), with their places and what was left out
    (``records``, ``places``, ``skipped``, ``listing()``); FileNotFoundError for a missing file, a
    ValueError ``"{path}:{line}: ..."`` for a bad record unless ``skip_invalid``, and always one for a
    file without a valid pair."""
    names = [n for n in (fields.prompt, fields.chosen, fields.rejected, fields.margin) if n]
    return _read(path, names, lambda record: _record(record, fields), skip_invalid, file_format, "valid pairs")


def _read(path, names: list[str], check, skip_invalid: bool, file_format: str, what: str) -> _Dataset:
    """The records of a file that ``check`` (a parsed record -> the kept one, or _Invalid) keeps."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path!r}")
    file_format = reader_format(path, file_format)
    rows: Iterator[tuple[int, Any]]
    parse: Callable[[Any], dict[str, Any]]
    row: Any    # a line for _parse or a record for _finite
    if file_format == "jsonl":
        data, rows, parse = _Dataset(path, "line"), _lines(path), _parse
    else:
        data, rows = _Dataset(path, "row"), _rows(path, file_format)
        parse = lambda row: _finite(row, names)      # noqa: E731
    for place, row in rows:
        try:
            data.records.append(check(parse(row)))
            data.places.append(place)
        except _Invalid as error:
            data.reject(place, str(error), skip_invalid)
    data.require_records(what)
    return data


@dataclasses.dataclass(frozen=True)
class StepFields:
    """The field names of a step-labelled record (TRL's stepwise supervision: ``prompt``,
    ``completions``, the response's steps in order, and ``labels``, whether each step is correct)."""
    prompt: str = "prompt"
    steps: str = "completions"
    labels: str = "labels"


def _step_record(record: dict, fields: StepFields) -> dict[str, Any]:
    """One checked record ``{"prompt", "steps", "labels"}``; _Invalid naming the field at fault."""
    missing = [k for k in (fields.prompt, fields.steps, fields.labels) if k not in record]
    if missing:
        raise _Invalid(f"record lacks field(s) {missing}; fields present: {sorted(record)}")
    prompt = _check_prompt(record[fields.prompt], fields.prompt)
    steps, labels = record[fields.steps], record[fields.labels]
    if not isinstance(steps, list) or not steps:
        raise _Invalid(f"field {fields.steps!r}: expected a non-empty list of the response's steps")
    for i, step in enumerate(steps):
        if not isinstance(step, str) or not step.strip():
            raise _Invalid(f"field {fields.steps!r}[{i}]: a step must be a string that is not blank")
    if not isinstance(labels, list) or len(labels) != len(steps):
        raise _Invalid(f"field {fields.labels!r}: expected a list of one label per step ({len(steps)}), got "
                       f"{labels!r:.60}")
    for i, label in enumerate(labels):
        if label not in (0, 1) or isinstance(label, float):
            raise _Invalid(f"field {fields.labels!r}[{i}]: a label is true / false or 1 / 0, got {label!r}")
    return {"prompt": prompt, "steps": list(steps), "labels": [int(label) for label in labels]}


def load_step_labels(path: str | os.PathLike, fields: StepFields = StepFields(), skip_invalid: bool = False,
                     file_format: str = "auto") -> _Dataset:
    """The checked step-labelled records of a file (``StepFields``; every step a string that is not
    blank, one label per step, each true / false or 1 / 0), with their places and what was left out,
    under ``load_preferences``' rules."""
    return _read(path, [fields.prompt, fields.steps, fields.labels], lambda record: _step_record(record, fields),
                 skip_invalid, file_format, "step-labelled records")
