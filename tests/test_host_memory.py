"""pgjax/host_memory.py: with PGJAX_KEEP_FREED_MEMORY=1, import pgjax keeps freed host memory
mapped (a second large allocation reuses the first one's pages instead of faulting them in again;
unset or 0, the default, malloc is left alone); ``python -m pgjax.run`` starts itself again with
glibc's transparent-huge-pages tunable unless the environment decides it, and the tunable cuts the
page faults of a fresh large block."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgjax import host_memory

ROOT = Path(__file__).resolve().parent.parent
THP = host_memory.transparent_huge_pages_mode()
HUGE_PAGES_APPLY = host_memory.with_huge_pages({}, THP, host_memory.glibc_version()) is not None

PROBE = """
import resource, sys
import pgjax
block = b"x" * 400_000_000                           # malloc'd and written (NumPy would madvise huge pages)
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = b"x" * 400_000_000
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(pgjax.KEEPS_FREED_MEMORY, faults)
"""


def page_faults_of_a_second_allocation(switch: str | None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "PGJAX_KEEP_FREED_MEMORY"}
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True,
                         env=env if switch is None else {**env, "PGJAX_KEEP_FREED_MEMORY": switch}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_block_is_reused_without_page_faults_only_when_asked():
    kept, faults = page_faults_of_a_second_allocation("1")
    assert kept == "True" and faults < 1000                # 400 MB = ~98k pages of 4 KiB
    for default in (None, "0"):
        kept, faults = page_faults_of_a_second_allocation(default)
        assert kept == "False" and faults > 50_000


@pytest.mark.parametrize("tunables, thp, libc, expected", [
    (None, "madvise", (2, 36), "glibc.malloc.hugetlb=1"),
    (None, "always", (2, 35), "glibc.malloc.hugetlb=1"),
    ("glibc.malloc.tcache_count=0", "madvise", (2, 36), "glibc.malloc.tcache_count=0:glibc.malloc.hugetlb=1"),
    ("glibc.malloc.hugetlb=0", "madvise", (2, 36), None),           # the user's choice stands
    ("glibc.malloc.hugetlb=1", "madvise", (2, 36), None),           # already on: no second restart
    ("glibc.malloc.mmap_max=0:glibc.malloc.hugetlb=2", "always", (2, 36), None),
    (None, "never", (2, 36), None),                                 # the kernel gives no THP
    (None, None, (2, 36), None),                                    # no THP file
    (None, "madvise", (2, 34), None),                               # glibc before the tunable
    (None, "madvise", None, None),                                  # not glibc
])
def test_huge_pages_are_added_only_where_they_change_something(tunables, thp, libc, expected):
    environ = {"HOME": "/h"} if tunables is None else {"HOME": "/h", "GLIBC_TUNABLES": tunables}
    result = host_memory.with_huge_pages(environ, thp, libc)
    assert result is None if expected is None else result == {"HOME": "/h", "GLIBC_TUNABLES": expected}


def test_the_thp_mode_is_the_bracketed_word(tmp_path, monkeypatch):
    (tmp_path / "enabled").write_text("always [madvise] never\n")
    monkeypatch.setattr(host_memory, "THP_MODE_FILE", tmp_path / "enabled")
    assert host_memory.transparent_huge_pages_mode() == "madvise"
    monkeypatch.setattr(host_memory, "THP_MODE_FILE", tmp_path / "missing")
    assert host_memory.transparent_huge_pages_mode() is None


FRESH_BLOCK = """
import resource
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = b"x" * 400_000_000                           # a fresh mmap'd block, written
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not HUGE_PAGES_APPLY, reason="needs glibc >= 2.35 and a kernel offering THP")
def test_huge_pages_fault_a_fresh_block_in_far_fewer_times():
    def faults(tunables):
        env = {**os.environ, "GLIBC_TUNABLES": tunables}
        return int(subprocess.run([sys.executable, "-c", FRESH_BLOCK], check=True, capture_output=True, text=True,
                                  env=env).stdout)
    assert faults("glibc.malloc.hugetlb=0") > 90_000 > 10 * faults("glibc.malloc.hugetlb=1")    # 400 MB: 98k pages


RECORDING_EXPERIMENT = """
import os, pathlib, runpy
pathlib.Path({out!r}).write_text(os.environ.get("GLIBC_TUNABLES", ""))
experiment = runpy.run_path({base!r})["experiment"]
"""


def tunables_seen_by_the_command(tmp_path, environ) -> str:
    """GLIBC_TUNABLES as the experiment file of ``python -m pgjax.run ... --print-config`` sees it."""
    out, exp = tmp_path / "tunables", tmp_path / "exp.py"
    exp.write_text(RECORDING_EXPERIMENT.format(out=str(out), base=str(ROOT / "experiments/arithmetic_grpo.py")))
    subprocess.run([sys.executable, "-m", "pgjax.run", str(exp), "--print-config"], check=True, capture_output=True,
                   cwd=ROOT, env=environ)
    return out.read_text()


@pytest.mark.skipif(not HUGE_PAGES_APPLY, reason="needs glibc >= 2.35 and a kernel offering THP")
def test_the_command_line_runs_with_huge_pages_unless_the_environment_decides(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    assert tunables_seen_by_the_command(tmp_path, environ) == "glibc.malloc.hugetlb=1"
    assert tunables_seen_by_the_command(tmp_path, {**environ, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) \
        == "glibc.malloc.hugetlb=0"
