"""An experiment's task context: what the Trainer, ``python -m pgjax.eval`` and the benchmarks all
need before they sample a prompt, built in one place (``task_context``).

The context is the task (its prompts and verifier), the tokenizer (the task's own, else the
checkpoint's), the prompt format (``task.chat_template`` / ``task.system_prompt`` through the
tokenizer's chat template), the stop tokens (the template's end of turn, the tokenizer's EOS and
every checkpoint's ``generation_config.json`` EOS ids) and the held-out evaluation prompts
(``task.examples(eval_prompts, seed=stream_seed(seed, "eval", 0))``). A dataset task's records are
first fitted to the prompt budget (``fit_prompts``), so every caller draws the same prompts from
the same records.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys

from pgjax.models import hf
from pgjax.parallel import multihost
from pgjax.rewards import make_task
from pgjax.train.experiment import ConfigError, Experiment, stream_seed
from pgjax.train.rollout import PromptFormat, prompt_format_for, stop_tokens


def user_error(what: str, build):
    """``build()``, with a user's mistake in ``what`` (a bad option, a missing or malformed file) as
    ConfigError naming ``what``."""
    try:
        return build()
    except (ValueError, TypeError, KeyError, OSError) as error:
        raise ConfigError(f"{what}: {error}") from None


@dataclasses.dataclass(frozen=True)
class TaskContext:
    """``task``; ``tokenizer``; ``prompt_format`` (how a prompt becomes the model's input text);
    ``eos_ids``, the tokens that end a response, and ``end_id``, the one that ends a demonstration;
    ``eval_examples``, the held-out prompts (every process's)."""
    task: object
    tokenizer: object
    prompt_format: PromptFormat
    eos_ids: tuple[int, ...]
    end_id: int
    eval_examples: list[dict]

    def render(self, prompts: list[str]) -> list[str]:
        """The model's input text of each prompt."""
        return self.prompt_format.render(self.tokenizer, prompts)


def task_context(exp: Experiment, checkpoint: str | pathlib.Path = "", fit_to: int | None = None) -> TaskContext:
    """The task context of ``exp``: its task with the task section's options; the task's tokenizer,
    else ``checkpoint``'s (default ``model.path``; ConfigError when neither has one); the stop tokens
    of the tokenizer and of ``checkpoint`` and ``model.path``; ``exp.eval_prompts`` held-out prompts
    drawn with ``exp.seed``. ``fit_to``: the prompt budget a dataset task's records are fitted to
    before any is drawn (None: not fitted). Every user mistake (an option, a file, a template)
    raises ConfigError; a summary of records left out (``task.skip_invalid``) is printed."""
    t = exp.task
    checkpoint = checkpoint or exp.model.path
    task = user_error("task", lambda: make_task(t.name, **t.options()))
    user_error("task", lambda: task.examples(1, seed=0))          # a malformed dataset fails here, first
    tokenizer = task.tokenizer()
    if tokenizer is None:
        if not checkpoint:
            raise ConfigError(f"task.name={t.name!r} has no tokenizer of its own: set model.path to a "
                              "checkpoint directory with one")
        tokenizer = user_error("model.path", lambda: hf.load_tokenizer(checkpoint))
    prompt_format = user_error("task", lambda: prompt_format_for(tokenizer, t.chat_template, t.system_prompt))
    eos_ids, end_id = user_error("model.path", lambda: stop_tokens(tokenizer, prompt_format,
                                                                   dict.fromkeys((str(checkpoint), exp.model.path))))
    if fit_to is not None and hasattr(task, "fit_prompts"):
        render = lambda prompts: prompt_format.render(tokenizer, prompts)     # noqa: E731
        user_error("task", lambda: task.fit_prompts(tokenizer, fit_to, render))
    summary = task.summary() if hasattr(task, "summary") else None
    if summary and multihost.is_primary():
        print(f"dataset {summary}", file=sys.stderr)
    eval_examples = task.examples(exp.eval_prompts, seed=stream_seed(exp.seed, "eval", 0))
    return TaskContext(task, tokenizer, prompt_format, eos_ids, end_id, eval_examples)
