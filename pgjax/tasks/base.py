"""The reward interface: per-example rewards, weighted sums, format rewards and the Task protocol.

A reward function is any callable

    fn(prompts: Sequence[str], completions: Sequence[str], **fields: Sequence) -> np.ndarray

returning float32 rewards of shape ``[len(completions)]``. ``fields`` are
per-example columns aligned with the batch (``target=[...]``,
``numbers=[...]``, ``answer=[...]``); a reward function takes the columns it
needs by name and ignores the rest, so one ``**fields`` dict can feed several.

Rules, the same for every reward in this package:
- a reward that cannot be computed (malformed completion, unparsable answer,
  division by zero, any exception while scoring one row) is 0.0 for that row:
  a row rule wrapped by ``per_example`` never yields NaN or infinity and
  never raises for a bad completion;
- a batched function is called through ``call_reward``: an exception it raises
  (``sys.exit()`` included), a call that does not return in time (``with_timeout``)
  and a result that is not one number per completion (``as_rewards``: a wrong shape,
  a string, even ``"1.0"``, None, a list) are a ``RewardError`` naming the
  function; ``finite_rewards`` is the one check of the numbers that reach
  training: a NaN or infinite reward is a ``RewardError`` naming the function
  and the row, or, where the caller asks for it, a masked row;
- a batch whose prompts, completions and field columns differ in length, or a
  missing field, is a caller's bug and raises (ValueError / TypeError).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import re
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

# the general error helpers (pgjax.errors), here too where the reward code and its users name them
from pgjax.errors import described_value, error_text, located_error, raised_at, raised_text  # noqa: F401


class RewardFn(Protocol):
    """``fn(prompts, completions, **fields) -> float32 [len(completions)]`` (see the module docstring)."""

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence) -> np.ndarray: ...


class Task(Protocol):
    """A task: prompts with the fields its reward needs, a demonstration and a verifier.

    ``examples(n, seed)`` returns ``n`` dicts, each with ``prompt`` (str; a
    ``Conversation`` for chat messages the chat template renders),
    ``answer`` (the demonstration / reference completion, for a supervised
    warm start) and the fields ``reward_fn`` reads; the same seed gives the
    same examples. ``reward_fn`` is the correctness reward (1.0 correct, 0.0
    otherwise), so accuracy is the fraction of rows whose reward is 1.
    ``format_pattern`` is a regular expression a well-formed completion fully
    matches (for ``format_reward``). ``tokenizer()`` is the task's own
    tokenizer, or None where the model's tokenizer is to be used.

    Optional, for a task over a finite set of records (``JsonlMathTask``):
    ``fit_prompts(tokenizer, max_tokens, render, special_tokens)`` checks (or, by the task's
    own option, drops) prompts too long for the model, and ``summary()`` says
    in one line what was left out; the Trainer calls them when present.
    """

    @property
    def name(self) -> str: ...

    @property
    def reward_fn(self) -> RewardFn: ...

    @property
    def format_pattern(self) -> str: ...

    def examples(self, n: int, seed: int = 0) -> list[dict[str, Any]]: ...

    def tokenizer(self) -> Any: ...


def _is_column(value) -> bool:
    return hasattr(value, "__len__") and hasattr(value, "__getitem__") and not isinstance(value, (str, bytes))


def check_columns(prompts: Sequence[str], completions: Sequence[str], fields: Mapping[str, Sequence]) -> int:
    """The batch size B; raises ValueError unless prompts, completions and every field column have length B."""
    for name, column in (("prompts", prompts), ("completions", completions), *fields.items()):
        if not _is_column(column):
            raise ValueError(f"{name!r} must be a sequence with one entry per completion, "
                             f"got {type(column).__name__}")
    n = len(completions)
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts but {n} completions")
    for name, column in fields.items():
        if len(column) != n:
            raise ValueError(f"field {name!r} has {len(column)} entries but there are {n} completions")
    return n


class RewardError(ValueError):
    """A reward function failed or returned something training cannot use: it raised, did not return
    in time, returned the wrong shape, something that is not a number, or a NaN or infinite reward."""


def call_reward(fn: RewardFn, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence) -> np.ndarray:
    """``fn(prompts, completions, **fields)`` as ``as_rewards`` float32 ``[len(completions)]``, NaN and
    infinities kept; any exception ``fn`` raises (``raised_by_code``: also ``sys.exit()``, which would
    end the whole process) is a RewardError naming it, the exception and where in the user's code it
    was raised."""
    try:
        values = fn(prompts, completions, **fields)
    except RewardError:
        raise
    except BaseException as error:
        if not raised_by_code(error):
            raise
        if isinstance(error, SystemExit):
            where = raised_at(error)
            what = (f"called sys.exit() ({error_text(error)}), which would end the run"
                    + (f" ({where})" if where else ""))
        else:
            what = f"raised {raised_text(error)}"
        raise RewardError(f"reward function {reward_name(fn)} {what}") from error
    return as_rewards(values, len(completions), reward_name(fn))


def raised_by_code(error: BaseException) -> bool:
    """Whether ``error`` came from the code that ran, not from outside it: any exception, ``SystemExit``
    (``sys.exit()``) and the other ``BaseException``s, but a ``KeyboardInterrupt`` only where Ctrl-C
    cannot raise one (SIGINT has a handler of its own, as during a run: ``interrupts.graceful_stop``)."""
    return not isinstance(error, KeyboardInterrupt) or signal.getsignal(signal.SIGINT) is not signal.default_int_handler


def with_timeout(fn: RewardFn, seconds: float) -> RewardFn:
    """``fn`` whose every call must return within ``seconds`` (``task.reward.timeout``; 0: ``fn``
    itself), else a RewardError naming it. Each call runs in a daemon thread, which a call that times
    out leaves behind, running (it does not keep the process from exiting); a function stuck in C
    code that holds the GIL cannot be interrupted, so then the timeout cannot fire either."""
    if not seconds:
        return fn
    name = reward_name(fn)

    def timed(prompts: Sequence[str], completions: Sequence[str], **fields: Sequence):
        return call_within(seconds, lambda: fn(prompts, completions, **fields), f"reward function {name}",
                           lambda: RewardError(f"reward function {name} did not return within task.reward.timeout="
                                               f"{seconds} s (called on {len(completions)} completions)"))

    timed.__name__ = timed.__qualname__ = name
    return timed


def call_within(seconds: float, call: Callable[[], Any], name: str, late: Callable[[], BaseException]) -> Any:
    """``call()`` in a daemon thread called ``name``: its value, or the exception it raised (re-raised
    here); ``late()`` is raised when it has not returned within ``seconds``, and the thread is left
    running (it does not keep the process from exiting)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as error:          # re-raised in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise late()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _is_number(value) -> bool:
    return isinstance(value, (numbers.Real, np.bool_))


