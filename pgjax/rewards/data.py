"""A user's JSONL dataset: records loaded by field name, and a math task over them.

One JSON object per line (blank lines skipped). ``load_jsonl`` returns dicts
with ``prompt`` (from ``prompt_field``), ``answer`` (from ``answer_field``)
and any ``extra_fields`` under their own names. Errors name the file, the line
and the problem: a missing file is FileNotFoundError; invalid JSON, a line
that is not an object, a record lacking a field, a non-string prompt, an
empty file or an answer the transform cannot extract are ValueError.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pgjax.rewards.math_answers import math_reward


def load_jsonl(path: str | os.PathLike, prompt_field: str = "question", answer_field: str = "answer",
               extra_fields: Sequence[str] = (), answer_transform: Callable[[Any], Any] | None = None
               ) -> list[dict[str, Any]]:
    """Records of a JSONL file as ``{"prompt", "answer", *extra_fields}`` dicts, in file order.

    ``answer_transform`` (e.g. ``extract_answer``, to keep only the final
    answer of a GSM8K solution ``"... #### 72"``) is applied to each answer; a
    result of None is an error naming the line. Answers are kept as JSON gives
    them otherwise (``math_reward`` compares ``str(answer)``).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file not found: {path!r}")
    if isinstance(extra_fields, str):
        extra_fields = (extra_fields,)
    fields = (prompt_field, answer_field, *extra_fields)
    records = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
            missing = [k for k in fields if k not in record]
            if missing:
                raise ValueError(f"{path}:{lineno}: record lacks field(s) {missing}; "
                                 f"fields present: {sorted(record)}")
            if not isinstance(record[prompt_field], str):
                raise ValueError(f"{path}:{lineno}: prompt field {prompt_field!r} must be a string, "
                                 f"got {type(record[prompt_field]).__name__}")
            answer = record[answer_field]
            if answer_transform is not None:
                answer = answer_transform(answer)
                if answer is None:
                    raise ValueError(f"{path}:{lineno}: no answer could be extracted from field "
                                     f"{answer_field!r}: {record[answer_field]!r:.80}")
            out = {"prompt": record[prompt_field], "answer": answer}
            out.update((k, record[k]) for k in extra_fields)
            records.append(out)
    if not records:
        raise ValueError(f"dataset file {path!r} holds no records")
    return records


@dataclasses.dataclass(frozen=True)
class JsonlMathTask:
    """A user's math dataset (GSM8K / MATH style) scored by ``math_reward``.

    ``examples(n, seed)`` draws ``n`` records in a random order fixed by
    ``seed`` (cycling through fresh permutations when ``n`` exceeds the file);
    ``n=None`` gives every record in file order. The reference ``answer`` may
    be a full solution (it serves as the demonstration; ``math_reward``
    compares its final ``\\boxed{}`` / ``####`` answer). ``tokenizer()`` is
    None: use the model's own tokenizer.
    """

    path: str
    prompt_field: str = "question"
    answer_field: str = "answer"
    extra_fields: tuple[str, ...] = ()
    name: str = dataclasses.field(default="jsonl_math", init=False)
    format_pattern: str = dataclasses.field(default=r"(?s).*\\boxed\{.+\}.*", init=False)

    @functools.cached_property
    def records(self) -> list[dict[str, Any]]:
        return load_jsonl(self.path, self.prompt_field, self.answer_field, tuple(self.extra_fields))

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
