"""Memory and time of log-probs + entropy (value and gradient): plain logits vs. the chunked path.

For a policy-gradient loss on N sampled tokens the plain path builds ``logits = hidden @ W``
(``[N, V]``, e.g. 8192 x 151936 float32 = 4.6 GiB for a Qwen2.5-0.5B head) and keeps it, its
softmax and its cotangent alive for the backward pass. ``chunked_logprobs_and_entropy``
processes ``chunk_size`` tokens at a time and recomputes each chunk's logits in the backward
pass. This script compiles ``jax.value_and_grad`` (w.r.t. hidden and W) of

    loss = sum(logp) + 0.01 * sum(entropy)

for both paths, reads XLA's compiled memory analysis and times the compiled call (median of
``--repeats`` runs after one warm-up).

Examples::

    python benchmarks/logprob_memory.py                      # Qwen2.5-0.5B head, 8192 tokens
    python benchmarks/logprob_memory.py --tokens 2048 --chunk-size 512 1024 2048 4096
    python benchmarks/logprob_memory.py --skip-plain-timing  # plain path too big to run

Issue target: chunked temp memory <= 1/10 of plain at <= 1.5x its time.
"""
import argparse
import os
import shlex
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import measure
from readme_tables import save_table

from pgjax import markdown
from pgjax.core.logprobs import chunked_logprobs_and_entropy, entropy_from_logits, token_logprobs

MIB = 2.0 ** 20
ENTROPY_COEF = 0.01
TARGET_MEMORY_RATIO = 0.1
TARGET_TIME_RATIO = 1.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--tokens", type=int, default=8192, help="N, number of token positions")
    p.add_argument("--hidden", type=int, default=896, help="H, hidden size")
    p.add_argument("--vocab", type=int, default=151936, help="V, vocabulary size")
    p.add_argument("--chunk-size", type=int, nargs="+", default=[1024],
                   help="chunk size(s) of the chunked path; several give one row each")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype of hidden states and unembedding")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    p.add_argument("--skip-plain-timing", action="store_true",
                   help="compile the plain path and report its memory analysis, but do not run it "
                        "(use when [N, V] logits do not fit in memory)")
    p.add_argument("--skip-check", action="store_true",
                   help="do not compare the chunked results with the plain ones")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="save the table, its provenance and each path's raw numbers here "
                                  "(benchmarks/results/NAME.json)")
    return p.parse_args(argv)


def make_losses(temperature):
    def plain_loss(hidden, unembed, tokens):
        logits = hidden @ unembed
        logp = token_logprobs(logits, tokens, temperature)
        ent = entropy_from_logits(logits, temperature)
        return jnp.sum(logp) + ENTROPY_COEF * jnp.sum(ent)

    def chunked_loss(hidden, unembed, tokens, chunk_size):
        logp, ent = chunked_logprobs_and_entropy(hidden, unembed, tokens, temperature, chunk_size)
        return jnp.sum(logp) + ENTROPY_COEF * jnp.sum(ent)

    return plain_loss, chunked_loss


def compile_value_and_grad(fn, shapes):
    t0 = time.perf_counter()
    compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(*shapes).compile()
    return compiled, time.perf_counter() - t0


def memory(compiled):
    ma = compiled.memory_analysis()
    if ma is None:
        return None
    fields = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
              "alias_size_in_bytes", "generated_code_size_in_bytes")
    return {f: getattr(ma, f, None) for f in fields}


def footprint(mem):
    """argument + output + temp - alias bytes: XLA's estimate of the call's peak device memory."""
    if mem is None or mem["temp_size_in_bytes"] is None:
        return None
    return sum(mem[k] or 0 for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                     "temp_size_in_bytes")) - (mem["alias_size_in_bytes"] or 0)


def available_host_bytes():
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def time_call(compiled, args, repeats):
    """(median, each) seconds of ``repeats`` calls of ``compiled(*args)`` (blocking), after a warm-up call."""
    _, times = measure.call_times(lambda: jax.block_until_ready(compiled(*args)), repeats)
    return statistics.median(times), times


def fmt_mib(b):
    return "n/a" if b is None else f"{b / MIB:,.1f}"


def fmt_ratio(x):
    return "n/a" if x is None else f"{x:.3f}"


def _memory_cells(mem) -> list[str]:
    """A compiled call's argument, output, alias and temp MiB and its ``footprint`` (``n/a`` when not compiled)."""
    if mem is None:
        return ["n/a"] * 5
    return [*(fmt_mib(mem[key]) for key in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                                            "temp_size_in_bytes")), fmt_mib(footprint(mem))]


