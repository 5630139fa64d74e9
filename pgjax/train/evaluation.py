"""Evaluation of a policy on a task's held-out prompts, with 95% confidence intervals: ``evaluate``
(the Trainer's periodic evaluation and ``python -m pgjax.eval``'s), the unbiased ``pass_at_k`` and
the intervals.

``evaluate`` is the one evaluation code path: a greedy pass (one argmax response per prompt) and a
sampled pass (N responses per prompt), both through ``rollout.sample_and_score``. Its metrics:

  greedy_accuracy   fraction of prompts whose greedy response scores exactly 1.0 by ``task.reward_fn``
                    (``Trainer.evaluate``'s definition)
  pass@k            the unbiased estimator ``pass_at_k`` of each prompt, averaged over prompts
  format_rate       fraction of sampled responses the task's ``format_pattern`` fully matches
  mean_length       mean sampled response length in tokens (the sampler's ``lengths``: EOS included)
  truncation_rate   fraction of sampled responses that hit ``max_new_tokens`` without EOS

Which 95% interval goes with which metric:

  Wilson score interval (``wilson_interval``), for a proportion of independent 0/1 outcomes:
    greedy_accuracy (one outcome per prompt), format_rate and truncation_rate (one per sampled
    response; responses to the same prompt are treated as independent, so these intervals are
    somewhat narrow when prompts differ a lot).
  Normal approximation (``mean_interval``), mean +- z s / sqrt(m) with s the sample standard
  deviation over the m prompts, for a mean of per-prompt values:
    pass@k (each prompt's estimate) and mean_length (each prompt's mean length), clipped to the
    values they can take.
"""
from __future__ import annotations

import math
import statistics

import jax
import numpy as np

from pgjax.parallel import multihost
from pgjax.parallel.mesh import single_device_mesh
from pgjax.rewards import format_reward
from pgjax.sample import Decoding
from pgjax.train.rollout import PLAIN, PromptFormat, pad_id, sample_and_score

Z95 = statistics.NormalDist().inv_cdf(0.975)     # 1.95996...: the two-sided 95% normal quantile


def _integers(name: str, value) -> np.ndarray:
    """``value`` as an integer array; ValueError for anything else (floats included)."""
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.integer) and array.dtype != bool):
        raise ValueError(f"{name} must be integers, got {value!r}")
    return array.astype(np.int64)


def pass_at_k(n, c, k: int) -> np.ndarray:
    """The unbiased pass@k estimate of each problem (Chen et al. 2021) with ``n`` samples, ``c`` correct:

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i),

    which is 1 when n - c < k. The product form keeps every factor in (0, 1) instead of dividing huge
    binomial coefficients. ``n`` and ``c`` broadcast together (one entry per problem); float64 out.
    ValueError unless they are integers with 0 <= c <= n and 1 <= k <= n."""
    n, c = np.broadcast_arrays(_integers("n", n), _integers("c", c))
    k = int(_integers("k", k))
    if np.any(c < 0) or np.any(c > n):
        raise ValueError(f"c (correct samples) must be in [0, n]; got c={c.tolist()} with n={n.tolist()}")
    if k < 1 or np.any(k > n):
        raise ValueError(f"k={k} must be in [1, n]: pass@k needs at least k samples per problem "
                         f"(n={n.min(initial=0)})")
    i = np.arange(1, n.max(initial=0) + 1, dtype=np.float64)
    tail = (i > (n - c)[..., None]) & (i <= n[..., None])
    factors = np.where(tail, 1.0 - k / i, 1.0)
    return np.where(n - c < k, 1.0, 1.0 - factors.prod(-1))


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion p = successes / trials of independent 0/1 outcomes:

        (p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n),   n = trials.

    Unlike the normal (Wald) interval it stays inside [0, 1] and is not a point at p = 0 or 1; its
    lower end is exactly 0 at p = 0 and its upper end exactly 1 at p = 1 (set so, free of rounding)."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials and trials >= 1, got {successes} of {trials}")
    p, n = successes / trials, trials
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    low = 0.0 if successes == 0 else (centre - half) / scale
    high = 1.0 if successes == trials else (centre + half) / scale
    return low, high


def mean_interval(values, z: float = Z95, support: tuple[float, float] = (-math.inf, math.inf)
                  ) -> tuple[float, float] | None:
    """The normal-approximation interval of the mean of m independent values (one per problem):

        mean -+ z s / sqrt(m),   s the sample standard deviation (ddof 1),

    clipped to ``support`` (the values the mean can take); None when m < 2 (no s). It relies on the
    mean being about normal over problems, and is a point when every value is the same."""
    values = np.asarray(values, np.float64)
    if values.ndim != 1 or not np.all(np.isfinite(values)):
        raise ValueError(f"values must be a finite 1-D array, got shape {values.shape}")
    if len(values) < 2:
        return None
    mean, half = values.mean(), z * values.std(ddof=1) / math.sqrt(len(values))
    return float(max(support[0], mean - half)), float(min(support[1], mean + half))


def _proportion(outcomes) -> dict:
    """A rate of 0/1 ``outcomes`` with its Wilson interval."""
    outcomes = np.asarray(outcomes, bool)
    return {"value": float(outcomes.mean()), "ci95": list(wilson_interval(int(outcomes.sum()), outcomes.size)),
            "interval": "wilson"}


