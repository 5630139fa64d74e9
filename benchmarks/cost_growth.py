"""How the cost of a GRPO step grows with the response length and the group size: pgjax and TRL.

    python benchmarks/cost_growth.py [--lengths 64 128 256 512 1024] [--length-groups 8]
        [--groups 4 16] [--group-length 256] [--steps 5] [--warmup 1] [--rounds 1]
        [--json benchmarks/results/cost_growth_tiny.json] [--plot benchmarks/results/cost_growth_tiny.png]

Each point is one run of ``compare_trl.py``'s matched-work harness with forced lengths (every row
generates exactly the point's number of new tokens, so a point's work is the same on both sides):
the same prompts, samples, loss and optimizer, each side alone in its own process at its defaults,
``--warmup`` untimed and ``--steps`` timed steps per child, ``--rounds`` children per side in ABBA
order. The points: every length of ``--lengths`` with ``--length-groups`` samples per prompt, and
every group size of ``--groups`` at ``--group-length`` tokens. For each point and side it reports the
median seconds per step of the pooled timed steps and the child's peak RSS, and TRL's time over
pgjax's as a ratio of pooled medians with its 95% bootstrap interval (``compare_trl.compare``).
Extra options (``--model DIR`` and the tiny model's shape) pass through to every point.

Saved (``--json``): the table, this process's provenance, and each point's harness arguments and
results file contents (its own provenance, plan and steps); ``--plot``: seconds per step and peak
memory against length (log-log) and against group size, both sides.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import measure
from readme_tables import save_table

from pgjax import markdown

SIDES = ("pgjax", "TRL GRPOTrainer")


def points(lengths, length_groups: int, groups, group_length: int) -> list[tuple[int, int]]:
    """(new tokens, samples per prompt) of every point: the length sweep, then the group sweep, each once."""
    todo = [(n, length_groups) for n in lengths] + [(group_length, g) for g in groups]
    return list(dict.fromkeys(todo))


def point_argv(length: int, group: int, args, passed: list[str], json_path) -> list[str]:
    """The harness arguments of one point."""
    return ["--lengths", "forced", "--new-tokens", str(length), "--samples", str(group), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--rounds", str(args.rounds), *passed, "--json", str(json_path)]


def point_row(length: int, group: int, result: dict) -> dict:
    """One point's numbers from its harness results file: each side's median s / step and peak RSS
    and the ratio TRL / pgjax with its interval."""
    rows = result["rows"]
    return {"new_tokens": length, "samples": group,
            "seconds": {side: rows[side]["step"] for side in SIDES},
            "peak_rss_gib": {side: rows[side]["peak_rss_gib"] for side in SIDES},
            "ratio": rows["pgjax"]["ratios"]["step"]}


def table(rows: list[dict]) -> list[str]:
    """The points as a markdown table, length sweep and group sweep in the order they ran."""
    return markdown.table(
        ["new tokens", "samples per prompt", "pgjax s / step", "TRL s / step", "TRL / pgjax [95% interval]",
         "pgjax peak RSS", "TRL peak RSS"],
        [[r["new_tokens"], r["samples"], measure.seconds(r["seconds"]["pgjax"], r["seconds"]["pgjax"]),
          measure.seconds(r["seconds"][SIDES[1]], r["seconds"][SIDES[1]]), measure.ratio_text(r["ratio"]),
          f"{r['peak_rss_gib']['pgjax']:.1f} GiB", f"{r['peak_rss_gib'][SIDES[1]]:.1f} GiB"]
         for r in rows]).splitlines()


def plot(rows: list[dict], length_groups: int, group_length: int, path) -> None:
    """Seconds per step and peak RSS against the response length (``length_groups`` samples) and
    against the group size (``group_length`` tokens), both sides."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    sweeps = (("new tokens", "new_tokens", [r for r in rows if r["samples"] == length_groups],
               f"{length_groups} samples per prompt"),
              ("samples per prompt", "samples", [r for r in rows if r["new_tokens"] == group_length],
               f"{group_length} new tokens"))
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for column, (label, key, chosen, fixed) in enumerate(sweeps):
        chosen = sorted(chosen, key=lambda r: r[key])
        for row, (quantity, unit) in enumerate((("seconds", "s / step"), ("peak_rss_gib", "peak RSS, GiB"))):
            ax = axes[row][column]
            for side, marker in zip(SIDES, "os", strict=True):
                ax.plot([r[key] for r in chosen], [r[quantity][side] for r in chosen], marker=marker, label=side)
            ax.set_xscale("log", base=2)
            if quantity == "seconds":
                ax.set_yscale("log")
            ax.set_xlabel(f"{label} ({fixed})")
            ax.set_ylabel(unit)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    parser.add_argument("--length-groups", type=int, default=8, help="samples per prompt of the length sweep")
    parser.add_argument("--groups", type=int, nargs="*", default=[4, 16], help="the group sweep's samples per prompt")
    parser.add_argument("--group-length", type=int, default=256, help="new tokens of the group sweep")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", help="save the results here")
    parser.add_argument("--plot", help="save the plot here (PNG)")
    return parser.parse_known_args(argv)


def main(argv=None):
    import compare_trl  # the harness: it imports torch and TRL, which the tests' environment lacks
    args, passed = parse(argv)
    rows, runs = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for length, group in points(args.lengths, args.length_groups, args.groups, args.group_length):
            out = pathlib.Path(scratch) / f"{length}_{group}.json"
            harness = point_argv(length, group, args, passed, out)
            print(f"point: {length} new tokens x {group} samples", file=sys.stderr, flush=True)
            compare_trl.main(harness)
            result = json.loads(out.read_text())
            rows.append(point_row(length, group, result))
            runs.append({"argv": harness[:-2], **{k: v for k, v in result.items() if k != "argv"}})
    if args.plot:
        plot(rows, args.length_groups, args.group_length, args.plot)
    save_table(args.json, sys.argv[1:] if argv is None else argv, table(rows), points=rows, runs=runs)


if __name__ == "__main__":
    main()
