"""One experiment file on 1 device, on 8 simulated devices, and on 2 processes x 4 devices
(``jax.distributed`` on localhost with CPU collectives): the same metrics and parameters; a
checkpoint written by the 2-process run restores in 1 process and continues identically; the
2-process run logs the completions of process 0's rows, those of the 1-device run. Multi-turn
episodes with the calculator (a warm start on worked episodes, then RL and its evaluation) on 2
processes give the 1-device metrics too."""
import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import simulated_devices

from pgjax.models import hf
from pgjax.train.records import COST_KEYS
from pgjax.train.sinks import read_completions

EXPERIMENT = """
from pgjax.config import Experiment, ModelSection, TaskSection, WarmStartSection
from pgjax.config import OptimConfig
from pgjax.rollout.collect import RolloutConfig

# Adam's eps at 1e-3: rounding-level gradient differences between meshes are not amplified to
# lr-sized steps (with eps 1e-8, runs on two meshes drift apart and soon sample different tokens)

def experiment():
    return Experiment(name="multihost", algorithm="grpo", steps=5, prompts_per_step=8, eval_every=1,
                      eval_prompts=32, checkpoint_every=3, task=TaskSection(options={"digits": 1}),
                      model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=16),
                      warm_start=WarmStartSection(steps=150, batch_size=16, optim=OptimConfig(lr=2e-2, eps=1e-3)),
                      optim=OptimConfig(lr=1e-2, eps=1e-3),
                      rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=6))
"""
TOOLS_EXPERIMENT = """
from pgjax.config import Experiment, ModelSection, TaskSection, WarmStartSection
from pgjax.config import OptimConfig
from pgjax.rollout.collect import RolloutConfig

def experiment():
    return Experiment(name="multihost_tools", algorithm="grpo", steps=2, prompts_per_step=8, eval_every=1,
                      eval_prompts=16, checkpoint_every=2,
                      task=TaskSection(name="helpers:SumWithCalculator", tools="calculator"),
                      model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=16),
                      warm_start=WarmStartSection(steps=60, batch_size=8, optim=OptimConfig(lr=1e-2, eps=1e-3)),
                      optim=OptimConfig(lr=1e-2, eps=1e-3),
                      rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=360, max_new_tokens=32,
                                            max_turns=2, max_observation_tokens=24))
"""
ROOT = pathlib.Path(__file__).parent.parent


def launch(file, directory, devices: int, *extra, process: int | None = None):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": simulated_devices(devices)}
    env.pop("JAX_COORDINATOR_ADDRESS", None)
    log = open(pathlib.Path(directory).parent / f"{pathlib.Path(directory).name}-{process or 0}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "pgjax.run", str(file), "--no-progress",
                             "--set", f"run_dir={directory}", *extra], env=env, stdout=log,
                            stderr=subprocess.STDOUT, text=True), log.name


def finish(*runs, timeout=900):
    for proc, log in runs:
        assert proc.wait(timeout=timeout) == 0, pathlib.Path(log).read_text()[-5000:]


def metrics(directory) -> list[dict]:
    lines = (pathlib.Path(directory) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k not in COST_KEYS} for x in lines]


