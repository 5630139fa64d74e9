"""The sampler's own log-probs reach the update and the mismatch is logged every step; asynchronous
rollouts (rollout.staleness) sample ahead with explicit weight copies, use each batch s updates
late, and resume exactly with batches in flight, on one device and on an 8-device mesh."""
import dataclasses
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import EMIT_X, XLA_COLLECTIVE_HANG, comparable, simulated_devices, tiny_experiment

from pgjax import config as config_lib
from pgjax.config import AlgorithmSection, ConfigError, UpdateConfig
from pgjax.models import hf
from pgjax.rollout.collect import keep_columns, pad_columns
from pgjax.train.records import MISMATCH_KEYS
from pgjax.train.sinks import read_records
from pgjax.train.trainer import Trainer, train


def stale_experiment(tmp_path, staleness=1, correction="token", **rollout):
    exp = tiny_experiment(tmp_path, task=EMIT_X, steps=4)
    return dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, staleness=staleness, **rollout),
                               algorithm=AlgorithmSection(correction=correction))


def test_same_precision_sampler_and_learner_agree_to_float32_round_off(tmp_path):
    """Recomputing the sampler's batch teacher-forced gives its log-probs back (KV-cache decode vs one
    forward pass, both float32): the mismatch metrics are round-off."""
    exp = dataclasses.replace(tiny_experiment(tmp_path, task=EMIT_X), update=UpdateConfig(recompute_old_logprobs=True))
    trainer = Trainer(exp)
    record = trainer.step()
    assert record["mismatch_abs_max"] < 2e-6 and record["mismatch_kl"] < 1e-11 and record["mismatch_outside"] == 0
    assert record["policy_lag"] == 0


def test_a_bfloat16_sampler_for_a_float32_learner_is_measured_and_corrected(tmp_path):
    exp = stale_experiment(tmp_path, staleness=0, correction="token", compute_dtype="bfloat16")
    trainer = Trainer(exp)
    assert trainer.pipeline.graphdef is not trainer.learner.graphdef
    record = trainer.step()
    assert 1e-4 < record["mismatch_abs"] < 0.1 and record["mismatch_abs_max"] > record["mismatch_abs"]
    assert 0 < record["is_weight"] < 2 and record["is_limited"] == 0.0


def test_bfloat16_sampler_weights_are_measured_and_smaller_than_a_bfloat16_sampler(tmp_path):
    """``rollout.weight_dtype=bfloat16``: the sampler's weights and weight matmuls in bfloat16 with
    float32 sums, activations in float32. Its log-probs differ from the float32 learner's by more than
    round-off and by less than those of a sampler that also computes in bfloat16 (same batch: step 1
    of the same seed samples the same prompts)."""
    weights = Trainer(stale_experiment(tmp_path / "w", staleness=0, weight_dtype="bfloat16"))
    assert weights.pipeline.graphdef is not weights.learner.graphdef
    whole = Trainer(stale_experiment(tmp_path / "c", staleness=0, compute_dtype="bfloat16"))
    by_weights, by_compute = weights.step(), whole.step()
    assert 1e-5 < by_weights["mismatch_abs"] < by_compute["mismatch_abs"] < 0.1
    assert np.isfinite(by_weights["policy_loss"]) and by_weights["kept"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [1, 2])
