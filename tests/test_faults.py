"""Faults a long run meets, injected one by one; each test asserts what the user sees and what is
left on disk. NaN / inf rewards and non-finite updates never reach a checkpoint or ``final/``;
damaged checkpoints are found and skipped; a torn metrics line is dropped on resume; a resume with a
changed experiment or changed input files is refused (or recorded); a directory holding another
run's results is never written into; a live run directory is locked, also when its note file is
deleted; ``final/`` is complete or not written; bad dataset records are named before anything is
written; SIGTERM and Ctrl-C finish the step and checkpoint it; a run killed with SIGKILL resumes
bit for bit (metrics, logged completions, weights); and a user's reward function that raises,
hangs or returns no numbers is one line naming it. Functions and tasks defined here are addressable
as ``test_faults:NAME``."""
import dataclasses
import itertools
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import (
    TINY_MODEL,
    EmitX,
    SignalAt,
    comparable,
    copy_of,
    experiment_file,
    read_events,
    sampled_rollout,
    save_tiny_checkpoint,
    snapshot,
    tiny_experiment,
    tiny_learner,
)

from pgjax import eval as eval_cli
from pgjax import run as cli
from pgjax.models import hf
from pgjax.models.transformer import CausalLM
from pgjax.parallel.mesh import single_device_mesh
from pgjax.rollout.collect import RolloutConfig, dispatch_samples, pad_id, sample_and_score
from pgjax.sample import Decoding
from pgjax.tasks import RewardError, with_timeout
from pgjax.train import experiment as experiment_lib
from pgjax.train import inputs
from pgjax.train import run_dir as run_dir_lib
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.experiment import AlgorithmSection, ConfigError, RunStopped, TaskSection
from pgjax.train.interrupts import RunInterrupted
from pgjax.train.learner import UpdateConfig
from pgjax.train.optim import OptimConfig
from pgjax.train.run_dir import RunDirectory, RunLock, locate
from pgjax.train.sinks import read_completions, read_records
from pgjax.train.trainer import Trainer, train

ROOT = pathlib.Path(__file__).parent.parent


def assert_no_nan_on_disk(directory: pathlib.Path) -> None:
    """No metrics line, record or experiment file holds a bare NaN / Infinity."""
    for path in [directory / "metrics.jsonl", *directory.glob("checkpoints/*/record/metadata")]:
        if path.is_file():
            for line in path.read_text().splitlines():
                json.loads(line, parse_constant=lambda c, path=path: pytest.fail(f"{path} holds {c}"))


def finite_tree(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact))


def assert_same_tree(a, b) -> None:
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))





def plain_mode() -> int:
    """The mode a plain file write gives here: 0666 less the umask."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def file_modes(folder: pathlib.Path) -> dict[str, int]:
    """``{relative path: permission bits}`` of every file under ``folder``."""
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_exported_files_are_readable_like_the_checkpoints(finished):
    """Every file of final/ has the mode of a plain write (0644 under umask 022), as orbax's files have
    (safetensors alone would leave model.safetensors 0600)."""
    directory = finished[1]
    final, checkpoint = file_modes(directory / "final"), file_modes(directory / "checkpoints" / "4")
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= set(final)
    assert set(final.values()) == set(checkpoint.values()) == {plain_mode()}, (final, checkpoint)


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
    code = cli.main([str(file), "--no-progress", "--set", "task.reward=test_faults:nan_from_the_third_call"])
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
    code = cli.main([str(file), "--no-progress", "--resume-with-changes", "--set",
                     "task.reward=test_faults:nan_from_the_third_call", "--set", "rollout.nonfinite_rewards=mask"])
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
    code = cli.main([str(file), "--no-progress", "--set", "task.reward=test_faults:huge_rewards"])
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
    exp = experiment_lib.override(experiment_lib.load(file), ["task.reward=test_faults:huge_rewards"])
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


# ---------------------------------------------------------------- damaged checkpoints

def damage(path: pathlib.Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "flip":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:])
    elif kind == "truncate":
        path.write_bytes(data[:len(data) // 2])
    else:
        path.unlink()


@pytest.mark.parametrize("kind", ["flip", "truncate", "delete"])
def test_any_damaged_file_in_the_newest_checkpoint_is_reported_and_the_one_before_restored(finished, tmp_path, kind,
                                                                                         capsys):
    """Whichever file of checkpoint 4 is damaged (a flipped bit, cut short, deleted), restore reports
    step 4 and the file in one line, sets the checkpoint aside and gives exactly step 2's state."""
    _, directory, trainer, states = finished
    files = sorted(p.relative_to(directory / "checkpoints" / "4") for p in (directory / "checkpoints" / "4").rglob("*")
                   if p.is_file() and p.stat().st_size)
    assert len(files) > 10 and "pgjax_files.json" in map(str, files)
    for n, name in enumerate(files):
        run = tmp_path / f"{n}"
        shutil.copytree(directory / "checkpoints", run / "checkpoints")
        damage(run / "checkpoints" / "4" / name, kind)
        checkpoints = Checkpoints(run / "checkpoints")
        state, record = checkpoints.restore(trainer.state)
        checkpoints.close()
        assert record["step"] == 2, name
        assert_same_tree(state, states[2])
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"checkpoint {run / 'checkpoints' / '4'} is damaged ("), err
        assert str(name) in err or str(name) == "pgjax_files.json"      # a changed list names what it no longer fits
        assert (run / "damaged_checkpoints" / "4").is_dir() and not (run / "checkpoints" / "4").exists()


