"""Where a decode step of pgjax's sampler spends its time, from XLA's own trace.

One forced ``generate`` call (no row stops early, so every token step decodes all ``--batch`` rows;
``word_math`` prompts through the model's chat template, as in ``sampler.py --model``) runs under
``jax.profiler.trace``. Each operation XLA executed is an HLO instruction of the compiled program,
whose metadata names the Python call stack that emitted it; the instruction's ``stack_frame_id`` is
resolved through the program's ``StackFrames`` table (the optimised HLO, dumped at compile time), and
the operation is booked to the innermost pgjax function of ``PARTS``. The table gives each part's
milliseconds per token step (op time summed over XLA's threads), its share, and a rate: the matmuls'
GFLOP/s, and for attention the GB/s of the KV cache it reads (every one of the cache's slots, filled
or not, at every step). The roofline bound of a part is max(FLOPs / peak, bytes read / bandwidth), with
this host's measured ``jnp.dot`` peak and the bytes per second a jitted ``jnp.sum`` reads of 512 MiB;
"of its bound" is the bound's share of the part's time (100% = at the roofline).

    python benchmarks/decode_profile.py --model models/smollm2-135m-instruct --batch 64 --new-tokens 128 \\
        --json benchmarks/results/decode_profile_smollm2.json

The model loads as a run loads it (``ModelSection``'s defaults: stacked layers, which ``generate``
copies out once per call). Op time summed over threads exceeds the wall time where XLA runs two
independent operations at once (the MLP's gate and up projections), and the wall time holds gaps in
which no traced operation runs (the while loop's control, thread hand-offs).
"""
import argparse
import collections
import os
import pathlib
import re
import sys
import tempfile

DUMP = tempfile.mkdtemp(prefix="pgjax-hlo-")
os.environ["XLA_FLAGS"] = (f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={DUMP} --xla_dump_hlo_as_text "
                           "--xla_dump_hlo_module_re=.*_generate.*").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import measure  # noqa: E402
import numpy as np  # noqa: E402
import traces  # noqa: E402
from readme_tables import save_table  # noqa: E402
from sampler import word_math_prompts  # noqa: E402

from pgjax import markdown  # noqa: E402
from pgjax.config import ModelSection  # noqa: E402
from pgjax.models import hf  # noqa: E402
from pgjax.sample import SamplingConfig, generate  # noqa: E402

# innermost function of an operation's call stack -> the part of the decode step it belongs to
PARTS = {"grouped_query_attention": "attention over the KV cache", "MLP.__call__": "MLP matmuls",
         "_project_heads": "q, k, v projections", "CausalLM.logits": "unembedding (logits)",
         "RMSNorm.__call__": "RMSNorms", "apply_rope": "RoPE", "rope_tables": "RoPE",
         "sampling_logprobs": "sampling", "inverse_cdf_sample": "sampling", "_decode.<locals>.pick": "sampling",
         "CausalLM.blocks": "layers copied out of the stack (once per call)",
         "_Live.keep_alive_first": "compaction", "_Live.write_into": "compaction", "_Live.write_timeline": "compaction",
         "Attention.__call__": "attention output projection"}
# where a function of PARTS holds matmuls and other operations: the others' part
NOT_MATMUL = {"MLP.__call__": "MLP activation (SiLU, product)", "Attention.__call__": "attention's reshapes and casts"}
CACHE_WRITE = "KV cache write"
THREAD_MARKERS = ("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener", "end: ")   # not operations


def _section(text: str, name: str) -> list[str]:
    """The lines of the HLO text's ``name`` section (``FileNames``, ``StackFrames``, ...)."""
    match = re.search(rf"^{name}\n(.*?)\n\n", text, re.S | re.M)
    return match.group(1).splitlines() if match else []


def _numbered(lines: list[str]) -> dict:
    """{id: {field: int}} of section lines ``id {field=value ...}``."""
    return {int(line.split()[0]): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)} for line in lines}


