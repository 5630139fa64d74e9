"""The unified objective: presets against literal float64 references of the paper's
equations, the paper's identities, micro-batch invariance, vmapped ablation grids
and bad input."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import make_batch

from pgjax import core
from pgjax.core import (
    PRESETS,
    Batch,
    HParams,
    Spec,
    combine_metrics,
    finalize_metrics,
    hparam_grid,
    loss_normalizer,
    preset,
    token_logprobs,
)

# ---------------------------------------------------------------- float64 references

def _np(batch):
    return {k: (None if v is None else np.asarray(v, np.float64))
            for k, v in dataclasses.asdict(batch).items() if k != "group_size"}


def _ref_group(r, k, *, loo=False, std=False, eps=1e-6):
    out = np.zeros_like(r)
    for p in range(len(r) // k):
        g = r[p * k:(p + 1) * k]
        if np.all(g == g[0]):
            continue
        for i in range(k):
            base = (g.sum() - g[i]) / (k - 1) if loo else g.mean()
            a = g[i] - base
            out[p * k + i] = a / (g.std(ddof=1) + eps) if std else a
    return out


def _ref_rho_hat(logp, old, adv, lo, hi):
    rho = np.exp(logp - old)
    clipped = ((adv > 0) & (rho > 1 + hi)) | ((adv < 0) & (rho < 1 - lo))
    return np.where(clipped, 0.0, rho)


def _ref_gae(r_tok, v, mask, boot, gamma, lam):
    b, t = mask.shape
    adv = np.zeros((b, t))
    for i in range(b):
        n = int(mask[i].sum())
        nxt_v, nxt_a = boot[i], 0.0
        for s in reversed(range(n)):
            delta = r_tok[i, s] + gamma * nxt_v - v[i, s]
            adv[i, s] = delta + gamma * lam * nxt_a
            nxt_v, nxt_a = v[i, s], adv[i, s]
    return adv


def _outcome_tokens(r, mask):
    out = np.zeros_like(mask)
    for i, n in enumerate(mask.sum(1).astype(int)):
        if n:
            out[i, n - 1] = r[i]
    return out


def _k3(logp, ref):
    return np.exp(ref - logp) - 1 - (ref - logp)


def reference_loss(name, x, k):
    """Each preset's loss written from the paper's equation with explicit loops."""
    m, r, logp, old = x["mask"], x["rewards"], x["logp"], x["old_logp"]
    b = len(r)
    p = b // k
    lengths = m.sum(1)
    seq = lambda per_tok: (per_tok * m).sum(1)  # noqa: E731
    if name == "reinforce":      # eq. 10, G_t = r for gamma = 1, rho = 1 (no critic, no bootstrap)
        return -np.mean(seq(np.broadcast_to(r[:, None], m.shape)))
    if name == "remax":          # eq. 13
        return -np.mean(seq(np.broadcast_to((r - x["greedy_rewards"])[:, None], m.shape)))
    if name == "reinforce_baseline":  # eq. 12: G_t - V(s_t) (with the bootstrap after truncation)
        adv = _ref_gae(_outcome_tokens(r, m), x["values"], m, x["bootstrap"], 1.0, 1.0)
        return -np.mean(seq(adv))
    if name == "rloo":           # eq. 14: (1/(K-1)) sum_k (G_k - mean), averaged over prompts
        a = np.array([(r[i] - r[(i // k) * k:(i // k + 1) * k].mean()) for i in range(b)])
        return -np.sum(seq(np.broadcast_to(a[:, None], m.shape))) / (k - 1) / p
    if name == "ppo_multi_sample":   # eq. 19
        a = _ref_group(r, k)[:, None] * np.ones_like(m)
        return -np.sum(seq(_ref_rho_hat(logp, old, a, 0.2, 0.2) * a)) / (k - 1) / p
    if name == "dr_grpo":        # eq. 21
        a = _ref_group(r, k)[:, None] * np.ones_like(m)
        return -np.sum(seq(_ref_rho_hat(logp, old, a, 0.2, 0.2) * a)) / p
    if name == "grpo":           # eq. 18
        a = _ref_group(r, k, std=True)[:, None] * np.ones_like(m)
        per_tok = _ref_rho_hat(logp, old, a, 0.2, 0.2) * a - 0.04 * _k3(logp, x["ref_logp"])
        return -np.mean(seq(per_tok) / np.maximum(lengths, 1))
    if name == "dapo":
        a = _ref_group(r, k, std=True)[:, None] * np.ones_like(m)
        return -np.sum(seq(_ref_rho_hat(logp, old, a, 0.2, 0.28) * a)) / m.sum()
    if name == "ppo":            # eq. 15-17: GAE(0.95), whitened over tokens (ddof 1)
        adv = _ref_gae(_outcome_tokens(r, m), x["values"], m, x["bootstrap"], 1.0, 0.95)
        sel = adv[m > 0]
        adv = (adv - sel.mean()) / (sel.std(ddof=1) + 1e-8) * m
        return -np.mean(seq(_ref_rho_hat(logp, old, adv, 0.2, 0.2) * adv))
    if name == "reinforce_pp":   # return-to-go of r - 0.01 * k1(old, ref), whitened, rho-hat, token-mean
        r_tok = _outcome_tokens(r, m) - 0.01 * (old - x["ref_logp"]) * m
        adv = np.flip(np.cumsum(np.flip(r_tok, 1), 1), 1) * m
        sel = adv[m > 0]
        adv = (adv - sel.mean()) / (sel.std(ddof=1) + 1e-8) * m
        return -np.sum(seq(_ref_rho_hat(logp, old, adv, 0.2, 0.2) * adv)) / m.sum()
    if name == "gspo":           # sequence ratio exp(mean_t log rho), clipped per sequence, / |o|
        a = _ref_group(r, k, std=True)
        total = 0.0
        for i in range(b):
            if lengths[i] == 0:
                continue
            s_i = np.exp(((logp[i] - old[i]) * m[i]).sum() / lengths[i])
            clipped = (a[i] > 0 and s_i > 1 + 4e-4) or (a[i] < 0 and s_i < 1 - 3e-4)
            total += 0.0 if clipped else s_i * a[i]   # (1/|o|) sum_t of a per-token constant
        return -total / b
    if name == "cispo":          # sg(min(rho, 1 + eps_high)) A log pi, token-mean
        a = _ref_group(r, k, std=True)[:, None] * np.ones_like(m)
        weight = np.minimum(np.exp(logp - old), 5.0)
        return -np.sum(seq(weight * a * logp)) / m.sum()
    raise KeyError(name)


REFERENCED = sorted(PRESETS)


@pytest.mark.parametrize("name", REFERENCED)
def test_preset_loss_matches_float64_reference(name):
    batch, _, _ = make_batch(0)
    got, _ = jax.jit(preset(name).loss)(batch)
    want = reference_loss(name, _np(batch), batch.group_size)
    np.testing.assert_allclose(float(got), want, rtol=1e-5, atol=1e-6)


def test_every_preset_is_finite_with_empty_responses_and_equal_groups():
    batch, theta, tokens = make_batch(1)
    for name, algo in PRESETS.items():
        def f(th):
            return algo.loss(batch.replace(logp=token_logprobs(th, tokens)))[0]  # noqa: B023 - called at once
        value, grad = jax.value_and_grad(f)(theta)
        assert np.isfinite(float(value)), name
        assert np.all(np.isfinite(np.asarray(grad))), name
        # the empty response (row 0) gets no gradient
        assert np.all(np.asarray(grad[0]) == 0.0), name


# ---------------------------------------------------------------- the paper's identities

def _grad(spec, hp, batch, theta, tokens, norm=None):
    def f(th):
        return core.loss(spec, batch.replace(logp=token_logprobs(th, tokens)), hp, norm)[0]
    return np.asarray(jax.grad(f)(theta), np.float64)


def test_rho_hat_loss_gradient_equals_clipped_objective_gradient(x64):
    """eq. 15 vs eq. 16 through the library's loss, with clip-higher and dual clip."""
    batch, theta, tokens = make_batch(2, dtype=jnp.float64)
    hp = HParams(clip_eps_low=0.1, clip_eps_high=0.25, dual_clip=2.0, divide_by_std=1.0)
    spec = preset("dapo").spec
    adv = core.advantages(spec, batch, hp)
    norm = loss_normalizer(batch.mask, batch.group_size)

    def clipped(th):
        ratio = core.importance_ratio(token_logprobs(th, tokens), batch.old_logp)
        per_tok = core.clipped_objective(ratio, adv, hp.clip_eps_low, hp.clip_eps_high, hp.dual_clip)
        return -core.aggregate(per_tok, batch.mask, spec.aggregation, norm)

    want = np.asarray(jax.grad(clipped)(theta))
    got = _grad(spec, hp, batch.replace(advantages=adv), theta, tokens)
    assert np.abs(want).max() > 1e-3  # not vacuous
    ratio = np.exp(np.asarray(batch.logp - batch.old_logp))
    assert np.any((ratio > 1.25) | (ratio < 0.9))  # some tokens are clipped
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_ppo_at_theta_old_equals_reinforce_with_the_same_advantages(x64):
    batch, theta, tokens = make_batch(3, dtype=jnp.float64)
    batch = batch.replace(old_logp=token_logprobs(theta, tokens))
    ppo = preset("ppo")
    adv = ppo.advantages(batch)
    on_policy = dataclasses.replace(ppo.spec, ratio="on_policy")
    g_ppo = _grad(ppo.spec, ppo.hparams, batch.replace(advantages=adv), theta, tokens)
    g_pg = _grad(on_policy, ppo.hparams, batch.replace(advantages=adv), theta, tokens)
    assert np.abs(g_pg).max() > 1e-3
    np.testing.assert_allclose(g_ppo, g_pg, atol=1e-12)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_rloo_advantage_is_k_over_k_minus_1_times_group_mean_advantage(k, x64):
    batch, _, _ = make_batch(4, prompts=3, group_size=k, dtype=jnp.float64)
    batch = batch.replace(rewards=jnp.asarray(np.random.default_rng(k).normal(size=3 * k)))
    loo = preset("rloo").advantages(batch)
    mean = preset("rloo").advantages(batch, HParams(leave_one_out=0.0))
    np.testing.assert_allclose(np.asarray(loo), k / (k - 1) * np.asarray(mean), atol=1e-12)


