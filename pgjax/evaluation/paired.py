"""Paired comparison of models evaluated on the same prompts, and the spread of runs across seeds:
what ``python -m pgjax.eval compare`` computes from the JSON reports of ``python -m pgjax.eval --json``.

Each model is one or more evaluations (runs: e.g. one per training seed) on the same prompts. Per
prompt i a model's outcome is a rate x_i / n_i pooled over its runs: for ``greedy_accuracy`` the
greedy responses that are correct of the runs, for ``pass@1`` the correct sampled responses of all
its samples, for ``finish_rate`` the finished ones, for ``call_rate`` (episodes with tools) the
episodes with a tool call. For a pair of models (B against A):

  difference      the mean over prompts of d_i = x_i^B / n_i^B - x_i^A / n_i^A (B - A)
  ci95            the paired percentile bootstrap interval: the prompts are resampled with replacement
                  (``statistics.bootstrap_means``: ``resamples``, >= 10,000 by default, from
                  ``np.random.default_rng(seed)``), each resample's mean of d, its 2.5th-97.5th percentile
  p_value         the exact two-sided sign-flip (permutation) test of mean d = 0 (``sign_flip_test``):
                  under the null the two models are exchangeable on each prompt, so each d_i is +-|d_i|
                  with probability 1/2; p = P(|sum of s_i d_i| >= |sum of d_i|) over all 2^P signs, computed
                  exactly. With one run per model and greedy (0/1) outcomes this is McNemar's exact test.

The runs of a model are taken as fixed: these statistics say how sure the difference is on these
prompts for these trained models, not across training seeds. The across-seed spread is
``across_runs``: the mean, standard deviation (ddof 1), minimum and maximum of each metric over a
model's runs. Where either model has two runs or more (training seeds), each pair also gets the
statistics across seeds (``pair["across_seeds"]``), which take the runs as a sample:

  seeds_and_prompts   the mean over runs and prompts of B minus A's, and the two-way percentile
                      bootstrap interval that resamples the prompts (the same for both) and each
                      model's runs (``statistics.seeds_and_prompts_bootstrap``)
  seeds_t             the t test across the runs' values (each run's mean rate over the prompts):
                      Welch's unpaired t where both have two runs or more (``welch_across_seeds``), the
                      one-sample t of the several runs against the single run's value where one has one
                      (``across_seeds``): its interval and p-value
  seeds_paired_t      where the caller names each run's training seed (``run_seeds``: a study does) and
                      both models have the same two seeds or more, also the t test paired by seed
                      (``across_seeds``): runs from one seed share their prompts and sampling draws
"""
from __future__ import annotations

import itertools
import json
import pathlib

import numpy as np

from pgjax import markdown
from pgjax.evaluation.held_out import budgets_of, digits_of
from pgjax.evaluation.statistics import (
    RESAMPLES,
    across_seeds,
    bootstrap_means,
    paired_difference,
    pass_at_k,
    percentile_interval,
    seeds_and_prompts_bootstrap,
    sign_flip_test,
    welch_across_seeds,
)

# metric: (the per-prompt count of successes in a report's per_prompt, the trials per run per prompt)
PAIRED = {"greedy_accuracy": ("greedy_correct", lambda ev: 1), "pass@1": ("sampled_correct", lambda ev: ev["samples"]),
          "finish_rate": ("sampled_finished", lambda ev: ev["samples"]),
          "call_rate": ("sampled_calling", lambda ev: ev["samples"])}


def across_runs(runs: list[dict]) -> dict:
    """``{metric: {"mean", "std", "min", "max", "runs", "values"}}`` over ``runs`` (evaluations) of every
    metric all of them report with a value; ``std`` is the sample standard deviation (ddof 1), None for one
    run; ``values``: each run's, in order."""
    names = [n for n in runs[0]["metrics"] if all(r["metrics"].get(n, {}).get("value") is not None for r in runs)]
    out = {}
    for name in names:
        values = np.array([r["metrics"][name]["value"] for r in runs], np.float64)
        out[name] = {"mean": float(values.mean()), "std": float(values.std(ddof=1)) if len(values) > 1 else None,
                     "min": float(values.min()), "max": float(values.max()), "runs": len(values),
                     "values": values.tolist()}
    return out


