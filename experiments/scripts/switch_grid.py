"""The paper's two GRPO switches on the main job, over 8 seeds, trained as one population.

    python experiments/scripts/switch_grid.py           # train, keep the records, report
    python experiments/scripts/switch_grid.py --resume  # continue a population stopped early (a signal, a kill)
    python experiments/scripts/switch_grid.py --report  # the table and the plot from the kept records
    python experiments/scripts/switch_grid.py --smoke --runs /tmp/sg --out /tmp/sg     # seconds: the CI check

GRPO (eq. 18) divides each group's centred reward by the group's standard deviation ("divide by
std") and each response's loss by its length |o| ("divide by length"); Dr. GRPO (eq. 21) does
neither. The paper argues that both are biases: 1/std weights prompts whose groups agree (very easy
or very hard) more, and 1/|o| punishes a long incorrect response less per token than a short one, so
incorrect responses may grow. This trains the 2 x 2 grid of the two switches, each with 8 seeds,
on the main job (``experiments/arithmetic_dr_grpo.py``: the Dr. GRPO preset, which differs from
GRPO's only in these switches and in nothing else here: no KL term, the same clipped ratio), as one
``pgjax.train.population.Population`` of 32 members. Member ``setting x seed`` is the single run
``python -m pgjax.run experiments/arithmetic_dr_grpo.py --set seed=SEED --set
algorithm.hparams.divide_by_std=S --set algorithm.hparams.divide_by_length=L`` (docs/population.md):
the four settings of a seed share its warm start, prompts and evaluation prompts, so they are
compared in pairs, seed by seed.

``--runs`` gets the population's run directory; ``--out`` keeps ``population.json`` and each
member's ``metrics.jsonl`` (``records/member-<i>/``), which ``--report`` reads to write ``switch_grid.md``
(per setting, and per switch paired by seed: the mean over seeds with a 95% t interval across seeds,
``pgjax.evaluation.statistics.across_seeds``) and ``switch_grid.png`` (curves: mean over seeds and the min-max band).
"""
import argparse
import json
import pathlib
import shutil
import sys

import numpy as np

from pgjax import config, markdown
from pgjax.evaluation.statistics import across_seeds
from pgjax.study import plot_band, tail_mean
from pgjax.train.sinks import read_records

ROOT = pathlib.Path(__file__).resolve().parents[2]
SWITCHES = ("divide_by_std", "divide_by_length")
SETTINGS = {(0.0, 0.0): "Dr. GRPO (neither)", (1.0, 0.0): "divide by std only",
            (0.0, 1.0): "divide by length only", (1.0, 1.0): "GRPO (both)"}
# (record key, label): the end of training, the mean of the last TAIL steps (the final evaluation for eval_accuracy)
METRICS = (("eval_accuracy", "greedy accuracy (held out)"), ("accuracy", "sampled accuracy"),
           ("length_incorrect", "length of incorrect responses"), ("length_correct", "length of correct responses"))
TAIL = 10


def base_experiment(steps: int | None, smoke: bool) -> config.Experiment:
    """The main job (``experiments/arithmetic_dr_grpo.py``), or a seconds-long one for ``--smoke``."""
    exp = config.load(str(ROOT / "experiments" / "arithmetic_dr_grpo.py"))
    if smoke:
        exp = config.override(exp, [
            "steps=3", "prompts_per_step=4", "eval_every=3", "eval_prompts=8", "warm_start.steps=3",
            "warm_start.batch_size=8", "model.hidden_size=32", "model.intermediate_size=64",
            "model.num_hidden_layers=1", "model.num_attention_heads=2", "model.num_key_value_heads=1",
            "model.head_dim=16", "rollout.samples_per_prompt=4"])
    if steps is not None:
        exp = config.override(exp, [f"steps={steps}"])
    return exp


def train(exp: config.Experiment, seeds: int, runs: pathlib.Path, out: pathlib.Path, resume: bool) -> None:
    """Train the population into ``runs`` (``resume``: continue the one there from its checkpoint) and
    keep its records in ``out/records``."""
    from pgjax.train.population import Population
    population = Population.grid(exp, seeds=list(range(seeds)), **{s: [0.0, 1.0] for s in SWITCHES})
    directory = population.fit(runs, resume=resume)
    kept = out / "records"
    if kept.exists():
        shutil.rmtree(kept)
    kept.mkdir(parents=True)
    shutil.copy(directory / "population.json", kept / "population.json")
    for i in range(population.size):
        (kept / f"member-{i}").mkdir()
        shutil.copy(directory / f"member-{i}" / "metrics.jsonl", kept / f"member-{i}" / "metrics.jsonl")


def load(records: pathlib.Path) -> dict:
    """``{(divide_by_std, divide_by_length): {seed: [records]}}`` from the kept records."""
    population = json.loads((records / "population.json").read_text())
    runs = {setting: {} for setting in SETTINGS}
    for member in population["members"]:
        if member["stopped"]:
            raise SystemExit(f"member {member['member']} stopped ({member['stopped']}): the report needs every member")
        setting = tuple(float(member["hparams_resolved"][s]) for s in SWITCHES)
        runs[setting][member["seed"]] = read_records(records / member["directory"])
    exp = population["experiment"]
    return {"steps": population["steps_done"], "warm_start": exp["warm_start"]["steps"],
            "eval_prompts": exp["eval_prompts"], "runs": runs}