def as_rewards(values, n: int, name: str = "reward") -> np.ndarray:
    """``values`` as float32 ``[n]``, NaN and infinities kept (``finite_rewards`` decides about them).

    ``values``: n numbers (int, float or bool; a list, a NumPy or JAX array). Anything else is a bug in
    the reward function ``name``, a RewardError saying what it returned: another shape, a single value,
    or a row that is not a number (a string, even ``"1.0"``, None, a list, a dict).
    """
    try:
        out = np.asarray(values)
    except ValueError:              # a ragged nest of sequences: their rows are reported below
        out = np.asarray(values, dtype=object)
    except Exception as error:      # e.g. a tensor that refuses the conversion
        raise RewardError(f"reward function {name} returned {described_value(values)}, which NumPy cannot read: "
                          f"{error_text(error)}") from error
    if out.ndim == 0:
        raise RewardError(f"reward function {name} returned {described_value(values)} for {n} completions, expected "
                          f"an array of shape ({n},)")
    if out.shape != (n,):
        raise RewardError(f"reward function {name} returned shape {out.shape} for {n} completions, expected ({n},)")
    if out.dtype.kind not in "biuf":
        rows = out.tolist()
        row = next((i for i, value in enumerate(rows) if not _is_number(value)), None)
        if row is not None:
            raise RewardError(f"reward function {name} returned {described_value(rows[row])} at row {row}: a "
                              "reward must be a number (int, float or bool)")
    return out.astype(np.float32)


NONFINITE_POLICIES = ("error", "mask")


def finite_rewards(rewards: np.ndarray, name: str, prompts: Sequence[str], completions: Sequence[str],
                   nonfinite: str = "error") -> tuple[np.ndarray, np.ndarray]:
    """(rewards with non-finite entries set to 0, the boolean mask of those rows) for ``nonfinite="mask"``;
    with ``"error"`` a non-finite reward raises RewardError naming ``name``, the first such row, its
    prompt and completion. The one validation of raw reward outputs before training uses them."""
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
    bad = ~np.isfinite(rewards)
    if bad.any() and nonfinite == "error":
        row = int(np.argmax(bad))
        raise RewardError(f"reward function {name} returned {rewards[row]} for row {row} of {len(rewards)} "
                          f"({int(bad.sum())} non-finite; prompt {prompts[row]!r:.60}, completion "
                          f"{completions[row]!r:.60}); fix it, or set rollout.nonfinite_rewards='mask' to leave "
                          "such samples out of the update")
    return np.where(bad, 0.0, rewards).astype(np.float32), bad


