"""Evaluation of a policy on a task's held-out prompts, with 95% confidence intervals: ``evaluate``
(the Trainer's periodic evaluation and ``python -m pgjax.eval``'s), the unbiased ``pass_at_k``, the
intervals, and one table of evaluations at several budgets (``to_markdown``).

``evaluate`` is the one evaluation code path: a greedy pass (one argmax response per prompt) and a
sampled pass (N responses per prompt), both through ``rollout.sample_and_score``, in batches of at
most ``batch_rows`` responses. Its metrics, each for all prompts and for each value of each tag the
examples carry (``STRATA``: ``difficulty``, ``op``, ``kind``; the ``strata`` of the results):

  greedy_accuracy    fraction of prompts whose greedy response scores exactly 1.0 by ``task.reward_fn``
                     (``Trainer.evaluate``'s definition)
  pass@k             the unbiased estimator ``pass_at_k`` of each prompt, averaged over prompts; pass@1 is
                     the sampled accuracy overall (always reported when sampling)
  finish_rate        fraction of sampled responses that ended with an EOS / end-of-turn token rather than
                     running into ``max_new_tokens``
  accuracy_finished  fraction correct among the sampled responses that finished (None when none did):
                     accuracy separated from the budget
  mean_length        mean sampled response length in tokens (the sampler's ``lengths``: EOS included)
  length_correct     mean length of the correct sampled responses, and ``length_incorrect`` of the others
                     (None where there are none): the length bias the paper describes, GRPO's 1/|o|
                     favouring short correct and long incorrect answers
  format_rate        fraction of sampled responses the task's ``format_pattern`` fully matches

Which 95% interval goes with which metric:

  Wilson score interval (``wilson_interval``): greedy_accuracy, one independent 0/1 outcome per prompt.
  Percentile bootstrap over prompts (``bootstrap_means``, ``percentile_interval``): every sampled
    metric. Each of ``RESAMPLES`` (10,000) resamples draws the prompts with replacement (a prompt's N
    responses move together, so prompts that differ in difficulty widen the interval as they should),
    recomputes the metric (accuracy_finished as the ratio of the resampled means of correct-and-finished
    and finished, the lengths of correct and incorrect responses likewise; resamples where the
    denominator is 0 are left out) and the interval is the 2.5th to
    97.5th percentile of the resampled values. The resamples come from ``np.random.default_rng(seed)``
    with ``bootstrap_seed`` (default 0), so an evaluation's intervals are reproducible. Where every
    prompt has the same value (say, no correct response at all) every resample does too and the
    interval is that one point: the data show no spread, which with few prompts is weak evidence.
"""
from __future__ import annotations

import jax
import numpy as np

from pgjax import markdown
from pgjax.evaluation.statistics import (
    RESAMPLES,
    bootstrap_means,
    pass_at_k,
    percentile_interval,
    wilson_interval,
)
from pgjax.parallel import multihost
from pgjax.parallel.mesh import batch_shards, single_device_mesh
from pgjax.rollout.collect import PLAIN, PromptFormat, pad_id, sample_and_score
from pgjax.rollout.episodes import run_episodes
from pgjax.sample import Decoding
from pgjax.tasks import format_reward

STRATA = ("difficulty", "op", "kind")             # the example tags evaluation groups by, when examples carry them
BATCH_ROWS = 512                                  # responses per sampler call


EPISODE_COUNTS = ("turns", "calls", "valid_calls", "episode_tokens")      # per-episode columns of a multi-turn pass


def _proportion(outcomes) -> dict:
    """A rate of 0/1 ``outcomes`` with its Wilson interval."""
    outcomes = np.asarray(outcomes, bool)
    return {"value": float(outcomes.mean()), "ci95": list(wilson_interval(int(outcomes.sum()), outcomes.size)),
            "interval": "wilson"}


def _bootstrapped(value, draws) -> dict:
    """A metric's ``value`` (None: undefined) with the percentile interval of its resampled ``draws``
    (None: fewer than two prompts, nothing to resample)."""
    interval = None if value is None or draws is None else percentile_interval(draws)
    return {"value": value, "ci95": None if interval is None else list(interval), "interval": "bootstrap"}


def check_ks(ks, samples: int) -> tuple[int, ...]:
    """The distinct ``ks`` in order; ValueError unless each is in [1, samples]."""
    if samples < 0:
        raise ValueError(f"samples must be >= 0 (0: the greedy pass only), got {samples}")
    bad = [k for k in ks if not 1 <= k <= samples]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= samples={samples}; got k={bad[0]} (raise --samples or lower --k)")
    return tuple(sorted(set(ks)))


