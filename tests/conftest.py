"""Test-session setup and the fixtures shared by several modules (plain helpers: helpers.py).

A persistent XLA compilation cache, shared by the tests and the subprocesses they start: most of the
suite's time is XLA compiling the same tiny programs again in every test and every process. It lives in
pytest's cache directory (``.pytest_cache/d/jax_compilation``; ``--cache-clear`` empties it) unless
``JAX_COMPILATION_CACHE_DIR`` names another, and it is set here before anything compiles, and exported
(``JAX_COMPILATION_CACHE_DIR``, ``JAX_PERSISTENT_CACHE_MIN_*``) so that every subprocess inherits it. A
fresh clone fills it on its first run, whose tests already share what an earlier test compiled. An
entry's key covers the program, the XLA flags (simulated device counts), the devices, the compile options
and the jax / jaxlib versions, so a hit gives the executable a fresh compilation would give. Off with
``JAX_ENABLE_COMPILATION_CACHE=false``.
"""
import os
import pathlib

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CACHE_EVENTS = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}
cache_counts = {"hits": 0, "misses": 0, "saved": 0.0, "entries": 0}


def compilation_cache_directory(config) -> pathlib.Path:
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    if getattr(config, "cache", None) is not None:             # the cacheprovider plugin (not -p no:cacheprovider)
        return config.cache.mkdir("jax_compilation")
    return ROOT / ".pytest_cache" / "d" / "jax_compilation"


def cache_entries(directory) -> int:
    return sum(1 for p in pathlib.Path(directory).glob("*-cache*")) if directory else 0


def pytest_configure(config):
    directory = compilation_cache_directory(config)
    directory.mkdir(parents=True, exist_ok=True)
    settings = {"jax_compilation_cache_dir": str(directory), "jax_persistent_cache_min_compile_time_secs": "0",
                "jax_persistent_cache_min_entry_size_bytes": "0"}
    for name, default in settings.items():
        value = os.environ.setdefault(name.upper(), default)      # subprocesses inherit the environment
        jax.config.update(name, value if name.endswith("_dir") else type(jax.config.values[name])(value))
    cache_counts["entries"] = cache_entries(directory)

    def count(event, **_):
        if event in CACHE_EVENTS:
            cache_counts[CACHE_EVENTS[event]] += 1

    def saved(event, seconds, **_):
        if event == "/jax/compilation_cache/compile_time_saved_sec":
            cache_counts["saved"] += seconds

    jax.monitoring.register_event_listener(count)
    jax.monitoring.register_event_duration_secs_listener(saved)


def pytest_terminal_summary(terminalreporter):
    directory = jax.config.values.get("jax_compilation_cache_dir")
    if not jax.config.values.get("jax_enable_compilation_cache", True) or not directory:
        return
    entries = cache_entries(directory)
    terminalreporter.write_line(
        f"XLA compilation cache {directory}: {cache_counts['hits']} hits, {cache_counts['misses']} misses in the "
        f"pytest process ({max(cache_counts['saved'], 0):.0f} s of compiling saved); {entries} entries "
        f"(+{entries - cache_counts['entries']} this run, subprocesses included)")


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield
