"""Accelerator benchmark of a Qwen2.5-0.5B-shaped policy in bfloat16: update-step MFU, sampler
tokens/s against the memory-bandwidth bound, and peak memory of the log-prob gradient.

Random weights (never a download): family qwen2, vocab V = 151936, hidden h = 896, intermediate
4864, L = 24 layers, 14 heads (2 kv) of 64, tied embeddings, bfloat16 parameters and compute.
Everything runs on a (data, fsdp, tensor) mesh over all of ``jax.devices()`` (``--data/--fsdp/
--tensor``; default data-parallel); ``--tiny`` is a CPU smoke test of the same code path.
Times are medians of ``--repeats`` calls after one warm-up (compiling) call, each ended by
``jax.block_until_ready``. Rows of the table:

1. update step: ``Learner.update`` (GRPO preset, group size K, ``optax.adamw``) on a rollout of
   B sequences x T tokens (a P-token prompt, then N = T - P response tokens, all counted).
   Model FLOPs (PaLM's MFU convention: training = 3 x forward, causal mask not discounted,
   embedding lookup free, the chunked head's backward recompute not counted):

       forward = B T (2 N_body + 4 L T d_attn) + B N (2 h V)
       update  = 3 x forward x epochs     (micro-batching, ``--micro-batches``, changes nothing)

   N_body = parameters outside the embedding / unembedding, d_attn = heads x head_dim (scores
   q k^T and probs v are 2 T d_attn FLOPs each per token and layer), 2 h V = the LM head matmul,
   applied to the N predicted positions (also when tied). MFU = update / time / (peak x devices).
   ``prepare`` (old and reference log-probs: 2 forwards, not part of the update) is its own row.
2. sampler: ``generate`` of b rows x n new tokens from random P-token prompts (temperature 1;
   EOS = V - 1, so rows practically never stop early; tokens = b x decode steps actually run).
   Bandwidth bound: decode step j reads every weight once (the embedding only as the LM head
   when tied) and the KV cache so far, P + j + 1 slots of 2 L kv_heads head_dim values a row.
   Per device (rows split over data x fsdp, weights and KV heads over tensor; fsdp gathers
   whole weights):

       bytes = (n W + b / (data fsdp) C (n P + n (n + 1) / 2)) / tensor,   tokens/s <= b n BW / bytes

   (W weight bytes, C KV bytes per slot and row, BW one device's HBM bandwidth). Prefill time
   is in the measurement, not in the bound. pgjax's decode attends over the whole
   preallocated cache (P + n slots) every step, which this ideal bound does not charge.
3. log-prob gradient: ``jax.value_and_grad`` w.r.t. (hidden, W) of sum(logp) + 0.01 sum(entropy)
   for M tokens through the same head, plain ``token_logprobs`` over [M, V] logits vs
   ``chunked_logprobs_and_entropy`` (functions of benchmarks/logprob_memory.py): XLA's compiled
   temp memory, and on GPU/TPU the device's ``peak_bytes_in_use`` (a process-wide high-water mark:
   this section runs first, chunked before plain; it includes the inputs and compile-time scratch).

Peak bf16 dense FLOP/s and HBM bandwidth per device come from ``SPECS`` by
``device_kind`` (override with ``--peak-flops`` / ``--hbm-bandwidth``); unknown devices (CPU)
get "n/a" fractions.

    python benchmarks/accelerator.py --json benchmarks/results/accelerator_h100.json   # 0.5B, on the accelerator
    python benchmarks/accelerator.py --attention cudnn        # cuDNN's fused attention (NVIDIA GPU)
    python benchmarks/accelerator.py --fsdp 8 --data 1        # parameters sharded over 8 devices
    python benchmarks/accelerator.py --tiny --repeats 1       # CPU smoke test (< 1 min)

``--json`` saves the table with the machine, the devices and the commit (``readme_tables.save_table``),
for ``python benchmarks/readme_tables.py`` to paste into docs/benchmarks.md.
"""
import argparse
import math
import os
import re
import shlex
import statistics
import sys

