"""Where a benchmark's numbers come from, saved in every results JSON (``record``): the date, the
commit (and whether the tree had uncommitted changes), the command, the CPU model and its
instruction-set flags, the core count and the threads BLAS / XLA may use, the library versions, and
the environment variables that change speed (allocator, thread and XLA settings)."""
import datetime
import importlib.metadata
import os
import pathlib
import platform
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEED_VARIABLES = ("XLA_FLAGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_ARENA_MAX",
                   "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "PGJAX_KEEP_FREED_MEMORY", "JAX_PLATFORMS",
                   "TF_CPP_MIN_LOG_LEVEL")
INSTRUCTION_SETS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_tile", "sha_ni")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def cpu() -> dict:
    """The CPU's model name and which of ``INSTRUCTION_SETS`` it has (from /proc/cpuinfo on Linux)."""
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
    return {"model": model, "instruction_sets": [f for f in INSTRUCTION_SETS if f in flags],
            "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0))}


def record(packages=("jax", "jaxlib", "flax", "numpy")) -> dict:
    """The provenance of a run of the calling benchmark (see the module docstring)."""
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": _git("rev-parse", "HEAD"), "uncommitted_changes": bool(_git("status", "--porcelain")),
            "command": " ".join([pathlib.Path(sys.executable).name, *sys.argv]), "cpu": cpu(),
            "python": platform.python_version(), "platform": platform.platform(), "versions": versions,
            "environment": {k: os.environ[k] for k in SPEED_VARIABLES if k in os.environ}}


def machine_line(saved: dict) -> str:
    """One line naming the machine of a ``record``: CPU model, instruction sets, cores."""
    c = saved["cpu"]
    return f"{c['model']} ({', '.join(c['instruction_sets']) or 'no AVX'}; {c['usable_cores']} cores)"
