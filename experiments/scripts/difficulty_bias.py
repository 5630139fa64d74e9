"""GRPO's question-difficulty bias in real training (the paper's "Dr. GRPO" section; Liu et al. 2025).

    python experiments/scripts/difficulty_bias.py [--seeds 3] [--steps 100]      # ~10 min on 2 CPU cores
    python experiments/scripts/difficulty_bias.py --smoke --runs /tmp/db --out /tmp/db   # seconds: the CI check
    python experiments/scripts/difficulty_bias.py --report      # summary, table and plot again from summary.json

Claim: dividing a group's advantages by its reward std (eq. 18, 20) scales a
question's whole update by 1 / std. With binary rewards and success rate p the
std is sqrt(p (1 - p)) (up to K / (K - 1)), smallest for questions that are
nearly always or nearly never solved, so those get the largest weight;
without the division (Dr. GRPO, eq. 21) a question's weight grows with its
std, largest at p = 1/2.

Prompts (``arithmetic_mix``): 1-, 2- and 3-digit sums in equal shares (easy,
medium, hard after a short supervised warm start). Two variants from the
Dr. GRPO preset (group-mean baseline, rho-hat, sum over tokens / prompts, no
1/|o|, no KL), the same seeds and warm-started checkpoints:

  std     / std     (GRPO's group normalisation)
  no_std  Dr. GRPO

At every step, before the update (the rollout prepared, rho = 1), each
difficulty d's measured share of the update:

  weight_d       sum over its tokens of |c_t|, c_t = -d loss / d log pi_t
                 (``core.token_weights``: the advantage times the aggregation weight)
  weight_share_d weight_d / sum over all difficulties
  grad_norm_d    || gradient of the loss restricted to its rows ||  (the rollout's mask
                 zeroed elsewhere; advantages and denominators stay those of the whole batch)
  accuracy_d     its sampled accuracy;  solved_groups_d / failed_groups_d: the share of its
                 groups whose K rewards are all 1 / all 0 (no signal under either variant)

and, whatever the prompt's difficulty, by a group's number of correct responses k = 1..K-1:
groups_k<k> (how many) and weight_k<k> (their summed |token weight|). The paper's claim is about
these: a group's sum of |A| is 2 k (K - k) / K, so without the std its weight is proportional to
k (K - k), largest at k = K/2; dividing by the sample std sqrt(k (K - k) / (K (K - 1))) makes it
proportional to sqrt(k (K - k)): nearly-always and nearly-never solved groups gain relative to
k = K/2 (for K = 8, k = 1 goes from 0.44 to 0.66 of a k = 4 group's weight). Response lengths
enter the measured weights too (the sum is over tokens), so the match is approximate.

Writes ``summary.json``, ``difficulty_bias.png`` (per-difficulty weight share and accuracy
against step, per variant) and ``difficulty_bias.md`` (the means over the first and last
``--tail`` steps; the last ones' mean over seeds with its t interval across seeds) into ``--out``;
the runs under ``--runs``.
"""
import jax.numpy as jnp
import numpy as np
import optax

from pgjax import markdown
from pgjax.config import Experiment, ModelSection, TaskSection, WarmStartSection
from pgjax.rollout.collect import RolloutConfig
from pgjax.study import ACROSS_SEEDS_NOTE, plot_band, seed_cell, tail_mean, variants
from pgjax.train.trainer import Callback

VARIANTS = {"std": {"divide_by_std": 1.0}, "no_std": {"divide_by_std": 0.0}}
DIFFICULTIES = (1, 2, 3)
MEASURES = ("weight", "weight_share", "grad_norm", "accuracy", "solved_groups", "failed_groups")


