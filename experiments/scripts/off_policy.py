"""Off-policy rollouts in real training: staleness 0, 1 and 2, a bfloat16 sampler, and each correction.

    python experiments/scripts/off_policy.py [--seeds 2] [--steps 250]      # ~40 min on 2 CPU cores
    python experiments/scripts/off_policy.py --smoke --runs /tmp/op --out /tmp/op   # seconds: the CI check
    python experiments/scripts/off_policy.py --report      # summary, table and plot again from summary.json

The main job (Dr. GRPO on 2-digit addition, the README's quickstart) from the same warm-started
checkpoint per seed, with:

  rollout.staleness = s        the batch of step t is sampled with the parameters of step t - s
                               (sampled while step t - s's update runs; 0 = on-policy)
  rollout.compute_dtype        bfloat16: a bfloat16 sampler for the float32 learner
  algorithm.correction            ignore (measure only), token / geometric / sequence importance
                               weights pi_old / mu (``algorithm.correction_mode`` truncate at
                               ``algorithm.hparams.is_cap`` = 2, or mask outside [0.5, 2]), or
                               behaviour_ratio (the PPO clip against the sampler's mu)

Variant names: ``s<staleness>``, ``bf16`` (the sampler), the correction (``tis``: truncated at 2,
``mis``: masked outside [0.5, 2], ``clip_mu``: behaviour_ratio). Each run logs the
learner-vs-sampler mismatch every step (``mismatch_abs``, ``mismatch_kl``, ...).
``--out`` gets ``summary.json`` (per-step curves and end values), ``off_policy.md`` (the table: each
seed's final evaluation accuracy, the other measures' mean over seeds with a t interval across seeds)
and ``off_policy.png`` (evaluation accuracy against step and against wall time, and the mismatch
KL against step). Wall time is the sum of the steps' ``time_step`` (evaluation excluded); all
variants run one after another in one process, so they share the machine alike.
"""
import numpy as np

from pgjax import markdown
from pgjax.config import Experiment, ModelSection, WarmStartSection
from pgjax.rollout.collect import RolloutConfig
from pgjax.study import ACROSS_SEEDS_NOTE, plot_band, seed_cell, tail_mean, variants

TIS = {"algorithm.correction": "token"}
VARIANTS = {
    "s0": {},
    "s0_bf16": {"rollout.compute_dtype": "bfloat16"},
    "s0_bf16_token_tis": {"rollout.compute_dtype": "bfloat16", **TIS},
    "s1": {"rollout.staleness": 1},
    "s1_token_tis": {"rollout.staleness": 1, **TIS},
    "s1_token_mis": {"rollout.staleness": 1, **TIS, "algorithm.correction_mode": "mask"},
    "s1_geometric_tis": {"rollout.staleness": 1, "algorithm.correction": "geometric"},
    "s1_sequence_tis": {"rollout.staleness": 1, "algorithm.correction": "sequence"},
    "s1_clip_mu": {"rollout.staleness": 1, "algorithm.correction": "behaviour_ratio"},
    "s2": {"rollout.staleness": 2},
    "s2_token_tis": {"rollout.staleness": 2, **TIS},
    "s2_clip_mu": {"rollout.staleness": 2, "algorithm.correction": "behaviour_ratio"},
}
PER_STEP = ("accuracy", "mismatch_abs", "mismatch_kl", "mismatch_outside", "is_limited", "time_step")


def base_experiment(steps: int, smoke: bool) -> Experiment:
    """The main job's settings (``Experiment``'s defaults), or a tiny model for the smoke check."""
    if smoke:
        return Experiment(name="off_policy", steps=steps, prompts_per_step=4, eval_every=steps, eval_prompts=8,
                          checkpoint_every=steps,
                          model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                          rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=6),
                          warm_start=WarmStartSection(steps=3, batch_size=8))
    return Experiment(name="off_policy", steps=steps, checkpoint_every=steps)


def curves(records: list[dict]) -> dict:
    """Per-step values of ``PER_STEP``, the cumulative wall time, and the evaluations (step, accuracy)."""
    steps = [r for r in records if "accuracy" in r]
    evals = [r for r in records if r.get("eval_accuracy") is not None]
    times = np.cumsum([r["time_step"] for r in steps]).tolist()
    wall = {r["step"]: t for r, t in zip(steps, times, strict=True)}
    return {"step": [r["step"] for r in steps], "wall": times, **{k: [r.get(k) for r in steps] for k in PER_STEP},
            "eval_step": [r["step"] for r in evals], "eval_wall": [wall.get(r["step"], 0.0) for r in evals],
            "eval_accuracy": [r["eval_accuracy"] for r in evals]}


