"""The task section: which task a run trains on and its own options, how each prompt reaches the
model, what the reward is, and the tools of multi-turn episodes."""
from __future__ import annotations

import dataclasses
import math

from pgjax.agents import TOOLS
from pgjax.checks import MAX_SECONDS, check_types, require
from pgjax.plugins import is_import_path
from pgjax.tasks import FILE_FORMATS

CHAT_TEMPLATE = ("auto", "none")
NORMALIZE = ("none", "batch")      # how a learned reward's scores are scaled: as they are, whitened over the batch
# the task section's keys that say how a prompt reaches the model and where a response ends (not the
# task factory's options; a pgjax.eval report records them beside those)
PROMPT_KEYS = ("chat_template", "system_prompt", "prompt_template", "stop_text")
OPTIONS = "task.options."       # a task's own options' keys: task.options.<name>, values read as JSON
# the task section's keys that mix a learned reward into the training reward (pgjax.train.learned_reward)
REWARD_KEYS = ("reward_model", "reward_model_weight", "reward_model_normalize", "verifier_weight")


@dataclasses.dataclass(frozen=True)
class TaskSection:
    """``name``: a task of ``pgjax.tasks.TASKS`` or the import path ``package.module:factory`` of
    your own; the factory receives the fields below that its signature names, and ``options``, a dict
    of the task's own options by name (``--set task.options.NAME=VALUE``, the value read as JSON where
    it parses, else kept as text), every one of which it must take: a factory that raises TypeError or
    ValueError for them is a ConfigError naming ``task.options`` (docs/extending.md). Built-in tasks:
    ``arithmetic`` (``digits``, ``ops``), ``arithmetic_mix`` (1..``digits``-digit operands in equal
    shares, tagged by difficulty), ``scratchpad_arithmetic`` (``digits``, ``ops``, ``max_scratch``: the
    demonstrations' longest free text, ``working``: ``before`` or ``after`` the answer), ``countdown``
    (``count`` numbers), ``word_math`` (English arithmetic and word problems for instruct models,
    answer in ``\\boxed{}``: ``digits``, ``ops``, ``word_share`` of word problems, ``answer_from``
    ``boxed_or_last_number`` or ``boxed``) or ``jsonl_math`` (a user's dataset file at ``path``,
    ``prompt_field`` holding a prompt string or a list of chat messages, ``answer_field``, scored by
    the math verifier; ``file_format``: ``auto`` (by the suffix: ``.parquet``, ``.arrow``, ``.csv``,
    else JSON Lines), ``jsonl``, ``json``, ``parquet``, ``arrow`` or ``csv`` (all but ``jsonl`` read
    by the ``datasets`` package, local files only); ``extra_fields``: comma-separated further
    columns, passed to the reward functions by name; every record is checked before training
    starts, ``skip_invalid`` leaves bad records out and prints how many instead of stopping).
    ``reward``: the import path of your own reward function (``fn(prompts, completions,
    **fields)``) to train on instead of the task's verifier (accuracy is still the verifier's);
    ``format_weight`` adds the task's format reward. ``chat_template``: ``auto`` puts each prompt
    through the tokenizer's chat template when it has one (as the user's turn, after
    ``system_prompt`` if set; responses then also stop at the template's end-of-turn token),
    ``none`` gives the model the prompt as plain text. ``prompt_template``: how each prompt is written
    for the model, its ``{prompt}`` replaced by the task's prompt (a base model without a chat
    template: ``"Question: {prompt}\\nAnswer:"``, ``\\n`` a line break; under a chat template, the user
    turn's text).
    ``stop_text``: comma-separated texts (``\\n`` a line break) any token holding one of which ends
    a response too, as EOS does (``"\\n"``: a base model's answer ends with its line, instead of
    going on to pose the next question). ``reward_timeout``: the seconds each call of the
    reward function (or the task's verifier) may take; one that has not returned by then stops the run
    with an error naming it (0: no limit; a function stuck in C code that holds the GIL cannot be
    interrupted, so then the limit cannot fire either). ``held_out`` (``word_math``): ``none``, or the held-out
    evaluation split ``templates``, ``numbers`` or ``both``, which the Trainer refuses to train on.
    ``tools``: comma-separated tools the policy may call in multi-turn episodes (``rollout.max_turns``),
    each ``calculator`` or ``python`` (``pgjax.agents.TOOLS``) or the import path of a tool class or
    factory of your own, called with no arguments (a ``pgjax.agents.Tool``: docs/extending.md): the
    task's prompt opens the episode, each call's result comes back as an observation, and the task's
    verifier scores the first reply that calls no tool (docs/agents.md). ``reward_model``: a trained
    reward model (a ``stage="reward_model"`` run, or a transformers sequence classifier) whose score
    joins the training reward:
    ``verifier_weight`` x the reward above + ``reward_model_weight`` x the score, whitened over the
    step's responses with ``reward_model_normalize="batch"`` (``pgjax.train.learned_reward``); accuracy is
    still the verifier's, and the record adds the score and its agreement with the verifier."""
    name: str = "arithmetic"
    digits: int = 2
    ops: str = "+"
    max_scratch: int = 8
    working: str = "before"
    count: int = 3
    path: str = ""
    prompt_field: str = "question"
    answer_field: str = "answer"
    extra_fields: str = ""
    file_format: str = "auto"
    skip_invalid: bool = False
    word_share: float = 0.5
    answer_from: str = "boxed_or_last_number"
    held_out: str = "none"
    reward: str = ""
    format_weight: float = 0.0
    chat_template: str = "auto"
    system_prompt: str = ""
    prompt_template: str = "{prompt}"
    stop_text: str = ""
    reward_timeout: float = 0.0
    tools: str = ""
    reward_model: str = ""
    reward_model_weight: float = 1.0
    reward_model_normalize: str = "none"
    verifier_weight: float = 1.0
    options: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_types(self, "task.")
        for name in self.options:
            require(isinstance(name, str) and name.isidentifier(), f"task.options[{name!r}]", name,
                     "an option's name is a Python identifier (a keyword argument of the task's factory)")
            require(name not in {f.name for f in dataclasses.fields(self)}, f"{OPTIONS}{name}", self.options[name],
                     f"{name} is a field of the task section: set task.{name}")
        require(bool(self.name), "task.name", self.name, "a registered task or package.module:factory")
        require(self.chat_template in CHAT_TEMPLATE, "task.chat_template", self.chat_template,
                 f"one of {', '.join(CHAT_TEMPLATE)}")
        require(self.prompt_template.count("{prompt}") == 1, "task.prompt_template", self.prompt_template,
                 "a text holding {prompt} once, e.g. 'Question: {prompt}\\nAnswer:'")
        require(all(self.stop_texts), "task.stop_text", self.stop_text,
                 "comma-separated texts, none empty (escapes \\n and \\t allowed)")
        require(self.file_format in FILE_FORMATS, "task.file_format", self.file_format,
                 f"one of {', '.join(FILE_FORMATS)}")
        require(math.isfinite(self.format_weight), "task.format_weight", self.format_weight, "a finite number")
        for key in ("reward_model_weight", "verifier_weight"):
            require(math.isfinite(getattr(self, key)), f"task.{key}", getattr(self, key), "a finite number")
        require(self.reward_model_normalize in NORMALIZE, "task.reward_model_normalize", self.reward_model_normalize,
                 f"one of {', '.join(NORMALIZE)}")
        require(0 <= self.reward_timeout <= MAX_SECONDS, "task.reward_timeout", self.reward_timeout,
                 f"finite seconds >= 0 (0: no limit), at most {MAX_SECONDS:.0f}")
        require(all(name in TOOLS or is_import_path(name) for name in self.tool_names), "task.tools", self.tools,
                 f"comma-separated tools, each one of {', '.join(TOOLS)} or the import path package.module:name of "
                 "your own (empty: none)")

    @property
    def tool_names(self) -> tuple[str, ...]:
        """``tools`` split at its commas."""
        return tuple(name.strip() for name in self.tools.split(",")) if self.tools else ()

    @property
    def stop_texts(self) -> tuple[str, ...]:
        """``stop_text`` split at its commas, each with its escapes read (``with_escapes``)."""
        return tuple(with_escapes(part) for part in self.stop_text.split(",")) if self.stop_text else ()

    @property
    def prompt_frame(self) -> str:
        """``prompt_template`` with its escapes read (``with_escapes``: ``--set`` gives ``\\n`` as two
        characters)."""
        return with_escapes(self.prompt_template)

    def factory_fields(self) -> dict:
        """The fields a task factory may take, by name (the ones its signature names reach it; its own
        ``options`` reach it all)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("name", "reward", "format_weight", "reward_timeout", "tools", "options",
                                  *REWARD_KEYS, *PROMPT_KEYS)}


def with_escapes(text: str) -> str:
    """``text`` with ``\\n`` and ``\\t`` read as a line break and a tab (how a command line writes them)."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