def load_evaluation(path, budget: int | None = None) -> dict:
    """The evaluation at ``budget`` (max new tokens; None: the report's only one) of the report
    ``python -m pgjax.eval --json`` wrote at ``path``, with its ``source`` (``path@budget``); ValueError
    naming the file when it cannot be read, has no per-prompt outcomes or no such budget."""
    try:
        report = json.loads(pathlib.Path(path).read_text())
        evaluations = budgets_of(report)
    except (OSError, ValueError, TypeError, AttributeError) as error:
        raise ValueError(f"{path}: not a readable pgjax.eval report ({error})") from None
    budgets = [ev["decoding"]["max_new_tokens"] for ev in evaluations]
    if budget is None and len(budgets) > 1:
        raise ValueError(f"{path} holds budgets {', '.join(map(str, budgets))}: choose one as {path}@BUDGET "
                         "or with --budget")
    if budget is not None and budget not in budgets:
        raise ValueError(f"{path} has no evaluation at budget {budget} (it has {', '.join(map(str, budgets))})")
    evaluation = evaluations[0 if budget is None else budgets.index(budget)]
    if "prompt" not in evaluation.get("per_prompt", {}):
        raise ValueError(f"{path} records no per-prompt prompts and outcomes: evaluate again with this pgjax.eval")
    return {**evaluation, "source": f"{path}@{evaluation['decoding']['max_new_tokens']}"}


def _pooled(runs: list[dict], metric: str) -> tuple[np.ndarray, int] | None:
    """(each prompt's successes summed over ``runs``, the trials per prompt) of ``metric``; None when a
    run lacks it (a greedy-only evaluation has no sampled outcomes)."""
    field, trials = PAIRED[metric]
    if any(field not in r["per_prompt"] for r in runs):
        return None
    return np.sum([r["per_prompt"][field] for r in runs], axis=0), sum(trials(r) for r in runs)


def run_rates(runs: list[dict], metric: str) -> np.ndarray | None:
    """[runs, prompts] rates of ``metric``: each run's successes on each prompt over its trials; None when
    a run lacks it."""
    field, trials = PAIRED[metric]
    if any(field not in r["per_prompt"] for r in runs):
        return None
    return np.array([np.asarray(r["per_prompt"][field], np.float64) / trials(r) for r in runs])


def seeds_statistics(rates_b: np.ndarray, rates_a: np.ndarray, resamples: int, seed: int,
                     same_seeds: bool = False) -> dict:
    """The across-seed statistics of B - A from each model's [runs, prompts] rates (module docstring),
    at least one of them with two runs or more; ``same_seeds``: run i of both was trained from the
    same seed (the t test is then paired by seed)."""
    values_b, values_a = rates_b.mean(1), rates_a.mean(1)
    if min(len(values_b), len(values_a)) >= 2:
        t_test = welch_across_seeds(values_b, values_a)
    else:                                   # the single run's value against each of the other's runs
        t_test = {**across_seeds(*np.broadcast_arrays(values_b, values_a)), "test": "one-sample t"}
    out = {"seeds_and_prompts": seeds_and_prompts_bootstrap(rates_b, rates_a, resamples, seed), "seeds_t": t_test}
    if same_seeds and len(values_b) == len(values_a) >= 2:
        out["seeds_paired_t"] = {**across_seeds(values_b, values_a), "test": "paired t by seed"}
    return out


def check_same_prompts(models: dict[str, list[dict]]) -> None:
    """ValueError naming both reports unless every evaluation has the first's prompts, in its order."""
    runs = [run for model in models.values() for run in model]
    first = runs[0]["per_prompt"]["prompt"]
    for run in runs[1:]:
        prompts = run["per_prompt"]["prompt"]
        if prompts != first:
            where = next((i for i, (a, b) in enumerate(zip(first, prompts, strict=False)) if a != b),
                         min(len(first), len(prompts)))
            detail = (f"prompt {where} differs: {first[where]!r} against {prompts[where]!r}"
                      if where < min(len(first), len(prompts)) else f"{len(first)} against {len(prompts)} prompts")
            raise ValueError(f"{runs[0]['source']} and {run['source']} were evaluated on different prompts ({detail}); "
                             "a paired comparison needs the same prompts: evaluate every model with the same --seed, "
                             "--prompts and task options")