def test_dr_grpo_is_k_minus_1_times_eq19(x64):
    batch, theta, tokens = make_batch(5, prompts=2, group_size=4, dtype=jnp.float64)
    dr, eq19 = preset("dr_grpo"), preset("ppo_multi_sample")
    l_dr, _ = dr.loss(batch)
    l_19, _ = eq19.loss(batch)
    assert abs(float(l_19)) > 1e-3
    np.testing.assert_allclose(float(l_dr), 3 * float(l_19), rtol=1e-12)
    np.testing.assert_allclose(_grad(dr.spec, dr.hparams, batch, theta, tokens),
                               3 * _grad(eq19.spec, eq19.hparams, batch, theta, tokens), atol=1e-12)


# A two-step token MDP: s0 -> a0 in {0,1,2} -> s1 = (a0) -> a1 in {0,1,2} -> end.
# Tabular softmax policy theta[state, action] with 4 states (s0 and the three s1).
def _trajectories():
    return [(a0, a1) for a0 in range(3) for a1 in range(3)]


def _reward(a0, a1):
    return float((a0 + 2 * a1) % 3 == 1) + 0.5 * (a0 == 2)


def _tabular_batch(theta, baseline_table, action_dependent):
    """All 9 trajectories as one batch (B = 9, T = 2) with the library's Batch."""
    logpi = jax.nn.log_softmax(theta, axis=-1)
    rows, values = [], []
    for a0, a1 in _trajectories():
        rows.append(jnp.stack([logpi[0, a0], logpi[1 + a0, a1]]))
        s1_value = baseline_table[1 + a0] + (baseline_table[0] * a1 if action_dependent else 0.0)
        values.append([baseline_table[0], s1_value])
    return Batch(mask=jnp.ones((9, 2)), rewards=jnp.asarray([_reward(*t) for t in _trajectories()]),
                 logp=jnp.stack(rows), values=jnp.asarray(values), group_size=1)


