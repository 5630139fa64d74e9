"""The run directory (pgjax/train/run_dir.py): a resume that changes the maths or data is refused
listing the keys, operational changes resume and are recorded; a live directory is locked (also when
its note file is deleted, or where a directory cannot be locked); a new run never writes into another
run's results; ``final/`` is complete or not written, its files readable like the checkpoints'."""
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import sys

import pytest
from helpers import (
    EMIT_X,
    comparable,
    copy_of,
    experiment_file,
    file_modes,
    plain_mode,
    snapshot,
    tiny_experiment,
)

from pgjax import machine
from pgjax import run as cli
from pgjax.config import (
    AlgorithmSection,
    ConfigError,
    OptimConfig,
    PromptSection,
    RewardSection,
    TaskSection,
    UpdateConfig,
)
from pgjax.errors import RunStopped
from pgjax.train import run_dir as run_dir_lib
from pgjax.train.run_dir import RunDirectory, RunLock, locate
from pgjax.train.sinks import read_machines, read_records
from pgjax.train.trainer import train

ROOT = pathlib.Path(__file__).parent.parent


def test_exported_files_are_readable_like_the_checkpoints(finished):
    """Every file of final/ has the mode of a plain write (0644 under umask 022), as orbax's files have
    (safetensors alone would leave model.safetensors 0600)."""
    directory = finished[1]
    final, checkpoint = file_modes(directory / "final"), file_modes(directory / "checkpoints" / "4")
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= set(final)
    assert set(final.values()) == set(checkpoint.values()) == {plain_mode()}, (final, checkpoint)


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
    del saved["task"]["prompt"]["stop_text"], saved["logging"]["completions_every"]   # a run begun before these
    (run / "experiment.json").write_text(json.dumps(saved))
    assert set(RunDirectory(exp, resume=True).changes) == {"run_dir"}     # at their defaults: no change
    with pytest.raises(ConfigError, match=r"task\.prompt\.stop_text: None -> 'x'"):
        RunDirectory(dataclasses.replace(exp, task=dataclasses.replace(exp.task, prompt=PromptSection(stop_text="x"))),
                     resume=True)


# the task section as experiment.json held it while the task's options, prompt, reward and tools were
# fields of the section itself (each at its default then; the run's task, helpers.EmitX, takes no options)
FLAT_TASK = {"name": EMIT_X.name, "digits": 2, "ops": "+", "max_scratch": 8, "working": "before", "count": 3,
             "path": "", "prompt_field": "question", "answer_field": "answer", "extra_fields": "",
             "file_format": "auto", "skip_invalid": False, "word_share": 0.5, "answer_from": "boxed_or_last_number",
             "held_out": "none", "reward": "", "format_weight": 0.0, "chat_template": "auto", "system_prompt": "",
             "prompt_template": "{prompt}", "stop_text": "", "reward_timeout": 0.0, "tools": "", "reward_model": "",
             "reward_model_weight": 1.0, "reward_model_normalize": "none", "verifier_weight": 1.0, "options": {}}


@pytest.mark.parametrize("old, new, change", [
    ({}, {}, None),                                                     # the same run: it resumes
    ({"digits": 3}, {}, None),                          # a flat option the run's task does not take: it did nothing
    ({"prompt_template": "Q: {prompt}"}, {"prompt": PromptSection(template="Q: {prompt}")}, None),
    ({"reward_model_weight": 0.5}, {"reward": RewardSection(model_weight=0.5)}, None),
    ({"stop_text": "x"}, {}, r"task\.prompt\.stop_text: 'x' -> ''"),     # a changed one is refused, named today
])
def test_a_run_saved_with_the_flat_task_section_resumes_in_the_sections_it_has_now(finished, tmp_path, old, new,
                                                                                   change):
    """A run directory's experiment.json written while the task section was flat (its options, prompt and
    reward keys beside its name) is read in today's layout (``config.upgraded``): the same experiment
    resumes, a changed one is refused naming the key as it is now."""
    exp, run = copy_of(finished, tmp_path)
    saved = json.loads((run / "experiment.json").read_text())
    (run / "experiment.json").write_text(json.dumps({**saved, "task": {**FLAT_TASK, **old}}))
    resumed = dataclasses.replace(exp, task=dataclasses.replace(exp.task, **new))
    if change is None:
        assert set(RunDirectory(resumed, resume=True).changes) == {"run_dir"}
    else:
        with pytest.raises(ConfigError, match=change):
            RunDirectory(resumed, resume=True)


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


def test_each_sitting_records_its_machine_and_a_resume_drops_the_steps_it_computes_again(finished, tmp_path):
    """machines.jsonl: a line per sitting with the step it started from and this machine's CPU and
    JAX backend; a resume from step 4 keeps the lines of earlier steps only (a line a later sitting
    wrote from step 6, whose steps the resume computes again, goes)."""
    exp, run = copy_of(finished, tmp_path)
    (first,) = read_machines(run)
    assert first["step"] == 0 and first["cpu"] == machine.cpu() and first["jax_backend"] == "cpu"
    later = {**first, "step": 6, "cpu": {**first["cpu"], "model": "another CPU"}}
    with (run / "machines.jsonl").open("a") as f:
        f.write(json.dumps(later) + "\n")
    train(dataclasses.replace(exp, steps=6), resume=True, progress=False)
    here = machine.cpu()["model"]
    assert [(m["step"], m["cpu"]["model"]) for m in read_machines(run)] == [(0, here), (4, here)]


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


def test_a_change_is_recorded_only_when_a_step_ran_with_it(finished, tmp_path):
    exp, run = copy_of(finished, tmp_path)
    saved = (run / "experiment.json").read_text()
    changed = dataclasses.replace(exp, steps=6, task=dataclasses.replace(exp.task, reward="helpers:always_nan"))
    with pytest.raises(RunStopped, match="reward function always_nan returned nan"):
        train(changed, resume=True, accept_changes=True, progress=False)
    assert not (run / "changes.jsonl").exists() and (run / "experiment.json").read_text() == saved
    train(dataclasses.replace(exp, steps=5), resume=True, progress=False)   # nothing recorded: no change to undo


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
