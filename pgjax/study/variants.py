"""Studies of variants of one experiment built in Python, trained in this process: every seed's variants start
from that seed's warm-started policy, and the study's own summary, table and plot are written from the
runs' curves, which ``summary.json`` keeps (the record ``--report`` reads again)."""
from __future__ import annotations

import argparse
import json
import pathlib

from pgjax import config as config_lib
from pgjax.study.jobs import InProcess, TrainJob
from pgjax.study.runner import Study
from pgjax.train.sinks import read_records

WARM = "warm"        # the method whose run of a seed (steps=0) is the warm-started policy its variants start from


def variant_sets(experiment_name: str, variant: str, changes: dict) -> tuple[str, ...]:
    """The ``--set`` overrides of ``variant`` (``changes``: ``hparams`` by their plain names, any other key of
    the experiment by its dotted name, e.g. ``rollout.staleness``) for a run from the warm-started policy:
    no warm start of its own, and the run named ``<experiment_name>_<variant>``."""
    return (*(f"{key}={value}" if "." in key else f"algorithm.hparams.{key}={value}" for key, value in changes.items()),
            "warm_start.steps=0", f"name={experiment_name}_{variant}")


def variants_study(name: str, base: config_lib.Experiment, variants: dict, seeds, callbacks=()) -> Study:
    """The in-process ``Study`` of ``variants`` (``{variant: changes}``, see ``variant_sets``) of ``base`` over
    ``seeds``: method ``warm`` trains a seed's warm start alone (``steps=0``) and each variant continues it;
    runs in ``RUNS/<method>/seed<k>``, with the trainer ``callbacks``."""
    if WARM in variants:
        raise ValueError(f"study {name}: {WARM!r} is the warm start's method, not a variant's name")
    return Study(name=name, experiment=base, base_model="", seeds=tuple(seeds),
                 methods={WARM: ("steps=0",), **{v: variant_sets(base.name, v, c) for v, c in variants.items()}},
                 continues=dict.fromkeys(variants, WARM), run_names="{method}/seed{seed}",
                 runner=InProcess(tuple(callbacks)), keep_records=False)


def warm_checkpoint(base: config_lib.Experiment, seed: int, runs) -> pathlib.Path:
    """Random seed ``seed``'s warm-started policy as a Hugging Face checkpoint (a ``steps=0`` run of ``base``
    under ``runs/warm/seed<k>``), reused if present."""
    study = variants_study(base.name, base, {}, (seed,))
    runs = pathlib.Path(runs)
    study.run_job(TrainJob(WARM, seed), runs, runs, "")
    return runs / study.run_name(WARM, seed) / "final"


def train_seeds(study: Study, seeds, runs: pathlib.Path) -> dict:
    """Train each of ``seeds``' jobs of ``study`` (a variant's run after its seed's warm start) under
    ``runs``; returns ``{variant: {seed: metric records}}``."""
    variants = [method for method in study.methods if method != WARM]
    out: dict[str, dict[int, list[dict]]] = {variant: {} for variant in variants}
    for seed in seeds:
        for method in study.methods:
            study.run_job(TrainJob(method, seed), runs, runs, "")
        for variant in variants:
            out[variant][seed] = read_records(runs / study.run_name(variant, seed))
    return out


def finished_seeds(summary_path: pathlib.Path, settings: dict, variants, seeds: int) -> dict:
    """``{variant: {seed: curves}}`` of the seeds below ``seeds`` that an earlier study's
    ``summary.json`` holds for every one of ``variants``, if it ran with the same steps, smoke flag and
    overrides; empty per variant otherwise (no file, other settings, a seed some variant lacks)."""
    kept: dict[str, dict[int, list]] = {variant: {} for variant in variants}
    if not summary_path.exists():
        return kept
    earlier = json.loads(summary_path.read_text())
    same = ("steps", "smoke", "overrides")
    if any(earlier["settings"].get(k) != settings[k] for k in same):
        return kept
    curves = {variant: {int(seed): c for seed, c in earlier["curves"].get(variant, {}).items()}
              for variant in variants}
    done = [seed for seed in range(seeds) if all(seed in curves[variant] for variant in variants)]
    return {variant: {seed: curves[variant][seed] for seed in done} for variant in variants}


def saved_curves(summary_path: pathlib.Path) -> tuple[dict, dict]:
    """The settings and ``{variant: {seed: curves}}`` an earlier study's ``summary.json`` holds."""
    if not summary_path.exists():
        raise SystemExit(f"--report: no {summary_path} (run the study first)")
    saved = json.loads(summary_path.read_text())
    return saved["settings"], {variant: {int(seed): c for seed, c in by_seed.items()}
                               for variant, by_seed in saved["curves"].items()}


def main(argv, doc: str, name: str, steps: int, base_experiment, variants: dict, curves, summarise, table, plot,
         callbacks=()) -> dict:
    """The command line and outputs of a multi-seed study of ``variants`` (``variants_study``).

    Options: ``--seeds``, ``--steps``, ``--tail`` (steps averaged for start / end values),
    ``--runs`` (run directories), ``--out`` (results), ``--smoke`` (2 steps, 1 seed, tail 1),
    ``--set key=value`` (overrides of the shared experiment, as in ``pgjax.run``), ``--report`` (train
    nothing: the summary, table and plot again from the curves ``<out>/summary.json`` holds, with its
    tail). ``base_experiment(steps, smoke)`` gives the shared settings; ``curves(records)`` one run's
    curves; ``summarise(runs, tail)``, ``table(summary, tail)`` and ``plot(runs, path)`` the
    results, written to ``<out>/summary.json``, ``<out>/<name>.md`` and ``<out>/<name>.png``.
    Seeds whose curves ``<out>/summary.json`` already holds for every variant, under the same steps,
    smoke flag and overrides, are kept rather than trained again (``--seeds 3`` after ``--seeds 2``
    trains seed 2 only)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=f"experiments/results/{name}", help="summary, table and plot")
    parser.add_argument("--runs", default=f"runs/{name}", help="the runs' directories")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--tail", type=int, default=20, help="steps averaged for the start and end values")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 2 steps, 1 seed (the tests' check)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of the shared experiment (dotted key)")
    parser.add_argument("--report", action="store_true", help="train nothing: the outputs from <out>/summary.json")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    if args.report:
        settings, runs = saved_curves(out / "summary.json")
    else:
        steps, seeds, tail = (2, 1, 1) if args.smoke else (args.steps, args.seeds, args.tail)
        out.mkdir(parents=True, exist_ok=True)
        base = config_lib.override(base_experiment(steps, args.smoke), args.set)
        settings = {"steps": steps, "seeds": seeds, "tail": tail, "smoke": args.smoke, "overrides": args.set}
        runs = finished_seeds(out / "summary.json", settings, variants, seeds)
        missing = [seed for seed in range(seeds) if seed not in runs[next(iter(variants))]]
        records = train_seeds(variants_study(name, base, variants, missing, callbacks), missing,
                              pathlib.Path(args.runs))
        for variant, by_seed in records.items():
            runs[variant].update({seed: curves(r) for seed, r in by_seed.items()})
            runs[variant] = dict(sorted(runs[variant].items()))
    summary = summarise(runs, settings["tail"])
    (out / "summary.json").write_text(json.dumps({"settings": settings, "summary": summary, "curves": runs}))
    text = table(summary, settings["tail"])
    (out / f"{name}.md").write_text(text + "\n")
    plot(runs, out / f"{name}.png")
    print(text)
    return summary