def _expected_gradient(spec, theta, baseline_table, action_dependent=False):
    """E[g] = sum_tau p(tau) grad loss(tau), computed exactly by enumeration."""
    probs = jnp.exp(jnp.sum(_tabular_batch(theta, baseline_table, action_dependent).logp, axis=1))

    def per_trajectory(th, i):
        batch = _tabular_batch(th, baseline_table, action_dependent)
        one = jax.tree.map(lambda x: x[i:i + 1], batch)
        return -core.loss(spec, one, HParams())[0]  # the ascent direction
    grads = [jax.grad(per_trajectory)(theta, i) for i in range(9)]
    return np.asarray(sum(p * g for p, g in zip(probs, grads, strict=True)))


def _true_gradient(theta):
    def j(th):
        logpi = jax.nn.log_softmax(th, axis=-1)
        return sum(jnp.exp(logpi[0, a0] + logpi[1 + a0, a1]) * _reward(a0, a1) for a0, a1 in _trajectories())
    return np.asarray(jax.grad(j)(theta))


@pytest.mark.slow
def test_state_baseline_leaves_expected_gradient_unchanged_exactly(x64):
    """The paper, eq. 11: E[b(s_t) grad log pi(a_t|s_t)] = 0 for any b that depends on s_t only."""
    theta = jnp.asarray(np.random.default_rng(0).normal(size=(4, 3)))
    baseline_table = jnp.asarray([0.7, -1.3, 2.0, 0.4])
    true = _true_gradient(theta)
    no_baseline = _expected_gradient(preset("reinforce").spec, theta, baseline_table)
    with_baseline = _expected_gradient(preset("reinforce_baseline").spec, theta, baseline_table)
    np.testing.assert_allclose(no_baseline, true, atol=1e-12)
    np.testing.assert_allclose(with_baseline, true, atol=1e-12)
    # control: a "baseline" that depends on the action a_1 biases the estimate
    biased = _expected_gradient(preset("reinforce_baseline").spec, theta, baseline_table, action_dependent=True)
    assert np.abs(biased - true).max() > 1e-2


