"""Train the paper's seven algorithms with the same seed and settings and compare them.

    python -m pgjax.compare [--set key=value ...] [--target 0.8] [--out runs/compare]

Runs ``experiments/arithmetic_<algorithm>.py`` for REINFORCE, REINFORCE with a
baseline, ReMax, RLOO, PPO, GRPO and Dr. GRPO (each with the ``--set``
overrides), then writes ``comparison.md`` (final and best greedy eval accuracy,
the first step whose eval accuracy reaches ``--target``, wall time) and
``comparison.png`` (eval accuracy against step) into ``--out``.

The helpers below it (``study``, ``run_seeds``, ``warm_checkpoint``,
``moving_average``, ``tail_mean``, ``plot_band``) run and summarise several
variants of one experiment over several seeds, for the experiments under
``experiments/``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time
import warnings

import numpy as np

from pgjax import config as config_lib
from pgjax.train.sinks import read_records
from pgjax.train.trainer import train

ALGORITHMS = ("reinforce", "reinforce_baseline", "remax", "rloo", "ppo", "grpo", "dr_grpo")


def summarise(records: list[dict], target: float) -> dict:
    """Final and best eval accuracy and the first step at which it reaches ``target`` (None if never)."""
    evals = [(r["step"], r["eval_accuracy"]) for r in records if r.get("eval_accuracy") is not None]
    reached = next((step for step, accuracy in evals if accuracy >= target), None)
    return {"start": evals[0][1], "final": evals[-1][1], "best": max(a for _, a in evals),
            "steps_to_target": reached, "curve": evals}


def table(results: dict, target: float) -> str:
    rows = ["| algorithm | eval accuracy at start | final | best | steps to "
            f"{target:.2f} | wall time (s) |", "|---|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        reached = "-" if r["steps_to_target"] is None else str(r["steps_to_target"])
        rows.append(f"| {name} | {r['start']:.3f} | {r['final']:.3f} | {r['best']:.3f} | {reached} | "
                    f"{r['seconds']:.0f} |")
    return "\n".join(rows)


def plot(results: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results.items():
        ax.plot(*zip(*r["curve"], strict=True), label=name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("greedy eval accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def compare(overrides: list[str], target: float, out, experiments="experiments",
            algorithms=ALGORITHMS) -> dict:
    """Train each algorithm's experiment file under ``out/<algorithm>``; returns the summaries."""
    out = pathlib.Path(out)
    results = {}
    for name in algorithms:
        exp = config_lib.load(pathlib.Path(experiments) / f"arithmetic_{name}.py")
        exp = config_lib.override(exp, overrides)
        exp = dataclasses.replace(exp, run_dir=str(out / name))
        start = time.perf_counter()
        records = read_records(train(exp, progress=False))
        results[name] = {**summarise(records, target), "seconds": time.perf_counter() - start}
        print(f"{name}: eval accuracy {results[name]['start']:.3f} -> {results[name]['final']:.3f}")
    text = table(results, target)
    (out / "comparison.md").write_text(text + "\n")
    plot(results, out / "comparison.png")
    print(text)
    return results


def warm_checkpoint(base: config_lib.Experiment, seed: int, runs) -> pathlib.Path:
    """Random seed ``seed``'s warm-started policy as a Hugging Face checkpoint (a ``steps=0`` run of ``base``
    under ``runs/warm/seed<k>``), reused if present."""
    directory = pathlib.Path(runs) / "warm" / f"seed{seed}"
    if not (directory / "final" / "config.json").exists():
        train(dataclasses.replace(base, seed=seed, steps=0, run_dir=str(directory)), progress=False)
    return directory / "final"


