"""Off-policy corrections (pgjax.core.off_policy) and their place in core.loss, against float64
NumPy references; jit, vmap over the caps, and the error paths."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pgjax import core
from pgjax.core import off_policy as op

RNG = np.random.default_rng(0)
B, T = 6, 5
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 0, 0, 0],
                 [1, 1, 1, 1, 0]], np.float64)
OLD = RNG.normal(-1.0, 0.4, (B, T)) * MASK
MU = (OLD + RNG.normal(0.0, 0.5, (B, T))) * MASK


def reference_weights(old, mu, mask, level, mode, cap, floor):
    """c_t per the module docstring, float64, 0 on padding; and the limited indicator."""
    log_w = (old - mu) * mask
    if level == "token":
        raw = np.exp(log_w)
    else:
        total = log_w.sum(1, keepdims=True)
        if level == "geometric":
            total = total / np.maximum(mask.sum(1, keepdims=True), 1)
        raw = np.broadcast_to(np.exp(total), log_w.shape)
    if mode == "truncate":
        weights, limited = np.minimum(raw, cap), raw > cap
    else:
        limited = (raw > cap) | (raw < floor)
        weights = np.where(limited, 0.0, raw)
    return weights * mask, limited * mask


@pytest.mark.parametrize("level", op.IS_LEVELS)
@pytest.mark.parametrize("mode", op.IS_MODES)
@pytest.mark.parametrize("cap,floor", [(2.0, 0.5), (1.2, 0.9), (np.inf, 0.0)])
def test_correction_weights_match_reference(level, mode, cap, floor):
    with jax.enable_x64(True):
        weights, limited = op.correction_weights(jnp.asarray(OLD), jnp.asarray(MU), jnp.asarray(MASK), level, mode,
                                                 cap, floor)
    want_w, want_l = reference_weights(OLD, MU, MASK, level, mode, cap, floor)
    np.testing.assert_allclose(np.asarray(weights), want_w, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(limited), want_l)


def test_mismatch_metrics_match_reference():
    with jax.enable_x64(True):
        m = op.mismatch_metrics(jnp.asarray(OLD), jnp.asarray(MU), jnp.asarray(MASK))
    log_r = (OLD - MU) * MASK
    on = MASK > 0
    assert float(m["mismatch_abs_sum"]) == pytest.approx(np.abs(log_r).sum(), rel=1e-12)
    assert float(m["mismatch_abs_max"]) == pytest.approx(np.abs(log_r[on]).max(), rel=1e-12)
    r = np.exp(log_r)
    assert float(m["mismatch_kl_sum"]) == pytest.approx(((r - 1 - log_r) * MASK).sum(), rel=1e-12)
    assert float(m["mismatch_outside_sum"]) == ((on & ((r < 0.5) | (r > 2.0))).sum())


def test_mismatch_of_identical_log_probs_is_zero_and_padding_is_ignored():
    mu = jnp.where(MASK > 0, jnp.asarray(OLD, jnp.float32), -jnp.inf)       # -inf on padding reaches nothing
    m = op.mismatch_metrics(jnp.asarray(OLD, jnp.float32), mu, jnp.asarray(MASK, jnp.float32))
    assert all(float(v) == 0.0 for v in m.values())
    empty = op.mismatch_metrics(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((2, 3)))
    assert float(empty["mismatch_abs_max"]) == -np.inf and float(empty["mismatch_kl_sum"]) == 0.0


def _batch(spec_ratio_old=None, **changes):
    rewards = np.array([1.0, 0.0, 1.0, 0.0, 0.5, 0.0])
    logp = OLD + RNG.normal(0, 0.05, (B, T)) * MASK
    fields = dict(mask=jnp.asarray(MASK), rewards=jnp.asarray(rewards), logp=jnp.asarray(logp),
                  old_logp=jnp.asarray(OLD), behaviour_logp=jnp.asarray(MU), group_size=2)
    fields.update(changes)
    return core.Batch(**fields)


def _with_correction(name, correction, mode="truncate", **hp):
    algo = core.preset(name)
    return dataclasses.replace(algo, spec=algo.spec.replace(correction=correction, correction_mode=mode),
                               hparams=algo.hparams.replace(**hp))


@pytest.mark.parametrize("name", ["rloo", "dr_grpo", "grpo", "cispo", "gspo"])
@pytest.mark.parametrize("level", op.IS_LEVELS)
@pytest.mark.parametrize("mode", op.IS_MODES)
def test_loss_gradient_is_the_weighted_policy_gradient(name, level, mode):
    """d loss / d logp with a correction = c_t times the uncorrected per-token derivative (the
    weight multiplies each token's policy term; advantages, clip and aggregation are unchanged)."""
    with jax.enable_x64(True):
        batch = _batch(ref_logp=jnp.asarray(OLD) if name == "grpo" else None)
        plain = _with_correction(name, "ignore", kl_coef=0.0) if name == "grpo" else _with_correction(name, "ignore")
        fixed = _with_correction(name, level, mode, **({"kl_coef": 0.0} if name == "grpo" else {}))
        g_plain = jax.grad(lambda lp: plain.loss(batch.replace(logp=lp))[0])(batch.logp)
        g_fixed = jax.grad(lambda lp: fixed.loss(batch.replace(logp=lp))[0])(batch.logp)
        weights, _ = reference_weights(OLD, MU, MASK, level, mode, 2.0, 0.5)
    np.testing.assert_allclose(np.asarray(g_fixed), weights * np.asarray(g_plain), rtol=1e-10, atol=1e-15)


def test_ignore_with_behaviour_log_probs_changes_nothing_but_the_metrics():
    algo = core.preset("dr_grpo")
    batch = _batch()
    with_mu, without = algo.loss(batch), algo.loss(batch.replace(behaviour_logp=None))
    assert float(with_mu[0]) == float(without[0])
    assert "mismatch_kl_sum" in with_mu[1] and "mismatch_kl_sum" not in without[1]
    assert "is_weight_sum" not in with_mu[1]


def test_behaviour_ratio_is_the_clip_against_the_sampler():
    """``behaviour_ratio`` = the same algorithm with old_logp := mu (no separate weight)."""
    algo = core.preset("dr_grpo")
    batch = _batch()
    value, metrics = _with_correction("dr_grpo", "behaviour_ratio").loss(batch)
    want, want_metrics = algo.loss(batch.replace(old_logp=batch.behaviour_logp))
    assert float(value) == pytest.approx(float(want), rel=1e-6)
    assert float(metrics["clipped_tokens"]) == float(want_metrics["clipped_tokens"]) > 0


def test_on_policy_token_weight_at_rho_one_is_pi_over_mu():
    """On-policy (old_logp None): the weight is computed from the current log-probs, without gradient:
    REINFORCE's token derivative is -c_t A_t / B with c_t = pi / mu (seq_mean aggregation)."""
    with jax.enable_x64(True):
        batch = _batch(old_logp=None)
        algo = _with_correction("reinforce", "token", is_cap=np.inf)
        grad = jax.grad(lambda lp: algo.loss(batch.replace(logp=lp))[0])(batch.logp)
        logp = np.asarray(batch.logp)
        returns = np.asarray(batch.rewards)[:, None] * MASK
        want = -np.exp((logp - MU) * MASK) * returns / B
    np.testing.assert_allclose(np.asarray(grad), want * MASK, rtol=1e-10, atol=1e-15)


def test_correction_metrics_are_sums_over_tokens():
    _, m = _with_correction("dr_grpo", "token", "mask").loss(_batch())
    weights, limited = reference_weights(OLD, MU, MASK, "token", "mask", 2.0, 0.5)
    assert float(m["is_weight_sum"]) == pytest.approx(weights.sum(), rel=1e-5)
    assert float(m["is_limited_sum"]) == limited.sum()
    fm = core.finalize_metrics(m)
    assert float(fm["is_limited_mean"]) == pytest.approx(limited.sum() / MASK.sum(), rel=1e-6)
    assert float(fm["mismatch_outside_mean"]) <= 1.0


def test_jit_and_vmap_over_caps():
    algo = _with_correction("dr_grpo", "sequence", "truncate")
    batch = _batch()
    grid, settings = core.hparam_grid(algo.hparams, is_cap=[0.5, 1.0, 2.0, np.inf])
    values = jax.jit(jax.vmap(lambda hp: algo.loss(batch, hp)[0]))(grid)
    for value, setting in zip(values, settings, strict=True):
        assert float(value) == pytest.approx(float(algo.loss(batch, algo.hparams.replace(**setting))[0]), rel=1e-6)
    assert len(set(np.round(np.asarray(values), 6))) > 1


@pytest.mark.parametrize("change,message", [
    (dict(spec=dict(correction="token"), batch=dict(behaviour_logp=None)), "needs batch.behaviour_logp"),
    (dict(hp=dict(is_cap=0.0)), "is_cap"),
    (dict(hp=dict(is_cap=float("nan"))), "is_cap"),
    (dict(hp=dict(is_floor=-0.1)), "is_floor"),
    (dict(hp=dict(is_floor=float("inf"))), "is_floor"),
    (dict(spec=dict(correction="sequnce")), "unknown correction"),
    (dict(spec=dict(correction_mode="clip")), "unknown correction_mode"),
    (dict(batch=dict(behaviour_logp=jnp.zeros((B, T + 1)))), "behaviour_logp must have shape"),
])
def test_bad_input_is_a_clear_error(change, message):
    algo = core.preset("dr_grpo")
    with pytest.raises(ValueError, match=message):
        spec = algo.spec.replace(**change.get("spec", {}))
        hp = algo.hparams.replace(**change.get("hp", {}))
        core.loss(spec, _batch(**change.get("batch", {})), hp)


def test_behaviour_ratio_needs_a_ratio_to_replace():
    with pytest.raises(ValueError, match="behaviour_ratio"):
        core.preset("reinforce").spec.replace(correction="behaviour_ratio")


def test_inf_cap_is_plain_importance_sampling():
    algo_inf = _with_correction("rloo", "sequence", is_cap=np.inf)
    batch = _batch(old_logp=None)
    _, m = algo_inf.loss(batch)
    assert float(m["is_limited_sum"]) == 0.0
