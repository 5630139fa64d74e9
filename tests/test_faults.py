"""Faults a training run meets, injected one by one; each test asserts what the user sees and what is
left on disk. NaN / inf rewards and non-finite updates never reach a checkpoint or ``final/``; bad
dataset records are named before anything is written; a run killed with SIGKILL resumes bit for bit
(metrics, logged completions, weights); SIGTERM and Ctrl-C finish the step and checkpoint it; a full
disk at a checkpoint stops in one line. Functions and tasks defined here are addressable as
``test_faults:NAME``. The faults of one module are in its own test file: checkpoints
(test_checkpoints.py), the run directory (test_run_dir.py, test_run_dir_faults.py), input fingerprints
(test_inputs.py), the user's reward functions (test_rollout.py)."""
import dataclasses
import itertools
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import (
    GOOD,
    SignalAt,
    assert_no_nan_on_disk,
    assert_same_tree,
    comparable,
    copy_of,
    dataset_experiment,
    experiment_file,
    finite_tree,
    read_events,
    sampled_rollout,
    tiny_experiment,
    tiny_learner,
)

from pgjax import config as config_lib
from pgjax import run as cli
from pgjax.config import ConfigError, UpdateConfig
from pgjax.errors import RunStopped
from pgjax.models import hf
from pgjax.rollout.collect import RolloutConfig
from pgjax.train import run_dir as run_dir_lib
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.interrupts import RunInterrupted
from pgjax.train.run_dir import RunDirectory, RunLock
from pgjax.train.sinks import read_completions, read_records
from pgjax.train.trainer import Trainer, train

ROOT = pathlib.Path(__file__).parent.parent


# ---------------------------------------------------------------- NaN / inf rewards

CALLS = itertools.count()


def nan_from_the_third_call(prompts, completions, **_):
    """Reward 1 for a response starting with x; from its third call on, NaN on row 3 and inf on row 7."""
    rewards = np.array([float(c.startswith("x")) for c in completions])
    if next(CALLS) >= 2:
        rewards[3], rewards[7] = np.nan, np.inf
    return rewards


@pytest.mark.slow
def test_a_nan_reward_stops_the_run_naming_the_function_and_row_and_keeps_the_last_checkpoint(tmp_path, capsys):
    global CALLS
    CALLS = itertools.count()
    file = experiment_file(tmp_path)
    code = cli.main([str(file), "--no-progress", "--set", "task.reward.function=test_faults:nan_from_the_third_call"])
    assert code == 1
    err = capsys.readouterr().err
    assert ("pgjax.run: stopped: step 3: reward function nan_from_the_third_call returned nan for row 3 of 16 "
            "(2 non-finite; prompt 'ab', completion") in err
    assert "rollout.nonfinite_rewards='mask'" in err
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0", "2"]
    assert not (run / "final").exists()
    assert [r["step"] for r in read_records(run)] == [0, 1, 2]
    assert_no_nan_on_disk(run)

    # the user opts in to masking: a changed experiment, so --resume-with-changes, and it is recorded
    code = cli.main(
        [
            str(file),
            "--no-progress",
            "--resume-with-changes",
            "--set",
            "task.reward.function=test_faults:nan_from_the_third_call",
            "--set",
            "rollout.nonfinite_rewards=mask",
        ]
    )
    assert code == 0, capsys.readouterr().err
    records = read_records(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["nonfinite_rewards"] for r in records[1:]] == [0, 0, 2, 2]
    assert records[3]["kept"] == pytest.approx(1 - 8 / 16)      # both groups holding a NaN or inf row are out
    assert all(r["skipped_updates"] == 0 and np.isfinite(r["policy_loss"]) for r in records[1:])
    changes = [json.loads(line) for line in (run / "changes.jsonl").read_text().splitlines()]
    assert changes == [{"step": 2, "changes": {"rollout.nonfinite_rewards": ["error", "mask"]}}]
    assert json.loads((run / "experiment.json").read_text())["rollout"]["nonfinite_rewards"] == "mask"
    assert finite_tree(nnx.state(hf.load(run / "final")))
    assert_no_nan_on_disk(run)