# ---------------------------------------------------------------- micro-batches, grids, transforms

@pytest.mark.parametrize("aggregation", core.AGGREGATIONS)
@pytest.mark.parametrize("n_micro", [1, 2, 4])
def test_micro_batch_gradients_sum_to_full_batch_gradient(aggregation, n_micro):
    batch, theta, tokens = make_batch(6, prompts=4, group_size=2)
    algo = preset("grpo")
    spec = dataclasses.replace(algo.spec, aggregation=aggregation)
    hp = algo.hparams.replace(whiten=1.0)  # whitening needs global statistics too
    adv = core.advantages(spec, batch, hp)
    norm = loss_normalizer(batch.mask, batch.group_size)
    full = _grad(spec, hp, batch.replace(advantages=adv), theta, tokens, norm)
    rows = batch.mask.shape[0] // n_micro
    total, metrics = np.zeros_like(full), None
    for i in range(n_micro):
        sl = slice(i * rows, (i + 1) * rows)
        micro = jax.tree.map(lambda x, sl=sl: x[sl], batch.replace(advantages=adv))
        total[sl] = _grad(spec, hp, micro, theta[sl], tokens[sl], norm)
        _, m = core.loss(spec, micro.replace(logp=token_logprobs(theta[sl], tokens[sl])), hp, norm)
        metrics = m if metrics is None else combine_metrics(metrics, m)
    np.testing.assert_allclose(total, full, atol=1e-6)
    _, full_metrics = core.loss(spec, batch.replace(advantages=adv), hp, norm)
    for key, value in full_metrics.items():
        # a sum over the batch's ~50 tokens in float32 is exact to about 50 eps of its terms' size (~1): the
        # whitened advantages' sum is 0 up to that rounding, in whatever order XLA adds them
        atol = 1e-5 if key.endswith("_sum") else 1e-6
        np.testing.assert_allclose(float(metrics[key]), float(value), rtol=1e-5, atol=atol, err_msg=key)