def per_example(fn: Callable[..., float]) -> RewardFn:
    """Turn a row rule ``fn(prompt, completion, **row_fields) -> float`` into a batched RewardFn.

    The batched function checks lengths (ValueError), checks that the fields
    ``fn`` names as keyword-only arguments without defaults are present
    (TypeError), then scores each row, passing the fields ``fn`` accepts (all
    of them if it takes ``**kwargs``); a row whose rule raises or returns a
    non-finite value gets 0.0.
    """
    params = list(inspect.signature(fn).parameters.values())
    positional = {p.name for p in params[:2]}
    required = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params)
    accepted = {p.name for p in params[2:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    @functools.wraps(fn)
    def reward(prompts: Sequence[str], completions: Sequence[str], **fields: Sequence) -> np.ndarray:
        n = check_columns(prompts, completions, fields)
        missing = [k for k in required if k not in fields]
        if missing:
            raise TypeError(f"{fn.__name__} needs the field(s) {missing}; got fields {sorted(fields)}")
        clash = sorted(positional & set(fields))
        if clash:
            raise ValueError(f"field name(s) {clash} clash with {fn.__name__}'s positional arguments")
        used = {k: v for k, v in fields.items() if takes_all or k in accepted}
        out = np.zeros(n, np.float32)
        for i in range(n):
            try:
                value = float(fn(prompts[i], completions[i], **{k: v[i] for k, v in used.items()}))
            except Exception:  # the documented rule: an uncomputable reward is 0.0
                value = 0.0
            out[i] = value if math.isfinite(value) else 0.0
        return out

    reward.required_fields = tuple(required)  # type: ignore[attr-defined]  # a function attribute
    return reward


def reward_name(fn) -> str:
    """A short name for logging: ``__name__``, a partial's function name, or the class name."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


@dataclasses.dataclass(frozen=True)
class WeightedSum:
    """``sum_i w_i fn_i(prompts, completions, **fields)``, built by ``combine``.

    ``components(...)`` returns each term's unweighted rewards by name (for
    logging); calling the object returns the weighted sum. Every term receives
    all fields and takes the ones it needs.
    """

    terms: tuple[tuple[str, RewardFn, float], ...]

    def components(self, prompts: Sequence[str], completions: Sequence[str],
                   **fields: Sequence) -> dict[str, np.ndarray]:
        n = check_columns(prompts, completions, fields)
        return {name: as_rewards(fn(prompts, completions, **fields), n, name) for name, fn, _ in self.terms}

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence) -> np.ndarray:
        parts = self.components(prompts, completions, **fields)
        total = sum((w * parts[name].astype(np.float64) for name, _, w in self.terms), np.zeros(len(completions)))
        return as_rewards(total, len(completions), self.__name__)

    @property
    def __name__(self) -> str:
        """``correct + 0.1 * format_reward``: how the sum is named in messages."""
        return " + ".join(name if w == 1 else f"{w:g} * {name}" for name, _, w in self.terms)

    @property
    def weights(self) -> dict[str, float]:
        return {name: w for name, _, w in self.terms}


def combine(*terms) -> WeightedSum:
    """Weighted sum of reward functions: ``combine((correct, 1.0), (fmt, 0.1))``.

    Each term is ``fn`` (weight 1) or ``(fn, weight)`` with a finite weight.
    Terms are named by ``reward_name`` (``_2``, ``_3``... on repeats) in
    ``components``.
    """
    if not terms:
        raise ValueError("combine needs at least one reward function")
    named: list[tuple[str, RewardFn, float]] = []
    seen: dict[str, int] = {}
    for term in terms:
        fn, weight = (term if isinstance(term, tuple) else (term, 1.0))
        if not callable(fn):
            raise TypeError(f"not a reward function: {fn!r}")
        weight = float(weight)
        if not math.isfinite(weight):
            raise ValueError(f"weight of {reward_name(fn)} must be finite, got {weight}")
        base = reward_name(fn)
        seen[base] = seen.get(base, 0) + 1
        named.append((base if seen[base] == 1 else f"{base}_{seen[base]}", fn, weight))
    return WeightedSum(tuple(named))


def format_reward(pattern: str, flags: int = 0) -> RewardFn:
    """1.0 where the stripped completion fully matches the regular expression ``pattern``, else 0.0.

    E.g. ``format_reward(r"-?\\d+")`` for the arithmetic task.
    """
    regex = re.compile(pattern, flags)

    def format_ok(prompt: str, completion: str, **_) -> float:
        return float(regex.fullmatch(completion.strip()) is not None)

    fn = per_example(format_ok)
    fn.__name__ = fn.__qualname__ = "format_reward"  # type: ignore[attr-defined]  # per_example's function
    fn.__doc__ = f"1.0 where the stripped completion fully matches {pattern!r}, else 0.0."
    return fn


def batch_fields(examples: Sequence[Mapping[str, Any]], repeat: int = 1,
                 exclude: Sequence[str] = ("prompt",)) -> dict[str, list]:
    """Columns ``{field: [value per row]}`` of a list of examples, to pass as ``**fields``.

    ``repeat=K`` repeats each example K times in a row, matching the group
    layout of docs/design.md (row ``p*K + k`` is response k to prompt p).
    ``prompt`` is left out by default (it is the ``prompts`` argument).
    """
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    keys = [k for k in (examples[0] if examples else {}) if k not in exclude]
    for i, ex in enumerate(examples):
        missing = [k for k in keys if k not in ex]
        if missing:
            raise ValueError(f"example {i} lacks field(s) {missing}")
    return {k: [ex[k] for ex in examples for _ in range(repeat)] for k in keys}
