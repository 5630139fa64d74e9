"""With PGJAX_KEEP_FREED_MEMORY=1, import pgjax keeps freed host memory mapped (pgjax/host_memory.py):
a second large allocation reuses the first one's pages instead of faulting them in again. Unset or
0 (the default), malloc is left alone."""
import os
import subprocess
import sys

import pytest

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