def test_vmap_over_16_setting_grid_equals_python_loop():
    batch, theta, tokens = make_batch(7)
    algo = preset("grpo")
    grid, settings = hparam_grid(algo.hparams, divide_by_std=[0.0, 1.0], divide_by_length=[0.0, 1.0],
                                 leave_one_out=[0.0, 1.0], kl_coef=[0.0, 0.04])
    assert len(settings) == 16

    def value_and_grad(b, hp):
        return jax.value_and_grad(lambda th: algo.loss(b.replace(logp=token_logprobs(th, tokens)), hp)[0])(theta)

    values, grads = jax.jit(jax.vmap(value_and_grad, in_axes=(None, 0)))(batch, grid)
    for i, setting in enumerate(settings):
        v, g = value_and_grad(batch, algo.hparams.replace(**setting))
        np.testing.assert_allclose(values[i], v, rtol=1e-5, atol=1e-6, err_msg=str(setting))
        np.testing.assert_allclose(grads[i], g, rtol=1e-5, atol=1e-6, err_msg=str(setting))
    assert len({round(float(v), 5) for v in values}) == 16  # every switch changes the loss


def test_vmap_loss_in_axes_none_0_and_over_batches():
    batch, _, _ = make_batch(8)
    algo = preset("ppo")
    grid, settings = hparam_grid(algo.hparams, lam=[0.0, 0.5, 0.95, 1.0], whiten=[0.0, 1.0],
                                 clip_eps_high=[0.1, 0.3])
    losses, _ = jax.vmap(algo.loss, in_axes=(None, 0))(batch, grid)
    for i, setting in enumerate(settings):
        np.testing.assert_allclose(losses[i], algo.loss(batch, algo.hparams.replace(**setting))[0], rtol=1e-5)
    batches = [make_batch(s)[0] for s in (9, 10, 11)]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
    over_batches, _ = jax.jit(jax.vmap(algo.loss))(stacked)
    for i, b in enumerate(batches):
        np.testing.assert_allclose(over_batches[i], algo.loss(b)[0], rtol=1e-5)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_jit_equals_eager(name):
    batch, _, _ = make_batch(12)
    eager, m_eager = preset(name).loss(batch)
    jitted, m_jit = jax.jit(preset(name).loss)(batch)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)
    assert set(m_eager) == set(m_jit)


def test_metrics_are_sums_and_counts():
    batch, _, _ = make_batch(13)
    _, m = preset("grpo").loss(batch)
    mask = np.asarray(batch.mask)
    ratio = np.exp(np.asarray(batch.logp - batch.old_logp))
    assert float(m["tokens"]) == mask.sum()
    np.testing.assert_allclose(m["ratio_sum"], (ratio * mask).sum(), rtol=1e-5)
    np.testing.assert_allclose(m["ratio_max"], ratio[mask > 0].max(), rtol=1e-6)
    np.testing.assert_allclose(m["ratio_min"], ratio[mask > 0].min(), rtol=1e-6)
    log_r = np.asarray(batch.logp - batch.old_logp)  # k3 estimate of KL(old || new) from samples of old
    np.testing.assert_allclose(m["approx_kl_sum"], ((np.exp(log_r) - 1 - log_r) * mask).sum(), rtol=1e-4)
    out = finalize_metrics(m)
    np.testing.assert_allclose(out["ratio_mean"], (ratio * mask).sum() / mask.sum(), rtol=1e-5)
    assert 0.0 < float(out["clip_fraction"]) < 1.0


