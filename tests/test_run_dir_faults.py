"""Faults of the run directory and of stopping, injected one by one: a live run whose directory is
moved or deleted stops in one line and writes nothing into a new run at that path; a reward model
(``task.reward.model``) replaced at the same path is refused on resume like ``model.path``; a
file added to ``model.path`` is named with the files that count; a missing generation config is
written again on resume and final/ never lacks it; a stop at once says whether a checkpoint is
left; Ctrl-C while the command line loads is one line (130); a checkpoint write cut short is
removed on resume; a signal while final/ is written finishes final/ and exits with the signal's
status; SIGHUP stops a run like SIGTERM. Functions and tasks defined here are addressable as
``test_run_dir_faults:NAME``."""
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EMIT_X, EmitX, SignalAt, copy_of, experiment_file, save_tiny_checkpoint, snapshot, tiny_experiment

from pgjax import run as cli
from pgjax.config import ConfigError, ModelSection, RewardSection, TaskSection
from pgjax.errors import RunStopped
from pgjax.models import hf
from pgjax.models.heads import RewardModel
from pgjax.train import inputs, interrupts
from pgjax.train import run_dir as run_dir_lib
from pgjax.train.interrupts import RunInterrupted
from pgjax.train.run_dir import RunDirectory, RunLock
from pgjax.train.sinks import read_records
from pgjax.train.trainer import Trainer, train

ROOT = pathlib.Path(__file__).parent.parent


# ---------------------------------------------------------------- a run directory moved or deleted while live

@pytest.fixture
def new_runs():
    """The locks of the new runs ``replace_directory`` starts, released at the test's end."""
    locks = []
    yield locks
    for lock in locks:
        lock.release()


def replace_directory(run: pathlib.Path, how: str, new_runs: list) -> None:
    """Move (``how="moved"``, to ``<run>-moved``) or delete the run directory, then start a new live
    run there: a directory holding its lock (appended to ``new_runs``) and a record of its own."""
    if how == "moved":
        os.rename(run, run.with_name(run.name + "-moved"))
    else:
        shutil.rmtree(run)
    run.mkdir()
    new_runs.append(RunLock(run))
    new_runs[-1].acquire()
    (run / "metrics.jsonl").write_text('{"step": 0, "new_run": true}\n')


def fate(run: pathlib.Path, how: str) -> str:
    """What the stopped run says became of its directory."""
    return f"was moved to {run.with_name(run.name + '-moved')} (the run's results so far are there)" \
        if how == "moved" else "was deleted"


@pytest.mark.parametrize("how", ["moved", "deleted"])
def test_a_run_whose_directory_is_moved_or_deleted_stops_in_one_line_writing_nothing_into_the_new_one(
        tmp_path, capsys, monkeypatch, new_runs, how):
    """The directory goes while step 2 runs (its evaluation), and a new run takes the path: the old
    run stops with one line (exit 1) before step 2's record, and the new directory is untouched."""
    run = tmp_path / "run"
    evaluate = Trainer.evaluate

    def evaluate_then_replace(self):
        if self.step_count == 2:
            replace_directory(run, how, new_runs)
        return evaluate(self)

    monkeypatch.setattr(Trainer, "evaluate", evaluate_then_replace)
    assert cli.main([str(experiment_file(tmp_path)), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"pgjax.run: stopped: run_dir='{run}' {fate(run, how)} while the run was live: the record of "
                       f"step 2 was not written, nor anything after it (what is at {run} now is not this run's)")
    assert "Traceback" not in "\n".join(err)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "metrics.jsonl"]
    assert read_records(run) == [{"step": 0, "new_run": True}]
    if how == "moved":
        moved = run.with_name("run-moved")
        assert [r["step"] for r in read_records(moved)] == [0, 1]
        assert sorted(p.name for p in (moved / "checkpoints").iterdir()) == ["0"]


def test_a_directory_moved_between_a_record_and_its_checkpoint_gets_no_checkpoint(finished, tmp_path, monkeypatch,
                                                                                   new_runs):
    exp = dataclasses.replace(finished[0], run_dir=str(tmp_path / "run"))
    run = tmp_path / "run"
    log = RunDirectory.log

    def log_then_move(self, record, completions=()):
        log(self, record, completions)
        if record["step"] == 2:
            replace_directory(run, "moved", new_runs)

    monkeypatch.setattr(RunDirectory, "log", log_then_move)
    with pytest.raises(RunStopped, match=rf"^run_dir='{run}' was moved to .*: the checkpoint of step 2 was not "
                                         "written, nor anything after it"):
        train(exp, progress=False)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "metrics.jsonl"]
    assert sorted(p.name for p in (tmp_path / "run-moved" / "checkpoints").iterdir()) == ["0"]


