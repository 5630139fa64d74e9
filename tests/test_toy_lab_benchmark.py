"""benchmarks/toy_lab.py: its record holds the table the docs quote and every timed call, and the table's
speed-up is the loop's median over the one call's."""
import json
import statistics

import pytest
from helpers import load_benchmark


@pytest.mark.slow
def test_the_record_holds_the_table_and_every_timed_call(tmp_path):
    path = tmp_path / "toy_lab.json"
    load_benchmark("toy_lab").main(["--seeds", "1", "--steps", "1", "--repeats", "2", "--json", str(path)])
    saved = json.loads(path.read_text())
    loop, vmap = (saved["seconds"][name] for name in ("loop", "vmap"))
    assert len(loop) == len(vmap) == 2 and min(loop + vmap) > 0
    row = next(line for line in saved["table"] if line.startswith("| one jitted call of vmaps |"))
    assert row.split("|")[4].strip() == f"{statistics.median(loop) / statistics.median(vmap):.1f}"
    assert saved["runs"] == 40 and saved["table"][-1].startswith("Measured on ")