def base_experiment(steps: int, smoke: bool) -> Experiment:
    """The shared settings (everything but the seed, the switch and the run directory)."""
    task = TaskSection(name="arithmetic_mix", options={"digits": len(DIFFICULTIES)})
    if smoke:
        return Experiment(name="difficulty_bias", algorithm="dr_grpo", steps=steps, prompts_per_step=6,
                          eval_every=steps, eval_prompts=6, checkpoint_every=steps, task=task,
                          model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                          rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=6),
                          warm_start=WarmStartSection(steps=3, batch_size=6))
    return Experiment(name="difficulty_bias", algorithm="dr_grpo", steps=steps, prompts_per_step=30, eval_every=25,
                      eval_prompts=240, checkpoint_every=steps, task=task,
                      rollout=RolloutConfig(samples_per_prompt=8, max_prompt_tokens=8, max_new_tokens=6),
                      warm_start=WarmStartSection(steps=800, batch_size=60))


def bucket_measures(weights, correct, difficulty, group_size: int) -> dict:
    """Per difficulty: the summed |token weight|, its share, accuracy, and the share of all-1 / all-0
    groups. ``weights`` [B, N] token weights; ``correct``, ``difficulty`` [B] (rows p * K + k)."""
    per_row = np.abs(np.asarray(weights, np.float64)).sum(1)
    total = per_row.sum()
    groups = np.asarray(correct, float).reshape(-1, group_size)
    out = {}
    for d in DIFFICULTIES:
        rows = np.asarray(difficulty) == d
        mine = groups[rows[::group_size]]
        out[f"weight_{d}"] = float(per_row[rows].sum())
        out[f"weight_share_{d}"] = float(per_row[rows].sum() / total) if total > 0 else float("nan")
        out[f"accuracy_{d}"] = float(np.asarray(correct)[rows].mean())
        out[f"solved_groups_{d}"] = float((mine.min(1) == 1).mean())
        out[f"failed_groups_{d}"] = float((mine.max(1) == 0).mean())
    successes = groups.sum(1)
    per_group = per_row.reshape(-1, group_size).sum(1)
    for k in range(1, group_size):
        out[f"groups_k{k}"] = float((successes == k).sum())
        out[f"weight_k{k}"] = float(per_group[successes == k].sum())
    return out


class BucketMeasures(Callback):
    """Before each update: ``bucket_measures`` and each difficulty's gradient norm (one process: the
    rollout's rows are all here)."""

    def before_update(self, trainer, rollout, examples, stats) -> dict:
        learner, hp = trainer.learner, trainer.hparams
        difficulty = np.repeat([e["difficulty"] for e in examples], learner.group_size)
        weights = learner.token_weights(trainer.state, rollout, hp)
        out = bucket_measures(weights, stats["correct"], difficulty, learner.group_size)
        for d in DIFFICULTIES:
            only = rollout.with_mask(rollout.mask * jnp.asarray(difficulty == d, rollout.mask.dtype)[:, None])
            out[f"grad_norm_{d}"] = float(optax.tree.norm(learner.policy_gradient(trainer.state, only, hp)))
        return out


def curves(records: list[dict]) -> dict:
    steps = [r for r in records if "accuracy" in r]
    keys = [f"{m}_{d}" for m in MEASURES for d in DIFFICULTIES]
    keys += sorted(k for k in steps[0] if k.startswith(("groups_k", "weight_k")))
    return {"step": [r["step"] for r in steps], **{key: [r[key] for r in steps] for key in keys}}