# ---------------------------------------------------------------- non-finite updates

def test_a_non_finite_update_is_skipped_leaving_parameters_and_optimizer_state_unchanged():
    policy, algo, learner = tiny_learner("reinforce", UpdateConfig())
    state = learner.init_state(policy, jax.random.PRNGKey(0))
    before = jax.device_get(state)
    rollout = sampled_rollout(policy)
    poisoned = rollout.replace(batch=rollout.batch.replace(rewards=rollout.batch.rewards.at[5].set(jnp.inf)))
    prepared = learner.prepare(state, poisoned, algo.hparams)
    state, metrics = learner.update(state, prepared, algo.hparams)
    assert float(metrics["skipped_updates"]) == 1 and float(metrics["optimizer_steps"]) == 0
    assert_same_tree(state.params, before.params)
    assert_same_tree(state.opt_state, before.opt_state)
    assert int(state.step) == 1                      # the step still counts: the next one draws new data
    state, metrics = learner.update(state, learner.prepare(state, rollout, algo.hparams), algo.hparams)
    assert float(metrics["skipped_updates"]) == 0 and float(metrics["optimizer_steps"]) == 1
    assert not np.array_equal(jax.device_get(state.params["embed"][...]), before.params["embed"][...])


def huge_rewards(prompts, completions, **_):
    """Finite rewards too large for float32 arithmetic: the REINFORCE loss overflows."""
    return np.array([1e38 * (1.0 + c.startswith("x")) for c in completions])


@pytest.mark.filterwarnings("ignore:overflow encountered")       # the step's mean reward: written as null
def test_consecutive_non_finite_updates_stop_the_run_with_the_parameters_of_the_last_good_step(tmp_path, capsys):
    file = experiment_file(tmp_path, algorithm='"reinforce"', update="UpdateConfig(max_skipped_steps=2)")
    code = cli.main([str(file), "--no-progress", "--set", "task.reward.function=test_faults:huge_rewards"])
    assert code == 1
    err = capsys.readouterr().err
    assert ("pgjax.run: stopped: steps 1..2: every update had a non-finite loss, gradient or result (or no finite "
            "reward) and was skipped (update.max_skipped_steps=2); the parameters are those of step 0") in err
    run = tmp_path / "run"
    records = read_records(run)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["skipped_updates"] == 1 and r["policy_loss"] is None and r["grad_norm"] is None
               for r in records[1:])
    assert_no_nan_on_disk(run)
    assert not (run / "final").exists()
    exp = config_lib.override(config_lib.load(file), ["task.reward.function=test_faults:huge_rewards"])
    fresh = Trainer(exp)
    saved, record = Checkpoints(run / "checkpoints").restore(fresh.state)
    assert record["step"] == 2
    assert_same_tree(saved.params, fresh.state.params)     # untouched by the skipped updates


def test_a_non_finite_state_is_never_saved_or_exported(finished, tmp_path):
    exp, _, trainer, states = finished
    trainer.state = states[4].replace(params=jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan),
                                                          states[4].params))
    checkpoints = Checkpoints(tmp_path / "checkpoints")
    with pytest.raises(RunStopped, match="the training state at step .* is not finite: the checkpoint of step"):
        trainer.save(checkpoints)
    assert checkpoints.latest_step() is None
    run = RunDirectory(dataclasses.replace(exp, run_dir=str(tmp_path / "export")), resume=False)
    with pytest.raises(RunStopped, match="final/ was not written"):
        trainer.export(run)
    assert not (tmp_path / "export").exists()
    trainer.state = states[4]


# ---------------------------------------------------------------- datasets checked at load


