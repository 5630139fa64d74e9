"""The study runner: ``Study`` (methods x seeds, references and evaluations, as jobs), its plan, report and
command line (the package docstring describes them)."""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from pgjax import config as config_lib
from pgjax import markdown
from pgjax.evaluation import paired
from pgjax.evaluation.held_out import budgets_of, digits_of
from pgjax.evaluation.held_out import to_markdown as evaluation_table
from pgjax.evaluation.statistics import across_seeds, welch_across_seeds
from pgjax.machine import cpu_line
from pgjax.study.curves import ACROSS_SEEDS_NOTE, plot_points_band, seed_cell
from pgjax.study.jobs import EvalJob, Job, Runner, Subprocess, TrainJob
from pgjax.train.sinks import MACHINES_FILE, read_machines, read_records

NO_VARIANT = {"": ()}


@dataclass(frozen=True)
class Evaluation:
    """One kind of evaluation job: ``pgjax.eval MODEL *arguments *variants[v] --json OUT/kind/MODEL_v.json``
    for each model of ``models`` (None: every reference and trained run) and each variant.

    ``paired``: the report compares the models in pairs per variant (same prompts: the arguments must
    fix ``--seed`` and ``--prompts``); otherwise it shows each model's own evaluation table (budgets,
    pass@k). ``titles``: each variant's section title; ``minutes``: the estimated time of one job."""
    kind: str
    arguments: tuple[str, ...]
    minutes: float
    variants: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(NO_VARIANT))
    titles: Mapping[str, str] = field(default_factory=dict)
    models: tuple[str, ...] | None = None
    paired: bool = True

    def __post_init__(self):
        if ":" in self.kind or self.kind == "train" or any(":" in v or "_" in v for v in self.variants):
            raise ValueError(f"evaluation {self.kind!r}: its kind may not be 'train' or hold ':', nor a variant "
                             f"':' or '_' (job names and output files are built from them), got {list(self.variants)}")
        if not self.variants:
            raise ValueError(f"evaluation {self.kind!r} has no variants (NO_VARIANT for one without)")

    def title(self, variant: str) -> str:
        """The report's heading of ``variant``."""
        return self.titles.get(variant, f"{self.kind} {variant}".strip())


