"""benchmarks/accelerator.py --tiny runs on CPU and prints its table with finite, positive numbers, and
saves it with its provenance (--json)."""
import json
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
def test_tiny_accelerator_benchmark_runs_on_cpu(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    saved = tmp_path / "accelerator.json"
    command = [sys.executable, "benchmarks/accelerator.py", "--tiny", "--repeats", "1", "--json", str(saved)]
    done = subprocess.run(command, cwd=ROOT, check=False, env=env, capture_output=True, text=True, timeout=300)
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
    record = json.loads(saved.read_text())
    assert record["table"][0] == HEADER and record["argv"] == ["--tiny", "--repeats", "1", "--json", str(saved)]
    assert record["provenance"]["commit"] and "jax_devices" in json.dumps(record["provenance"])
    assert [row["measurement"] for row in record["rows"]] == [n for n in table if n not in ("measurement", "---")]
    assert "attention einsum" in record["table"][-3]
    refused = subprocess.run([sys.executable, "benchmarks/accelerator.py", "--tiny", "--attention", "cudnn"], cwd=ROOT,
                             check=False, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "accelerator.py: model.attention='cudnn' needs an NVIDIA GPU with cuDNN; this process's JAX devices are "
        "cpu (cpu): use model.attention=einsum there"], refused.stderr