def compare(models: dict[str, list[dict]], resamples: int = RESAMPLES, seed: int = 0,
            run_seeds: dict[str, list[int]] | None = None) -> dict:
    """The across-seed summary of each model (``{label: [evaluations]}``, one per run) and, for every
    pair of models in order (A listed before B), the paired statistics of B - A on greedy accuracy,
    pass@1, the finish rate and the call rate (those both models have); ``run_seeds``: each label's runs' training
    seeds, in order, where known. ValueError when the prompts differ or when
    ``resamples`` < 10,000 would make a loose interval."""
    if len(models) < 2 or any(not runs for runs in models.values()):
        raise ValueError("a comparison needs two or more models, each with one or more evaluations")
    if resamples < 10_000:
        raise ValueError(f"resamples must be >= 10,000 for a stable 95% interval, got {resamples}")
    check_same_prompts(models)
    summary = {label: {"runs": [r["source"] for r in runs], "budgets": sorted({r["decoding"]["max_new_tokens"]
                                                                              for r in runs}),
                       "metrics": across_runs(runs), "seeds": (run_seeds or {}).get(label)}
               for label, runs in models.items()}
    pairs = []
    for a, b in itertools.combinations(models, 2):
        metrics, seeds = {}, {}
        for metric in PAIRED:
            pooled_a, pooled_b = _pooled(models[a], metric), _pooled(models[b], metric)
            if pooled_a is not None and pooled_b is not None:
                metrics[metric] = paired_difference(*pooled_a, *pooled_b, resamples=resamples, seed=seed)
                rates_a, rates_b = run_rates(models[a], metric), run_rates(models[b], metric)
                if rates_a is not None and rates_b is not None and max(len(rates_a), len(rates_b)) >= 2:
                    same = run_seeds is not None and a in run_seeds and run_seeds.get(b) == run_seeds[a]
                    seeds[metric] = seeds_statistics(rates_b, rates_a, resamples, seed, same)
        pairs.append({"a": a, "b": b, "metrics": metrics, **({"across_seeds": seeds} if seeds else {})})
    return {"prompts": len(next(iter(models.values()))[0]["per_prompt"]["prompt"]),
            "bootstrap": {"resamples": resamples, "seed": seed}, "models": summary, "pairs": pairs}


