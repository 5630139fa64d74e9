"""The task section (``task``): which task a run trains on and the task's own options (``options``),
how each prompt reaches the model (``prompt``), what the training reward is (``reward``) and the tools
of multi-turn episodes (``tools``), each a section of its own."""
from __future__ import annotations

import dataclasses
import math

from pgjax.agents import TOOLS
from pgjax.checks import MAX_SECONDS, ConfigError, check_types, require
from pgjax.plugins import is_import_path
from pgjax.tasks import option_defaults, task_factory

CHAT_TEMPLATE = ("auto", "none")
NORMALIZE = ("none", "batch")      # how a learned reward's scores are scaled: as they are, whitened over the batch
OPTIONS = "task.options."       # a task's own options' keys: task.options.<name>, values read as JSON


def with_escapes(text: str) -> str:
    """``text`` with ``\\n`` and ``\\t`` read as a line break and a tab (how a command line writes them)."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def _split(text: str) -> tuple[str, ...]:
    """``text`` split at its commas, each part stripped; () for an empty text."""
    return tuple(part.strip() for part in text.split(",")) if text else ()


@dataclasses.dataclass(frozen=True)
class PromptSection:
    """How each prompt reaches the model and where a response ends (``task.prompt``).
    ``chat_template``: ``auto`` puts each prompt through the tokenizer's chat template when it has one
    (as the user's turn, after ``system_prompt`` if set; responses then also stop at the template's
    end-of-turn token), ``none`` gives the model the prompt as plain text. ``template``: how each
    prompt is written for the model, its ``{prompt}`` replaced by the task's prompt (a base model
    without a chat template: ``"Question: {prompt}\\nAnswer:"``, ``\\n`` a line break; under a chat
    template, the user turn's text). ``stop_text``: comma-separated texts (``\\n`` a line break) any
    token holding one of which ends a response too, as EOS does (``"\\n"``: a base model's answer
    ends with its line, instead of going on to pose the next question)."""
    chat_template: str = "auto"
    system_prompt: str = ""
    template: str = "{prompt}"
    stop_text: str = ""

    def __post_init__(self):
        check_types(self, "task.prompt.")
        require(self.chat_template in CHAT_TEMPLATE, "task.prompt.chat_template", self.chat_template,
                f"one of {', '.join(CHAT_TEMPLATE)}")
        require(self.template.count("{prompt}") == 1, "task.prompt.template", self.template,
                "a text holding {prompt} once, e.g. 'Question: {prompt}\\nAnswer:'")
        require(all(self.stop_texts), "task.prompt.stop_text", self.stop_text,
                "comma-separated texts, none empty (escapes \\n and \\t allowed)")

    @property
    def stop_texts(self) -> tuple[str, ...]:
        """``stop_text`` split at its commas, each with its escapes read (``with_escapes``)."""
        return tuple(with_escapes(part) for part in self.stop_text.split(",")) if self.stop_text else ()

    @property
    def frame(self) -> str:
        """``template`` with its escapes read (``with_escapes``: ``--set`` gives ``\\n`` as two characters)."""
        return with_escapes(self.template)


@dataclasses.dataclass(frozen=True)
class RewardSection:
    """The training reward (``task.reward``). ``function``: the import path of your own reward function
    (``fn(prompts, completions, **fields)``) to train on instead of the task's verifier (accuracy is
    still the verifier's); ``format_weight`` adds the task's format reward. ``timeout``: the seconds
    each call of the reward function (or the task's verifier) may take; one that has not returned by
    then stops the run with an error naming it (0: no limit; a function stuck in C code that holds
    the GIL cannot be interrupted, so then the limit cannot fire either). ``model``: a trained reward
    model (a ``stage="reward_model"`` run, or a transformers sequence classifier) whose score joins
    the training reward: ``verifier_weight`` x the reward above + ``model_weight`` x the score,
    whitened over the step's responses with ``model_normalize="batch"``
    (``pgjax.train.learned_reward``); accuracy is still the verifier's, and the record adds the score
    and its agreement with the verifier."""
    function: str = ""
    format_weight: float = 0.0
    timeout: float = 0.0
    model: str = ""
    model_weight: float = 1.0
    model_normalize: str = "none"
    verifier_weight: float = 1.0

    def __post_init__(self):
        check_types(self, "task.reward.")
        for name in ("format_weight", "model_weight", "verifier_weight"):
            require(math.isfinite(getattr(self, name)), f"task.reward.{name}", getattr(self, name), "a finite number")
        require(self.model_normalize in NORMALIZE, "task.reward.model_normalize", self.model_normalize,
                f"one of {', '.join(NORMALIZE)}")
        require(0 <= self.timeout <= MAX_SECONDS, "task.reward.timeout", self.timeout,
                f"finite seconds >= 0 (0: no limit), at most {MAX_SECONDS:.0f}")


@dataclasses.dataclass(frozen=True)
class ToolsSection:
    """The tools of multi-turn episodes (``task.tools``; ``rollout.max_turns`` and the episode budgets
    are the rollout's). ``names``: comma-separated tools the policy may call, each ``calculator`` or
    ``python`` (``pgjax.agents.TOOLS``) or the import path of a tool class or factory of your own,
    called with no arguments (a ``pgjax.agents.Tool``: docs/extending.md): the task's prompt opens the
    episode, each call's result comes back as an observation, and the task's verifier scores the first
    reply that calls no tool (docs/agents.md). Empty: single-turn rollouts."""
    names: str = ""

    def __post_init__(self):
        check_types(self, "task.tools.")
        require(all(name in TOOLS or is_import_path(name) for name in self.listed), "task.tools.names", self.names,
                f"comma-separated tools, each one of {', '.join(TOOLS)} or the import path package.module:name of "
                "your own (empty: none)")

    @property
    def listed(self) -> tuple[str, ...]:
        """``names`` split at its commas (empty: no tools)."""
        return _split(self.names)


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """``name``: a task of ``pgjax.tasks.TASKS`` or the import path ``package.module:factory`` of
    your own. ``options``: the task's own options by name, the keyword arguments its factory is
    called with (``--set task.options.NAME=VALUE``, the value read as JSON where it parses, else kept
    as text); an option it does not take, or one it refuses with TypeError or ValueError, is a
    ConfigError naming ``task.options`` (docs/extending.md); an option left out takes the factory's
    default. The built-in tasks' options: ``arithmetic`` (``digits``, ``ops``), ``arithmetic_mix``
    (1..``digits``-digit operands in equal shares, tagged by difficulty), ``scratchpad_arithmetic``
    (``digits``, ``ops``, ``max_scratch``: the demonstrations' longest free text, ``working``:
    ``before`` or ``after`` the answer), ``countdown`` (``count`` numbers, ``max_number``,
    ``max_target``), ``word_math`` (English arithmetic and word problems for instruct models, answer in
    ``\\boxed{}``: ``digits``, ``ops``, ``word_share`` of word problems, ``answer_from``
    ``boxed_or_last_number`` or ``boxed``, ``held_out``: ``none``, or the held-out evaluation split
    ``templates``, ``numbers`` or ``both``, which the Trainer refuses to train on) or ``jsonl_math`` (a
    user's dataset file at ``path``, ``prompt_field`` holding a prompt string or a list of chat
    messages, ``answer_field``, scored by the math verifier; ``file_format``: ``auto`` (by the suffix:
    ``.parquet``, ``.arrow``, ``.csv``, else JSON Lines), ``jsonl``, ``json``, ``parquet``, ``arrow`` or
    ``csv`` (all but ``jsonl`` read by the ``datasets`` package, local files only); ``extra_fields``:
    comma-separated further columns, passed to the reward functions by name; every record is checked
    before training starts, ``skip_invalid`` leaves bad records out and prints how many instead of
    stopping). Each factory's signature gives its options and their defaults.

    ``prompt`` (``PromptSection``), ``reward`` (``RewardSection``) and ``tools`` (``ToolsSection``):
    how prompts reach the model, the training reward, the tools of multi-turn episodes. In an
    experiment file ``reward="package.module:fn"`` is short for ``RewardSection(function=...)`` and
    ``tools="calculator"`` for ``ToolsSection(names="calculator")``."""
    name: str = "arithmetic"
    options: dict = dataclasses.field(default_factory=dict)
    prompt: PromptSection = PromptSection()
    reward: RewardSection = RewardSection()
    tools: ToolsSection = ToolsSection()

    def __post_init__(self):
        if not isinstance(self.reward, RewardSection):      # reward="package.module:fn": the reward function
            object.__setattr__(self, "reward", RewardSection(function=self.reward))
        if not isinstance(self.tools, ToolsSection):        # tools="calculator": the tools' names
            object.__setattr__(self, "tools", ToolsSection(names=self.tools))
        check_types(self, "task.")
        for name in self.options:
            require(isinstance(name, str) and name.isidentifier(), f"task.options[{name!r}]", name,
                    "an option's name is a Python identifier (a keyword argument of the task's factory)")
        require(bool(self.name), "task.name", self.name, "a registered task or package.module:factory")

    def resolved_options(self) -> dict:
        """The options the task is built with: its factory's default for each option it takes
        (``tasks.option_defaults``), replaced by ``options``; ConfigError naming ``task.name`` for a task
        that does not resolve."""
        return {**option_defaults(factory_of(self.name)), **self.options}

    def option(self, name: str, default=None):
        """The task's option ``name`` (``resolved_options``), else ``default`` (a setting of some tasks
        only, such as ``word_math``'s ``held_out`` or ``jsonl_math``'s ``path``)."""
        return self.resolved_options().get(name, default)


def factory_of(name: str):
    """The factory of the task ``name`` (``tasks.task_factory``); ConfigError naming ``task.name``."""
    try:
        return task_factory(name)
    except ValueError as error:
        raise ConfigError(str(error)) from None
