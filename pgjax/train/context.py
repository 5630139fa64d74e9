"""An experiment's task context: what the Trainer, ``python -m pgjax.eval`` and the benchmarks all
need before they sample a prompt, built in one place (``task_context``).

The context is the task (its prompts and verifier), the tokenizer (the task's own, else the
checkpoint's), the prompt format (``task.prompt.chat_template`` / ``task.prompt.system_prompt`` through the
tokenizer's chat template), the stop tokens (the template's end of turn, the tokenizer's EOS and
every checkpoint's ``generation_config.json`` EOS ids) and the held-out evaluation prompts
(``task.examples(eval_prompts, seed=stream_seed(seed, "eval", 0))``). A dataset task's records are
first fitted to the prompt budget (``fit_prompts``), so every caller draws the same prompts from
the same records. A user's task (``task.name=package.module:factory``) is the user's code: any
exception in it, or a factory that returns no task, is a ConfigError naming ``task.name`` and where
it was raised; ``task.reward.timeout`` limits each call of the task's verifier (``tasks.with_timeout``)
and each step of its environment (``TimedEnvironment``). The tools of ``task.tools.names`` are built here
(``make_tool``: a built-in of ``pgjax.agents.TOOLS`` or a user's by import path) and checked
(``check_tool``) before anything is written.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
from collections.abc import Callable

from pgjax.agents import (
    TOOLS,
    Environment,
    JsonCalls,
    PythonSandbox,
    SandboxUnavailable,
    Step,
    Tool,
    ToolEnvironment,
    call_format_for,
)
from pgjax.checks import ConfigError
from pgjax.config import Experiment, stream_seed
from pgjax.models import hf
from pgjax.parallel import multihost
from pgjax.plugins import is_import_path, resolve
from pgjax.rollout.collect import PromptFormat, prompt_format_for, stop_tokens
from pgjax.rollout.episodes import EpisodeError, checked_step, opening_ids
from pgjax.tasks import (
    Task,
    batch_fields,
    call_reward,
    call_within,
    described_value,
    error_text,
    finite_rewards,
    make_task,
    raised_at,
    reward_name,
    with_timeout,
)

TOOL_FIELDS = ("name", "description", "parameter")     # a pgjax.agents.Tool's str attributes (and __call__)


def user_error(what: str, build, user_code: bool = False):
    """``build()``, with a user's mistake in ``what`` (a bad option, a missing or malformed file) as
    ConfigError naming ``what``; with ``user_code`` (``build`` runs the user's own code) any exception,
    named with the file and line it was raised at."""
    try:
        return build()
    except Exception as error:
        if not (user_code or isinstance(error, (ValueError, TypeError, KeyError, OSError))):
            raise
        where = raised_at(error) if user_code else ""
        raise ConfigError(f"{what}: {where}: {error_text(error)}" if where else f"{what}: {error}") from None


def checked_examples(task, n: int, seed: int) -> list[dict]:
    """``task.examples(n, seed=seed)``; ValueError unless they are n dicts with the same fields, each
    with a str ``prompt``."""
    examples = task.examples(n, seed=seed)
    if not isinstance(examples, list | tuple):
        raise ValueError(f"examples({n}, seed={seed}) returned {described_value(examples)}, not a list of examples")
    if len(examples) != n:
        raise ValueError(f"examples({n}, seed={seed}) returned {len(examples)} examples")
    for i, example in enumerate(examples):
        if not (isinstance(example, dict) and isinstance(example.get("prompt"), str)):
            raise ValueError(f"examples({n}, seed={seed})[{i}] is {described_value(example)}: an example is a dict "
                             "with a str 'prompt'")
    batch_fields(examples)      # every example has the first one's fields
    return list(examples)


class TimedEnvironment:
    """``environment`` whose every ``step`` must return within ``seconds`` (``task.reward.timeout``):
    a late one is the episode's error (``EpisodeError``), its call left running in a daemon thread;
    every other attribute is the environment's own."""

    def __init__(self, environment: Environment, seconds: float):
        self.environment, self.seconds = environment, seconds

    def reset(self, example: dict) -> list[dict]:
        return self.environment.reset(example)

    def step(self, reply: str) -> Step:
        name = type(self.environment).__name__
        return call_within(self.seconds, lambda: checked_step(self.environment, reply), f"{name}.step",
                           lambda: EpisodeError(f"{name}.step did not return within task.reward.timeout="
                                                f"{self.seconds} s"))

    def __getattr__(self, name: str):
        return getattr(self.environment, name)


class TimedTask:
    """``task`` whose verifier ``reward_fn`` must return within ``seconds`` (``tasks.with_timeout``);
    every other attribute is the task's own."""

    def __init__(self, task, seconds: float):
        self.task, self.reward_fn = task, with_timeout(task.reward_fn, seconds)

    def __getattr__(self, name: str):
        return getattr(self.task, name)


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """``task``; ``tokenizer``; ``prompt_format`` (how a prompt becomes the model's input text);
    ``eos_ids``, the tokens that end a response, and ``end_id``, the one that ends a demonstration;
    ``eval_examples``, the held-out prompts (every process's); ``environment``: for multi-turn
    episodes, what makes one episode's environment (``environment_factory``), else None."""
    task: Task      # the task, a TimedTask under task.reward.timeout
    tokenizer: object
    prompt_format: PromptFormat
    eos_ids: tuple[int, ...]
    end_id: int
    eval_examples: list[dict]
    environment: Callable[[], Environment] | None = None

    def render(self, prompts: list[str]) -> list[str]:
        """The model's input text of each prompt."""
        return self.prompt_format.render(self.tokenizer, prompts)


def task_context(exp: Experiment, checkpoint: str | pathlib.Path = "", fit_to: int | None = None) -> TaskContext:
    """The task context of ``exp``: its task with the task section's options; the task's tokenizer,
    else ``checkpoint``'s (default ``model.path``; ConfigError when neither has one); the stop tokens
    of the tokenizer and of ``checkpoint`` and ``model.path``; ``exp.eval_prompts`` held-out prompts
    drawn with ``exp.seed``. ``fit_to``: the prompt budget a dataset task's records are fitted to
    before any is drawn (None: not fitted). Every user mistake (an option, a file, a template)
    raises ConfigError; a summary of records left out (``task.options.skip_invalid``) is printed. With
    ``task.reward.timeout`` the task is a ``TimedTask``. A task with an environment has its episodes'
    openings checked against ``fit_to`` too (``check_openings``)."""
    t = exp.task
    checkpoint = checkpoint or exp.model.path
    user_code = ":" in t.name           # a user's task by import path: anything it raises is a mistake in it
    what = f"task.name={t.name!r}" if user_code else "task"
    in_task = lambda build: user_error(what, build, user_code)     # noqa: E731
    task = in_task(lambda: make_task(t.name, t.options))
    in_task(lambda: checked_examples(task, 1, seed=0))          # a malformed dataset fails here, first
    tokenizer = in_task(task.tokenizer)
    if tokenizer is not None and not (hasattr(tokenizer, "eos_token_id") and callable(tokenizer)):
        raise ConfigError(f"{what}: tokenizer() returned {described_value(tokenizer)}, not a Hugging Face "
                          "tokenizer (or None, for the checkpoint's)")
    if tokenizer is None:
        if not checkpoint:
            raise ConfigError(f"task.name={t.name!r} has no tokenizer of its own: set model.path to a "
                              "checkpoint directory with one")
        tokenizer = user_error("model.path", lambda: hf.load_tokenizer(checkpoint))
    prompt_format = user_error("task", lambda: prompt_format_for(tokenizer, t.prompt.chat_template,
                                                                 t.prompt.system_prompt, t.prompt.frame))
    eos_ids, end_id = user_error("model.path", lambda: stop_tokens(tokenizer, prompt_format,
                                                                   dict.fromkeys((str(checkpoint), exp.model.path)),
                                                                   t.prompt.stop_texts))
    if fit_to is not None and hasattr(task, "fit_prompts"):
        render = lambda prompts: prompt_format.render(tokenizer, prompts)     # noqa: E731
        in_task(lambda: task.fit_prompts(tokenizer, fit_to, render, prompt_format.special_tokens))
    summary = in_task(lambda: task.summary() if hasattr(task, "summary") else None)
    if summary and multihost.is_primary():
        print(f"dataset {summary}", file=sys.stderr)
    eval_examples = in_task(lambda: checked_examples(task, exp.eval_prompts, stream_seed(exp.seed, "eval", 0)))
    if t.reward.timeout:
        task = TimedTask(task, t.reward.timeout)
    environment, prompt_format = environment_factory(exp, task, tokenizer, prompt_format)
    if environment is not None and fit_to is not None:       # the environment is the user's code, whatever the task
        user_error(what, lambda: check_openings(environment, eval_examples, tokenizer, prompt_format, fit_to), True)
    return TaskContext(task, tokenizer, prompt_format, eos_ids, end_id, eval_examples, environment)


def check_openings(environment, examples: list[dict], tokenizer, prompt_format: PromptFormat, width: int) -> None:
    """The environment's opening messages for ``examples`` (the tool prompt and the task's prompt)
    fit the prompt budget ``width`` (``task_context``'s ``fit_to``): ValueError naming the longest,
    before anything is written."""
    longest = max(map(len, opening_ids(tokenizer, prompt_format, [environment().reset(e) for e in examples])))
    if longest > width:
        raise ValueError(f"the environment's opening messages take up to {longest} tokens (with the tool prompt), "
                         f"more than rollout.max_prompt_tokens={width}: raise it")


def is_tool(value) -> bool:
    """Whether ``value`` has the ``pgjax.agents.Tool`` interface: str ``name``, ``description`` and
    ``parameter``, and a ``__call__(arguments)``; a class is not a tool (its instances may be)."""
    return (not isinstance(value, type) and callable(value)
            and all(isinstance(getattr(value, field, None), str) for field in TOOL_FIELDS))


def make_tool(name: str) -> Tool:
    """The tool ``name`` of ``task.tools.names``: a built-in (``pgjax.agents.TOOLS``) or the object at the import
    path ``name`` (``pgjax.plugins.resolve``), called with no arguments unless it is a tool already;
    checked by ``check_tool``. ConfigError naming ``task.tools.names`` for a path that does not import, a
    factory that raises (where in the user's code) or something that is not a tool."""
    try:
        factory = resolve("task.tools.names", name, TOOLS, "tool (a pgjax.agents.Tool class or factory)")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    tool = factory if is_tool(factory) else user_error(f"task.tools.names={name}", factory, is_import_path(name))
    check_tool(tool, name)
    return tool


def check_tool(tool, name: str = "") -> None:
    """A tool of ``task.tools.names`` (``name``, default the tool's own) before anything is written: one without
    the ``pgjax.agents.Tool`` interface is a ConfigError naming it (``is_tool``), and so is a sandboxed
    tool whose layers this machine cannot set up (tried once: ``SandboxUnavailable``), not an error in
    every episode."""
    if not is_tool(tool):
        missing = [field for field in TOOL_FIELDS if not isinstance(getattr(tool, field, None), str)]
        lacks = ", ".join([*(f"a str {field}" for field in missing), *([] if callable(tool) else ["__call__"])]
                          ) or "an instance (it is a class)"
        raise ConfigError(f"task.tools.names={name}: it gave {described_value(tool)}, not a tool: it lacks {lacks} "
                          "(see pgjax.agents.Tool)")
    if isinstance(tool, PythonSandbox):
        try:
            tool.run("pass")
        except SandboxUnavailable as error:
            raise ConfigError(f"task.tools.names={name or tool.name}: {error}") from None


def environment_factory(exp: Experiment, task, tokenizer, prompt_format: PromptFormat
                        ) -> tuple[Callable[[], Environment] | None, PromptFormat]:
    """What makes an episode's environment, and the prompt format it needs: with ``task.tools.names`` a
    ``ToolEnvironment`` of those tools whose final answer the task's verifier scores, in the call
    convention of the tokenizer's chat template (``call_format_for``; a template that takes tools
    gets their schemas); else the task's own ``environment`` (a factory) if it has one; else None
    (single-turn rollouts), which ``rollout.max_turns`` > 1 refuses. With ``task.reward.timeout`` each
    environment is a ``TimedEnvironment``."""
    t = exp.task
    factory: Callable[[], Environment] | None
    if t.tools.names:
        calls = call_format_for(getattr(tokenizer, "chat_template", None) if prompt_format.chat else None)
        tools = [make_tool(name) for name in t.tools.listed]
        names = [tool.name for tool in tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"task.tools.names={t.tools.names!r}: two tools have the same name "
                              f"({', '.join(names)}); the policy calls a tool by its name")
        if isinstance(calls, JsonCalls):
            prompt_format = dataclasses.replace(prompt_format, tools=json.dumps(JsonCalls.schemas(tools)))

        def answer_reward(example: dict, reply: str) -> float:
            fields = {k: [v] for k, v in example.items() if k != "prompt"}
            raw = call_reward(task.reward_fn, [example["prompt"]], [reply], **fields)
            return float(finite_rewards(raw, reward_name(task.reward_fn), [example["prompt"]], [reply], "error")[0][0])

        factory = lambda: ToolEnvironment(tools, answer_reward, calls)       # noqa: E731
    else:
        factory = getattr(task, "environment", None)
    if factory is None and exp.rollout.max_turns > 1:
        raise ConfigError(f"rollout.max_turns={exp.rollout.max_turns} needs an environment: set task.tools.names, "
                          f"or give task {t.name!r} an environment() of its own (docs/agents.md)")
    if factory is not None and t.reward.timeout:
        return (lambda: TimedEnvironment(factory(), t.reward.timeout)), prompt_format
    return factory, prompt_format
