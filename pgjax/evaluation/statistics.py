"""The statistics every report uses (NumPy and SciPy; no JAX): proportions, pass@k, the one percentile
bootstrap, medians of timings and their ratios, and the paired tests.

- ``pass_at_k``: the unbiased pass@k estimator; ``wilson_interval``: a proportion's Wilson interval.
- ``bootstrap``: the percentile bootstrap's resampling (rows drawn with replacement from
  ``np.random.default_rng(seed)``), used by ``bootstrap_means`` (evaluations' sampled metrics, paired
  differences) and by ``median_interval`` / ``median_ratio`` (benchmarks' step times; a side's pooled
  steps are resampled independently of the other's, and fewer than ``MIN_STEPS`` steps are refused as
  too few for an interval); ``percentile_interval`` takes the resampled values' percentiles.
- ``sign_flip_test`` and ``paired_difference``: two models on the same prompts, the runs taken as fixed;
  ``across_seeds``: two settings across training seeds paired by seed, the seeds the sample (Student's
  t); ``welch_across_seeds``: the same unpaired (Welch's t); ``seeds_and_prompts_bootstrap``: two models'
  runs on the same prompts, runs and prompts both resampled (the interval that includes both the
  seed-to-seed and the prompt-to-prompt spread).

A hand-rolled bootstrap rather than ``scipy.stats.bootstrap``: the recorded intervals are reproduced
from ``default_rng(seed)`` draw for draw, and a prompt's columns (several metrics at once) must move
together in one resample, which ``scipy.stats.bootstrap`` does only through its paired mode, one
statistic at a time.
"""
from __future__ import annotations

import math
import statistics

import numpy as np

Z95 = statistics.NormalDist().inv_cdf(0.975)     # 1.95996...: the two-sided 95% normal quantile
RESAMPLES = 10_000                                # bootstrap resamples of every interval that is not Wilson's
MIN_STEPS = 5                                     # the fewest timed steps a median's interval is computed from
EXACT_TEST_LIMIT = 10 ** 9      # the exact sign-flip test's work (differences x lattice width) before it refuses


def integer_array(name: str, value) -> np.ndarray:
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
    n, c = np.broadcast_arrays(integer_array("n", n), integer_array("c", c))
    k = int(integer_array("k", k))
    if np.any(c < 0) or np.any(c > n):
        raise ValueError(f"c (correct samples) must be in [0, n]; got c={c.tolist()} with n={n.tolist()}")
    if k < 1 or np.any(k > n):
        raise ValueError(f"k={k} must be in [1, n]: pass@k needs at least k samples per problem "
                         f"(n={n.min(initial=0)})")
    i = np.arange(1, n.max(initial=0) + 1, dtype=np.float64)
    tail = (i > (n - c)[..., None]) & (i <= n[..., None])
    factors = np.where(tail, 1.0 - k / i, 1.0)
    return np.where(n - c < k, 1.0, 1.0 - factors.prod(-1))


def wilson_interval(successes: float, trials: float, z: float = Z95) -> tuple[float, float]:
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


