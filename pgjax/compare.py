"""Train the seed's seven algorithms with the same seed and settings and compare them.

    python -m pgjax.compare [--set key=value ...] [--target 0.8] [--out runs/compare]

Runs ``experiments/arithmetic_<algorithm>.py`` for REINFORCE, REINFORCE with a
baseline, ReMax, RLOO, PPO, GRPO and Dr. GRPO (each with the ``--set``
overrides), then writes ``comparison.md`` (final and best greedy eval accuracy,
the first step whose eval accuracy reaches ``--target``, wall time) and
``comparison.png`` (eval accuracy against step) into ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

from pgjax import run
from pgjax.train import experiment as experiment_lib

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
        exp = experiment_lib.load(pathlib.Path(experiments) / f"arithmetic_{name}.py")
        exp = experiment_lib.override(exp, overrides)
        exp = dataclasses.replace(exp, run_dir=str(out / name))
        start = time.perf_counter()
        directory = run.train(exp, progress=False)
        records = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
        results[name] = {**summarise(records, target), "seconds": time.perf_counter() - start}
        print(f"{name}: eval accuracy {results[name]['start']:.3f} -> {results[name]['final']:.3f}")
    text = table(results, target)
    (out / "comparison.md").write_text(text + "\n")
    plot(results, out / "comparison.png")
    print(text)
    return results


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