def outcome_metrics(greedy_correct, sampled: dict | None, ks=(1,), resamples: int = RESAMPLES,
                    seed: int = 0) -> dict:
    """The metrics of one set of P prompts (module docstring) from their outcomes: ``greedy_correct`` [P]
    0/1, and ``sampled`` (None: the greedy pass only) with ``correct``, ``finished``, ``format`` [P, N]
    0/1 and ``length`` [P, N] of N responses per prompt; pass@k for each of ``ks``. Greedy accuracy has
    the Wilson interval, the sampled metrics the percentile bootstrap over prompts (``resamples``,
    ``seed``; all from the same resamples)."""
    metrics = {"greedy_accuracy": _proportion(greedy_correct)}
    if sampled is None:
        return metrics
    correct, finished = np.asarray(sampled["correct"], bool), np.asarray(sampled["finished"], bool)
    columns = {f"pass@{k}": pass_at_k(correct.shape[1], correct.sum(1), k) for k in ks}
    length = np.asarray(sampled["length"], np.float64)
    columns |= {"finish_rate": finished.mean(1), "finished_correct": (correct & finished).mean(1),
                "mean_length": length.mean(1), "correct": correct.mean(1), "incorrect": (~correct).mean(1),
                "correct_tokens": (length * correct).mean(1), "incorrect_tokens": (length * ~correct).mean(1),
                "format_rate": np.asarray(sampled["format"], bool).mean(1)}
    values = {name: float(column.mean()) for name, column in columns.items()}
    draws = dict.fromkeys(columns)
    if len(correct) >= 2:
        draws = dict(zip(columns, bootstrap_means(np.stack(list(columns.values()), 1), resamples, seed).T, strict=True))
    for name in (*(f"pass@{k}" for k in ks), "finish_rate"):
        metrics[name] = _bootstrapped(values[name], draws[name])
    metrics["accuracy_finished"] = _ratio(values, draws, "finished_correct", "finish_rate")
    metrics["mean_length"] = _bootstrapped(values["mean_length"], draws["mean_length"])
    metrics["length_correct"] = _ratio(values, draws, "correct_tokens", "correct")
    metrics["length_incorrect"] = _ratio(values, draws, "incorrect_tokens", "incorrect")
    metrics["format_rate"] = _bootstrapped(values["format_rate"], draws["format_rate"])
    if "calls" in sampled:
        metrics.update(_episode_metrics(sampled, resamples, seed))
    return metrics


def _episode_metrics(sampled: dict, resamples: int, seed: int) -> dict:
    """Multi-turn episodes' metrics from ``sampled``'s ``calls``, ``valid_calls``, ``turns`` and
    ``episode_tokens`` [P, N]: ``call_rate`` (episodes with a tool call), ``valid_call_rate`` (calls
    that ran, of all calls; None without calls), ``mean_turns``, ``mean_episode_tokens`` (the tokens
    after the prompt, the environment's included), each with its bootstrap interval over prompts."""
    calls, valid = np.asarray(sampled["calls"], np.float64), np.asarray(sampled["valid_calls"], np.float64)
    columns = {"call_rate": (calls > 0).mean(1), "calls": calls.mean(1), "valid": valid.mean(1),
               "mean_turns": np.asarray(sampled["turns"], np.float64).mean(1),
               "mean_episode_tokens": np.asarray(sampled["episode_tokens"], np.float64).mean(1)}
    values = {name: float(column.mean()) for name, column in columns.items()}
    draws = dict.fromkeys(columns)
    if len(calls) >= 2:
        draws = dict(zip(columns, bootstrap_means(np.stack(list(columns.values()), 1), resamples, seed).T, strict=True))
    out = {name: _bootstrapped(values[name], draws[name]) for name in ("call_rate", "mean_turns",
                                                                       "mean_episode_tokens")}
    out["valid_call_rate"] = _ratio(values, draws, "valid", "calls")
    return out


def _ratio(values: dict, draws: dict, numerator: str, denominator: str) -> dict:
    """The ratio of two means over prompts, ``values[numerator] / values[denominator]`` (None where the
    denominator is 0), with the percentile interval of the same ratio over the resamples ``draws``
    (resamples whose denominator is 0 left out)."""
    ratio = None
    if draws[denominator] is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(draws[denominator] > 0, draws[numerator] / draws[denominator], np.nan)
    return _bootstrapped(values[numerator] / values[denominator] if values[denominator] > 0 else None, ratio)


