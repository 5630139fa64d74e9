"""benchmarks/suite_profile.py runs pytest with its recorder in the test process: a test that compiles
a program has its trace, lowering and backend seconds and the program counted, a test that waits for
a subprocess has that subprocess's CPU seconds, and the saved table and records say so, with provenance."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = '''
import subprocess, sys
import jax, jax.numpy as jnp

def test_compiles_one_program():
    assert float(jax.jit(lambda x: x * 2 + 1)(jnp.arange(3.0)).sum()) == 9.0

def test_waits_for_a_subprocess():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
'''


@pytest.mark.slow
def test_the_profile_attributes_compiles_and_subprocesses_to_their_tests(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    saved = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "benchmarks/suite_profile.py", "--json", str(saved), "-n", "0",
                           "-p", "no:cacheprovider", str(tmp_path / "test_sample.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(saved.read_text())
    assert result["exit_status"] == 0 and result["provenance"]["commit"]
    tests = {name.split("::")[1]: entry for name, entry in result["tests"].items()}
    assert set(tests) == {"test_compiles_one_program", "test_waits_for_a_subprocess"}
    compiled, waited = tests["test_compiles_one_program"], tests["test_waits_for_a_subprocess"]
    assert compiled["compiled"] >= 1 and compiled["cache_hits"] == 0      # an empty cache: compiled, not read
    assert compiled["trace"] > 0 and compiled["lower"] > 0 and compiled["backend"] > 0
    assert compiled["trace"] + compiled["lower"] + compiled["backend"] <= compiled["wall"]
    assert waited["subprocess_cpu"] > 0.05 and waited["compiled"] == 0 and waited["backend"] == 0
    assert compiled["subprocess_cpu"] == 0
    table = "\n".join(result["table"])
    assert "| test | wall s | trace s |" in table and "test_waits_for_a_subprocess" in table
    totals = result["table"][2].strip("|").split("|")
    assert int(totals[1]) == 2 and int(totals[6]) == compiled["compiled"] + waited["compiled"]