def call_stacks(hlo: str) -> dict:
    """{instruction name: (its Python call stack's function names, innermost first; the last part of
    its JAX op name, the primitive)} from an optimised HLO module's text. A fusion that holds a matmul
    is booked as its first matmul (its own metadata is its root's, e.g. a reduction after the
    product). A frame's ``parent_frame_id`` counts from 1 (0: none)."""
    functions = {int(line.split()[0]): line.split(None, 1)[1].strip('"') for line in _section(hlo, "FunctionNames")}
    locations = _numbered(_section(hlo, "FileLocations"))
    frames = _numbered(_section(hlo, "StackFrames"))

    def stack(frame: int) -> list[str]:
        names = []
        while frame in frames:
            names.append(functions[locations[frames[frame]["file_location_id"]]["function_name_id"]])
            frame = frames[frame].get("parent_frame_id", 0) - 1
        return names

    stacks, calls, matmuls, computation = {}, {}, collections.defaultdict(list), None
    for line in hlo.splitlines():
        header = re.match(r"(?:ENTRY )?%?([\w.\-]+) \(.*\) -> .*\{$", line)
        if header:
            computation = header.group(1)
            continue
        name = re.match(r"\s+(?:ROOT )?%?([\w.\-]+) = ", line)
        if name:
            frame = re.search(r"stack_frame_id=(\d+)", line)
            op_name = re.search(r'op_name="([^"]*)"', line)
            stacks[name.group(1)] = (stack(int(frame.group(1))) if frame else [],
                                     op_name.group(1).split("/")[-1] if op_name else "")
            if re.search(r" = \S+ dot\(", line):        # a matmul (a bitcast of its output shares its op name)
                matmuls[computation].append(name.group(1))
            called = re.search(r"calls=%?([\w.\-]+)", line)
            if called:
                calls[name.group(1)] = called.group(1)
    for fusion, called in calls.items():
        if matmuls[called]:
            stacks[fusion] = stacks[matmuls[called][0]]
    return stacks


def part_of(stack: list[str], primitive: str) -> str:
    """The ``PARTS`` entry of an operation's innermost listed function (``NOT_MATMUL``'s for what is
    not a matmul there); the cache's update slices are the ``CACHE_WRITE``."""
    if primitive == "dynamic_update_slice" and "Attention.__call__" in stack:
        return CACHE_WRITE
    for function in stack:
        if function in PARTS:
            return NOT_MATMUL[function] if function in NOT_MATMUL and primitive != "dot_general" else PARTS[function]
    return "other (loop control, copies, no metadata)"


def op_times(trace_file: pathlib.Path, stacks: dict) -> tuple[collections.Counter, float]:
    """Microseconds of XLA operations per part, summed over XLA's threads, and the wall time in which
    at least one operation ran, from a Perfetto trace."""
    ops = traces.xla_spans(*traces.load(trace_file), THREAD_MARKERS)
    parts = collections.Counter()
    for e in ops:
        parts[part_of(*stacks.get(e["name"], ([], "")))] += e["dur"]
    covered = sum(stop - start for start, stop in traces.merged([(e["ts"], e["ts"] + e["dur"]) for e in ops]))
    return parts, covered


def work_per_step(config, rows: int, cache_slots: int) -> dict:
    """(FLOPs, bytes read) per token step of ``rows`` rows: of each matmul part, its FLOPs and its weights
    plus the rows' inputs and outputs; of attention over the KV cache, the cache's bytes (the cache holds
    the compute dtype), which is what bounds it."""
    c = config
    d, layers, dh, item = c.hidden_size, c.num_hidden_layers, c.head_dim, jnp.dtype(c.compute_dtype).itemsize
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * dh
    shapes = {"MLP matmuls": [(d, c.intermediate_size)] * 2 * layers + [(c.intermediate_size, d)] * layers,
              "q, k, v projections": [(d, qkv)] * layers,
              "attention output projection": [(c.num_attention_heads * dh, d)] * layers,
              "unembedding (logits)": [(d, c.vocab_size)]}
    work = {part: (sum(2 * rows * i * o for i, o in mats), sum((i * o + rows * (i + o)) * item for i, o in mats))
            for part, mats in shapes.items()}
    cache = 2 * layers * rows * c.num_key_value_heads * cache_slots * dh * item
    work["attention over the KV cache"] = (0, cache)
    return work


