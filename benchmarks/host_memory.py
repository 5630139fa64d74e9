"""glibc malloc settings against the page faults of pgjax's training step on a real model.

``import pgjax`` sets three ``mallopt`` options (``pgjax/host_memory.py``: one arena, no mmap'd
blocks, no trimming). This measures why all three: each variant below runs in a fresh child
process (``PGJAX_KEEP_FREED_MEMORY=0``, then the variant's own ``mallopt`` calls before JAX
starts), which runs ``--steps`` consecutive steps of ``train_step.py``'s ``pgjax, chunked`` row
(forward + backward + AdamW on random tokens) and records each step's seconds, minor page faults
and kernel seconds (``getrusage``), and the process's peak RSS. The first step (compilation) is
left out of the ranges.

    python benchmarks/host_memory.py --model models/smollm2-135m-instruct --shape 32x64 --steps 7 \\
        --json benchmarks/results/host_memory_smollm2.json
"""
import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import time

from pgjax.host_memory import (M_ARENA_MAX, M_MMAP_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, SETTINGS,  # no JAX yet
                               SWITCH)
from readme_tables import save_table  # noqa: E402  (no JAX either)

GIB = 1 << 30
VARIANTS = {
    "glibc defaults (`PGJAX_KEEP_FREED_MEMORY=0`)": [],
    "one arena": [(M_ARENA_MAX, 1)],
    "one arena, no trimming": [(M_ARENA_MAX, 1), (M_TRIM_THRESHOLD, -1)],
    "one arena, no mmap'd blocks": [(M_ARENA_MAX, 1), (M_MMAP_MAX, 0)],
    "one arena, 1 GiB trim and mmap thresholds": [(M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, GIB), (M_TRIM_THRESHOLD, GIB)],
    "pgjax's: one arena, no mmap'd blocks, no trimming": list(SETTINGS),
}


def run_variant(name, args) -> dict:
    """(In the child process) apply ``name``'s settings, then time ``args.steps`` training steps."""
    mallopt = ctypes.CDLL("libc.so.6").mallopt
    if not all(mallopt(option, value) == 1 for option, value in VARIANTS[name]):
        raise RuntimeError(f"mallopt rejected a setting of {name!r}")
    import measure               # these import JAX, torch and pgjax: after mallopt,
    import train_step            # with PGJAX_KEEP_FREED_MEMORY=0
    batch, length = map(int, args.shape.split("x"))
    options = argparse.Namespace(no_compile=True, bf16=False, seed=args.seed)
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    row = "pgjax, chunked"
    run = train_step.trainers(args.model, train_step.make_batch(batch, length, vocab, args.seed), options, True,
                              only=row)[row]
    steps = []
    for _ in range(args.steps):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        float(run())
        steps.append({"seconds": time.perf_counter() - start, **measure.kernel_cost(before)})
    return {"steps": steps, "peak_rss_gib": measure.peak_rss_gib()}


def span(values, fmt) -> str:
    low, high = min(values), max(values)
    return fmt(low) if fmt(low) == fmt(high) else f"{fmt(low)}-{fmt(high)}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a converted checkpoint directory")
    parser.add_argument("--shape", default="32x64", help="batch x length")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="save the results here")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args.variant, args)))
        return
    results = {}
    for name in VARIANTS:
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", name], capture_output=True,
                              text=True, check=True, env={**os.environ, SWITCH: "0"})
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}: {[round(s['seconds'], 2) for s in results[name]['steps']]} s", file=sys.stderr, flush=True)
    table = ["| malloc settings | step (s) | minor faults per step | kernel s per step | peak RSS |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        timed = r["steps"][1:]
        table.append(f"| {name} | {span([s['seconds'] for s in timed], lambda x: f'{x:.1f}')} "
                     f"| {span([s['minor_faults'] for s in timed], lambda x: f'{x / 1e6:.2f} M')} "
                     f"| {span([s['system_s'] for s in timed], lambda x: f'{x:.1f}')} | {r['peak_rss_gib']:.1f} GiB |")
    save_table(args.json, sys.argv[1:], table, results=results)


if __name__ == "__main__":
    main()