def summarise(runs: dict, tail: int) -> dict:
    """Per variant, each seed's value and their mean: the final evaluation accuracy, the sampled accuracy
    and mismatch over the last ``tail`` steps, the median step time and the total wall time; and each
    seed's evaluation accuracy at the start (the warm-started policy) and at the end."""
    def over_seeds(values):
        return {"mean": float(np.mean(values)), "per_seed": [float(v) for v in values]}
    out = {}
    for variant, seeds in runs.items():
        c = list(seeds.values())
        out[variant] = {
            "eval_accuracy": over_seeds([x["eval_accuracy"][-1] for x in c]),
            "eval_start_per_seed": [x["eval_accuracy"][0] for x in c],
            "eval_end_per_seed": [x["eval_accuracy"][-1] for x in c],
            "accuracy": over_seeds([tail_mean(x["accuracy"], tail) for x in c]),
            **{key: over_seeds([tail_mean(x[key], tail) for x in c])
               for key in ("mismatch_abs", "mismatch_kl", "mismatch_outside", "is_limited")},
            "step_seconds": over_seeds([float(np.median(x["time_step"])) for x in c]),
            "wall_seconds": over_seeds([x["wall"][-1] for x in c])}
    return out


def table(summary: dict, tail: int) -> str:
    """Per variant: each seed's final evaluation accuracy, then the other measures across seeds."""
    rows = []
    for variant, s in summary.items():
        limited = "-" if np.isnan(s["is_limited"]["mean"]) else seed_cell(s["is_limited"]["per_seed"], ".4f")
        across = [seed_cell(s[key]["per_seed"], fmt) for key, fmt in (
            ("accuracy", ".3f"), ("mismatch_abs", ".2e"), ("mismatch_kl", ".2e"), ("mismatch_outside", ".4f"))]
        rows.append([variant, " / ".join(f"{a:.3f}" for a in s["eval_end_per_seed"]), *across, limited,
                     f"{s['step_seconds']['mean']:.3f} s", f"{s['wall_seconds']['mean']:.0f} s"])
    start = " / ".join(f"{a:.3f}" for a in next(iter(summary.values()))["eval_start_per_seed"])
    return (markdown.table(["variant", "final eval accuracy per seed", "sampled accuracy", "mean |dlog p|",
                            "KL(mu||pi)", "outside [0.5, 2]", "weights limited", "median step", "wall"], rows)
            + f"\n\nGreedy eval accuracy of the warm-started policy (every variant's start), per seed: {start}. "
            f"Other columns: {ACROSS_SEEDS_NOTE}; sampled accuracy and mismatch: mean over the last {tail} steps; "
            "median step and wall: the RL steps' time_step (evaluation excluded), mean over seeds.")


def plot(runs: dict, path, title: str = "off-policy rollouts on the main job: mean over seeds") -> None:
    """Greedy eval accuracy against step and against wall time, and KL(mu || pi) against step, of
    ``{variant: {seed: curves}}`` (the mean over seeds; solid: on-policy, dashed: 1 step stale, dotted: 2)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for variant, seeds in runs.items():
        c = list(seeds.values())
        style = "-" if variant.startswith("s0") else "--" if variant.startswith("s1") else ":"
        mean_eval = np.mean([x["eval_accuracy"] for x in c], axis=0)
        axes[0].plot(c[0]["eval_step"], mean_eval, style, label=variant)
        axes[1].plot(np.mean([x["eval_wall"] for x in c], axis=0), mean_eval, style, label=variant)
        plot_band(axes[2], c[0]["step"], [[max(v, 1e-12) if v is not None else None for v in x["mismatch_kl"]]
                                          for x in c], variant)
    axes[0].set(xlabel="RL step", title="greedy eval accuracy")
    axes[1].set(xlabel="wall seconds (RL steps)", title="greedy eval accuracy")
    axes[2].set(xlabel="RL step", title="KL(mu || pi) per token (k3)", yscale="log")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> dict:
    return variants.main(argv, __doc__, "off_policy", 250, base_experiment, VARIANTS, curves, summarise, table, plot)


if __name__ == "__main__":
    main()
