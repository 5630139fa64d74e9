"""benchmarks/population.py: the projection of a whole experiment, the token agreement and the table
from hand-made numbers, and a 4-member grid of a tiny experiment end to end."""
import json
import subprocess
import sys

import numpy as np
import pytest
from helpers import load_benchmark

population = load_benchmark("population")

TINY = """
from pgjax.config import Experiment, ModelSection, TaskSection, WarmStartSection
from pgjax.rollout.collect import RolloutConfig

def experiment():
    return Experiment(name="tiny_population", algorithm="dr_grpo", steps=30, eval_every=10, prompts_per_step=4,
                      eval_prompts=8, task=TaskSection(options={"digits": 1}),
                      model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                      warm_start=WarmStartSection(steps=3, batch_size=8),
                      rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=4))
"""


def test_the_projection_adds_the_steady_steps_and_evaluations_to_the_fixed_phases():
    times = {"build": 1.0, "warm_start": 2.0, "eval_first": 3.0, "first_steps": 4.0, "eval_last": 0.5}
    runs = {**times, "build": 11.0}
    out = population.projected(times, runs, [9, 9, 1, 1, 3], [9, 9, 2, 2, 2], full_steps=12, eval_every=5)
    assert out["population"] == pytest.approx(10.0 + 10 * 1.0 + 3 * 0.5)     # median of the steady steps: 1
    assert out["runs"] == pytest.approx(20.0 + 10 * 2.0 + 3 * 0.5)
    assert out["ratio"] == pytest.approx(out["runs"] / out["population"])


def test_agreement_finds_each_members_first_differing_step():
    same, other = np.zeros((2, 3)), np.ones((2, 3))
    pop_tokens = [np.stack([same, same]), np.stack([same, other])]       # [steps][members]
    run_tokens = [[same, same], [same, same]]
    records = {"policy_loss": 1.0, "grad_norm": 2.0}
    pop_records = [[records, {**records, "grad_norm": 2.2}], [records, records]]
    run_records = [[records, records], [records, records]]
    out = population.agreement(pop_tokens, run_tokens, pop_records, run_records, steps=2)
    assert [m["first_token_difference"] for m in out["members"]] == [None, 2] and out["identical_members"] == 1
    assert out["members"][1]["max_relative_loss_difference"] == pytest.approx(0.1)


@pytest.mark.slow
def test_a_tiny_grid_end_to_end(tmp_path):
    file = tmp_path / "tiny.py"
    file.write_text(TINY)
    out = tmp_path / "population.json"
    done = subprocess.run([sys.executable, str(population.__file__), "--experiment", str(file), "--seeds", "1",
                           "--steps", "7", "--sizes", "4", "--scaling-steps", "7", "--json", str(out), "--plot",
                           str(tmp_path / "population.png")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = json.loads(out.read_text())
    assert saved["provenance"]["command"] and (tmp_path / "population.png").is_file()
    compared = saved["compare"]
    assert len(compared["members"]) == 4 and [p["vmap_width"] for p in compared["populations"]] == [1, 4]
    one_at_a_time = compared["populations"][0]        # each member computed as its single run computes it
    assert one_at_a_time["agreement"]["identical_members"] == 4
    assert one_at_a_time["eval_first"] == compared["runs"]["eval_first"]
    assert "| **whole run** |" in "\n".join(saved["table"])
