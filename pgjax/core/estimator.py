"""The estimator protocol: what training, the memory planner and the exact audit ask of an algorithm.

An estimator is a gradient estimator of the paper's unified form (eq. 22): per-token advantages
A_bt on the global batch, then a loss whose gradient is -sum_bt c_bt A_bt grad log pi(a_bt | s_bt).
The presets (``core.Algorithm``: a static ``Spec`` and traced ``HParams``) are estimators; so is any
object that subclasses ``Estimator`` and provides

- ``name``: a str, for messages and records;
- ``hparams``: a pytree of float scalars (a ``jax.tree_util.register_dataclass`` frozen dataclass,
  or a dict). They are traced: the Trainer passes them to its jitted functions as arguments, and a
  stacked pytree (``stack_hparams``, ``hparam_grid``) is a grid ``jax.vmap`` evaluates in one call;
- ``requires``: the ``Batch`` fields it reads beyond ``mask``, ``rewards``, ``logp``,
  ``behaviour_logp`` (always there in training) and ``entropy``: any of ``REQUIRABLE``;
- ``advantages(batch, hp)``: ``[B, T]`` on the whole rollout, without gradient (``Learner.prepare``);
- ``loss(batch, hp, norm)``: a float scalar to minimise and a dict of float scalar metrics, on a
  micro-batch whose ``batch.advantages`` are those of the whole rollout;
- ``value_targets(batch, hp)`` when ``"values"`` is required (the critic's regression targets);
- ``check_hparams(hp, group_size)`` (optional): ValueError for out-of-range values.

The normaliser: ``norm`` (``aggregation.Normalizer``) holds the denominators of the whole
minibatch: its token count, sequences, prompts and token budget. An estimator divides by these and
by nothing it counts on its own micro-batch, so that its loss is *additive*: the sum of its values
(and gradients) over the micro-batches of a minibatch equals its value on the whole minibatch with
the same ``norm``. Micro-batching and data parallelism are then exact (``estimator_checks.check_estimator``
tests it on a probe batch). Metrics combine like the loss: summed over micro-batches, except keys ending in
``_min`` / ``_max`` (combined by min / max); ``x_sum`` is divided by the token count at the end
(``finalize_metrics``: recorded as ``x_mean``).
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import jax
import numpy as np

Array = jax.Array

# Batch fields an estimator may require: a critic's values (and bootstrap, value targets), ReMax's greedy
# rewards, the reference policy's log-probs (a KL term), the old policy's log-probs in its advantages
REQUIRABLE = ("values", "greedy_rewards", "ref_logp", "old_logp")


class Estimator:
    """Base class of a user's estimator (see the module docstring for the protocol). Subclass it,
    set ``name`` and ``hparams`` and implement ``advantages`` and ``loss``."""

    name: str = "estimator"
    hparams: Any = None     # a pytree of float scalars: a registered frozen dataclass or a dict (the subclass's own)
    requires: frozenset = frozenset()
    min_group_size: int = 1     # K >= 2 for a group baseline

    def advantages(self, batch, hp) -> Array:
        raise NotImplementedError(f"{type(self).__name__} must implement advantages(batch, hp)")

    def loss(self, batch, hp, norm):
        raise NotImplementedError(f"{type(self).__name__} must implement loss(batch, hp, norm)")

    def value_targets(self, batch, hp) -> Array:
        raise NotImplementedError(f"{type(self).__name__} requires 'values' but has no value_targets(batch, hp)")

    def check_hparams(self, hp, group_size: int | None = None) -> None:
        """ValueError for a hyperparameter that is not a finite number (override to check ranges)."""
        for name, value in hparam_items(hp).items():
            if not isinstance(value, jax.core.Tracer) and not np.all(np.isfinite(np.asarray(value, np.float64))):
                raise ValueError(f"hyperparameter {name}={np.asarray(value).tolist()} must be finite")

    def with_hparams(self, **changes) -> Estimator:
        """A copy with the hyperparameters ``changes`` (name -> float) replaced; ValueError naming an
        unknown one (with the closest valid name) or one ``check_hparams`` refuses."""
        valid = list(hparam_items(self.hparams))
        for name in changes:
            if name not in valid:
                close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise ValueError(f"unknown hyperparameter {name!r} of {self.name}{hint} (valid: {', '.join(valid)})")
        is_instance = dataclasses.is_dataclass(self.hparams) and not isinstance(self.hparams, type)
        hp = dataclasses.replace(self.hparams, **changes) if is_instance else {**self.hparams, **changes}
        self.check_hparams(hp)
        if dataclasses.is_dataclass(self):
            return dataclasses.replace(self, hparams=hp)
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__, hparams=hp)
        return new


def hparam_items(hp) -> dict:
    """``{name: value}`` of a hyperparameter pytree: a dataclass's fields or a dict's items."""
    if dataclasses.is_dataclass(hp):
        return {f.name: getattr(hp, f.name) for f in dataclasses.fields(hp)}
    if isinstance(hp, dict):
        return dict(hp)
    raise TypeError(f"hyperparameters must be a dataclass or a dict of float scalars, got {type(hp).__name__}")


def requirements(estimator) -> frozenset:
    """``estimator.requires``, checked against ``REQUIRABLE`` (ValueError naming the unknown ones)."""
    required = frozenset(estimator.requires)
    unknown = sorted(required - set(REQUIRABLE))
    if unknown:
        raise ValueError(f"{estimator.name}: requires {unknown}, which training cannot provide; an estimator may "
                         f"require {', '.join(REQUIRABLE)}")
    return required