def assert_same_metrics(got: list[dict], want: list[dict]):
    """Counts and accuracies exactly (the same tokens were sampled); losses to float32 rounding."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys(), (a, b)
        for key in a:
            if isinstance(a[key], float) and isinstance(b[key], float):
                assert np.isclose(a[key], b[key], rtol=1e-3, atol=1e-5), (a["step"], key, a[key], b[key])
            else:
                assert a[key] == b[key], (a["step"], key, a[key], b[key])


def assert_same_parameters(a, b):
    close = lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)  # noqa: E731
    jax.tree.map(close, nnx.state(hf.load(pathlib.Path(a) / "final")), nnx.state(hf.load(pathlib.Path(b) / "final")))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_one_experiment_file_on_one_device_eight_devices_and_two_processes(tmp_path):
    file = tmp_path / "multihost.py"
    file.write_text(EXPERIMENT)
    # every run starts from the same supervised warm start (150 Adam steps amplify rounding
    # differences between meshes into different weights); `steps=0` runs only the warm start
    finish(launch(file, tmp_path / "warm", 1, "--set", "steps=0"))
    warm = ("--set", f"model.path={tmp_path / 'warm' / 'final'}", "--set", "warm_start.steps=0")
    logged = ("--set", "logging.completions_every=1", "--set", "logging.completions_per_step=32")   # every row
    single = launch(file, tmp_path / "single", 1, *warm, *logged)
    eight = launch(file, tmp_path / "eight", 8, *warm, "--set", "steps=3", "--set", "mesh.fsdp=2",
                   "--set", "mesh.tensor=2")
    finish(single, eight)
    reference = metrics(tmp_path / "single")
    assert 0 < np.mean([r["reward"] for r in reference[1:]]) < 1       # not a trivial comparison
    assert_same_metrics(metrics(tmp_path / "eight"), [r for r in reference if r["step"] <= 3])

    port = free_port()
    two = [launch(file, tmp_path / "two", 4, *warm, *logged, "--set", "steps=3", "--set", "mesh.fsdp=2",
                  "--set", f"distributed.coordinator_address=127.0.0.1:{port}",
                  "--set", "distributed.num_processes=2", "--set", f"distributed.process_id={i}", process=i)
           for i in range(2)]
    finish(*two)
    assert_same_metrics(metrics(tmp_path / "two"), [r for r in reference if r["step"] <= 3])
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir() if p.name.isdigit()) == ["0", "3"]

    # the 2-process (8-device) checkpoint of step 3 continues on 1 process with 1 device
    finish(launch(file, tmp_path / "two", 1, *warm, *logged, "--resume"))
    assert_same_metrics(metrics(tmp_path / "two"), reference)
    assert_same_parameters(tmp_path / "two", tmp_path / "single")

    # completions: on 2 processes drawn among process 0's rows (0-15 of 32), after the resume all 32
    got, want = read_completions(tmp_path / "two"), read_completions(tmp_path / "single")
    want = [r for r in want if r["step"] > 3 or r["row"] < 16]
    assert [(r["step"], r["row"]) for r in got] == [(r["step"], r["row"]) for r in want] and len(got) == 3 * 16 + 2 * 32
    for a, b in zip(got, want, strict=True):
        assert {k: v for k, v in a.items() if k != "advantage"} == {k: v for k, v in b.items() if k != "advantage"}
        assert a["advantage"] == pytest.approx(b["advantage"], rel=1e-3, abs=1e-5)


def two_processes(file, directory, *extra):
    """``file`` on 2 processes x 4 simulated devices (fsdp 2), each process half the batch's rows."""
    port = free_port()
    return [launch(file, directory, 4, *extra, "--set", "mesh.fsdp=2",
                   "--set", f"distributed.coordinator_address=127.0.0.1:{port}", "--set", "distributed.num_processes=2",
                   "--set", f"distributed.process_id={i}", process=i) for i in range(2)]


@pytest.mark.slow
def test_multi_turn_tool_episodes_on_two_processes_give_the_one_device_metrics(tmp_path):
    """Each process plays its own rows' episodes; the processes agree on when the turns end and on
    each observation block's width and the batch's trimmed width (otherwise they would call different
    collectives, and hang). From a warm start on worked episodes (so the tiny model calls the
    calculator), 2 more warm-start steps (the demonstrations split over the processes), then 2 RL
    steps with greedy evaluations: the 1-device run's records, calls and turns exactly."""
    file = tmp_path / "tools.py"
    file.write_text(TOOLS_EXPERIMENT)
    finish(launch(file, tmp_path / "warm", 1, "--set", "steps=0"))
    warm = ("--set", f"model.path={tmp_path / 'warm' / 'final'}", "--set", "warm_start.steps=2",
            "--set", "warm_start.optim.lr=1e-4")           # a small step: the model keeps calling the tool
    finish(launch(file, tmp_path / "single", 1, *warm), *two_processes(file, tmp_path / "two", *warm))
    reference = metrics(tmp_path / "single")
    assert len(reference) == 3 and reference[1]["calls"] > 0.5 and reference[1]["turns"] > 1.5
    assert_same_metrics(metrics(tmp_path / "two"), reference)
