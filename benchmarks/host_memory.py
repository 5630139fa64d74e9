"""Host-memory levers against the page faults of pgjax's training step on a real model.

XLA's CPU runtime allocates a compiled program's temporaries afresh on every call (``malloc``) and
frees them at its end; with glibc's defaults the blocks are ``mmap``'d and unmapped, so each step
faults gigabytes of zero-filled pages in again. This measures the levers against that, each
variant in a fresh child process that runs ``--steps`` consecutive steps of ``train_step.py``'s
``pgjax, chunked`` row (forward + backward + AdamW on random tokens) at each ``--shapes`` and
records per step its seconds, minor page faults, kernel seconds (``getrusage``) and resident
memory after it (``/proc/self/statm``), and the process's peak RSS:

  malloc settings  ``mallopt`` calls before JAX starts (``PGJAX_KEEP_FREED_MEMORY=0``, then the
                   variant's own), up to pgjax's opt-in ``PGJAX_KEEP_FREED_MEMORY=1`` (one arena,
                   no mmap'd blocks, no trimming: ``pgjax/host_memory.py``);
  huge pages       glibc's ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (malloc asks for transparent
                   huge pages: far fewer faults, the same zero-filling), which pgjax leaves to
                   the user (they pay with unrolled layers, not at a run's default layout);
  less memory      the model options ``scan_layers`` + ``remat="save_nothing"`` (smaller
                   temporaries) under glibc's defaults, and with huge pages.

The first step (compilation) is left out of the ranges. A variant that dies (out of memory) is
reported as such. ``--variants`` picks levers by key (default: all).

    python benchmarks/host_memory.py --model models/smollm2-135m-instruct --shapes 32x64 16x256 --steps 6 \\
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

from readme_tables import save_table  # no JAX either

from pgjax import host_memory, markdown  # no JAX yet
from pgjax.host_memory import M_ARENA_MAX, M_MMAP_MAX, M_TRIM_THRESHOLD, SETTINGS, SWITCH, TUNABLES

HUGE_PAGES = {TUNABLES: host_memory.HUGE_PAGES}
REMAT = {"scan_layers": True, "remat": "save_nothing"}
# key: (label, mallopt settings, environment, model options)
VARIANTS = {
    "glibc": ("glibc defaults (`PGJAX_KEEP_FREED_MEMORY=0`)", [], {}, {}),
    "huge-pages": ("glibc, transparent huge pages", [], HUGE_PAGES, {}),
    "one-arena": ("one arena", [(M_ARENA_MAX, 1)], {}, {}),
    "no-trim": ("one arena, no trimming", [(M_ARENA_MAX, 1), (M_TRIM_THRESHOLD, -1)], {}, {}),
    "no-mmap": ("one arena, no mmap'd blocks", [(M_ARENA_MAX, 1), (M_MMAP_MAX, 0)], {}, {}),
    "keep": ("pgjax's opt-in: one arena, no mmap'd blocks, no trimming", list(SETTINGS), {}, {}),
    "remat": ("glibc, scan_layers + remat save_nothing", [], {}, REMAT),
    "remat-huge-pages": ("transparent huge pages, scan_layers + remat save_nothing", [], HUGE_PAGES, REMAT),
}


def resident_gib() -> float:
    """This process's resident memory now, GiB (``/proc/self/statm``'s second field, in pages)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 30


def run_variant(key, shape, args) -> dict:
    """(In the child process) apply variant ``key``'s malloc settings, then time ``args.steps`` training steps."""
    _, settings, _, options = VARIANTS[key]
    mallopt = ctypes.CDLL("libc.so.6").mallopt
    if not all(mallopt(option, value) == 1 for option, value in settings):
        raise RuntimeError(f"mallopt rejected a setting of {key!r}")
    import measure  # these import JAX, torch and pgjax: after mallopt,
    import train_step  # with PGJAX_KEEP_FREED_MEMORY=0
    batch, length = map(int, shape.split("x"))
    vocab = json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]
    run = train_step.pgjax_trainer(args.model, train_step.pgjax_chunked_loss,
                                   train_step.make_batch(batch, length, vocab, args.seed), **options)
    steps = []
    for _ in range(args.steps):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        float(run())
        steps.append({"seconds": time.perf_counter() - start, **measure.kernel_cost(before),
                      "resident_gib": resident_gib()})
    return {"steps": steps, "peak_rss_gib": measure.peak_rss_gib()}


def measure_variant(key, shape) -> dict:
    """Run variant ``key`` at ``shape`` in a fresh child process; its result, or ``{"failed": why}``."""
    _, _, environment, _ = VARIANTS[key]
    argv = [sys.executable, __file__, *sys.argv[1:], "--variant", key, "--shape", shape]
    base = {name: value for name, value in os.environ.items() if name != TUNABLES}     # glibc's defaults
    done = subprocess.run(argv, capture_output=True, text=True, env={**base, SWITCH: "0", **environment})
    if done.returncode:
        memory = done.returncode == -9 or any(s in done.stderr for s in ("RESOURCE_EXHAUSTED", "MemoryError"))
        return {"failed": "out of memory" if memory else done.stderr.strip()[-300:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def span(values, fmt) -> str:
    low, high = min(values), max(values)
    return fmt(low) if fmt(low) == fmt(high) else f"{fmt(low)}-{fmt(high)}"


def _cells(r: dict) -> list[str]:
    """A lever's measured cells: the span over its timed steps of each per-step quantity, and its peak RSS
    (for a failed run: the failure, the rest blank)."""
    if "failed" in r:
        return [f"failed: {r['failed']}", "", "", "", ""]
    timed = r["steps"][1:]
    return [span([s["seconds"] for s in timed], lambda x: f"{x:.1f}"),
            span([s["minor_faults"] for s in timed], lambda x: f"{x / 1e6:.2f} M"),
            span([s["system_s"] for s in timed], lambda x: f"{x:.1f}"),
            span([s["resident_gib"] for s in timed], lambda x: f"{x:.1f}") + " GiB", f"{r['peak_rss_gib']:.1f} GiB"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a converted checkpoint directory")
    parser.add_argument("--shapes", nargs="+", default=["32x64"], help="batch x length shapes")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="the levers to measure (default: all)")
    parser.add_argument("--json", help="save the results here")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.shape, args)))
        return
    results = {shape: {} for shape in args.shapes}
    for shape in args.shapes:
        for key in args.variants:
            name = VARIANTS[key][0]
            results[shape][name] = r = measure_variant(key, shape)
            print(f"{shape} {name}: {r.get('failed') or [round(s['seconds'], 2) for s in r['steps']]}",
                  file=sys.stderr, flush=True)
    table = markdown.table(["batch x length", "lever", "step (s)", "minor faults per step", "kernel s per step",
                            "resident after each step", "peak RSS"],
                           [[shape.replace("x", " x "), name, *_cells(r)]
                            for shape, variants in results.items() for name, r in variants.items()], align="llrrrrr")
    save_table(args.json, sys.argv[1:], table.splitlines(), results=results)


if __name__ == "__main__":
    main()
