"""Generated tokens per second: pgjax's jitted sampler vs transformers' PyTorch ``generate``.

Both sample from the same tiny random Qwen2 model (built with transformers, saved to a
temporary directory and loaded into pgjax with ``pgjax.models.hf.load``, float32) on the
same CPU, in one process: random 8-token prompts, pure sampling at temperature 1 from the
full distribution (top-k and top-p off for both), for every batch size x number of new
tokens. Both stop a row at the same EOS id and stop the batch once every row has ended
(pgjax's while_loop and transformers' stopping criteria alike), so both do the same work;
generated tokens are the real response tokens (up to and including the first EOS, else all
of them; pgjax: ``Samples.lengths``). With a random model EOS is rare, so nearly every row
runs to the token budget. Tokens per second = generated tokens / wall time of one
``generate`` call (after ``jax.block_until_ready``), median of ``--repeats`` calls after one
warm-up call that also compiles pgjax's program. The ratio is pgjax / transformers. Torch
keeps its default thread count; on a busy machine its numbers collapse (spinning threads),
so the header prints the load average.

    python benchmarks/sampler.py [--batches 1 64 256] [--new-tokens 16 64] [--repeats 3]

Issue target: ratio >= 4 at batch 64.
"""
import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np
import torch
import transformers

from pgjax.models import hf
from pgjax.sample import SamplingConfig, generate


def timed(fn, count, repeats):
    """Median of count(output) / seconds over ``repeats`` calls of ``fn``, after one warm-up call."""
    fn()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        rates.append(count(out) / (time.perf_counter() - start))
    return statistics.median(rates)


def build_models(args, directory):
    """The same random weights as a transformers (PyTorch) model and a pgjax model."""
    torch.manual_seed(args.seed)
    config = transformers.Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prompt_length + max(args.new_tokens))
    ref = transformers.AutoModelForCausalLM.from_config(config).eval()
    transformers.utils.logging.disable_progress_bar()
    ref.save_pretrained(directory)
    return ref, hf.load(directory)


def logits_gap(ref, model, prompts):
    """Max |logit difference| of the two models on ``prompts``: a check that they are the same model."""
    with torch.no_grad():
        expected = ref(torch.from_numpy(prompts)).logits.numpy()
    return float(np.abs(np.asarray(model(prompts)) - expected).max())


def pgjax_rate(model, prompts, new_tokens, eos, seed, repeats):
    config = SamplingConfig(max_new_tokens=new_tokens, eos_ids=(eos,), pad_id=0, temperature=1.0)
    mask, key = np.ones_like(prompts), jax.random.key(seed)
    run = lambda: jax.block_until_ready(generate(model, prompts, mask, key, config))
    return timed(run, lambda samples: int(samples.lengths.sum()), repeats)


def transformers_rate(ref, prompts, new_tokens, eos, repeats):
    input_ids = torch.from_numpy(prompts)

    def run():
        with torch.no_grad():
            return ref.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=True,
                                temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                eos_token_id=eos, pad_token_id=0)

    return timed(run, lambda out: response_tokens(out[:, prompts.shape[1]:], eos), repeats)


def response_tokens(response, eos):
    """Tokens up to and including each row's first EOS (all of them in rows without one)."""
    is_eos = response == eos
    ended = is_eos.any(dim=1)
    lengths = torch.where(ended, is_eos.int().argmax(dim=1) + 1, response.shape[1])
    return int(lengths.sum())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--prompt-length", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    eos = args.vocab - 1
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as directory:
        ref, model = build_models(args, directory)
    check = rng.integers(1, eos, (2, args.prompt_length))
    print(f"jax {jax.__version__} on {jax.devices()}; torch {torch.__version__} with "
          f"{torch.get_num_threads()} threads; transformers {transformers.__version__}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"Qwen2: vocab {args.vocab}, hidden {args.hidden}, intermediate {args.intermediate}, "
          f"{args.layers} layers, {args.heads} heads ({args.kv_heads} kv), float32; "
          f"{args.prompt_length}-token prompts; temperature 1, no top-k/top-p; EOS {eos}; "
          f"median of {args.repeats}; max |logit gap| {logits_gap(ref, model, check):.1e}\n")
    print("| batch | new tokens | pgjax tok/s | transformers tok/s | ratio |\n| ---: | ---: | ---: | ---: | ---: |")
    for batch in args.batches:
        prompts = rng.integers(1, eos, (batch, args.prompt_length))
        for new_tokens in args.new_tokens:
            ours = pgjax_rate(model, prompts, new_tokens, eos, args.seed, args.repeats)
            theirs = transformers_rate(ref, prompts, new_tokens, eos, args.repeats)
            print(f"| {batch} | {new_tokens} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.1f} |", flush=True)


if __name__ == "__main__":
    main()
