"""Typed experiment configuration: loaded from a Python file, overridden by ``key=value`` strings,
validated before anything runs or is written.

An experiment file is a Python module with a function ``experiment()`` that
returns an ``Experiment``. ``--set rollout.temperature=0.7`` replaces one
field (dotted path, value parsed by the field's type); ``algorithm.hparams.<name>``
overrides one of the algorithm's traced hyperparameters (``core.HParams``), and
``task.options.<name>`` one of the task's own options (the value read as JSON where it parses, else
kept as text). A renamed key (``RENAMED``) is an unknown key whose message names the new one.
Research code plugs in by import path where a setting names it (``task.name``, ``task.reward``,
``task.tools``, ``logging.sinks``, ``model.family``, ``algorithm.preset``: ``pgjax.plugins``,
docs/extending.md).

Every mistake a user can make in a configuration raises ``ConfigError`` (a
``ValueError``) with a message naming the key, the value and what would be
valid: an unknown key (with the closest valid one), a value of the wrong type,
a value out of its range (each section's ``__post_init__`` checks its own
fields), and the checks that need several sections (``validate``: a group
baseline with one sample per prompt, batches that do not split into
micro-batches or over the mesh, a missing checkpoint or dataset, a run whose
model and batches cannot fit the machine's memory). The command line prints it
as plain lines and exits with status 2.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import math
import os
import pathlib
import re
import threading
import traceback
import types
import typing

import numpy as np

from pgjax import core
from pgjax.agents import TOOLS
from pgjax.models import hf
from pgjax.models.lora import TARGETS, LoRAConfig
from pgjax.models.transformer import RUNTIME_OPTIONS, ModelConfig
from pgjax.parallel.mesh import MeshConfig, check_divisible_rows
from pgjax.parallel.multihost import DistributedConfig
from pgjax.plugins import is_import_path, named_estimator, resolve
from pgjax.rollout.collect import RolloutConfig
from pgjax.tasks import (
    FILE_FORMATS,
    accepted_options,
    error_text,
    located_error,
    make_task,
    raised_at,
    reader_format,
    reward_function,
    task_factory,
)
from pgjax.train.learned_reward import NORMALIZE
from pgjax.train.learner import UpdateConfig
from pgjax.train.memory import check_run_memory
from pgjax.train.optim import OptimConfig

RENAMED = {"model.layers": "model.num_hidden_layers", "model.heads": "model.num_attention_heads",
           "model.kv_heads": "model.num_key_value_heads", "task.dataset": "task.path", "task.numbers": "task.count",
           "algorithm": "algorithm.preset", "hparams": "algorithm.hparams", "update.correction": "algorithm.correction",
           "update.correction_mode": "algorithm.correction_mode"}

HPARAMS = "algorithm.hparams."      # the traced hyperparameters' keys: algorithm.hparams.<core.HParams field>
MAX_SECONDS = threading.TIMEOUT_MAX     # the longest wait a thread or timer takes (about 292 years); longer overflows
# the longest name of a run directory, and of each folder above it, in bytes: a file system takes 255 a
# name, and --restart renames the directory to <name>-replaced-<date>
NAME_BYTES = 200


def renamed(key: str) -> str | None:
    """The key an old ``key`` is now called (``RENAMED``, and ``hparams.NAME`` -> ``algorithm.hparams.NAME``)."""
    head, _, rest = key.partition(".")
    if key in RENAMED:
        return RENAMED[key]
    return f"{RENAMED[head]}.{rest}" if head == "hparams" and rest else None


class ConfigError(ValueError):
    """A user's configuration mistake, found before anything is written (printed without a traceback)."""


class RunStopped(RuntimeError):
    """Training cannot go on: a reward function that failed (raised, did not return within
    ``task.reward_timeout``, returned something that is not one number per completion, or a NaN or
    infinity), repeated non-finite updates, or a non-finite state about to be saved. Nothing non-finite
    was written; the last checkpoint is intact."""


