"""The machine a process runs on, as records name it: the CPU (model, the instruction sets that change
speed or numerics, cores), the Python and OS, and, once JAX is imported, its backend and devices; and
the process's peak resident memory (``peak_resident_bytes``), which step records and benchmarks report.

A run on a CPU is not the same computation on every CPU: XLA picks kernels by instruction set, so
float32 sums round differently and a trained policy drifts apart over many steps. A run directory
therefore records the machine of each sitting (``pgjax.train.run_dir``, ``machines.jsonl``), and the
benchmarks' provenance names it the same way (``benchmarks/provenance.py``). Importing this module
imports no JAX.
"""
import importlib.metadata
import os
import pathlib
import platform
import resource
import sys

INSTRUCTION_SETS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
                    "avx512_fp16", "amx_tile", "amx_bf16")
JAX_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")


def cpu() -> dict:
    """The CPU's model name, which of ``INSTRUCTION_SETS`` it has (from /proc/cpuinfo on Linux), its
    logical cores and those this process may run on."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "instruction_sets": [f for f in INSTRUCTION_SETS if f in flags],
            "cores": os.cpu_count(), "usable_cores": usable}


def versions(packages: tuple[str, ...] = JAX_PACKAGES) -> dict[str, str | None]:
    """The installed version of each of ``packages`` (None: not installed)."""
    out: dict[str, str | None] = {}
    for name in packages:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def describe() -> dict:
    """This machine: ``cpu()``, Python, the OS, ``versions()``, and JAX's backend and devices when this
    process has imported JAX (describing it never imports it)."""
    out = {"cpu": cpu(), "python": platform.python_version(), "platform": platform.platform(),
           "versions": versions()}
    jax = sys.modules.get("jax")
    if jax is not None:
        out["jax_backend"] = jax.default_backend()
        out["jax_devices"] = [str(d) for d in jax.devices()]
    return out


def peak_resident_bytes() -> int:
    """This process's peak resident set so far, in bytes: ``getrusage``'s ``ru_maxrss`` (KiB on Linux,
    bytes on macOS), the maximum resident set size ``/usr/bin/time -v`` reports."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def cpu_line(cpu_record: dict) -> str:
    """One line naming a ``cpu()`` record: model, instruction sets, usable cores."""
    sets = ", ".join(cpu_record["instruction_sets"]) or "no AVX"
    return f"{cpu_record['model']} ({sets}; {cpu_record['usable_cores']} cores)"
