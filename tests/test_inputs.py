"""Input fingerprints (pgjax/train/inputs.py): a run's datasets, checkpoints and user modules are
compared by content on resume; moved unchanged they resume, edited in place they are refused in one
line (or, with --resume-with-changes, recorded). Functions defined here are addressable as
``test_inputs:NAME``."""
import dataclasses
import json
import os
import pathlib
import shutil
import sys
import time

import numpy as np
import pytest
from helpers import (
    GOOD,
    copy_of,
    damage,
    dataset_experiment,
    snapshot,
)

from pgjax.config import ConfigError
from pgjax.train import inputs
from pgjax.train import run_dir as run_dir_lib
from pgjax.train.run_dir import RunDirectory
from pgjax.train.trainer import train

ROOT = pathlib.Path(__file__).parent.parent


# ---------------------------------------------------------------- inputs checked by content on resume

@pytest.fixture(scope="module")
def finished_on_data(tmp_path_factory, checkpoint_dir):
    """A finished 2-step run on a JSONL dataset and a copy of the tiny checkpoint (inputs the tests
    then change); its experiment and directory."""
    tmp = tmp_path_factory.mktemp("on_data")
    shutil.copytree(checkpoint_dir, tmp / "model")
    exp = dataset_experiment(tmp, tmp / "model", GOOD)
    exp = dataclasses.replace(exp, steps=2, checkpoint_every=2, eval_prompts=4, prompts_per_step=2,
                              task=dataclasses.replace(exp.task, reward="test_inputs:emits_x"))
    return exp, train(exp, progress=False)


def emits_x(prompts, completions, **_):
    """1 for a response starting with x."""
    return np.array([float(c.startswith("x")) for c in completions])


def copy_run_and_inputs(finished_on_data, tmp_path) -> tuple:
    """A copy of the run, its dataset and its model, with an experiment pointing at the copies."""
    exp, directory = finished_on_data
    shutil.copytree(directory, tmp_path / "run")
    shutil.copytree(exp.model.path, tmp_path / "model")
    shutil.copy(exp.task.options["path"], tmp_path / "data.jsonl")
    moved = dataclasses.replace(exp, run_dir=str(tmp_path / "run"), model=dataclasses.replace(exp.model, path=str(
        tmp_path / "model")), task=dataclasses.replace(exp.task, options={"path": str(tmp_path / "data.jsonl")}))
    return moved, tmp_path / "run"


def test_inputs_moved_unchanged_resume_but_a_dataset_edited_in_place_is_refused(finished_on_data, tmp_path):
    """The fingerprints are of content: the inputs copied elsewhere (new paths, same bytes) resume; a
    dataset edited in place is refused in one line naming the file and what changed; with
    --resume-with-changes the run goes on and changes.jsonl records the input's change."""
    exp, run = copy_run_and_inputs(finished_on_data, tmp_path)
    recorded = json.loads((run / "inputs.json").read_text())["files"]
    assert {"task.options.path", "model.path/model.safetensors", "model.path/config.json",
            "task.reward.function:module"} <= set(recorded)
    RunDirectory(exp, resume=True, accept_changes=False)        # moved, same bytes: no change of inputs
    data = pathlib.Path(exp.task.options["path"])
    data.write_text(data.read_text().replace('"answer": 4', '"answer": 5'))      # same size, other bytes
    untouched = snapshot(run)
    with pytest.raises(ConfigError) as error:
        RunDirectory(exp, resume=True)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"--resume: an input of {run} changed since the run began ")
    assert f"task.options.path: {data} holds other bytes (same size, {data.stat().st_size} bytes, SHA-256 " in message
    assert "--resume-with-changes" in message and snapshot(run) == untouched
    longer = dataclasses.replace(exp, steps=3)
    assert train(longer, resume=True, accept_changes=True, progress=False) == run
    entry = json.loads((run / "changes.jsonl").read_text())
    assert (
        entry["step"] == 2
        and list(entry["inputs"]) == ["task.options.path"]
        and "holds other bytes" in entry["inputs"]["task.options.path"]
    )
    assert json.loads((run / "inputs.json").read_text())["files"]["task.options.path"]["sha256"] == inputs.file_sha256(
        data
    )
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
        with pytest.raises(ConfigError, match=rf"task.reward.function:module: {module} holds other bytes"):
            RunDirectory(mine, resume=True)
    finally:
        sys.path.remove(str(tmp_path))


def test_an_unchanged_file_is_not_hashed_again_and_an_edit_that_keeps_its_time_is_found(tmp_path, monkeypatch):
    """The size / mtime / ctime / inode pre-check: an untouched file keeps its saved hash unread; an
    edit in place of the same size with the modification time set back is still re-hashed (its
    change time moved)."""
    data = tmp_path / "data.jsonl"
    data.write_text("a" * 100)
    saved = inputs.fingerprints({"task.options.path": data})
    monkeypatch.setattr(inputs, "file_sha256", lambda path: pytest.fail(f"{path} hashed again"))
    assert inputs.fingerprints({"task.options.path": data}, known=saved) == saved
    monkeypatch.undo()
    before = data.stat()
    time.sleep(0.01)
    data.write_text("b" * 100)
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    now = inputs.fingerprints({"task.options.path": data}, known=saved)
    assert inputs.differences(saved, now) == {"task.options.path": f"{data.absolute()} holds other bytes (same "
                                                                   f"size, 100 "
                                              f"bytes, SHA-256 {saved['task.options.path']['sha256'][:12]} -> "
                                              f"{now['task.options.path']['sha256'][:12]})"}


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
