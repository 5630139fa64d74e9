"""Sequence packing in the update (``update.pack_width``), measured on a real training run's rollouts.

    python benchmarks/packing.py --model models/smollm2-135m-instruct --steps 8 --widths 1 2 3 \\
        --json benchmarks/results/packing_smollm2.json

The run is ``experiments/smollm2_math.py`` (8 prompts x 4 samples, 64 new tokens, 2 micro-batches)
from ``--model``. Its steps run as the trainer runs them; before each update a callback times
``Learner.update`` on a copy of the trainer's state and the step's prepared rollout once unpacked
and once per ``--widths`` (packed rows that many rollout rows wide): matched work, the same rows,
loss and optimizer, in an order that rotates and reverses from step to step. A call during which
XLA compiled is left out of the timings and its compile seconds are counted: packing adds shapes
(the packed row count), each compiled once. The trainer's own update then runs as usual, so later
steps see the policy's responses as training shortens them.

Reported per variant: the positions its forward pass computes per unpacked position (the rows in
order, micro-batch by micro-batch), the median update with its interval, unpacked / it (> 1:
packing faster) with a bootstrap interval, the compiles, and the largest relative difference
between its gradient norm and the unpacked one (the same gradient up to float rounding; the loss
value itself is the same by construction on-policy, where it does not read log pi); and the
padding share of the update's (trimmed) rows. The JSON
keeps every row's prompt and response length.
"""
import argparse
import dataclasses
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from readme_tables import save_table  # noqa: E402

from pgjax import config as config_lib  # noqa: E402
from pgjax import markdown  # noqa: E402
from pgjax.evaluation.statistics import describe_ratio, median_interval, median_ratio  # noqa: E402
from pgjax.train.learner import build_learner  # noqa: E402
from pgjax.train.packing import pack  # noqa: E402
from pgjax.train.trainer import Callback, Trainer  # noqa: E402

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
COMPILED = {"s": 0.0, "n": 0}


def _count_compile(event, duration, **_):
    if event == COMPILE_EVENT:
        COMPILED["s"] += duration
        COMPILED["n"] += 1


jax.monitoring.register_event_duration_secs_listener(_count_compile)


def name(width: int) -> str:
    return f"packed x{width}" if width else "unpacked"


class TimeUpdates(Callback):
    """Before each update: the update of a copy of the state on the prepared rollout by each learner
    of ``learners`` ({pack_width: Learner}), in an order that turns round and reverses from step to
    step; one record per step in ``steps``."""

    def __init__(self, learners: dict):
        self.learners, self.steps = learners, []

    def before_update(self, trainer, rollout, examples, stats):
        k, widths = len(self.steps), list(self.learners)
        order = widths[k // 2 % len(widths):] + widths[:k // 2 % len(widths)]
        order = order[::-1] if k % 2 else order
        tokens, mask = np.asarray(rollout.tokens), np.asarray(rollout.attention_mask)
        prompt_width = tokens.shape[1] - rollout.mask.shape[1]
        step = {"padding": 1.0 - float(mask.mean()), "rows": int(mask.shape[0]), "width": int(mask.shape[1]),
                "prompt_lengths": mask[:, :prompt_width].sum(1).tolist(),
                "response_lengths": mask[:, prompt_width:].sum(1).tolist(), "order": [name(w) for w in order]}
        for width in order:
            entry = {}
            if width:
                packing = pack(tokens, mask, prompt_width, np.arange(step["rows"]), trainer.exp.update.micro_batches,
                               width)
                entry["packed_positions"] = int(np.prod(packing.tokens.shape))
            state = jax.tree.map(jnp.copy, trainer.state)
            compiles, start = dict(COMPILED), time.perf_counter()
            _, metrics = jax.block_until_ready(self.learners[width].update(state, rollout, trainer.hparams))
            step[name(width)] = {"seconds": time.perf_counter() - start, "compiled": COMPILED["n"] > compiles["n"],
                                 "compile_seconds": COMPILED["s"] - compiles["s"],
                                 "grad_norm": float(metrics["grad_norm_max"]), **entry}
        self.steps.append(step)
        print({key: value for key, value in step.items() if "lengths" not in key}, flush=True)
        return {}


def relative_gap(value: float, reference: float) -> float:
    """|value / reference - 1|; |value| when the reference is 0 (a step whose every advantage is 0)."""
    return abs(value - reference) / abs(reference) if reference else abs(value)


def timed(steps, key):
    return [s[key]["seconds"] for s in steps if not s[key]["compiled"]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="checkpoint directory the run starts from")
    parser.add_argument("--experiment", default=str(ROOT / "experiments" / "smollm2_math.py"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3],
                        help="the packed variants' update.pack_width (the unpacked update always runs)")
    parser.add_argument("--set", nargs="*", default=[], dest="overrides", help="more experiment overrides")
    parser.add_argument("--json", help="save the table and the per-step data here")
    args = parser.parse_args(argv)
    exp = config_lib.override(config_lib.load(args.experiment),
                                  [f"model.path={args.model}", f"steps={args.steps}", *args.overrides])
    trainer = Trainer(exp)
    learners = {width: build_learner(trainer.policy, trainer.algorithm, exp.rollout.samples_per_prompt,
                                     dataclasses.replace(exp.update, pack_width=width), exp.optim, exp.critic_optim,
                                     trainer.mesh)
                for width in [0, *args.widths]}
    timer = TimeUpdates(learners)
    for _ in range(args.steps):
        trainer.step([timer])
    steps = timer.steps
    padding = [s["padding"] for s in steps]
    table = [f"Update of `{pathlib.Path(args.experiment).name}` from `{args.model}`, {args.steps} steps "
             f"({exp.prompts_per_step} prompts x {exp.rollout.samples_per_prompt} samples, "
             f"{exp.rollout.max_new_tokens} new tokens, {exp.update.micro_batches} micro-batches); padding "
             f"{min(padding):.0%}-{max(padding):.0%} of the update's positions:", ""]
    unpacked, ratios, rows = timed(steps, "unpacked"), {}, []
    for width in learners:
        key, times = name(width), timed(steps, name(width))
        m = median_interval(times)
        positions = (np.mean([s[key]["packed_positions"] / (s["rows"] * s["width"]) for s in steps])
                     if width else 1.0)
        ratios[key] = median_ratio(unpacked, times) if width else None
        gap = max(relative_gap(s[key]["grad_norm"], s["unpacked"]["grad_norm"]) for s in steps)
        compiles = sum(s[key]["compiled"] for s in steps), sum(s[key]["compile_seconds"] for s in steps)
        rows.append([key, f"{positions:.2f}", f"{m['median']:.1f} [{m['low']:.1f}, {m['high']:.1f}]",
                     describe_ratio(ratios[key]) if width else "1", len(times), f"{compiles[0]} ({compiles[1]:.0f})",
                     f"{gap:.1e}"])
    table += markdown.table(["update", "positions / unpacked", "s (median [95% interval])", "unpacked / it",
                             "steps timed", "compiles (s)", "gradient norm / unpacked - 1, largest"], rows).splitlines()
    save_table(args.json, argv if argv is not None else sys.argv[1:], table, steps=steps, ratios=ratios)


if __name__ == "__main__":
    main()