def _plain(value):
    """A NumPy scalar as the Python one (for JSON)."""
    return value.item() if isinstance(value, np.generic) else value


def strata_of(examples: list[dict], by=STRATA) -> dict[str, list]:
    """``{tag: its value for each example}`` for each tag of ``by`` the examples carry; ValueError for a
    value that is not a str, int, float or bool."""
    tags = {}
    for tag in (t for t in by if t in examples[0]):
        values = [_plain(e[tag]) for e in examples]
        bad = next((v for v in values if not isinstance(v, str | int | float)), None)
        if bad is not None:
            raise ValueError(f"tag {tag!r}: evaluation groups by str, int, float or bool values, got {bad!r}")
        tags[tag] = values
    return tags


def _strata(tags: dict[str, list], greedy_correct, sampled: dict | None, ks, resamples: int, seed: int) -> dict:
    """``{tag: {str(value): {"prompts": count, "metrics": outcome_metrics of those prompts}}}``, values in
    sorted order (numbers before strings)."""
    out: dict[str, dict[str, dict]] = {}
    for tag, tag_values in tags.items():
        values = np.array(tag_values, dtype=object)
        out[tag] = {}
        for value in sorted(set(values), key=lambda v: (isinstance(v, str), v)):
            rows = values == value
            part = None if sampled is None else {name: x[rows] for name, x in sampled.items()}
            out[tag][str(value)] = {"prompts": int(rows.sum()),
                                    "metrics": outcome_metrics(greedy_correct[rows], part, ks, resamples, seed)}
    return out


def _per_prompt(examples: list[dict], tags: dict, greedy_correct, sampled: dict | None) -> dict:
    """Each prompt's text, tags and outcome counts (what ``pgjax.evaluation.paired`` compares); for
    episodes also, over its samples, the episodes with a tool call (``sampled_calling``), the calls, the
    valid calls and the turns summed, and the mean tokens of an episode."""
    out = {"prompt": [e["prompt"] for e in examples], "tags": tags,
           "greedy_correct": greedy_correct.astype(int).tolist()}
    if sampled is not None:
        correct, finished = sampled["correct"], sampled["finished"]
        out |= {"sampled_correct": correct.sum(1).tolist(), "sampled_finished": finished.sum(1).tolist(),
                "finished_correct": (correct & finished).sum(1).tolist(),
                "mean_length": sampled["length"].mean(1).tolist()}
        if "calls" in sampled:
            calls = np.asarray(sampled["calls"])
            out |= {"sampled_calling": (calls > 0).sum(1).tolist(), "calls": calls.sum(1).tolist(),
                    "valid_calls": np.asarray(sampled["valid_calls"]).sum(1).tolist(),
                    "turns": np.asarray(sampled["turns"]).sum(1).tolist(),
                    "mean_episode_tokens": np.asarray(sampled["episode_tokens"], np.float64).mean(1).tolist()}
    return out


