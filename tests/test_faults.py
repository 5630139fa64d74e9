"""Faults a long run meets, injected one by one; each test asserts what the user sees and what is
left on disk. NaN / inf rewards and non-finite updates never reach a checkpoint or ``final/``;
damaged checkpoints are found and skipped; a torn metrics line is dropped on resume; a resume with a
changed experiment is refused (or recorded); a live run directory is locked; bad dataset records
are named before anything is written; and a run killed with SIGKILL resumes bit for bit."""
import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pgjax import run as cli
from pgjax.models import hf
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.train import experiment as experiment_lib
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.experiment import AlgorithmSection, ConfigError, RunStopped, TaskSection
from pgjax.train.learner import UpdateConfig
from pgjax.train.optim import OptimConfig
from pgjax.train.run_dir import RunDirectory, RunLock, locate
from pgjax.train.sinks import read_records
from pgjax.train.trainer import Trainer, train
from helpers import (EMIT_X, comparable, read_events, sampled_rollout, save_tiny_tokenizer, tiny_experiment,
                     tiny_learner)

ROOT = pathlib.Path(__file__).parent.parent


def experiment_file(tmp_path, **changes) -> pathlib.Path:
    """An experiment file for the command line: ``tiny_experiment`` on the EmitX task."""
    file = tmp_path / "faulty.py"
    extra = "".join(f", {k}={v}" for k, v in changes.items())
    file.write_text("import pathlib\nfrom helpers import EMIT_X, tiny_experiment\n"
                    "from pgjax.train.learner import UpdateConfig\nfrom pgjax.train.optim import OptimConfig\n\n"
                    "def experiment():\n"
                    f"    return tiny_experiment(pathlib.Path({str(tmp_path)!r}), task=EMIT_X{extra})\n")
    return file


def snapshot(directory: pathlib.Path) -> dict:
    """Every file under ``directory`` (but the lock's note of its last holder) with a hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != ".lock"}


def assert_no_nan_on_disk(directory: pathlib.Path) -> None:
    """No metrics line, record or experiment file holds a bare NaN / Infinity."""
    for path in [directory / "metrics.jsonl", *directory.glob("checkpoints/*/record/metadata")]:
        if path.is_file():
            for line in path.read_text().splitlines():
                json.loads(line, parse_constant=lambda c: pytest.fail(f"{path} holds {c}"))


def finite_tree(tree) -> bool:
    return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact))


def assert_same_tree(a, b) -> None:
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 4-step run (checkpoints at steps 2 and 4), a trainer of its experiment (whose
    state is the layout to restore into) and the states of both checkpoints."""
    tmp = tmp_path_factory.mktemp("finished")
    exp = tiny_experiment(tmp, task=EMIT_X)
    directory = train(exp, progress=False)
    trainer = Trainer(exp)
    checkpoints = Checkpoints(directory / "checkpoints")
    states = {step: checkpoints.restore(trainer.state, step)[0] for step in (2, 4)}
    checkpoints.close()
    return exp, directory, trainer, states


def copy_of(finished, tmp_path) -> tuple:
    exp, directory = finished[:2]
    shutil.copytree(directory, tmp_path / "run")
    return dataclasses.replace(exp, run_dir=str(tmp_path / "run")), tmp_path / "run"


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
    assert ("pgjax.run: stopped: steps 1..2: every update had a non-finite loss, gradient or result and was skipped "
            "(update.max_skipped_steps=2); the parameters are those of step 0") in err
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
    with pytest.raises(ConfigError, match=r"no intact checkpoint in .*checkpoints: step 4: .*; step 2: "):
        train(exp, resume=True, progress=False)
    assert not (run / "final.partial").exists()


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
    assert "mlp" in message and "float32[32, 64] in the checkpoint, float32[32, 48] here" in message
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
    directory = tmp_path_factory.mktemp("checkpoint")
    config = ModelConfig(family="qwen2", vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    hf.save(CausalLM(config, nnx.Rngs(0)), directory)
    config_json = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config_json, "max_position_embeddings": 32}))
    save_tiny_tokenizer(directory)
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
from pgjax.train.rollout import RolloutConfig

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
    whole = start_run(file, tmp_path / "whole")
    killed = start_run(file, tmp_path / "killed")
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
    resumed = start_run(file, tmp_path / "killed", "--resume")
    assert resumed.wait() == 0, resumed.stdout.read()
    assert whole.wait() == 0, whole.stdout.read()
    assert comparable(metrics) == comparable(tmp_path / "whole" / "metrics.jsonl")
    events = read_events(tmp_path / "killed")   # TensorBoard keeps one value per step: the killed run's events
                                                # after the checkpoint are purged on resume
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert events["reward"] == pytest.approx({r["step"]: r["reward"] for r in records if "reward" in r})
    a = hf.load(tmp_path / "whole" / "final")
    b = hf.load(tmp_path / "killed" / "final")
    jax.tree.map(np.testing.assert_array_equal, nnx.state(a), nnx.state(b))