def weight_per_group(seeds: dict) -> dict:
    """k -> the mean |token weight| of a group with k correct responses (pooled over steps and
    seeds), relative to that of a group with k = K/2."""
    ks = sorted(int(key[len("groups_k"):]) for key in next(iter(seeds.values())) if key.startswith("groups_k"))
    mean = {k: sum(sum(c[f"weight_k{k}"]) for c in seeds.values())
            / max(sum(sum(c[f"groups_k{k}"]) for c in seeds.values()), 1) for k in ks}
    middle = mean[(len(ks) + 1) // 2]
    return {k: mean[k] / middle if middle > 0 else float("nan") for k in ks}


def summarise(runs: dict, tail: int) -> dict:
    """Per variant and measure: the first and last ``tail`` steps' mean, averaged over seeds, and the last
    ones' per seed; and ``weight_per_group``."""
    def first_and_last(key: str) -> dict:
        last = [tail_mean(c[key], tail) for c in runs_of_variant.values()]
        return {"start": float(np.mean([tail_mean(c[key][:tail], tail) for c in runs_of_variant.values()])),
                "end": float(np.mean(last)), "end_per_seed": last}

    out = {}
    for variant, runs_of_variant in runs.items():
        measures = [key for key in next(iter(runs_of_variant.values())) if key.startswith(MEASURES)]
        out[variant] = {**{key: first_and_last(key) for key in measures},
                        "weight_per_group": weight_per_group(runs_of_variant)}
    return out


def predicted_weight_per_group(k: int, group_size: int, divide_by_std: bool) -> float:
    """k (K - k), or sqrt(k (K - k)) with the std division, relative to k = K/2."""
    middle = (group_size // 2) * (group_size - group_size // 2)
    return float(np.sqrt(k * (group_size - k) / middle) if divide_by_std else k * (group_size - k) / middle)


def table(summary: dict, tail: int) -> str:
    """Per variant and difficulty each measure's first -> last value; then per variant the measured and
    predicted weight of a group by its number of correct responses."""
    names = {1: "easy (1 digit)", 2: "medium (2 digits)", 3: "hard (3 digits)"}

    def cell(values: dict, fmt: str = ".2f") -> str:
        return f"{values['start']:{fmt}} -> {seed_cell(values['end_per_seed'], fmt)}"

    rows = [[variant, names[d], cell(s[f"weight_share_{d}"]), cell(s[f"grad_norm_{d}"], ".3f"),
             cell(s[f"accuracy_{d}"]), cell(s[f"solved_groups_{d}"]), cell(s[f"failed_groups_{d}"])]
            for variant, s in summary.items() for d in DIFFICULTIES]
    lines = [markdown.table(["variant", "difficulty", "weight share: first -> last", "gradient norm: first -> last",
                             "accuracy: first -> last", "all-correct groups", "all-wrong groups"], rows, "llrrrrr"),
             "", f"first / last: mean over the first / last {tail} steps; first: then over seeds; last: then the "
             f"{ACROSS_SEEDS_NOTE}.", ""]
    first = next(iter(summary.values()))["weight_per_group"]
    group_size = len(first) + 1
    rows = []
    for variant, s in summary.items():
        std = VARIANTS[variant]["divide_by_std"] > 0
        rows.append([f"{variant}: measured", *(f"{v:.2f}" for v in s["weight_per_group"].values())])
        rows.append([f"{variant}: predicted",
                     *(f"{predicted_weight_per_group(int(k), group_size, std):.2f}" for k in first)])
    lines += [markdown.table(["k correct of K", *(f"{k}/{group_size}" for k in first)], rows), "",
              f"mean |token weight| of a group with k correct responses, relative to k = {group_size // 2}; "
              "predicted from the advantages alone (equal lengths)."]
    return "\n".join(lines)


def plot(runs: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [(variant, measure) for measure in ("weight_share", "accuracy") for variant in runs]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.8 * len(panels), 3.3), sharey=False)
    for ax, (variant, measure) in zip(axes, panels, strict=True):
        seeds = runs[variant]
        for d in DIFFICULTIES:
            plot_band(ax, next(iter(seeds.values()))["step"], [c[f"{measure}_{d}"] for c in seeds.values()],
                      f"{d} digit{'s' if d > 1 else ''}")
        ax.set_title(f"{variant}: {measure.replace('_', ' ')}", fontsize=9)
        ax.set_xlabel("RL step", fontsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle("difficulty bias: mean over seeds (10-step moving average), min-max band", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> dict:
    return variants.main(argv, __doc__, "difficulty_bias", 100, base_experiment, VARIANTS, curves, summarise, table,
                         plot, callbacks=(BucketMeasures(),))


if __name__ == "__main__":
    main()