def test_a_directory_deleted_during_a_checkpoint_is_one_line_not_orbaxs_error(finished, tmp_path, monkeypatch,
                                                                               new_runs):
    """Orbax fails when the directory it writes into vanishes mid-save: the run says what happened."""
    import orbax.checkpoint as ocp
    exp = dataclasses.replace(finished[0], run_dir=str(tmp_path / "run"))
    run = tmp_path / "run"
    save = ocp.CheckpointManager.save

    def deleted_during_step_2(manager, step, *args, **kwargs):
        if step == 2:
            replace_directory(run, "deleted", new_runs)
            raise FileNotFoundError(2, "No such file or directory", str(run / "checkpoints" / "2.orbax-checkpoint-tmp"))
        return save(manager, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", deleted_during_step_2)
    with pytest.raises(RunStopped, match=rf"^run_dir='{run}' was deleted while the run was live: the checkpoint of "
                                         "step 2 was not written"):
        train(exp, progress=False)
    assert sorted(p.name for p in run.iterdir()) == [".lock", "metrics.jsonl"]


# ---------------------------------------------------------------- inputs: a reward model, files added to model.path

@pytest.fixture(scope="module")
def with_reward_model(tmp_path_factory):
    """A finished 2-step RL run scored by a tiny reward model (``task.reward.model``); its experiment
    and directory."""
    tmp = tmp_path_factory.mktemp("rm")
    trunk = save_tiny_checkpoint(tmp / "trunk")
    hf.save_reward_model(RewardModel(hf.load(trunk)), tmp / "reward_model", tokenizer_dir=trunk)
    exp = tiny_experiment(
        tmp,
        steps=2,
        checkpoint_every=2,
        eval_prompts=4,
        task=TaskSection(name=EMIT_X.name, reward=RewardSection(model=str(tmp / "reward_model"), verifier_weight=0.0)),
    )
    return exp, train(exp, progress=False)


def test_a_reward_model_replaced_at_the_same_path_is_refused_on_resume_and_recorded_with_changes(
    with_reward_model, tmp_path
):
    exp, directory = with_reward_model
    shutil.copytree(directory, tmp_path / "run")
    shutil.copytree(exp.task.reward.model, tmp_path / "reward_model")
    exp = dataclasses.replace(exp, run_dir=str(tmp_path / "run"), steps=3,
                              task=dataclasses.replace(exp.task, reward=dataclasses.replace(
                                  exp.task.reward, model=str(tmp_path / "reward_model"))))
    assert {"task.reward.model/model.safetensors", "task.reward.model/config.json"} <= set(
        json.loads((tmp_path / "run" / "inputs.json").read_text())["files"])
    RunDirectory(exp, resume=True)                          # moved elsewhere, the same bytes: no change
    other = hf.load_reward_model(exp.task.reward.model)
    other.head.set_value(jnp.ones(other.head.shape, jnp.float32))
    hf.save_reward_model(other, tmp_path / "other")
    shutil.copy(tmp_path / "other" / "model.safetensors", exp.task.reward.model)      # new weights at the same path
    untouched = snapshot(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"^--resume: an input of .* changed since the run began \(task.reward.model/"
                                          r"model.safetensors: .*model.safetensors holds other bytes"):
        train(exp, resume=True, progress=False)
    assert snapshot(tmp_path / "run") == untouched
    train(exp, resume=True, accept_changes=True, progress=False)
    entry = json.loads((tmp_path / "run" / "changes.jsonl").read_text())
    assert entry["step"] == 2 and list(entry["inputs"]) == ["task.reward.model/model.safetensors"]


def test_a_file_added_to_model_path_is_named_with_the_files_that_count(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    model = save_tiny_checkpoint(tmp_path / "model")
    exp = dataclasses.replace(exp, model=ModelSection(path=str(model)))
    (run / "experiment.json").write_text(json.dumps(run_dir_lib.experiment_record(exp)))
    (run / "inputs.json").write_text(json.dumps({"files": inputs.fingerprints(inputs.input_files(exp))}))
    RunDirectory(exp, resume=True)
    (model / "notes.json").write_text("{}")
    with pytest.raises(ConfigError) as error:
        RunDirectory(exp, resume=True)
    assert (f"model.path/notes.json: {model / 'notes.json'} is new (of model.path, the files ending in .json, "
            ".safetensors, .txt, .model, .jinja and those in additional_chat_templates/ are inputs: move a file that "
            "is not the checkpoint's out of it)") in str(error.value)
    (model / "notes.json").rename(tmp_path / "notes.json")
    RunDirectory(exp, resume=True)


# ---------------------------------------------------------------- final/ and the generation config

@pytest.fixture(scope="module")
def with_generation_config(tmp_path_factory):
    """A finished 2-step run on a checkpoint (``model.path``) that has a generation_config.json."""
    tmp = tmp_path_factory.mktemp("generation")
    model = save_tiny_checkpoint(tmp / "model")
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1=", "answer": a + 1}) + "\n" for a in range(6)))
    exp = tiny_experiment(tmp, steps=2, checkpoint_every=2, eval_prompts=4, prompts_per_step=2,
                          model=ModelSection(path=str(model)),
                          task=TaskSection(name="jsonl_math", options={"path": str(data)}))
    return exp, train(exp, progress=False)


def test_a_missing_generation_config_is_written_again_on_resume_and_final_has_it(with_generation_config, tmp_path,
                                                                                  capsys):
    exp, directory = with_generation_config
    shutil.copytree(directory, tmp_path / "run")
    exp, run = dataclasses.replace(exp, run_dir=str(tmp_path / "run")), tmp_path / "run"
    assert (run / "final" / "generation_config.json").is_file()
    (run / "tokenizer" / "generation_config.json").unlink()
    train(exp, resume=True, progress=False)                    # a finished run: only final/ is written again
    assert (f"{run / 'tokenizer'} was missing or incomplete: written again from the run's tokenizer (it lacked "
            "generation_config.json)") in capsys.readouterr().err
    for folder in ("tokenizer", "final"):
        assert json.loads((run / folder / "generation_config.json").read_text()) == {"eos_token_id": [1, 2]}


def test_an_export_that_would_lack_the_generation_config_writes_no_final(with_generation_config, tmp_path):
    exp, directory = with_generation_config
    shutil.copytree(directory, tmp_path / "run")
    exp, run = dataclasses.replace(exp, run_dir=str(tmp_path / "run")), tmp_path / "run"
    run_directory = RunDirectory(exp, resume=True)
    (run / "tokenizer" / "generation_config.json").unlink()
    before = snapshot(run / "final")
    with pytest.raises(RunStopped, match=r"^final/ was not written: it would lack generation_config.json \(the "
                                         r"checkpoints are intact; --resume writes what .*tokenizer lacks again"):
        run_directory.export(hf.load(run / "final"))
    assert snapshot(run / "final") == before


def test_final_is_replaced_by_renames_never_removed_in_place(finished, tmp_path, monkeypatch):
    """A kill while the old final/ is removed would leave half of it: the old final/ is renamed aside
    before it is removed, so final/ is whole (the old or the new) at every moment."""
    exp, run = copy_of(finished, tmp_path)
    rmtree = shutil.rmtree

    def never_final(path, *args, **kwargs):
        assert pathlib.Path(path).name != "final", "final/ removed in place"
        return rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", never_final)
    train(exp, resume=True, progress=False)
    names = lambda folder: sorted(p.name for p in folder.iterdir())    # noqa: E731
    assert names(run / "final") == names(finished[1] / "final")
    assert not (run / "final.replaced").exists() and not (run / "final.partial").exists()


# ---------------------------------------------------------------- signals

RELEASE = threading.Event()
HUNG = []


def hang_once(prompts, completions, **_):
    """1 for a response starting with x; on the first call it sends SIGTERM and waits for ``RELEASE``
    (what the test's stand-in for ``os._exit`` sets)."""
    if not HUNG:
        HUNG.append(True)
        signal.raise_signal(signal.SIGTERM)
        assert RELEASE.wait(60), "not released"
    return np.array([float(c.startswith("x")) for c in completions])


class HangsOnce(EmitX):
    """EmitX whose verifier hangs on its first call: the step-0 evaluation, before any checkpoint."""
    reward_fn = staticmethod(hang_once)


@pytest.mark.parametrize("where, says", [
    ("evaluation", "no checkpoint was written yet: nothing to resume; run it again to start over"),
    ("reward", "the checkpoint of step 0 is the last complete one (--resume continues from it)")])
def test_a_stop_at_once_says_whether_a_checkpoint_is_left(tmp_path, monkeypatch, capsys, where, says):
    """SIGTERM while a reward function hangs, the grace period runs out: the run says what it leaves
    (``os._exit`` replaced by a stand-in that records the status and lets the hang end)."""
    HUNG.clear()
    RELEASE.clear()
    exits = []
    monkeypatch.setattr(os, "_exit", lambda status: exits.append(status) or RELEASE.set())
    task = (TaskSection(name="test_run_dir_faults:HangsOnce") if where == "evaluation" else
            dataclasses.replace(EMIT_X, reward="test_run_dir_faults:hang_once"))
    with pytest.raises(RunInterrupted):
        train(tiny_experiment(tmp_path, task=task), progress=False, grace_period=0.5)
    assert exits == [128 + signal.SIGTERM]
    assert (f"pgjax.run: the step and its checkpoint did not finish within the grace period of 0.5 s; {says}"
            in capsys.readouterr().err)


class Unhandled(Exception):
    """A signal the code under test left to the test's handler (its default action would end the
    test's process)."""


@contextlib.contextmanager
def unhandled_raises(signum):
    """Within the block, ``signum`` raises Unhandled unless the code under test handles it."""
    def unhandled(signum, frame):
        raise Unhandled(signal.Signals(signum).name)

    previous = signal.signal(signum, unhandled)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def test_a_grace_period_of_0_stops_at_once_saying_what_is_left(monkeypatch, capsys):
    def exit_now(status):
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", exit_now)
    with unhandled_raises(signal.SIGHUP), pytest.raises(SystemExit) as exited, \
            interrupts.graceful_stop(lambda: "what is left", grace_period=0):
        signal.raise_signal(signal.SIGHUP)
    assert exited.value.code == 128 + signal.SIGHUP
    assert capsys.readouterr().err == "pgjax.run: SIGHUP: stopped at once (a grace period of 0 s); what is left\n"


def test_an_ignored_sighup_stays_ignored():
    """Under ``nohup`` SIGHUP is ignored: a closed terminal does not stop the run."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupts.graceful_stop(lambda: "what is left"):
            signal.raise_signal(signal.SIGHUP)
            assert interrupts.requested() is None
    finally:
        signal.signal(signal.SIGHUP, previous)


def caught_signals(pid: int) -> int:
    """The mask of the signals the process ``pid`` has handlers for (/proc/<pid>/status, SigCgt)."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="reads /proc")
def test_ctrl_c_while_the_command_line_loads_is_one_line_and_130(tmp_path):
    """Ctrl-C as soon as ``python -m pgjax.run`` handles signals (SIGHUP caught: Python alone does not
    catch it), while its modules load: one line, status 130, nothing written."""
    # SIGHUP at its default in the child, as from a terminal (under nohup it is ignored and stays so)
    process = subprocess.Popen([sys.executable, "-m", "pgjax.run", str(experiment_file(tmp_path)), "--no-progress"],
                               env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        while process.poll() is None and not caught_signals(process.pid) & (1 << (signal.SIGHUP - 1)):
            time.sleep(0.001)
        process.send_signal(signal.SIGINT)
        out = process.communicate(timeout=60)[0]
    finally:
        process.kill()
    assert process.returncode == 130, out
    assert out == "pgjax.run: interrupted by SIGINT (no step was running: nothing was being written)\n"
    assert not (tmp_path / "run").exists()


def test_a_checkpoint_write_cut_short_is_removed_on_resume(finished, tmp_path, capsys):
    exp, run = copy_of(finished, tmp_path)
    leftover = run / "checkpoints" / "6.orbax-checkpoint-tmp-1234"
    (leftover / "state").mkdir(parents=True)
    (leftover / "state" / "half").write_bytes(b"\0" * 64)
    train(exp, resume=True, progress=False)
    assert not leftover.exists()
    assert (f"--resume: removed 6.orbax-checkpoint-tmp-1234 from {run / 'checkpoints'}: the temporary files of a "
            "checkpoint write cut short (not a checkpoint)") in capsys.readouterr().err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["2", "4"]


def test_a_signal_while_final_is_written_finishes_it_and_exits_with_the_signals_status(finished, tmp_path,
                                                                                       monkeypatch, capsys):
    exp, run = copy_of(finished, tmp_path)
    shutil.rmtree(run / "final")
    save = hf.save

    def signalled_save(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return save(*args, **kwargs)

    monkeypatch.setattr(hf, "save", signalled_save)
    with pytest.raises(RunInterrupted, match="^interrupted by SIGTERM after writing final/: the run is complete$") as \
            error:
        train(exp, resume=True, progress=False)
    assert error.value.exit_status == 143
    assert "pgjax.run: SIGTERM: writing final/ (at most 50 s; a second signal stops at once)" in \
        capsys.readouterr().err
    names = lambda folder: sorted(p.name for p in folder.iterdir())    # noqa: E731
    assert names(run / "final") == names(finished[1] / "final") and not (run / "final.partial").exists()


def test_sighup_stops_a_run_like_sigterm(finished, tmp_path, capsys):
    exp = dataclasses.replace(finished[0], run_dir=str(tmp_path / "run"))
    with unhandled_raises(signal.SIGHUP), pytest.raises(
            RunInterrupted, match="interrupted by SIGHUP after step 1, its checkpoint written") as error:
        train(exp, progress=False, callbacks=[SignalAt(signal.SIGHUP, 1)])
    assert error.value.exit_status == 129
    assert "SIGHUP: finishing the current step and writing a checkpoint" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["0", "1"]
