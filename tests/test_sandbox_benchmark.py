"""benchmarks/sandbox.py end to end with tiny counts: the before side's children import pgjax from a
temporary worktree of the revision before the hardened sandbox (removed afterwards) and the after
side's from this tree, the rounds alternate, each side reports the layers its sandbox set up, and the
saved table holds the three after / before ratios and names its machine."""
import json
import subprocess
from pathlib import Path

import pytest
from helpers import load_benchmark

from pgjax.agents.sandbox import LAYERS, PythonSandbox

ROOT = Path(__file__).resolve().parents[1]


def git(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *arguments], capture_output=True, text=True, check=False)


@pytest.mark.slow
def test_both_sides_run_their_own_sandbox_in_alternating_rounds(tmp_path):
    benchmark = load_benchmark("sandbox")
    if git("cat-file", "-e", f"{benchmark.BEFORE}^{{commit}}").returncode:
        pytest.skip(f"no commit {benchmark.BEFORE} in this clone (a shallow one?)")
    layers = PythonSandbox(allow_weaker=True).run("pass").layers
    if not all(layers.get(layer) for layer in LAYERS if layer != "signals"):
        pytest.skip(f"this machine lacks sandbox layers: {layers}")
    worktrees = git("worktree", "list", "--porcelain").stdout
    out = tmp_path / "sandbox_cost.json"
    benchmark.main(["--calls", "3", "--episodes", "3", "--rounds", "2", "--warmup", "1", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert git("worktree", "list", "--porcelain").stdout == worktrees             # the before tree is gone
    assert saved["before"]["commit"].startswith(benchmark.BEFORE)
    before, after = saved["layers"]["before"], saved["layers"]["after"]
    assert "processes" in before and "syscalls" not in before and len(before) < len(after)
    assert all(after.get(layer) for layer in LAYERS if layer != "signals")
    assert saved["defaults"]["before"]["cpu_seconds"] == saved["defaults"]["after"]["cpu_seconds"] == 5
    for side, runs in saved["rounds"].items():
        assert [(run["round"], run["position"]) for run in runs] == (
            [(1, 0), (2, 1)] if side == "before" else [(1, 1), (2, 0)])
        (tree,) = {run["tree"] for run in runs}                                  # one tree a side, every round
        assert all(run["pgjax"] == f"{tree}/pgjax/__init__.py" for run in runs)
        assert tree == str(ROOT.resolve()) if side == "after" else not Path(tree).exists()
        for measure in ("call_seconds", "call_cpu_seconds", "episode_seconds"):
            assert len(saved["seconds"][measure][side]) == 6 and min(saved["seconds"][measure][side]) > 0
    table = "\n".join(saved["table"])
    assert "this tree's / lighter" in table and table.count("x [") == 3 and "Measured on" in saved["table"][-1]
    assert {"date", "commit", "command", "cpu"} <= set(saved["provenance"])
