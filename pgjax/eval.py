"""The evaluation command line: a checkpoint or a run's policy on a task's held-out prompts, with 95%
confidence intervals (the metrics and intervals: ``pgjax.evaluation.held_out``), and the paired comparison
of such evaluations (``compare``; the statistics: ``pgjax.evaluation.paired``).

    python -m pgjax.eval MODEL_OR_RUN --task NAME [--set task.KEY=VALUE ...] [--prompts P] [--samples N]
                         [--k 1,8] [--max-new-tokens T[,T...]] [--temperature 1.0] [--seed 0]
                         [--by difficulty,op,kind] [--batch-rows 512] [--json OUT.json]
    python -m pgjax.eval compare LABEL=REPORT.json[@T][,REPORT.json[@T]...] LABEL=... [--budget T]
                         [--resamples 10000] [--seed 0] [--json OUT.json]

Held-out prompts: the task context of the experiment (``pgjax.train.context.task_context``, as the
Trainer builds it), whose evaluation prompts are ``task.examples(P, seed=stream_seed(seed, "eval",
0))``. On a run directory ``seed``, ``P`` (``eval_prompts``), the task, ``max_prompt_tokens`` and
``max_new_tokens`` default to the run's ``experiment.json``, so the prompts are exactly those the run
evaluated on during training (a dataset task's records fitted to the run's ``max_prompt_tokens``),
rendered the same way and stopped by the same tokens; ``--set task.options.held_out=templates`` (word_math)
evaluates on phrasings training never drew. Several budgets (``--max-new-tokens 64,256,512``) are
evaluated one after another on the same prompts with the same key and printed as one table, a row
per budget and stratum (``--by``: the example tags to group by). ``--json`` writes the results with the
task's options, each prompt's text, tags and outcomes (one budget: the results at the top level;
several: a ``budgets`` list).

``compare`` reads two or more such reports, one label per model with one report per run (e.g. per
training seed), all evaluated on the same prompts (the same ``--seed``, ``--prompts`` and task options;
otherwise it refuses), and prints each model's metrics across its runs (mean, standard deviation,
min-max) and, for each pair, the mean per-prompt difference with its paired bootstrap interval and
the exact sign-flip test (McNemar's exact test for one greedy run each). ``REPORT.json@T`` picks budget
T of a report with several.

Exit status: 0 done; 1 a reward function failed on the model's responses (it raised, did not return
within ``task.reward.timeout``, or returned something that is not a number; one line names it); 2 a
mistake in the arguments, the task or a report, found before any sampling.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import typing

import jax

from pgjax.checks import ConfigError
from pgjax.config import Experiment, ModelSection, TaskSection, override, upgraded
from pgjax.evaluation import paired
from pgjax.evaluation.held_out import BATCH_ROWS, STRATA, check_ks, evaluate, strata_of, to_markdown
from pgjax.evaluation.statistics import RESAMPLES
from pgjax.models import hf
from pgjax.rollout.collect import RolloutConfig
from pgjax.rollout.episodes import episode_limits, opening_ids
from pgjax.sample import Decoding
from pgjax.tasks import RewardError
from pgjax.train.context import task_context

# the rollout settings --set takes besides the task's: a multi-turn episode's limits
EPISODE_SETTINGS = ("rollout.max_turns=", "rollout.max_episode_tokens=", "rollout.max_observation_tokens=")

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
        saved = upgraded(json.loads(path.read_text()))
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
                             "task, prompts, seed and token budgets default to its experiment.json); "
                             "'compare' compares reports instead (python -m pgjax.eval compare --help)")
    parser.add_argument("--task", help="the task (a registered name or package.module:factory); required for a "
                                       "checkpoint directory, default for a run: the run's")
    parser.add_argument("--set", action="append", default=[], metavar="task.KEY=VALUE",
                        help="a task option (repeatable), e.g. task.options.digits=3 or "
                             "task.options.held_out=templates")
    parser.add_argument("--prompts", type=int, help="held-out prompts (default: the run's eval_prompts, else 256)")
    parser.add_argument("--samples", type=int, default=8, help="sampled responses per prompt (0: greedy only)")
    parser.add_argument("--k", help="comma-separated k of pass@k (default: 1 and --samples; 1 is always reported)")
    parser.add_argument("--max-new-tokens", help="response budget, or comma-separated budgets evaluated one after "
                                                 "another, e.g. 64,256,512 (default: the run's)")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the sampled pass")
    parser.add_argument("--seed", type=int, help="seed of the prompts and the sampling (default: the run's, else 0)")
    parser.add_argument("--by", help="comma-separated example tags to report each value of (default: those of "
                                     f"{','.join(STRATA)} the examples carry; '' for none)")
    parser.add_argument("--batch-rows", type=int, default=BATCH_ROWS,
                        help="responses per sampler call (its KV cache grows with rows x (prompt + budget) tokens)")
    parser.add_argument("--json", metavar="OUT.json", help="also write the results as JSON")
    return parser.parse_args(argv)


def _integers(option: str, text: str) -> list[int]:
    """A comma-separated list of integers; ValueError naming ``option`` otherwise."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{option}={text!r}: expected comma-separated integers such as 1,8") from None


