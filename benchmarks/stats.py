"""The statistics every timing comparison reports: the ratio of two sides' pooled medians with a
percentile-bootstrap 95% interval (``median_ratio``), and a step time's median with its own
interval (``median_interval``).

A side's timed steps are pooled over its rounds (ABBA order spreads machine drift over both sides);
the bootstrap resamples each side's pooled steps independently, with replacement, and takes the
2.5th and 97.5th percentiles of the resampled ratios. With fewer than 5 steps a side the interval is
too wide to mean much, and ``median_ratio`` says so by refusing."""
import numpy as np

MIN_STEPS = 5
RESAMPLES = 10_000


def _check(times, name: str) -> np.ndarray:
    values = np.asarray(times, dtype=np.float64)
    if values.ndim != 1 or values.size < MIN_STEPS:
        raise ValueError(f"{name}: {values.size} timed steps; a median and its interval need at least {MIN_STEPS}")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ValueError(f"{name}: times must be finite and > 0")
    return values


def median_interval(times, seed: int = 0, level: float = 0.95) -> dict:
    """``{"median", "low", "high", "n"}`` of ``times`` (seconds), the interval a percentile bootstrap."""
    values = _check(times, "times")
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, size=(RESAMPLES, values.size)), axis=1)
    tail = (1 - level) / 2 * 100
    return {"median": float(np.median(values)), "low": float(np.percentile(medians, tail)),
            "high": float(np.percentile(medians, 100 - tail)), "n": int(values.size)}


def median_ratio(numerator, denominator, seed: int = 0, level: float = 0.95) -> dict:
    """``{"ratio", "low", "high", "n"}``: median(numerator) / median(denominator) of two sides' pooled
    step times, e.g. TRL's seconds over pgjax's (> 1: pgjax faster), with a percentile-bootstrap
    interval resampling each side independently."""
    a, b = _check(numerator, "numerator"), _check(denominator, "denominator")
    rng = np.random.default_rng(seed)
    ratios = (np.median(rng.choice(a, size=(RESAMPLES, a.size)), axis=1)
              / np.median(rng.choice(b, size=(RESAMPLES, b.size)), axis=1))
    tail = (1 - level) / 2 * 100
    return {"ratio": float(np.median(a) / np.median(b)), "low": float(np.percentile(ratios, tail)),
            "high": float(np.percentile(ratios, 100 - tail)), "n": [int(a.size), int(b.size)]}


def describe(result: dict) -> str:
    """``2.04x [1.87, 2.21]`` for a ``median_ratio``."""
    return f"{result['ratio']:.2f}x [{result['low']:.2f}, {result['high']:.2f}]"
