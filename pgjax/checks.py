"""Configuration checks: ``ConfigError``, a user's configuration mistake said in one line, and the
helpers every configuration section checks its fields with, whichever layer it lives in (the
experiment's sections in ``pgjax.config``, the rollout's ``RolloutConfig``, the sampler's ``Decoding``,
the model's ``ModelConfig``, the learner's ``UpdateConfig``, the optimizer's ``OptimConfig``, the mesh's
and the processes'): ``require`` for a value out of its range, ``check_types`` for a value not of its
field's type. Each names the dotted key (``rollout.temperature``), the value and what is valid:
``rollout.temperature=0.0 is invalid: a finite number > 0``.
"""
from __future__ import annotations

import dataclasses
import math
import threading
import types
import typing

MAX_SECONDS = threading.TIMEOUT_MAX     # the longest wait a thread or timer takes (about 292 years); longer overflows
# what a field of each type takes, as the messages say it
EXPECTED = {int: "an int is expected", float: "a number is expected", bool: "a bool, true or false",
            str: "a str is expected", dict: "a dict is expected"}


class ConfigError(ValueError):
    """A user's configuration mistake, found before anything is written (printed without a traceback).
    Raised by ``require`` and ``check_types``, it also holds the setting at fault: ``key``, ``value``
    and ``valid`` (what it may be), so that a command line that set the value can name its own key
    and text (``pgjax.config.override``); None where the mistake is not one setting's."""

    def __init__(self, message: str, key: str | None = None, value: typing.Any = None, valid: str | None = None):
        super().__init__(message)
        self.key, self.value, self.valid = key, value, valid


def invalid(key: str, value, valid: str) -> ConfigError:
    """The error ``KEY=VALUE is invalid: VALID`` of the setting ``key`` (its ``key``, ``value`` and ``valid`` set)."""
    return ConfigError(f"{key}={value!r} is invalid: {valid}", key, value, valid)


def require(ok: bool, key: str, value, valid: str) -> None:
    """Nothing when ``ok``; else ``invalid(key, value, valid)`` is raised."""
    if not ok:
        raise invalid(key, value, valid)


def fits(value, kind) -> bool:
    """Whether ``value`` is of the field type ``kind`` (an int also for a float, never a bool for a number)."""
    if kind in (int, float) and isinstance(value, bool):
        return False
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        return any(fits(value, k) for k in typing.get_args(kind))
    return isinstance(value, (int, float) if kind is float else typing.get_origin(kind) or kind)


_FIELD_TYPES: dict[type, dict] = {}


def _field_types(section: type) -> dict:
    """The declared type of each field of the dataclass ``section``, resolved once per class."""
    if section not in _FIELD_TYPES:
        _FIELD_TYPES[section] = typing.get_type_hints(section)
    return _FIELD_TYPES[section]


def check_types(config, prefix: str = "") -> None:
    """ConfigError naming the first field of the config section ``config`` (keys ``prefix`` + field),
    nested sections included, whose value is not of the type its field declares: ``steps="10"``,
    ``steps=1.5``, ``seed=True`` or ``task="arithmetic"`` in an experiment file (``--set`` parses each
    value by its type already)."""
    hints = _field_types(type(config))
    for field in dataclasses.fields(config):
        kind, value, key = hints[field.name], getattr(config, field.name), prefix + field.name
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            require(isinstance(value, kind), key, value, f"{kind.__name__}(...) is expected")
            check_types(value, f"{key}.")
        else:
            require(fits(value, kind), key, value, EXPECTED.get(kind, f"a {kind} is expected"))


def check_finite(ok: bool, key: str, value, valid: str) -> None:
    """``require`` for a number that must also be finite: ``valid`` says the rest (``> 0``)."""
    require(ok and math.isfinite(value), key, value, f"a finite number {valid}")