def test_a_resume_after_a_damaged_checkpoint_and_a_torn_metrics_line_gives_the_undamaged_runs_results(
        finished, tmp_path, capsys):
    directory = finished[1]
    exp, run = copy_of(finished, tmp_path)
    biggest = max((p for p in (run / "checkpoints" / "4").rglob("*") if "/d/" in str(p)),
                  key=lambda p: p.stat().st_size)
    damage(biggest, "flip")
    untouched = snapshot(run)
    with pytest.raises(ConfigError, match=rf"checkpoint .*/checkpoints/4 is damaged \(state/.*{biggest.name} does "
                                          r"not hold the bytes written \(SHA-256 differs\)\); without --no-fallback"):
        train(exp, resume=True, progress=False, fallback=False)
    assert snapshot(run) == untouched                    # refused: nothing moved or written
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "reward": 0.')               # a write cut short
    assert train(exp, resume=True, progress=False) == run
    err = capsys.readouterr().err
    assert "checkpoints/4 is damaged" in err and "moved to" in err and "trying the one before" in err
    assert "metrics.jsonl: dropped a torn last line (" in err and "resumed" in err and "at step 2" in err
    assert comparable(run / "metrics.jsonl") == comparable(directory / "metrics.jsonl")
    assert_same_tree(nnx.state(hf.load(run / "final")), nnx.state(hf.load(directory / "final")))
    assert (run / "damaged_checkpoints" / "4").is_dir()