def _require(ok: bool, key: str, value, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{key}={value!r} is invalid: {valid}")


EXPECTED = {int: "an int is expected", float: "a number is expected", bool: "a bool, true or false",
            str: "a str is expected", dict: "a dict is expected"}


def _fits(value, kind) -> bool:
    """Whether ``value`` is of the field type ``kind`` (an int also for a float, never a bool for a number)."""
    if kind in (int, float) and isinstance(value, bool):
        return False
    if typing.get_origin(kind) in (types.UnionType, typing.Union):
        return any(_fits(value, k) for k in typing.get_args(kind))
    return isinstance(value, (int, float) if kind is float else typing.get_origin(kind) or kind)


def check_types(config, prefix: str = "") -> None:
    """ConfigError naming the first field of the config section ``config`` (keys ``prefix`` + field),
    nested sections included, whose value is not of the type its field declares: ``steps="10"``,
    ``steps=1.5``, ``seed=True`` or ``task="arithmetic"`` in an experiment file (``--set`` parses each
    value by its type already)."""
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        kind, value, key = hints[field.name], getattr(config, field.name), prefix + field.name
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            _require(isinstance(value, kind), key, value, f"{kind.__name__}(...) is expected")
            check_types(value, f"{key}.")
        else:
            _require(_fits(value, kind), key, value, EXPECTED.get(kind, f"a {kind} is expected"))


@dataclasses.dataclass(frozen=True)
class LoRASection:
    """Low-rank adapters (``pgjax.models.lora``): ``rank`` 0 trains every weight (full fine-tuning);
    ``rank`` r >= 1 freezes the checkpoint and trains adapters of rank r on the ``targets``
    (comma-separated ``q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj``, or ``all``), scaled by
    ``alpha`` / r, with ``dropout`` on their input during the update. The KL reference is then the
    checkpoint itself (adapters off), checkpoints hold only the adapters, and ``final/`` holds the
    merged model plus the PEFT adapter in ``final/adapter``."""
    rank: int = 0
    alpha: float = 32.0
    dropout: float = 0.0
    targets: str = "all"

    def __post_init__(self):
        check_types(self, "model.lora.")
        _require(self.rank >= 0, "model.lora.rank", self.rank, "an integer >= 0 (0: full fine-tuning)")
        try:
            self._lora_config(max(self.rank, 1))       # every field checked, even while LoRA is off
        except ValueError as error:
            raise ConfigError(f"model.lora: {error}") from None

    def config(self) -> LoRAConfig | None:
        """The ``LoRAConfig``, None for full fine-tuning (rank 0)."""
        return self._lora_config(self.rank) if self.rank else None

    def _lora_config(self, rank: int) -> LoRAConfig:
        targets = TARGETS if self.targets == "all" else tuple(t.strip() for t in self.targets.split(","))
        return LoRAConfig(rank=rank, alpha=self.alpha, dropout=self.dropout, targets=targets)


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """``path``: a local Hugging Face checkpoint directory (its config and weights; the architecture
    fields below are then ignored). Empty: a new random model of this architecture (``ModelConfig``'s
    fields, named as in Hugging Face's config.json) over the task's tokenizer, whose size is the
    vocabulary. Either way: ``param_dtype``, ``compute_dtype``; ``remat``, what each layer's
    backward pass recomputes instead of keeping (``off``, ``save_matmuls``, ``save_nothing``: see
    ``pgjax.models.transformer.REMAT_POLICIES``; same gradients, less activation memory); and
    ``scan_layers``: the layers stored stacked and run as one ``lax.scan`` (one traced layer, so
    compile time does not grow with depth; a run resumes only with the layout it started with).
    The defaults, stacked layers each recomputed in the backward pass, are the fastest and smallest
    update measured on SmolLM2-135M (docs/benchmarks.md, "The model options"); ``scan_layers=false``
    with ``remat=off`` resume a run begun when they were the default.

    ``family``: ``llama``, ``qwen2``, ``qwen3``, ``gemma3`` (``pgjax.models.transformer.FAMILIES``) or the
    import path ``package.module:NAME`` of a ``Family`` of your own (transformers' model_type and
    architecture class, and which of ``CausalLM``'s switches its layers use: docs/extending.md). With
    ``path`` the checkpoint's config.json names its family by its model_type; a family of your own
    named here by import path is the one its model_type must then be (``hf.load``'s ``family``)."""
    path: str = ""
    # ModelConfig's architecture fields (a test keeps the names in step), with a tiny model's defaults
    family: str = "qwen3"
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat: str = "save_nothing"
    scan_layers: bool = True
    lora: LoRASection = LoRASection()

    def __post_init__(self):
        check_types(self, "model.")
        try:            # the architecture's checks are ModelConfig's own
            self.config(vocab_size=1)
        except ValueError as error:
            raise ConfigError(f"model.{error}") from None

    @property
    def checkpoint_family(self) -> str | None:
        """``family`` where it is an import path (a family of the user's, which a checkpoint at ``path``
        is read as: ``hf.load``'s ``family``), else None (a checkpoint names its built-in family)."""
        return self.family if is_import_path(self.family) else None

    def runtime_options(self) -> dict:
        """The ``RUNTIME_OPTIONS`` (dtypes, remat, scan_layers) to load a checkpoint with, and its
        ``family`` where that is a family of the user's (``checkpoint_family``)."""
        options = {name: self.lora.config() if name == "lora" else getattr(self, name) for name in RUNTIME_OPTIONS}
        return options if self.checkpoint_family is None else {**options, "family": self.checkpoint_family}

    def config(self, vocab_size: int) -> ModelConfig:
        """The architecture of a new model over a vocabulary of ``vocab_size`` tokens."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name != "path" and f.name not in RUNTIME_OPTIONS}
        return ModelConfig(vocab_size=vocab_size, **{**fields, **self.runtime_options()})


CHAT_TEMPLATE = ("auto", "none")
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
            _require(isinstance(name, str) and name.isidentifier(), f"task.options[{name!r}]", name,
                     "an option's name is a Python identifier (a keyword argument of the task's factory)")
            _require(name not in {f.name for f in dataclasses.fields(self)}, f"{OPTIONS}{name}", self.options[name],
                     f"{name} is a field of the task section: set task.{name}")
        _require(bool(self.name), "task.name", self.name, "a registered task or package.module:factory")
        _require(self.chat_template in CHAT_TEMPLATE, "task.chat_template", self.chat_template,
                 f"one of {', '.join(CHAT_TEMPLATE)}")
        _require(self.prompt_template.count("{prompt}") == 1, "task.prompt_template", self.prompt_template,
                 "a text holding {prompt} once, e.g. 'Question: {prompt}\\nAnswer:'")
        _require(all(self.stop_texts), "task.stop_text", self.stop_text,
                 "comma-separated texts, none empty (escapes \\n and \\t allowed)")
        _require(self.file_format in FILE_FORMATS, "task.file_format", self.file_format,
                 f"one of {', '.join(FILE_FORMATS)}")
        _require(math.isfinite(self.format_weight), "task.format_weight", self.format_weight, "a finite number")
        for key in ("reward_model_weight", "verifier_weight"):
            _require(math.isfinite(getattr(self, key)), f"task.{key}", getattr(self, key), "a finite number")
        _require(self.reward_model_normalize in NORMALIZE, "task.reward_model_normalize", self.reward_model_normalize,
                 f"one of {', '.join(NORMALIZE)}")
        _require(0 <= self.reward_timeout <= MAX_SECONDS, "task.reward_timeout", self.reward_timeout,
                 f"finite seconds >= 0 (0: no limit), at most {MAX_SECONDS:.0f}")
        _require(all(name in TOOLS or is_import_path(name) for name in self.tool_names), "task.tools", self.tools,
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


@dataclasses.dataclass(frozen=True)
class WarmStartSection:
    """Supervised warm start on demonstrations before RL: ``steps`` batches of ``batch_size`` (0 = off)."""
    steps: int = 200
    batch_size: int = 64
    optim: OptimConfig = OptimConfig(lr=3e-3, warmup_steps=20)

    def __post_init__(self):
        check_types(self, "warm_start.")
        _require(self.steps >= 0, "warm_start.steps", self.steps, "an integer >= 0 (0: no warm start)")
        _require(self.batch_size >= 1, "warm_start.batch_size", self.batch_size, "an integer >= 1")


@dataclasses.dataclass(frozen=True)
class LoggingSection:
    """Where metrics go besides ``metrics.jsonl``: TensorBoard event files in the run directory
    (``tensorboard --logdir runs/``), and Weights & Biases when ``wandb`` is true (needs the
    ``wandb`` package; ``WANDB_MODE=offline`` keeps it local). ``progress_every``: seconds between
    progress lines when stderr is not a terminal (a terminal gets a live bar).

    Completions (``pgjax.train.completions``): every ``completions_every`` RL steps (0: off)
    ``completions_per_step`` rows of the step's batch (drawn from the seed: a resumed run logs the
    same rows), their prompt and completion each clipped to ``completions_max_chars`` characters
    (the cut marked), go to ``completions.jsonl``, TensorBoard text and a W&B table. The default, 4
    rows every 10 steps, is the default ``eval_every``: a look at the samples beside each evaluation,
    at most 4 x 2 x 2000 characters of text per logged step, and a W&B table (a file each) every
    tenth step rather than every step.

    ``sinks``: comma-separated import paths ``package.module:name`` of logging sinks of your own, each a
    ``pgjax.train.sinks.Sink`` subclass (or a factory of one) opened as ``factory(directory, since)``
    (the run directory; the step a resume starts after, None for a new run) and given every record
    and the step's logged completions after the run's own sinks; one that raises is reported and left
    out for the rest of the run, never touching the other records (docs/extending.md)."""
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "pgjax"
    progress_every: float = 30.0
    completions_every: int = 10
    completions_per_step: int = 4
    completions_max_chars: int = 2000
    sinks: str = ""

    def __post_init__(self):
        check_types(self, "logging.")
        _require(all(map(is_import_path, self.sink_names)), "logging.sinks", self.sinks,
                 "comma-separated import paths package.module:name of Sink classes or factories of your own "
                 "(the built-in sinks have their own switches: logging.tensorboard, logging.wandb)")
        _require(self.progress_every >= 0, "logging.progress_every", self.progress_every, ">= 0 seconds")
        _require(self.completions_every >= 0, "logging.completions_every", self.completions_every,
                 "an integer >= 0 (RL steps between logged completions; 0: none)")
        _require(self.completions_per_step >= 1, "logging.completions_per_step", self.completions_per_step,
                 "an integer >= 1 (rows logged per step, at most the batch's)")
        _require(self.completions_max_chars >= 1, "logging.completions_max_chars", self.completions_max_chars,
                 "an integer >= 1 (characters kept of each prompt and completion)")

    @property
    def sink_names(self) -> tuple[str, ...]:
        """``sinks`` split at its commas."""
        return tuple(name.strip() for name in self.sinks.split(",")) if self.sinks else ()


@dataclasses.dataclass(frozen=True)
class AlgorithmSection:
    """The estimator (the paper's unified policy gradient, docs/design.md; your own: docs/estimators.md):
    ``preset``, a name of ``core.PRESETS`` (REINFORCE, ReMax, RLOO, PPO, GRPO, Dr. GRPO and
    relatives) or the import path ``package.module:name`` of your own estimator (a ``core.Estimator``,
    or a class or function called with no arguments that returns one); ``estimator``, an estimator
    object instead (Python only: an experiment file or ``Trainer(exp, algorithm=...)``; it replaces
    ``preset``); ``hparams``, its traced hyperparameters by name (a preset's: ``core.HParams``
    fields, e.g. ``{"kl_coef": 0.01}``) over its own; ``correction`` and ``correction_mode`` (presets
    only), what the loss does with the sampler's log-probs (the ``core.Spec`` fields of those names:
    ``ignore`` measures the learner-sampler mismatch only; importance weights pi_old / mu per
    ``token``, ``sequence`` or ``geometric`` mean, truncated or masked at ``hparams.is_cap`` /
    ``is_floor``; or ``behaviour_ratio``, the PPO clip against mu). In an experiment file
    ``algorithm="grpo"`` is short for ``AlgorithmSection(preset="grpo")``."""
    preset: str = "dr_grpo"
    hparams: dict = dataclasses.field(default_factory=dict)
    correction: str = "ignore"
    correction_mode: str = "truncate"
    estimator: core.Estimator | None = None

    def __post_init__(self):
        check_types(self, "algorithm.")
        for name, value in self.hparams.items():
            _require(_fits(value, float), f"{HPARAMS}{name}", value, EXPECTED[float])
        _require(self.preset in core.PRESETS or ":" in self.preset, "algorithm.preset", self.preset,
                 f"one of {', '.join(core.PRESETS)}, or the import path package.module:name of your own estimator")
        _require(self.correction in core.CORRECTIONS, "algorithm.correction", self.correction,
                 f"one of {', '.join(core.CORRECTIONS)}")
        _require(self.correction_mode in core.IS_MODES, "algorithm.correction_mode", self.correction_mode,
                 f"one of {', '.join(core.IS_MODES)}")

    @property
    def key(self) -> str:
        """The setting that names the estimator, for messages: ``algorithm.preset=...`` or ``algorithm.estimator``."""
        return "algorithm.estimator" if self.estimator is not None else f"algorithm.preset={self.preset}"

    def build(self) -> core.Estimator:
        """The estimator (``estimator``, else ``preset`` looked up by ``pgjax.plugins.resolve``) with
        ``hparams`` applied, and a preset's off-policy correction when it is set: ConfigError for an
        import path that does not give a ``core.Estimator``, a correction the preset's ratio cannot
        take or set for an estimator of the user's, or an unknown or invalid hyperparameter."""
        algo = self.estimator if self.estimator is not None else _estimator(self.preset)
        correction = dict(correction=self.correction, correction_mode=self.correction_mode)
        if correction != {"correction": "ignore", "correction_mode": "truncate"}:
            if not isinstance(algo, core.Algorithm):
                raise ConfigError(f"algorithm.correction={self.correction!r}, algorithm.correction_mode="
                                  f"{self.correction_mode!r} are the presets' off-policy corrections; "
                                  f"{algo.name} reads the sampler's log-probs (batch.behaviour_logp) itself")
            try:
                algo = dataclasses.replace(algo, spec=algo.spec.replace(**correction))
            except ValueError as error:
                raise ConfigError(f"algorithm.correction={self.correction!r}: {error}") from None
        try:
            return algo.with_hparams(**self.hparams) if self.hparams else algo
        except (ValueError, TypeError) as error:
            raise ConfigError(f"algorithm.hparams: {error}") from None


