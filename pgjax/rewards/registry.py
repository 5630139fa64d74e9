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
from pgjax.rewards.base import Task
from pgjax.rewards.countdown import CountdownTask
from pgjax.rewards.data import JsonlMathTask
from pgjax.rewards.word_math import WordMathTask

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask, "arithmetic_mix": MixedArithmeticTask,
    "scratchpad_arithmetic": ScratchpadArithmeticTask, "countdown": CountdownTask, "jsonl_math": JsonlMathTask,
    "word_math": WordMathTask}


def import_object(path: str, key: str):
    """The object named by ``package.module:name``; ValueError naming the setting ``key`` otherwise."""
    module, sep, name = path.partition(":")
    if not (sep and module and name):
        raise ValueError(f"{key}={path!r} is not an import path: write package.module:name")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{key}={path!r} cannot be imported: {error}") from None


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


def make_task(name: str, **options) -> Task:
    """The task ``name`` built from the ``options`` its factory's signature names."""
    factory = task_factory(name)
    accepted = accepted_options(factory)
    return factory(**{k: v for k, v in options.items() if accepted is None or k in accepted})