@pytest.mark.parametrize("bad, message", [
    (json.dumps({"question": "1+2+3+4+5+6=", "answer": 21}),
     "data.jsonl:4: field 'question': the prompt has 12 tokens; rollout.max_prompt_tokens=4"),
    (json.dumps({"question": "  ", "answer": 1}), "data.jsonl:4: field 'question': the prompt is empty"),
    (json.dumps({"question": "1=", "answer": None}), "data.jsonl:4: field 'answer': the answer is null"),
    ('{"question": "1=", "answer": NaN}', "data.jsonl:4: field 'answer': the non-standard JSON constant NaN"),
    *[(json.dumps({"question": "1=", "answer": answer}), "data.jsonl:4: field 'answer': the answer cannot be scored")
      for answer in ("#### ", "\\boxed{1")],
])
def test_a_bad_dataset_record_is_named_before_anything_is_written(tmp_path, checkpoint_dir, bad, message, capsys):
    exp = dataset_experiment(tmp_path, checkpoint_dir, GOOD[:3] + [bad] + GOOD[3:])
    with pytest.raises(ConfigError, match="^task: .*" + message.replace("+", r"\+").replace("(", r"\(")):
        train(exp, progress=False)
    assert not (tmp_path / "run").exists()
    skipping = dataset_experiment(tmp_path, checkpoint_dir, GOOD[:3] + [bad] + GOOD[3:], skip_invalid=True)
    trainer = Trainer(skipping)
    assert len(trainer.task.records) == 6 and all(r["prompt"] != json.loads(bad.replace("NaN", "0"))["question"]
                                                  for r in trainer.task.records)
    assert "records, 1 skipped (line 4: " in capsys.readouterr().err


def test_a_prompt_and_response_longer_than_the_models_context_is_refused(tmp_path, checkpoint_dir):
    exp = dataset_experiment(tmp_path, checkpoint_dir, GOOD)
    exp = config_lib.override(exp, ["rollout.max_prompt_tokens=24", "rollout.max_new_tokens=9"])
    with pytest.raises(ConfigError, match=r"max_new_tokens = 33 exceeds the model's context of 32 tokens"):
        train(exp, progress=False)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- SIGKILL

RESUME_EXPERIMENT = """
from pgjax.config import Experiment, ModelSection, WarmStartSection
from pgjax.rollout.collect import RolloutConfig

def experiment():
    return Experiment(name="resume", algorithm="grpo", steps=12, prompts_per_step=4, eval_every=1,
                      eval_prompts=64, checkpoint_every=3,
                      model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                      warm_start=WarmStartSection(steps=3, batch_size=8),
                      rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=6))
"""


