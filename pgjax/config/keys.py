"""An experiment's settings by dotted key (``rollout.temperature``): every key (``valid_keys``), the
values a run resolves them to (``resolved``, what ``--print-config`` lists), ``--set key=value``
(``override``), the hint for an unknown or renamed key (the closest valid one, or its new name:
``RENAMED``), and a run's saved experiment read with today's keys (``upgraded``)."""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing

from pgjax import core
from pgjax.checks import ConfigError, invalid, require
from pgjax.config.sections import HPARAMS, AlgorithmSection, Experiment
from pgjax.config.task import OPTIONS, TaskSection
from pgjax.tasks import accepted_options, option_defaults, task_factory

# the task's own options, once fields of the task section: task.<name> is task.options.<name>
TASK_OPTIONS = ("digits", "ops", "max_scratch", "working", "count", "path", "prompt_field", "answer_field",
                "extra_fields", "file_format", "skip_invalid", "word_share", "answer_from", "held_out")
RENAMED = {"model.layers": "model.num_hidden_layers", "model.heads": "model.num_attention_heads",
           "model.kv_heads": "model.num_key_value_heads", "task.dataset": "task.options.path",
           "task.numbers": "task.options.count", "algorithm": "algorithm.preset", "hparams": "algorithm.hparams",
           "update.correction": "algorithm.correction", "update.correction_mode": "algorithm.correction_mode",
           **{f"task.{name}": f"{OPTIONS}{name}" for name in TASK_OPTIONS},
           "task.chat_template": "task.prompt.chat_template", "task.system_prompt": "task.prompt.system_prompt",
           "task.prompt_template": "task.prompt.template", "task.stop_text": "task.prompt.stop_text",
           "task.reward": "task.reward.function", "task.format_weight": "task.reward.format_weight",
           "task.reward_timeout": "task.reward.timeout", "task.reward_model": "task.reward.model",
           "task.reward_model_weight": "task.reward.model_weight",
           "task.reward_model_normalize": "task.reward.model_normalize",
           "task.verifier_weight": "task.reward.verifier_weight", "task.tools": "task.tools.names"}


def renamed(key: str) -> str | None:
    """The key an old ``key`` is now called (``RENAMED``, and ``hparams.NAME`` -> ``algorithm.hparams.NAME``)."""
    head, _, rest = key.partition(".")
    if key in RENAMED:
        return RENAMED[key]
    return f"{RENAMED[head]}.{rest}" if head == "hparams" and rest else None


def closest(name: str, names: list[str]) -> list[str]:
    """The names a mistyped ``name`` most likely meant: up to two that begin with it at its depth (a name
    cut short), else the closest spelling (difflib, ratio >= 0.6), else none."""
    depth = name.count(".")
    return ([n for n in names if n.startswith(name) and n.count(".") == depth][:2]
            or difflib.get_close_matches(name, names, n=1, cutoff=0.6))


def section_types(config=Experiment) -> set[type]:
    """``config`` and every config section type it holds, nested ones included (``OptimConfig``, ``LoRASection``)."""
    found = {config}
    for field in dataclasses.fields(config):
        kind = _field_type(config, field.name)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            found |= section_types(kind)
    return found


SECTIONS = {
    "algorithm": "the estimator: a preset of core.PRESETS, its traced hyperparameters, the off-policy correction",
    "model": "the policy: a local Hugging Face checkpoint (path) or a new model's architecture",
    "task": "a registered task or package.module:factory, its options, its prompts (prompt), reward, tools",
    "rollout": "K samples per prompt, token budgets, temperature / top-k / top-p, DAPO-style options",
    "update": "epochs, minibatches and micro-batches of each update, scoring temperature, value clip",
    "optim": "the policy's AdamW: lr, warm-up, betas, eps, weight decay, gradient clipping",
    "critic_optim": "the critic's AdamW (PPO, REINFORCE with a baseline)",
    "warm_start": "supervised warm start before RL: steps, batch size, its optimizer",
    "logging": "TensorBoard and Weights & Biases writers, sinks of your own, progress lines when not on a terminal",
    "mesh": "device mesh sizes: data, fsdp, tensor (-1 = the rest)",
    "distributed": "how the processes of a multi-host run meet (jax.distributed)",
    "reward_model": "with stage=reward_model / process_reward_model: the pairs or step labels it trains on",
}


