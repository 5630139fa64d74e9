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

from pgjax.core import PRESETS, Batch, algorithm_table, finalize_metrics, hparam_grid, preset, token_logprobs


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
    rows = ["| preset | eq. | loss | grad norm | clip fraction | approx KL(old, new) |",
            "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name, algo in PRESETS.items():
        value, metrics, norm = jax.jit(loss_and_grad_norm, static_argnums=0)(algo, batch, theta, tokens,
                                                                            algo.hparams)
        m = finalize_metrics(metrics)
        rows.append(f"| {name} | {algo.spec.equation} | {float(value):+.4f} | {float(norm):.4f} "
                    f"| {float(m['clip_fraction']):.3f} | {float(m['approx_kl_mean']):.4f} |")
    return "\n".join(rows)


def ablation_table(batch, theta, tokens) -> str:
    algo = preset("grpo")
    grid, settings = hparam_grid(algo.hparams, divide_by_std=[1.0, 0.0], divide_by_length=[1.0, 0.0],
                                 leave_one_out=[0.0, 1.0], kl_coef=[0.04, 0.0])
    sweep = jax.jit(jax.vmap(loss_and_grad_norm, in_axes=(None, None, None, None, 0)), static_argnums=0)
    values, _, norms = sweep(algo, batch, theta, tokens, grid)
    rows = ["| / std | / \\|o\\| | leave-one-out | KL coef | loss | grad norm |",
            "| --- | --- | --- | --- | ---: | ---: |"]
    for s, v, n in zip(settings, values, norms, strict=True):
        rows.append(f"| {s['divide_by_std']:g} | {s['divide_by_length']:g} | {s['leave_one_out']:g} "
                    f"| {s['kl_coef']:g} | {float(v):+.4f} | {float(n):.4f} |")
    return "\n".join(rows)


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
