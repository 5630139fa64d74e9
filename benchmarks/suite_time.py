"""How long the test suite takes a newcomer: the whole suite with an empty XLA compilation cache (a new
machine), then again with the cache that run filled (a second run, or a fresh clone on the same
machine), and the fast tier with it, each with the suite's own settings (two workers).

    python benchmarks/suite_time.py --json benchmarks/results/suite_time.json

Each run is ``python -m pytest`` in this checkout with ``JAX_COMPILATION_CACHE_DIR`` set to a new
temporary directory (the runs share it, in the order above); the table gives the wall time, the
tests passed and skipped, and each run's slowest tests (pytest's own durations, setup included) are
kept in the JSON. Nothing else should run on the machine meanwhile: the numbers are one run each.
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from provenance import record
from readme_tables import save_table

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUNS = {"whole suite, empty cache (a new machine)": [],
        "whole suite, warm cache (a second run, or a fresh clone on the same machine)": [],
        "fast tier (-m \"not slow\"), warm cache": ["-m", "not slow"]}
SLOWEST = 25


def outcomes(report: pathlib.Path) -> dict:
    """Counts of passed, failed (errors included) and skipped tests, and every test's seconds (its
    setup, call and teardown as pytest reports them), from a JUnit XML report."""
    counts, seconds = {"passed": 0, "failed": 0, "skipped": 0}, {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        seconds[name] = seconds.get(name, 0.0) + float(case.get("time") or 0.0)
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "seconds": seconds}


def timed_run(arguments: list[str], cache: pathlib.Path, report: pathlib.Path) -> dict:
    """One pytest run with the compilation cache ``cache``: its wall seconds, exit status, counts and
    slowest tests."""
    environment = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                           *arguments], cwd=ROOT, env=environment)
    wall = time.perf_counter() - start
    found = outcomes(report)
    slowest = sorted(found.pop("seconds").items(), key=lambda item: -item[1])[:SLOWEST]
    return {"arguments": arguments, "wall_seconds": wall, "exit_status": done.returncode, **found,
            "slowest": [{"test": name, "seconds": seconds} for name, seconds in slowest]}


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="save the table and the runs here (benchmarks/results/suite_time.json)")
    args = parser.parse_args(argv)
    provenance = record()
    runs = {}
    with tempfile.TemporaryDirectory(prefix="pgjax-suite-") as scratch:
        cache = pathlib.Path(scratch) / "jax_compilation"
        cache.mkdir()
        for label, arguments in RUNS.items():
            runs[label] = timed_run(arguments, cache, pathlib.Path(scratch) / "report.xml")
    table = ["| run | wall time | passed | skipped | failed |", "| --- | ---: | ---: | ---: | ---: |"]
    table += [f"| {label} | {minutes(r['wall_seconds'])} | {r['passed']} | {r['skipped']} | {r['failed']} |"
              for label, r in runs.items()]
    save_table(args.json, argv if argv is not None else sys.argv[1:], table, provenance, runs=runs)
    return max(r["exit_status"] for r in runs.values())


if __name__ == "__main__":
    sys.exit(main())
