"""Population training against the same runs one after another: the main job's 2 x 2 grid of the paper's
GRPO switches (``divide_by_std``, ``divide_by_length``) x 4 seeds = 16 members trained as one population
(``pgjax.train.population``) against the 16 ``Trainer`` runs in a row, in one process; and how a population's
step grows with its size.

    python benchmarks/population.py [--steps 20] [--sizes 4 16 64] [--scaling-steps 7] \\
        [--json benchmarks/results/population.json] [--plot benchmarks/results/population.png]

Two populations of the grid are measured, each one compiled program: "one member at a time"
(``vmap_width=1``: ``jax.lax.map`` over the members, each computed with a single run's shapes; the
default on CPU) and "all vmapped" (``vmap_width`` >= N: every phase ``jax.vmap``-ed over all members; the
default on an accelerator).

Matched work: each member is the single run ``Population.member_experiment(i)`` (the main job with that
seed and those switches: the same warm start, prompts, K = 8 responses of at most 6 tokens to 32 prompts a
step, evaluations); every side runs ``--steps`` RL steps after the warm start (the main job runs 250, which
would not fit the benchmark's time), with the greedy evaluation on 256 held-out prompts after the warm
start and at the end. All sides are built in the same process, the populations first. Their phases are
timed one by one: building (``Trainer`` / ``Population``), the warm start (a population's once per seed:
members of a seed share it), the two evaluations, the first two RL steps (compiling the sampler, scoring
and update), the rest of the RL steps. The RL steps are interleaved (step t of the runs, then of each
population; the order reversed every other step), so machine drift reaches every side alike; the runs'
step time is the sum of the 16 runs' step t.

Reported, per population: each phase's seconds and the runs' over it (one measurement each); the ratio of
the steady-state step times (steps 3..S) as pooled medians with a percentile-bootstrap 95% interval
(``stats.median_ratio``); the whole run's ratio; the whole experiment's projected from the measured phases
(each side's fixed phases plus the experiment's steps, 250 for the main job, at the steady-state median and
its evaluations, every 10 steps). Correctness beside
the timing: for each member the first step whose sampled tokens differ from its run's (None: none within
the steps run; vmap sums in another order, so float rounding can move a token whose sampling uniform
falls within it of a CDF boundary, and training carries rounding on, so from some step the two
trajectories differ as two seeds' do), and the largest relative difference of the records' losses before
it.

Scaling: populations of each ``--sizes`` N (the 2 x 2 grid x N / 4 seeds, from the initial policy: no
warm start, so every response runs to the 6-token budget) run ``--scaling-steps`` RL steps, the first two
not counted; their step times' medians (with intervals) against N x the median step of one run of the
same setting, measured in the same process, drawn in ``--plot``.
"""
import argparse
import dataclasses
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from pgjax import markdown  # noqa: E402
from pgjax.evaluation import statistics as stats  # noqa: E402

GRID = {"divide_by_std": [0.0, 1.0], "divide_by_length": [0.0, 1.0]}
SEEDS = [0, 1, 2, 3]
COMPILING_STEPS = 2                           # the first step compiles; the second can recompile a new width
LOSS_KEYS = ("policy_loss", "grad_norm", "entropy", "kl_old")