def test_no_intact_checkpoint_is_a_one_line_error(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    for step in ("2", "4"):
        damage(run / "checkpoints" / step / "record" / "metadata", "delete")
    with pytest.raises(ConfigError, match=r"no intact checkpoint in .*checkpoints: step 4: .*; step 2: .*\(--restart "
                                          "starts the run again, its results moved aside"):
        train(exp, resume=True, progress=False)
    assert not (run / "final.partial").exists()
    with pytest.raises(ConfigError, match=r"--resume: no checkpoint to resume in .*; --restart starts the run again "
                                          "there, first moving experiment.json, final, damaged_checkpoints"):
        train(exp, resume=True, progress=False)     # the damaged ones were set aside: nothing left to try
    train(exp, restart=True, progress=False)
    assert [r["step"] for r in read_records(run)] == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- a changed experiment on resume

@pytest.mark.parametrize("changes, listed", [
    (dict(algorithm="rloo"), "algorithm.preset: 'dr_grpo' -> 'rloo'"),
    (dict(algorithm=AlgorithmSection(hparams={"clip_eps": 0.1})), "(algorithm.hparams.clip_eps: None -> 0.1)"),
    (dict(seed=1), "seed: 0 -> 1"),
    (dict(prompts_per_step=8), "prompts_per_step: 4 -> 8"),
    (dict(task=TaskSection(name="arithmetic")), "task.name: 'helpers:EmitX' -> 'arithmetic'"),
    (dict(optim=OptimConfig(lr=2e-2)), "optim.lr: 0.01 -> 0.02"),
    (dict(eval_prompts=16), "eval_prompts: 8 -> 16"),
])
def test_a_resume_that_changes_the_maths_or_data_is_refused_listing_the_keys(finished, tmp_path, changes, listed):
    exp, run = copy_of(finished, tmp_path)
    untouched = snapshot(run)
    with pytest.raises(ConfigError, match="--resume: the experiment differs from the one .* was trained with") as error:
        RunDirectory(dataclasses.replace(exp, **changes), resume=True)
    assert listed in str(error.value) and "--resume-with-changes" in str(error.value)
    assert snapshot(run) == untouched


def test_a_key_newer_than_the_run_resumes_at_its_default_and_is_refused_otherwise(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    saved = json.loads((run / "experiment.json").read_text())
    del saved["task"]["held_out"], saved["logging"]["completions_every"]    # a run begun before these keys
    (run / "experiment.json").write_text(json.dumps(saved))
    assert set(RunDirectory(exp, resume=True).changes) == {"run_dir"}     # at their defaults: no change
    with pytest.raises(ConfigError, match=r"task\.held_out: None -> 'templates'"):
        RunDirectory(dataclasses.replace(exp, task=dataclasses.replace(exp.task, held_out="templates")), resume=True)


def test_a_run_begun_with_unrolled_layers_is_told_how_to_resume(finished, tmp_path):
    """Runs begun before stacked layers became the default saved ``model.scan_layers: false``."""
    exp, run = copy_of(finished, tmp_path)
    unrolled = dataclasses.replace(exp, model=dataclasses.replace(exp.model, scan_layers=False, remat="off"))
    saved = json.loads((run / "experiment.json").read_text())
    saved["model"].update(scan_layers=False, remat="off")
    (run / "experiment.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=r"model\.scan_layers: False -> True.*resume with --set "
                                          r"model\.scan_layers=false"):
        RunDirectory(exp, resume=True)
    assert set(RunDirectory(unrolled, resume=True).changes) == {"run_dir"}


def test_operational_changes_resume_and_are_recorded(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    changed = dataclasses.replace(exp, steps=6, eval_every=3, update=UpdateConfig(micro_batches=2))
    assert train(changed, resume=True, progress=False) == run
    assert [r["step"] for r in read_records(run)] == [0, 1, 2, 3, 4, 5, 6]
    record = json.loads((run / "changes.jsonl").read_text())
    assert record == {"step": 4, "changes": {"eval_every": [2, 3], "run_dir": [str(finished[1]), str(run)],
                                             "steps": [4, 6], "update.micro_batches": [1, 2]}}
    assert json.loads((run / "experiment.json").read_text())["steps"] == 6


def test_a_changed_model_shape_is_one_line_naming_the_arrays(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    wider = dataclasses.replace(exp, model=dataclasses.replace(exp.model, intermediate_size=48))
    with pytest.raises(ConfigError) as error:
        train(wider, resume=True, accept_changes=True, progress=False)
    message = str(error.value)
    assert "does not fit this experiment's training state" in message and "\n" not in message
    # [layers, D, F]
    assert "mlp" in message and "float32[1, 32, 64] in the checkpoint, float32[1, 32, 48] here" in message
    assert "partial_restore" not in message


# ---------------------------------------------------------------- the run-directory lock

HOLDER = """
import pathlib, sys, time
from pgjax.train.run_dir import RunLock
lock = RunLock(pathlib.Path(sys.argv[1]))
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_live_run_directory_is_locked_and_a_killed_holder_leaves_no_stale_lock(finished, tmp_path, capsys):
    exp, run = copy_of(finished, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        untouched = snapshot(run)
        with pytest.raises(ConfigError, match=rf"run_dir='{run}' is in use by PID {holder.pid} on host "
                                              rf"{socket.gethostname()} \(since "):
            train(exp, resume=True, progress=False)
        assert snapshot(run) == untouched
        (tmp_path / "new").mkdir()
        holder_new = RunLock(tmp_path / "new")
        holder_new.acquire()
        file = experiment_file(tmp_path)
        assert cli.main([str(file), "--no-progress", "--set", f"run_dir={tmp_path / 'new'}"]) == 2
        assert f"is in use by PID {os.getpid()}" in capsys.readouterr().err
        assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [".lock"]
        holder_new.release()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = RunLock(run)
    lock.acquire()                   # the OS released the killed holder's lock
    lock.release()


def test_a_new_run_without_run_dir_passes_over_a_directory_in_use(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exp = tiny_experiment(tmp_path, run_dir="")
    (tmp_path / "runs" / "t").mkdir(parents=True)
    lock = RunLock(tmp_path / "runs" / "t")
    lock.acquire()
    assert locate(exp, resume=False) == pathlib.Path("runs/t-2")
    lock.release()
    assert locate(exp, resume=False) == pathlib.Path("runs/t")


# ---------------------------------------------------------------- datasets checked at load

@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A tiny Hugging Face checkpoint (config with a 32-token context, a character tokenizer)."""
    directory = save_tiny_checkpoint(tmp_path_factory.mktemp("checkpoint"))
    config_json = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config_json, "max_position_embeddings": 32}))
    return directory


def dataset_experiment(tmp_path, checkpoint_dir, lines, **task):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    return tiny_experiment(tmp_path, model=experiment_lib.ModelSection(path=str(checkpoint_dir)),
                           task=TaskSection(name="jsonl_math", path=str(data), **task))


GOOD = [json.dumps({"question": f"{a}+1=", "answer": a + 1}) for a in range(6)]


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
    exp = experiment_lib.override(exp, ["rollout.max_prompt_tokens=24", "rollout.max_new_tokens=9"])
    with pytest.raises(ConfigError, match=r"max_new_tokens = 33 exceeds the model's context of 32 tokens"):
        train(exp, progress=False)
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- SIGKILL

RESUME_EXPERIMENT = """
from pgjax.train.experiment import Experiment, ModelSection, WarmStartSection
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


# ---------------------------------------------------------------- inputs checked by content on resume

@pytest.fixture(scope="module")
def finished_on_data(tmp_path_factory, checkpoint_dir):
    """A finished 2-step run on a JSONL dataset and a copy of the tiny checkpoint (inputs the tests
    then change); its experiment and directory."""
    tmp = tmp_path_factory.mktemp("on_data")
    shutil.copytree(checkpoint_dir, tmp / "model")
    exp = dataset_experiment(tmp, tmp / "model", GOOD)
    exp = dataclasses.replace(exp, steps=2, checkpoint_every=2, eval_prompts=4, prompts_per_step=2,
                              task=dataclasses.replace(exp.task, reward="test_faults:emits_x"))
    return exp, train(exp, progress=False)


def emits_x(prompts, completions, **_):
    """1 for a response starting with x."""
    return np.array([float(c.startswith("x")) for c in completions])


def copy_run_and_inputs(finished_on_data, tmp_path) -> tuple:
    """A copy of the run, its dataset and its model, with an experiment pointing at the copies."""
    exp, directory = finished_on_data
    shutil.copytree(directory, tmp_path / "run")
    shutil.copytree(exp.model.path, tmp_path / "model")
    shutil.copy(exp.task.path, tmp_path / "data.jsonl")
    moved = dataclasses.replace(exp, run_dir=str(tmp_path / "run"), model=dataclasses.replace(exp.model, path=str(
        tmp_path / "model")), task=dataclasses.replace(exp.task, path=str(tmp_path / "data.jsonl")))
    return moved, tmp_path / "run"


def test_inputs_moved_unchanged_resume_but_a_dataset_edited_in_place_is_refused(finished_on_data, tmp_path):
    """The fingerprints are of content: the inputs copied elsewhere (new paths, same bytes) resume; a
    dataset edited in place is refused in one line naming the file and what changed; with
    --resume-with-changes the run goes on and changes.jsonl records the input's change."""
    exp, run = copy_run_and_inputs(finished_on_data, tmp_path)
    recorded = json.loads((run / "inputs.json").read_text())["files"]
    assert {"task.path", "model.path/model.safetensors", "model.path/config.json",
            "task.reward:module"} <= set(recorded)
    RunDirectory(exp, resume=True, accept_changes=False)        # moved, same bytes: no change of inputs
    data = pathlib.Path(exp.task.path)
    data.write_text(data.read_text().replace('"answer": 4', '"answer": 5'))      # same size, other bytes
    untouched = snapshot(run)
    with pytest.raises(ConfigError) as error:
        RunDirectory(exp, resume=True)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"--resume: an input of {run} changed since the run began ")
    assert f"task.path: {data} holds other bytes (same size, {data.stat().st_size} bytes, SHA-256 " in message
    assert "--resume-with-changes" in message and snapshot(run) == untouched
    longer = dataclasses.replace(exp, steps=3)
    assert train(longer, resume=True, accept_changes=True, progress=False) == run
    entry = json.loads((run / "changes.jsonl").read_text())
    assert entry["step"] == 2 and list(entry["inputs"]) == ["task.path"] and "holds other bytes" in entry["inputs"][
        "task.path"]
    assert json.loads((run / "inputs.json").read_text())["files"]["task.path"]["sha256"] == inputs.file_sha256(data)
    RunDirectory(dataclasses.replace(longer, steps=4), resume=True)      # the new dataset is now the run's