def test_stale_rollouts_run_log_their_lag_and_resume_exactly(tmp_path, staleness):
    """A run interrupted after step 2 (its checkpoint holds the batches in flight) and resumed ends
    with the uninterrupted run's metrics and weights; batch t is used s updates after its sampling."""
    whole = stale_experiment(tmp_path / "whole", staleness)
    train(whole, progress=False)
    records = read_records(whole.run_dir)
    assert [r.get("policy_lag") for r in records[1:]] == [min(t, staleness) for t in range(4)]
    assert all(r[key] is not None for r in records[1:] for key in MISMATCH_KEYS)
    assert max(r["mismatch_abs"] for r in records[1:]) > 1e-3          # stale batches differ from the learner
    saved = json.loads(next((tmp_path / "whole" / "run" / "checkpoints").glob("*/record/metadata")).read_text())
    assert len(saved["in_flight"]) == staleness

    halves = stale_experiment(tmp_path / "halves", staleness)
    train(dataclasses.replace(halves, steps=2), progress=False)
    train(halves, resume=True, progress=False)
    assert comparable(f"{halves.run_dir}/metrics.jsonl") == comparable(f"{whole.run_dir}/metrics.jsonl")
    for a, b in zip(jax.tree.leaves(nnx.state(hf.load(f"{whole.run_dir}/final"))),
                    jax.tree.leaves(nnx.state(hf.load(f"{halves.run_dir}/final"))), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_staleness_zero_is_the_on_policy_run(tmp_path):
    """``staleness=0`` samples, then updates, with the parameters being updated: lag 0, and the
    sampler's copy of the weights is never taken."""
    trainer = Trainer(stale_experiment(tmp_path, staleness=0, correction="ignore"))
    records = [trainer.step() for _ in range(2)]
    assert [r["policy_lag"] for r in records] == [0, 0] and trainer.pipeline.in_flight == []


def test_the_sampler_weights_are_a_copy_that_outlives_the_update(tmp_path):
    trainer = Trainer(stale_experiment(tmp_path))
    copy = trainer.pipeline.weight_copy(trainer.state.params)
    before = jax.tree.map(np.asarray, copy)
    trainer.step()                                          # donates the state's own buffers
    trainer.step()
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(copy), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert any(not np.array_equal(a, np.asarray(n))
               for a, n in zip(jax.tree.leaves(before), jax.tree.leaves(trainer.state.params), strict=True))


def test_a_batch_widened_for_a_checkpoint_is_cut_back_exactly(tmp_path):
    trainer = Trainer(stale_experiment(tmp_path))
    trainer.pipeline.fill(trainer.state, trainer.step_count)
    batch = trainer.pipeline.in_flight[0]
    full, meta = batch.saved(prompt_width=4, budget=3)
    assert full.tokens.shape[1] == 7
    back = keep_columns(full, meta["prompt_columns"], meta["response_columns"])
    for a, b in zip(jax.tree.leaves(batch.rollout), jax.tree.leaves(back), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert back.budget == batch.rollout.budget
    assert pad_columns(batch.rollout, 4, 3).mask.shape == (16, 3)


@pytest.mark.parametrize("assignments, message", [
    (["rollout.staleness=-1"], "rollout.staleness=-1 is invalid: an integer >= 0"),
    (["rollout.compute_dtype=float16"], "rollout.compute_dtype='float16' is invalid: float32, bfloat16"),
    (["rollout.weight_dtype=float16"], "rollout.weight_dtype='float16' is invalid: bfloat16 or empty"),
    (["algorithm.correction=tis"], "algorithm.correction='tis' is invalid: one of ignore, token"),
    (["algorithm.preset=rloo", "algorithm.correction=behaviour_ratio"], "ratio 'on_policy' has none"),
])
def test_bad_asynchronous_settings_are_config_errors(tmp_path, assignments, message):
    with pytest.raises(ConfigError, match=message):
        config_lib.override(tiny_experiment(tmp_path), assignments).algorithm.build()


def test_the_switches_are_experiment_keys(tmp_path):
    exp = config_lib.override(tiny_experiment(tmp_path), [
        "rollout.staleness=2", "rollout.compute_dtype=bfloat16", "algorithm.correction=sequence",
        "algorithm.correction_mode=mask", "algorithm.hparams.is_cap=3", "algorithm.hparams.is_floor=0.2"])
    algo = exp.algorithm.build()
    assert (algo.spec.correction, algo.spec.correction_mode) == ("sequence", "mask")
    assert (float(algo.hparams.is_cap), float(algo.hparams.is_floor)) == (3.0, 0.2)
    assert exp.rollout.staleness == 2 and exp.rollout.compute_dtype == "bfloat16"


# ---------------------------------------------------------------- on an 8-device mesh (a subprocess)

MESH_SCRIPT = """
import dataclasses, pathlib, sys
import jax
sys.path.insert(0, {tests!r})
from pgjax.parallel.mesh import MeshConfig
from pgjax.train.sinks import read_records
from pgjax.train.trainer import train
from test_async_rollouts import stale_experiment
assert len(jax.devices()) == 8
root = pathlib.Path({root!r})
for name, steps, resume in (("whole", 4, False), ("halves", 2, False), ("halves", 4, True)):
    exp = stale_experiment(root / name, 1)
    exp = dataclasses.replace(exp, steps=steps, mesh=MeshConfig(data=2, fsdp=2, tensor=2),
                              run_dir=str(root / name / "run"))
    train(exp, resume=resume, progress=False)
print("LAGS", [r.get("policy_lag") for r in read_records(root / "whole" / "run")])

# the sampler on 4 devices of its own, the learner on the other 4: explicit weight and batch copies
import numpy as np
from pgjax.train.trainer import Trainer
exp = dataclasses.replace(stale_experiment(root / "split", 1), mesh=MeshConfig(data=2, fsdp=2))
exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, sampler_devices=4))
trainer = Trainer(exp)
learner_devices, sampler_devices = set(trainer.mesh.devices.flat), set(trainer.pipeline.sampler_mesh.devices.flat)
assert len(learner_devices) == len(sampler_devices) == 4 and not learner_devices & sampler_devices
weights = trainer.pipeline.weight_copy(trainer.state.params)
for copy, own in zip(jax.tree.leaves(weights), jax.tree.leaves(trainer.state.params), strict=True):
    assert copy.sharding.device_set == sampler_devices and own.sharding.device_set <= learner_devices
    np.testing.assert_array_equal(np.asarray(copy), np.asarray(own))
records = [trainer.step() for _ in range(3)]
assert all(leaf.sharding.device_set <= learner_devices
           for leaf in jax.tree.leaves(trainer.pipeline.in_flight[0].rollout))
print("SPLIT LAGS", [r["policy_lag"] for r in records], "REWARD", records[-1]["reward"])
"""


@pytest.mark.slow
def test_staleness_one_on_an_8_device_mesh_runs_and_resumes_exactly_and_on_a_sampler_sub_mesh(tmp_path):
    tests = os.path.dirname(__file__)
    script = MESH_SCRIPT.format(tests=tests, root=str(tmp_path))
    env = {**os.environ, "XLA_FLAGS": simulated_devices(8), "PYTHONPATH": os.path.dirname(tests)}
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
        if done.returncode == 0 or XLA_COLLECTIVE_HANG not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-4000:]
    assert "LAGS [None, 0, 1, 1, 1]" in done.stdout and "SPLIT LAGS [0, 1, 1]" in done.stdout
    assert comparable(tmp_path / "halves" / "run" / "metrics.jsonl") == \
        comparable(tmp_path / "whole" / "run" / "metrics.jsonl")
