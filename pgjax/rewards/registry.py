"""Tasks by name: the built-in registry, and a user's own task or reward function by import path.

``make_task("countdown", count=4)`` builds a registered task;
``make_task("my_pkg.tasks:make_task", digits=3, path="data.jsonl")`` imports and calls a user's
factory instead. Either way the factory receives the options its signature names (all of them
if it takes ``**options``), so one flat set of options (an experiment's task section) serves
every task.
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from pgjax.rewards.arithmetic import ArithmeticTask, MixedArithmeticTask, ScratchpadArithmeticTask
from pgjax.rewards.base import Task, described_value, located_error
from pgjax.rewards.countdown import CountdownTask
from pgjax.rewards.data import JsonlMathTask
from pgjax.rewards.word_math import WordMathTask

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask, "arithmetic_mix": MixedArithmeticTask,
    "scratchpad_arithmetic": ScratchpadArithmeticTask, "countdown": CountdownTask, "jsonl_math": JsonlMathTask,
    "word_math": WordMathTask}


def import_object(path: str, key: str):
    """The object named by ``package.module:name``; ValueError naming the setting ``key`` otherwise,
    also when importing the module raises (a SyntaxError in it: ``file:line: SyntaxError: ...``)."""
    module, sep, name = path.partition(":")
    if not (sep and module and name):
        raise ValueError(f"{key}={path!r} is not an import path: write package.module:name")
    try:
        return getattr(importlib.import_module(module), name)
    except AttributeError as error:
        raise ValueError(f"{key}={path!r} cannot be imported: {error}") from None
    except Exception as error:      # the module's own code failed, or it is not there
        raise ValueError(f"{key}={path!r} cannot be imported: {located_error(error)}") from None


def reward_function(path: str):
    """The reward function at the import path ``path`` (``task.reward``); ValueError unless it can be
    called as ``fn(prompts, completions, **fields)``: a function or an object with ``__call__``, not a
    module, a class or a value."""
    fn = import_object(path, "task.reward")
    if inspect.isclass(fn):
        raise ValueError(f"task.reward={path!r} is a class, not a reward function fn(prompts, completions, **fields)")
    if not callable(fn):
        raise ValueError(f"task.reward={path!r} is not callable: it must be a reward function fn(prompts, "
                         f"completions, **fields), not {described_value(fn)}")
    try:
        inspect.signature(fn).bind([], [])
    except TypeError as error:
        raise ValueError(f"task.reward={path!r} cannot be called as fn(prompts, completions, **fields): "
                         f"{error}") from None
    except ValueError:      # no signature to read (a builtin): calling it will tell
        pass
    return fn


def task_factory(name: str) -> Callable[..., Task]:
    """``TASKS[name]``, or the callable at the import path ``name``; ValueError naming the valid names."""
    if name in TASKS:
        return TASKS[name]
    if ":" not in name:
        raise ValueError(f"task.name={name!r} is unknown; valid: {', '.join(TASKS)}, or the import path "
                         "package.module:factory of your own task")
    factory = import_object(name, "task.name")
    if not callable(factory):
        raise ValueError(f"task.name={name!r} is not callable: it must build a task")
    return factory


def accepted_options(factory) -> list[str] | None:
    """The option names ``factory`` takes, or None when it takes any (``**options``)."""
    parameters = inspect.signature(factory).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


TASK_METHODS = ("examples", "reward_fn", "tokenizer")      # what training calls on a task


def make_task(name: str, **options) -> Task:
    """The task ``name`` built from the ``options`` its factory's signature names; ValueError when the
    factory returns something without the ``Task`` interface (``TASK_METHODS``)."""
    factory = task_factory(name)
    accepted = accepted_options(factory)
    task = factory(**{k: v for k, v in options.items() if accepted is None or k in accepted})
    lacking = [method for method in TASK_METHODS if not callable(getattr(task, method, None))]
    if lacking:
        raise ValueError(f"{name} returned {described_value(task)}, not a task: it has no "
                         f"{', '.join(lacking)} (see pgjax.rewards.Task)")
    return task
