"""Training-step time of pgjax vs PyTorch on the same model: forward + backward + AdamW step
of a 64 x 32 token batch, in ms / step and as a ratio to PyTorch eager, measured in one process.

The model is a small random Qwen2 (``transformers`` ``from_config``, saved to a temporary
directory) loaded in float32 by both ``pgjax.models.hf.load`` and ``AutoModelForCausalLM.
from_pretrained``. Every row runs the same step on the same batch (random tokens, full
attention mask m):

    loss = -sum_{b,t} A[b,t] m[b,t] log pi(x[b,t+1] | x[b,<=t]) / sum_{b,t} m[b,t]

with fixed random advantages A (a policy-gradient surrogate), then one AdamW update of every
parameter (lr 1e-4, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; ``optax.adamw`` and
``torch.optim.AdamW``).

Rows:
  pgjax, logits:   ``model(tokens, mask)`` -> [B, T, V] logits -> ``token_logprobs``.
  pgjax, chunked:  ``scoring.response_logprobs`` (final hidden states ->
                   ``chunked_logprobs_and_entropy``; its entropy is computed but unused).
  torch eager:     the HF model, ``log_softmax`` + ``gather``, ``loss.backward()``,
                   ``opt.step()``, ``opt.zero_grad(set_to_none=True)``.
  torch.compile:   the same with model forward + loss compiled (default inductor backend),
                   backward and optimizer as in eager (skip with ``--no-compile``).

The pgjax step is one ``jax.jit`` function over (params, opt_state) from
``nnx.split(model, nnx.Param)`` with ``donate_argnums``: the functional NNX style, so no graph
traversal per call (``nnx.Optimizer`` + ``nnx.jit`` computes the same and timed the same within
noise at this size). Before timing, the losses of each row's first two steps (the initial weights,
then after one AdamW update) must match torch eager to 1e-4; those steps are also the warm-up
(compilation). Then ``--repeats`` rounds each time ``--steps`` consecutive steps of every row in
turn (interleaved, so machine noise hits all rows alike); a row's time is its median round.
A ratio above 1 means slower than torch eager.

    python benchmarks/train_step.py [--steps 5] [--repeats 5] [--no-compile]
"""
import argparse
import statistics
import tempfile
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from flax import nnx

from pgjax.core import token_logprobs
from pgjax.models import hf, scoring

MODEL = {"vocab_size": 2048, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
ADAMW = {"learning_rate": 1e-4, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "weight_decay": 0.01}
LOSS_TOLERANCE = 1e-4


def save_random_model(directory, seed):
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(**MODEL)).save_pretrained(directory)


def make_batch(batch, length, seed):
    """Token ids [B, T], a full attention mask [B, T] and advantages [B, T - 1], as NumPy arrays."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, MODEL["vocab_size"], (batch, length), dtype=np.int64)
    return tokens, np.ones_like(tokens), rng.standard_normal((batch, length - 1)).astype(np.float32)


def surrogate(logp, mask, advantages, xp):
    """Masked mean of -A * log pi over the predicted tokens (``xp``: jnp or torch)."""
    m = mask[:, 1:]
    return -xp.sum(advantages * logp * m) / xp.sum(m)


def pgjax_logits_loss(model, tokens, mask, advantages):
    logp = token_logprobs(model(tokens, mask)[:, :-1], tokens[:, 1:])
    return surrogate(logp, mask, advantages, jnp)


def pgjax_chunked_loss(model, tokens, mask, advantages):
    logp, _ = scoring.response_logprobs(model, tokens, mask, prompt_length=1)
    return surrogate(logp, mask, advantages, jnp)


def torch_loss(model, tokens, mask, advantages):
    logits = model(input_ids=tokens, attention_mask=mask, use_cache=False).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    return surrogate(logp, mask, advantages, torch)


def pgjax_trainer(directory, loss_fn, batch):
    """A no-argument function running one jitted training step of a fresh pgjax model; returns the loss."""
    graphdef, params = nnx.split(hf.load(directory), nnx.Param)
    tx = optax.adamw(**ADAMW)
    batch = tuple(map(jnp.asarray, batch))  # int64 ids become int32 (x64 off)

    @partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(nnx.merge(graphdef, p), *batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    state = (params, tx.init(params))

    def run():
        nonlocal state
        *state, loss = step(*state, batch)
        return loss

    return run


def torch_trainer(directory, batch, compile_loss):
    """The same for a fresh HF model in float32, eager or with ``torch.compile``'d forward + loss."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ADAMW["learning_rate"], betas=(ADAMW["b1"], ADAMW["b2"]),
                            eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"])
    loss_fn = torch.compile(torch_loss) if compile_loss else torch_loss
    batch = tuple(map(torch.from_numpy, batch))

    def run():
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return run


def check_same_losses(runs, reference):
    """Run two steps of every trainer (the warm-up), assert each one's losses match ``reference``'s;
    returns ``reference``'s losses and the largest gap."""
    losses = {name: [float(run()) for _ in range(2)] for name, run in runs.items()}
    gaps = {name: max(abs(a - b) for a, b in zip(values, losses[reference])) for name, values in losses.items()}
    for name, gap in gaps.items():
        assert gap <= LOSS_TOLERANCE, f"{name} losses {losses[name]} vs {reference} {losses[reference]}"
    return losses[reference], max(gaps.values())


def timed(runs, steps, repeats):
    """Median over ``repeats`` interleaved rounds of each trainer's seconds per step (``steps`` in a row)."""
    times = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(steps):
                loss = run()
            float(loss)  # waits for JAX's asynchronous dispatch
            times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    batch = make_batch(args.batch, args.length, args.seed)
    with tempfile.TemporaryDirectory() as directory:
        save_random_model(directory, args.seed)
        runs = {"torch eager": torch_trainer(directory, batch, compile_loss=False),
                "pgjax, logits": pgjax_trainer(directory, pgjax_logits_loss, batch),
                "pgjax, chunked": pgjax_trainer(directory, pgjax_chunked_loss, batch)}
        if not args.no_compile:
            runs["torch.compile"] = torch_trainer(directory, batch, compile_loss=True)
    losses, gap = check_same_losses(runs, "torch eager")
    times = timed(runs, args.steps, args.repeats)
    print(f"Qwen2 {MODEL}; batch {args.batch} x {args.length} tokens; float32; AdamW {ADAMW}")
    print(f"jax {jax.__version__} {jax.devices()}; torch {torch.__version__} with {torch.get_num_threads()} threads; "
          f"losses of the first two steps {losses[0]:.6f}, {losses[1]:.6f} (rows differ by <= {gap:.1e}); "
          f"median of {args.repeats} rounds of {args.steps} steps\n")
    print("| implementation | ms / step | ratio vs torch eager |\n| --- | ---: | ---: |")
    for name, seconds in times.items():
        print(f"| {name} | {1e3 * seconds:.1f} | {seconds / times['torch eager']:.2f} |")


if __name__ == "__main__":
    main()