def _in_batches(examples: list[dict], key, n: int, mesh, batch_rows: int, play) -> dict:
    """``play(batch, key)`` -> ``{name: [rows]}`` over ``examples`` (this process's) in consecutive
    batches of at most ``batch_rows`` responses (``n`` per prompt; at least one prompt, a multiple of
    this process's batch devices; the last batch filled up with copies of its first prompt, so one
    program is compiled, and the copies' rows dropped), joined in order (row p * n + k: response k of
    prompt p). One batch plays with ``key``, batch i of several with ``fold_in(key, i)``."""
    unit = max(1, batch_shards(mesh) // jax.process_count())
    size = min(len(examples), max(unit, batch_rows // n // unit * unit))
    batches = [examples[i:i + size] for i in range(0, len(examples), size)]
    parts = []
    for i, batch in enumerate(batches):
        batch_key = key if len(batches) == 1 else jax.random.fold_in(key, i)
        played = play(batch + [batch[0]] * (size - len(batch)), batch_key)
        parts.append({name: np.asarray(x)[:len(batch) * n] for name, x in played.items()})
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _sampled(policy, tokenizer, prompt_width: int, sampling, scorers: dict, mesh, nonfinite: str,
             prompt_format: PromptFormat):
    """``_in_batches``' play for single responses: ``sample_and_score``'s scores, ``length`` and
    ``truncated`` of each."""
    def play(batch, key):
        scored = sample_and_score(policy, tokenizer, batch, prompt_width, key, sampling, scorers, mesh, nonfinite,
                                  prompt_format)
        return {**scored.scores, "length": scored.lengths, "truncated": scored.truncated}
    return play


def _played(policy, tokenizer, prompt_width: int, sampling, task, mesh, prompt_format: PromptFormat, environment,
            limits):
    """``_in_batches``' play for multi-turn episodes (``episodes.run_episodes`` of ``environment``
    within ``limits``): per episode ``correct`` (the environment's ``info["correct"]``, 0 where it gave
    none), ``format`` (the task's format reward of the last reply), ``length`` (the policy's tokens),
    ``truncated``, and the episode counts ``turns``, ``calls``, ``valid_calls``, ``episode_tokens``."""
    form = format_reward(task.format_pattern)

    def play(batch, key):
        played = run_episodes(policy, tokenizer, environment, batch, key, sampling, limits, prompt_format,
                              prompt_width, mesh)
        last = [replies[-1] if replies else "" for replies in played.replies]
        length = played.mask.sum(1).astype(np.int64)
        return {"correct": np.nan_to_num(played.correct, nan=0.0),
                "format": form([e["prompt"] for e in batch for _ in range(sampling.n)], last), "length": length,
                "truncated": played.truncated, "turns": played.turns, "calls": played.calls,
                "valid_calls": played.valid_calls, "episode_tokens": length + played.observation_tokens}
    return play


def evaluate(policy, tokenizer, task, examples: list[dict], *, samples: int, ks=(), decoding: Decoding,
             max_prompt_tokens: int, eos_ids, key, mesh=None, nonfinite: str = "error",
             prompt_format: PromptFormat = PLAIN, by=STRATA, batch_rows: int = BATCH_ROWS,
             resamples: int = RESAMPLES, bootstrap_seed: int = 0, environment=None, limits=None) -> dict:
    """Greedy and sampled evaluation of ``policy`` on ``examples`` (every process's: each process
    samples its share, ``multihost.process_share``, and the metrics gather all rows).

    The greedy pass draws one argmax response per prompt; ``greedy_accuracy`` is the fraction whose
    ``task.reward_fn`` score is exactly 1.0. With ``samples`` = N >= 1 a sampled pass draws N responses
    per prompt as ``decoding`` says (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``; a
    ``RolloutConfig`` will do) and gives ``pass@k`` for 1 and each k of ``ks`` (1 <= k <= N),
    ``finish_rate``, ``accuracy_finished``, ``mean_length`` and ``format_rate`` (see the module
    docstring); ``samples=0`` runs the greedy pass only. The metrics are computed for all prompts and,
    under ``strata``, for the prompts of each value of each tag of ``by`` the examples carry. Prompts
    are rendered by ``prompt_format`` (a chat template) and left-padded to ``max_prompt_tokens``;
    ``eos_ids`` end a response; ``key`` seeds the sampling (the same key at two budgets draws the same
    tokens up to the smaller one); each sampler call takes at most ``batch_rows`` responses (its KV cache
    grows with rows x (``max_prompt_tokens`` + ``max_new_tokens``)); ``nonfinite`` is
    ``sample_and_score``'s policy for a NaN score; ``resamples`` and ``bootstrap_seed`` set the bootstrap.
    With an ``environment`` (a factory, ``TaskContext.environment``) every response is a multi-turn
    episode within ``limits`` (``episodes.EpisodeLimits``; ``decoding.max_new_tokens`` bounds each
    reply): correct is the environment's verdict, length the policy's tokens, finished an episode
    whose last reply ended its turn, and the metrics add ``call_rate``, ``valid_call_rate``,
    ``mean_turns`` and ``mean_episode_tokens`` (``outcome_metrics``).

    Returns ``{"prompts": P, "samples": N, "decoding": {...}, "bootstrap": {"resamples", "seed"},
    "metrics": {name: {"value", "ci95": [low, high] or None, "interval": "wilson" | "bootstrap"}},
    "strata": {tag: {value: {"prompts", "metrics"}}}, "per_prompt": {"prompt": [P] texts, "tags": {tag:
    [P]}, "greedy_correct": [P] 0/1, and with samples "sampled_correct", "sampled_finished",
    "finished_correct": [P] counts of N, "mean_length": [P]}}``, JSON-ready, prompts in ``examples``' order."""
    ks = check_ks((1, *ks) if samples else ks, samples)
    if not examples:
        raise ValueError("evaluate needs at least one example")
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    tags = strata_of(examples, by)
    mesh = single_device_mesh() if mesh is None else mesh
    share, pad, prompts = multihost.process_share(examples, mesh), pad_id(tokenizer), len(examples)
    greedy_key, sample_key = jax.random.split(key)

    def play(key, sampling, scorers):
        one = (_sampled(policy, tokenizer, max_prompt_tokens, sampling, scorers, mesh, nonfinite, prompt_format)
               if environment is None else
               _played(policy, tokenizer, max_prompt_tokens, sampling, task, mesh, prompt_format, environment, limits))
        return _in_batches(share, key, sampling.n, mesh, batch_rows, one)
    greedy = play(greedy_key, decoding.sampling(eos_ids, pad, greedy=True), {"correct": task.reward_fn})
    greedy_correct = multihost.gather_rows(greedy["correct"] == 1.0, prompts, mesh)
    sampled = None
    if samples:
        rows = play(sample_key, decoding.sampling(eos_ids, pad, n=samples),
                    {"correct": task.reward_fn, "format": format_reward(task.format_pattern)})
        episode = {name: rows[name] for name in EPISODE_COUNTS if name in rows}
        rows = multihost.gather_rows({"correct": rows["correct"] == 1.0, "format": rows["format"] == 1.0,
                                      "finished": ~rows["truncated"], "length": rows["length"], **episode},
                                     prompts * samples, mesh)
        sampled = {name: x.reshape(prompts, samples) for name, x in rows.items()}
    return {"prompts": prompts, "samples": samples, "decoding": decoding.decoding(),
            "bootstrap": {"resamples": resamples, "seed": bootstrap_seed},
            "metrics": outcome_metrics(greedy_correct, sampled, ks, resamples, bootstrap_seed),
            "strata": _strata(tags, greedy_correct, sampled, ks, resamples, bootstrap_seed),
            "per_prompt": _per_prompt(examples, tags, greedy_correct, sampled)}


def budgets_of(report: dict) -> list[dict]:
    """The evaluations of a report ``python -m pgjax.eval --json`` wrote, one per response budget: its
    ``budgets`` list (several ``--max-new-tokens``), or the report itself (one)."""
    return report["budgets"] if "budgets" in report else [report]


LABELS = {"greedy_accuracy": "greedy", "finish_rate": "finished", "accuracy_finished": "accuracy if finished",
          "mean_length": "length", "format_rate": "format",
          "length_correct": "length if correct", "length_incorrect": "length if wrong"}
INTERVALS = {"wilson": "Wilson score interval (one 0/1 outcome per prompt)",
             "bootstrap": "percentile bootstrap over prompts ({resamples} resamples, seed {seed}; a prompt's "
                          "responses are resampled together)"}


def digits_of(name: str) -> int:
    """Decimals a table shows of metric ``name``: lengths and token counts to 0.1, rates to 0.001."""
    return 1 if "length" in name or name.endswith("tokens") else 3


def _cell(name: str, metric: dict) -> str:
    """``value [low, high]`` (lengths to 0.1, the rest to 0.001; ``-`` where undefined)."""
    if metric["value"] is None:
        return "-"
    digits = digits_of(name)
    interval = "" if metric["ci95"] is None else " [{:.{d}f}, {:.{d}f}]".format(*metric["ci95"], d=digits)
    return f"{metric['value']:.{digits}f}{interval}"


def to_markdown(evaluations) -> str:
    """One table of ``evaluate``'s results at one or several budgets (a results dict or a list of them):
    a row per budget and stratum (all prompts, then each tag's values), a column per metric, each cell
    ``value [95% CI]``; then a line on the counts and the intervals."""
    evaluations = [evaluations] if isinstance(evaluations, dict) else list(evaluations)
    names = list(dict.fromkeys(name for results in evaluations for name in results["metrics"]))
    rows = []
    for results in evaluations:
        groups = [("all", results["prompts"], results["metrics"])]
        groups += [(f"{tag}={value}", part["prompts"], part["metrics"])
                   for tag, values in results["strata"].items() for value, part in values.items()]
        rows += [[results["decoding"]["max_new_tokens"], count, label,
                  *(_cell(n, metrics[n]) if n in metrics else None for n in names)] for label, count, metrics in groups]
    table = markdown.table(["budget", "prompts", "stratum", *(LABELS.get(n, n) for n in names)], rows,
                           align="rrl" + "r" * len(names))
    first = evaluations[0]
    used = dict.fromkeys(m["interval"] for results in evaluations for m in results["metrics"].values())
    sampling = (f"{first['samples']} samples per prompt at temperature {first['decoding']['temperature']:g}"
                if first["samples"] else "greedy only")
    return (f"{table}\n\nbudget: max new tokens; {sampling}; 95% CI: "
            + "; ".join(f"{name}: {INTERVALS[name].format(**first['bootstrap'])}" for name in used))