def pass_at_k_difference(a: dict, b: dict, k: int, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """B - A of pass@k, two evaluations (one run each) on the same prompts: per prompt i each model's
    unbiased pass@k estimate from its n samples with c_i correct (``statistics.pass_at_k``), d_i their
    difference; the mean of d, its paired percentile bootstrap 95% interval over prompts, and the exact
    sign-flip test where d lies on an integer lattice: k = 1 (c_i^B n^A - c_i^A n^B) or k = n of both
    (solved or not: [c_i^B > 0] - [c_i^A > 0]); elsewhere ``p_value`` is None."""
    check_same_prompts({"A": [a], "B": [b]})
    (na, ca), (nb, cb) = ((ev["samples"], np.asarray(ev["per_prompt"]["sampled_correct"])) for ev in (a, b))
    d = pass_at_k(nb, cb, k) - pass_at_k(na, ca, k)
    if k == 1:
        p_value: float | None = sign_flip_test(cb * na - ca * nb)
    elif k == na == nb:
        p_value = sign_flip_test((cb > 0).astype(np.int64) - (ca > 0).astype(np.int64))
    else:
        p_value = None
    return {"k": k, "difference": float(d.mean()),
            "ci95": percentile_interval(bootstrap_means(d[:, None], resamples, seed)[:, 0]), "p_value": p_value}


def pass_at_k_pairs(reference: tuple[str, list[dict]], others: dict[str, list[dict]], resamples: int = RESAMPLES,
                    seed: int = 0) -> str | None:
    """The table of each of ``others`` ({label: evaluations, one per budget}) against ``reference``
    (label, evaluations) in pass@k at every k and budget both report (``pass_at_k_difference``); None
    when they share no budget with sampled outcomes."""
    ref_label, ref_evaluations = reference
    by_budget = {ev["decoding"]["max_new_tokens"]: ev for ev in ref_evaluations}
    rows = []
    for label, evaluations in others.items():
        for ev in evaluations:
            base = by_budget.get(ev["decoding"]["max_new_tokens"])
            if base is None or "sampled_correct" not in ev["per_prompt"] or "sampled_correct" not in base["per_prompt"]:
                continue
            ks = [int(name[5:]) for name in ev["metrics"] if name.startswith("pass@") and name in base["metrics"]]
            for k in ks:
                stats = pass_at_k_difference(base, ev, k, resamples, seed)
                rows.append([f"{label} - {ref_label}", ev["decoding"]["max_new_tokens"], k,
                             _signed(stats["difference"]), _signed_interval(stats["ci95"]),
                             "-" if stats["p_value"] is None else f"{stats['p_value']:.3g}"])
    if not rows:
        return None
    return (markdown.table(["B - A", "budget", "k", "mean difference", "95% CI (paired bootstrap)",
                            "p (exact sign-flip)"], rows, align="lrrrrr")
            + f"\n\nPer prompt each model's unbiased pass@k from its samples; the interval resamples the prompts "
            f"({resamples} resamples, seed {seed}); the exact sign-flip test where the differences are on a lattice "
            "(k = 1, and k = the samples of both: solved or not), else -. One run per model: the runs are taken "
            "as fixed.")


def _spread(stats: dict, digits: int) -> str:
    """``mean`` for one run, else ``mean +- std (min-max)``."""
    if stats["runs"] == 1:
        return f"{stats['mean']:.{digits}f}"
    mean, std, low, high = (f"{stats[key]:.{digits}f}" for key in ("mean", "std", "min", "max"))
    return f"{mean} ± {std} ({low}-{high})"


def _signed(value: float) -> str:
    """``+0.123``; a value that rounds to zero is ``+0.000`` whatever its sign."""
    return f"{round(value, 3) + 0.0:+.3f}"


def _signed_interval(interval) -> str:
    return f"[{_signed(interval[0])}, {_signed(interval[1])}]"


def _each_run(models: dict, names: list[str]) -> str | None:
    """The table of each run's metrics of the models with two runs or more (a run named by its training
    seed where known, else by its place); None when every model has one run."""
    rows = []
    for label, m in models.items():
        if len(m["runs"]) > 1:
            names_of = [f"seed {s}" for s in m["seeds"]] if m.get("seeds") else [f"run {i + 1}" for i in
                                                                                  range(len(m["runs"]))]
            rows += [[label, run, *(f"{m['metrics'][n]['values'][i]:.{digits_of(n)}f}" if n in m["metrics"]
                                    else None for n in names)] for i, run in enumerate(names_of)]
    return markdown.table(["model", "run", *names], rows, align="ll" + "r" * len(names)) if rows else None


def to_markdown(comparison: dict) -> str:
    """Each model's metrics across its runs, each run's (where a model has several), each pair's paired
    statistics and, where there are several runs, the statistics across seeds."""
    models = comparison["models"]
    names = list(dict.fromkeys(n for m in models.values() for n in m["metrics"]))
    runs = markdown.table(["model", "runs", "budget", *names],
                          [[label, len(m["runs"]), ", ".join(map(str, m["budgets"])),
                            *(_spread(m["metrics"][n], digits_of(n)) if n in m["metrics"] else None for n in names)]
                           for label, m in models.items()])
    each_run = _each_run(models, names)
    if each_run is not None:
        runs = f"{runs}\n\n{each_run}"
    pairs = markdown.table(["B - A", "metric", "mean difference", "95% CI (paired bootstrap)", "p (exact sign-flip)"],
                           [[f"{pair['b']} - {pair['a']}", metric, _signed(s["difference"]),
                             _signed_interval(s["ci95"]), f"{s['p_value']:.3g}"]
                            for pair in comparison["pairs"] for metric, s in pair["metrics"].items()], align="llrrr")
    boot = comparison["bootstrap"]
    seeds = [(pair, metric, stats) for pair in comparison["pairs"]
             for metric, stats in pair.get("across_seeds", {}).items()]
    across = markdown.table(
        ["B - A", "metric", "runs (B, A)", "mean difference", "95% CI (runs and prompts bootstrap)",
         "95% CI (t across seeds)", "p (t across seeds)", "p (t paired by seed)"],
        [[f"{pair['b']} - {pair['a']}", metric, "{}, {}".format(*s["seeds_and_prompts"]["runs"]),
          _signed(s["seeds_and_prompts"]["difference"]), _signed_interval(s["seeds_and_prompts"]["ci95"]),
          _signed_interval(s["seeds_t"]["ci95"]),
          f"{s['seeds_t']['p_value']:.3g} ({s['seeds_t']['test']})",
          f"{s['seeds_paired_t']['p_value']:.3g}" if "seeds_paired_t" in s else "-"]
         for pair, metric, s in seeds], align="lllrrrrr")
    note = (f"{comparison['prompts']} prompts, the same for every model. Runs: mean ± standard deviation "
            "(min-max) over a model's runs. Pairs: per prompt each model's rate pooled over its runs; the "
            f"interval resamples prompts ({boot['resamples']} resamples, seed {boot['seed']}); the test flips "
            "the sign of each prompt's difference, exactly (McNemar's exact test for one greedy run each). "
            "The runs are taken as fixed: the pair statistics do not include the seed-to-seed spread.")
    if not seeds:
        return "\n\n".join([runs, pairs, note])
    seeds_note = ("Across seeds, the runs taken as a sample: the mean over runs and prompts; the bootstrap "
                  "interval resamples the prompts (the same for both models) and each model's runs "
                  f"({boot['resamples']} resamples, seed {boot['seed']}); the t interval and test are over the runs' "
                  "mean rates: Welch's t where both models have two runs or more, the one-sample t of the several "
                  "runs against the single run's value where one has one; where both have the same training seeds, "
                  "also the t paired by seed. With few runs the t interval "
                  "has few degrees of freedom and can be wide.")
    return "\n\n".join([runs, pairs, note, across, seeds_note])
