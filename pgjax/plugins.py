"""Research code plugged into pgjax from outside it, named where it is used by its import path.

Every extension point of an experiment takes a built-in name or the import path
``package.module:name`` of an object of the user's, in the same setting, looked up the same way
(``resolve``):

  task.name       a task factory (``pgjax.tasks.TASKS``), its own options in ``task.options``
  task.reward.function     a reward function ``fn(prompts, completions, **fields)`` (import paths only)
  task.tools.names      tools (``pgjax.agents.TOOLS``): classes or factories called with no arguments
  logging.sinks   logging sinks (``pgjax.train.sinks.SINKS``): ``factory(directory, since)``
  model.family    a model family (``pgjax.models.transformer.FAMILIES``): a ``Family``
  algorithm.preset  an estimator (``pgjax.core.PRESETS``)

The module is imported with the usual rules (it must be importable: installed, or on
``PYTHONPATH`` / ``sys.path``); what each kind must be is checked by its user, before anything is
written. docs/extending.md shows each kind with an example.
"""
from __future__ import annotations

import importlib
from collections.abc import Mapping

from pgjax import core
from pgjax.errors import described_value, located_error


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


def is_import_path(name: str) -> bool:
    """Whether ``name`` is written as an import path (``package.module:name``), not a built-in name."""
    return ":" in name


def resolve(key: str, name: str, builtins: Mapping, what: str):
    """``builtins[name]``, else the object at the import path ``name`` (``import_object``). ValueError
    naming the setting ``key``, the value and the valid built-in names for a name that is neither
    (with no built-ins, ``import_object``'s: not an import path). What the object must be is the
    caller's to check."""
    if name in builtins:
        return builtins[name]
    if is_import_path(name) or not builtins:
        return import_object(name, key)
    raise ValueError(f"{key}={name!r} is unknown; valid: {', '.join(builtins)}, or the import path "
                     f"package.module:name of your own {what}")


def module_of(path: str) -> str:
    """The module part of the import path ``path`` (``package.module`` of ``package.module:name``)."""
    return path.partition(":")[0]


def named_estimator(name: str, key: str = "algorithm.preset") -> core.Estimator:
    """The preset ``name`` (``core.PRESETS``) or the estimator at the import path ``name``: the object there,
    or what calling it with no arguments returns when it is a class or function. ValueError, naming
    the setting ``key``, unless that is a ``core.Estimator`` whose ``requires`` and hyperparameters are
    valid (with where in the user's code a call or import failed)."""
    found = resolve(key, name, core.PRESETS, "estimator (a pgjax.core.Estimator)")
    if not isinstance(found, core.Estimator) and callable(found):
        try:
            found = found()
        except Exception as error:      # the user's code
            raise ValueError(f"{key}={name!r}: calling it with no arguments raised {located_error(error)}") from None
    if not isinstance(found, core.Estimator):
        raise ValueError(f"{key}={name!r} is {described_value(found)}, not an estimator: subclass "
                         "pgjax.core.Estimator (docs/estimators.md)")
    try:
        core.estimator.requirements(found)
        found.check_hparams(found.hparams)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{key}={name!r}: {error}") from None
    return found