def start_run(file, directory, *extra):
    return subprocess.Popen([sys.executable, "-m", "pgjax.run", str(file), "--no-progress",
                             "--set", f"run_dir={directory}", *extra], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_to_the_same_metrics_and_parameters(tmp_path):
    file = tmp_path / "resume.py"
    file.write_text(RESUME_EXPERIMENT)
    logging = ("--set", "logging.completions_every=2")          # completions logged on every other step
    whole = start_run(file, tmp_path / "whole", *logging)
    killed = start_run(file, tmp_path / "killed", *logging)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and killed.poll() is None:
        if metrics.exists() and any(json.loads(x)["step"] >= 4 for x in metrics.read_text().splitlines()[:-1]):
            killed.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL, killed.stdout.read()
    assert not (tmp_path / "killed" / "final").exists()
    resumed = start_run(file, tmp_path / "killed", "--resume", *logging)
    assert resumed.wait() == 0, resumed.stdout.read()
    assert whole.wait() == 0, whole.stdout.read()
    assert comparable(metrics) == comparable(tmp_path / "whole" / "metrics.jsonl")
    completions = [(tmp_path / run / "completions.jsonl").read_bytes() for run in ("whole", "killed")]
    assert completions[0] == completions[1] and len(read_completions(tmp_path / "whole")) == 6 * 4
    events = read_events(tmp_path / "killed")   # TensorBoard keeps one value per step: the killed run's events
                                                # after the checkpoint are purged on resume
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert events["reward"] == pytest.approx({r["step"]: r["reward"] for r in records if "reward" in r})
    a = hf.load(tmp_path / "whole" / "final")
    b = hf.load(tmp_path / "killed" / "final")
    jax.tree.map(np.testing.assert_array_equal, nnx.state(a), nnx.state(b))


def test_every_reward_masked_warns_and_stops(tmp_path, capsys):
    file = experiment_file(tmp_path, update="UpdateConfig(max_skipped_steps=2)")
    code = cli.main([str(file), "--no-progress", "--set", "task.reward.function=helpers:always_nan", "--set",
                     "rollout.nonfinite_rewards=mask"])
    assert code == 1
    err = capsys.readouterr().err
    assert "step 1: every reward was non-finite; rollout.nonfinite_rewards='mask' left all 16 rows out" in err
    assert "pgjax.run: stopped: steps 1..2: every update had a non-finite loss, gradient or result (or no finite " \
           "reward)" in err


# ---------------------------------------------------------------- SIGTERM and Ctrl-C

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_finishes_the_step_writes_its_checkpoint_and_the_resume_is_exact(finished, tmp_path, signum, capsys):
    exp, run = copy_of(finished, tmp_path)
    fresh = dataclasses.replace(exp, run_dir=str(tmp_path / "signalled"))
    handler = signal.getsignal(signum)
    with pytest.raises(RunInterrupted, match=rf"interrupted by {signum.name} after step 3, its checkpoint written"):
        train(fresh, progress=False, callbacks=[SignalAt(signum, 3)])
    assert signal.getsignal(signum) is handler          # restored
    err = capsys.readouterr().err
    assert f"{signum.name}: finishing the current step and writing a checkpoint" in err
    directory = tmp_path / "signalled"
    assert sorted(p.name for p in (directory / "checkpoints").iterdir()) == ["2", "3"]
    assert not RunLock.held(directory) and not (directory / "final").exists()
    train(fresh, resume=True, progress=False)
    assert comparable(directory / "metrics.jsonl") == comparable(finished[1] / "metrics.jsonl")
    assert_same_tree(nnx.state(hf.load(directory / "final")), nnx.state(hf.load(finished[1] / "final")))


def test_a_full_disk_at_a_checkpoint_stops_in_one_line_keeping_the_last_one_and_the_resume_is_exact(
        finished, tmp_path, capsys, monkeypatch):
    """The disk fills while step 4's checkpoint is written (orbax's error, as it reported a real full
    disk): the run stops with one line and status 1, step 2's checkpoint intact and no half-written
    step 4 left; with space again, --resume gives the uninterrupted run's records and final/."""
    import orbax.checkpoint as ocp
    exp, _, _, _ = finished
    save = ocp.CheckpointManager.save

    def full_at_step_4(manager, step, *args, **kwargs):
        if step == 4:
            (pathlib.Path(manager.directory) / "4.orbax-checkpoint-tmp-0").mkdir()       # what a cut write leaves
            raise ValueError("RESOURCE_EXHAUSTED: Error writing \"key/0\" in OCDBT database: Failed to write "
                             "24870912 bytes to file 15: No space left on device [os_error_code='28']")
        return save(manager, step, *args, **kwargs)
    monkeypatch.setattr(ocp.CheckpointManager, "save", full_at_step_4)
    file = experiment_file(tmp_path)
    assert cli.main([str(file), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert ("pgjax.run: stopped: the checkpoint of step 4 could not be written: no space left on the device of "
            in err) and "--resume" in err and "Traceback" not in err
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0", "2"] and not (run / "final").exists()
    assert not RunLock.held(run)
    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    assert cli.main([str(file), "--no-progress", "--resume"]) == 0
    assert comparable(run / "metrics.jsonl") == comparable(finished[1] / "metrics.jsonl")
    assert_same_tree(nnx.state(hf.load(run / "final")), nnx.state(hf.load(finished[1] / "final")))


def test_the_command_line_exits_with_128_plus_the_signal(tmp_path, capsys, monkeypatch):
    file = experiment_file(tmp_path)
    calls = itertools.count()
    monkeypatch.setattr(Trainer, "evaluate", lambda self: next(calls) or signal.raise_signal(signal.SIGTERM) or 0.0)
    assert cli.main([str(file), "--no-progress"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "pgjax.run: interrupted by SIGTERM after step 0, its checkpoint written; --resume continues " \
                      "from it"
    assert (tmp_path / "run" / "checkpoints" / "0").is_dir()


def wait_for_step(process, metrics: pathlib.Path, step: int) -> None:
    """Wait (at most 300 s) until ``metrics`` holds a complete record of ``step`` or later."""
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if metrics.exists() and any(json.loads(x)["step"] >= step for x in metrics.read_text().splitlines()[:-1]):
            return
        time.sleep(0.005)
    pytest.fail(f"no step {step} in {metrics}: {process.stdout.read() if process.poll() is not None else ''}")


@pytest.mark.slow
def test_real_signals_stop_a_run_without_a_traceback_and_it_resumes_exactly(tmp_path):
    """Through ``python -m pgjax.run``: SIGTERM finishes the step, checkpoints it and exits 143, and
    the resume gives the uninterrupted run's metrics and weights; two Ctrl-C stop at once (130); a
    grace period too short to finish the step stops at once too (143). None prints a traceback, and
    each leaves a run that resumes."""
    file = tmp_path / "resume.py"
    file.write_text(RESUME_EXPERIMENT)
    whole = start_run(file, tmp_path / "whole")
    termed = start_run(file, tmp_path / "termed")
    wait_for_step(termed, tmp_path / "termed" / "metrics.jsonl", 4)
    termed.send_signal(signal.SIGTERM)
    out = termed.stdout.read()
    assert termed.wait() == 143 and "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("pgjax.run: interrupted by SIGTERM after step ") and last.endswith(
        ", its checkpoint written; --resume continues from it"), out
    step = int(last.split("after step ")[1].split(",")[0])
    assert (tmp_path / "termed" / "checkpoints" / str(step)).is_dir()
    resumed = start_run(file, tmp_path / "termed", "--resume")
    assert resumed.wait() == 0, resumed.stdout.read()
    assert whole.wait() == 0, whole.stdout.read()
    assert comparable(tmp_path / "termed" / "metrics.jsonl") == comparable(tmp_path / "whole" / "metrics.jsonl")
    jax.tree.map(np.testing.assert_array_equal, nnx.state(hf.load(tmp_path / "whole" / "final")),
                 nnx.state(hf.load(tmp_path / "termed" / "final")))

    for name, signals, extra, status, says in [
            ("twice", (signal.SIGINT, signal.SIGINT), (), 130, "a second signal (SIGINT): stopped at once"),
            ("grace", (signal.SIGTERM,), ("--grace-period", "0.001"), 143, "did not finish within the grace period")]:
        process = start_run(file, tmp_path / name, *extra)
        wait_for_step(process, tmp_path / name / "metrics.jsonl", 2)
        for signum in signals:
            process.send_signal(signum)
            time.sleep(0.05)
        out = process.stdout.read()
        assert process.wait() == status and "Traceback" not in out and says in out, out
        resumed = start_run(file, tmp_path / name, "--resume")
        assert resumed.wait() == 0, resumed.stdout.read()


def test_a_signal_in_the_warm_start_stops_it_leaving_no_results_so_the_run_simply_runs_again(tmp_path, monkeypatch):
    from pgjax.train import trainer as trainer_lib
    calls = itertools.count()
    real_step = trainer_lib.sft_step

    def signalled_step(*args, **kwargs):
        if next(calls) == 1:
            signal.raise_signal(signal.SIGTERM)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(trainer_lib, "sft_step", signalled_step)
    exp = tiny_experiment(tmp_path, steps=2, warm_start=config_lib.WarmStartSection(steps=3, batch_size=4),
                          rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=6))
    with pytest.raises(RunInterrupted, match=r"interrupted by SIGTERM during the warm start \(2 of 3 steps\), before "
                                             "the first checkpoint: nothing to resume"):
        train(exp, progress=False)
    assert run_dir_lib.run_results(tmp_path / "run") == []
    monkeypatch.undo()
    train(exp, progress=False)            # no --restart needed: nothing of the stopped run was kept
    assert [r["step"] for r in read_records(tmp_path / "run")] == [0, 1, 2]
