"""The Trainer as a library: driven step by step from Python it gives the command line's metrics;
callbacks see every step; the run directory's metrics reach TensorBoard event files and Weights &
Biases (offline) with the same values; progress never prints a line per step off a terminal."""
import glob
import io
import pathlib

import numpy as np
import pytest
from helpers import read_events, read_wandb_history

from pgjax import config as config_lib
from pgjax import run
from pgjax.train.progress import Progress
from pgjax.train.records import COST_KEYS
from pgjax.train.sinks import read_records
from pgjax.train.trainer import Callback, Trainer, train

EXPERIMENT = """
from pgjax.config import Experiment, ModelSection, TaskSection, WarmStartSection
from pgjax.rollout.collect import RolloutConfig

def experiment():
    return Experiment(name="by_hand", algorithm="grpo", steps=3, prompts_per_step=4, eval_every=2, eval_prompts=16,
                      task=TaskSection(options={"digits": 1}),
                      model=ModelSection(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16),
                      warm_start=WarmStartSection(steps=60, batch_size=16),
                      rollout=RolloutConfig(samples_per_prompt=4, max_prompt_tokens=8, max_new_tokens=4))
"""


def without_timings(records):
    return [{k: v for k, v in r.items() if k not in COST_KEYS} for r in records]


@pytest.mark.slow
def test_a_trainer_driven_step_by_step_gives_the_command_lines_metrics(tmp_path, capsys):
    file = tmp_path / "by_hand.py"
    file.write_text(EXPERIMENT)
    code = run.main([str(file), "--no-progress", "--set", f"run_dir={tmp_path / 'cli'}"])   # the command line
    assert code == 0, capsys.readouterr().err[-3000:]

    exp = config_lib.load(file)
    trainer = Trainer(exp)
    trainer.warm_start()
    records = [{"step": 0, "eval_accuracy": trainer.evaluate()}]
    for _ in range(exp.steps):
        record = trainer.step()
        if record["step"] % exp.eval_every == 0 or record["step"] == exp.steps:
            record["eval_accuracy"] = trainer.evaluate()
        records.append(record)
    assert trainer.step_count == 3
    assert without_timings(records) == without_timings(read_records(tmp_path / "cli"))
    assert 0 < np.mean([r["reward"] for r in records[1:]]) < 1


class Recorder(Callback):
    """Adds a measurement before each update and keeps what it is shown."""

    def __init__(self):
        self.seen, self.records, self.padding = [], [], []

    def before_update(self, trainer, rollout, examples, stats):
        self.seen.append((trainer.step_count, len(examples), stats["reward"].shape, rollout.batch.advantages.shape))
        self.padding.append(1.0 - np.asarray(rollout.attention_mask, np.float64).mean())
        return {"mean_advantage": float(np.asarray(rollout.batch.advantages).mean())}

    def after_step(self, trainer, record):
        self.records.append(record)


@pytest.mark.slow
def test_metrics_reach_jsonl_tensorboard_and_wandb_with_the_same_values(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    file = tmp_path / "by_hand.py"
    file.write_text(EXPERIMENT)
    exp = config_lib.override(config_lib.load(file), [
        "steps=2", "warm_start.steps=0", f"run_dir={tmp_path / 'run'}", "logging.wandb=true"])
    recorder = Recorder()
    directory = train(exp, progress=False, callbacks=(recorder,))
    records = read_records(directory)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert [r["step"] for r in recorder.records] == [1, 2] and recorder.records == records[1:]
    assert recorder.seen == [(0, 4, (16,), (16, 4)), (1, 4, (16,), (16, 4))]
    assert all("mean_advantage" in r for r in records[1:])
    padding = [r["padding"] for r in records[1:]]        # the update's padded positions, as the callback counts them
    assert padding == pytest.approx(recorder.padding, abs=1e-6) and all(0 < p < 1 for p in padding)

    events = read_events(directory)
    wandb_file = glob.glob(f"{directory}/wandb/offline-run-*/*.wandb")[0]
    history = {row["_step"]: row for row in read_wandb_history(wandb_file)}
    checked = 0
    for record in records:
        for key, value in record.items():
            if key == "step" or value is None:
                continue
            assert events[key][record["step"]] == pytest.approx(value, rel=1e-6), key    # float32 in the event
            assert history[record["step"]][key] == pytest.approx(value, rel=1e-12), key
            checked += 1
    assert checked >= 38 and {"reward", "eval_accuracy", "kl_ref", "time_step", "mean_advantage", "policy_lag",
                              "mismatch_abs", "mismatch_abs_max", "mismatch_kl", "mismatch_outside"} <= set(events)

    run_id = (directory / "wandb_run_id").read_text()           # a resumed run continues the same W&B run
    train(config_lib.override(exp, ["steps=3"]), resume=True, progress=False)
    assert (directory / "wandb_run_id").read_text() == run_id
    assert {pathlib.Path(f).name for f in glob.glob(f"{directory}/wandb/offline-run-*/*.wandb")} == \
        {f"run-{run_id}.wandb"}
    assert [r["step"] for r in read_records(directory)] == [0, 1, 2, 3]
    assert sorted(read_events(directory)["reward"]) == [1, 2, 3]


def test_progress_off_a_terminal_prints_a_line_every_so_often_not_every_step():
    stream = io.StringIO()
    bar = Progress(total=10, start=0, every=3600.0, enabled=True, stream=stream)
    for step in range(1, 11):
        bar.update({"step": step, "reward": 0.5, "accuracy": 0.25, **({"eval_accuracy": 0.75} if step == 10 else {})})
    bar.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "\r" not in stream.getvalue()          # only the last step, past the interval
    assert "10/10" in lines[0] and "reward 0.500 acc 0.25 eval 0.750" in lines[0]
    every_step = io.StringIO()
    bar = Progress(total=4, start=0, every=0.0, enabled=True, stream=every_step)
    for step in range(1, 5):
        bar.update({"step": step, "reward": 0.5, "accuracy": 0.25})
    assert len(every_step.getvalue().splitlines()) == 4
    silent = io.StringIO()
    Progress(total=4, start=0, every=0.0, enabled=False, stream=silent).update({"step": 1, "reward": 0, "accuracy": 0})
    assert silent.getvalue() == ""
