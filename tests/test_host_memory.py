"""import pgjax keeps freed host memory mapped (pgjax/host_memory.py): a second large allocation
reuses the first one's pages instead of faulting them in again; PGJAX_KEEP_FREED_MEMORY=0 opts out."""
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


def page_faults_of_a_second_allocation(opt_out: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True,
                         env={**os.environ, "PGJAX_KEEP_FREED_MEMORY": opt_out}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_freed_block_is_reused_without_page_faults_unless_opted_out():
    kept, faults = page_faults_of_a_second_allocation("1")
    assert kept == "True" and faults < 1000                # 400 MB = ~98k pages of 4 KiB
    kept, faults = page_faults_of_a_second_allocation("0")
    assert kept == "False" and faults > 50_000
