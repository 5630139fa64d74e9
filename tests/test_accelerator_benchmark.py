"""benchmarks/accelerator.py --tiny runs on CPU and prints its table with finite, positive numbers."""
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER = "| measurement | shape | time (s) | achieved | peak / bound | fraction |"
ROWS = ("update step (GRPO, AdamW)", "prepare (old + ref log-probs)", "sampler (generate)",
        "log-prob grad, plain logits", "log-prob grad, chunked")


def number(text):
    """The first number in ``text`` (thousands separators allowed)."""
    return float(re.search(r"[-+]?\d[\d,]*\.?\d*(?:e[-+]?\d+)?", text).group().replace(",", ""))


@pytest.mark.slow
def test_tiny_accelerator_benchmark_runs_on_cpu():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "benchmarks/accelerator.py", "--tiny", "--repeats", "1"], cwd=ROOT,
                          check=False, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert HEADER in out and "parameters:" in out and "command:" in out, out
    table = {cells[0]: cells[1:] for line in out.splitlines() if line.startswith("| ")
             for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    for prefix in ROWS:
        name = next((n for n in table if n.startswith(prefix)), None)
        assert name is not None, (prefix, out)
        _, seconds, achieved, _, _ = table[name]
        for value in (number(seconds), number(achieved)):
            assert math.isfinite(value) and value > 0, (name, table[name])
    update = table["update step (GRPO, AdamW)"]
    assert update[2].endswith("TFLOP/s") and update[4] == "MFU n/a", update  # CPU: no peak in the table
    assert table["sampler (generate)"][2].endswith("tok/s"), table
    plain, chunked = (table[n] for n in table if n.startswith("log-prob grad"))
    assert number(plain[2].removeprefix("temp")) > 0 and number(chunked[2].removeprefix("temp")) > 0, table
