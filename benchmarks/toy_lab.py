"""Runs per second of the toy lab: one jitted call (a vmap over seeds x learning rates per
algorithm) vs a Python loop over the same runs, each a jitted single run, measured in one
process (compile excluded for both).

    python benchmarks/toy_lab.py [--seeds 16] [--steps 50] [--repeats 3]
"""
import argparse
import statistics
import time

import jax

from pgjax import markdown
from pgjax.theory import lab
from pgjax.theory import mdp as mdp_lib

LEARNING_RATES = (0.3, 1.0, 3.0, 10.0)


def timed(fn, repeats):
    jax.block_until_ready(fn())  # compile and warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    mdp = mdp_lib.make_mdp(vocab=3, horizon=4, prompts=6, reward="outcome", seed=0)
    policy = mdp_lib.shared_policy(mdp)
    algorithms = lab.default_algorithms()
    keys, lrs, theta0 = lab.grid_inputs(policy, LEARNING_RATES, args.seeds)
    trains = [lab.make_train(mdp, policy, entry, k=4, steps=args.steps) for entry in algorithms]
    runs = len(algorithms) * len(lrs)

    grid = jax.jit(lambda keys, lrs, theta0: [jax.vmap(t)(keys, lrs, theta0) for t in trains])
    singles = [jax.jit(t) for t in trains]
    t_vmap = timed(lambda: grid(keys, lrs, theta0), args.repeats)
    t_loop = timed(lambda: [single(keys[i], lrs[i], theta0[i]) for single in singles for i in range(len(lrs))],
                   args.repeats)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; {runs} runs "
          f"({len(algorithms)} algorithms x {len(LEARNING_RATES)} learning rates x {args.seeds} seeds), "
          f"{args.steps} steps each; median of {args.repeats}\n")
    print(markdown.table(["execution", "seconds", "runs per second", "speed-up vs loop"],
                         [["Python loop of jitted single runs", f"{t_loop:.2f}", f"{runs / t_loop:.1f}", "1.0"],
                          ["one jitted call of vmaps", f"{t_vmap:.2f}", f"{runs / t_vmap:.1f}",
                           f"{t_loop / t_vmap:.1f}"]]))


if __name__ == "__main__":
    main()