@dataclass(frozen=True)
class Study:
    """``methods``: ``{method: --set overrides of the experiment}``, each trained once per seed from
    ``experiment`` (an experiment file, or for an in-process ``runner`` an ``Experiment``) or the method's
    own file in ``experiments``, starting from ``base_model`` (``""``: the experiment's own model), into
    ``RUNS/<run_names>`` (a format of ``method`` and ``seed``) by ``runner``: ``Subprocess()`` (a
    ``python -m pgjax.run`` each, which outlives the session) or ``InProcess(callbacks)`` (this process,
    the runs sharing compiled programs); ``keep_records``: copy each finished run's metrics.jsonl to
    ``OUT/records`` (the record the report's curves and training table read).
    ``references``: ``{name: pgjax.eval arguments after the base checkpoint}`` (its task options: a
    reference has no experiment.json), needed by a paired evaluation; ``train_minutes``: the estimated time
    of one training job, and ``machine`` the machine those estimates come from. ``record_metrics``:
    per-step record fields the report tables per method, each window of ``record_window`` steps (``training_table``).
    ``continues``: ``{method: earlier method}``: each seed's run of the method starts from the final
    policy of the earlier method's run of the same seed, not from the base model (a warm start
    shared by the methods compared after it). ``curve_metrics``: the record fields the plot shows.
    ``method_seeds``: ``{method: seeds}`` for a method trained on other seeds than ``seeds`` (a longer
    run on one seed, say). ``record_contrasts``: ``(B, A)`` pairs of methods whose ``record_metrics`` the
    report tests across seeds (``contrast_table``)."""
    name: str
    experiment: str | config_lib.Experiment
    base_model: str
    methods: Mapping[str, tuple[str, ...]]
    seeds: tuple[int, ...]
    references: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    evaluations: tuple[Evaluation, ...] = ()
    train_minutes: float = 0.0
    machine: str = "this machine"
    experiments: Mapping[str, str] = field(default_factory=dict)
    run_names: str = "{method}_s{seed}"
    runner: Runner = Subprocess()
    keep_records: bool = True
    curve_title: str = ""
    record_metrics: tuple[str, ...] = ()
    record_window: int = 10
    continues: Mapping[str, str] = field(default_factory=dict)
    curve_metrics: tuple[str, ...] = ("eval_accuracy",)
    method_seeds: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    record_contrasts: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        order = list(self.methods)
        wrong = {m: e for m, e in self.continues.items() if m not in order or e not in order[:order.index(m)]}
        if wrong:
            raise ValueError(f"study {self.name}: a method continues an earlier method of the study, got {wrong} "
                             f"(methods in order: {order})")
        unknown = {m for pair in self.record_contrasts for m in pair} - set(order)
        if unknown or any(len(pair) != 2 for pair in self.record_contrasts):
            raise ValueError(f"study {self.name}: record_contrasts are (B, A) pairs of its methods, got "
                             f"{self.record_contrasts} (methods: {order})")
        if set(self.method_seeds) - set(self.methods):
            raise ValueError(f"study {self.name}: method_seeds names methods not in the study: "
                             f"{sorted(set(self.method_seeds) - set(self.methods))}")
        unnamed = [m for m in self.methods if self.experiment_of(m) == ""]
        if unnamed:
            raise ValueError(f"study {self.name}: no experiment for the methods {unnamed}")
        built = [m for m in self.methods if not isinstance(self.experiment_of(m), str)]
        if isinstance(self.runner, Subprocess) and built:
            raise ValueError(f"study {self.name}: a pgjax.run process trains an experiment file; an Experiment "
                             "built in Python needs the InProcess runner")
        clashes = set(self.references) & set(self.trained())
        kinds, paired = [e.kind for e in self.evaluations], any(e.paired for e in self.evaluations)
        if clashes or len(set(kinds)) != len(kinds) or (paired and not self.references):
            raise ValueError(f"study {self.name}: needs a reference, distinct evaluation kinds ({kinds}) and no "
                             f"reference named like a trained run ({sorted(clashes)})")

    def run_name(self, method: str, seed: int) -> str:
        """The directory (under RUNS) and model name of ``method``'s run with ``seed``."""
        return self.run_names.format(method=method, seed=seed)

    def experiment_of(self, method: str) -> str | config_lib.Experiment:
        """The experiment ``method`` trains: its own file in ``experiments``, else the study's."""
        return self.experiments.get(method, self.experiment)

    def seeds_of(self, method: str) -> tuple[int, ...]:
        """The seeds ``method`` is trained with."""
        return self.method_seeds.get(method, self.seeds)

    def trained(self) -> list[str]:
        """Every trained run's name, method by method."""
        return [self.run_name(m, s) for m in self.methods for s in self.seeds_of(m)]

    def models(self) -> list[str]:
        """The references, then every trained run."""
        return [*self.references, *self.trained()]

    def evaluation(self, kind: str) -> Evaluation:
        """The study's evaluation of ``kind``."""
        return next(e for e in self.evaluations if e.kind == kind)

    def jobs(self) -> list[Job]:
        """Every job of the study, in the order it runs: training, then each evaluation in turn."""
        jobs: list[Job] = [TrainJob(m, s) for m in self.methods for s in self.seeds_of(m)]
        for e in self.evaluations:
            jobs += [EvalJob(e.kind, model, v) for model in (e.models or self.models()) for v in e.variants]
        return jobs

    def training_of(self, model: str) -> TrainJob:
        """The training job of trained run ``model``."""
        return next(job for job in self.jobs() if isinstance(job, TrainJob) and self.trained_by(job) == model)

    def trained_by(self, job: TrainJob) -> str:
        """The run that training job ``job`` writes."""
        return self.run_name(job.method, job.seed)

    def output(self, job: Job, runs: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
        """The file whose existence means ``job`` is done (for a training job, its policy)."""
        if isinstance(job, TrainJob):
            return runs / self.trained_by(job) / "final"
        return out / job.kind / ("_".join(filter(None, (job.model, job.variant))) + ".json")

    def starting_run(self, job: TrainJob) -> str | None:
        """The trained run whose final policy training job ``job`` starts from (None: the base model)."""
        return self.run_name(self.continues[job.method], job.seed) if job.method in self.continues else None

    def policy_users(self, model: str) -> list[Job]:
        """The jobs that read trained run ``model``'s final policy: its evaluations and the training jobs
        that continue it."""
        return [job for job in self.jobs()
                if (self.starting_run(job) if isinstance(job, TrainJob) else job.model) == model]

    def done(self, job: Job, runs: pathlib.Path, out: pathlib.Path) -> bool:
        """Whether ``job`` has nothing left to do: its output exists, or, for a training job whose policy
        is gone with an earlier session's RUNS, every job that reads the policy is done and either there
        is one (without a kept record the run is missing from the curves, which ``plan`` says, but
        training it again would give a different run than the one evaluated) or the run's record is
        kept (a study whose report reads the records alone)."""
        if self.output(job, runs, out).exists():
            return True
        if not isinstance(job, TrainJob):
            return False
        users = self.policy_users(self.trained_by(job))
        kept = self.keep_records and kept_record(self.trained_by(job), out).exists()
        return (bool(users) or kept) and all(self.done(j, runs, out) for j in users)

    def train_sets(self, job: TrainJob, runs: pathlib.Path, base_model: str) -> list[str]:
        """The ``--set`` overrides of training job ``job``: its run directory, seed, starting policy (none
        named: the experiment's own model) and the method's overrides."""
        start = self.starting_run(job)
        start = str(runs / start / "final") if start else base_model
        return [f"run_dir={runs / self.trained_by(job)}", f"seed={job.seed}",
                *([f"model.path={start}"] if start else []), *self.methods[job.method]]

    def eval_command(self, job: EvalJob, runs: pathlib.Path, out: pathlib.Path, base_model: str) -> list[str]:
        """The ``pgjax.eval`` command line of evaluation job ``job``."""
        evaluation, model = self.evaluation(job.kind), job.model
        variant = evaluation.variants[job.variant]
        target = [base_model, *self.references[model]] if model in self.references else [str(runs / model)]
        return [sys.executable, "-m", "pgjax.eval", *target, *map(str, evaluation.arguments), *map(str, variant),
                "--json", str(self.output(job, runs, out))]

    def run_job(self, job: Job, runs: pathlib.Path, out: pathlib.Path, base_model: str) -> None:
        """Run ``job`` unless it is ``done``: a training job by the study's ``runner`` (a finished one keeps
        its record), an evaluation as a ``pgjax.eval`` process, which waits for the run's training."""
        if self.done(job, runs, out):
            return
        if isinstance(job, TrainJob):
            needed = self.starting_run(job)
        else:
            needed = None if job.model in self.references else job.model
        if needed and not (runs / needed / "final").exists():
            raise SystemExit(f"{job}: {runs / needed} has no final policy: run {self.training_of(needed)} first")
        self.output(job, runs, out).parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        print(f"{job}", flush=True)
        if isinstance(job, TrainJob):
            directory = runs / self.trained_by(job)
            self.runner.train(self.experiment_of(job.method), self.train_sets(job, runs, base_model), directory)
            if self.keep_records:
                keep_record(self.trained_by(job), runs, out)
        else:
            command = self.eval_command(job, runs, out, base_model)
            print(" ".join(command), flush=True)
            subprocess.run(command, check=True)
        print(f"{job}: done in {time.perf_counter() - started:.0f} s", flush=True)

    def minutes(self, job: Job) -> float:
        """The estimated minutes of ``job``."""
        return self.train_minutes if isinstance(job, TrainJob) else self.evaluation(job.kind).minutes

    def plan(self, selected: list[Job], runs: pathlib.Path, out: pathlib.Path) -> str:
        """One line per job (done, or missing with its estimated minutes) and the total left."""
        lines, left = [], 0.0
        for job in selected:
            finished = self.done(job, runs, out)
            left += 0 if finished else self.minutes(job)
            status = "done" if finished else f"missing (~{self.minutes(job):g} min)"
            if finished and isinstance(job, TrainJob) and not kept_record(self.trained_by(job), out).exists():
                status += " (its record is not kept: the curves leave it out)"
            lines.append(f"{str(job):36s} {status}")
        return "\n".join(lines + [f"left: ~{left / 60:.1f} h on {self.machine}"])

    def paired_report(self, evaluation: Evaluation, variant: str, runs: pathlib.Path, out: pathlib.Path) -> str | None:
        """``pgjax.eval compare``'s tables for one evaluation and variant: the references and each method
        with the seeds evaluated so far (named, so that two methods with the same seeds are paired by
        seed across seeds); None unless a reference and one other model are evaluated."""
        def evaluated(model: str, seeds) -> list[tuple[int | None, pathlib.Path]]:
            paths = [(s, self.output(EvalJob(evaluation.kind, model if s is None else self.run_name(model, s),
                                             variant), runs, out)) for s in seeds]
            return [(s, path) for s, path in paths if path.exists()]

        found = {ref: evaluated(ref, [None]) for ref in self.references}
        found.update({m: evaluated(m, self.seeds_of(m)) for m in self.methods})
        found = {label: done for label, done in found.items() if done}
        if not set(found) & set(self.references) or len(found) < 2:
            return None
        groups = {label: [paired.load_evaluation(path) for _, path in done] for label, done in found.items()}
        run_seeds = {m: [s for s, _ in found[m] if s is not None] for m in self.methods if m in found}
        return paired.to_markdown(paired.compare(groups, run_seeds=run_seeds))

    def reference_pairs(self, evaluated: dict[str, pathlib.Path]) -> str | None:
        """``paired.pass_at_k_pairs`` of each model of an unpaired evaluation (``{model: report path}``, in
        order) against the first, when that one is a reference: pass@k differences per prompt (a line saying
        why not where an evaluation holds no per-prompt outcomes)."""
        first = next(iter(evaluated), "")
        if first not in self.references or len(evaluated) < 2:
            return None

        def loaded(path: pathlib.Path) -> list[dict]:
            return [paired.load_evaluation(path, ev["decoding"]["max_new_tokens"])
                    for ev in budgets_of(json.loads(path.read_text()))]
        try:
            return paired.pass_at_k_pairs((first, loaded(evaluated[first])),
                                          {model: loaded(path) for model, path in evaluated.items() if model != first})
        except ValueError as error:         # an evaluation written without per-prompt outcomes: no pairs
            return f"No pairs: {error}"

    def curves(self, out: pathlib.Path, metric: str = "eval_accuracy") -> dict:
        """``{method: {seed: [(step, value)]}}`` of ``metric`` in the runs whose records are kept: the
        greedy evaluation accuracy where measured, a per-step metric as its mean over each window of
        ``record_window`` steps, placed at the window's last step."""
        found: dict[str, dict[int, list[tuple[int, float]]]] = {}
        for method in self.methods:
            for seed in self.seeds_of(method):
                path = kept_record(self.run_name(method, seed), out)
                if not path.exists():
                    continue
                records = read_records(path.parent)
                if metric == "eval_accuracy":
                    points = [(r["step"], r[metric]) for r in records if r.get(metric) is not None]
                else:
                    windows = _windows(max((r["step"] for r in records), default=0), self.record_window)
                    points = [(end, _window_mean(records, metric, start, end)) for start, end in windows]
                    points = [(end, value) for end, value in points if value is not None]
                if points:
                    found.setdefault(method, {})[seed] = points
        return found

    def training_table(self, out: pathlib.Path) -> str | None:
        """Per method and window of ``record_window`` steps, each of ``record_metrics`` averaged over the
        window's steps (steps where it is undefined left out) in each seed's kept record, then the mean
        over the seeds and its t interval (``seed_cell``); and the greedy evaluation at the window's last
        step. None without ``record_metrics`` or kept records."""
        rows = []
        for method in self.methods:
            paths = {seed: kept_record(self.run_name(method, seed), out) for seed in self.seeds_of(method)}
            records = {seed: read_records(path.parent) for seed, path in paths.items() if path.exists()}
            if not records:
                continue
            for start, end in _windows(max(r["step"] for rs in records.values() for r in rs), self.record_window):
                cells = []
                for name in (*self.record_metrics, "eval_accuracy"):
                    per_seed = [_window_mean(rs, name, end if name == "eval_accuracy" else start, end)
                                for rs in records.values()]
                    present = [v for v in per_seed if v is not None]
                    cells.append(seed_cell(present, record_format(name)) if present else None)
                rows.append([method, len(records), f"{start}-{end}", *cells])
        if not self.record_metrics or not rows:
            return None
        names = [*self.record_metrics, "greedy eval at the window's end"]
        return "\n".join([markdown.table(["method", "seeds", "steps", *names], rows, "lrl" + "r" * len(names)), "",
                          f"Each cell: per seed its mean over the window's steps, then the {ACROSS_SEEDS_NOTE}; "
                          "from the kept records (records/ beside this report)."])

    def window_means(self, method: str, out: pathlib.Path, name: str) -> dict[tuple[int, int], dict[int, float]]:
        """``{(first step, last step): {seed: the mean of record field name over the window}}`` of ``method``'s
        kept records, windows of ``record_window`` steps, seeds where the field is defined in the window."""
        records = {seed: read_records(path.parent) for seed in self.seeds_of(method)
                   if (path := kept_record(self.run_name(method, seed), out)).exists()}
        if not records:
            return {}
        found: dict[tuple[int, int], dict[int, float]] = {}
        for start, end in _windows(max(r["step"] for rs in records.values() for r in rs), self.record_window):
            for seed, rs in records.items():
                value = _window_mean(rs, name, start, end)
                if value is not None:
                    found.setdefault((start, end), {})[seed] = value
        return found

    def contrast_table(self, out: pathlib.Path) -> str | None:
        """For each ``record_contrasts`` pair (B, A) and each of ``record_metrics``, across seeds (each seed's
        mean over a window of steps, from the kept records): each method's change from its first window to
        its last (Student's t paired by seed, ``across_seeds``), and B - A in the last window both have
        (Welch's t, ``welch_across_seeds``; where both have the same seeds, also the t paired by seed).
        None without contrasts or with fewer than two seeds a method."""
        rows = []
        methods = list(dict.fromkeys(method for pair in self.record_contrasts for method in pair))
        for name in self.record_metrics:
            means = {method: self.window_means(method, out, name) for method in methods}
            for method, windows in means.items():
                first, last = (windows[w] for w in (min(windows), max(windows))) if windows else ({}, {})
                seeds = sorted(set(first) & set(last))
                if len(seeds) >= 2 and len(windows) >= 2:
                    change = across_seeds([last[s] for s in seeds], [first[s] for s in seeds])
                    (start, end), (start_last, end_last) = min(windows), max(windows)
                    rows.append(self._contrast_row(method, name, f"{start}-{end} -> {start_last}-{end_last}",
                                                   str(len(seeds)), change, "paired t", None))
            for b, a in self.record_contrasts:
                shared = sorted(set(means[b]) & set(means[a]))
                at_b, at_a = (means[b][shared[-1]], means[a][shared[-1]]) if shared else ({}, {})
                if min(len(at_b), len(at_a)) >= 2:
                    seeds = sorted(at_b)
                    paired_t = (across_seeds([at_b[s] for s in seeds], [at_a[s] for s in seeds])
                                if seeds == sorted(at_a) else None)
                    rows.append(self._contrast_row(f"{b} - {a}", name, f"{shared[-1][0]}-{shared[-1][1]}",
                                                   f"{len(at_b)}, {len(at_a)}",
                                                   welch_across_seeds(list(at_b.values()), list(at_a.values())),
                                                   "Welch t", paired_t))
        if not rows:
            return None
        return "\n".join([markdown.table(["contrast", "metric", "steps", "seeds", "mean difference",
                                           "95% CI (t across seeds)", "p (t across seeds)", "p (t paired by seed)"],
                                          rows, "llllrrrr"), "",
                          "Each seed's mean over a window of steps, from the kept records; a method's row: its last "
                          "window minus its first, Student's t paired by seed; B - A: the last window both have, "
                          "seeds: how many of B's and of A's, "
                          "Welch's t over the two methods' seeds and, where they share their seeds, the t paired "
                          "by seed (pgjax.evaluation.statistics). The seeds are the sample: few seeds, few degrees "
                          "of freedom."])

    @staticmethod
    def _contrast_row(label: str, name: str, steps: str, seeds: str, stats: dict, test: str,
                      paired_t: dict | None) -> list:
        digits = digits_of(name)
        return [label, name, steps, seeds, f"{stats['mean']:+.{digits}f}",
                "[{:+.{d}f}, {:+.{d}f}]".format(*stats["ci95"], d=digits), f"{stats['p_value']:.3g} ({test})",
                "-" if paired_t is None else f"{paired_t['p_value']:.3g}"]

    def final_table(self, out: pathlib.Path) -> str | None:
        """Per method, each seed's first and last greedy evaluation in its kept record (the run's eval
        prompts; the first is the starting policy's, after any warm start), the last ones' mean with its t
        interval across seeds (``seed_cell``) and their range; None without kept records that hold an
        evaluation."""
        rows = []
        for method, by_seed in self.curves(out, "eval_accuracy").items():
            last = [points[-1][1] for points in by_seed.values()]
            rows.append([method, len(by_seed),
                         ", ".join(f"{seed}: {points[0][1]:.3f} -> {points[-1][1]:.3f}"
                                   for seed, points in by_seed.items()),
                         seed_cell(last), f"{min(last):.3f}-{max(last):.3f}",
                         ", ".join(sorted({f"{points[0][0]}-{points[-1][0]}" for points in by_seed.values()}))])
        if not rows:
            return None
        return "\n".join([markdown.table(["method", "seeds", "per seed: first -> last", "last: mean [95% t interval]",
                                           "last: range", "steps"], rows, "lrlrrr"), "",
                          f"Each seed's first and last greedy evaluation in its kept record; the last ones' "
                          f"{ACROSS_SEEDS_NOTE}."])

    def machines_table(self, out: pathlib.Path) -> str | None:
        """Per kept run, the CPU of each sitting and the steps it computed (from the machines.jsonl kept
        beside its record); a run kept without one says so. None where no kept run has one (records kept
        before runs recorded their machines)."""
        rows = []
        for model in self.trained():
            record = kept_record(model, out)
            if not record.exists():
                continue
            last = max((r["step"] for r in read_records(record.parent)), default=0)
            sittings = read_machines(record.parent)
            ends = [following["step"] for following in sittings[1:]] + [last]       # one end with no sittings
            rows += [[model, f"{sitting['step'] + 1}-{end}", cpu_line(sitting["cpu"])]
                     for sitting, end in zip(sittings, ends, strict=False)] or [[model, f"1-{last}", "not recorded"]]
        if all(row[2] == "not recorded" for row in rows):
            return None
        return markdown.table(["run", "steps", "CPU"], rows, "lll")

    def report(self, runs: pathlib.Path, out: pathlib.Path) -> str | None:
        """The study's markdown (written to ``OUT/NAME.md``) and plot, from the outputs that exist; None
        while no table has its models evaluated (a paired one needs a reference and another model)."""
        sections = []
        for evaluation in self.evaluations:
            for variant in evaluation.variants:
                if evaluation.paired:
                    table = self.paired_report(evaluation, variant, runs, out)
                    if table:
                        sections.append(f"### {evaluation.title(variant)}\n\n{table}")
                    continue
                evaluated = {}
                for model in evaluation.models or self.models():
                    path = self.output(EvalJob(evaluation.kind, model, variant), runs, out)
                    if path.exists():
                        evaluated[model] = path
                        table = evaluation_table(budgets_of(json.loads(path.read_text())))
                        sections.append(f"### {evaluation.title(variant)}: {model}\n\n{table}")
                pairs = self.reference_pairs(evaluated)
                if pairs:
                    sections.append(f"### {evaluation.title(variant)}: paired against {next(iter(evaluated))}\n\n"
                                    f"{pairs}")
        for model in self.trained() if self.keep_records else ():
            if not kept_record(model, out).exists():
                keep_record(model, runs, out)
        found = {metric: curves for metric in self.curve_metrics if (curves := self.curves(out, metric))}
        if found:
            plot(found, out / f"{self.name}.png", self.curve_title or self.name, self.record_window)
        training = self.training_table(out)
        if training:
            sections.append(f"### training, per {self.record_window} steps\n\n{training}")
        contrasts = self.contrast_table(out)
        if contrasts:
            sections.append(f"### training, across seeds\n\n{contrasts}")
        final = self.final_table(out)
        if final:
            sections.append(f"### the last greedy evaluation of each seed\n\n{final}")
        machines = self.machines_table(out)
        if machines:
            sections.append(f"### the machines that trained each run\n\n{machines}")
        if not sections:
            return None
        text = "\n\n".join(sections)
        (out / f"{self.name}.md").write_text(text + "\n")
        return text


def record_format(name: str) -> str:
    """How a study's training table writes record field ``name``: the sampler-learner mismatch KL in
    scientific notation (it spans 1e-11 to 1e-2), seconds to 0.1, the rest as ``digits_of`` says
    (lengths to 0.1, rates and the KL to the reference to 0.001)."""
    if name == "mismatch_kl":
        return ".2e"
    return ".1f" if name.startswith("time_") else f".{digits_of(name)}f"


def _windows(last: int, width: int) -> list[tuple[int, int]]:
    """Steps 1..``last`` cut into windows of ``width`` steps (the last one shorter): (first, last) each."""
    return [(start, min(start + width - 1, last)) for start in range(1, last + 1, width)]


def _window_mean(records: list[dict], name: str, start: int, end: int) -> float | None:
    """The mean of ``name`` over the records of steps ``start``..``end`` that define it (None: none do)."""
    values = [r[name] for r in records if start <= r["step"] <= end and r.get(name) is not None
              and np.isfinite(r[name])]
    return float(np.mean(values)) if values else None


def kept_record(model: str, out: pathlib.Path) -> pathlib.Path:
    """The committed copy of trained run ``model``'s metrics.jsonl."""
    return out / "records" / model / "metrics.jsonl"


def keep_record(model: str, runs: pathlib.Path, out: pathlib.Path) -> None:
    """Copy finished run ``model``'s metrics.jsonl to ``kept_record``, and its machines.jsonl (the
    machine of each sitting) beside it; a run still training is left out: its partial curve would pull
    the mean of its later steps towards the other seeds'."""
    source = runs / model / "metrics.jsonl"
    if (runs / model / "final").is_dir() and source.exists():
        kept_record(model, out).parent.mkdir(parents=True, exist_ok=True)
        kept_record(model, out).write_bytes(source.read_bytes())
        machines = runs / model / MACHINES_FILE
        if machines.exists():
            kept_record(model, out).with_name(MACHINES_FILE).write_bytes(machines.read_bytes())


CURVE_LABELS = {"eval_accuracy": "greedy accuracy, the run's eval prompts", "accuracy": "the verifier's accuracy",
                "learned_reward": "the reward model's mean score",
                "reward_model_agreement": "the reward model's agreement with the verifier"}


def plot(found: dict, path: pathlib.Path, title: str, window: int) -> None:
    """``{metric: Study.curves}`` against step, one panel per metric: per method the mean over its seeds
    and the min-max band (a per-step metric's points: means over ``window`` steps)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(found), figsize=(6 * len(found), 4), squeeze=False)
    for ax, (metric, curves) in zip(axes[0], found.items(), strict=True):
        for method, by_seed in curves.items():
            seeds = f"{len(by_seed)} seed{'s' * (len(by_seed) > 1)}"
            plot_points_band(ax, by_seed.values(), f"{method} ({seeds})", marker="o")
        ax.set_xlabel("RL step")
        label = CURVE_LABELS.get(metric, metric)
        ax.set_ylabel(label if metric == "eval_accuracy" else f"{label}, {window}-step means", fontsize=8)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: mean and min-max over seeds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(study: Study, argv=None, description: str | None = None) -> None:
    """The study file's command line (module docstring)."""
    parser = argparse.ArgumentParser(description=description or __doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", nargs="+", metavar="JOB", help="these jobs only, in this order (default: all)")
    parser.add_argument("--plan", action="store_true", help="list the jobs, done or missing, and stop")
    parser.add_argument("--report", action="store_true", help="run nothing: the tables and the plot only")
    parser.add_argument("--runs", default=f"runs/{study.name}", help="folder of the runs' directories")
    parser.add_argument("--out", default=f"experiments/results/{study.name}")
    parser.add_argument("--base-model", default=study.base_model, help="the checkpoint every method starts from")
    args = parser.parse_args(argv)
    runs, out = pathlib.Path(args.runs), pathlib.Path(args.out)
    names = {str(job): job for job in study.jobs()}
    unknown = [name for name in args.jobs or () if name not in names]
    if unknown:
        raise SystemExit(f"unknown jobs {unknown}; the study's jobs: {' '.join(names)}")
    selected = [names[name] for name in args.jobs] if args.jobs else study.jobs()
    if args.plan:
        print(study.plan(selected, runs, out))
        return
    if not args.report:
        for job in selected:
            study.run_job(job, runs, out, args.base_model)
    out.mkdir(parents=True, exist_ok=True)
    text = study.report(runs, out)
    if text is None:
        nothing = (f"nothing to report yet under {out}: a paired table needs a reference and another model "
                   f"evaluated (--plan lists what is missing)")
        if args.report:
            raise SystemExit(nothing)
        text = nothing
    print(text)