import jax
import jax.numpy as jnp
import measure
import numpy as np
import optax
from flax import nnx

# benchmarks/ is sys.path[0] when this file runs as a script
from logprob_memory import compile_value_and_grad, make_losses, memory, time_call
from readme_tables import save_table

from pgjax import core, markdown
from pgjax.checks import ConfigError
from pgjax.config import UpdateConfig
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.parallel import mesh as mesh_lib
from pgjax.rollout.batch import Rollout
from pgjax.sample import SamplingConfig, generate
from pgjax.train.learner import Learner

MIB = 2.0 ** 20
QWEN25_05B = {"family": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
              "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64,
              "rope_theta": 1e6, "tie_word_embeddings": True, "param_dtype": "bfloat16", "compute_dtype": "bfloat16"}
TINY = {**QWEN25_05B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
# 4 micro-batches of 16 x 512 tokens: XLA:CPU's buffer assignment of this update step (compiled, not run)
# needs 39 GiB of temporaries, 2 micro-batches 139 GiB; the state (params, reference, Adam) is 3.7 GiB.
FULL_SIZES = {"batch": 64, "seq": 512, "prompt_tokens": 64, "micro_batches": 4, "sampler_batch": 64,
              "new_tokens": 256, "logprob_tokens": 8192, "chunk_size": 1024}
TINY_SIZES = {"batch": 16, "seq": 32, "prompt_tokens": 8, "micro_batches": 1, "sampler_batch": 8, "new_tokens": 16,
              "logprob_tokens": 256, "chunk_size": 64}

# Vendor spec sheets, per device: bf16 dense FLOP/s (no sparsity) and HBM bytes/s. First match of
# the pattern in device_kind (lower case) wins. NVIDIA H100/H200/A100/L4 datasheets; Google Cloud
# TPU system-architecture pages (v5e reports "TPU v5 lite", v6e "TPU v6 lite", v5p "TPU v5").
SPECS = [
    (r"h200", 989e12, 4.8e12),
    (r"h100.*pcie", 756e12, 2.0e12),
    (r"h100", 989e12, 3.35e12),          # SXM
    (r"a100.*40gb", 312e12, 1.555e12),
    (r"a100", 312e12, 2.0e12),           # 80GB
    (r"\bl4\b", 121e12, 0.3e12),
    (r"v6 ?(lite|e)", 918e12, 1.64e12),
    (r"v5 ?(lite|e)", 197e12, 0.82e12),
    (r"v5", 459e12, 2.76e12),            # v5p
    (r"v4", 275e12, 1.2e12),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model and sizes (CPU smoke test)")
    p.add_argument("--repeats", type=int, default=3, help="timed calls after one warm-up")
    p.add_argument("--batch", type=int, help=f"B, update rows (default {FULL_SIZES['batch']})")
    p.add_argument("--seq", type=int, help=f"T, tokens per update row (default {FULL_SIZES['seq']})")
    p.add_argument("--prompt-tokens", type=int, help=f"P, prompt part of T and sampler prompt length "
                                                     f"(default {FULL_SIZES['prompt_tokens']})")
    p.add_argument("--group-size", type=int, default=8, help="K, GRPO samples per prompt")
    p.add_argument("--micro-batches", type=int, help="gradient-accumulation micro-batches of the update "
                                                     f"(default {FULL_SIZES['micro_batches']})")
    p.add_argument("--chunk-size", type=int, help=f"chunked log-prob chunk (default {FULL_SIZES['chunk_size']})")
    p.add_argument("--sampler-batch", type=int, help=f"b, sampler rows (default {FULL_SIZES['sampler_batch']})")
    p.add_argument("--new-tokens", type=int, help=f"n, sampled tokens per row (default {FULL_SIZES['new_tokens']})")
    p.add_argument("--logprob-tokens", type=int, help=f"M (default {FULL_SIZES['logprob_tokens']})")
    p.add_argument("--data", type=int, default=-1, help="mesh data axis (-1: the rest)")
    p.add_argument("--fsdp", type=int, default=1, help="mesh fsdp axis")
    p.add_argument("--tensor", type=int, default=1, help="mesh tensor axis")
    p.add_argument("--peak-flops", type=float, help="per-device peak FLOP/s (overrides SPECS)")
    p.add_argument("--hbm-bandwidth", type=float, help="per-device HBM bytes/s (overrides SPECS)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--attention", choices=("einsum", "cudnn"), default="einsum",
                   help="model.attention: the einsum, or cuDNN's fused attention (an NVIDIA GPU)")
    p.add_argument("--json", help="save the table and its provenance here (benchmarks/results/NAME.json)")
    args = p.parse_args(argv)
    for name, value in (TINY_SIZES if args.tiny else FULL_SIZES).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not 0 < args.prompt_tokens < args.seq or args.batch % args.group_size:
        p.error("need 0 < prompt tokens < seq and batch a multiple of group size")
    return args


def device_specs(kind, args):
    """(peak FLOP/s, HBM bytes/s) of one device of ``kind``; None where unknown."""
    match = next(((f, b) for pattern, f, b in SPECS if re.search(pattern, kind.lower())), (None, None))
    return args.peak_flops or match[0], args.hbm_bandwidth or match[1]


def peak_bytes():
    """Device 0's ``peak_bytes_in_use`` (None where the backend keeps no statistics, e.g. CPU)."""
    stats = jax.devices()[0].memory_stats()
    return stats.get("peak_bytes_in_use") if stats else None


def fmt_peak(peak):
    return "device peak n/a" if peak is None else f"device peak {peak / MIB:,.1f} MiB"


def timed(fn, repeats):
    """(median seconds of ``repeats`` calls, seconds of the warm-up call) of ``fn`` (which blocks)."""
    warm, seconds = measure.call_times(fn, repeats)
    return statistics.median(seconds), warm


def build_policy(config, mesh):
    """A random ``CausalLM`` initialised by one jitted program straight into the mesh's shardings."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: CausalLM(config, nnx.Rngs(0))))
    init = jax.jit(lambda: nnx.state(CausalLM(config, nnx.Rngs(0))), out_shardings=mesh_lib.shardings(abstract, mesh))
    return nnx.merge(graphdef, init())


def param_counts(policy):
    """(total, body) parameter counts; body excludes the embedding and an untied LM head."""
    c = policy.config
    total = sum(x.size for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))
    head = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return total, total - head


def forward_flops(c, body, rows, seq, predicted):
    """Model FLOPs of one teacher-forced forward (see the module docstring)."""
    d_attn = c.num_attention_heads * c.head_dim
    head = 2 * c.hidden_size * c.vocab_size
    return rows * seq * (2 * body + 4 * c.num_hidden_layers * seq * d_attn) + rows * predicted * head


def logprob_rows(c, args):
    """Table rows of the plain vs chunked log-prob gradient (runs first: see ``peak_bytes``)."""
    m, h, v, dtype = args.logprob_tokens, c.hidden_size, c.vocab_size, jnp.dtype(c.param_dtype)
    shapes = (jax.ShapeDtypeStruct((m, h), dtype), jax.ShapeDtypeStruct((h, v), dtype),
              jax.ShapeDtypeStruct((m,), jnp.int32))
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    inputs = jax.block_until_ready(jax.jit(lambda: (
        jax.random.normal(k1, (m, h), dtype), (jax.random.normal(k2, (h, v)) / h ** 0.5).astype(dtype),
        jax.random.randint(k3, (m,), 0, v, jnp.int32)))())
    plain_loss, chunked_loss = make_losses(1.0)
    chunked = lambda hh, ww, tt: chunked_loss(hh, ww, tt, args.chunk_size)  # noqa: E731
    results = {}
    for name, fn in ((f"chunked ({args.chunk_size})", chunked), ("plain logits", plain_loss)):
        compiled, _ = compile_value_and_grad(fn, shapes)
        seconds, _ = time_call(compiled, inputs, args.repeats)
        results[name] = (seconds, (memory(compiled) or {}).get("temp_size_in_bytes"), peak_bytes())
        print(f"log-prob {name}: {seconds:.4f} s, memory {results[name][1:]}", flush=True)
        del compiled
    plain_temp = results["plain logits"][1]
    rows = []
    for name in reversed(results):
        seconds, temp, peak = results[name]
        ratio = f"{temp / plain_temp:.3f} x plain temp" if temp is not None and plain_temp else "n/a"
        rows.append((f"log-prob grad, {name}", f"M={m} x V={v}, {dtype.name}", seconds,
                     "temp n/a" if temp is None else f"temp {temp / MIB:,.1f} MiB",
                     fmt_peak(peak), ratio))
    return rows


def sampler_row(policy, args, mesh, bandwidth):
    c, b, n, p = policy.config, args.sampler_batch, args.new_tokens, args.prompt_tokens
    eos = c.vocab_size - 1
    prompts = np.random.default_rng(args.seed).integers(1, eos, (b, p))
    config = SamplingConfig(max_new_tokens=n, eos_ids=(eos,), pad_id=0, temperature=1.0)
    out = {}

    def run():
        out["samples"] = jax.block_until_ready(generate(policy, prompts, np.ones_like(prompts),
                                                        jax.random.key(args.seed), config, mesh=mesh))

    seconds, _ = timed(run, args.repeats)
    steps = int(out["samples"].lengths.max())  # the while loop ran this many decode steps
    rate = b * steps / seconds
    # Per device and decode step: the weights split over `tensor` (fsdp gathers them whole), the KV cache of
    # its b / (data x fsdp) rows split over `tensor`.
    tensor, rows = mesh.shape["tensor"], b / mesh_lib.batch_shards(mesh)
    weights = sum(x.nbytes for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))
    if not c.tie_word_embeddings:
        weights -= policy.embed[...].nbytes  # only b rows of the input embedding are read
    slot = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * jnp.dtype(c.compute_dtype).itemsize
    device_bytes = (steps * weights + rows * slot * (steps * p + steps * (steps + 1) / 2)) / tensor
    bound = b * steps * bandwidth / device_bytes if bandwidth else None
    print(f"sampler: {seconds:.4f} s, {steps} steps, {device_bytes / steps / MIB:,.1f} MiB read per device "
          f"and step on average, {fmt_peak(peak_bytes())}", flush=True)
    return ("sampler (generate)", f"b={b} x n={steps} new, P={p} prompt", seconds, f"{rate:,.0f} tok/s",
            "bound n/a" if bound is None else f"{bound:,.0f} tok/s (HBM bound)",
            "n/a" if bound is None else f"{rate / bound:.1%} of bound")


def make_learner(policy, args, mesh):
    return Learner(policy, core.preset("grpo"), args.group_size,
                   UpdateConfig(micro_batches=args.micro_batches, chunk_size=args.chunk_size),
                   optax.adamw(1e-6), None, use_reference=True, mesh=mesh)


def update_rows(policy, args, mesh, peak, devices, body):
    c, b, t, p = policy.config, args.batch, args.seq, args.prompt_tokens
    algo = core.preset("grpo")
    learner = make_learner(policy, args, mesh)
    state = learner.init_state(policy, jax.random.PRNGKey(args.seed))  # placed on the mesh
    rng = np.random.default_rng(args.seed)
    rollout = mesh_lib.shard_batch(Rollout(
        tokens=jnp.asarray(rng.integers(0, c.vocab_size, (b, t)), jnp.int32),
        attention_mask=jnp.ones((b, t), jnp.int32),
        batch=core.Batch(mask=jnp.ones((b, t - p), jnp.float32), logp=None, group_size=args.group_size,
                         rewards=jnp.asarray(rng.integers(0, 2, b), jnp.float32))), mesh)
    out = {}

    def prepare():
        out["rollout"] = jax.block_until_ready(learner.prepare(state, rollout, algo.hparams))

    def update():
        nonlocal state
        state, metrics = learner.update(state, out["rollout"], algo.hparams)
        jax.block_until_ready((state, metrics))
        out["loss"] = float(metrics["policy_loss"])

    forward = forward_flops(c, body, b, t, t - p)
    rows = []
    for name, fn, flops in (("prepare (old + ref log-probs)", prepare, 2 * forward),
                            ("update step (GRPO, AdamW)", update, 3 * forward * learner.update_config.epochs)):
        seconds, warm = timed(fn, args.repeats)
        achieved = flops / seconds
        print(f"{name}: {seconds:.4f} s (warm-up {warm:.1f} s), {flops:.3e} FLOP, {fmt_peak(peak_bytes())}",
              flush=True)
        rows.append((name, f"B={b} x T={t} (P={p}), {flops:.3e} FLOP", seconds, f"{achieved / 1e12:.4g} TFLOP/s",
                     "peak n/a" if peak is None else f"{peak * devices / 1e12:,.0f} TFLOP/s",
                     f"MFU {'n/a' if peak is None else f'{achieved / (peak * devices):.1%}'}"))
    assert math.isfinite(out["loss"]), out["loss"]
    return rows[::-1]


def main(argv=None):
    args = parse_args(argv)
    config = ModelConfig(**(TINY if args.tiny else QWEN25_05B), attention=args.attention)
    try:
        CausalLM(ModelConfig(**TINY, attention=args.attention), nnx.Rngs(0))   # refuses what this backend lacks
    except ConfigError as error:
        print(f"accelerator.py: {error}", file=sys.stderr)
        sys.exit(2)
    mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(args.data, args.fsdp, args.tensor))
    devices, kind = len(jax.devices()), jax.devices()[0].device_kind
    peak, bandwidth = device_specs(kind, args)
    print("command: " + " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + sys.argv))
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, {devices} x {kind!r}, mesh {dict(mesh.shape)}; "
          f"per device: peak {peak or 'n/a'} FLOP/s, HBM {bandwidth or 'n/a'} B/s; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus", flush=True)

    rows = logprob_rows(config, args)
    policy = build_policy(config, mesh)
    total, body = param_counts(policy)
    print(f"model: {config}\nparameters: {total:,} ({body:,} outside the {config.vocab_size} x "
          f"{config.hidden_size} embedding{'' if config.tie_word_embeddings else ' and LM head'})", flush=True)
    rows.insert(0, sampler_row(policy, args, mesh, bandwidth))
    rows[:0] = update_rows(policy, args, mesh, peak, devices, body)

    note = (f"{devices} x {kind}, jax {jax.__version__} ({jax.default_backend()}), mesh {dict(mesh.shape)}, "
            f"attention {args.attention}; median of {args.repeats} after one warm-up; GRPO group size "
            f"{args.group_size}, {args.micro_batches} micro-batch(es), chunk {args.chunk_size}.")
    table = markdown.table(["measurement", "shape", "time (s)", "achieved", "peak / bound", "fraction"],
                           [[name, shape, f"{seconds:.4f}", achieved, reference, fraction]
                            for name, shape, seconds, achieved, reference, fraction in rows], align="llrrrr")
    save_table(args.json, sys.argv[1:] if argv is None else argv, [*table.splitlines(), "", note],
               rows=[dict(zip(("measurement", "shape", "seconds", "achieved", "reference", "fraction"), row,
                              strict=True)) for row in rows])


if __name__ == "__main__":
    main()