def end_value(records: list[dict], key: str) -> float:
    """The end of training: the final evaluation for ``eval_accuracy``, else the mean of the last
    ``TAIL`` steps' values."""
    if key == "eval_accuracy":
        return float(next(r[key] for r in reversed(records) if r.get(key) is not None))
    return tail_mean([r.get(key) for r in records if "reward" in r], TAIL)


def _cell(values, baseline, digits: int, effect: bool = False) -> str:
    """Mean [95% t interval] across seeds of ``values`` (minus ``baseline``, paired by seed; with the t
    test's p and the seeds above it for an ``effect``); "n/a" where a seed has no value (e.g. no
    incorrect response in its last steps)."""
    if not (np.isfinite(values).all() and np.isfinite(baseline).all()):
        return "n/a"
    stats = across_seeds(values, baseline)
    sign = "+" if effect else ""
    low, high = stats["ci95"]
    cell = f"{stats['mean']:{sign}.{digits}f} [{low:{sign}.{digits}f}, {high:{sign}.{digits}f}]"
    return cell + (f", p={stats['p_value']:.2g}, {stats['positive']}/{stats['seeds']}" if effect else "")


def report(loaded: dict) -> str:
    """The markdown report: per setting, then per switch (paired by seed)."""
    runs = loaded["runs"]
    seeds = sorted(runs[(0.0, 0.0)])
    end = {setting: {key: np.array([end_value(runs[setting][s], key) for s in seeds]) for key, _ in METRICS}
           for setting in SETTINGS}
    lines = [f"The main job's 2 x 2 grid of GRPO's switches, {len(seeds)} seeds each ({loaded['steps']} RL steps "
             f"after the {loaded['warm_start']}-step warm start; one population of {len(seeds) * len(SETTINGS)} "
             "members). "
             f"End of training: the final greedy evaluation on the seed's {loaded['eval_prompts']} held-out prompts, "
             "and the mean over the last "
             f"{TAIL} steps' sampled responses. Mean over seeds [95% t interval across seeds].", "",
             markdown.table(["setting", *(label for _, label in METRICS)],
                            [[name, *(_cell(end[setting][key], np.zeros(len(seeds)), 3 if "accuracy" in key else 2)
                                      for key, _ in METRICS)] for setting, name in SETTINGS.items()])]
    lines += ["", "Each switch's effect, on minus off, paired by seed (the settings of a seed share its warm start, "
                  "prompts and held-out prompts): averaged over the other switch's two values, and GRPO against "
                  "Dr. GRPO. Mean difference over seeds [95% t interval]; p: the paired t test across seeds; "
                  "k/n: the seeds whose difference is > 0.", ""]
    effects = {"divide by std": ((1.0, 0.0), (1.0, 1.0), (0.0, 0.0), (0.0, 1.0)),
               "divide by length": ((0.0, 1.0), (1.0, 1.0), (0.0, 0.0), (1.0, 0.0)),
               "GRPO - Dr. GRPO": ((1.0, 1.0), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0))}
    lines.append(markdown.table(["effect", *(label for _, label in METRICS)], [
        [name, *(_cell((end[on_a][key] + end[on_b][key]) / 2, (end[off_a][key] + end[off_b][key]) / 2,
                       3 if "accuracy" in key else 2, effect=True) for key, _ in METRICS)]
        for name, (on_a, on_b, off_a, off_b) in effects.items()]))
    lines += ["", "Per seed: the greedy accuracy on its held-out prompts after the warm start (step 0, shared by "
                  "its four settings) and at the end of training, per setting.", "",
              markdown.table(["seed", "after the warm start", *SETTINGS.values()], [
                  [seed, f"{runs[(0.0, 0.0)][seed][0]['eval_accuracy']:.3f}",
                   *(f"{end_value(runs[setting][seed], 'eval_accuracy'):.3f}" for setting in SETTINGS)]
                  for seed in seeds], align="r" * (2 + len(SETTINGS)))]
    return "\n".join(lines)


def plot(loaded: dict, path) -> None:
    """Curves per setting: mean over seeds and the min-max band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = (("eval_accuracy", "greedy accuracy (held out)"), ("accuracy", "sampled accuracy"),
            ("length_incorrect", "length of incorrect responses"))
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4))
    for ax, (key, label) in zip(axes, keys, strict=True):
        for setting, name in SETTINGS.items():
            per_seed = [[r for r in records if r.get(key) is not None] for records in loaded["runs"][setting].values()]
            steps = [r["step"] for r in per_seed[0]]
            plot_band(ax, steps, [[r[key] for r in rows] for rows in per_seed], name,
                      window=1 if key == "eval_accuracy" else 10)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("RL step", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.suptitle("GRPO's switches on the main job: mean over seeds, min-max band", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=8, help="seeds per setting (default 8)")
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the main job's)")
    parser.add_argument("--runs", type=pathlib.Path, default=pathlib.Path("runs/switch_grid"))
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "experiments" / "results" / "switch_grid")
    parser.add_argument("--resume", action="store_true", help="continue the population in --runs from its checkpoint")
    parser.add_argument("--report", action="store_true", help="only the report, from the kept records")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long run of a tiny model (the CI check)")
    args = parser.parse_args(argv)
    if not args.report:
        if args.seeds < 2:
            parser.error("--seeds must be >= 2 (intervals across seeds)")
        train(base_experiment(args.steps, args.smoke), args.seeds, args.runs, args.out, args.resume)
    loaded = load(args.out / "records")
    text = report(loaded)
    (args.out / "switch_grid.md").write_text(text + "\n")
    plot(loaded, args.out / "switch_grid.png")
    print(text)
    return text


if __name__ == "__main__":
    sys.exit(main() and 0)