def _ks(text: str | None, samples: int) -> tuple[int, ...]:
    """``--k`` as integers (default: 1 and ``samples``), checked against ``samples``."""
    if text is None:
        return check_ks((1, samples) if samples else (), samples)
    return check_ks(_integers("--k", text), samples)


def _budgets(text: str | None, run: Experiment | None, model) -> list[int]:
    """``--max-new-tokens`` as distinct budgets in their order (default: the run's); ConfigError when a
    checkpoint has no default, ValueError for a budget < 1."""
    if text is None:
        if run is None:
            raise ConfigError(f"--max-new-tokens is required for {model} (a run directory's experiment.json "
                              "gives a default)")
        return [run.rollout.max_new_tokens]
    budgets = list(dict.fromkeys(_integers("--max-new-tokens", text)))
    if min(budgets) < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {text}")
    return budgets


def setup(args: argparse.Namespace) -> dict:
    """Everything ``evaluate`` and the report need from the command line: the model, its task context,
    held-out examples and settings (ConfigError / ValueError / OSError for bad input, before any sampling)."""
    ks = _ks(args.k, args.samples)
    if args.batch_rows < 1:
        raise ValueError(f"--batch-rows must be >= 1, got {args.batch_rows}")
    model_dir, run = locate_model(args.model)
    if run is None and not args.task:
        raise ConfigError(f"--task is required for {args.model} (only a run directory's experiment.json names one)")
    not_task = [a for a in args.set if not a.strip().startswith(("task.", *EPISODE_SETTINGS))]
    if not_task:
        raise ConfigError(f"--set takes task options (task.KEY=VALUE) and the episode limits "
                          f"({', '.join(key.rstrip('=') for key in EPISODE_SETTINGS)}), got {not_task[0]!r}")
    exp = override(run or Experiment(), ([f"task.name={args.task}"] if args.task else []) + args.set)
    prompts = exp.eval_prompts if args.prompts is None else args.prompts
    if prompts < 1:
        raise ValueError(f"--prompts must be >= 1, got {prompts}")
    budgets = _budgets(args.max_new_tokens, run, args.model)
    exp = dataclasses.replace(exp, eval_prompts=prompts, seed=exp.seed if args.seed is None else args.seed)
    context = task_context(exp, model_dir, fit_to=run.rollout.max_prompt_tokens if run else None)
    examples = context.eval_examples
    by = STRATA if args.by is None else [tag for tag in args.by.split(",") if tag]
    missing = [tag for tag in by if tag not in examples[0] and args.by is not None]
    if missing:
        raise ValueError(f"--by {missing[0]}: the examples carry no such tag (they have {', '.join(examples[0])})")
    strata_of(examples, by)
    if context.environment is None:
        ids = context.prompt_format.token_ids(context.tokenizer, [e["prompt"] for e in examples])
    else:                                   # the episodes' openings: the task's prompts after the tool prompt
        ids = opening_ids(context.tokenizer, context.prompt_format, [context.environment().reset(e) for e in examples])
    # an episode's replies are bounded by the evaluated budget (the largest, for the episode's total)
    limits = episode_limits(dataclasses.replace(exp.rollout, max_new_tokens=max(budgets)))
    policy = hf.load(model_dir, family=exp.model.checkpoint_family, param_dtype=exp.model.param_dtype,
                     compute_dtype=exp.model.compute_dtype)
    return {"policy": policy, "tokenizer": context.tokenizer,
            "task": context.task, "examples": examples, "samples": args.samples, "ks": ks,
            "decodings": [Decoding(max_new_tokens=budget, temperature=args.temperature) for budget in budgets],
            "max_prompt_tokens": max(max(map(len, ids)), run.rollout.max_prompt_tokens if run else 0),
            "eos_ids": context.eos_ids, "prompt_format": context.prompt_format, "by": by,
            "environment": context.environment, "limits": limits,
            "batch_rows": args.batch_rows, "key": jax.random.PRNGKey(exp.seed),
            "about": {"model": str(args.model), "task": exp.task.name,
                      "task_options": exp.task.resolved_options(),
                      "episodes": None if context.environment is None else {
                          "tools": exp.task.tools.names, **dataclasses.asdict(limits)},
                      "prompt_format": dataclasses.asdict(exp.task.prompt), "seed": exp.seed}}


