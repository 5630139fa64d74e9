"""Runs per second of the toy lab: one jitted call (a vmap over seeds x learning rates per
algorithm) vs a Python loop over the same runs, each a jitted single run, measured in one
process (compile excluded for both).

    python benchmarks/toy_lab.py [--seeds 16] [--steps 50] [--repeats 3] [--json benchmarks/results/toy_lab.json]

``--json`` saves the table with the machine and commit (``readme_tables.save_table``) and each timed call.
"""
import argparse
import statistics
import sys
import time

import jax
from readme_tables import save_table

from pgjax import markdown
from pgjax.theory import lab
from pgjax.theory import mdp as mdp_lib

LEARNING_RATES = (0.3, 1.0, 3.0, 10.0)


def timed(fn, repeats) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` (blocking), after one that compiles and warms up."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="save the table, its provenance and every timed call here")
    args = parser.parse_args(argv)
    mdp = mdp_lib.make_mdp(vocab=3, horizon=4, prompts=6, reward="outcome", seed=0)
    policy = mdp_lib.shared_policy(mdp)
    algorithms = lab.default_algorithms()
    keys, lrs, theta0 = lab.grid_inputs(policy, LEARNING_RATES, args.seeds)
    trains = [lab.make_train(mdp, policy, entry, k=4, steps=args.steps) for entry in algorithms]
    runs = len(algorithms) * len(lrs)

    grid = jax.jit(lambda keys, lrs, theta0: [jax.vmap(t)(keys, lrs, theta0) for t in trains])
    singles = [jax.jit(t) for t in trains]
    vmap_times = timed(lambda: grid(keys, lrs, theta0), args.repeats)
    loop_times = timed(lambda: [single(keys[i], lrs[i], theta0[i]) for single in singles for i in range(len(lrs))],
                       args.repeats)
    t_vmap, t_loop = statistics.median(vmap_times), statistics.median(loop_times)
    setup = (f"jax {jax.__version__} on {jax.devices()[0].platform}; {runs} runs ({len(algorithms)} algorithms x "
             f"{len(LEARNING_RATES)} learning rates x {args.seeds} seeds), {args.steps} steps each; median of "
             f"{args.repeats} calls after a compiling one")
    table = markdown.table(["execution", "seconds", "runs per second", "speed-up vs loop"],
                           [["Python loop of jitted single runs", f"{t_loop:.2f}", f"{runs / t_loop:.1f}", "1.0"],
                            ["one jitted call of vmaps", f"{t_vmap:.2f}", f"{runs / t_vmap:.1f}",
                             f"{t_loop / t_vmap:.1f}"]])
    save_table(args.json, sys.argv[1:] if argv is None else argv, [setup + ":", "", *table.splitlines()],
               setup=setup, runs=runs, seconds={"loop": loop_times, "vmap": vmap_times})


if __name__ == "__main__":
    main()