def _estimator(name: str) -> core.Estimator:
    """The estimator ``algorithm.preset`` names (``plugins.named_estimator``: a preset, or an import path);
    ConfigError otherwise."""
    try:
        return named_estimator(name)
    except ValueError as error:
        raise ConfigError(str(error)) from None


STAGES = ("rl", "reward_model", "process_reward_model")


@dataclasses.dataclass(frozen=True)
class RewardModelSection:
    """The learned reward a ``stage="reward_model"`` or ``"process_reward_model"`` run trains
    (``pgjax.train.reward_trainer``) on the file ``path`` (``pgjax.tasks.preferences``: the fields by
    name, the formats and checks of every dataset, ``skip_invalid``). A reward model: the
    Bradley-Terry loss on preference pairs (``prompt_field``, ``chosen_field``, ``rejected_field``),
    ``margin`` added to each pair's own (``margin_field``). A process reward model: each step's label
    at its last token (``steps_field``, ``labels_field``; the response is its steps joined by
    ``separator``, ``\n`` a line break). The held-out records are those of ``eval_path``, else
    ``eval_prompts`` records drawn from ``path`` with the run's seed, never trained on. ``max_tokens``:
    the most tokens a prompt and response may take as the model reads them (the task section's
    ``chat_template``, ``system_prompt`` and ``prompt_template`` render the prompt)."""
    path: str = ""
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    margin_field: str = ""
    steps_field: str = "completions"
    labels_field: str = "labels"
    step_separator: str = "\\n"
    file_format: str = "auto"
    skip_invalid: bool = False
    eval_path: str = ""
    margin: float = 0.0
    max_tokens: int = 256

    def __post_init__(self):
        check_types(self, "reward_model.")
        _require(self.file_format in FILE_FORMATS, "reward_model.file_format", self.file_format,
                 f"one of {', '.join(FILE_FORMATS)}")
        _require(math.isfinite(self.margin), "reward_model.margin", self.margin, "a finite number")
        _require(self.max_tokens >= 2, "reward_model.max_tokens", self.max_tokens, "an integer >= 2")
        _require(bool(self.step_separator), "reward_model.step_separator", self.step_separator,
                 "a text that is not empty (escapes \\n and \\t allowed)")

    @property
    def separator(self) -> str:
        """``step_separator`` with its escapes read (``\\n`` a line break)."""
        return with_escapes(self.step_separator)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One run. The defaults are the README's main job: Dr. GRPO on 2-digit addition with a tiny
    Qwen3-style model and a short supervised warm start, sized for 2 CPU cores. ``steps`` RL steps
    of ``prompts_per_step`` prompts (0: only the warm start, then the export); greedy evaluation on
    ``eval_prompts`` held-out prompts every ``eval_every`` steps; a checkpoint every
    ``checkpoint_every`` steps. ``mesh``: how the devices of all processes are split (default: data
    parallel over all of them); ``distributed``: how the processes of a multi-host run meet (default:
    from the environment). ``stage``: ``rl``, or ``reward_model`` / ``process_reward_model`` to train the
    learned reward of the ``reward_model`` section instead (``steps`` of ``prompts_per_step`` records
    with ``optim``, held-out accuracy every ``eval_every`` steps; the algorithm, rollout, update and
    warm-start sections unused)."""
    name: str = "experiment"
    seed: int = 0
    stage: str = "rl"
    algorithm: AlgorithmSection = AlgorithmSection()
    steps: int = 250
    prompts_per_step: int = 32
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    rollout: RolloutConfig = RolloutConfig(samples_per_prompt=8, max_prompt_tokens=8, max_new_tokens=6)
    update: UpdateConfig = UpdateConfig()
    optim: OptimConfig = OptimConfig(lr=5e-4, warmup_steps=5)
    critic_optim: OptimConfig = OptimConfig(lr=1e-3, warmup_steps=5)
    warm_start: WarmStartSection = WarmStartSection()
    eval_every: int = 10
    eval_prompts: int = 256
    checkpoint_every: int = 50
    run_dir: str = ""
    logging: LoggingSection = LoggingSection()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()
    reward_model: RewardModelSection = RewardModelSection()

    def __post_init__(self):
        if isinstance(self.algorithm, str):         # algorithm="grpo": the preset's name
            object.__setattr__(self, "algorithm", AlgorithmSection(preset=self.algorithm))
        check_types(self)
        _require(self.name not in ("", ".", "..") and not {"/", "\0"} & set(self.name), "name", self.name,
                 "a non-empty name without '/', other than '.' and '..' (runs/<name> is the run directory)")
        _require(_fits_file_names(self.name), "name", self.name,
                 f"at most {NAME_BYTES} bytes (runs/<name> is the run directory)")
        _require("\0" not in self.run_dir and _fits_file_names(self.run_dir), "run_dir", self.run_dir,
                 f"a path without NUL whose every part is at most {NAME_BYTES} bytes")
        # jax.random.PRNGKey keeps the low 32 bits of a seed (2**32 would give seed 0's key) and
        # overflows from 2**63 on; the data streams' SeedSequence takes any
        _require(0 <= self.seed < 2**32, "seed", self.seed, "an integer in [0, 2**32)")
        _require(self.stage in STAGES, "stage", self.stage, f"one of {', '.join(STAGES)} (RL, or training the reward "
                 "model of the reward_model section)")
        _require(self.steps >= 0, "steps", self.steps, "an integer >= 0 (0: only the warm start)")
        for name in ("prompts_per_step", "eval_every", "eval_prompts", "checkpoint_every"):
            _require(getattr(self, name) >= 1, name, getattr(self, name), "an integer >= 1")


def _fits_file_names(path: str) -> bool:
    """Whether every part of ``path`` is at most ``NAME_BYTES`` long in the file system's encoding."""
    return all(len(os.fsencode(part)) <= NAME_BYTES for part in pathlib.PurePath(path).parts)