def main(argv=None):
    args = parse_args(argv)
    n, h, v = args.tokens, args.hidden, args.vocab
    dtype = jnp.dtype(args.dtype)

    print("command: " + " ".join(shlex.quote(a) for a in [os.path.basename(sys.executable)] + sys.argv))
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}, "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    print(f"N={n} tokens, H={h}, V={v}, dtype={dtype.name}, temperature={args.temperature}, "
          f"repeats={args.repeats}; loss = sum(logp) + {ENTROPY_COEF} * sum(entropy), "
          f"value_and_grad w.r.t. (hidden, W)")
    print(f"[N, V] float32 logits alone: {n * v * 4 / MIB:,.1f} MiB; "
          f"[H, V] W: {h * v * dtype.itemsize / MIB:,.1f} MiB")
    print(flush=True)

    shapes = (jax.ShapeDtypeStruct((n, h), dtype), jax.ShapeDtypeStruct((h, v), dtype),
              jax.ShapeDtypeStruct((n,), jnp.int32))
    plain_loss, chunked_loss = make_losses(args.temperature)

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(args.seed), 3)
    inputs = jax.jit(lambda: (jax.random.normal(k1, (n, h), dtype),
                              (jax.random.normal(k2, (h, v)) / h ** 0.5).astype(dtype),
                              jax.random.randint(k3, (n,), 0, v, jnp.int32)))()
    jax.block_until_ready(inputs)

    rows = []  # (name, mem dict, median time or None, all times, compile s)
    compiled, t_compile = compile_value_and_grad(plain_loss, shapes)
    mem = memory(compiled)
    print(f"plain: compiled in {t_compile:.1f} s, memory analysis {mem}", flush=True)
    ref = None
    skip_plain = args.skip_plain_timing
    need, avail = footprint(mem), available_host_bytes()
    if not skip_plain and jax.default_backend() == "cpu" and need and avail and need > 0.9 * avail:
        print(f"plain: needs ~{need / 2**30:.1f} GiB but only {avail / 2**30:.1f} GiB of host memory is "
              f"available: not running it (as with --skip-plain-timing)", flush=True)
        skip_plain = True
    if skip_plain:
        rows.append(("plain", mem, None, [], t_compile))
    else:
        med, times = time_call(compiled, inputs, args.repeats)
        print(f"plain: times {[round(t, 3) for t in times]}", flush=True)
        rows.append(("plain", mem, med, times, t_compile))
        if not args.skip_check:
            ref = compiled(*inputs)
    del compiled

    for c in args.chunk_size:
        fn = lambda hh, ww, tt, c=c: chunked_loss(hh, ww, tt, c)  # noqa: E731
        compiled, t_compile = compile_value_and_grad(fn, shapes)
        mem = memory(compiled)
        print(f"chunked (chunk {c}): compiled in {t_compile:.1f} s, memory analysis {mem}", flush=True)
        med, times = time_call(compiled, inputs, args.repeats)
        print(f"chunked (chunk {c}): times {[round(t, 3) for t in times]}", flush=True)
        if ref is not None:
            val, (gh, gw) = compiled(*inputs)
            rval, (rgh, rgw) = ref
            def rel(a, b):
                return float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))
                             / jnp.maximum(jnp.max(jnp.abs(b.astype(jnp.float32))), 1e-30))
            print(f"chunked (chunk {c}): vs plain: loss {float(val):.6g} vs {float(rval):.6g}, "
                  f"max rel err grad_hidden {rel(gh, rgh):.2e}, grad_W {rel(gw, rgw):.2e}", flush=True)
            del val, gh, gw
        rows.append((f"chunked ({c})", mem, med, times, t_compile))
        del compiled

    plain_mem, plain_time = rows[0][1], rows[0][2]
    plain_temp = plain_mem and plain_mem["temp_size_in_bytes"]

    cells, verdicts = [], []
    for name, mem, med, _, _ in rows:
        temp = mem and mem["temp_size_in_bytes"]
        mem_ratio = temp / plain_temp if temp is not None and plain_temp else None
        time_ratio = med / plain_time if med is not None and plain_time else None
        cells.append([name, fmt_mib(temp), "not run" if med is None else f"{med:.3f}", fmt_ratio(mem_ratio),
                      fmt_ratio(time_ratio)])
        if name != "plain":
            verdicts.append((name, mem_ratio, time_ratio))
    print()
    setup = (f"N = {n} tokens, H = {h}, V = {v}, {dtype.name}; value and gradient (hidden, W) of sum(logp) + "
             f"{ENTROPY_COEF} sum(entropy); time: median of {args.repeats} calls after a warm-up")
    save_table(args.json, sys.argv[1:] if argv is None else argv,
               [setup + ":", "", *markdown.table(["path", "temp memory (MiB)", "time (s)", "memory ratio vs plain",
                                                   "time ratio vs plain"], cells).splitlines()],
               setup=setup, rows=[{"path": name, "memory": mem, "seconds": times, "compile_s": t_compile}
                                  for name, mem, _, times, t_compile in rows])
    print()
    print(markdown.table(["path", "argument (MiB)", "output (MiB)", "alias (MiB)", "temp (MiB)",
                          "arg + out + temp - alias (MiB)", "compile (s)"],
                         [[name, *_memory_cells(mem), f"{t_compile:.1f}"] for name, mem, _, _, t_compile in rows]))

    print()
    print(f"target: chunked temp memory <= {TARGET_MEMORY_RATIO:g} x plain and time <= "
          f"{TARGET_TIME_RATIO:g} x plain")
    for name, mem_ratio, time_ratio in verdicts:
        mem_ok = None if mem_ratio is None else mem_ratio <= TARGET_MEMORY_RATIO
        time_ok = None if time_ratio is None else time_ratio <= TARGET_TIME_RATIO
        word = lambda ok: "unknown" if ok is None else ("yes" if ok else "NO")  # noqa: E731
        overall = "MET" if mem_ok and time_ok else ("NOT MET" if False in (mem_ok, time_ok) else "UNKNOWN")
        print(f"  {name}: memory {word(mem_ok)} ({fmt_ratio(mem_ratio)}), "
              f"time {word(time_ok)} ({fmt_ratio(time_ratio)}) -> {overall}")


if __name__ == "__main__":
    main()
