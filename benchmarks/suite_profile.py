"""Where the test suite's time goes: for every test, its wall seconds and, from JAX's own monitoring
events, the seconds spent tracing Python to jaxprs, lowering them to StableHLO and in the backend
(an XLA compilation, or a read from the persistent compilation cache), the programs compiled and read
from the cache, and the CPU seconds of the subprocesses it waited for.

    python benchmarks/suite_profile.py --json benchmarks/results/suite_profile.json [pytest arguments]

runs ``python -m pytest`` (the suite's own settings: two workers) with an empty compilation cache, as
on a new machine, and this module loaded as a plugin in every worker. The table gives the slowest tests
with the share of their wall time that is JAX's compile path (trace + lower + backend) and the share
that is subprocesses; the JSON keeps every test. A test's module-scoped fixtures count in the first test
that uses them, as in pytest's own durations. Nothing else should run on the machine meanwhile.
"""
import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from provenance import record
from readme_tables import save_table

from pgjax import markdown

ROOT = pathlib.Path(__file__).resolve().parent.parent
SLOWEST = 25
EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
          "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
          "/jax/core/compile/backend_compile_duration": "backend"}
COUNTS = {"/jax/compilation_cache/cache_hits": "cache_hits", "/jax/compilation_cache/cache_misses": "compiled"}
OUTPUT = "PGJAX_SUITE_PROFILE"          # the directory each pytest process writes its records to


class Recorder:
    """The pytest plugin: JAX's compile-path durations and counts, summed per test."""

    def __init__(self, directory: pathlib.Path):
        self.directory, self.current, self.records, self.fixtures = directory, None, {}, []

    def entry(self) -> dict | None:
        if self.current is None:
            return None
        return self.records.setdefault(self.current, {"wall": 0.0, "trace": 0.0, "lower": 0.0, "backend": 0.0,
                                                      "compiled": 0, "cache_hits": 0, "subprocess_cpu": 0.0})

    def duration(self, event, seconds, **_):
        entry = self.entry()
        if entry is not None and event in EVENTS:
            entry[EVENTS[event]] += seconds

    def count(self, event, **_):
        entry = self.entry()
        if entry is not None and event in COUNTS:
            entry[COUNTS[event]] += 1

    def pytest_configure(self, config):
        import jax
        jax.monitoring.register_event_duration_secs_listener(self.duration)
        jax.monitoring.register_event_listener(self.count)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.current = item.nodeid
        entry = self.entry()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        yield
        entry["wall"] += time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        entry["subprocess_cpu"] += (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        self.current = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.perf_counter()
        yield
        if fixturedef.scope != "function":
            self.fixtures.append({"fixture": fixturedef.argname, "scope": fixturedef.scope,
                                  "module": request.node.nodeid.split("::")[0],
                                  "seconds": time.perf_counter() - start})

    def pytest_sessionfinish(self, session):
        worker = getattr(session.config, "workerinput", {}).get("workerid", "main")
        tests = {name: {key: round(value, 3) for key, value in entry.items()} for name, entry in self.records.items()}
        fixtures = [{**f, "seconds": round(f["seconds"], 3)} for f in self.fixtures if f["seconds"] >= 0.05]
        (self.directory / f"{worker}.json").write_text(json.dumps({"tests": tests, "fixtures": fixtures}))


def pytest_configure(config):
    """Registered when pytest loads this module with ``-p suite_profile`` and ``PGJAX_SUITE_PROFILE`` is set."""
    if os.environ.get(OUTPUT):
        config.pluginmanager.register(Recorder(pathlib.Path(os.environ[OUTPUT])), "pgjax-suite-profile")


def share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def profile_table(records: dict) -> list[str]:
    """The slowest tests: wall seconds, compile-path seconds (trace, lower, backend) and their share of
    the wall time, programs compiled and read from the cache, subprocess CPU seconds."""
    slowest = sorted(records.items(), key=lambda item: -item[1]["wall"])[:SLOWEST]
    rows = []
    for name, r in slowest:
        jax_path = r["trace"] + r["lower"] + r["backend"]
        rows.append([f"`{name.removeprefix('tests/')}`", f"{r['wall']:.1f}", f"{r['trace']:.1f}", f"{r['lower']:.1f}",
                     f"{r['backend']:.1f}", share(jax_path, r["wall"]), r["compiled"], r["cache_hits"],
                     f"{r['subprocess_cpu']:.1f}"])
    return markdown.table(["test", "wall s", "trace s", "lower s", "compile s", "compile path", "programs compiled",
                           "cache reads", "subprocess CPU s"], rows).splitlines()


def totals_table(records: dict, wall: float) -> list[str]:
    """The whole run: its wall time and, summed over the tests of both workers, each part."""
    total = {key: sum(r[key] for r in records.values()) for key in
             ("wall", "trace", "lower", "backend", "compiled", "cache_hits", "subprocess_cpu")}
    return markdown.table(
        ["run wall s", "tests", "test seconds (both workers)", "trace s", "lower s", "compile s",
         "programs compiled", "cache reads", "subprocess CPU s"],
        [[f"{wall:.0f}", len(records), f"{total['wall']:.0f}", f"{total['trace']:.0f}", f"{total['lower']:.0f}",
          f"{total['backend']:.0f}", total["compiled"], total["cache_hits"], f"{total['subprocess_cpu']:.0f}"]]
    ).splitlines()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="save the tables and every test's record here")
    args, pytest_arguments = parser.parse_known_args(argv)
    provenance = record()
    with tempfile.TemporaryDirectory(prefix="pgjax-profile-") as scratch:
        output, cache = pathlib.Path(scratch) / "records", pathlib.Path(scratch) / "jax_compilation"
        output.mkdir()
        cache.mkdir()
        environment = {**os.environ, OUTPUT: str(output), "JAX_COMPILATION_CACHE_DIR": str(cache),
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"),
                                                                   os.environ.get("PYTHONPATH")]))}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_profile", *pytest_arguments],
                              cwd=ROOT, env=environment)
        wall = time.perf_counter() - start
        records, fixtures = {}, {}
        for part in sorted(output.glob("*.json")):
            found = json.loads(part.read_text())
            records.update(found["tests"])
            fixtures[part.stem] = found["fixtures"]
    table = totals_table(records, wall) + [""] + profile_table(records)
    save_table(args.json, argv if argv is not None else sys.argv[1:], table, provenance,
               exit_status=done.returncode, tests=records, fixtures=fixtures)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