def bootstrap(rows, statistic=np.mean, resamples: int = RESAMPLES, rng=0) -> np.ndarray:
    """The percentile bootstrap's resampled statistics, the one resampling every interval here uses:
    ``statistic(rows[idx[b]], axis=1)`` for b < ``resamples``, where
    ``idx = rng.integers(0, P, size=(resamples, P))`` draws the P rows (prompts, timed steps) with
    replacement, a row's columns moving together. ``rng``: a seed or a ``np.random.Generator`` (several
    draws in turn from one generator resample several samples independently). Vectorised in blocks of
    resamples (about 32 MiB each); float64 [resamples, ...]."""
    rows = np.asarray(rows, np.float64)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(rng)
    idx = rng.integers(0, len(rows), size=(resamples, len(rows)))
    block = max(1, 2 ** 22 // max(rows.size, 1))
    return np.concatenate([statistic(rows[idx[b:b + block]], axis=1) for b in range(0, resamples, block)])


def bootstrap_means(columns, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """The column means of ``columns`` [P, M] (one row per prompt) on ``resamples`` bootstrap resamples of
    the prompts (``bootstrap``), float64 [resamples, M]. ValueError for anything but a finite [P >= 1, M]
    array or resamples < 1."""
    columns = np.asarray(columns, np.float64)
    if columns.ndim != 2 or len(columns) < 1 or not np.all(np.isfinite(columns)):
        raise ValueError(f"columns must be a finite [prompts >= 1, M] array, got shape {columns.shape}")
    return bootstrap(columns, np.mean, resamples, seed)


def percentile_interval(draws, level: float = 0.95) -> tuple[float, float] | None:
    """The percentile bootstrap interval at ``level`` (95%: the 2.5th and 97.5th percentiles) of the resampled values
    ``draws`` (NumPy's default, linear interpolation between order statistics), leaving out NaN draws (a
    statistic undefined on that resample); None when no draw is a number."""
    draws = np.asarray(draws, np.float64)
    draws = draws[~np.isnan(draws)]
    if not draws.size:
        return None
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def _numeric_interval(draws, level: float = 0.95) -> tuple[float, float]:
    """``percentile_interval`` of draws from finite data, where some draw is always a number; a ValueError
    where none is."""
    interval = percentile_interval(draws, level)
    if interval is None:
        raise ValueError("no bootstrap draw is a number")
    return interval


def _step_times(times, name: str) -> np.ndarray:
    values = np.asarray(times, dtype=np.float64)
    if values.ndim != 1 or values.size < MIN_STEPS:
        raise ValueError(f"{name}: {values.size} timed steps; a median and its interval need at least {MIN_STEPS}")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(f"{name}: times must be finite and > 0")
    return values


def median_interval(times, seed: int = 0, level: float = 0.95) -> dict:
    """``{"median", "low", "high", "n"}`` of ``times`` (seconds, at least ``MIN_STEPS``), the interval the
    percentile bootstrap of the median (``bootstrap``, ``percentile_interval``)."""
    values = _step_times(times, "times")
    low, high = _numeric_interval(bootstrap(values, np.median, RESAMPLES, seed), level)
    return {"median": float(np.median(values)), "low": low, "high": high, "n": int(values.size)}


def median_ratio(numerator, denominator, seed: int = 0, level: float = 0.95) -> dict:
    """``{"ratio", "low", "high", "n"}``: median(numerator) / median(denominator) of two sides' pooled
    step times, e.g. TRL's seconds over pgjax's (> 1: pgjax faster), with the percentile-bootstrap
    interval of the ratio of medians, each side resampled independently from one generator."""
    a, b = _step_times(numerator, "numerator"), _step_times(denominator, "denominator")
    rng = np.random.default_rng(seed)
    ratios = bootstrap(a, np.median, RESAMPLES, rng) / bootstrap(b, np.median, RESAMPLES, rng)
    low, high = _numeric_interval(ratios, level)
    return {"ratio": float(np.median(a) / np.median(b)), "low": low, "high": high, "n": [int(a.size), int(b.size)]}


def describe_ratio(result: dict) -> str:
    """``2.04x [1.87, 2.21]`` for a ``median_ratio``."""
    return f"{result['ratio']:.2f}x [{result['low']:.2f}, {result['high']:.2f}]"


def sign_flip_test(differences) -> float:
    """The two-sided p-value of the exact paired sign-flip (permutation) test of a zero mean difference.

    ``differences``: the per-prompt differences m_i as integers (differences of rates on a common
    lattice, e.g. c_B n_A - c_A n_B for c of n successes). Under the null each sign s_i = +-1 is equally
    likely and independent, and p = P(|sum_i s_i m_i| >= |sum_i m_i|) over all 2^P sign vectors. It is
    computed exactly by building the distribution of the signed sum one difference at a time (after
    dividing every m_i by their greatest common divisor), in float64. Zero differences do not move the
    sum. For 0/1 outcomes the nonzero m_i are McNemar's b discordant pairs of +1 and c of -1 and p is his
    exact test, min(1, 2 P(X <= min(b, c))) with X ~ Binomial(b + c, 1/2). ValueError for non-integers
    or a lattice too wide to sum (``EXACT_TEST_LIMIT``)."""
    m = integer_array("differences", differences).ravel()
    observed = int(m.sum())
    m = np.abs(m[m != 0])
    if not m.size:
        return 1.0
    divisor = int(np.gcd.reduce(m))
    m, observed = m // divisor, abs(observed) // divisor
    total = int(m.sum())
    if m.size * (2 * total + 1) > EXACT_TEST_LIMIT:
        raise ValueError(f"the exact sign-flip test of {m.size} differences summing to {total} lattice steps is "
                         "too large to compute")
    distribution = np.zeros(2 * total + 1)       # index: signed sum + total
    distribution[total] = 1.0
    for v in m:
        shifted = np.zeros_like(distribution)
        shifted[v:] += 0.5 * distribution[:-v]
        shifted[:-v] += 0.5 * distribution[v:]
        distribution = shifted
    return min(1.0, float(distribution[np.abs(np.arange(-total, total + 1)) >= observed].sum()))


def paired_difference(successes_a, trials_a: int, successes_b, trials_b: int, resamples: int = RESAMPLES,
                      seed: int = 0) -> dict:
    """B against A on the same P prompts, from each prompt's successes ([P] integers) of ``trials_a`` /
    ``trials_b`` (the same for every prompt): the mean per-prompt difference of rates, its paired
    percentile bootstrap 95% interval and the exact sign-flip test's p-value (module docstring)."""
    xa, xb = integer_array("successes_a", successes_a), integer_array("successes_b", successes_b)
    na, nb = int(integer_array("trials_a", trials_a)), int(integer_array("trials_b", trials_b))
    if xa.ndim != 1 or xa.shape != xb.shape or min(na, nb) < 1 or np.any((xa < 0) | (xa > na) | (xb < 0) | (xb > nb)):
        raise ValueError("need [P] counts of both models with 0 <= successes <= trials and trials >= 1")
    d = xb / nb - xa / na
    low, high = _numeric_interval(bootstrap_means(d[:, None], resamples, seed)[:, 0])
    return {"difference": float(d.mean()), "ci95": [low, high], "p_value": sign_flip_test(xb * na - xa * nb),
            "interval": "paired bootstrap", "test": "exact sign-flip"}


def across_seeds(values_b, values_a) -> dict:
    """B against A across training seeds, paired by seed: ``values_b[s]`` and ``values_a[s]`` are one
    number per seed s (a run's end accuracy, say) of two settings trained from the same seed. With the
    per-seed differences d_s = b_s - a_s over n >= 2 seeds, mean m and sample standard deviation sd
    (ddof 1): ``ci95`` = m -+ t_{0.975, n-1} sd / sqrt(n), Student's t interval across seeds, and
    ``p_value`` the two-sided paired t test of mean d = 0 (1.0 when every d_s is equal: no spread to
    test against, and the interval is the point; equal up to float rounding counts); ``positive``: the
    seeds with d_s > 0. Here the seeds are the sample: unlike ``paired_difference``, which takes the
    runs as fixed, this says how sure the difference is across training runs. With ``values_a`` all
    zero it is B's own mean and interval across seeds."""
    b, a = (np.asarray(v, np.float64) for v in (values_b, values_a))
    if b.ndim != 1 or b.shape != a.shape or b.size < 2 or not (np.isfinite(b).all() and np.isfinite(a).all()):
        raise ValueError(f"need two [n] arrays of finite per-seed values, n >= 2 (got {b.shape} and {a.shape})")
    d = b - a
    n, mean, sd = d.size, float(d.mean()), float(d.std(ddof=1))
    no_spread = sd <= 1e-12 * np.abs(d).max()        # every d_s equal, up to float rounding
    half, p = _t_interval_and_test(mean, 0.0 if no_spread else sd ** 2 / n, n - 1)
    return {"mean": mean, "ci95": [mean - half, mean + half], "p_value": p, "positive": int((d > 0).sum()),
            "seeds": n, "interval": "t across seeds", "test": "paired t"}


def _t_interval_and_test(mean: float, variance_of_mean: float, dof: float) -> tuple[float, float]:
    """(half-width of the 95% t interval, two-sided p of mean = 0) for an estimate ``mean`` with the
    estimated variance ``variance_of_mean`` on ``dof`` degrees of freedom; without spread (variance 0)
    there is nothing to test against: (0, 1.0)."""
    if not variance_of_mean > 0:
        return 0.0, 1.0
    from scipy import stats as scipy_stats  # imported here: it costs every command line's start
    scale = math.sqrt(variance_of_mean)
    return (float(scipy_stats.t.ppf(0.975, dof)) * scale,
            float(2 * scipy_stats.t.sf(abs(mean) / scale, dof)))


def welch_across_seeds(values_b, values_a) -> dict:
    """B against A across training seeds, not paired: ``values_b`` holds one number per run of B (its end
    accuracy, say), ``values_a`` one per run of A, n_B, n_A >= 2 each, from seeds that need not match.
    With means m, sample variances v (ddof 1) and v_B / n_B + v_A / n_A = se^2: ``mean`` = m_B - m_A,
    Welch-Satterthwaite's dof = se^4 / ((v_B / n_B)^2 / (n_B - 1) + (v_A / n_A)^2 / (n_A - 1)),
    ``ci95`` = mean -+ t_{0.975, dof} se and ``p_value`` the two-sided Welch t test of m_B = m_A. With no
    spread in either (se = 0, up to float rounding) there is nothing to test against: the interval is
    the point and ``p_value`` 1.0, as in ``across_seeds``. Like it, the seeds are the sample."""
    b, a = (np.asarray(v, np.float64) for v in (values_b, values_a))
    if b.ndim != 1 or a.ndim != 1 or min(b.size, a.size) < 2 or not (np.isfinite(b).all() and np.isfinite(a).all()):
        raise ValueError(f"need two 1-D arrays of finite per-run values, two runs or more each (got {b.shape} and "
                         f"{a.shape})")
    share_b, share_a = b.var(ddof=1) / b.size, a.var(ddof=1) / a.size
    se2 = float(share_b + share_a)
    if se2 <= (1e-12 * max(np.abs(b).max(), np.abs(a).max(), 1e-300)) ** 2:    # no spread, up to rounding
        se2 = 0.0
    mean = float(b.mean() - a.mean())
    dof = se2 ** 2 / (share_b ** 2 / (b.size - 1) + share_a ** 2 / (a.size - 1)) if se2 else float("nan")
    half, p = _t_interval_and_test(mean, se2, dof)
    return {"mean": mean, "ci95": [mean - half, mean + half], "p_value": p, "dof": float(dof) if se2 else None,
            "runs": [int(b.size), int(a.size)], "interval": "Welch t across seeds", "test": "Welch t"}


def _resampled_means(rates: np.ndarray, prompt_weights: np.ndarray, rng) -> np.ndarray:
    """[S] means of ``rates`` ([R, P]) over R runs drawn with replacement (from ``rng``) and the prompts
    weighted by ``prompt_weights`` ([S, P], each row the drawn prompts' counts over P)."""
    runs = rates.shape[0]
    run_weights = rng.multinomial(runs, np.full(runs, 1.0 / runs), size=prompt_weights.shape[0]) / runs
    return np.einsum("sr,rp,sp->s", run_weights, rates, prompt_weights)


def _run_prompt_rates(name: str, rates) -> np.ndarray:
    rates = np.asarray(rates, np.float64)
    if rates.ndim != 2 or 0 in rates.shape or not np.isfinite(rates).all():
        raise ValueError(f"{name} must be a finite [runs, prompts] array of rates, got shape {rates.shape}")
    return rates


def seeds_and_prompts_draws(rates_b, rates_a, resamples: int = RESAMPLES, seed: int = 0) -> np.ndarray:
    """The ``resamples`` resampled differences of ``seeds_and_prompts_bootstrap`` (its docstring): each draws
    P prompts with replacement, the same for both models, and each model's runs with replacement,
    independently of the other's; a draw is the mean of B's drawn runs on the drawn prompts minus A's."""
    b, a = _run_prompt_rates("rates_b", rates_b), _run_prompt_rates("rates_a", rates_a)
    if b.shape[1] != a.shape[1]:
        raise ValueError(f"the two models' rates must be on the same prompts, got {b.shape[1]} and {a.shape[1]}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(seed)
    prompts = b.shape[1]
    prompt_weights = rng.multinomial(prompts, np.full(prompts, 1.0 / prompts), size=resamples) / prompts
    return _resampled_means(b, prompt_weights, rng) - _resampled_means(a, prompt_weights, rng)


def seeds_and_prompts_bootstrap(rates_b, rates_a, resamples: int = RESAMPLES, seed: int = 0) -> dict:
    """B against A when each is one or more runs (training seeds) evaluated on the same P prompts:
    ``rates_b`` [R_B, P] and ``rates_a`` [R_A, P] hold each run's rate on each prompt. The statistic is the
    mean over runs and prompts of B minus that of A, ``difference``. Each of ``resamples`` resamples
    (``np.random.default_rng(seed)``) draws the P prompts with replacement, the same for both (paired by
    prompt), and, independently for each model, its R runs with replacement (the runs need not share
    seeds): a two-way (runs x prompts) bootstrap. ``ci95`` is the percentile interval of the resampled
    differences (``seeds_and_prompts_draws``). Unlike ``paired_difference``, which keeps the runs fixed,
    the interval includes the spread between runs; with one run each it resamples prompts only."""
    draws = seeds_and_prompts_draws(rates_b, rates_a, resamples, seed)
    b, a = np.asarray(rates_b, np.float64), np.asarray(rates_a, np.float64)
    low, high = _numeric_interval(draws)
    return {"difference": float(b.mean() - a.mean()), "ci95": [low, high], "runs": [b.shape[0], a.shape[0]],
            "interval": "seeds and prompts bootstrap"}
