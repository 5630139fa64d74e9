"""Test-session setup and the fixtures shared by several modules (plain helpers: helpers.py).

A persistent XLA compilation cache, shared by the tests, the pytest-xdist workers and the subprocesses the
tests start: most of the suite's time is XLA compiling tiny programs. It is set here before anything
compiles and exported (``JAX_COMPILATION_CACHE_DIR``, ``JAX_PERSISTENT_CACHE_MIN_*``), so that every
subprocess inherits it. It lives per user, ``~/.cache/pgjax/jax_compilation/<cpu>`` (``$XDG_CACHE_HOME``
honoured; ``JAX_COMPILATION_CACHE_DIR`` names another), not in the clone: few programs repeat within one
run (a cold run takes about as long as no cache), so a fresh clone is fast only if it finds what earlier
runs on the machine compiled. An entry's key covers the program, the XLA flags (simulated device counts),
the devices, the compile options and the jax / jaxlib versions, and the directory is per CPU (flags), so a
hit is the executable a fresh compilation would give. Off with ``JAX_ENABLE_COMPILATION_CACHE=false``;
emptied with ``rm -rf ~/.cache/pgjax/jax_compilation``; kept under ``CACHE_LIMIT`` bytes (least recently
read entries go first).
"""
import gc
import hashlib
import json
import os
import pathlib
import platform

import jax
import pytest
from helpers import FAST_COMPILE

if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):   # before any backend starts
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()

CACHE_LIMIT = 2 << 30
CACHE_EVENTS = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}
cache_counts = {"hits": 0, "misses": 0, "saved": 0.0, "peak_mappings": 0}
cache_state = {"entries": 0}


