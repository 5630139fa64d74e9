"""GRPO's response-length bias in real training (the paper's "Dr. GRPO" section; Liu et al. 2025).

    python experiments/scripts/length_bias.py [--seeds 3] [--steps 150]      # ~15 min on 2 CPU cores
    python experiments/scripts/length_bias.py --set task.options.working=before \\
        --out experiments/results/length_bias_before
    python experiments/scripts/length_bias.py --smoke --runs /tmp/lb --out /tmp/lb   # seconds: the CI check
    python experiments/scripts/length_bias.py --report      # summary, table and plot again from summary.json

Claim: dividing each response's loss by its length |o| (eq. 18) weights a token
of a short response more than a token of a long one. For a correct response
(A > 0) short is rewarded more per token; for an incorrect one (A < 0) long is
punished less per token, so incorrect responses can grow while correct ones
shrink. Dr. GRPO (eq. 21) drops 1/|o| (and the group std).

Task ``scratchpad_arithmetic``: 1-digit addition where a response is the answer,
``':'`` and free text (``working="after"``, the default here), or free text,
``':'`` and the answer (``--set task.options.working=before``); only the answer counts,
so the length can drift either way without changing correctness. With the text
after the answer the policy picks the length knowing its answer, so length can
come to depend on correctness; before it, it cannot. The supervised warm start
(120 steps: greedy accuracy about 0.5, so both correct and incorrect responses
are common) shows 0..8 dots of free text, uniformly; responses may grow to 20
tokens. Both designs were run (``experiments/results/length_bias`` and
``length_bias_before``; docs/experiments.md and ``notebooks/02_biases.ipynb`` discuss them).
Four variants, all from the Dr. GRPO preset (group-mean baseline, rho-hat, sum
over tokens / prompts, no KL), differing only in the paper's two switches:

  grpo         / std and / |o|   (GRPO's normalisations, eq. 18)
  std_only     / std
  length_only  / |o|
  dr_grpo      neither           (eq. 21)

Every variant runs the same seeds from the same warm-started checkpoint per
seed (trained once, by a ``steps=0`` run), with the same steps, prompts and
samples. Each run's directory is ``--runs``/``<variant>/seed<k>``; ``--out`` gets
``summary.json`` (the per-step curves and end values), ``length_bias.png``
(length of correct and of incorrect responses and sampled accuracy against
step: mean over seeds, min-max band) and ``length_bias.md`` (start and end
values: the means over the first and last ``--tail`` steps; the end's mean over
seeds with its t interval across seeds). ``--report`` writes them again from
``summary.json``.
"""
import numpy as np

from pgjax import markdown
from pgjax.config import Experiment, ModelSection, OptimConfig, TaskSection, WarmStartSection
from pgjax.rollout.collect import RolloutConfig
from pgjax.study import ACROSS_SEEDS_NOTE, plot_band, seed_cell, tail_mean, variants

VARIANTS = {
    "grpo": {"divide_by_std": 1.0, "divide_by_length": 1.0},
    "std_only": {"divide_by_std": 1.0, "divide_by_length": 0.0},
    "length_only": {"divide_by_std": 0.0, "divide_by_length": 1.0},
    "dr_grpo": {"divide_by_std": 0.0, "divide_by_length": 0.0},
}
CURVES = (("length_correct", "length of correct responses"), ("length_incorrect", "length of incorrect responses"),
          ("accuracy", "sampled accuracy"))


def base_experiment(steps: int, smoke: bool) -> Experiment:
    """The shared settings (everything but the seed, the switches and the run directory)."""
    if smoke:
        return Experiment(name="length_bias", algorithm="dr_grpo", steps=steps, prompts_per_step=4, eval_every=steps,
                          eval_prompts=8, checkpoint_every=steps,
                          task=TaskSection(name="scratchpad_arithmetic", options={"working": "after"}),
                          model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                          rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=16),
                          warm_start=WarmStartSection(steps=3, batch_size=8))
    return Experiment(name="length_bias", algorithm="dr_grpo", steps=steps, prompts_per_step=32, eval_every=25,
                      eval_prompts=256, checkpoint_every=steps,
                      task=TaskSection(name="scratchpad_arithmetic", options={"digits": 1, "working": "after"}),
                      rollout=RolloutConfig(samples_per_prompt=8, max_prompt_tokens=8, max_new_tokens=20),
                      optim=OptimConfig(lr=5e-4, warmup_steps=5),
                      warm_start=WarmStartSection(steps=120, batch_size=64))


def curves(records: list[dict]) -> dict:
    """Per-step values of ``CURVES`` (None where a step had no correct / no incorrect response)."""
    steps = [r for r in records if "accuracy" in r]
    return {"step": [r["step"] for r in steps], **{key: [r[key] for r in steps] for key, _ in CURVES}}


def summarise(runs: dict, tail: int) -> dict:
    """Per variant and curve: each seed's end value (the mean over the last ``tail`` steps) and their mean
    over seeds, and the mean over seeds of the start value (the first ``tail`` steps)."""
    out = {}
    for variant, seeds in runs.items():
        end = {key: [tail_mean(c[key], tail) for c in seeds.values()] for key, _ in CURVES}
        start = {key: [tail_mean(c[key][:tail], tail) for c in seeds.values()] for key, _ in CURVES}
        out[variant] = {key: {"start_mean": float(np.mean(start[key])), "end_mean": float(np.mean(end[key])),
                              "end_per_seed": end[key]} for key, _ in CURVES}
    return out


def table(summary: dict, tail: int) -> str:
    """Per variant and curve: the start value (mean over seeds) -> the end value (mean over seeds and its
    interval across seeds)."""
    rows = [[variant, *(f"{s[k]['start_mean']:.2f} -> {seed_cell(s[k]['end_per_seed'], '.2f')}" for k, _ in CURVES)]
            for variant, s in summary.items()]
    return (markdown.table(["variant", "length correct: start -> end", "length incorrect: start -> end",
                            "accuracy: start -> end"], rows)
            + f"\n\nstart / end: mean over the first / last {tail} steps; start: mean over seeds; end: "
            f"{ACROSS_SEEDS_NOTE}.")


def plot(runs: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.2 * len(CURVES), 3.4))
    for ax, (key, label) in zip(axes, CURVES, strict=True):
        for variant, seeds in runs.items():
            plot_band(ax, next(iter(seeds.values()))["step"], [c[key] for c in seeds.values()], variant)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("RL step", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle("length bias: mean over seeds (10-step moving average), min-max band", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> dict:
    return variants.main(argv, __doc__, "length_bias", 150, base_experiment, VARIANTS, curves, summarise, table, plot)


if __name__ == "__main__":
    main()
