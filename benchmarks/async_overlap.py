"""Wall time of asynchronous rollouts: what ``rollout.staleness`` hides of a step.

    python benchmarks/async_overlap.py [--steps 30] [--json benchmarks/results/async_overlap_tiny.json]
    python benchmarks/async_overlap.py --experiment experiments/smollm2_math.py --steps 4 --warmup 1 \\
        --rows 0 1 --json benchmarks/results/async_overlap_smollm2.json

Each row trains the experiment (default: the main job, from one warm-started checkpoint made
once by a ``steps=0`` run under ``--runs``) in a process of its own, ``--warmup`` steps to compile
and then ``--steps`` measured ones, and reports the medians of the step's phases from its records:

  sample   dispatching the batch, reading it back, decoding and scoring it (with staleness s >= 1
           this is the batch of step t + s, decoded and scored while step t's update runs)
  prepare  old / reference log-probs and advantages of the batch being used
  update   waiting for the update after that (with s >= 1: what the scoring did not hide)
  step     the whole step; "/ on-policy" is its ratio to the first row's

On one XLA device the sampler and the update still run one after the other (one execution
stream); what overlaps is the host's decoding and scoring with the device's update. A separate
sampler mesh (``rollout.sampler_devices``) lets the sampler's devices work during the update too.

The profile: ``--profile-steps`` more steps per row run under ``jax.profiler.trace``; from its
Perfetto trace come the trainer's phases on the Python thread (``pgjax/score`` etc., see
``Trainer.step``) and the intervals in which XLA's threads execute anything (device work).
"host scoring over device work" is the share of the host's decoding and reward time
(``pgjax/decode_and_score``, not the wait for the sampler's output) during which the device was
executing: the overlap staleness buys. ``--timeline PNG`` draws the profiled steps of each row.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import traces  # noqa: E402
from traces import merged  # noqa: E402

from pgjax import markdown  # noqa: E402

# (label, --set overrides, simulated devices)
ROWS = [
    ("on-policy (staleness 0)", [], 1),
    ("staleness 1", ["rollout.staleness=1"], 1),
    ("staleness 2", ["rollout.staleness=2"], 1),
    ("8 devices, on-policy", [], 8),
    ("8 devices, staleness 1, one mesh", ["rollout.staleness=1"], 8),
    ("8 devices, staleness 1, sampler on 4 of them", ["rollout.staleness=1", "rollout.sampler_devices=4"], 8),
]
PHASES = ("time_sample", "time_prepare", "time_update", "time_step")
HOST_PHASES = ("pgjax/sample_dispatch", "pgjax/prepare", "pgjax/update_dispatch", "pgjax/score", "pgjax/update_wait")
SCORING_PHASES = ("pgjax/read_back", "pgjax/decode_and_score")      # inside pgjax/score
NOT_WORK = ("ThreadpoolListener", "end: ", "SlinkyThreadPool::Await")      # markers and idle waits of XLA's threads


def covered(interval: tuple[float, float], union: list[tuple[float, float]]) -> float:
    """Length of ``interval`` inside the disjoint ``union``."""
    return sum(max(0.0, min(interval[1], end) - max(interval[0], start)) for start, end in union)


def timeline(trace_file: pathlib.Path) -> dict:
    """From a Perfetto trace: the trainer's phases on the Python thread (name, start, end), the
    merged intervals in which any XLA thread executes, both in seconds from the first phase, and the
    share of the host's decoding and scoring time covered by device work."""
    events, threads = traces.load(trace_file)
    spans = [e for e in events if e.get("ph") == "X"]
    host = sorted(((e["name"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in spans
                   if e["name"] in HOST_PHASES + SCORING_PHASES), key=lambda phase: phase[1])
    device = merged([(e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6) for e in traces.xla_spans(events, threads, NOT_WORK)])
    origin = min(start for _, start, _ in host)
    scoring = [(start, end) for name, start, end in host if name == "pgjax/decode_and_score"]
    total = sum(end - start for start, end in scoring)
    return {"host": [(name, start - origin, end - origin) for name, start, end in host],
            "device": [(start - origin, end - origin) for start, end in device if end > origin],
            "score_seconds": total, "score_over_device": sum(covered(i, device) for i in scoring) / max(total, 1e-12)}


def measure(experiment: str, overrides: list[str], runs: str, steps: int, warmup: int, profile_steps: int) -> dict:
    """Median phase times of ``steps`` steps after ``warmup`` ones, from the warm-started checkpoint,
    and the ``timeline`` of ``profile_steps`` steps after those, traced."""
    import dataclasses

    import jax
    import numpy as np

    from pgjax import config as config_lib
    from pgjax.study.variants import warm_checkpoint
    from pgjax.train.trainer import Trainer

    base = config_lib.override(config_lib.load(experiment), overrides)
    exp = base
    if not base.model.path or base.warm_start.steps:
        warm = warm_checkpoint(base, 0, runs)
        exp = dataclasses.replace(base, model=dataclasses.replace(base.model, path=str(warm)),
                                  warm_start=dataclasses.replace(base.warm_start, steps=0))
    trainer = Trainer(exp)
    records = [trainer.step() for _ in range(warmup + steps)][warmup:]
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            for _ in range(profile_steps):
                trainer.step()
        traced = timeline(next(pathlib.Path(trace_dir).rglob("perfetto_trace.json.gz")))
    return {key: float(np.median([r[key] for r in records])) for key in PHASES} | {
        "accuracy": float(np.mean([r["accuracy"] for r in records])), **traced}


def table(rows: list[dict]) -> list[str]:
    """Per rollout mode: the median seconds of each phase and of the step, the step over the first row's
    (on-policy), and host scoring over device work."""
    first = rows[0]["time_step"]
    rows = [[r["label"], *(f"{r[key]:.3f} s" for key in PHASES), f"{r['time_step'] / first:.2f}",
             f"{r['score_over_device']:.0%}"] for r in rows]
    return markdown.table(["rollouts", "sample", "prepare", "update wait", "step", "/ on-policy",
                           "host scoring over device work"], rows).splitlines()


def plot_timelines(rows: list[dict], path) -> None:
    """One panel per row: the Python thread's phases at the top, the parts of its scoring below them,
    XLA's device work at the bottom."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colours = dict(zip(HOST_PHASES + SCORING_PHASES, ("tab:blue", "tab:orange", "tab:purple", "tab:green",
                                                      "tab:red", "tab:gray", "tab:olive"), strict=True))
    fig, axes = plt.subplots(len(rows), 1, figsize=(12, 1.5 * len(rows) + 0.6), squeeze=False)
    for ax, r in zip(axes[:, 0], rows, strict=True):
        for name, start, end in r["host"]:
            ax.broken_barh([(start, end - start)], (1 if name in SCORING_PHASES else 2, 0.8), color=colours[name])
        ax.broken_barh([(start, end - start) for start, end in r["device"]], (0, 0.8), color="black")
        ax.set(yticks=[0.4, 1.4, 2.4], yticklabels=["XLA", "scoring", "host"],
               title=f"{r['label']}: host scoring over device work {r['score_over_device']:.0%}")
        ax.title.set_fontsize(8)
    axes[-1, 0].set_xlabel("seconds")
    handles = [matplotlib.patches.Patch(color=c, label=n.removeprefix("pgjax/")) for n, c in colours.items()]
    fig.legend(handles=handles, loc="lower center", fontsize=7, ncol=len(handles))
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default=str(ROOT / "experiments" / "arithmetic_dr_grpo.py"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override every row")
    parser.add_argument("--runs", default="runs/async_overlap", help="where the warm-started checkpoint goes")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3, help="steps not measured (compilation, pipeline fill)")
    parser.add_argument("--profile-steps", type=int, default=2, help="steps traced after the measured ones")
    parser.add_argument("--timeline", help="draw the traced steps of every row here (PNG)")
    parser.add_argument("--rows", type=int, nargs="*", help="indices of ROWS to run (default: all)")
    parser.add_argument("--json", help="save the table and numbers here")
    parser.add_argument("--row", type=int, help=argparse.SUPPRESS)      # internal: measure one row, print JSON
    args = parser.parse_args(argv)
    if args.row is not None:
        label, overrides, _ = ROWS[args.row]
        print("RESULT " + json.dumps({"label": label, **measure(args.experiment, args.set + overrides, args.runs,
                                                                   args.steps, args.warmup, args.profile_steps)}))
        return
    from readme_tables import save_table

    from pgjax.config import load
    load(args.experiment)                                       # a bad file fails here, not in every row
    results = []
    for index in args.rows if args.rows is not None else range(len(ROWS)):
        devices = ROWS[index][2]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if devices > 1:
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        command = [sys.executable, __file__, "--row", str(index), "--experiment", args.experiment, "--runs", args.runs,
                   "--steps", str(args.steps), "--warmup", str(args.warmup), "--profile-steps", str(args.profile_steps),
                   *sum((["--set", s] for s in args.set), [])]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"row {index} failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.split("RESULT ", 1)[1]))
        print(f"{results[-1]['label']}: step {results[-1]['time_step']:.3f} s", file=sys.stderr)
    save_table(args.json, sys.argv[1:] if argv is None else argv, table(results), rows=results,
               steps=args.steps, warmup=args.warmup, experiment=args.experiment, overrides=args.set)
    if args.timeline:
        plot_timelines(results, args.timeline)


if __name__ == "__main__":
    main()
