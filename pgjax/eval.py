"""The evaluation command line: a checkpoint or a run's policy on a task's held-out prompts, with 95%
confidence intervals (the metrics and intervals: ``pgjax.train.evaluation``).

    python -m pgjax.eval MODEL_OR_RUN --task NAME [--set task.KEY=VALUE ...] [--prompts P] [--samples N]
                         [--k 1,8] [--max-new-tokens T] [--temperature 1.0] [--seed 0] [--json OUT.json]

Held-out prompts: the task context of the experiment (``pgjax.train.context.task_context``, as the
Trainer builds it), whose evaluation prompts are ``task.examples(P, seed=stream_seed(seed, "eval",
0))``. On a run directory ``seed``, ``P`` (``eval_prompts``), the task, ``max_prompt_tokens`` and
``max_new_tokens`` default to the run's ``experiment.json``, so the prompts are exactly those the run
evaluated on during training (a dataset task's records fitted to the run's ``max_prompt_tokens``),
rendered the same way and stopped by the same tokens. ``--json`` writes the results with the task's
options and each prompt's correct counts.

Exit status: 0 done; 1 a reward function failed on the model's responses (it raised, did not return
within ``task.reward_timeout``, or returned something that is not a number; one line names it); 2 a
mistake in the arguments or the task, found before any sampling.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import typing

import jax

from pgjax.models import hf
from pgjax.rewards import RewardError
from pgjax.sample import Decoding
from pgjax.train.context import task_context
from pgjax.train.evaluation import check_ks, evaluate, to_markdown
from pgjax.train.experiment import ConfigError, Experiment, ModelSection, TaskSection, override
from pgjax.train.rollout import RolloutConfig


def _section(kind, saved: dict):
    """A config section from its saved fields, nested sections included (fields this version does not
    know are left out)."""
    hints = typing.get_type_hints(kind)
    fields = {f.name for f in dataclasses.fields(kind)}
    return kind(**{k: _section(hints[k], v) if dataclasses.is_dataclass(hints[k]) and isinstance(v, dict) else v
                   for k, v in saved.items() if k in fields})


def saved_experiment(path: pathlib.Path) -> Experiment:
    """What evaluation needs of the experiment a run saved (``experiment.json``): its seed,
    ``eval_prompts`` and task, rollout and model sections; ConfigError if it cannot be read."""
    try:
        saved = json.loads(path.read_text())
        return Experiment(seed=saved["seed"], eval_prompts=saved["eval_prompts"],
                          task=_section(TaskSection, saved["task"]), rollout=_section(RolloutConfig, saved["rollout"]),
                          model=_section(ModelSection, saved["model"]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path} is not a readable pgjax experiment: {error}") from None


def locate_model(path) -> tuple[pathlib.Path, Experiment | None]:
    """(the Hugging Face checkpoint directory, the run's experiment) for a checkpoint directory
    (config.json; no experiment) or a pgjax run directory (its ``final/``, and its ``experiment.json``
    when present); FileNotFoundError for anything else."""
    path = pathlib.Path(path)
    if (path / "config.json").is_file():
        return path, None
    if (path / "final" / "config.json").is_file():
        saved = path / "experiment.json"
        return path / "final", saved_experiment(saved) if saved.is_file() else None
    raise FileNotFoundError(f"{path}: neither a Hugging Face checkpoint directory (config.json) nor a pgjax run "
                            "directory (final/config.json)")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pgjax.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", metavar="MODEL_OR_RUN",
                        help="a Hugging Face checkpoint directory, or a pgjax run directory (its final/ policy; "
                             "task, prompts, seed and token budgets default to its experiment.json)")
    parser.add_argument("--task", help="the task (a registered name or package.module:factory); required for a "
                                       "checkpoint directory, default for a run: the run's")
    parser.add_argument("--set", action="append", default=[], metavar="task.KEY=VALUE",
                        help="a task option (repeatable), e.g. task.digits=3")
    parser.add_argument("--prompts", type=int, help="held-out prompts (default: the run's eval_prompts, else 256)")
    parser.add_argument("--samples", type=int, default=8, help="sampled responses per prompt (0: greedy only)")
    parser.add_argument("--k", help="comma-separated k of pass@k (default: 1 and --samples)")
    parser.add_argument("--max-new-tokens", type=int, help="response budget (default: the run's)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the sampled pass")
    parser.add_argument("--seed", type=int, help="seed of the prompts and the sampling (default: the run's, else 0)")
    parser.add_argument("--json", metavar="OUT.json", help="also write the results as JSON")
    return parser.parse_args(argv)


def _ks(text: str | None, samples: int) -> tuple[int, ...]:
    """``--k`` as integers (default: 1 and ``samples``), checked against ``samples``."""
    if text is None:
        return check_ks((1, samples) if samples else (), samples)
    try:
        ks = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--k={text!r}: expected comma-separated integers such as 1,8") from None
    return check_ks(ks, samples)


def setup(args: argparse.Namespace) -> dict:
    """Everything ``evaluate`` and the report need from the command line: the model, its task context,
    held-out examples and settings (ConfigError / ValueError / OSError for bad input, before any sampling)."""
    ks = _ks(args.k, args.samples)
    model_dir, run = locate_model(args.model)
    if run is None and not args.task:
        raise ConfigError(f"--task is required for {args.model} (only a run directory's experiment.json names one)")
    not_task = [a for a in args.set if not a.strip().startswith("task.")]
    if not_task:
        raise ConfigError(f"--set takes task options (task.KEY=VALUE), got {not_task[0]!r}")
    exp = override(run or Experiment(), ([f"task.name={args.task}"] if args.task else []) + args.set)
    prompts = exp.eval_prompts if args.prompts is None else args.prompts
    if prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {prompts}")
    exp = dataclasses.replace(exp, eval_prompts=prompts, seed=exp.seed if args.seed is None else args.seed)
    context = task_context(exp, model_dir, fit_to=run.rollout.max_prompt_tokens if run else None)
    examples = context.eval_examples
    ids = context.tokenizer(context.render([e["prompt"] for e in examples]), add_special_tokens=False)["input_ids"]
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None and run is not None:
        max_new_tokens = run.rollout.max_new_tokens
    if max_new_tokens is None:
        raise ConfigError(f"--max-new-tokens is required for {args.model} (a run directory's experiment.json "
                          "gives a default)")
    policy = hf.load(model_dir, param_dtype=exp.model.param_dtype, compute_dtype=exp.model.compute_dtype)
    return {"policy": policy, "tokenizer": context.tokenizer,
            "task": context.task, "examples": examples, "samples": args.samples, "ks": ks,
            "decoding": Decoding(max_new_tokens=max_new_tokens, temperature=args.temperature),
            "max_prompt_tokens": max(max(map(len, ids)), run.rollout.max_prompt_tokens if run else 0),
            "eos_ids": context.eos_ids, "prompt_format": context.prompt_format,
            "key": jax.random.PRNGKey(exp.seed),
            "about": {"model": str(args.model), "task": exp.task.name, "task_options": exp.task.options(),
                      "seed": exp.seed}}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        settings = setup(args)
    except (ValueError, TypeError, OSError, KeyError) as error:     # ConfigError is a ValueError
        print(f"pgjax.eval: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    about = settings.pop("about")
    try:
        results = evaluate(**settings)
    except RewardError as error:
        print(f"pgjax.eval: stopped: {error}", file=sys.stderr)
        return 1
    print(to_markdown(results))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({**about, **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