def run_seeds(base: config_lib.Experiment, variants: dict, seeds, runs, callbacks=()) -> dict:
    """Train every variant (a dict of overrides: ``hparams`` by their plain names, any other key of the
    experiment by its dotted name, e.g. ``rollout.staleness``) for each seed in ``seeds`` (a count n:
    0..n-1, or the seeds themselves) under ``runs/<variant>/seed<k>``, each seed's variants from the
    same warm-started checkpoint, with the trainer ``callbacks``; returns
    ``{variant: {seed: metric records}}``."""
    started = time.perf_counter()
    out: dict[str, dict[int, list[dict]]] = {variant: {} for variant in variants}
    for seed in range(seeds) if isinstance(seeds, int) else seeds:
        warm = warm_checkpoint(base, seed, runs)
        for variant, changes in variants.items():
            hparams = {k: v for k, v in changes.items() if "." not in k}
            exp = config_lib.override(base, [f"{k}={v}" for k, v in changes.items() if "." in k])
            exp = dataclasses.replace(exp, name=f"{base.name}_{variant}", seed=seed,
                                      algorithm=dataclasses.replace(exp.algorithm,
                                                                    hparams={**exp.algorithm.hparams, **hparams}),
                                      model=dataclasses.replace(base.model, path=str(warm)),
                                      warm_start=dataclasses.replace(base.warm_start, steps=0),
                                      run_dir=str(pathlib.Path(runs) / variant / f"seed{seed}"))
            out[variant][seed] = read_records(train(exp, progress=False, callbacks=callbacks))
            print(f"{variant} seed {seed}: done at {time.perf_counter() - started:.0f} s")
    return out


def moving_average(values, window: int = 10) -> np.ndarray:
    """Mean of each value and the ``window - 1`` before it (NaN-aware; NaN where all are NaN)."""
    values = np.asarray(values, float)
    out = np.full_like(values, np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1):i + 1]
        if np.isfinite(chunk).any():
            out[i] = np.nanmean(chunk)
    return out


def tail_mean(values, tail: int) -> float:
    """Mean of the last ``tail`` values that are not None / NaN (NaN if none)."""
    kept = [v for v in list(values)[-tail:] if v is not None and np.isfinite(v)]
    return float(np.mean(kept)) if kept else float("nan")


def plot_band(ax, steps, per_seed, label: str, window: int = 10) -> None:
    """Mean over seeds (rows of ``per_seed``, None = missing) and the min-max band, both smoothed."""
    values = np.array([[np.nan if v is None else v for v in row] for row in per_seed], float)
    with warnings.catch_warnings():       # a step where no seed has a value stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, low, high = (moving_average(f(values, axis=0), window) for f in (np.nanmean, np.nanmin, np.nanmax))
    line, = ax.plot(steps, mean, label=label)
    ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)


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


def study(argv, doc: str, name: str, steps: int, base_experiment, variants: dict, curves, summarise, table,
          plot, callbacks=()) -> dict:
    """The command line and outputs of a multi-seed study of ``variants`` (overrides, see ``run_seeds``).

    Options: ``--seeds``, ``--steps``, ``--tail`` (steps averaged for start / end values),
    ``--runs`` (run directories), ``--out`` (results), ``--smoke`` (2 steps, 1 seed, tail 1),
    ``--set key=value`` (overrides of the shared experiment, as in ``pgjax.run``).
    ``base_experiment(steps, smoke)`` gives the shared settings; ``curves(records)`` one run's
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
    args = parser.parse_args(argv)
    steps, seeds, tail = (2, 1, 1) if args.smoke else (args.steps, args.seeds, args.tail)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = config_lib.override(base_experiment(steps, args.smoke), args.set)
    settings = {"steps": steps, "seeds": seeds, "tail": tail, "smoke": args.smoke, "overrides": args.set}
    runs = finished_seeds(out / "summary.json", settings, variants, seeds)
    records = run_seeds(base, variants, [seed for seed in range(seeds) if seed not in runs[next(iter(variants))]],
                        args.runs, callbacks)
    for variant, by_seed in records.items():
        runs[variant].update({seed: curves(r) for seed, r in by_seed.items()})
        runs[variant] = dict(sorted(runs[variant].items()))
    summary = summarise(runs, tail)
    (out / "summary.json").write_text(json.dumps({"settings": settings, "summary": summary, "curves": runs}))
    text = table(summary, tail)
    (out / f"{name}.md").write_text(text + "\n")
    plot(runs, out / f"{name}.png")
    print(text)
    return summary


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--target", type=float, default=0.8, help="eval accuracy for 'steps to target'")
    parser.add_argument("--out", default="runs/compare")
    parser.add_argument("--experiments", default="experiments", help="folder of arithmetic_<algorithm>.py")
    args = parser.parse_args(argv)
    compare(args.set, args.target, args.out, args.experiments)


if __name__ == "__main__":
    main()
