"""What a study's reports compute from its runs' per-step records: moving means, tail means, the band
plot of a method's seeds, and the across-seed statistic of a method's per-seed values."""
from __future__ import annotations

import warnings

import numpy as np

from pgjax.evaluation.statistics import across_seeds

ACROSS_SEEDS_NOTE = ("mean over seeds [95% t interval across seeds: Student's t, "
                "pgjax.evaluation.statistics.across_seeds]; one seed: its value")


def moving_average(values, window: int = 10) -> np.ndarray:
    """Mean of each value and the ``window - 1`` before it (NaN-aware; NaN where all are NaN)."""
    values = np.asarray(values, float)
    out = np.full_like(values, np.nan)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1):i + 1]
        if np.isfinite(chunk).any():
            out[i] = np.nanmean(chunk)
    return out


def tail_mean(values, tail: int) -> float:
    """Mean of the last ``tail`` values that are not None / NaN (NaN if none)."""
    kept = [v for v in list(values)[-tail:] if v is not None and np.isfinite(v)]
    return float(np.mean(kept)) if kept else float("nan")


def plot_band(ax, steps, per_seed, label: str, window: int = 10, **style) -> None:
    """Mean over seeds (rows of ``per_seed`` over ``steps``, None or NaN = missing) and the min-max band, both
    smoothed by ``moving_average`` over ``window`` points (1: not smoothed); ``style``: the line's."""
    values = np.array([[np.nan if v is None else v for v in row] for row in per_seed], float)
    with warnings.catch_warnings():       # a step where no seed has a value stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, low, high = (moving_average(f(values, axis=0), window) for f in (np.nanmean, np.nanmin, np.nanmax))
    line, = ax.plot(steps, mean, label=label, **style)
    ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.15)


def plot_points_band(ax, per_seed_points, label: str, **style) -> None:
    """``plot_band`` of each seed's ``[(step, value)]`` (``per_seed_points``; seeds may miss steps) over
    the union of their steps, not smoothed."""
    per_seed_points = [dict(points) for points in per_seed_points]
    steps = sorted({step for points in per_seed_points for step in points})
    plot_band(ax, steps, [[points.get(step) for step in steps] for points in per_seed_points], label, window=1,
              **style)


def seed_statistics(values) -> dict:
    """``{"mean", "ci95", "seeds"}`` of one number per seed: with two seeds or more the mean and Student's t
    95% interval across seeds (``across_seeds`` against zero), with one its value and no interval."""
    values = np.asarray(values, np.float64)
    if values.size >= 2:
        stats = across_seeds(values, np.zeros_like(values))
        return {"mean": stats["mean"], "ci95": stats["ci95"], "seeds": stats["seeds"]}
    return {"mean": float(values[0]), "ci95": None, "seeds": 1}


def seed_cell(values, fmt: str = ".3f") -> str:
    """``mean [low, high]`` of ``seed_statistics`` with the format ``fmt`` (one seed, or every seed equal: the
    mean alone; a value that is not finite: ``n/a``)."""
    values = np.asarray(values, np.float64)
    if not values.size or not np.isfinite(values).all():
        return "n/a"
    stats = seed_statistics(values)
    mean = f"{stats['mean']:{fmt}}"
    if stats["ci95"] is None or stats["ci95"][0] == stats["ci95"][1]:
        return mean
    return f"{mean} [{stats['ci95'][0]:{fmt}}, {stats['ci95'][1]:{fmt}}]"
