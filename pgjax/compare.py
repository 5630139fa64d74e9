"""Train the paper's seven algorithms with the same seeds and settings and compare them.

    python -m pgjax.compare [--set key=value ...] [--target 0.8] [--seeds 1] [--out runs/compare]

A study (``pgjax.study``) whose methods are REINFORCE, REINFORCE with a baseline, ReMax, RLOO, PPO, GRPO
and Dr. GRPO, each trained from its own ``experiments/arithmetic_<algorithm>.py`` (with the ``--set``
overrides) in this process, into ``--out``/``<algorithm>`` (one seed) or ``<algorithm>/seed<k>``. It
writes ``comparison.md`` (per algorithm the greedy eval accuracy at the start, the final and the best
one, the first step whose eval accuracy reaches ``--target``, the wall time; over several seeds each
the mean over seeds with its t interval across seeds) and ``comparison.png`` (eval accuracy against
step: the mean over seeds and the min-max band) into ``--out``.
"""
from __future__ import annotations

import argparse
import pathlib
import time

from pgjax import markdown
from pgjax.study import ACROSS_SEEDS_NOTE, InProcess, Study, TrainJob, plot_points_band, seed_cell
from pgjax.train.sinks import read_records

ALGORITHMS = ("reinforce", "reinforce_baseline", "remax", "rloo", "ppo", "grpo", "dr_grpo")


def comparison_study(overrides: list[str], experiments, algorithms, seeds: int) -> Study:
    """The comparison as an in-process study: each algorithm's experiment file with ``overrides``."""
    return Study(name="comparison", experiment="", base_model="", methods=dict.fromkeys(algorithms, tuple(overrides)),
                 experiments={a: str(pathlib.Path(experiments) / f"arithmetic_{a}.py") for a in algorithms},
                 seeds=tuple(range(seeds)), run_names="{method}" if seeds == 1 else "{method}/seed{seed}",
                 runner=InProcess(), keep_records=False)


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
                     seed_cell([r["seconds"] for r in runs], ".0f")])
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
    """Train each algorithm's experiment file over ``seeds`` seeds under ``out``; returns
    ``{algorithm: {seed: summary}}`` (``summarise`` and the run's wall time, ``seconds``)."""
    out = pathlib.Path(out)
    study = comparison_study(overrides, experiments, algorithms, seeds)
    results: dict[str, dict[int, dict]] = {}
    for job in study.jobs():
        assert isinstance(job, TrainJob)
        start = time.perf_counter()
        study.run_job(job, out, out, "")
        records = read_records(out / study.trained_by(job))
        summary = {**summarise(records, target), "seconds": time.perf_counter() - start}
        results.setdefault(job.method, {})[job.seed] = summary
        print(f"{job}: eval accuracy {summary['start']:.3f} -> {summary['final']:.3f}")
    text = table(results, target)
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
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be >= 1")
    compare(args.set, args.target, args.out, args.experiments, seeds=args.seeds)


if __name__ == "__main__":
    main()
