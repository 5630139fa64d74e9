"""The unified objective: every algorithm of the paper as one choice per column.

An algorithm is an ``Algorithm(spec, hparams)``:
- ``Spec`` holds the static choices (part of the compiled program): which
  baseline, which ratio, where the KL goes, which KL estimator, how per-token
  terms are aggregated;
- ``HParams`` is a pytree of float scalars (traced): clip epsilons, KL and
  entropy coefficients, gamma, lambda, and the paper's on/off switches as 0/1
  floats (divide by std, divide by |o|, leave-one-out i.e. 1/(K-1) vs 1/K,
  batch whitening; KL off is ``kl_coef = 0``). So
  ``jax.vmap(algo.loss, in_axes=(None, 0))(batch, grid)`` evaluates a whole
  ablation grid in one compiled call.

``advantages`` runs on the global batch (group statistics and whitening need
it); ``loss`` takes precomputed advantages for micro-batches, or computes them
when ``batch.advantages`` is None.
"""
from __future__ import annotations

import dataclasses
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np

from pgjax.core import advantages as adv_lib
from pgjax.core import objectives as obj_lib
from pgjax.core import off_policy as op_lib
from pgjax.core.advantages import check_group_size
from pgjax.core.aggregation import AGGREGATIONS, Normalizer, aggregate, loss_normalizer
from pgjax.core.dtypes import at_least_f32
from pgjax.core.estimator import Estimator
from pgjax.core.returns import as_token_rewards, gae

Array = jax.Array
Scalar = float | Array   # an HParams field: a Python float, or an array (traced, or a stacked grid)

BASELINES = ("none", "value", "greedy", "group")
RATIOS = ("on_policy", "clip", "sequence", "truncated_is")
KL_PLACEMENTS = ("none", "reward", "loss")
CORRECTIONS = ("ignore", *op_lib.IS_LEVELS, "behaviour_ratio")