def captured(fn, out: list, field):
    """``fn`` that appends ``field(result)`` (as NumPy) to ``out`` after each call."""
    def wrapped(*args, **kwargs):
        result = fn(*args, **kwargs)
        out.append(np.asarray(field(result)))
        return result
    return wrapped


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def compare(steps: int, experiment: str, widths: dict, seeds=SEEDS) -> dict:
    """Populations of the 2 x 2 grid x 4 seeds (one per ``widths`` entry: label -> ``vmap_width``) against
    the grid's 16 runs (see the module docstring)."""
    from pgjax.config import load
    from pgjax.train.population import Population
    from pgjax.train.trainer import Trainer
    exp = load(experiment)
    sides = {}
    for label, width in widths.items():
        times = {}
        population, times["build"] = timed(lambda width=width: Population.grid(exp, seeds=seeds, vmap_width=width,
                                                                               **GRID))
        tokens = []
        population._sample = captured(population._sample, tokens, lambda s: s.response)
        _, times["warm_start"] = timed(population.warm_start)
        first, times["eval_first"] = timed(population.evaluate)
        sides[label] = {"population": population, "times": times, "tokens": tokens, "first": first, "steps": [],
                        "records": []}
        print(f"{label}: built and warm-started", file=sys.stderr, flush=True)
    members = next(iter(sides.values()))["population"]
    n = members.size
    trainers, run_tokens, run_first = [], [[] for _ in range(n)], []
    run_times = {"build": 0.0, "warm_start": 0.0, "eval_first": 0.0}
    for i in range(n):
        trainer, seconds = timed(lambda i=i: Trainer(members.member_experiment(i)))
        run_times["build"] += seconds
        trainer.pipeline.dispatch = captured(trainer.pipeline.dispatch, run_tokens[i], lambda r: r[1].response)
        run_times["warm_start"] += timed(trainer.warm_start)[1]
        accuracy, seconds = timed(trainer.evaluate)
        run_times["eval_first"] += seconds
        run_first.append(accuracy)
        trainers.append(trainer)
        print(f"run {i + 1}/{n} built and warm-started", file=sys.stderr, flush=True)
    run_steps, run_records = [], [[] for _ in range(n)]

    def runs_step():
        total = 0.0
        for i, trainer in enumerate(trainers):
            record, seconds = timed(trainer.step)
            run_records[i].append(record)
            total += seconds
        run_steps.append(total)

    def population_step(side):
        def step():
            records, seconds = timed(side["population"].step)
            side["records"].append(records)
            side["steps"].append(seconds)
        return step

    order = [runs_step, *(population_step(side) for side in sides.values())]
    for step in range(steps):
        for run in (order if step % 2 == 0 else order[::-1]):
            run()
        print(f"step {step + 1}/{steps}: runs {run_steps[-1]:.2f} s, "
              + ", ".join(f"{label} {side['steps'][-1]:.2f} s" for label, side in sides.items()),
              file=sys.stderr, flush=True)
    run_times["eval_last"], run_last = 0.0, []
    for trainer in trainers:
        accuracy, seconds = timed(trainer.evaluate)
        run_times["eval_last"] += seconds
        run_last.append(accuracy)
    close(run_times, run_steps)
    result = {"experiment": exp.name, "warm_start_steps": exp.warm_start.steps, "full_steps": exp.steps,
              "eval_every": exp.eval_every,
              "members": [m.describe() for m in members.members], "steps": steps,
              "runs": {"times": run_times, "steps": run_steps, "eval_first": run_first, "eval_last": run_last},
              "populations": []}
    for label, side in sides.items():
        last, side["times"]["eval_last"] = timed(side["population"].evaluate)
        close(side["times"], side["steps"])
        result["populations"].append({
            "label": label, "vmap_width": side["population"].vmap_width, "times": side["times"],
            "steps": side["steps"], "eval_first": side["first"], "eval_last": last,
            "steady_ratio": stats.median_ratio(run_steps[COMPILING_STEPS:], side["steps"][COMPILING_STEPS:]),
            "projected": projected(side["times"], run_times, side["steps"], run_steps, exp.steps, exp.eval_every),
            "agreement": agreement(side["tokens"], run_tokens, side["records"], run_records, steps)})
    return result


def close(times: dict, step_times: list) -> None:
    """``times`` completed with the compiling steps, the steady-state steps and the whole run."""
    times["first_steps"] = float(sum(step_times[:COMPILING_STEPS]))
    times["steady_steps"] = float(sum(step_times[COMPILING_STEPS:]))
    times["total"] = float(sum(times.values()))


