"""pgjax/host_memory.py: with PGJAX_KEEP_FREED_MEMORY=1, import pgjax keeps freed host memory
mapped (a second large allocation reuses the first one's pages instead of faulting them in again;
unset or 0, the default, malloc is left alone); ``python -m pgjax.run`` leaves glibc's tunables
(transparent huge pages among them) as the user's environment sets them."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgjax import host_memory

ROOT = Path(__file__).resolve().parent.parent

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


def test_the_command_line_leaves_the_malloc_tunables_to_the_user(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    assert tunables_seen_by_the_command(tmp_path, environ) == ""
    assert tunables_seen_by_the_command(tmp_path, {**environ, "GLIBC_TUNABLES": host_memory.HUGE_PAGES}) \
        == host_memory.HUGE_PAGES
