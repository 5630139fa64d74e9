"""Train the paper's seven algorithms with the same seeds and settings and compare them.

    python -m pgjax.compare [--set key=value ...] [--target 0.8] [--seeds 1] [--out runs/compare]

A study (``pgjax.study``) whose methods are REINFORCE, REINFORCE with a baseline, ReMax, RLOO, PPO, GRPO
and Dr. GRPO, each trained from its own ``experiments/arithmetic_<algorithm>.py`` (with the ``--set``
overrides) in this process, into ``--out``/``<algorithm>`` (one seed) or ``<algorithm>/seed<k>``. It
keeps each finished run's ``metrics.jsonl`` in ``--out``/``records/`` and each run's wall time and the
target in ``comparison.json``, and writes from those two ``comparison.md`` (per algorithm the greedy
eval accuracy at the start, the final and the best one, the first step whose eval accuracy reaches
``--target``, the wall time; over several seeds each the mean over seeds with its t interval across
seeds) and ``comparison.png`` (eval accuracy against step: the mean over seeds and the min-max band).
``--report`` writes them again from what ``--out`` keeps, training nothing.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

from pgjax import markdown
from pgjax.study import (
    ACROSS_SEEDS_NOTE,
    InProcess,
    Study,
    TrainJob,
    keep_record,
    kept_record,
    plot_points_band,
    seed_cell,
)
from pgjax.train.sinks import read_records

ALGORITHMS = ("reinforce", "reinforce_baseline", "remax", "rloo", "ppo", "grpo", "dr_grpo")


def comparison_study(overrides: list[str], experiments, algorithms, seeds: int) -> Study:
    """The comparison as an in-process study: each algorithm's experiment file with ``overrides``."""
    return Study(name="comparison", experiment="", base_model="", methods=dict.fromkeys(algorithms, tuple(overrides)),
                 experiments={a: str(pathlib.Path(experiments) / f"arithmetic_{a}.py") for a in algorithms},
                 seeds=tuple(range(seeds)), run_names="{method}" if seeds == 1 else "{method}/seed{seed}",
                 runner=InProcess())


def summarise(records: list[dict], target: float) -> dict:
    """Final and best eval accuracy and the first step at which it reaches ``target`` (None if never)."""
    evals = [(r["step"], r["eval_accuracy"]) for r in records if r.get("eval_accuracy") is not None]
    reached = next((step for step, accuracy in evals if accuracy >= target), None)
    return {"start": evals[0][1], "final": evals[-1][1], "best": max(a for _, a in evals),
            "steps_to_target": reached, "curve": evals}


def table(results: dict, target: float) -> str:
    """Per algorithm (``results``: ``{algorithm: {seed: summary}}``) its start, final and best eval accuracy
    and wall time (over several seeds: ``seed_cell``) and the step it reached ``target`` (per seed)."""
    rows = []
    for name, by_seed in results.items():
        runs = list(by_seed.values())
        reached = " / ".join("-" if r["steps_to_target"] is None else str(r["steps_to_target"]) for r in runs)
        rows.append([name, *(seed_cell([r[key] for r in runs]) for key in ("start", "final", "best")), reached,
                     seed_cell([r["seconds"] for r in runs], ".0f")
                     if all(r["seconds"] is not None for r in runs) else "-"])
    text = markdown.table(["algorithm", "eval accuracy at start", "final", "best", f"steps to {target:.2f}",
                           "wall time (s)"], rows)
    seeds = max(len(by_seed) for by_seed in results.values())
    return text if seeds == 1 else f"{text}\n\n{seeds} seeds: {ACROSS_SEEDS_NOTE}; steps to {target:.2f}: per seed."


def plot(results: dict, path) -> None:
    """Greedy eval accuracy against step per algorithm: the mean over seeds and the min-max band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, by_seed in results.items():
        plot_points_band(ax, [r["curve"] for r in by_seed.values()], name)
    ax.set_xlabel("RL step")
    ax.set_ylabel("greedy eval accuracy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def compare(overrides: list[str], target: float, out, experiments="experiments", algorithms=ALGORITHMS,
            seeds: int = 1) -> dict:
    """Train each algorithm's experiment file over ``seeds`` seeds under ``out`` and ``report`` them.
    ``comparison.json`` holds the target, the overrides, each algorithm's runs by seed and each run's wall
    time by run name; it is written after every run, so a comparison stopped part way keeps the times of
    the runs it finished (a run found finished keeps its saved time, when the overrides are the same)."""
    out = pathlib.Path(out)
    study = comparison_study(overrides, experiments, algorithms, seeds)
    saved_path = out / "comparison.json"
    saved = json.loads(saved_path.read_text()) if saved_path.exists() else {}
    seconds: dict[str, float] = saved.get("seconds", {}) if saved.get("overrides") == overrides else {}
    runs: dict[str, dict[str, str]] = {}
    for job in study.jobs():
        assert isinstance(job, TrainJob)
        name, start, trained = study.trained_by(job), time.perf_counter(), not study.done(job, out, out)
        study.run_job(job, out, out, "")
        if trained:
            seconds[name] = time.perf_counter() - start
        keep_record(name, out, out)                  # a run finished before its record was kept
        runs.setdefault(job.method, {})[str(job.seed)] = name
        saved_path.write_text(json.dumps({"target": target, "overrides": overrides, "runs": runs,
                                          "seconds": seconds}, indent=1) + "\n")
    return report(out)


def report(out) -> dict:
    """Write ``comparison.md`` and ``comparison.png`` from the kept records and ``comparison.json`` in
    ``out``; returns ``{algorithm: {seed: summary}}`` (``summarise`` and the run's wall time, ``seconds``:
    None for a run with no time saved). ValueError naming a missing file."""
    out = pathlib.Path(out)
    if not (out / "comparison.json").is_file():
        raise ValueError(f"{out} holds no comparison.json: train the comparison first")
    saved = json.loads((out / "comparison.json").read_text())
    results: dict[str, dict[int, dict]] = {}
    for algorithm, by_seed in saved["runs"].items():
        for seed, name in by_seed.items():
            record = kept_record(name, out)
            if not record.is_file():
                raise ValueError(f"{record} is missing: the run of {algorithm}, seed {seed}, did not finish")
            results.setdefault(algorithm, {})[int(seed)] = {**summarise(read_records(record.parent), saved["target"]),
                                                            "seconds": saved["seconds"].get(name)}
    text = table(results, saved["target"])
    (out / "comparison.md").write_text(text + "\n")
    plot(results, out / "comparison.png")
    print(text)
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--target", type=float, default=0.8, help="eval accuracy for 'steps to target'")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per algorithm (0..N-1)")
    parser.add_argument("--out", default="runs/compare")
    parser.add_argument("--experiments", default="experiments", help="folder of arithmetic_<algorithm>.py")
    parser.add_argument("--report", action="store_true", help="only write the table and plot again from --out")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    if args.report:
        try:
            report(args.out)
        except ValueError as error:
            parser.exit(1, f"pgjax.compare: {error}\n")
    else:
        compare(args.set, args.target, args.out, args.experiments, seeds=args.seeds)


if __name__ == "__main__":
    main()
