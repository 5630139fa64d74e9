"""Host memory for XLA's CPU backend: transparent huge pages for the command line, and optionally
freed memory kept in the process, so that every step's temporaries are not page-faulted in afresh.

XLA's CPU backend allocates every activation of a compiled program afresh on each call and
frees it at the end. With glibc's default malloc, blocks above the mmap threshold and every
per-thread arena hand freed memory back to the kernel, and the next call faults the same
gigabytes in again, zero-filled, 4 KiB at a time: on SmolLM2-135M's update (64 x 64 tokens, 2
cores) 2.7 million page faults per step, a third of its CPU time in the kernel. Three
``mallopt`` settings (glibc's own knobs: one arena, no mmap'd blocks, no trimming) keep that
memory mapped: the same step then takes ~12 s instead of ~18.5 s, with no faults. Only all three
together remove the faults (``benchmarks/host_memory.py`` measures each variant).

They are off unless ``PGJAX_KEEP_FREED_MEMORY=1``, because the cost is memory, unpredictably.
Resident memory never shrinks below its peak, and the one heap fragments: now and then a step
finds no free block that fits and grows the heap by gigabytes (at 32 x 64 tokens: 6.3 GiB, then
10.1 GiB from some step on). In one run on a 24 GB machine SmolLM2's update ran out of memory at
16 x 256 tokens, a shape that needs 13 GiB without the settings. Turn them on for speed when
the run's memory is well below the machine's.

``import pgjax`` applies them when asked (before JAX starts its threads). Linux with glibc only;
elsewhere nothing happens.

Transparent huge pages are the bounded half of the remedy: with glibc's tunable
``glibc.malloc.hugetlb=1`` malloc asks the kernel for 2 MiB pages for the blocks it maps, so the
same gigabytes are faulted in about 100 times less often (measured; the zero-filling stays) and memory is handed
back as with glibc's defaults. On SmolLM2-135M's update it took 22-24 s per step instead of 28-29
at 16 x 256 tokens (``benchmarks/host_memory.py``). glibc reads its tunables only when a process
starts, so ``python -m pgjax.run`` starts itself again with the tunable
(``restart_with_huge_pages``) unless ``GLIBC_TUNABLES`` already names ``glibc.malloc.hugetlb``
(``=0`` turns it off), the kernel's THP mode is ``never``, or the C library is not glibc >= 2.35.
Programs that import pgjax set it themselves: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python ...``.
"""
import ctypes
import os
import pathlib
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -3, -4, -8     # glibc's malloc.h
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))  # one arena, no mmap'd blocks, no trim
SWITCH = "PGJAX_KEEP_FREED_MEMORY"
TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"
HUGE_PAGES = f"{HUGE_PAGES_TUNABLE}=1"       # the GLIBC_TUNABLES pair that turns them on
THP_MODE_FILE = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


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


def transparent_huge_pages_mode() -> str | None:
    """The kernel's THP mode (``always``, ``madvise`` or ``never``: the bracketed word of
    /sys/kernel/mm/transparent_hugepage/enabled), None where there is no such file."""
    try:
        words = THP_MODE_FILE.read_text().split()
    except OSError:
        return None
    return next((w.strip("[]") for w in words if w.startswith("[")), None)


def glibc_version() -> tuple[int, ...] | None:
    """(major, minor) of the C library when it is glibc, else None."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
    except (AttributeError, ValueError, OSError):      # no confstr name here, or not "glibc X.Y"
        return None
    return tuple(int(part) for part in version.split(".")[:2]) if name == "glibc" else None


def with_huge_pages(environ, thp_mode: str | None, libc: tuple[int, ...] | None) -> dict | None:
    """``environ`` with ``glibc.malloc.hugetlb=1`` added to ``GLIBC_TUNABLES`` (colon-separated
    ``name=value`` pairs); None where that changes nothing or is decided already: the tunables name
    ``glibc.malloc.hugetlb`` (any value), the THP mode is ``never`` or unknown, or ``libc`` is not
    glibc >= 2.35 (the first with the tunable)."""
    tunables = environ.get(TUNABLES, "")
    named = {pair.split("=", 1)[0] for pair in tunables.split(":") if pair}
    if HUGE_PAGES_TUNABLE in named or thp_mode not in ("always", "madvise") or libc is None or libc < (2, 35):
        return None
    return {**environ, TUNABLES: ":".join(filter(None, (tunables, HUGE_PAGES)))}


def restart_with_huge_pages() -> None:
    """Replace this process by the same command line (``sys.orig_argv``) in ``with_huge_pages``'s
    environment, where it changes something; returns where it does not, or where the exec fails.
    Call it first thing in a command's ``__main__``: glibc reads its tunables only at start."""
    environ = with_huge_pages(os.environ, transparent_huge_pages_mode(), glibc_version())
    if environ is None:
        return
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
    except OSError:
        return
