"""Checkpoints (pgjax/train/checkpoints.py) under damage: any damaged file of the newest checkpoint is
reported in one line and the one before restored; a resume after a damaged checkpoint and a torn
metrics line gives the undamaged run's results; no intact checkpoint is a one-line error; a file list
that verifies nothing counts as damage."""
import pathlib
import shutil

import pytest
from flax import nnx
from helpers import (
    assert_same_tree,
    comparable,
    copy_of,
    damage,
    snapshot,
)

from pgjax.config import ConfigError
from pgjax.models import hf
from pgjax.train.checkpoints import Checkpoints
from pgjax.train.sinks import read_records
from pgjax.train.trainer import train

ROOT = pathlib.Path(__file__).parent.parent


# ---------------------------------------------------------------- damaged checkpoints

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