def stream_seed(seed: int, stream: str, index: int) -> int:
    """Independent deterministic integer seeds for the data streams of a run (``train``, ``eval``,
    ``warm_start``), one per step."""
    return int(np.random.SeedSequence([seed, sum(map(ord, stream)), index]).generate_state(1)[0])


def validate(exp: Experiment, mesh, members: int = 1, groups: int = 1) -> None:
    """The checks that need several sections (each section checks its own fields): the algorithm and
    its hyperparameters (a KL coefficient only where there is a KL term), a group baseline's K >= 2, the
    scoring temperature equal to the sampling one, every batch size, the task (importing a user's task
    or reward module) and the options it takes, the files a run reads, and what the run certainly
    holds against the machine's memory (a population's: ``members`` in ``groups`` groups, ``mesh`` one
    group's). Raises ConfigError; writes nothing."""
    algo = exp.algorithm.build()
    _check_estimator(exp, algo)
    if exp.update.temperature != exp.rollout.temperature:
        raise ConfigError(f"update.temperature={exp.update.temperature} differs from rollout.temperature="
                          f"{exp.rollout.temperature}: the update would score another policy than the one that "
                          "sampled; set both")
    check_batches(exp, mesh)
    _check_episodes(exp, algo)
    try:
        factory = task_factory(exp.task.name)
        if exp.task.reward:
            reward_function(exp.task.reward)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    accepted = accepted_options(factory)
    ignored = [] if accepted is None else [k for k in _changed_options(exp.task) if k not in accepted]
    if ignored:
        raise ConfigError(f"task.{ignored[0]}={getattr(exp.task, ignored[0])!r} does nothing for task "
                          f"{exp.task.name!r}, which takes {', '.join(accepted or []) or 'no options'}")
    _check_task_options(exp)
    _check_tools(exp)
    if exp.model.path and not (pathlib.Path(exp.model.path) / "config.json").is_file():
        raise ConfigError(f"model.path={exp.model.path!r}: no Hugging Face checkpoint there (config.json missing)")
    _check_context(exp)
    if exp.task.name == "jsonl_math":
        _check_dataset_file(exp.task)
    if exp.logging.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("logging.wandb=True needs the wandb package: pip install -e '.[wandb]'")
    _check_memory(exp, mesh, members, groups)


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


