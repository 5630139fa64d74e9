"""Keep freed host memory in the process, so XLA's CPU backend does not page-fault it back in.

XLA's CPU backend allocates every activation of a compiled program afresh on each call and
frees it at the end. With glibc's default malloc, blocks above the mmap threshold and every
per-thread arena hand freed memory back to the kernel, and the next call faults the same
gigabytes in again, zero-filled, 4 KiB at a time: on SmolLM2-135M's update (64 x 64 tokens, 2
cores) 2.7 million page faults per step, a third of its CPU time in the kernel. Three
``mallopt`` settings (glibc's own knobs: one arena, no mmap'd blocks, no trimming) keep that
memory mapped: the same step then takes ~12 s instead of ~18.5 s, with no faults (measured with
``benchmarks/train_step.py``). The cost: the process's resident memory never shrinks below its
peak, which a training process reaches on its first step anyway.

``import pgjax`` applies them (before JAX starts its threads); ``PGJAX_KEEP_FREED_MEMORY=0``
leaves malloc alone. Linux with glibc only; elsewhere nothing happens.
"""
import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8     # glibc's malloc.h
OPT_OUT = "PGJAX_KEEP_FREED_MEMORY"


def keep_freed_memory() -> bool:
    """One malloc arena, no mmap'd blocks and no trimming (``mallopt``); True when applied."""
    if os.environ.get(OPT_OUT, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):        # not glibc (musl has no mallopt)
        return False
    return all(mallopt(option, value) == 1 for option, value in
               ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1)))
