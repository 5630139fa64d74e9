"""Tasks by name: the built-in registry, and a user's own task or reward function by import path.

``make_task("countdown", count=4)`` builds a registered task;
``make_task("my_pkg.tasks:make_task", digits=3, path="data.jsonl")`` imports and calls a user's
factory instead (``pgjax.plugins.resolve``: a name of ``TASKS`` or an import path). Either way the
factory receives, in ``options``, the task's own options by name (an experiment's ``task.options``),
every one of which it must take, and of the keyword ``fields`` those its signature names (all of
them if it takes ``**options``).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from pgjax.plugins import resolve
from pgjax.tasks.arithmetic import ArithmeticTask, MixedArithmeticTask, ScratchpadArithmeticTask
from pgjax.tasks.base import Task, described_value
from pgjax.tasks.countdown import CountdownTask
from pgjax.tasks.data import JsonlMathTask
from pgjax.tasks.word_math import WordMathTask

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask, "arithmetic_mix": MixedArithmeticTask,
    "scratchpad_arithmetic": ScratchpadArithmeticTask, "countdown": CountdownTask, "jsonl_math": JsonlMathTask,
    "word_math": WordMathTask}


def reward_function(path: str):
    """The reward function at the import path ``path`` (``task.reward.function``); ValueError unless it can be
    called as ``fn(prompts, completions, **fields)``: a function or an object with ``__call__``, not a
    module, a class or a value."""
    fn = resolve("task.reward.function", path, {}, "reward function")
    if inspect.isclass(fn):
        raise ValueError(f"task.reward.function={path!r} is a class, not a reward function fn(prompts, "
                         "completions, **fields)")
    if not callable(fn):
        raise ValueError(f"task.reward.function={path!r} is not callable: it must be a reward function fn(prompts, "
                         f"completions, **fields), not {described_value(fn)}")
    try:
        inspect.signature(fn).bind([], [])
    except TypeError as error:
        raise ValueError(f"task.reward.function={path!r} cannot be called as fn(prompts, completions, **fields): "
                         f"{error}") from None
    except ValueError:      # no signature to read (a builtin): calling it will tell
        pass
    return fn


def task_factory(name: str) -> Callable[..., Task]:
    """``TASKS[name]``, or the callable at the import path ``name``; ValueError naming the valid names."""
    factory = resolve("task.name", name, TASKS, "task factory")
    if not callable(factory):
        raise ValueError(f"task.name={name!r} is not callable: it must build a task")
    return factory


def accepted_options(factory) -> list[str] | None:
    """The option names ``factory`` takes, or None when it takes any (``**options``)."""
    parameters = inspect.signature(factory).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def option_defaults(factory) -> dict[str, Any]:
    """The options ``factory`` takes that have a default, and each default (what an option left out of
    ``task.options`` is)."""
    parameters = inspect.signature(factory).parameters.values()
    return {p.name: p.default for p in parameters
            if p.default is not p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


TASK_METHODS = ("examples", "reward_fn", "tokenizer")      # what training calls on a task


def make_task(name: str, options: Mapping[str, Any] | None = None, **fields) -> Task:
    """The task ``name`` built from the ``fields`` its factory's signature names (the others left out)
    and every one of its own ``options`` (``task.options``), which the
    factory must take: TypeError naming an option it does not, before it is called (a factory that
    takes ``**options`` checks its own, raising TypeError or ValueError). ValueError when the factory
    returns something without the ``Task`` interface (``TASK_METHODS``)."""
    factory = task_factory(name)
    accepted = accepted_options(factory)
    options = dict(options or {})
    refused = [key for key in options if accepted is not None and key not in accepted]
    if refused:
        raise TypeError(f"task {name!r} takes no option {refused[0]!r}; it takes "
                        f"{', '.join(accepted or []) or 'no options'}")
    task = factory(**{k: v for k, v in fields.items() if (accepted is None or k in accepted) and k not in options},
                   **options)
    lacking = [method for method in TASK_METHODS if not callable(getattr(task, method, None))]
    if lacking:
        raise ValueError(f"{name} returned {described_value(task)}, not a task: it has no "
                         f"{', '.join(lacking)} (see pgjax.tasks.Task)")
    return task
