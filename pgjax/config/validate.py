"""The checks that need several sections of an experiment, or the world outside it (files, imports,
the machine's memory): ``validate``, run before anything is written."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import typing

from pgjax import core
from pgjax.agents import TOOLS
from pgjax.checks import EXPECTED, ConfigError, fits, require
from pgjax.config.sections import Experiment
from pgjax.config.task import OPTIONS, TaskSection, factory_of
from pgjax.parallel.mesh import check_divisible_rows
from pgjax.plugins import resolve
from pgjax.tasks import FILE_FORMATS, accepted_options, located_error, make_task, reader_format, reward_function


def validate(exp: Experiment, mesh) -> None:
    """The checks that need several sections (each section checks its own fields): the algorithm and
    its hyperparameters (a KL coefficient only where there is a KL term), a group baseline's K >= 2, the
    scoring temperature equal to the sampling one, every batch size (split over ``mesh``), the task
    (importing a user's task or reward module) and the options it takes, and the files a run reads.
    Raises ConfigError; writes nothing. What the run holds against the machine's memory is the
    learner's to say (``pgjax.train.memory.check_memory``, which the Trainer runs next)."""
    algo = exp.algorithm.build()
    _check_estimator(exp, algo)
    if exp.update.temperature != exp.rollout.temperature:
        raise ConfigError(f"update.temperature={exp.update.temperature} differs from rollout.temperature="
                          f"{exp.rollout.temperature}: the update would score another policy than the one that "
                          "sampled; set both")
    check_batches(exp, mesh)
    _check_episodes(exp, algo)
    _check_task_options(exp.task, factory_of(exp.task.name))
    try:
        if exp.task.reward.function:
            reward_function(exp.task.reward.function)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    _check_tools(exp)
    if exp.model.path and not (pathlib.Path(exp.model.path) / "config.json").is_file():
        raise ConfigError(f"model.path={exp.model.path!r}: no Hugging Face checkpoint there (config.json missing)")
    _check_context(exp)
    if exp.task.name == "jsonl_math":
        _check_dataset_file(exp.task.resolved_options())
    if exp.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("logging.wandb=True needs the wandb package: pip install -e '.[wandb]'")


def _check_estimator(exp: Experiment, algo: core.Estimator) -> None:
    """The estimator against the run: K samples per prompt at least its ``min_group_size``, its
    hyperparameters in range for K, a preset's KL coefficient only where it has a KL term, and an
    estimator of the user's following the protocol (``core.check_estimator``: it traces, returns a
    scalar, and with ``update.micro_batches`` > 1 is additive over micro-batches)."""
    k = exp.rollout.samples_per_prompt
    if k < algo.min_group_size:
        raise ConfigError(f"rollout.samples_per_prompt={k} is invalid for {algo.name}: its group baseline "
                          f"compares K >= {algo.min_group_size} responses per prompt")
    try:
        algo.check_hparams(algo.hparams, k)
    except ValueError as error:
        raise ConfigError(f"algorithm.hparams: {error}") from None
    if isinstance(algo, core.Algorithm):
        if algo.spec.kl_placement == "none" and float(algo.hparams.kl_coef) != 0:
            raise ConfigError(f"algorithm.hparams.kl_coef={float(algo.hparams.kl_coef)} does nothing for "
                              f"{exp.algorithm.preset}: its preset has no KL term (use grpo, ppo or reinforce_pp "
                              "for one)")
        return
    try:
        core.check_estimator(algo, k, exp.update.micro_batches)
    except ValueError as error:
        raise ConfigError(f"{exp.algorithm.key}: {error}") from None


def _check_episodes(exp: Experiment, algo) -> None:
    """With tools (multi-turn episodes) the environment's rewards are the training reward, and what
    single-turn rollouts add to theirs has no place: ReMax's greedy response, a reward function of
    the user's, the format reward, the overlong penalty."""
    tools, reward = exp.task.tools.names, exp.task.reward
    if not tools:
        return
    conflicts = [("greedy_rewards" in algo.requires, f"{exp.algorithm.key} (a greedy baseline)"),
                 (bool(reward.function), f"task.reward.function={reward.function!r}"),
                 (reward.format_weight != 0, f"task.reward.format_weight={reward.format_weight}"),
                 (exp.rollout.overlong_buffer > 0, f"rollout.overlong_buffer={exp.rollout.overlong_buffer}")]
    for conflict, setting in conflicts:
        if conflict:
            raise ConfigError(f"{setting} is not supported with task.tools.names={tools!r}: in a multi-turn "
                              "episode the environment's rewards are the training reward")


def _check_task_options(t: TaskSection, factory) -> None:
    """The task's own options (``task.options``) against its ``factory``, before anything is written:
    each a keyword it takes (ConfigError naming the option and what the task takes), of the type its
    signature declares where that is a plain int, float, bool or str (``checks.fits``), and the task
    built with them (``tasks.make_task``; the task context builds it again), where a TypeError or
    ValueError it raises is a ConfigError naming ``task.options`` (any other exception, one naming
    ``task.name``), with where in the user's code."""
    accepted = accepted_options(factory)
    for name, value in t.options.items():
        if accepted is not None and name not in accepted:
            raise ConfigError(f"{OPTIONS}{name}={value!r} does nothing for task {t.name!r}, which takes "
                              f"{', '.join(accepted) or 'no options'}")
        kind = _declared_types(factory).get(name, object)
        require(kind not in EXPECTED or fits(value, kind), f"{OPTIONS}{name}", value, EXPECTED.get(kind, ""))
    if not t.options:
        return
    try:
        make_task(t.name, t.options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"task.options={t.options!r} for task {t.name!r}: {located_error(error)}") from None
    except Exception as error:      # the user's factory failed otherwise
        raise ConfigError(f"task.name={t.name!r}: {located_error(error)}") from None


def _declared_types(factory) -> dict:
    """The types ``factory``'s signature declares for its options (its annotations); {} where they do
    not resolve."""
    try:
        return typing.get_type_hints(factory)
    except Exception:       # an annotation naming what its module does not define: no types to check
        return {}


def _check_tools(exp: Experiment) -> None:
    """Each tool of ``task.tools.names`` named by import path imports (``pgjax.plugins.resolve``); that it is
    a tool is checked where the task context builds it (``context.make_tool``), before anything is
    written too."""
    for name in exp.task.tools.listed:
        try:
            resolve("task.tools.names", name, TOOLS, "tool (a pgjax.agents.Tool class or factory)")
        except ValueError as error:
            raise ConfigError(str(error)) from None


def _check_dataset_file(options: dict) -> None:
    """The task option ``file_format`` is one of ``FILE_FORMATS``, ``path`` is a file, and the package
    its format needs (``tasks.reader_format``) is installed."""
    path, file_format = options.get("path", ""), options.get("file_format", "auto")
    require(file_format in FILE_FORMATS, f"{OPTIONS}file_format", file_format, f"one of {', '.join(FILE_FORMATS)}")
    if not pathlib.Path(path).is_file():
        raise ConfigError(f"{OPTIONS}path={path!r}: no such dataset file (jsonl_math reads a dataset file)")
    try:
        reader_format(path, file_format)
    except ImportError as error:
        raise ConfigError(f"{OPTIONS}path={path!r}: {error}") from None


def _check_context(exp: Experiment) -> None:
    """A prompt and its response fit the context of the checkpoint at ``model.path``
    (``max_position_embeddings`` of its config.json; a model built here has no limit but memory)."""
    if not exp.model.path:
        return
    file = pathlib.Path(exp.model.path) / "config.json"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"model.path={exp.model.path!r}: {file} is not a readable JSON file: {error}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"model.path={exp.model.path!r}: {file} holds {type(config).__name__}, not a JSON object")
    context = config.get("max_position_embeddings")
    episodes = bool(exp.task.tools.names)
    response = "rollout.episode_budget()" if episodes else "rollout.max_new_tokens"
    width = exp.rollout.max_prompt_tokens + (exp.rollout.episode_budget() if episodes else exp.rollout.max_new_tokens)
    if context and width > context:
        raise ConfigError(f"rollout.max_prompt_tokens + {response} = {width} exceeds the model's context "
                          f"of {context} tokens (max_position_embeddings in {exp.model.path}/config.json)")


def check_batches(exp: Experiment, mesh) -> None:
    """The one place that checks every batch a run makes: whole prompt groups per micro-batch, and
    each batch split evenly over the mesh's ``data`` x ``fsdp`` devices (ConfigError naming the key)."""
    batches = {"prompts_per_step": exp.prompts_per_step, "eval_prompts": exp.eval_prompts}
    if exp.warm_start.steps:
        batches["warm_start.batch_size"] = exp.warm_start.batch_size
    try:
        exp.update.check(exp.prompts_per_step, exp.rollout.samples_per_prompt, mesh)
        for what, rows in batches.items():
            check_divisible_rows(rows, mesh, what)
    except ValueError as error:
        raise ConfigError(str(error)) from None


