"""Toy ablation: every algorithm x 16 seeds x 4 learning rates on an enumerable token MDP,
in one compiled ``jax.vmap`` call, with learning curves of the exact objective J.

    python experiments/scripts/toy_ablation.py [--out runs/toy_ablation] [--steps 50] [--seeds 16]

The default MDP: vocabulary 3 (EOS included), horizon 4 (31 trajectories per
prompt), 6 prompts of mixed difficulty with binary outcome rewards, and a
shared-parameter policy (logits from prompt + position + last token), so that
prompts interfere as they do in a language model. Each algorithm's learning
rate is chosen by the area under its curve (mean J over steps and seeds).
PPO, GRPO, Dr. GRPO and DAPO take 4 gradient steps per batch (the first at
theta_old = theta), the REINFORCE family one.

Writes ``curves.csv`` (algorithm, learning_rate, seed, step, J), ``toy_ablation.md`` (the table, from
``curves.csv`` as written: ``table(*read_csv(path))`` rebuilds it) and ``curves.png`` (J vs step per
algorithm at its best learning rate: mean and min-max over seeds). The committed run is in
``experiments/results/toy_ablation/``.
"""
import argparse
import csv
import pathlib
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from pgjax import markdown
from pgjax.theory import lab
from pgjax.theory import mdp as mdp_lib

LEARNING_RATES = (0.3, 1.0, 3.0, 10.0)


def write_csv(path, algorithms, curves):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["algorithm", "learning_rate", "seed", "step", "J"])
        for a, entry in enumerate(algorithms):
            for i, lr in enumerate(LEARNING_RATES):
                for s in range(curves.shape[2]):
                    for step, j in enumerate(curves[a, i, s]):
                        writer.writerow([entry.label, lr, s, step, f"{j:.6f}"])


def read_csv(path) -> tuple[list[str], np.ndarray]:
    """(algorithm labels, curves [algorithm, learning rate, seed, step]) of a ``curves.csv``."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    labels = list(dict.fromkeys(r["algorithm"] for r in rows))
    seeds = 1 + max(int(r["seed"]) for r in rows)
    steps = 1 + max(int(r["step"]) for r in rows)
    curves = np.zeros((len(labels), len(LEARNING_RATES), seeds, steps))
    for r in rows:
        curves[labels.index(r["algorithm"]), LEARNING_RATES.index(float(r["learning_rate"])), int(r["seed"]),
               int(r["step"])] = float(r["J"])
    return labels, curves


def table(labels: list[str], curves) -> str:
    """Each algorithm's row (``best_row``) as a markdown table."""
    return markdown.table(["algorithm", "best lr", "mean J over steps", "final J (mean +- std over seeds)"],
                          [best_row(label, curves[a]) for a, label in enumerate(labels)])


def best_learning_rate(curves_of_algorithm) -> int:
    """Index of the learning rate with the largest area under the curve (mean J over seeds and steps)."""
    return int(np.argmax(curves_of_algorithm.mean(axis=(1, 2))))


def best_row(label: str, curves_of_algorithm) -> list[str]:
    """An algorithm's row: its best learning rate, the mean J over its seeds and steps at that rate, and
    the final J's mean +- std over seeds."""
    best = best_learning_rate(curves_of_algorithm)
    final = curves_of_algorithm[best, :, -1]
    return [label, f"{LEARNING_RATES[best]:g}", f"{curves_of_algorithm[best].mean():.3f}",
            f"{final.mean():.3f} +- {final.std():.3f}"]


def plot(path, algorithms, curves, title):
    fig, ax = plt.subplots(figsize=(8, 5))
    steps = np.arange(curves.shape[-1])
    for a, entry in enumerate(algorithms):
        best = best_learning_rate(curves[a])
        runs = curves[a, best]
        line, = ax.plot(steps, runs.mean(axis=0), label=f"{entry.label} (lr {LEARNING_RATES[best]:g})")
        ax.fill_between(steps, runs.min(axis=0), runs.max(axis=0), color=line.get_color(), alpha=0.12)
    ax.set_xlabel("update step")
    ax.set_ylabel("exact J (expected reward)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/toy_ablation")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--horizon", type=int, default=4)
    parser.add_argument("--policy", choices=["shared", "tabular"], default="shared")
    parser.add_argument("--mdp-seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mdp = mdp_lib.make_mdp(vocab=3, horizon=args.horizon, prompts=args.prompts, reward="outcome",
                           seed=args.mdp_seed)
    policy = mdp_lib.shared_policy(mdp) if args.policy == "shared" else mdp_lib.tabular_policy(mdp)
    algorithms = lab.default_algorithms()
    start = time.perf_counter()
    curves = lab.run_grid(mdp, policy, algorithms, LEARNING_RATES, args.seeds, k=args.k, steps=args.steps)
    seconds = time.perf_counter() - start
    runs = curves.shape[0] * curves.shape[1] * curves.shape[2]
    write_csv(out / "curves.csv", algorithms, curves)
    plot(out / "curves.png", algorithms, curves,
         f"{args.prompts} prompts, H={args.horizon}, {args.policy} policy, K={args.k}, {args.seeds} seeds: "
         f"{runs} runs in one vmap ({seconds:.1f} s)")
    print(f"{runs} runs x {args.steps} steps in one compiled call: {seconds:.1f} s (compile included)")
    print(f"J at step 0: {curves[0, 0, 0, 0]:.3f}\n")
    summary = table(*read_csv(out / "curves.csv"))
    (out / "toy_ablation.md").write_text(summary + "\n")
    print(summary)
    print(f"wrote {out / 'curves.csv'}, {out / 'toy_ablation.md'} and {out / 'curves.png'}")


if __name__ == "__main__":
    main()