def parse_compare_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pgjax.eval compare",
                                     description="Paired comparison of pgjax.eval --json reports on the same prompts")
    parser.add_argument("models", nargs="+", metavar="LABEL=REPORT.json[@T][,REPORT.json[@T]...]",
                        help="a model: its label and its reports, one per run (e.g. per training seed); @T picks "
                             "budget T of a report with several")
    parser.add_argument("--budget", type=int, help="the budget of every report without @T (default: its only one)")
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help="bootstrap resamples (>= 10000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resamples")
    parser.add_argument("--json", metavar="OUT.json", help="also write the comparison as JSON")
    return parser.parse_args(argv)


def compare_models(args: argparse.Namespace) -> dict:
    """``paired.compare`` of the reports the arguments name (ValueError for a malformed argument or report)."""
    models: dict[str, list[dict]] = {}
    for argument in args.models:
        label, _, reports = argument.partition("=")
        if not label or not reports or label in models:
            raise ValueError(f"{argument!r}: expected LABEL=REPORT.json[,REPORT.json...] with a label of its own")
        models[label] = []
        for report in reports.split(","):
            path, at, budget = report.rpartition("@") if "@" in report else (report, "", "")
            if at and not budget.isdigit():
                raise ValueError(f"{report!r}: expected REPORT.json@BUDGET with a whole number of tokens")
            models[label].append(paired.load_evaluation(path, int(budget) if at else args.budget))
    return paired.compare(models, args.resamples, args.seed)


def _error(command: str, error: Exception) -> int:
    print(f"{command}: error: {' '.join(str(error).split())}", file=sys.stderr)
    return 2


def compare_main(argv) -> int:
    args = parse_compare_args(argv)
    try:
        comparison = compare_models(args)
    except (ValueError, OSError) as error:
        return _error("pgjax.eval compare", error)
    print(paired.to_markdown(comparison))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(comparison, indent=2))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:
        return compare_main(argv[1:])
    args = parse_args(argv)
    try:
        settings = setup(args)
    except (ValueError, TypeError, OSError, KeyError) as error:     # ConfigError is a ValueError
        return _error("pgjax.eval", error)
    about, decodings = settings.pop("about"), settings.pop("decodings")
    try:
        evaluations = [evaluate(**settings, decoding=decoding) for decoding in decodings]
    except RewardError as error:
        print(f"pgjax.eval: stopped: {error}", file=sys.stderr)
        return 1
    print(to_markdown(evaluations))
    if args.json:
        report = {**about, **evaluations[0]} if len(evaluations) == 1 else {**about, "budgets": evaluations}
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