def sections() -> dict[str, str]:
    """Each section of ``Experiment`` (a nested config) with its one-line summary."""
    hints = typing.get_type_hints(Experiment)
    return {f.name: SECTIONS[f.name] for f in dataclasses.fields(Experiment) if dataclasses.is_dataclass(hints[f.name])}


def valid_keys(config=Experiment, prefix: str = "") -> list[str]:
    """Every dotted key ``override`` accepts."""
    keys = []
    for field in dataclasses.fields(config):
        kind = _field_type(config, field.name)
        if dataclasses.is_dataclass(kind):
            keys += valid_keys(kind, f"{prefix}{field.name}.")
        elif field.name == "hparams" and config is AlgorithmSection:
            keys += [f"{prefix}hparams.{name}" for name in core.algorithms.field_names(core.HParams)]
        elif field.name == "estimator" and config is AlgorithmSection:
            continue        # an object: Python only (the command line names one by import path, preset)
        else:
            keys.append(prefix + field.name)
    return keys


def resolved(exp: Experiment) -> dict:
    """Every key with the value this experiment runs with (``algorithm.hparams`` as the preset resolves
    them, and each ``task.options.NAME`` the task is built with)."""
    out: dict[str, typing.Any] = {}
    for key in valid_keys():
        if key.startswith(HPARAMS):
            continue
        value: typing.Any = exp
        for part in key.split("."):
            value = getattr(value, part)
        out[key] = value
    estimator = exp.algorithm.build()
    if exp.algorithm.estimator is not None:
        out["algorithm.estimator"] = estimator_label(estimator)
    out.update({f"{HPARAMS}{name}": float(value) for name, value in core.hparam_items(estimator.hparams).items()})
    out.update({f"{OPTIONS}{name}": value for name, value in _task_options(exp.task).items()})
    return out


def _task_options(task: TaskSection) -> dict:
    """The options ``task`` is built with (``resolved_options``), or only those set where its factory
    does not import (which a run's ``validate`` reports; ``--print-config`` lists what it can)."""
    try:
        return task.resolved_options()
    except ConfigError:
        return task.options


def upgraded(record: dict) -> dict:
    """An experiment record (a run's experiment.json, ``dataclasses.asdict`` of an ``Experiment``) in
    this version's layout: the task section's fields an earlier version held flat moved to their
    sub-sections and ``task.options`` (``RENAMED``), and the task's options left as they act: those
    at their factory's default (the same task as left out) dropped, and of the options a built-in
    task's section once held for every task, those its factory does not take."""
    task = dict(record.get("task") or {})
    options = dict(task.pop("options", None) or {})
    for field in [f for f in task if f"task.{f}" in RENAMED and not isinstance(task[f], dict)]:
        section, name = RENAMED[f"task.{field}"].split(".")[1:]
        value = task.pop(field)
        if section == "options":
            options.setdefault(name, value)
        else:
            task[section] = {**task.get(section, {}), name: value}
    return {**record, "task": {**task, "options": _acting(task.get("name", ""), options)}}


def _acting(name: str, options: dict) -> dict:
    """``options`` of the task ``name`` without those at its factory's default, and, of the options the
    task section once held as fields (``TASK_OPTIONS``), without those it does not take; all of them
    where the task does not resolve here."""
    try:
        factory = task_factory(name)
    except ValueError:
        return options
    accepted, defaults = accepted_options(factory), option_defaults(factory)
    return {k: v for k, v in options.items() if not (k in defaults and defaults[k] == v)
            and (accepted is None or k in accepted or k not in TASK_OPTIONS)}


def estimator_label(estimator: core.Estimator) -> str:
    """What names an estimator object in a run's records: ``module:class`` and its name."""
    kind = type(estimator)
    return f"{kind.__module__}:{kind.__qualname__} ({estimator.name})"