def _check_memory(exp: Experiment, mesh, members: int = 1, groups: int = 1) -> None:
    """What the run certainly holds fits this machine's memory (``memory.check_run_memory``), for the
    architecture of ``model.path`` or a new model's (its vocabulary left out: the task's tokenizer is
    not loaded yet)."""
    try:
        model = (hf.load_config(exp.model.path, **exp.model.runtime_options()) if exp.model.path
                 else exp.model.config(vocab_size=1))
    except (ValueError, TypeError, KeyError, OSError) as error:
        raise ConfigError(f"model.path: {error}") from None
    try:
        check_run_memory(exp, model, mesh, members, groups)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _check_episodes(exp: Experiment, algo) -> None:
    """With tools (multi-turn episodes) the environment's rewards are the training reward, and what
    single-turn rollouts add to theirs has no place: ReMax's greedy response, a reward function of
    the user's, the format reward, the overlong penalty."""
    if not exp.task.tools:
        return
    conflicts = [("greedy_rewards" in algo.requires, f"{exp.algorithm.key} (a greedy baseline)"),
                 (bool(exp.task.reward), f"task.reward={exp.task.reward!r}"),
                 (exp.task.format_weight != 0, f"task.format_weight={exp.task.format_weight}"),
                 (exp.rollout.overlong_buffer > 0, f"rollout.overlong_buffer={exp.rollout.overlong_buffer}")]
    for conflict, setting in conflicts:
        if conflict:
            raise ConfigError(f"{setting} is not supported with task.tools={exp.task.tools!r}: in a multi-turn "
                              "episode the environment's rewards are the training reward")