def roofline(flops: float, bytes_read: float, peak: float, bandwidth: float) -> tuple[float, str]:
    """The roofline's lower bound on a part's seconds, max(flops / peak, bytes / bandwidth), and which
    side binds it ("compute" or "memory")."""
    compute, memory = flops / peak, bytes_read / bandwidth
    return max(compute, memory), "compute" if compute >= memory else "memory"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a converted Hugging Face model directory")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls after the warm-up, untraced")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="save the results here")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_compilation_cache", False)    # compile here, so the program is dumped
    prompts, _, pad = word_math_prompts(args.model, [args.batch], args.seed)
    tokens, mask = prompts[args.batch][:2]
    model = hf.load(args.model, **ModelSection().runtime_options())
    config = SamplingConfig(max_new_tokens=args.new_tokens, eos_ids=(model.config.vocab_size - 1,), pad_id=pad)
    key = jax.random.key(args.seed)

    def call():
        return jax.block_until_ready(generate(model, tokens, mask, key, config))

    first, seconds = measure.call_times(call, args.repeats)
    assert int(call().lengths.sum()) == args.batch * args.new_tokens, "a row stopped early: not a forced run"
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            call()
        hlo = max(pathlib.Path(DUMP).glob("*_generate*after_optimizations.txt"), key=lambda p: p.stat().st_size)
        parts, covered = op_times(next(pathlib.Path(trace_dir).rglob("perfetto_trace.json.gz")),
                                  call_stacks(hlo.read_text()))
    steps, wall = args.new_tokens, float(np.median(seconds))
    work = work_per_step(model.config, args.batch, tokens.shape[1] + args.new_tokens)
    total = sum(parts.values())
    peak, bandwidth = measure.matmul_peak()["jnp.dot"], measure.memory_bandwidth()
    header = (f"jax {jax.__version__}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
              f"{os.path.basename(os.path.normpath(args.model))}, float32, a run's model options "
              f"({ModelSection().runtime_options()})")
    setup = (f"forced decode: {args.batch} rows x {args.new_tokens} new tokens, {tokens.shape[1]}-token prompts; "
             f"median of {args.repeats} untraced calls {wall:.2f} s (range {min(seconds):.2f}-{max(seconds):.2f} s; "
             f"{wall / steps * 1e3:.0f} ms a token step, "
             f"{args.batch * steps / wall:.0f} tokens/s), first call {first:.1f} s; the traced call: "
             f"{total / 1e3 / steps:.0f} ms of XLA operations a step summed over threads, "
             f"{covered / 1e3 / steps:.0f} ms of wall time with one running; roofline: jnp.dot peak (2048^3) "
             f"{peak / 1e9:.0f} GFLOP/s, memory read (jnp.sum of 512 MiB) {bandwidth / 1e9:.1f} GB/s")
    print(header + "\n" + setup + "\n", flush=True)
    rows, cells = [], []
    for part, micros in parts.most_common():
        ms = micros / 1e3 / steps
        rate = bound_cell = share_cell = ""
        bound = None
        if part in work:
            flops, bytes_read = work[part]
            bound, side = roofline(flops, bytes_read, peak, bandwidth)
            rate = f"{bytes_read / (ms / 1e3) / 1e9:.1f} GB/s of cache read" if not flops else \
                f"{flops / (ms / 1e3) / 1e9:.0f} GFLOP/s"
            bound_cell, share_cell = f"{bound * 1e3:.1f} ({side})", f"{100 * bound * 1e3 / ms:.0f}%"
        rows.append({"part": part, "ms_per_step": ms, "share": micros / total, "work_per_step": work.get(part),
                     "roofline_ms": None if bound is None else bound * 1e3})
        cells.append([part, f"{ms:.1f}", f"{100 * micros / total:.1f}%", rate, bound_cell, share_cell])
    table = markdown.table(["part of the decode step", "ms / token step", "share of op time", "rate",
                            "roofline bound, ms", "of its bound"], cells)
    bounded, bound_ms = (sum(r[key] for r in rows if r["roofline_ms"] is not None)
                         for key in ("ms_per_step", "roofline_ms"))
    print(f"parts with a roofline: {bounded:.1f} ms a step against a bound of {bound_ms:.1f} ms "
          f"({100 * bound_ms / bounded:.0f}%)")
    save_table(args.json, sys.argv[1:], table.splitlines(), header=header, setup=setup, parts=rows, seconds=seconds,
               first_call_s=first, op_ms_per_step=total / 1e3 / steps, covered_ms_per_step=covered / 1e3 / steps,
               matmul_peak_flops=peak, memory_bandwidth=bandwidth, roofline_ms_per_step=bound_ms,
               bounded_ms_per_step=bounded)


if __name__ == "__main__":
    main()