def test_entropy_bonus_enters_the_loss():
    batch, _, _ = make_batch(14)
    ent = jnp.ones_like(batch.mask) * 2.0
    algo = preset("dapo")
    base, _ = algo.loss(batch)
    with_bonus, m = algo.loss(batch.replace(entropy=ent), algo.hparams.replace(entropy_coef=0.1))
    np.testing.assert_allclose(float(base - with_bonus), 0.1 * 2.0, rtol=1e-5)  # token-mean of 2.0
    np.testing.assert_allclose(float(m["entropy_sum"]), 2.0 * float(batch.mask.sum()), rtol=1e-6)


def test_kl_in_reward_lowers_the_returns():
    batch, _, _ = make_batch(15)
    algo = preset("reinforce_pp")
    off = core.advantages(algo.spec, batch, algo.hparams.replace(kl_coef=0.0, whiten=0.0))
    on = core.advantages(algo.spec, batch, algo.hparams.replace(kl_coef=0.5, whiten=0.0))
    k1 = np.asarray((batch.old_logp - batch.ref_logp) * batch.mask)
    # return-to-go of the per-token penalty -0.5 * k1
    penalty = -0.5 * np.flip(np.cumsum(np.flip(k1, 1), 1), 1) * np.asarray(batch.mask)
    np.testing.assert_allclose(np.asarray(on - off), penalty, atol=1e-5)


# ---------------------------------------------------------------- bad input

def test_unknown_names_raise():
    with pytest.raises(ValueError, match="unknown preset 'grpoo'.*dr_grpo"):
        preset("grpoo")
    with pytest.raises(ValueError, match="unknown aggregation 'mean'"):
        dataclasses.replace(preset("grpo").spec, aggregation="mean")
    with pytest.raises(ValueError, match="unknown baseline"):
        Spec(name="x", equation="-", baseline="critic", ratio="clip", aggregation="token_mean")
    with pytest.raises(ValueError, match="unknown kl_estimator"):
        dataclasses.replace(preset("grpo").spec, kl_estimator="k4")
    with pytest.raises(ValueError, match="unknown hyperparameter.*clip_eps"):
        HParams().replace(clip_epsilon=0.1)


@pytest.mark.parametrize("field,value,message", [
    ("clip_eps_low", -0.1, "clip_eps_low"), ("clip_eps_high", -0.2, "clip_eps_high"),
    ("dual_clip", 0.5, "dual_clip"), ("gamma", 1.5, "gamma"), ("std_eps", 0.0, "std_eps"),
    ("divide_by_std", 2.0, "switch"), ("kl_coef", -1.0, "kl_coef"), ("lam", float("nan"), "lam"),
])
def test_out_of_range_hyperparameters_raise(field, value, message):
    batch, _, _ = make_batch(16)
    with pytest.raises(ValueError, match=message):
        preset("grpo").loss(batch, preset("grpo").hparams.replace(**{field: value}))


def test_out_of_range_value_in_a_grid_raises():
    with pytest.raises(ValueError, match="clip_eps_low"):
        hparam_grid(HParams(), clip_eps_low=[0.2, -0.2])


def test_bad_batches_raise():
    batch, _, _ = make_batch(17, prompts=3, group_size=4)
    grpo = preset("grpo")
    with pytest.raises(ValueError, match="not divisible by group_size K=5"):
        grpo.loss(batch.replace(group_size=5))
    with pytest.raises(ValueError, match="old_logp must have shape"):
        grpo.loss(batch.replace(old_logp=batch.old_logp[:, :-1]))
    with pytest.raises(ValueError, match="rewards must have shape"):
        grpo.loss(batch.replace(rewards=batch.rewards[:-1]))
    with pytest.raises(ValueError, match="mask must be a float"):
        grpo.loss(batch.replace(mask=batch.mask.astype(jnp.int32)))
    with pytest.raises(ValueError, match="K must be >= 2 here, got K=1"):
        grpo.loss(batch.replace(group_size=1))
    with pytest.raises(ValueError, match="needs batch.values"):
        preset("ppo").loss(batch.replace(values=None))
    with pytest.raises(ValueError, match="needs batch.greedy_rewards"):
        preset("remax").loss(batch.replace(greedy_rewards=None))
    with pytest.raises(ValueError, match="needs batch.ref_logp"):
        grpo.loss(batch.replace(ref_logp=None))
    # KL off: ref_logp may be absent
    loss_value, _ = grpo.loss(batch.replace(ref_logp=None), grpo.hparams.replace(kl_coef=0.0))
    assert np.isfinite(float(loss_value))