def _check_task_options(exp: Experiment) -> None:
    """The task's own options (``task.options``) against its factory, before anything is written: the
    task is built with them (``tasks.make_task``; its factory is called again by the task context),
    and an option it does not take, or a TypeError or ValueError it raises, is a ConfigError naming
    ``task.options`` (any other exception, one naming ``task.name``), with where in the user's code."""
    t = exp.task
    if not t.options:
        return
    try:
        make_task(t.name, t.options, **t.factory_fields())
    except (TypeError, ValueError) as error:
        raise ConfigError(f"task.options={t.options!r} for task {t.name!r}: {located_error(error)}") from None
    except Exception as error:      # the user's factory failed otherwise
        raise ConfigError(f"task.name={t.name!r}: {located_error(error)}") from None


def _check_tools(exp: Experiment) -> None:
    """Each tool of ``task.tools`` named by import path imports (``pgjax.plugins.resolve``); that it is
    a tool is checked where the task context builds it (``context.make_tool``), before anything is
    written too."""
    for name in exp.task.tool_names:
        try:
            resolve("task.tools", name, TOOLS, "tool (a pgjax.agents.Tool class or factory)")
        except ValueError as error:
            raise ConfigError(str(error)) from None


def _check_dataset_file(task: TaskSection) -> None:
    """``task.path`` is a file, and the package its format needs (``tasks.reader_format``) is installed."""
    if not pathlib.Path(task.path).is_file():
        raise ConfigError(f"task.path={task.path!r}: no such dataset file (jsonl_math reads a dataset file)")
    try:
        reader_format(task.path, task.file_format)
    except ImportError as error:
        raise ConfigError(f"task.path={task.path!r}: {error}") from None


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
    response = "rollout.episode_budget()" if exp.task.tools else "rollout.max_new_tokens"
    width = exp.rollout.max_prompt_tokens + (exp.rollout.episode_budget() if exp.task.tools
                                             else exp.rollout.max_new_tokens)
    if context and width > context:
        raise ConfigError(f"rollout.max_prompt_tokens + {response} = {width} exceeds the model's context "
                          f"of {context} tokens (max_position_embeddings in {exp.model.path}/config.json)")


