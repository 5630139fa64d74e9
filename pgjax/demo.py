"""A tour of ``pgjax.core`` on CPU in seconds: every preset's loss on one batch, and
the paper's GRPO switches swept as a 16-setting ablation grid in one compiled call.

    python -m pgjax.demo            # the tour
    python -m pgjax.demo --table    # the algorithm-to-equation table (markdown), as in the README

The batch is synthetic: P prompts x K responses with random lengths, binary
rewards and a tabular softmax policy whose logits are the parameters.
"""
import argparse

import jax
import jax.numpy as jnp
import numpy as np

from pgjax import markdown
from pgjax.core import PRESETS, Algorithm, Batch, finalize_metrics, hparam_grid, preset, token_logprobs


def _num(x) -> str:
    """``x`` as the table writes a hyperparameter: ``%g``."""
    return f"{float(x):g}"


def _advantage_column(algo: Algorithm) -> str:
    """The advantage a preset computes, as the table's advantage cell."""
    spec, hp = algo.spec, algo.hparams
    if spec.baseline == "none":
        text = f"G_t (gamma={_num(hp.gamma)})"
    elif spec.baseline == "value":
        text = f"GAE: G^lambda_t - V(s_t) (lambda={_num(hp.lam)})"
    elif spec.baseline == "greedy":
        text = "G - G_greedy"
    else:
        text = "r - leave-one-out mean (1/(K-1))" if hp.leave_one_out else "r - group mean (1/K)"
        if hp.divide_by_std:
            text += ", / std"
    if hp.whiten:
        text += ", batch-whitened"
    return text


def _ratio_column(algo: Algorithm) -> str:
    """The ratio (and clipping) a preset uses, as the table's ratio cell."""
    spec, hp = algo.spec, algo.hparams
    eps = f"eps={_num(hp.clip_eps_low)}" if hp.clip_eps_low == hp.clip_eps_high else \
        f"eps=({_num(hp.clip_eps_low)}, {_num(hp.clip_eps_high)})"
    return {"on_policy": "on-policy (rho = 1)", "clip": f"rho-hat, {eps}",
            "sequence": f"sequence rho-hat, {eps}",
            "truncated_is": f"sg(min(rho, {_num(1 + hp.clip_eps_high)})) A log pi"}[spec.ratio]


def _kl_column(algo: Algorithm) -> str:
    """A preset's KL term (coefficient, estimator, placement), as the table's KL cell."""
    spec, hp = algo.spec, algo.hparams
    if spec.kl_placement == "none":
        return "none"
    if float(hp.kl_coef) == 0:
        return f"off (kl_coef=0; {spec.kl_estimator} in {spec.kl_placement} when on)"
    return f"{_num(hp.kl_coef)} * {spec.kl_estimator} in {spec.kl_placement}"


def _aggregation_column(algo: Algorithm) -> str:
    """A preset's loss aggregation, with ``(1/|o|)`` where it divides by the response length."""
    per_seq = " (1/|o|)" if algo.hparams.divide_by_length else ""
    return f"{algo.spec.aggregation}{per_seq}"


def algorithm_table() -> str:
    """Markdown table of every preset: equation, advantage, ratio, KL, aggregation."""
    return markdown.table(["preset", "eq.", "advantage", "ratio", "KL", "aggregation"],
                          [[f"`{name}`", algo.spec.equation, _advantage_column(algo), _ratio_column(algo),
                            _kl_column(algo), _aggregation_column(algo)] for name, algo in PRESETS.items()],
                          align="llllll")


def synthetic_batch(seed: int, prompts: int, group_size: int, length: int, vocab: int):
    """A batch whose current log-probs come from logits ``theta`` ``[B, T, V]``."""
    rng = np.random.default_rng(seed)
    b = prompts * group_size
    lengths = rng.integers(1, length + 1, size=b)
    mask = jnp.asarray(np.arange(length)[None, :] < lengths[:, None], jnp.float32)
    theta = jnp.asarray(rng.normal(size=(b, length, vocab)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, vocab, size=(b, length)))
    logp = token_logprobs(theta, tokens)
    noise = lambda scale: jnp.asarray(rng.normal(scale=scale, size=(b, length)), jnp.float32)  # noqa: E731
    batch = Batch(mask=mask, rewards=jnp.asarray(rng.integers(0, 2, size=b), jnp.float32), logp=logp,
                  old_logp=logp + noise(0.2), ref_logp=logp + noise(0.1), values=noise(0.5),
                  greedy_rewards=jnp.asarray(rng.integers(0, 2, size=b), jnp.float32), group_size=group_size)
    return batch, theta, tokens


def loss_and_grad_norm(algo, batch, theta, tokens, hp):
    """Loss, metrics and the norm of d loss / d theta for one setting ``hp``."""
    def f(th):
        return algo.loss(batch.replace(logp=token_logprobs(th, tokens)), hp)
    (value, metrics), grad = jax.value_and_grad(f, has_aux=True)(theta)
    return value, metrics, jnp.linalg.norm(grad)


def presets_table(batch, theta, tokens) -> str:
    rows = []
    for name, algo in PRESETS.items():
        value, metrics, norm = jax.jit(loss_and_grad_norm, static_argnums=0)(algo, batch, theta, tokens,
                                                                            algo.hparams)
        m = finalize_metrics(metrics)
        rows.append([name, algo.spec.equation, f"{float(value):+.4f}", f"{float(norm):.4f}",
                     f"{float(m['clip_fraction']):.3f}", f"{float(m['approx_kl_mean']):.4f}"])
    return markdown.table(["preset", "eq.", "loss", "grad norm", "clip fraction", "approx KL(old, new)"], rows,
                          align="llrrrr")


def ablation_table(batch, theta, tokens) -> str:
    algo = preset("grpo")
    grid, settings = hparam_grid(algo.hparams, divide_by_std=[1.0, 0.0], divide_by_length=[1.0, 0.0],
                                 leave_one_out=[0.0, 1.0], kl_coef=[0.04, 0.0])
    sweep = jax.jit(jax.vmap(loss_and_grad_norm, in_axes=(None, None, None, None, 0)), static_argnums=0)
    values, _, norms = sweep(algo, batch, theta, tokens, grid)
    return markdown.table(["/ std", "/ |o|", "leave-one-out", "KL coef", "loss", "grad norm"],
                          [[f"{s['divide_by_std']:g}", f"{s['divide_by_length']:g}", f"{s['leave_one_out']:g}",
                            f"{s['kl_coef']:g}", f"{float(v):+.4f}", f"{float(n):.4f}"]
                           for s, v, n in zip(settings, values, norms, strict=True)], align="llllrr")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", action="store_true", help="print the algorithm table and exit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32)
    args = parser.parse_args(argv)
    if args.table:
        print(algorithm_table())
        return
    batch, theta, tokens = synthetic_batch(args.seed, args.prompts, args.group_size, args.length, args.vocab)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; batch: {args.prompts} prompts x "
          f"K={args.group_size} responses, up to {args.length} tokens\n")
    print("Every preset on one batch (loss to minimise; gradient w.r.t. the policy logits):\n")
    print(presets_table(batch, theta, tokens))
    print("\nGRPO's switches as one vmapped grid (16 settings, one compiled call; "
          "row 1 is GRPO eq. 18, the row with all switches off but leave-one-out is eq. 19):\n")
    print(ablation_table(batch, theta, tokens))


if __name__ == "__main__":
    main()
