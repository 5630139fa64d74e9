"""Algorithm presets: the paper's algorithms (and DAPO, REINFORCE++, GSPO, CISPO) as
``Algorithm(spec, hparams)`` values. ``pgjax.demo.algorithm_table()`` renders them, so the
README's table is generated from the presets themselves.

Each preset reproduces its equation up to a positive constant factor that the
learning rate absorbs, except where the paper's point is the factor itself
(1/K vs 1/(K-1)); see each ``equation`` and the float64 references in
tests/test_algorithms.py.
"""
from pgjax.core.algorithms import Algorithm, HParams, Spec


def _preset(summary, hparams=None, **spec) -> Algorithm:
    return Algorithm(spec=Spec(**spec), hparams=hparams or HParams(), summary=summary)


PRESETS: dict[str, Algorithm] = {
    "reinforce": _preset(
        "REINFORCE: sum_t G_t grad log pi", name="reinforce", equation="10",
        baseline="none", ratio="on_policy", aggregation="seq_mean"),
    "reinforce_baseline": _preset(
        "REINFORCE with a critic baseline: sum_t (G_t - V(s_t)) grad log pi",
        name="reinforce_baseline", equation="11-12", baseline="value", ratio="on_policy", aggregation="seq_mean"),
    "remax": _preset(
        "ReMax: baseline = return of the greedy response", name="remax", equation="13",
        baseline="greedy", ratio="on_policy", aggregation="seq_mean"),
    "rloo": _preset(
        "RLOO: leave-one-out baseline over K samples, i.e. 1/(K-1) scaling",
        HParams(leave_one_out=1.0), name="rloo", equation="14",
        baseline="group", ratio="on_policy", aggregation="seq_mean"),
    "ppo": _preset(
        "PPO: modified ratio rho-hat, GAE(lambda) with a critic, whitened advantages, KL in reward",
        HParams(lam=0.95, whiten=1.0), name="ppo", equation="15-17",
        baseline="value", ratio="clip", aggregation="seq_mean", kl_placement="reward", kl_estimator="k1"),
    "ppo_multi_sample": _preset(
        "PPO with multiple sampling: group mean baseline with 1/(K-1), rho-hat",
        HParams(leave_one_out=1.0), name="ppo_multi_sample", equation="19-20",
        baseline="group", ratio="clip", aggregation="seq_mean"),
    "grpo": _preset(
        "GRPO: group mean, / std, / |o|, 1/K, rho-hat, beta * k3 KL in the loss",
        HParams(divide_by_std=1.0, divide_by_length=1.0, kl_coef=0.04), name="grpo", equation="18",
        baseline="group", ratio="clip", aggregation="seq_mean", kl_placement="loss", kl_estimator="k3"),
    "dr_grpo": _preset(
        "Dr. GRPO: group mean, no std, no |o|: sum_k sum_t rho-hat (r_k - mean r)",
        name="dr_grpo", equation="21", baseline="group", ratio="clip", aggregation="prompt_mean"),
    "dapo": _preset(
        "DAPO (beyond the paper): clip-higher, token-mean, / std, no KL",
        HParams(clip_eps_high=0.28, divide_by_std=1.0), name="dapo", equation="-",
        baseline="group", ratio="clip", aggregation="token_mean"),
    "reinforce_pp": _preset(
        "REINFORCE++ (beyond the paper): returns-to-go with k1 KL in the reward, batch whitening, clip",
        HParams(whiten=1.0, kl_coef=0.01), name="reinforce_pp", equation="-",
        baseline="none", ratio="clip", aggregation="token_mean", kl_placement="reward", kl_estimator="k1"),
    "gspo": _preset(
        "GSPO (beyond the paper): clipped length-normalised sequence ratio",
        HParams(clip_eps_low=3e-4, clip_eps_high=4e-4, divide_by_std=1.0, divide_by_length=1.0),
        name="gspo", equation="-", baseline="group", ratio="sequence", aggregation="seq_mean"),
    "cispo": _preset(
        "CISPO (beyond the paper): truncated IS weight sg(min(rho, 1+eps_high)) A log pi",
        HParams(clip_eps_high=4.0, divide_by_std=1.0), name="cispo", equation="-",
        baseline="group", ratio="truncated_is", aggregation="token_mean"),
}


def preset(name: str) -> Algorithm:
    """The preset called ``name``; a ValueError lists the valid names."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name]
