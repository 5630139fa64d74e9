"""Host memory for XLA's CPU backend: optionally, freed memory kept in the process, so that every
step's temporaries are not page-faulted in afresh.

XLA's CPU backend allocates every activation of a compiled program afresh on each call and
frees it at the end. With glibc's default malloc, blocks above the mmap threshold and every
per-thread arena hand freed memory back to the kernel, and the next call faults the same
gigabytes in again, zero-filled, 4 KiB at a time: on a model the size of SmolLM2-135M that is
millions of page faults per step and a large share of its CPU time in the kernel. Three
``mallopt`` settings (glibc's own knobs: one arena, no mmap'd blocks, no trimming) keep that
memory mapped, and the faults go. Only all three together remove them (``benchmarks/host_memory.py``
measures each variant; docs/benchmarks.md, "Page faults and the allocator", has the numbers).

They are off unless ``PGJAX_KEEP_FREED_MEMORY=1``, because the cost is memory, unpredictably.
Resident memory never shrinks below its peak, and the one heap fragments: now and then a step
finds no free block that fits and grows the heap by gigabytes, enough to run a shape out of
memory that fits without the settings. Turn them on for speed when the run's memory is well below
the machine's.

``import pgjax`` applies them when asked (before JAX starts its threads). Linux with glibc only;
elsewhere nothing happens.

Transparent huge pages (glibc's tunable ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, set before
the process starts: malloc asks for 2 MiB pages for the blocks it maps) fault the same gigabytes in
far less often and hand memory back as glibc's defaults do. pgjax does not set them: they paid
with unrolled layers but slowed the update at a run's default layout (stacked layers with remat),
its kernel time grown (``benchmarks/host_memory.py``, docs/benchmarks.md). ``HUGE_PAGES`` is the
tunable for the benchmarks that compare them.
"""
import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -3, -4, -8     # glibc's malloc.h
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))  # one arena, no mmap'd blocks, no trim
SWITCH = "PGJAX_KEEP_FREED_MEMORY"
TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES = "glibc.malloc.hugetlb=1"        # the GLIBC_TUNABLES pair that turns transparent huge pages on


def keep_freed_memory() -> bool:
    """One malloc arena, no mmap'd blocks and no trimming (``mallopt``) when ``PGJAX_KEEP_FREED_MEMORY=1``;
    True when applied."""
    if os.environ.get(SWITCH, "0") != "1" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):        # not glibc (musl has no mallopt)
        return False
    return all(mallopt(option, value) == 1 for option, value in SETTINGS)