@dataclasses.dataclass(frozen=True)
class Spec:
    """Static choices of an algorithm.

    baseline: ``none`` A_t = G_t, the sampled return (eq. 10; no critic, so
      ``batch.bootstrap`` is not used); ``value`` A_t = GAE(gamma, lambda)
      with a critic V(s_t) and its bootstrap after truncated responses
      (eq. 12 with lambda = 1, eq. 17); ``greedy``
      A = G - G_hat of the greedy rollout (ReMax, eq. 13); ``group`` the group
      family of eq. (14), (18)-(21), shaped by ``leave_one_out`` and
      ``divide_by_std``. ``greedy`` and ``group`` score each response by its
      total reward and broadcast the advantage over its tokens.
    ratio: ``on_policy`` rho = 1 with gradient grad log pi (REINFORCE family);
      ``clip`` the modified ratio rho-hat of eq. (16); ``sequence`` rho-hat of
      GSPO's length-normalised sequence ratio; ``truncated_is`` CISPO's
      sg(min(rho, 1 + eps_high)) A log pi.
    kl_placement: ``none``; ``reward`` r_t -= kl_coef * KL_t before the
      advantages (PPO, REINFORCE++); ``loss`` + kl_coef * KL aggregated like the
      policy term (GRPO, eq. 18).
    kl_estimator: ``k1``, ``k2`` or ``k3`` (see ``objectives.kl_estimate``).
    aggregation: see ``pgjax.core.aggregation``.
    correction: what the loss does with the sampler's log-probs mu (``batch.behaviour_logp``,
      see ``pgjax.core.off_policy``): ``ignore`` (only measured: the ``mismatch_*`` metrics);
      ``token``, ``sequence``, ``geometric``: weight each token's policy term by the
      stop-gradient importance weight pi_old / mu of the token, of the whole response, or its
      geometric mean, limited as ``correction_mode`` says (``is_cap``, ``is_floor``);
      ``behaviour_ratio``: no weight, the ratio's old policy is mu itself (rho = pi / mu,
      clipped as ``ratio`` says: PPO on the sampler's log-probs, no recomputed pi_old).
    correction_mode: ``truncate`` min(w, is_cap) (TIS) or ``mask`` (w outside
      [is_floor, is_cap] drops the token, or the whole response for the sequence levels).
    """
    name: str
    equation: str
    baseline: str
    ratio: str
    aggregation: str
    kl_placement: str = "none"
    kl_estimator: str = "k3"
    correction: str = "ignore"
    correction_mode: str = "truncate"

    def __post_init__(self):
        for field, allowed in (("baseline", BASELINES), ("ratio", RATIOS), ("aggregation", AGGREGATIONS),
                               ("kl_placement", KL_PLACEMENTS), ("kl_estimator", obj_lib.KL_ESTIMATORS),
                               ("correction", CORRECTIONS), ("correction_mode", op_lib.IS_MODES)):
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"unknown {field} {value!r}; expected one of {allowed}")
        if self.correction == "behaviour_ratio" and self.ratio == "on_policy":
            raise ValueError(f"{self.name}: correction 'behaviour_ratio' replaces the old policy of a ratio, and "
                             "ratio 'on_policy' has none; use a weight (token, sequence, geometric)")

    def replace(self, **changes) -> Spec:
        return dataclasses.replace(self, **changes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HParams:
    """Traced float hyperparameters. Switches are 0.0 (off) or 1.0 (on).

    clip_eps_low, clip_eps_high: eq. (15)'s epsilon below and above 1 (clip-higher if different).
    dual_clip: c > 1 bounds the objective at c A for A < 0; 0 disables it.
    kl_coef: beta of eq. (18); 0 turns the KL term off.
    entropy_coef: weight of the entropy bonus (needs ``batch.entropy``).
    gamma, lam: discount (eq. 3) and GAE lambda (eq. 17).
    leave_one_out: group baseline excludes the sample itself, i.e. 1/(K-1) instead of 1/K (eq. 14, 19).
    divide_by_std: divide group advantages by the group std (eq. 18, 20), with std_eps and std_ddof.
    divide_by_length: weight each response by 1/|o| (eq. 18).
    whiten: whiten advantages over the global batch's tokens (PPO, REINFORCE++).
    is_cap, is_floor: the limits of the off-policy weight (``Spec.correction``): the cap C of
      truncation and masking (inf: untruncated), the floor of masking.
    """
    clip_eps_low: Scalar = 0.2
    clip_eps_high: Scalar = 0.2
    dual_clip: Scalar = 0.0
    kl_coef: Scalar = 0.0
    entropy_coef: Scalar = 0.0
    gamma: Scalar = 1.0
    lam: Scalar = 1.0
    leave_one_out: Scalar = 0.0
    divide_by_std: Scalar = 0.0
    std_eps: Scalar = 1e-6
    std_ddof: Scalar = 1.0
    divide_by_length: Scalar = 0.0
    whiten: Scalar = 0.0
    is_cap: Scalar = 2.0
    is_floor: Scalar = 0.5

    def replace(self, **changes) -> HParams:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown hyperparameter(s) {sorted(unknown)}; valid: {field_names(HParams)}")
        new = dataclasses.replace(self, **changes)
        check_hparams(new)
        return new


def field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


_SWITCHES = ("leave_one_out", "divide_by_std", "divide_by_length", "whiten")


def check_hparams(hp: HParams, group_size: int | None = None) -> None:
    """Raise ValueError for out-of-range hyperparameters.

    Concrete values (Python floats, arrays, stacked grids) are checked; traced
    ones cannot be read and are skipped, so a setting built inside ``jit`` is
    the caller's responsibility. ``HParams.replace``, ``hparam_grid`` and an
    eager ``loss`` call check; ``std_ddof < K`` is checked only where K is known.
    """
    def values(name):
        x = getattr(hp, name)
        if isinstance(x, jax.core.Tracer):
            return None
        return np.asarray(x, dtype=np.float64)

    rules = {
        "clip_eps_low": (lambda v: (v >= 0) & (v < 1), "must be in [0, 1)"),
        "clip_eps_high": (lambda v: v >= 0, "must be >= 0"),
        "dual_clip": (lambda v: (v == 0) | (v > 1), "must be 0 (off) or > 1"),
        "kl_coef": (lambda v: v >= 0, "must be >= 0"),
        "entropy_coef": (lambda v: v == v, "must be finite"),
        "gamma": (lambda v: (v >= 0) & (v <= 1), "must be in [0, 1]"),
        "lam": (lambda v: (v >= 0) & (v <= 1), "must be in [0, 1]"),
        "std_eps": (lambda v: v > 0, "must be > 0"),
        "std_ddof": ((lambda v: v >= 0, "must be >= 0") if group_size is None else
                     (lambda v: (v >= 0) & (v < group_size), f"must be in [0, K) with K={group_size}")),
        **{s: (lambda v: (v >= 0) & (v <= 1), "is a switch: must be in [0, 1]") for s in _SWITCHES},
        "is_cap": (lambda v: v > 0, "must be > 0 (inf: no limit)"),
        "is_floor": (lambda v: v >= 0, "must be >= 0"),
    }
    for name, (ok, message) in rules.items():
        v = values(name)
        if v is None:
            continue
        finite = np.isfinite(v) | (np.isposinf(v) if name == "is_cap" else False)    # is_cap = inf: no cap
        if not (np.all(finite) and np.all(ok(v))):
            raise ValueError(f"hyperparameter {name}={v.tolist()} {message}")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch of responses (see docs/design.md's array conventions). B = P * K.

    mask: ``[B, T]`` float, 1.0 on response tokens.
    rewards: ``[B]`` outcome or ``[B, T]`` per-token rewards.
    logp: ``[B, T]`` log pi_theta of the taken tokens (differentiate through it).
    old_logp: the update's old (proximal) policy pi_old, the learner's log-probs at the parameters
      the update started from; None means on-policy (old = stop_gradient(logp)).
    behaviour_logp: the sampler's log-probs mu of the taken tokens (``Spec.correction``); None:
      no correction and no mismatch metrics.
    ref_logp: reference-policy log-probs, needed when the KL term is on.
    values, bootstrap: critic V(s_t) ``[B, T]`` and the value after a truncated response ``[B]``.
    greedy_rewards: ``[B]`` reward of the greedy response to each row's prompt (ReMax).
    entropy: ``[B, T]`` policy entropy, for the entropy bonus.
    advantages: ``[B, T]`` precomputed advantages (micro-batches); None computes them.
    group_size: K, static.
    """
    mask: Array
    rewards: Array
    logp: Array | None      # None before the learner scores the rollout (``advantages`` does not read it)
    old_logp: Array | None = None
    behaviour_logp: Array | None = None
    ref_logp: Array | None = None
    values: Array | None = None
    bootstrap: Array | None = None
    greedy_rewards: Array | None = None
    entropy: Array | None = None
    advantages: Array | None = None
    group_size: int = dataclasses.field(default=1, metadata=dict(static=True))

    def replace(self, **changes) -> Batch:
        return dataclasses.replace(self, **changes)


def check_batch_for_spec(spec: Spec, batch: Batch) -> None:
    """Check ``batch`` against ``spec``: mask [B, T] float; rewards [B] or [B, T]; every per-token
    field [B, T] and every per-row field [B]; the fields ``spec`` reads present (``behaviour_logp``
    for a correction other than 'ignore', ``values`` / ``greedy_rewards`` for its baseline unless
    ``advantages`` are given) and ``group_size`` dividing B (K >= 2 for the group baseline). Raises
    a ValueError naming the problem."""
    chex.assert_rank(batch.mask, 2)
    if not jnp.issubdtype(batch.mask.dtype, jnp.floating):
        raise ValueError(f"mask must be a float array (1.0 / 0.0), got {batch.mask.dtype}")
    b, t = batch.mask.shape
    if batch.rewards.shape not in ((b,), (b, t)):
        raise ValueError(f"rewards must have shape ({b},) or ({b}, {t}), got {batch.rewards.shape}")
    for name in ("logp", "old_logp", "behaviour_logp", "ref_logp", "values", "entropy", "advantages"):
        x = getattr(batch, name)
        if x is not None and x.shape != (b, t):
            raise ValueError(f"{name} must have shape {(b, t)} like mask, got {x.shape}")
    for name in ("bootstrap", "greedy_rewards"):
        x = getattr(batch, name)
        if x is not None and x.shape != (b,):
            raise ValueError(f"{name} must have shape {(b,)}, got {x.shape}")
    if spec.correction != "ignore" and batch.behaviour_logp is None:
        raise ValueError(f"{spec.name}: correction {spec.correction!r} needs batch.behaviour_logp (the sampler's "
                         "log-probs)")
    if batch.advantages is None:
        needs = {"value": "values", "greedy": "greedy_rewards"}.get(spec.baseline)
        if needs and getattr(batch, needs) is None:
            raise ValueError(f"{spec.name}: baseline {spec.baseline!r} needs batch.{needs}")
        check_group_size(b, batch.group_size, minimum=2 if spec.baseline == "group" else 1)


def _is_nonzero(x) -> bool:
    """True when ``x`` is concrete and not all zero; traced values count as zero."""
    return not isinstance(x, jax.core.Tracer) and bool(np.any(np.asarray(x) != 0))


def _kl_needed(spec: Spec, hp: HParams, batch: Batch, placement: str) -> bool:
    """Whether the KL term at ``placement`` is computed: only with ``batch.ref_logp``.

    Without ref_logp the term is dropped; a concrete non-zero kl_coef then raises.
    """
    if spec.kl_placement != placement:
        return False
    if batch.ref_logp is not None:
        return True
    if _is_nonzero(hp.kl_coef):
        raise ValueError(f"{spec.name}: kl_placement={placement!r} with kl_coef != 0 needs batch.ref_logp "
                         "(or set kl_coef=0)")
    return False


def _present(x: Array | None, spec: Spec | None, name: str) -> Array:
    """``x``, the field ``batch.<name>`` that ``spec`` (None: the batch's metrics) reads here; a ValueError
    where it is None (``check_batch_for_spec`` and ``_kl_needed`` have checked it on the usual paths)."""
    if x is None:
        raise ValueError(f"{'batch_metrics' if spec is None else spec.name}: needs batch.{name}")
    return x


def _old_logp(batch: Batch) -> Array:
    """log pi_old: ``batch.old_logp``, or on-policy the current log-probs without their gradient."""
    if batch.old_logp is not None:
        return batch.old_logp
    return jax.lax.stop_gradient(_present(batch.logp, None, "logp (or old_logp)"))


def advantages(spec: Spec, batch: Batch, hp: HParams) -> Array:
    """Per-token advantages ``[B, T]`` (no gradient) of ``spec`` on the *global* batch."""
    check_batch_for_spec(spec, batch)
    mask = batch.mask
    kl_penalty = _kl_reward_penalty(spec, batch, hp)
    if spec.baseline in ("none", "value"):
        token_rewards = as_token_rewards(batch.rewards, mask) - kl_penalty
        if spec.baseline == "none":
            adv = gae(token_rewards, jnp.zeros_like(token_rewards), mask, hp.gamma, 1.0)[0]
        else:
            adv = gae(token_rewards, _present(batch.values, spec, "values"), mask, hp.gamma, hp.lam,
                      batch.bootstrap)[0]
    else:
        # scored from the rewards themselves, so an empty response still counts in its group
        scores = adv_lib.sequence_scores(batch.rewards, mask) - jnp.sum(kl_penalty, axis=1)
        if spec.baseline == "greedy":
            seq_adv = adv_lib.greedy_baseline_advantages(scores, _present(batch.greedy_rewards, spec,
                                                                          "greedy_rewards"))
        else:
            seq_adv = adv_lib.group_advantages(scores, batch.group_size, hp.leave_one_out, hp.divide_by_std,
                                               hp.std_eps, hp.std_ddof)
        adv = adv_lib.broadcast_over_tokens(seq_adv, mask)
    adv = (1.0 - hp.whiten) * adv + hp.whiten * adv_lib.whiten(adv, mask)
    return jax.lax.stop_gradient(adv)


def _kl_reward_penalty(spec: Spec, batch: Batch, hp: HParams) -> Array:
    """kl_coef * KL_t subtracted from the per-token rewards when the KL sits in the reward, else 0."""
    if not _kl_needed(spec, hp, batch, "reward"):
        return jnp.zeros_like(batch.mask)
    kl = obj_lib.kl_estimate(_old_logp(batch), _present(batch.ref_logp, spec, "ref_logp"), spec.kl_estimator)
    return jnp.where(batch.mask > 0, hp.kl_coef * kl, 0.0)


def value_targets(spec: Spec, batch: Batch, hp: HParams) -> Array:
    """Critic regression targets ``[B, T]``: the lambda-returns G^lambda_t = A_t + V(s_t) of eq. (17),
    from the same (KL-penalised) token rewards as ``advantages`` but before any whitening."""
    check_batch_for_spec(spec, batch)
    if batch.values is None:
        raise ValueError(f"{spec.name}: value_targets needs batch.values from a critic")
    token_rewards = as_token_rewards(batch.rewards, batch.mask) - _kl_reward_penalty(spec, batch, hp)
    return jax.lax.stop_gradient(gae(token_rewards, batch.values, batch.mask, hp.gamma, hp.lam,
                                     batch.bootstrap)[1])


def _policy_terms(spec: Spec, hp: HParams, logp: Array, old_logp: Array, adv: Array, mask: Array):
    """Per-token objective to maximise, the ratio shown in metrics, and the clipped-token indicator."""
    if spec.ratio == "on_policy":
        ratio = obj_lib.on_policy_ratio(logp)
        return ratio * adv, ratio, jnp.zeros_like(adv)
    if spec.ratio == "truncated_is":
        ratio = obj_lib.importance_ratio(logp, old_logp)
        weight = obj_lib.truncated_is_weight(ratio, hp.clip_eps_high)
        return weight * adv * logp, ratio, (ratio > 1.0 + hp.clip_eps_high).astype(ratio.dtype)
    if spec.ratio == "sequence":
        ratio = obj_lib.sequence_ratio(logp, old_logp, mask)
    else:
        ratio = obj_lib.importance_ratio(logp, old_logp)
    eps = (hp.clip_eps_low, hp.clip_eps_high, hp.dual_clip)
    return obj_lib.modified_ratio(ratio, adv, *eps) * adv, ratio, obj_lib.clipped_mask(ratio, adv, *eps)


def loss(spec: Spec, batch: Batch, hp: HParams, norm: Normalizer | None = None):
    """Loss to minimise and metrics (sums, counts, mins, maxes) of ``spec`` on ``batch``.

      loss = -agg(c_t rho-hat_t A_t) + kl_coef agg(KL_t) [if in loss] - entropy_coef agg(H_t)

    with agg the spec's aggregation and the 1/|o| switch, c_t the off-policy weight of
    ``spec.correction`` (1 when ``ignore``; ``pgjax.core.off_policy``). ``norm`` must come
    from the global batch when ``batch`` is a micro-batch (then also pass
    ``batch.advantages`` computed on the global batch); None uses this batch.

    Whatever padded positions of the log-probs and entropy hold (even -inf)
    is replaced by 0 first, so it reaches neither the value nor the gradient.
    """
    check_batch_for_spec(spec, batch)
    computes_group_std = batch.advantages is None and spec.baseline == "group"
    check_hparams(hp, batch.group_size if computes_group_std else None)
    batch = _zero_padding(batch)
    mask, logp = batch.mask, _present(batch.logp, spec, "logp")
    norm = loss_normalizer(mask, batch.group_size) if norm is None else norm
    adv = advantages(spec, batch, hp) if batch.advantages is None else jax.lax.stop_gradient(batch.advantages)
    old_logp = _old_logp(batch)
    agg = lambda x: aggregate(x, mask, spec.aggregation, norm, hp.divide_by_length)  # noqa: E731

    ratio_old = (_present(batch.behaviour_logp, spec, "behaviour_logp") if spec.correction == "behaviour_ratio"
                 else old_logp)
    objective, ratio, clipped = _policy_terms(spec, hp, logp, ratio_old, adv, mask)
    correction = {}
    if spec.correction in op_lib.IS_LEVELS:
        weights, limited = op_lib.correction_weights(old_logp, _present(batch.behaviour_logp, spec, "behaviour_logp"),
                                                     mask, spec.correction, spec.correction_mode, hp.is_cap,
                                                     hp.is_floor)
        objective = weights * objective
        correction = {"is_weight_sum": jnp.sum(weights * mask), "is_limited_sum": jnp.sum(limited * mask)}
    policy_loss = -agg(objective)
    total = policy_loss
    metrics = {"policy_loss": policy_loss}
    if _kl_needed(spec, hp, batch, "loss"):
        kl_loss = agg(obj_lib.kl_estimate(logp, _present(batch.ref_logp, spec, "ref_logp"), spec.kl_estimator))
        total = total + hp.kl_coef * kl_loss
        metrics["kl_loss"] = kl_loss
    if batch.entropy is None and _is_nonzero(hp.entropy_coef):
        raise ValueError(f"{spec.name}: entropy_coef != 0 needs batch.entropy")
    if batch.entropy is not None:
        entropy_bonus = agg(batch.entropy)
        total = total - hp.entropy_coef * entropy_bonus
        metrics["entropy_bonus"] = entropy_bonus
    metrics.update(batch_metrics(batch), **_ratio_metrics(batch, ratio, clipped, adv), **correction)
    return total, metrics


def token_weights(estimator, batch: Batch, hp, norm: Normalizer | None = None) -> Array:
    """The weight c_t of each token's score in the update of ``estimator`` (a preset or any
    ``core.Estimator``), ``[B, T]``:

      grad_theta loss = -sum_{b,t} c_bt grad_theta log pi(a_bt | s_bt),   c_bt = -d loss / d logp_bt,

    at the current ``batch.logp`` (at the first step of an update, logp = old_logp, rho = 1 and
    no token is clipped, so c_bt = A_bt w_b / N: the advantage times the aggregation's weight,
    eq. 18 / 21, plus the KL term's pull where it is in the loss). Summing |c| over a subset of
    rows (e.g. a difficulty bucket) gives that subset's share of the update's weight; 0 on padding.
    ``norm`` None: this batch's own (``loss_normalizer``).
    """
    norm = loss_normalizer(batch.mask, batch.group_size) if norm is None else norm
    value = lambda logp: estimator.loss(batch.replace(logp=logp), hp, norm)[0]  # noqa: E731
    return -jax.grad(value)(batch.logp) * (batch.mask > 0)


def _zero_padding(batch: Batch) -> Batch:
    """The per-token inputs with 0 wherever the mask is 0."""
    on = batch.mask > 0
    fields = ("logp", "old_logp", "behaviour_logp", "ref_logp", "entropy")
    return batch.replace(**{name: jnp.where(on, getattr(batch, name), 0.0) for name in fields
                            if getattr(batch, name) is not None})


def batch_metrics(batch: Batch) -> dict:
    """What any estimator's update is measured by, from the batch alone (sums and counts over the
    masked tokens; combine with ``combine_metrics``): tokens, sequences, the k3 KL of the old policy
    to the current one (``approx_kl``), to the reference (``ref_kl``, with ``ref_logp``), the entropy
    (with ``entropy``) and the learner-sampler mismatch (with ``behaviour_logp``)."""
    batch = _zero_padding(batch)
    m = batch.mask
    sg = jax.lax.stop_gradient
    logp = sg(_present(batch.logp, None, "logp"))
    out = {"tokens": jnp.sum(m), "sequences": jnp.asarray(m.shape[0], m.dtype),
           "approx_kl_sum": jnp.sum(obj_lib.kl_estimate(_old_logp(batch), logp, "k3") * m)}
    if batch.ref_logp is not None:
        out["ref_kl_sum"] = jnp.sum(obj_lib.kl_estimate(logp, batch.ref_logp, "k3") * m)
    if batch.entropy is not None:
        out["entropy_sum"] = jnp.sum(sg(batch.entropy) * m)
    if batch.behaviour_logp is not None:
        out.update(op_lib.mismatch_metrics(sg(_old_logp(batch)), batch.behaviour_logp, m))
    return out


def _ratio_metrics(batch: Batch, ratio, clipped, adv) -> dict:
    """The ratio's sum, min and max, the clipped tokens and the advantages' sum over the masked tokens."""
    m = batch.mask
    on = m > 0
    ratio = jax.lax.stop_gradient(ratio)
    return {"clipped_tokens": jnp.sum(clipped * m), "ratio_sum": jnp.sum(ratio * m),
            "ratio_min": jnp.min(jnp.where(on, ratio, jnp.inf)), "ratio_max": jnp.max(jnp.where(on, ratio, -jnp.inf)),
            "advantage_sum": jnp.sum(adv * m)}


def combine_metrics(a: dict, b: dict) -> dict:
    """Merge the metrics of two micro-batches: ``*_min`` by min, ``*_max`` by max, the rest by sum."""
    def merge(key):
        if key.endswith("_min"):
            return jnp.minimum(a[key], b[key])
        if key.endswith("_max"):
            return jnp.maximum(a[key], b[key])
        return a[key] + b[key]
    return {key: merge(key) for key in a}


def finalize_metrics(metrics: dict) -> dict:
    """Divide sums by their counts once: ``x_sum`` per token -> ``x_mean``; the clip fraction where
    ``clipped_tokens`` is counted."""
    tokens = jnp.maximum(metrics["tokens"], 1.0)
    out = {k: v for k, v in metrics.items() if not k.endswith("_sum") and k != "clipped_tokens"}
    out.update({k[:-4] + "_mean": v / tokens for k, v in metrics.items() if k.endswith("_sum")})
    if "clipped_tokens" in metrics:
        out["clip_fraction"] = metrics["clipped_tokens"] / tokens
    return out


@dataclasses.dataclass(frozen=True)
class Algorithm(Estimator):
    """A preset: static ``spec`` and default traced ``hparams``; an ``Estimator`` whose methods are
    this module's ``advantages``, ``loss`` and ``value_targets`` of ``spec``."""
    spec: Spec
    hparams: HParams
    summary: str = ""

    @property
    def name(self) -> str:  # type: ignore[override]  # Estimator's class attribute, derived from spec here
        return self.spec.name

    @property
    def requires(self) -> frozenset:  # type: ignore[override]  # as name
        """A critic's ``values`` (baseline ``value``), ReMax's ``greedy_rewards``, the reference
        policy's ``ref_logp`` when the KL term is on (a placement and ``kl_coef`` > 0) and the old
        policy's ``old_logp`` when the KL sits in the reward (the advantages read it)."""
        spec = self.spec
        needs = {"value": {"values"}, "greedy": {"greedy_rewards"}}.get(spec.baseline, set())
        if spec.kl_placement != "none" and float(np.max(np.asarray(self.hparams.kl_coef))) > 0:
            needs.add("ref_logp")
        if spec.kl_placement == "reward":
            needs.add("old_logp")
        return frozenset(needs)

    @property
    def min_group_size(self) -> int:  # type: ignore[override]  # as name
        return 2 if self.spec.baseline == "group" else 1

    def advantages(self, batch: Batch, hp: HParams | None = None) -> Array:
        return advantages(self.spec, batch, self.hparams if hp is None else hp)

    def loss(self, batch: Batch, hp: HParams | None = None, norm: Normalizer | None = None):
        return loss(self.spec, batch, self.hparams if hp is None else hp, norm)

    def value_targets(self, batch: Batch, hp: HParams | None = None) -> Array:
        return value_targets(self.spec, batch, self.hparams if hp is None else hp)

    def check_hparams(self, hp: HParams, group_size: int | None = None) -> None:
        """``check_hparams`` (module function), with K only for the group baseline (``std_ddof < K``)."""
        check_hparams(hp, group_size if self.spec.baseline == "group" else None)

    def with_hparams(self, **changes) -> Algorithm:
        return dataclasses.replace(self, hparams=self.hparams.replace(**changes))


def stack_hparams(settings: list[HParams]) -> HParams:
    """Stack settings along a new leading axis, for ``jax.vmap``."""
    if not settings:
        raise ValueError("stack_hparams needs at least one setting")
    return jax.tree.map(lambda *xs: jnp.stack([at_least_f32(x) for x in xs]), *settings)


def hparam_grid(base, **axes) -> tuple:
    """Cartesian product of ``axes`` (name -> list of values) over ``base``: ``HParams``, or an
    estimator (``core.Estimator``: its own hyperparameters, checked by its ``check_hparams``).

    Returns the stacked grid and the list of settings (dicts) in its order.
    """
    names = list(axes)
    settings = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(axes[n] for n in names))]
    if isinstance(base, Estimator):
        grid = stack_hparams([base.with_hparams(**s).hparams for s in settings])
        base.check_hparams(grid)
    else:
        grid = stack_hparams([base.replace(**s) for s in settings])
        check_hparams(grid)
    return grid, settings