def test_missing_reference_drops_the_kl_term_under_jit_and_vmap():
    batch, _, _ = make_batch(18)
    grpo = preset("grpo")
    no_ref = batch.replace(ref_logp=None)
    off = grpo.hparams.replace(kl_coef=0.0)
    eager, _ = grpo.loss(no_ref, off)
    jitted, _ = jax.jit(grpo.loss)(no_ref, off)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)
    np.testing.assert_allclose(eager, grpo.loss(batch, off)[0], rtol=1e-6)
    grid, _ = hparam_grid(off, divide_by_std=[0.0, 1.0])
    swept, _ = jax.vmap(grpo.loss, in_axes=(None, 0))(no_ref, grid)
    np.testing.assert_allclose(swept[1], eager, rtol=1e-6)


def test_entropy_coef_without_entropy_raises():
    batch, _, _ = make_batch(19)
    with pytest.raises(ValueError, match="entropy_coef != 0 needs batch.entropy"):
        preset("dapo").loss(batch, preset("dapo").hparams.replace(entropy_coef=0.01))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_minus_inf_log_probs_in_padding_give_finite_values_and_gradients(name):
    batch, theta, tokens = make_batch(20)
    pad = batch.mask == 0
    poison = lambda x: jnp.where(pad, -jnp.inf, x)  # noqa: E731
    batch = batch.replace(old_logp=poison(batch.old_logp), ref_logp=poison(batch.ref_logp),
                          entropy=jnp.where(pad, jnp.nan, 1.0))
    algo = preset(name)

    def f(th):
        return algo.loss(batch.replace(logp=poison(token_logprobs(th, tokens))), algo.hparams)[0]
    value, grad = jax.value_and_grad(f)(theta)
    assert np.isfinite(float(value))
    assert np.all(np.isfinite(np.asarray(grad)))


def test_reinforce_uses_the_sampled_return_not_a_critic_bootstrap():
    batch, _, _ = make_batch(21)
    reinforce = preset("reinforce")
    scaled = batch.replace(bootstrap=batch.bootstrap * 100)
    np.testing.assert_allclose(reinforce.loss(batch)[0], reinforce.loss(scaled)[0])
    critic = preset("reinforce_baseline")  # with a critic, the bootstrap value is used
    assert float(critic.loss(batch)[0]) != float(critic.loss(scaled)[0])


