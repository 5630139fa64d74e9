"""The study runner: one experiment (or one experiment file per method) trained by several methods over
several seeds as typed jobs (``jobs.TrainJob``, ``jobs.EvalJob``), each trained run and each reference
checkpoint evaluated by ``python -m pgjax.eval`` on the same prompts, the evaluations compared in pairs
(``pgjax.evaluation.paired``), and the across-seed statistics computed by the report.

- ``runner.Study``: the jobs, their outputs, plan and report, and ``main``, a study file's command line;
- ``jobs``: the typed jobs and the two ways a training job runs, chosen by the study: ``Subprocess()``
  (``python -m pgjax.run``, which survives the end of a session: real models) or ``InProcess(callbacks)``
  (this process, the runs sharing compiled programs: tiny models, the seven-algorithm comparison
  ``pgjax.compare`` and the bias studies of ``experiments/scripts/``);
- ``variants``: a study of variants of one experiment built in Python, every seed's variants from its
  warm-started policy, with the study's own summary, table and plot (``variants.main``);
- ``curves``: moving and tail means, the one band plot (mean over seeds, min-max band; ``plot_points_band``
  for per-seed ``(step, value)`` points), and the across-seed statistic every table prints (``seed_cell``:
  the mean and Student's t 95% interval across seeds, ``pgjax.evaluation.statistics.across_seeds``).

A study file (``experiments/studies/smollm2_seeds.py``, ``experiments/studies/gemma3_seeds.py``) defines a ``Study``
and calls ``main(STUDY)``; its command line:

    python experiments/STUDY.py --plan       # each job: done or missing, and its estimated minutes
    python experiments/STUDY.py              # runs every missing job, in order
    python experiments/STUDY.py --jobs train:dr_grpo:0 eval:base:none      # only these
    python experiments/STUDY.py --report     # the tables and the plot from what exists

The jobs, in order:

- ``train:METHOD:SEED``: the method's experiment trained by the study's runner (a study file's:
  ``python -m pgjax.run EXPERIMENT``) from ``--base-model`` (or, for a method that ``continues``
  another, from that method's run of the same seed) with ``seed=SEED`` and the method's overrides, into
  ``RUNS/METHOD_sSEED`` (``run_names``; resumed when it has checkpoints);
- ``KIND:MODEL[:VARIANT]``, one per ``Evaluation``: ``python -m pgjax.eval`` of a reference (the base
  checkpoint with the reference's task arguments) or of a trained run (whose ``experiment.json``
  gives its task), with the evaluation's arguments and the variant's, into ``OUT/KIND/MODEL[_VARIANT].json``.

Every job writes one file and is skipped when that file exists. ``OUT`` is committed and ``RUNS`` is
not: a training job also copies its run's ``metrics.jsonl`` and ``machines.jsonl`` (the machine of each
sitting) to ``OUT/records/RUN/``, and a run whose record is kept counts as trained unless a job still to
run needs its policy.

``--report`` writes ``OUT/NAME.md`` (per paired evaluation and variant: each method's spread across
seeds, the paired statistics of every pair of models with the runs fixed, and, where a model has
several seeds, the statistics across seeds: the runs-and-prompts bootstrap interval, Welch's or the
one-sample t test, and the t test paired by seed where two methods share their seeds; each unpaired
evaluation's table; the training table of ``record_metrics``, each cell the mean over seeds and its t
interval across seeds; each seed's first and last greedy evaluation in its kept record, with the last
ones' mean, t interval and range; the CPU of each sitting of each kept run) and
``OUT/NAME.png`` (each of ``curve_metrics`` against step, one panel each, per method the mean over its
seeds and the min-max band, from the kept records: by default the greedy evaluation accuracy in
training; a per-step training metric is averaged over windows of ``record_window`` steps).
"""
from pgjax.study.curves import (
    ACROSS_SEEDS_NOTE,
    moving_average,
    plot_band,
    plot_points_band,
    seed_cell,
    seed_statistics,
    tail_mean,
)
from pgjax.study.jobs import EvalJob, InProcess, Job, Subprocess, TrainJob
from pgjax.study.runner import NO_VARIANT, Evaluation, Study, keep_record, kept_record, main

__all__ = ["ACROSS_SEEDS_NOTE", "NO_VARIANT", "EvalJob", "Evaluation", "InProcess", "Job", "Study", "Subprocess",
           "TrainJob", "keep_record", "kept_record", "main", "moving_average", "plot_band",
           "plot_points_band", "seed_cell", "seed_statistics", "tail_mean"]
