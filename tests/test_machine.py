"""pgjax.machine: the CPU read from /proc/cpuinfo as the shell reads it, and a description that
imports no JAX."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from pgjax import machine

CPUINFO = pathlib.Path("/proc/cpuinfo")


@pytest.mark.skipif(not CPUINFO.exists(), reason="reads /proc/cpuinfo (Linux)")
def test_the_cpu_is_what_the_shell_reads_from_proc_cpuinfo():
    model = subprocess.run(["sh", "-c", "grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2-"],
                           capture_output=True, text=True, check=True).stdout.strip()
    flags = subprocess.run(["sh", "-c", "grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2-"],
                           capture_output=True, text=True, check=True).stdout.split()
    found = machine.cpu()
    assert found["model"] == model
    assert found["instruction_sets"] == [f for f in machine.INSTRUCTION_SETS if f in flags]
    assert found["cores"] == os.cpu_count() and found["usable_cores"] == len(os.sched_getaffinity(0))
    assert machine.cpu_line(found) == (f"{model} ({', '.join(found['instruction_sets']) or 'no AVX'}; "
                                       f"{found['usable_cores']} cores)")


def test_describing_the_machine_imports_no_jax_and_names_its_backend_once_imported():
    script = ("import json, sys; from pgjax import machine; before = machine.describe(); "
              "imported = 'jax' in sys.modules; import jax; after = machine.describe(); "
              "print(json.dumps([before, imported, after]))")
    before, imported, after = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True,
                                                        text=True, check=True).stdout)
    assert not imported and "jax_backend" not in before
    assert after["jax_backend"] == "cpu" and after["jax_devices"] and after["cpu"] == before["cpu"]
    assert after["versions"]["jax"] == machine.versions(("jax",))["jax"] is not None


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="reads /proc/self/status (Linux)")
def test_the_peak_resident_memory_is_the_kernels_high_water_mark():
    """``peak_resident_bytes`` against VmHWM of /proc/self/status, after touching 200 MB it did not hold."""
    held = bytearray(200 * 10 ** 6)
    held[::4096] = b"\x01" * len(held[::4096])
    peak = machine.peak_resident_bytes()
    high_water = next(int(line.split()[1]) * 1024 for line in pathlib.Path("/proc/self/status").read_text()
                      .splitlines() if line.startswith("VmHWM:"))
    assert abs(peak - high_water) < 0.05 * high_water and peak > 200 * 10 ** 6
