"""How long CI and the test suite take a newcomer: a fresh clone of this repository's HEAD runs
``.ci/run`` (a new virtual environment, the README's install and test command: lint, types, the whole
suite) with an empty XLA compilation cache, as on a new machine; then, in that clone, the whole suite
again with the cache the first run filled (a second run, or a fresh clone on the same machine) and the
fast tier with it, each with the suite's own settings (two workers).

    python benchmarks/suite_time.py --json benchmarks/results/suite_time.json

``JAX_COMPILATION_CACHE_DIR`` points every run at one new temporary directory; pip's own cache is the
user's (a newcomer's first install also downloads, which is not timed here). The table gives each
run's wall time and the tests passed, skipped and failed; the JSON keeps each run's slowest tests
(pytest's own durations, setup included). Nothing else should run on the machine meanwhile: the
numbers are one run each.
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

from pgjax import markdown

ROOT = pathlib.Path(__file__).resolve().parent.parent
CI = "`.ci/run` in a fresh clone, empty cache (a new machine)"
RUNS = {CI: None,
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


def timed_run(clone: pathlib.Path, arguments: list[str] | None, cache: pathlib.Path, report: pathlib.Path) -> dict:
    """One run in ``clone`` with the compilation cache ``cache`` (``arguments`` None: ``.ci/run``, else
    ``python -m pytest`` with them in the clone's environment): its wall seconds, exit status, counts
    and slowest tests."""
    environment = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    environment.update(JAX_COMPILATION_CACHE_DIR=str(cache), PYTEST_ADDOPTS=f"--junitxml={report}")
    command = ([str(clone / ".ci" / "run")] if arguments is None
               else [str(clone / ".venv" / "bin" / "python"), "-m", "pytest", "-q", *arguments])
    start = time.perf_counter()
    done = subprocess.run(command, cwd=clone, env=environment)
    wall = time.perf_counter() - start
    found = outcomes(report) if report.exists() else {"passed": 0, "failed": 0, "skipped": 0, "seconds": {}}
    report.unlink(missing_ok=True)
    slowest = sorted(found.pop("seconds").items(), key=lambda item: -item[1])[:SLOWEST]
    return {"command": [".ci/run"] if arguments is None else ["python", *command[1:]], "wall_seconds": wall,
            "exit_status": done.returncode, **found,
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
        cache, clone = pathlib.Path(scratch) / "jax_compilation", pathlib.Path(scratch) / "clone"
        cache.mkdir()
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        for label, arguments in RUNS.items():
            runs[label] = timed_run(clone, arguments, cache, pathlib.Path(scratch) / "report.xml")
            if not (clone / ".venv" / "bin" / "python").exists():
                break                                       # CI could not build the clone's environment
    table = markdown.table(["run", "wall time", "passed", "skipped", "failed"],
                           [[label, minutes(r["wall_seconds"]), r["passed"], r["skipped"], r["failed"]]
                            for label, r in runs.items()])
    save_table(args.json, argv if argv is not None else sys.argv[1:], table.splitlines(), provenance, runs=runs)
    return max(r["exit_status"] for r in runs.values())


if __name__ == "__main__":
    sys.exit(main())
