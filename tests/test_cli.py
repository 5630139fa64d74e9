"""The command line treats a user's mistake as an error, not a crash: each class of bad input exits
with status 2 and one or two plain lines naming the key, the value and what is valid, prints no
traceback, and writes nothing to disk."""
import os
import pathlib
import subprocess
import sys

import pytest

from pgjax import run
from pgjax.train import experiment as experiment_lib

ROOT = pathlib.Path(__file__).parent.parent
MAIN_JOB = str(ROOT / "experiments" / "arithmetic_dr_grpo.py")
GRPO = str(ROOT / "experiments" / "arithmetic_grpo.py")


def fails(capsys, tmp_path, monkeypatch, *argv, experiment=MAIN_JOB) -> str:
    """Run the CLI in ``tmp_path`` (default run directory runs/<name> there); assert exit status 2, a
    one-or-two-line message without a traceback, and nothing written; return the message."""
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert run.main([experiment, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pgjax.run: error: ") and 1 <= len(err.splitlines()) <= 2, err
    assert "Traceback" not in err
    assert sorted(tmp_path.rglob("*")) == before, "the CLI wrote to disk before refusing"
    return err


CASES = {
    "unknown key, with a suggestion": (["--set", "rollout.temprature=0.7"],
                                       "unknown config key 'rollout.temprature'; did you mean rollout.temperature?"),
    "key=value syntax": (["--set", "steps"], "--set expects key=value, got 'steps'"),
    "wrong type": (["--set", "prompts_per_step=lots"], "prompts_per_step='lots' is invalid: an int is expected"),
    "negative steps": (["--set", "steps=-5"], "steps=-5 is invalid: an integer >= 0"),
    "zero batch": (["--set", "prompts_per_step=0"], "prompts_per_step=0 is invalid: an integer >= 1"),
    "non-positive learning rate": (["--set", "optim.lr=0"], "optim.lr='0' is invalid: lr must be finite and > 0"),
    "bad hyperparameter": (["--set", "algorithm.hparams.clip_eps_low=1.5"], "hyperparameter clip_eps_low=1.5 must be in [0, 1)"),
    "unknown algorithm": (["--set", "algorithm.preset=trpo"], "algorithm.preset='trpo' is invalid: one of reinforce"),
    "a renamed key": (["--set", "hparams.kl_coef=0.01"], "did you mean algorithm.hparams.kl_coef?"),
    "the old algorithm key": (["--set", "algorithm=grpo"], "did you mean algorithm.preset?"),
    "unknown task": (["--set", "task.name=sudoku"], "task.name='sudoku' is unknown; valid: arithmetic"),
    "micro-batches that do not divide": (["--set", "update.micro_batches=3"],
                                         "32 prompt groups per step (prompts_per_step) do not split into "
                                         "update.minibatches=1 x update.micro_batches=3"),
    "missing model": (["--set", "model.path=/no/such/checkpoint"],
                      "model.path='/no/such/checkpoint': no Hugging Face checkpoint there"),
    "missing dataset": (["--set", "task.name=jsonl_math", "--set", "task.path=/no/such.jsonl"],
                        "task.path='/no/such.jsonl': no such dataset file"),
    "negative seed": (["--set", "seed=-1"], "seed=-1 is invalid: an integer >= 0"),
    "prompts longer than the prompt budget": (["--set", "rollout.max_prompt_tokens=3"],
                                              "rollout.max_prompt_tokens=3: prompts must have 1..3 tokens"),
    "demonstrations longer than the response budget": (["--set", "rollout.max_new_tokens=2"],
                                                       "rollout.max_new_tokens=2: demonstration"),
    "a mesh that does not fit the devices": (["--set", "mesh.data=3"], "mesh: mesh {'data': 3, 'fsdp': 1, 'tensor': 1} "
                                                                       "needs 3 devices, 1 are present"),
    "a sampler that leaves the learner no device": (["--set", "rollout.sampler_devices=1"],
                                                    "mesh, rollout.sampler_devices: sampler_devices=1 must leave "
                                                    "the learner at least one of the 1 devices"),
    "a KL coefficient where there is no KL term": (["--set", "algorithm.hparams.kl_coef=0.01"],
                                                   "hparams.kl_coef=0.01 does nothing for dr_grpo"),
    "sampling and scoring temperatures that differ": (["--set", "rollout.temperature=0.8"],
                                                      "update.temperature=1.0 differs from rollout.temperature=0.8"),
    "a task option the task does not take": (["--set", "task.count=4"],
                                             "task.count=4 does nothing for task 'arithmetic', which takes digits, ops"),
    "a reward that is not a function": (["--set", "task.reward=pgjax.rewards:TASKS"], "is not callable"),
    "distributed ids out of range": (["--set", "distributed.num_processes=2", "--set", "distributed.process_id=2"],
                                     "process_id in [0, num_processes)"),
    "resume with nothing to resume": (["--resume"], "--resume: no checkpoint to resume in runs/arithmetic_dr_grpo"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_configuration_mistake_exits_2_with_a_plain_message_and_writes_nothing(case, capsys, tmp_path,
                                                                                   monkeypatch):
    argv, message = CASES[case]
    assert message in fails(capsys, tmp_path, monkeypatch, *argv)


def test_a_group_baseline_with_one_sample_per_prompt_is_refused(capsys, tmp_path, monkeypatch):
    err = fails(capsys, tmp_path, monkeypatch, "--set", "rollout.samples_per_prompt=1", experiment=GRPO)
    assert "rollout.samples_per_prompt=1 is invalid for grpo: its group baseline compares K >= 2" in err


def test_a_run_directory_that_cannot_be_written_is_refused(capsys, tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("not a directory")
    err = fails(capsys, tmp_path, monkeypatch, "--set", f"run_dir={tmp_path / 'a_file' / 'run'}")
    assert "cannot be written" in err and "a_file is not a writable directory" in err


def test_a_missing_experiment_file_is_refused(capsys, tmp_path, monkeypatch):
    err = fails(capsys, tmp_path, monkeypatch, experiment=str(tmp_path / "nope.py"))
    assert "no experiment file" in err and "nope.py" in err


def test_the_real_command_prints_no_traceback(tmp_path):
    """The same through ``python -m pgjax.run`` in a subprocess (what a user sees)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pgjax.run", MAIN_JOB, "--set", "model.layers=3"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "pgjax.run: error: unknown config key 'model.layers'; did you mean model.num_hidden_layers?",
        "(--print-config lists every key and its value)"]
    assert done.stdout == "" and not (tmp_path / "runs").exists()


def test_print_config_lists_every_key_with_its_resolved_value(capsys):
    assert run.main([GRPO, "--set", "rollout.temperature=0.8", "--print-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    values = dict(line.split(" = ", 1) for line in lines)
    keys = [k for k in experiment_lib.valid_keys()]
    assert sorted(values) == sorted(keys)
    assert values["rollout.temperature"] == "0.8" and values["algorithm.preset"] == "'grpo'"
    assert values["algorithm.hparams.kl_coef"] == "0.04" and values["algorithm.hparams.divide_by_std"] == "1.0"   # the preset's


def test_help_lists_the_sections(capsys):
    with pytest.raises(SystemExit) as exit_status:
        run.main(["--help"])
    assert exit_status.value.code == 0
    out = capsys.readouterr().out
    for section in ("algorithm", "model", "task", "rollout", "update", "optim", "warm_start", "logging", "mesh",
                    "distributed"):
        assert f"\n  {section} " in out, section
    assert "algorithm.hparams.kl_coef=0.01" in out
    assert "--print-config" in out and "--resume" in out