def cpu_fingerprint() -> str:
    """The machine and its CPU's feature flags: XLA compiles for the host CPU, and a home directory may be
    shared by machines with different ones."""
    flags = ""
    try:
        flags = next((line for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()}-{hashlib.sha256(f'{platform.processor()} {flags}'.encode()).hexdigest()[:12]}"


def compilation_cache_directory() -> pathlib.Path:
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    base = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return base / "pgjax" / "jax_compilation" / cpu_fingerprint()


def cache_entries(directory) -> int:
    return sum(1 for _ in pathlib.Path(directory).glob("*-cache")) if directory else 0


def tidy(directory: pathlib.Path) -> None:
    """JAX writes an entry in place: a process killed while writing one (a timeout, the SIGKILL test) leaves
    it cut short, and every later read of it warns (on a subprocess's stderr, too) and compiles again, while
    the entry is never rewritten. Entries written since the last check that do not decompress are deleted;
    then the least recently read ones, while the directory holds more than ``CACHE_LIMIT`` bytes."""
    try:
        from jax._src.compilation_cache import decompress_executable
    except ImportError:                                         # a jax that moved it: no check
        decompress_executable = None
    stamp = directory / "checked"
    since = stamp.stat().st_mtime - 600 if stamp.exists() else 0.0   # slack for entries being written then
    stamp.touch()
    kept = []
    for entry in directory.glob("*-cache"):
        try:
            status = entry.stat()
            if decompress_executable is not None and status.st_mtime >= since:
                decompress_executable(entry.read_bytes())
            kept.append((status.st_atime, status.st_size, entry))
        except FileNotFoundError:
            pass
        except Exception:
            entry.unlink(missing_ok=True)
    total = sum(size for _, size, _ in kept)
    if total > CACHE_LIMIT:
        for _, size, entry in sorted(kept, key=lambda k: k[0]):      # least recently read first
            if total <= CACHE_LIMIT * 3 // 4:
                break
            entry.unlink(missing_ok=True)
            total -= size


def pytest_configure(config):
    directory = compilation_cache_directory()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:                                             # no writable home: a cache for this clone
        directory = pathlib.Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax_compilation"
        directory.mkdir(parents=True, exist_ok=True)
    if not hasattr(config, "workerinput"):                      # once, in the controller of an xdist run
        tidy(directory)
    settings = {"jax_compilation_cache_dir": str(directory), "jax_persistent_cache_min_compile_time_secs": "0",
                "jax_persistent_cache_min_entry_size_bytes": "0"}
    for name, default in settings.items():
        value = os.environ.setdefault(name.upper(), default)      # subprocesses inherit the environment
        jax.config.update(name, value if name.endswith("_dir") else type(jax.config.values[name])(value))
    cache_state["entries"] = cache_entries(directory)

    def count(event, **_):
        if event in CACHE_EVENTS:
            cache_counts[CACHE_EVENTS[event]] += 1

    def saved(event, seconds, **_):
        if event == "/jax/compilation_cache/compile_time_saved_sec":
            cache_counts["saved"] += seconds

    jax.monitoring.register_event_listener(count)
    jax.monitoring.register_event_duration_secs_listener(saved)


def memory_mappings() -> int:
    """The memory mappings this process holds (0 where /proc does not say)."""
    try:
        return pathlib.Path(f"/proc/{os.getpid()}/maps").read_text().count("\n")
    except OSError:
        return 0


def max_map_count() -> str:
    """The kernel's limit on a process's memory mappings, as /proc says it ("?" where it does not)."""
    try:
        return pathlib.Path("/proc/sys/vm/max_map_count").read_text().strip()
    except OSError:
        return "?"


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After a module's last test (its fixtures torn down), drop the compiled programs JAX holds in
    memory (``jax.clear_caches``). Each loaded executable keeps a few memory mappings for its
    JIT-linked code; a worker that kept every program of the modules it ran reached Linux's
    default limit of 65,530 mappings per process (``vm.max_map_count``), where LLVM could not map the
    next program's code and the worker died of a segmentation fault. The next module reads what it
    needs back from the persistent cache. The peak is reported (``pytest_terminal_summary``)."""
    if nextitem is None or nextitem.module is not item.module:
        cache_counts["peak_mappings"] = max(cache_counts["peak_mappings"], memory_mappings())
        jax.clear_caches()
        gc.collect()


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):                 # an xdist worker reports to the controller
        session.config.workeroutput["jax_compilation_cache"] = dict(cache_counts)


def pytest_testnodedown(node, error):
    for key, value in getattr(node, "workeroutput", {}).get("jax_compilation_cache", {}).items():
        cache_counts[key] = max(cache_counts[key], value) if key == "peak_mappings" else cache_counts[key] + value


def pytest_terminal_summary(terminalreporter):
    directory = jax.config.values.get("jax_compilation_cache_dir")
    if not jax.config.values.get("jax_enable_compilation_cache", True) or not directory:
        return
    entries = cache_entries(directory)
    terminalreporter.write_line(
        f"XLA compilation cache {directory}: {cache_counts['hits']} hits, {cache_counts['misses']} misses in the "
        f"pytest processes ({max(cache_counts['saved'], 0):.0f} s of compiling saved); {entries} entries "
        f"(+{entries - cache_state['entries']} this run, subprocesses included); at most "
        f"{cache_counts['peak_mappings']:,} memory mappings in a test process at a module's end (the limit: "
        f"vm.max_map_count = {max_map_count()})")


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run (checkpoints at steps 2 and 4), a trainer of its experiment (whose
    state is the layout to restore into) and the states of both checkpoints (test_faults,
    test_run_dir_faults)."""
    from helpers import EMIT_X, tiny_experiment

    from pgjax.train.checkpoints import Checkpoints
    from pgjax.train.trainer import Trainer, train
    tmp = tmp_path_factory.mktemp("finished")
    exp = tiny_experiment(tmp, task=EMIT_X)
    directory = train(exp, progress=False)
    trainer = Trainer(exp)
    checkpoints = Checkpoints(directory / "checkpoints")
    states = {step: checkpoints.restore(trainer.state, step)[0] for step in (2, 4)}
    checkpoints.close()
    return exp, directory, trainer, states


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A tiny Hugging Face checkpoint (config with a 32-token context, a character tokenizer): test_faults,
    test_inputs."""
    from helpers import save_tiny_checkpoint
    directory = save_tiny_checkpoint(tmp_path_factory.mktemp("checkpoint"))
    config_json = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config_json, "max_position_embeddings": 32}))
    return directory