def _changed_options(section: TaskSection) -> list[str]:
    """The task options set to something other than their default."""
    return [k for k, v in section.factory_fields().items() if v != getattr(TaskSection, k)]


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


def load(path) -> Experiment:
    """``experiment()`` of the Python file ``path``: ConfigError if it is not a ``.py`` file, has no
    ``experiment()`` or a bad one, or if importing the file or calling ``experiment()`` raises (naming
    the file and line where)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"no experiment file {path}")
    if path.suffix != ".py":
        raise ConfigError(f"{path} is not a Python file: an experiment is a .py file defining experiment() "
                          "returning a pgjax Experiment (experiments/ holds examples)")
    spec = importlib.util.spec_from_file_location(f"pgjax_experiment_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:      # a SyntaxError, NameError, ImportError... in the file or what it imports
        raise ConfigError(f"{raised_at(error) or path}: {error_text(error)}") from None
    if not hasattr(module, "experiment"):
        raise ConfigError(f"{path} must define experiment() returning a pgjax Experiment")
    try:
        experiment = module.experiment()
    except (ValueError, TypeError) as error:    # a section's own check, a field that does not exist or was renamed
        raise ConfigError(f"{raised_at(error) or path}: {_section_error(error)}") from None
    except Exception as error:       # the user's code in experiment() failed
        raise ConfigError(f"{raised_at(error) or path}: experiment() raised {error_text(error)}") from None
    if not isinstance(experiment, Experiment):
        raise ConfigError(f"{path}: experiment() returned {type(experiment).__name__}, not an Experiment")
    return experiment


def _section_error(error: ValueError | TypeError) -> str:
    """What a section's constructor raised in an experiment file, said plainly: a field of the wrong
    type named with its key (``OptimConfig(lr="1e-3")``, whose own range check compares a str:
    ``OptimConfig.lr='1e-3' is invalid: a number is expected``), a renamed field with its new key."""
    section = _failed_section(error)
    if section is not None:
        keys = _section_keys().get(type(section), [])
        try:
            check_types(section, f"{keys[0] if len(keys) == 1 else type(section).__name__}.")
        except ConfigError as mistyped:
            return str(mistyped)
    moved = [f"{old.split('.')[-1]} is now {new}" for old, new in RENAMED.items()
             if f"'{old.split('.')[-1]}'" in str(error)]
    return f"{error}" + (f" ({'; '.join(moved)})" if moved else _field_hint(error))


def _field_hint(error: ValueError | TypeError) -> str:
    """``; did you mean FIELD?`` for a section constructor's unexpected keyword (``Experiment(stepz=3)``):
    the section's closest field, as ``--set`` hints an unknown key; empty otherwise."""
    found = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", str(error))
    if found is None:
        return ""
    section = next((kind for kind in (Experiment, *_section_keys()) if kind.__name__ == found[1]), None)
    if section is None or not dataclasses.is_dataclass(section):
        return ""
    close = _closest(found[2], [f.name for f in dataclasses.fields(section)])
    return f"; did you mean {' or '.join(close)}?" if close else ""