def projected(pop_times: dict, run_times: dict, pop_steps, run_steps, full_steps: int, eval_every: int) -> dict:
    """Each side's whole experiment (``full_steps`` RL steps, an evaluation every ``eval_every``) from its
    measured phases: building, warm start, the first evaluation and the compiling steps as measured,
    then the other steps at the steady-state median and each evaluation at the last one's time
    (compiled by then)."""
    out = {}
    for name, times, step_times in (("population", pop_times, pop_steps), ("runs", run_times, run_steps)):
        fixed = times["build"] + times["warm_start"] + times["eval_first"] + times["first_steps"]
        steady = float(np.median(step_times[COMPILING_STEPS:]))
        out[name] = fixed + (full_steps - COMPILING_STEPS) * steady + -(-full_steps // eval_every) * times["eval_last"]
    out["ratio"] = out["runs"] / out["population"]
    return out


def agreement(pop_tokens, run_tokens, pop_records, run_records, steps: int) -> dict:
    """Per member: the first step whose sampled tokens differ from its run's (None: none), and the
    largest relative difference of ``LOSS_KEYS`` over the steps before it."""
    members = []
    for i, tokens in enumerate(run_tokens):
        first = next((s + 1 for s in range(steps) if not np.array_equal(pop_tokens[s][i], tokens[s])), None)
        worst = 0.0
        for s in range(steps if first is None else first - 1):
            for key in LOSS_KEYS:
                a, b = run_records[i][s].get(key), pop_records[s][i].get(key)
                if isinstance(a, float) and isinstance(b, float) and abs(a) > 1e-6:
                    worst = max(worst, abs(a - b) / abs(a))
        members.append({"first_token_difference": first, "max_relative_loss_difference": worst})
    return {"members": members, "identical_members": sum(m["first_token_difference"] is None for m in members)}


def scaling(sizes: list[int], steps: int, experiment: str, widths: dict) -> dict:
    """Step times of populations of each size (the grid x size / 4 seeds) at each ``widths`` entry, and
    of one run, from the initial policy (no warm start)."""
    from pgjax.config import WarmStartSection, load
    from pgjax.train.population import Population
    from pgjax.train.trainer import Trainer
    exp = dataclasses.replace(load(experiment), warm_start=WarmStartSection(steps=0))
    trainer = Trainer(exp)
    single = [timed(trainer.step)[1] for _ in range(steps)][COMPILING_STEPS:]
    out = {"steps": steps, "single": {"steps": single, **stats.median_interval(single)}, "rows": []}
    print(f"one run: {out['single']['median']:.3f} s a step", file=sys.stderr, flush=True)
    for size in sizes:
        if size % 4:
            raise SystemExit(f"--sizes: {size} is not a multiple of 4 (the 2 x 2 grid x seeds)")
        row = {"members": size}
        for label, width in widths.items():
            population = Population.grid(exp, seeds=range(size // 4), vmap_width=width, **GRID)
            times = [timed(population.step)[1] for _ in range(steps)][COMPILING_STEPS:]
            row[label] = {"vmap_width": population.vmap_width, "steps": times, **stats.median_interval(times),
                          "ratio": stats.median_ratio([t * size for t in single], times)}
            print(f"population of {size}, {label}: {row[label]['median']:.3f} s a step", file=sys.stderr,
                  flush=True)
            del population
        out["rows"].append(row)
    return out


def phase_table(main: dict) -> str:
    """Per phase of the experiment: the runs' seconds, then each population's seconds and the runs' time over it."""
    runs, pops, steps = main["runs"]["times"], main["populations"], main["steps"]
    labels = {"build": "build", "warm_start": f"warm start ({main['warm_start_steps']} steps; a population's once per "
                                              "seed)",
              "eval_first": "greedy evaluation after the warm start", "first_steps": "RL steps 1-2 (compiling)",
              "steady_steps": f"RL steps 3-{steps}", "eval_last": "final greedy evaluation", "total": "whole run"}
    header = ["phase", f"{len(main['members'])} runs",
              *(c for p in pops for c in (f"population, {p['label']}", "ratio"))]
    rows = [[f"**{label}**" if key == "total" else label, f"{runs[key]:.1f}",
             *(c for p in pops for c in (f"{p['times'][key]:.1f}", f"{runs[key] / p['times'][key]:.2f}x"))]
            for key, label in labels.items()]
    return markdown.table(header, rows)


def _interval(m: dict) -> str:
    """A median and its 95% interval: ``0.123 [0.120, 0.127]``."""
    return f"{m['median']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"


def scaling_table(scale: dict) -> str:
    """Per population size N: N runs' seconds (N x one run's median step), then each population's median step
    [95% interval] and the runs' time over it."""
    labels = [label for label in scale["rows"][0] if label != "members"]
    single = scale["single"]["median"]
    header = ["N", "N runs (s)", *(c for label in labels for c in (f"population, {label} (s)", "ratio"))]
    rows = [[row["members"], f"{row['members'] * single:.3f}",
             *(c for label in labels for c in (_interval(row[label]), stats.describe_ratio(row[label]["ratio"])))]
            for row in scale["rows"]]
    return markdown.table(header, rows, align="r" * len(header))


def table(result: dict) -> list[str]:
    main = result["compare"]
    pops, n, steps = main["populations"], len(main["members"]), main["steps"]
    lines = [f"{main['experiment']}'s 2 x 2 switch grid x {n // 4} seeds: {n} runs one after another against one "
             f"population of {n}, {steps} RL steps after the warm start (seconds; ratio: the runs' time over the "
             "population's)", "", *phase_table(main).splitlines(), ""]
    for p in pops:
        proj, agree = p["projected"], p["agreement"]
        lines.append(f"Population, {p['label']}: steady-state RL step (median of steps 3-{steps}, the {n} runs' step "
                     f"over the population's) {stats.describe_ratio(p['steady_ratio'])}; the whole experiment "
                     f"({main['full_steps']} steps, an evaluation every {main['eval_every']}) projected from these "
                     f"phases, {proj['runs']:.0f} s against {proj['population']:.0f} s: {proj['ratio']:.2f}x; sampled "
                     f"tokens identical to the member's own run at every step for {agree['identical_members']} of {n} "
                     "members.")
    scale = result.get("scaling")
    if scale:
        lines += ["", f"A population's RL step against its size N (from the initial policy, no warm start; median of "
                      f"{scale['steps'] - COMPILING_STEPS} steps with its 95% interval; N runs: N x one run's median "
                      f"step, {scale['single']['median']:.3f} s; ratio: N runs over the population)", "",
                  *scaling_table(scale).splitlines()]
    return lines


def plot(result: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    scale = result["scaling"]
    rows, single = scale["rows"], scale["single"]["median"]
    sizes = [r["members"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    for label in [label for label in rows[0] if label != "members"]:
        points = [r[label] for r in rows]
        ax.errorbar(sizes, [p["median"] for p in points], yerr=[[p["median"] - p["low"] for p in points],
                                                                [p["high"] - p["median"] for p in points]],
                    marker="o", capsize=3, label=f"population, {label}")
    ax.plot(sizes, [n * single for n in sizes], "--", marker="s", color="gray", label="N runs one after another")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("members N")
    ax.set_ylabel("seconds per RL step")
    ax.set_title("A population's RL step against its size", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experiment", default=str(ROOT / "experiments" / "arithmetic_dr_grpo.py"))
    parser.add_argument("--steps", type=int, default=20, help="RL steps of each side after the warm start")
    parser.add_argument("--sizes", type=int, nargs="*", default=[4, 16, 64], help="population sizes to scale over")
    parser.add_argument("--scaling-steps", type=int, default=7, help="RL steps of each size (the first two not "
                                                                     "counted)")
    parser.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds of the grid (4: 16 members)")
    parser.add_argument("--json", help="save the table and numbers here")
    parser.add_argument("--plot", help="draw the scaling here (PNG)")
    args = parser.parse_args(argv)
    if args.steps < COMPILING_STEPS + stats.MIN_STEPS or (args.sizes and args.scaling_steps < COMPILING_STEPS
                                                           + stats.MIN_STEPS):
        raise SystemExit(f"--steps and --scaling-steps: at least {COMPILING_STEPS + stats.MIN_STEPS} (the first "
                         f"{COMPILING_STEPS} compile; a median needs {stats.MIN_STEPS})")
    from readme_tables import save_table
    widths = {"one member at a time": 1, "all vmapped": max(args.sizes + [args.seeds * 4])}
    result = {"compare": compare(args.steps, args.experiment, widths, list(range(args.seeds)))}
    if args.sizes:
        result["scaling"] = scaling(args.sizes, args.scaling_steps, args.experiment, widths)
    save_table(args.json, sys.argv[1:] if argv is None else argv, table(result), **result)
    if args.plot and args.sizes:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