def test_micro_batches_may_split_a_group_and_carry_per_token_advantages():
    """PPO's per-token GAE advantages and GRPO's group advantages, micro-batches of 2 rows with K = 4."""
    batch, theta, tokens = make_batch(22, prompts=2, group_size=4)
    norm = loss_normalizer(batch.mask, batch.group_size)
    for name in ("ppo", "grpo"):
        algo = preset(name)
        adv = algo.advantages(batch)
        full = _grad(algo.spec, algo.hparams, batch.replace(advantages=adv), theta, tokens, norm)
        total = np.zeros_like(full)
        for start in range(0, 8, 2):
            sl = slice(start, start + 2)
            micro = jax.tree.map(lambda x, sl=sl: x[sl], batch.replace(advantages=adv))
            total[sl] = _grad(algo.spec, algo.hparams, micro, theta[sl], tokens[sl], norm)
        np.testing.assert_allclose(total, full, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_value_targets_are_unwhitened_lambda_returns_of_the_kl_penalised_rewards(kl_coef):
    from test_returns import ref_gae
    batch, _, _ = make_batch(5)
    algo = core.preset("ppo")                              # whitened advantages, k1 KL in the reward
    hp = algo.hparams.replace(kl_coef=kl_coef, gamma=0.9)
    mask = np.asarray(batch.mask, np.float64)
    token_rewards = np.zeros_like(mask)
    last = np.maximum(mask.sum(1).astype(int) - 1, 0)
    token_rewards[np.arange(len(last)), last] = np.asarray(batch.rewards) * (mask.sum(1) > 0)
    token_rewards -= kl_coef * (np.asarray(batch.old_logp) - np.asarray(batch.ref_logp)) * mask
    _, want = ref_gae(token_rewards, batch.values, mask, 0.9, 0.95, batch.bootstrap)
    got = core.value_targets(algo.spec, batch, hp)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    whitened = algo.advantages(batch, hp) + batch.values * batch.mask
    assert np.abs(np.asarray(whitened) - want).max() > 1e-2    # targets are not the whitened advantages
    with pytest.raises(ValueError, match="needs batch.values"):
        core.value_targets(algo.spec, batch.replace(values=None), hp)


def test_token_weights_per_difficulty_bucket_match_a_hand_computed_example():
    """Three groups of K=4: easy [1,1,1,0], medium [1,1,0,0], hard [1,0,0,0]; lengths [2,2,2,4].

    Advantages r - mean: easy [.25,.25,.25,-.75], medium [.5,.5,-.5,-.5], hard [.75,-.25,-.25,-.25];
    sample std (ddof 1): easy .5, medium 1/sqrt(3), hard .5. Dr. GRPO (prompt_mean, N = P = 3):
    c_bt = A_b / 3, so sum |c| = sum_b |A_b| |o_b| / 3 = 1.5, 5/3, 7/6. With / std and / |o|:
    sum_t |c_bt| = |A_b| / std / 3 (the length cancels) = 1, 2 / sqrt(3), 1: the std
    up-weights the easy and hard groups relative to the medium one (0.75 -> 0.866)."""
    rewards = jnp.asarray([1, 1, 1, 0, 1, 1, 0, 0, 1, 0, 0, 0], jnp.float32)
    lengths = np.tile([2, 2, 2, 4], 3)
    mask = jnp.asarray(np.arange(4)[None, :] < lengths[:, None], jnp.float32)
    logp = jnp.asarray(np.random.default_rng(0).normal(size=(12, 4)), jnp.float32) - 2.0
    batch = Batch(mask=mask, rewards=rewards, logp=logp, old_logp=logp, ref_logp=logp, group_size=4)
    buckets = lambda c: np.abs(np.asarray(c)).sum(1).reshape(3, 4).sum(1)  # noqa: E731
    dr = core.preset("dr_grpo")
    np.testing.assert_allclose(buckets(core.token_weights(dr, batch, dr.hparams)), [1.5, 5 / 3, 7 / 6],
                               rtol=1e-5)
    both = dr.hparams.replace(divide_by_std=1.0, divide_by_length=1.0)
    weights = jax.jit(core.token_weights, static_argnums=0)(dr, batch, both)
    np.testing.assert_allclose(buckets(weights), [1.0, 2 / np.sqrt(3), 1.0], rtol=1e-5)
    # per token: A_b / std / |o_b| / 3 on the response, 0 on padding
    adv = np.asarray([.25, .25, .25, -.75, .5, .5, -.5, -.5, .75, -.25, -.25, -.25])
    std = np.repeat([.5, 1 / np.sqrt(3), .5], 4)
    np.testing.assert_allclose(np.asarray(weights), (adv / std / lengths / 3)[:, None] * np.asarray(mask),
                               rtol=1e-5, atol=1e-7)
    # GRPO's preset (seq_mean: N = B = 12, k3 KL in the loss, zero gradient at ref = logp)
    grpo = core.preset("grpo")
    np.testing.assert_allclose(np.asarray(core.token_weights(grpo, batch, grpo.hparams)),
                               np.asarray(weights) / 4, rtol=1e-5, atol=1e-7)