def _mean(values, support: tuple[float, float]) -> dict:
    """The mean of per-problem ``values`` with its normal-approximation interval."""
    interval = mean_interval(values, support=support)
    return {"value": float(np.mean(values)), "ci95": None if interval is None else list(interval),
            "interval": "normal"}


def check_ks(ks, samples: int) -> tuple[int, ...]:
    """The distinct ``ks`` in order; ValueError unless each is in [1, samples]."""
    if samples < 0:
        raise ValueError(f"samples must be >= 0 (0: the greedy pass only), got {samples}")
    bad = [k for k in ks if not 1 <= k <= samples]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= samples={samples}; got k={bad[0]} (raise --samples or lower --k)")
    return tuple(sorted(set(ks)))


def evaluate(policy, tokenizer, task, examples: list[dict], *, samples: int, ks=(), decoding: Decoding,
             max_prompt_tokens: int, eos_ids, key, mesh=None, nonfinite: str = "error",
             prompt_format: PromptFormat = PLAIN) -> dict:
    """Greedy and sampled evaluation of ``policy`` on ``examples`` (every process's: each process
    samples its share, ``multihost.process_share``, and the metrics gather all rows).

    The greedy pass draws one argmax response per prompt; ``greedy_accuracy`` is the fraction whose
    ``task.reward_fn`` score is exactly 1.0. With ``samples`` = N >= 1 a sampled pass draws N responses
    per prompt as ``decoding`` says (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``; a
    ``RolloutConfig`` will do) and gives ``pass@k`` for each k of ``ks`` (1 <= k <= N), ``format_rate``,
    ``mean_length`` and ``truncation_rate`` (see the module docstring); ``samples=0`` runs the greedy
    pass only. Prompts are rendered by ``prompt_format`` (a chat template) and left-padded to
    ``max_prompt_tokens``; ``eos_ids`` end a response; ``key`` seeds the sampling; ``nonfinite`` is
    ``sample_and_score``'s policy for a NaN score.

    Returns ``{"prompts": P, "samples": N, "decoding": {...}, "metrics": {name: {"value", "ci95":
    [low, high] or None, "interval": "wilson" | "normal"}}, "per_prompt": {"greedy_correct": [P] 0/1,
    "sampled_correct": [P] correct samples of N (with samples)}}``, JSON-ready, prompts in ``examples``' order."""
    ks = check_ks(ks, samples)
    if not examples:
        raise ValueError("evaluate needs at least one example")
    mesh = single_device_mesh() if mesh is None else mesh
    share, pad, prompts = multihost.process_share(examples, mesh), pad_id(tokenizer), len(examples)
    greedy_key, sample_key = jax.random.split(key)
    greedy = sample_and_score(policy, tokenizer, share, max_prompt_tokens, greedy_key,
                              decoding.sampling(eos_ids, pad, greedy=True), {"correct": task.reward_fn},
                              mesh, nonfinite, prompt_format)
    greedy_correct = multihost.gather_rows(greedy.scores["correct"] == 1.0, prompts, mesh)
    metrics = {"greedy_accuracy": _proportion(greedy_correct)}
    per_prompt = {"greedy_correct": greedy_correct.astype(int).tolist()}
    if samples:
        scored = sample_and_score(policy, tokenizer, share, max_prompt_tokens, sample_key,
                                  decoding.sampling(eos_ids, pad, n=samples),
                                  {"correct": task.reward_fn, "format": format_reward(task.format_pattern)},
                                  mesh, nonfinite, prompt_format)
        rows = {"correct": scored.scores["correct"] == 1.0, "format": scored.scores["format"] == 1.0,
                "length": scored.lengths, "truncated": scored.truncated}
        rows = multihost.gather_rows(rows, prompts * samples, mesh)
        correct = rows["correct"].reshape(prompts, samples).sum(1)
        per_prompt["sampled_correct"] = correct.astype(int).tolist()
        metrics.update({f"pass@{k}": _mean(pass_at_k(samples, correct, k), (0.0, 1.0)) for k in ks})
        metrics["format_rate"] = _proportion(rows["format"])
        metrics["mean_length"] = _mean(rows["length"].reshape(prompts, samples).mean(1),
                                       (0.0, float(decoding.max_new_tokens)))
        metrics["truncation_rate"] = _proportion(rows["truncated"])
    return {"prompts": prompts, "samples": samples, "decoding": decoding.decoding(), "metrics": metrics,
            "per_prompt": per_prompt}


INTERVALS = {"wilson": "Wilson score interval (a proportion of independent 0/1 outcomes)",
             "normal": "normal approximation, mean +- 1.96 s / sqrt(prompts) with s the standard deviation over "
                       "prompts"}


def to_markdown(results: dict) -> str:
    """A table ``metric | value | 95% CI`` of ``evaluate``'s results, and a line on the counts and intervals."""
    rows = ["| metric | value | 95% CI |", "|---|---:|---:|"]
    for name, m in results["metrics"].items():
        interval = "-" if m["ci95"] is None else f"[{m['ci95'][0]:.3f}, {m['ci95'][1]:.3f}]"
        rows.append(f"| {name} | {m['value']:.3f} | {interval} |")
    used = dict.fromkeys(m["interval"] for m in results["metrics"].values())
    rows += ["", f"{results['prompts']} prompts, {results['samples']} samples per prompt; 95% CI: "
             + "; ".join(f"{name}: {INTERVALS[name]}" for name in used)]
    return "\n".join(rows)
