"""Where a benchmark's numbers come from, saved in every results JSON (``record``; ``readme_tables.
save_table`` adds it): the date, the commit (and whether the code differed from it: changes outside
``benchmarks/results`` and the Markdown pages), the
command, the CPU model and its instruction-set flags, the cores and the threads each library may
use, the library versions and torch's BLAS back-end, and the environment variables that change
speed (allocator, thread and XLA settings). ``REQUIRED`` names the fields ``tests/test_readme.py``
checks in every results file; ``machine_line`` is how a docs table names its machine."""
import datetime
import importlib.util
import os
import pathlib
import platform
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEED_VARIABLES = ("XLA_FLAGS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MALLOC_ARENA_MAX",
                   "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "LD_PRELOAD",
                   "PGJAX_KEEP_FREED_MEMORY", "GLIBC_TUNABLES", "JAX_PLATFORMS", "JAX_ENABLE_X64",
                   "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES")
PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "torch", "transformers", "trl", "peft")
REQUIRED = ("date", "commit", "command", "cpu", "versions", "threads", "environment")


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _torch() -> dict:
    """torch's intra-op threads and BLAS back-end (``torch.__config__.show()``), when this process has
    imported torch (importing it only to describe it would change what the benchmark measured)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    config = torch.__config__.show()
    blas = [line.strip() for line in config.splitlines() if "BLAS" in line or "LAPACK" in line or "MKL" in line]
    return {"torch_threads": torch.get_num_threads(), "torch_blas": blas}


def record(children: dict | None = None) -> dict:
    """The provenance of this run of the calling benchmark (see the module docstring); ``children``:
    the threads and environment of the child processes it started, by name, when it started any."""
    # imported here, not with the module: a benchmark that runs another tree's pgjax (benchmarks/sandbox.py)
    # imports this module before it puts that tree first on sys.path
    from pgjax.machine import cpu, versions
    threads = {"usable_cores": len(os.sched_getaffinity(0)), **_torch()}
    if importlib.util.find_spec("jax") is not None and "jax" in sys.modules:
        jax = sys.modules["jax"]
        threads["jax_devices"] = [str(d) for d in jax.devices()]
    code_changes = _git("status", "--porcelain", "--", ".", ":!benchmarks/results", ":!*.md")
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": _git("rev-parse", "HEAD"), "uncommitted_changes": bool(code_changes),
            "command": " ".join([pathlib.Path(sys.executable).name, *sys.argv]), "cpu": cpu(),
            "python": platform.python_version(), "platform": platform.platform(), "versions": versions(PACKAGES),
            "threads": threads, "environment": {k: os.environ[k] for k in SPEED_VARIABLES if k in os.environ},
            "children": children or {}}


def machine_line(saved: dict) -> str:
    """One line naming the machine of a ``record``: CPU model, instruction sets, cores."""
    from pgjax.machine import cpu_line  # see ``record``
    return cpu_line(saved["cpu"])
