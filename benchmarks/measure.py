"""What the CPU benchmarks share: the machine's float32 matmul peak, a model's FLOPs, and a check
that pgjax and PyTorch hold the same model.

Model FLOPs count the work a token needs, the same for every implementation: a forward pass
costs 2 M per token (M: the parameters used as matmul weights; a tied embedding counts once, as
the unembedding) plus 4 L H Dh per causal (query, key) pair; a training step (forward + backward)
is 3 forwards. MFU is achieved model FLOP/s over the measured peak.

PyTorch is imported only by the functions that compare with it, so a machine without it (the
accelerator script's) can use the rest.
"""
import argparse
import functools
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pgjax.evaluation import statistics as stats
from pgjax.machine import peak_resident_bytes


def matmul_peak(size=2048, repeats=10) -> dict:
    """Float32 FLOP/s of a size^3 matmul: ``jnp.dot`` (jitted) and ``torch.mm``, the best of ``repeats``
    (a peak: on this shared machine one slow call, or a median of them, can read half the rate)."""
    import torch
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    dot = jax.jit(jnp.dot)
    x = jnp.asarray(a)
    ta = torch.from_numpy(a)

    def rate(fn):
        return 2 * size ** 3 / min(call_times(fn, repeats)[1])

    return {"jnp.dot": rate(lambda: dot(x, x).block_until_ready()), "torch.mm": rate(lambda: torch.mm(ta, ta))}


def memory_bandwidth(mib=512, repeats=5) -> float:
    """Bytes/s a jitted ``jnp.sum`` reads of a float32 array of ``mib`` MiB (far above the caches), the
    best of ``repeats``: the memory side of a roofline."""
    x = jnp.ones((mib << 18,), jnp.float32)
    total = jax.jit(jnp.sum)
    return x.nbytes / min(call_times(lambda: total(x).block_until_ready(), repeats)[1])


def call_times(fn, repeats: int) -> tuple[float, list[float]]:
    """(seconds of a warm-up call, seconds of each of ``repeats`` further calls) of ``fn`` (which blocks)."""
    start = time.perf_counter()
    fn()
    warm = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return warm, times


def kernel_cost(before, per: int = 1) -> dict:
    """Kernel (system) seconds and minor page faults of this process since ``before`` (a
    ``resource.getrusage``), divided by ``per`` (steps): the cost of host memory faulted in."""
    now = resource.getrusage(resource.RUSAGE_SELF)
    return {"system_s": (now.ru_stime - before.ru_stime) / per,
            "minor_faults": (now.ru_minflt - before.ru_minflt) / per}


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, GiB (``pgjax.machine.peak_resident_bytes``)."""
    return peak_resident_bytes() / 2 ** 30


def forward_flops(model) -> callable:
    """``flops(length)``: model FLOPs of one causal forward pass of ``model`` (a pgjax ``CausalLM``)
    over a sequence of ``length`` tokens."""
    c = model.config
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    per_token = 2 * (params - (0 if c.tie_word_embeddings else c.vocab_size * c.hidden_size))
    per_pair = 4 * c.num_hidden_layers * c.num_attention_heads * c.head_dim
    return lambda length: per_token * length + per_pair * length * (length + 1) / 2


def logits_gap(ref, model, tokens, mask) -> float:
    """Max |logit difference| of the transformers model ``ref`` and the pgjax ``model`` on the real
    tokens of the left-padded ``tokens`` [B, T] (NumPy, with ``mask``): are they the same model?"""
    import torch
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)         # left padding: count from the first token
    with torch.no_grad():
        expected = ref(torch.from_numpy(tokens).long(), attention_mask=torch.from_numpy(mask).long(),
                       position_ids=torch.from_numpy(positions).long()).logits.numpy()
    real = mask.astype(bool)
    return float(np.abs(np.asarray(model(tokens, mask))[real] - expected[real]).max())


def wrap_method(obj, name: str, before=None, after=None) -> None:
    """Replace the bound method ``obj.name`` by one that calls ``before(*args, **kwargs)`` first (when
    given) and returns ``after(result, seconds)``: how the matched-work harnesses split a peer's step
    into its parts without editing the peer."""
    method = getattr(obj, name)

    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        if before:
            before(*args, **kwargs)
        start = time.perf_counter()
        result = method(*args, **kwargs)
        return after(result, time.perf_counter() - start)

    setattr(obj, name, wrapped)


def add_harness_arguments(parser: argparse.ArgumentParser, other: str) -> None:
    """The options of the matched-work GRPO harnesses (``compare_trl.py``, ``compare_tunix.py``): the
    workload (a converted model, or the random tiny Qwen2's shape), the batch, the timed steps and rounds,
    the seed, and the child processes' hidden ones; ``other``: the other side's name (``--only``)."""
    parser.add_argument("--model", help="a converted Hugging Face model directory (default: a random tiny Qwen2)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of each child process")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps of each child process")
    parser.add_argument("--rounds", type=int, default=2,
                        help="child processes per row, in ABBA order; each row's timed steps are pooled")
    parser.add_argument("--prompts", type=int, help="prompts per step (default 8; 4 with --model)")
    parser.add_argument("--samples", type=int, help="samples per prompt (default 8)")
    parser.add_argument("--new-tokens", type=int, help="new tokens of a row at most (default 16; 64 with --model)")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=384)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("pgjax", other),
                        help="run one side in this process and print its steps as JSON (what the children do)")
    parser.add_argument("--random-dir", help=argparse.SUPPRESS)
    parser.add_argument("--plan-steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="save the results here")


def seconds(x: float, step: float) -> str:
    """A time in a harness's table: three decimals when its step is under a second, else two."""
    return f"{x:.3f}" if step < 1 else f"{x:.2f}"


def ratio_text(result: dict) -> str:
    """A ratio of pooled medians (``statistics.median_ratio``) with its interval, or without one when a
    side has fewer than ``statistics.MIN_STEPS`` timed steps."""
    if result["low"] is None:
        return f"{result['ratio']:.2f}x (n < {stats.MIN_STEPS}: no interval)"
    return stats.describe_ratio(result)