def test_a_model_replaced_at_the_same_path_and_a_changed_user_module_are_refused(finished_on_data, tmp_path):
    exp, run = copy_run_and_inputs(finished_on_data, tmp_path)
    weights = pathlib.Path(exp.model.path) / "model.safetensors"
    damage(weights, "flip")
    with pytest.raises(ConfigError, match=r"model.path/model.safetensors: .*model.safetensors holds other bytes"):
        RunDirectory(exp, resume=True)
    shutil.copy(pathlib.Path(finished_on_data[0].model.path) / "model.safetensors", weights)
    RunDirectory(exp, resume=True)                           # the same bytes again: accepted


def test_a_user_module_edited_in_place_is_refused(finished_on_data, tmp_path):
    exp, run = copy_run_and_inputs(finished_on_data, tmp_path)
    module = tmp_path / "my_rewards.py"
    module.write_text("def reward(prompts, completions, **_):\n    return [1.0] * len(completions)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        mine = dataclasses.replace(exp, task=dataclasses.replace(exp.task, reward="my_rewards:reward"))
        (run / "experiment.json").write_text(json.dumps(run_dir_lib.experiment_record(mine)))
        (run / "inputs.json").write_text(json.dumps({"files": inputs.fingerprints(inputs.input_files(mine))}))
        RunDirectory(mine, resume=True)
        module.write_text("def reward(prompts, completions, **_):\n    return [2.0] * len(completions)\n")
        with pytest.raises(ConfigError, match=rf"task.reward:module: {module} holds other bytes"):
            RunDirectory(mine, resume=True)
    finally:
        sys.path.remove(str(tmp_path))


def test_an_unchanged_file_is_not_hashed_again_and_an_edit_that_keeps_its_time_is_found(tmp_path, monkeypatch):
    """The size / mtime / ctime / inode pre-check: an untouched file keeps its saved hash unread; an
    edit in place of the same size with the modification time set back is still re-hashed (its
    change time moved)."""
    data = tmp_path / "data.jsonl"
    data.write_text("a" * 100)
    saved = inputs.fingerprints({"task.path": data})
    monkeypatch.setattr(inputs, "file_sha256", lambda path: pytest.fail(f"{path} hashed again"))
    assert inputs.fingerprints({"task.path": data}, known=saved) == saved
    monkeypatch.undo()
    before = data.stat()
    time.sleep(0.01)
    data.write_text("b" * 100)
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    now = inputs.fingerprints({"task.path": data}, known=saved)
    assert inputs.differences(saved, now) == {"task.path": f"{data.absolute()} holds other bytes (same size, 100 "
                                              f"bytes, SHA-256 {saved['task.path']['sha256'][:12]} -> "
                                              f"{now['task.path']['sha256'][:12]})"}


@pytest.mark.parametrize("contents", ["missing", "{}", "[]", "null"])
def test_an_unreadable_inputs_or_experiment_record_is_refused_and_with_changes_accepted(finished, tmp_path, contents):
    for name in ("inputs.json", "experiment.json"):
        exp, run = copy_of(finished, tmp_path / name)
        if contents == "missing":
            (run / name).unlink()
        else:
            (run / name).write_text(contents)
        with pytest.raises(ConfigError, match=rf"--resume: cannot read .*{name} \(|--resume: an input|--resume: the "
                                              "experiment differs") as error:
            RunDirectory(exp, resume=True)
        assert "\n" not in str(error.value)
        RunDirectory(exp, resume=True, accept_changes=True)


# ---------------------------------------------------------------- a run directory belongs to one run

def test_a_new_run_never_writes_into_another_runs_results(finished, tmp_path, monkeypatch):
    """After the checkpoints of a finished run are deleted, an explicit run_dir is refused naming what
    it holds; without run_dir the next name is taken; --resume says how to start over."""
    exp, run = copy_of(finished, tmp_path)
    shutil.rmtree(run / "checkpoints")
    untouched = snapshot(run)
    with pytest.raises(ConfigError, match=r"holds another run's results \(experiment.json, final, metrics.jsonl\); "
                                          r"pass --resume to continue that run, --restart to move them aside"):
        train(exp, progress=False)
    with pytest.raises(ConfigError, match=r"--resume: no checkpoint to resume in .*; --restart starts the run again "
                                          r"there, first moving experiment.json, final, metrics.jsonl aside"):
        train(exp, resume=True, progress=False)
    assert snapshot(run) == untouched
    monkeypatch.chdir(tmp_path)
    shutil.copytree(run, tmp_path / "runs" / "t")
    assert locate(dataclasses.replace(exp, run_dir=""), resume=False) == pathlib.Path("runs/t-2")


def test_restart_moves_the_old_results_aside_and_starts_again(finished, tmp_path, capsys):
    exp, run = copy_of(finished, tmp_path)
    shutil.rmtree(run / "checkpoints")
    old = snapshot(run)
    assert train(exp, restart=True, progress=False) == run
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run-replaced-")]
    assert len(aside) == 1 and snapshot(aside[0]) == old
    assert f"--restart: moved the earlier run's experiment.json, final, metrics.jsonl to {aside[0]}" in \
        capsys.readouterr().err
    assert comparable(run / "metrics.jsonl") == comparable(finished[1] / "metrics.jsonl")
    with pytest.raises(ConfigError, match="cannot be combined with --resume"):
        RunDirectory(exp, resume=True, restart=True)


def test_two_new_runs_without_run_dir_take_two_names(tmp_path, monkeypatch):
    """The second of two runs that located runs/t at the same moment takes runs/t-2 when it finds the
    first holding the lock."""
    monkeypatch.chdir(tmp_path)
    exp = tiny_experiment(tmp_path, run_dir="")
    first, second = RunDirectory(exp, resume=False), RunDirectory(exp, resume=False)
    assert first.directory == second.directory == pathlib.Path("runs/t")
    first.create()
    second.create()
    assert second.directory == pathlib.Path("runs/t-2")
    first.close()
    second.close()


# ---------------------------------------------------------------- the lock survives deletion

def test_deleting_the_lock_file_does_not_release_a_live_runs_lock(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert "the lock is held on the directory itself" in (run / ".lock").read_text()
        (run / ".lock").unlink()
        with pytest.raises(ConfigError, match=rf"run_dir='{run}' is in use by another process"):
            train(exp, resume=True, progress=False)
        assert RunLock.held(run)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not RunLock.held(run)


# ---------------------------------------------------------------- final/ complete or not written

def test_a_missing_tokenizer_is_written_again_on_resume_and_final_is_complete(finished, tmp_path, capsys):
    exp, run = copy_of(finished, tmp_path)
    shutil.rmtree(run / "tokenizer")
    shutil.rmtree(run / "final")
    train(exp, resume=True, progress=False)
    assert "tokenizer was missing or incomplete: written again from the run's tokenizer" in capsys.readouterr().err
    names = lambda folder: sorted(p.name for p in folder.iterdir())    # noqa: E731
    assert names(run / "final") == names(finished[1] / "final")


def test_an_export_that_would_lack_a_file_writes_no_final(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    trainer = finished[2]
    directory = RunDirectory(exp, resume=True)
    shutil.rmtree(run / "tokenizer")
    before = snapshot(run / "final")
    with pytest.raises(RunStopped, match=r"final/ was not written: .*tokenizer holds no tokenizer"):
        directory.export(trainer.policy)
    assert snapshot(run / "final") == before


# ---------------------------------------------------------------- smaller

@pytest.mark.parametrize("contents", ["{}", "[]", "null"])
def test_a_file_list_that_verifies_nothing_is_damage(finished, tmp_path, contents, capsys):
    _, directory, trainer, states = finished
    shutil.copytree(directory / "checkpoints", tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / "4" / "pgjax_files.json").write_text(contents)
    checkpoints = Checkpoints(tmp_path / "checkpoints")
    state, record = checkpoints.restore(trainer.state)
    checkpoints.close()
    assert record["step"] == 2
    err = capsys.readouterr().err
    assert "checkpoints/4 is damaged (" in err and err.count("\n") == 1
    assert ("lists no file" if contents == "{}" else "is missing or unreadable") in err


def always_nan(prompts, completions, **_):
    return np.full(len(completions), np.nan)


def test_a_change_is_recorded_only_when_a_step_ran_with_it(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    saved = (run / "experiment.json").read_text()
    changed = dataclasses.replace(exp, steps=6, task=dataclasses.replace(exp.task, reward="test_faults:always_nan"))
    with pytest.raises(RunStopped, match="reward function always_nan returned nan"):
        train(changed, resume=True, accept_changes=True, progress=False)
    assert not (run / "changes.jsonl").exists() and (run / "experiment.json").read_text() == saved
    train(dataclasses.replace(exp, steps=5), resume=True, progress=False)   # nothing recorded: no change to undo


def test_every_reward_masked_warns_and_stops(tmp_path, capsys):
    file = experiment_file(tmp_path, update="UpdateConfig(max_skipped_steps=2)")
    code = cli.main([str(file), "--no-progress", "--set", "task.reward=test_faults:always_nan", "--set",
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
    exp = tiny_experiment(tmp_path, steps=2, warm_start=experiment_lib.WarmStartSection(steps=3, batch_size=4),
                          rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=6))
    with pytest.raises(RunInterrupted, match=r"interrupted by SIGTERM during the warm start \(2 of 3 steps\), before "
                                             "the first checkpoint: nothing to resume"):
        train(exp, progress=False)
    assert run_dir_lib.run_results(tmp_path / "run") == []
    monkeypatch.undo()
    train(exp, progress=False)            # no --restart needed: nothing of the stopped run was kept
    assert [r["step"] for r in read_records(tmp_path / "run")] == [0, 1, 2]


def test_where_a_directory_cannot_be_locked_the_note_file_is(tmp_path, monkeypatch):
    """Some network file systems refuse ``flock`` on a directory: the lock falls back to the note file,
    which then holds the lock as before (a second holder is refused)."""
    real_take = run_dir_lib._take

    def no_directory_locks(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(9, "Bad file descriptor")
        return real_take(fd)

    monkeypatch.setattr(run_dir_lib, "_take", no_directory_locks)
    first = RunLock(tmp_path)
    first.acquire()
    assert first.on_note and f"PID {os.getpid()}" in (tmp_path / ".lock").read_text()
    with pytest.raises(ConfigError, match=f"is in use by PID {os.getpid()}"):
        RunLock(tmp_path).acquire()
    first.release()
    RunLock(tmp_path).acquire()


# ---------------------------------------------------------------- the user's own code: reward functions and verifiers
# A reward function (or a task's verifier) that raises, never returns (``task.reward_timeout``) or returns
# something that is not one number per completion is a ``RewardError`` naming the function, what it
# returned and, for an exception, the file and line in the user's code; ``python -m pgjax.run`` stops
# with one line (exit 1), ``python -m pgjax.eval`` too.

RELEASE = threading.Event()     # what a hanging function waits for (a new one per test: the ``release`` fixture)


def line_of(fn) -> str:
    """``file:line`` of the first line of ``fn``'s body, as messages name it (the file relative to the
    working directory when it lies below it)."""
    relative = os.path.relpath(__file__)
    return f"{os.path.abspath(__file__) if relative.startswith('..') else relative}:{fn.__code__.co_firstlineno + 1}"


def divides_by_zero(prompts, completions, **_):
    return [1 / 0 for _ in completions]


def too_few(prompts, completions, **_):
    return np.zeros(3)


def numeric_strings(prompts, completions, **_):
    return ["1.0"] * len(completions)


def none_in_row_2(prompts, completions, **_):
    return [None if i == 2 else 1.0 for i in range(len(completions))]


def a_dict(prompts, completions, **_):
    return {"x": 1.0}


def lists_of_lists(prompts, completions, **_):
    return [[1.0] for _ in completions]


def forgets_to_return(prompts, completions, **_):
    [1.0 for _ in completions]


def hangs(prompts, completions, **_):
    RELEASE.wait(60)
    return np.zeros(len(completions))


@pytest.fixture
def release():
    """A new ``RELEASE`` for the test's hanging functions, set when it ends (their threads then return)."""
    global RELEASE
    RELEASE = threading.Event()
    yield
    RELEASE.set()


@pytest.fixture(scope="module")
def score():
    """``score(fn)``: the scores of ``fn`` on 16 responses of a tiny policy to EmitX's prompts, through
    ``sample_and_score`` (the one path from samples to rewards), sampled once."""
    tokenizer = EmitX().tokenizer()
    policy = CausalLM(TINY_MODEL.config(len(tokenizer)), nnx.Rngs(0))
    examples, mesh, key = EmitX().examples(4), single_device_mesh(), jax.random.key(0)
    sampling = Decoding(max_new_tokens=3).sampling((tokenizer.eos_token_id,), pad_id(tokenizer), n=4)
    samples = dispatch_samples(policy, tokenizer, examples, 4, key, sampling, mesh)
    return lambda fn: sample_and_score(policy, tokenizer, examples, 4, key, sampling, {"reward": fn}, mesh,
                                       samples=samples).scores["reward"]


BAD_RETURNS = {
    divides_by_zero: "reward function divides_by_zero raised ZeroDivisionError: division by zero ({line})",
    too_few: "reward function too_few returned shape (3,) for 16 completions, expected (16,)",
    numeric_strings: "reward function numeric_strings returned a str ('1.0') at row 0: a reward must be a number "
                     "(int, float or bool)",
    none_in_row_2: "reward function none_in_row_2 returned None at row 2: a reward must be a number (int, float or "
                   "bool)",
    a_dict: "reward function a_dict returned a dict ({'x': 1.0}) for 16 completions, expected an array of shape (16,)",
    lists_of_lists: "reward function lists_of_lists returned shape (16, 1) for 16 completions, expected (16,)",
    forgets_to_return: "reward function forgets_to_return returned None for 16 completions, expected an array of "
                       "shape (16,)",
}


@pytest.mark.parametrize("fn", BAD_RETURNS, ids=lambda fn: fn.__name__)
def test_a_reward_function_that_raises_or_returns_no_numbers_is_one_line_naming_it(score, fn):
    with pytest.raises(RewardError) as error:
        score(fn)
    assert str(error.value) == BAD_RETURNS[fn].replace("{line}", line_of(fn))


def test_a_reward_function_that_does_not_return_in_time_is_named(score, release):
    with pytest.raises(RewardError, match=re.escape("reward function hangs did not return within "
                                                    "task.reward_timeout=0.2 s (called on 16 completions)")):
        score(with_timeout(hangs, 0.2))
    # in time, the timed function is the function: its value, or its exception and where it was raised
    np.testing.assert_array_equal(score(with_timeout(lambda p, completions, **_: np.ones(len(completions)), 5.0)),
                                  1.0)
    with pytest.raises(RewardError, match=re.escape(f"raised ZeroDivisionError: division by zero "
                                                    f"({line_of(divides_by_zero)})")):
        score(with_timeout(divides_by_zero, 5.0))


# ---------------------------------------------------------------- what the command lines print

def assert_one_line(err: str, line: str) -> None:
    """``line`` is on stderr, the only line from the command, with no traceback."""
    assert "Traceback" not in err, err
    assert [text for text in err.splitlines() if text.startswith("pgjax.")] == [line], err


def test_the_run_stops_in_one_line_naming_the_reward_function_and_its_line(tmp_path, capsys):
    code = cli.main([str(experiment_file(tmp_path)), "--no-progress",
                     "--set", "task.reward=test_faults:divides_by_zero"])
    assert code == 1
    assert_one_line(capsys.readouterr().err, "pgjax.run: stopped: step 1: reward function divides_by_zero raised "
                                             f"ZeroDivisionError: division by zero ({line_of(divides_by_zero)})")


VERIFIER_CALLS = itertools.count()


@dataclasses.dataclass(frozen=True)
class SlowVerifier(EmitX):
    """EmitX whose verifier answers the step-0 evaluation, then never returns."""

    @staticmethod
    def reward_fn(prompts, completions, **_):
        if next(VERIFIER_CALLS) >= 1:
            RELEASE.wait(60)
        return np.zeros(len(completions))


def test_a_verifier_that_never_returns_stops_the_run_after_task_reward_timeout(tmp_path, capsys, release):
    global VERIFIER_CALLS
    VERIFIER_CALLS = itertools.count()
    code = cli.main([str(experiment_file(tmp_path)), "--no-progress", "--set",
                     "task.name=test_faults:SlowVerifier", "--set", "task.reward_timeout=1"])
    assert code == 1
    assert_one_line(capsys.readouterr().err, "pgjax.run: stopped: step 1: reward function reward_fn did not return "
                                             "within task.reward_timeout=1.0 s (called on 16 completions)")


def missing_field(prompts, completions, **_):
    return {}["target"]


@dataclasses.dataclass(frozen=True)
class RaisingVerifier(EmitX):
    """EmitX on the checkpoint's tokenizer, whose verifier raises."""
    reward_fn = staticmethod(missing_field)

    def tokenizer(self):
        return None


def test_evaluation_stops_in_one_line_naming_the_verifier(tmp_path, capsys):
    save_tiny_checkpoint(tmp_path)
    code = eval_cli.main([str(tmp_path), "--task", "test_faults:RaisingVerifier", "--samples", "0",
                          "--prompts", "4", "--max-new-tokens", "3"])
    assert code == 1
    assert_one_line(capsys.readouterr().err, "pgjax.eval: stopped: reward function missing_field raised KeyError: "
                                             f"'target' ({line_of(missing_field)})")