def _closest(name: str, names: list[str]) -> list[str]:
    """The names a mistyped ``name`` most likely meant: up to two that begin with it at its depth (a name
    cut short), else the closest spelling (difflib, ratio >= 0.6), else none."""
    depth = name.count(".")
    return ([n for n in names if n.startswith(name) and n.count(".") == depth][:2]
            or difflib.get_close_matches(name, names, n=1, cutoff=0.6))


def _failed_section(error: BaseException):
    """The config section (of ``_section_keys``) whose ``__post_init__`` raised ``error``, innermost
    first; None when no section's did."""
    sections = _section_keys()
    frames = [frame for frame, _ in traceback.walk_tb(error.__traceback__) if frame.f_code.co_name == "__post_init__"]
    return next((frame.f_locals["self"] for frame in reversed(frames)
                 if type(frame.f_locals.get("self")) in sections), None)


def _section_keys(config=Experiment, prefix: str = "") -> dict[type, list[str]]:
    """Each config section type ``Experiment`` holds, and the keys it is at (``OptimConfig``:
    ``optim``, ``critic_optim``, ``warm_start.optim``)."""
    found: dict[type, list[str]] = {}
    for field in dataclasses.fields(config):
        kind = _field_type(config, field.name)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            found.setdefault(kind, []).append(prefix + field.name)
            for section, keys in _section_keys(kind, f"{prefix}{field.name}.").items():
                found.setdefault(section, []).extend(keys)
    return found


SECTIONS = {
    "algorithm": "the estimator: a preset of core.PRESETS, its traced hyperparameters, the off-policy correction",
    "model": "the policy: a local Hugging Face checkpoint (path) or a new model's architecture",
    "task": "prompts and verifier: a registered task or package.module:factory, its options, the reward",
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
    """Every key with the value this experiment runs with (``algorithm.hparams`` as the preset resolves them)."""
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
    return out


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
            _require(len(path) == 3 and path[2].isidentifier(), key, text,
                     f"{OPTIONS}NAME=VALUE sets the task's own option NAME (a Python identifier)")
            changes[path] = _json_value(text)
            texts[key] = text
            continue
        changes[path] = _parse(text, float if key.startswith(HPARAMS) else _key_type(path), key)
        texts[key] = text
    try:
        changed = _apply(experiment, changes)
    except ConfigError:
        raise
    except (ValueError, TypeError) as error:
        named = [k for k in texts if k.split(".")[-1] in str(error)] or list(texts)
        raise ConfigError(", ".join(f"{k}={texts[k]!r}" for k in named) + f" is invalid: {error}") from None
    unknown = [key for key in texts if key not in keys and not key.startswith(OPTIONS)]
    if unknown and changed.algorithm.estimator is None and changed.algorithm.preset in core.PRESETS:
        raise _unknown_key(unknown[0], keys)
    return changed


def _unknown_key(key: str, keys: list[str]) -> ConfigError:
    """The error of an unknown ``key``, with the closest of ``keys`` (or the new name of a renamed one)."""
    new_name = renamed(key)
    close = [new_name] if new_name else [k for k in keys if k.endswith("." + key)][:2] or _closest(key, keys)
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
