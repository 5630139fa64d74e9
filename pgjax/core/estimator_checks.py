"""Checks that an estimator follows the protocol of ``pgjax.core.estimator`` (the Trainer runs them
before anything is built or written): it traces, returns what training reads, and is additive over
micro-batches."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pgjax.core.aggregation import loss_normalizer
from pgjax.core.algorithms import Batch
from pgjax.core.estimator import requirements

# how much a micro-batched loss and gradient may differ from the whole batch's (float32 summation order)
ADDITIVITY_RTOL = 1e-4


def probe_batch(prompts: int, group_size: int, width: int = 6, seed: int = 0):
    """A small float32 batch of ``prompts`` x ``group_size`` responses with ragged lengths (one empty),
    every optional field filled, for ``check_estimator``: a micro-batch-shaped test input."""
    rng = np.random.default_rng(seed)
    rows = prompts * group_size
    lengths = rng.integers(1, width + 1, rows)
    lengths[0] = 0
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float32)
    logp = -rng.uniform(0.05, 3.0, (rows, width)).astype(np.float32)
    near = lambda: (logp + rng.normal(0, 0.1, (rows, width))).astype(np.float32)     # noqa: E731
    return Batch(mask=jnp.asarray(mask), rewards=jnp.asarray(rng.integers(0, 2, rows), jnp.float32),
                     logp=jnp.asarray(logp), old_logp=jnp.asarray(near()), behaviour_logp=jnp.asarray(near()),
                     ref_logp=jnp.asarray(near()), values=jnp.asarray(rng.normal(0, 0.5, (rows, width)), jnp.float32),
                     bootstrap=jnp.zeros(rows, jnp.float32), greedy_rewards=jnp.asarray(rng.integers(0, 2, rows),
                                                                                         jnp.float32),
                     entropy=jnp.asarray(rng.uniform(0, 2, (rows, width)), jnp.float32), group_size=group_size)


def check_estimator(estimator, group_size: int, micro_batches: int = 1) -> None:
    """ValueError, saying what is wrong and how to fix it, unless ``estimator`` follows the protocol on
    a probe batch of ``micro_batches`` prompt groups of ``group_size``: its ``requires`` are known, its
    ``advantages`` are ``[B, T]``, its ``loss`` traces under ``jax.jit`` (no Python branch on a traced
    value) and returns a float scalar and a dict of float scalars, and, with ``micro_batches`` > 1, the
    sum of its loss and of its gradient over the micro-batches equals the whole batch's (relative
    ``ADDITIVITY_RTOL``): it divides by the normaliser, not by its own micro-batch's counts."""
    requirements(estimator)
    batch = probe_batch(max(micro_batches, 1), group_size)
    hp = estimator.hparams
    try:
        adv = jax.jit(estimator.advantages)(batch.replace(logp=batch.old_logp), hp)
    except Exception as error:      # the user's code: whatever it raised is the message
        raise ValueError(f"{estimator.name}: advantages(batch, hp) cannot run under jax.jit: "
                         f"{type(error).__name__}: {_first_line(error)}") from None
    if getattr(adv, "shape", None) != batch.mask.shape:
        raise ValueError(f"{estimator.name}: advantages(batch, hp) must return [B, T] = {batch.mask.shape}, got "
                         f"{getattr(adv, 'shape', type(adv).__name__)}")
    batch = batch.replace(advantages=adv)
    norm = loss_normalizer(batch.mask, group_size)
    try:
        out = jax.eval_shape(estimator.loss, batch, hp, norm)
    except Exception as error:
        raise ValueError(f"{estimator.name}: loss(batch, hp, norm) cannot be traced by jax.jit: "
                         f"{type(error).__name__}: {_first_line(error)} (branch with jnp.where or lax.cond, not "
                         "Python if, on anything computed from the batch or the hyperparameters)") from None
    _check_loss_output(estimator.name, out)
    if micro_batches > 1:
        _check_additive(estimator, batch, hp, norm, micro_batches)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def _check_loss_output(name: str, out) -> None:
    """``out`` (shapes of ``loss``'s result) is (a float scalar, a dict of float scalars)."""
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ValueError(f"{name}: loss(batch, hp, norm) must return (loss, metrics), got "
                         f"{type(out).__name__}")
    value, metrics = out
    if getattr(value, "shape", None) != () or not jnp.issubdtype(value.dtype, jnp.floating):
        raise ValueError(f"{name}: loss(batch, hp, norm) must return a float scalar loss first, got "
                         f"{getattr(value, 'dtype', type(value).__name__)}{list(getattr(value, 'shape', []))}")
    if not isinstance(metrics, dict):
        raise ValueError(f"{name}: loss(batch, hp, norm)'s metrics must be a dict of float scalars, got "
                         f"{type(metrics).__name__}")
    for key, metric in metrics.items():
        if getattr(metric, "shape", None) != ():
            raise ValueError(f"{name}: metric {key!r} must be a scalar (a sum over the micro-batch), got shape "
                             f"{getattr(metric, 'shape', type(metric).__name__)}")


def _check_additive(estimator, batch, hp, norm, parts: int) -> None:
    """The loss and its gradient with respect to ``batch.logp`` summed over ``parts`` micro-batches of
    whole groups equal the whole batch's, with the whole batch's ``norm`` and advantages."""
    def value_and_grad(part):
        return jax.value_and_grad(lambda logp: estimator.loss(part.replace(logp=logp), hp, norm)[0])(part.logp)

    whole_value, whole_grad = jax.jit(value_and_grad)(batch)
    rows = batch.mask.shape[0] // parts
    pieces = [jax.jit(value_and_grad)(jax.tree.map(lambda x, i=i: x[i * rows:(i + 1) * rows], batch))
              for i in range(parts)]
    split_value = sum(float(v) for v, _ in pieces)
    split_grad = np.concatenate([np.asarray(g) for _, g in pieces])
    scale = max(float(np.max(np.abs(np.asarray(whole_grad)))), abs(float(whole_value)), 1e-6)
    if (abs(split_value - float(whole_value)) > ADDITIVITY_RTOL * scale
            or np.max(np.abs(split_grad - np.asarray(whole_grad))) > ADDITIVITY_RTOL * scale):
        raise ValueError(f"{estimator.name}: the loss is not additive over micro-batches: on a probe batch its "
                         f"value is {float(whole_value):.6g} whole and {split_value:.6g} summed over {parts} "
                         "micro-batches, so update.micro_batches would change the gradient; divide by the "
                         "normaliser norm (num_tokens, num_sequences, num_prompts, max_length of the whole "
                         "minibatch), not by counts of the batch the loss is given, or set update.micro_batches=1")