def override(experiment: Experiment, assignments: list[str]) -> Experiment:
    """Apply ``key=value`` strings, all at once (each section is rebuilt once, so the order of the
    assignments does not matter); ConfigError for an unknown key, a value of the wrong type or out of
    its range."""
    keys = valid_keys()
    changes, texts = {}, {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        key, text = key.strip(), text.strip()
        if not sep:
            raise ConfigError(f"--set expects key=value, got {assignment!r}")
        if key not in keys and not key.startswith((HPARAMS, OPTIONS)):     # an estimator or a task of the
            raise _unknown_key(key, keys)                                   # user's names its own
        path = tuple(key.split("."))
        if key.startswith(OPTIONS):
            require(len(path) == 3 and path[2].isidentifier(), key, text,
                     f"{OPTIONS}NAME=VALUE sets the task's own option NAME (a Python identifier)")
            changes[path] = _json_value(text)
            texts[key] = text
            continue
        changes[path] = _parse(text, float if key.startswith(HPARAMS) else _key_type(path), key)
        texts[key] = text
    try:
        changed = _apply(experiment, changes)
    except ConfigError as error:
        raise _as_set(error, texts, keys) from None
    except (ValueError, TypeError) as error:
        named = [k for k in texts if k.split(".")[-1] in str(error)] or list(texts)
        raise ConfigError(", ".join(f"{k}={texts[k]!r}" for k in named) + f" is invalid: {error}") from None
    unknown = [key for key in texts if key not in keys and not key.startswith(OPTIONS)]
    if unknown and changed.algorithm.estimator is None and changed.algorithm.preset in core.PRESETS:
        raise _unknown_key(unknown[0], keys)
    return changed


def _as_set(error: ConfigError, texts: dict[str, str], keys: list[str]) -> ConfigError:
    """A section's ``error`` naming the key that was set: a section at several keys names its field by
    its type (``OptimConfig.lr``), the command line by the key set (``warm_start.optim.lr``)."""
    if error.key is None or error.valid is None or error.key in keys:
        return error
    field = error.key.rsplit(".", 1)[-1]
    named = [key for key in texts if key.endswith(f".{field}")]
    return invalid(named[0], error.value, error.valid) if named else error


def _unknown_key(key: str, keys: list[str]) -> ConfigError:
    """The error of an unknown ``key``, with the closest of ``keys`` (or the new name of a renamed one)."""
    new_name = renamed(key)
    close = [new_name] if new_name else [k for k in keys if k.endswith("." + key)][:2] or closest(key, keys)
    close = [f"{OPTIONS}{key.rsplit('.', 1)[-1]}" if k == OPTIONS[:-1] and key.count(".") == 2 else k for k in close]
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}\n(--print-config lists every key and its value)")


def _key_type(path: tuple[str, ...]):
    config = Experiment
    for part in path[:-1]:
        config = _field_type(config, part)
    return _field_type(config, path[-1])


def _apply(config, changes: dict):
    """``config`` with ``changes`` ({field path: value}) made, one ``replace`` per nested config."""
    fields = {}
    for head in dict.fromkeys(path[0] for path in changes):
        below = {path[1:]: value for path, value in changes.items() if path[0] == head and len(path) > 1}
        if head == "hparams" and isinstance(config, AlgorithmSection):
            fields[head] = {**config.hparams, **{path[0]: value for path, value in below.items()}}
        elif head == "options" and isinstance(config, TaskSection) and below:
            fields[head] = {**changes.get((head,), config.options), **{path[0]: value for path, value in below.items()}}
        elif below:
            fields[head] = _apply(getattr(config, head), below)
        else:
            fields[head] = changes[(head,)]
    return dataclasses.replace(config, **fields)


def _field_type(config: type, name: str):
    return typing.get_type_hints(config)[name]


def _json_value(text: str):
    """``text`` read as JSON where it parses (``3``, ``0.5``, ``true``, ``[1, 2]``, ``{"a": 1}``, ``"x"``),
    else the text itself (``--set task.options.mode=fast``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parse(text: str, kind, key: str):
    if kind is dict:        # a whole dict (task.options): a JSON object
        value = _json_value(text)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={text!r} is invalid: a JSON object is expected, e.g. '{{\"name\": 1}}'")
        return value
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ConfigError(f"{key}={text!r} is invalid: a bool, true or false")
        return text.lower() in ("true", "1")
    if isinstance(kind, types.UnionType):
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{key}={text!r} is invalid: {'a number' if kind is float else f'an {kind.__name__}'} "
                          "is expected") from None
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{key}={text!r} is invalid: a finite number is expected")
    return value

