"""benchmarks/async_overlap.py: the interval arithmetic and the trace reading against hand-made
traces, and one traced staleness-1 row of a tiny experiment end to end."""
import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_plotted

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("async_overlap", ROOT / "benchmarks" / "async_overlap.py")
async_overlap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(async_overlap)

TINY = """
from pgjax.config import Experiment, ModelSection, TaskSection, WarmStartSection
from pgjax.rollout.collect import RolloutConfig

def experiment():
    return Experiment(name="tiny_overlap", steps=10, prompts_per_step=4, eval_every=100, eval_prompts=8,
                      task=TaskSection(options={"digits": 1}),
                      model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                      warm_start=WarmStartSection(steps=3, batch_size=8),
                      rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=4))
"""


def test_merged_intervals_and_the_length_covered():
    assert async_overlap.merged([(3, 4), (0, 1), (0.5, 2), (2, 2.5)]) == [(0, 2.5), (3, 4)]
    union = [(0, 2.5), (3, 4)]
    assert async_overlap.covered((2, 3.5), union) == pytest.approx(1.0)       # 0.5 in the first, 0.5 in the second
    assert async_overlap.covered((5, 6), union) == 0.0


def _trace(path, events):
    threads = [{"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}}
               for tid, name in ((1, "python"), (2, "tf_XLAEigen/1"), (3, "tf_XLAPjRtCpuClient/2"))]
    spans = [{"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": start, "dur": end - start}
             for tid, name, start, end in events]
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": threads + spans}).encode()))


def test_timeline_reads_the_phases_and_the_share_of_scoring_over_device_work(tmp_path):
    trace = tmp_path / "perfetto_trace.json.gz"
    _trace(trace, [(1, "pgjax/update_dispatch", 1000, 1100), (1, "pgjax/score", 1100, 1500),
                   (1, "pgjax/read_back", 1100, 1200), (1, "pgjax/decode_and_score", 1200, 1400),
                   (1, "some python frame", 0, 5000),
                   (2, "fusion", 1050, 1250), (3, "ThunkExecutor::Execute (wait for completion)", 1240, 1300),
                   (2, "ThreadpoolListener::StartRegion", 1300, 1400), (2, "end: fusion", 1350, 1390),
                   (2, "SlinkyThreadPool::Await", 1300, 1400)])
    got = async_overlap.timeline(trace)
    assert [name for name, _, _ in got["host"]] == ["pgjax/update_dispatch", "pgjax/score", "pgjax/read_back",
                                                    "pgjax/decode_and_score"]
    assert got["host"][0][1:] == (0.0, pytest.approx(1e-4))                  # seconds from the first phase
    assert got["device"] == [(pytest.approx(5e-5), pytest.approx(3e-4))]    # 1050..1300 us, markers left out
    assert got["score_seconds"] == pytest.approx(2e-4)
    assert got["score_over_device"] == pytest.approx(100 / 200)             # 1200..1300 of 1200..1400


@pytest.mark.slow
def test_a_traced_staleness_one_row_scores_over_the_update(tmp_path):
    experiment = tmp_path / "tiny.py"
    experiment.write_text(TINY)
    out = tmp_path / "overlap.json"
    done = subprocess.run([sys.executable, "benchmarks/async_overlap.py", "--experiment", str(experiment),
                           "--runs", str(tmp_path / "runs"), "--rows", "0", "1", "--steps", "2", "--warmup", "2",
                           "--json", str(out), "--timeline", str(tmp_path / "timeline.png")],
                          cwd=ROOT, env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    saved = json.loads(out.read_text())
    on_policy, stale = saved["rows"]
    assert stale["label"] == "staleness 1" and "| staleness 1 |" in "\n".join(saved["table"])
    for row in (on_policy, stale):
        assert {name for name, _, _ in row["host"]} == set(async_overlap.HOST_PHASES + async_overlap.SCORING_PHASES)
        assert row["device"] and all(0 < row[k] for k in async_overlap.PHASES)
    assert 0 <= on_policy["score_over_device"] <= 1 and 0 <= stale["score_over_device"] <= 1
    assert_plotted(tmp_path / "timeline.png")
