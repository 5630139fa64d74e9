"""Completions in the logs (``logging.completions_*``, ``pgjax.train.completions``): a run writes the
drawn rows of every N-th step to completions.jsonl (``read_completions``), TensorBoard's Text tab
and a W&B table; each row is its step's (the rows' rewards give the step's metrics, the reward's
parts add up to it, the advantage is Dr. GRPO's from the group's rewards); texts are clipped with
the cut marked; a resume after a kill, a torn line included, neither repeats nor loses a row, with
a batch in flight too; 0 writes nothing; bad settings are ConfigErrors."""
import dataclasses
import glob
import html.parser
import json
import pathlib
import re
import shutil

import numpy as np
import pytest
from helpers import EMIT_X, EmitX, read_texts, read_wandb_history, tiny_experiment

from pgjax import config as config_lib
from pgjax.config import ConfigError, Experiment, LoggingSection, RewardSection
from pgjax.train.completions import clip, logged_at, pick_rows
from pgjax.train.run_dir import RunDirectory
from pgjax.train.sinks import markdown_table, read_completions, read_records, table_columns
from pgjax.train.trainer import train

TEXT_TAG = "completions/text_summary"       # tensorboardX's tag for add_text("completions", ...)
FIELDS = ["step", "row", "group", "reward", "format_reward", "overlong_penalty", "advantage", "correct", "length",
          "truncated", "kept", "prompt", "completion"]


def logging_experiment(tmp, logging: LoggingSection, **changes):
    """The tiny EmitX run (4 steps of 4 prompts x 4 samples, 3 new tokens, checkpoints at 2 and 4)
    with ``logging``."""
    exp = tiny_experiment(tmp, task=EMIT_X, logging=logging)
    return dataclasses.replace(exp, **changes)


@pytest.fixture(scope="module")
def every_row(tmp_path_factory):
    """A finished run logging all 16 rows of every step, its reward with a format part (weight 0.5)
    and DAPO's overlong penalty (the last of the 3 tokens costs 1)."""
    tmp = tmp_path_factory.mktemp("every_row")
    exp = logging_experiment(tmp, LoggingSection(completions_every=1, completions_per_step=16))
    exp = dataclasses.replace(exp, task=dataclasses.replace(exp.task, reward=RewardSection(format_weight=0.5)),
                              rollout=dataclasses.replace(exp.rollout, overlong_buffer=1))
    return exp, train(exp, progress=False)


@pytest.fixture(scope="module")
def in_flight(tmp_path_factory):
    """A finished asynchronous run (``rollout.staleness`` 1: each checkpoint holds the next step's
    batch) logging 5 rows of every step, texts clipped to 2 characters."""
    tmp = tmp_path_factory.mktemp("in_flight")
    exp = logging_experiment(tmp, LoggingSection(completions_every=1, completions_per_step=5,
                                                 completions_max_chars=2))
    exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, staleness=1))
    return exp, train(exp, progress=False)


def by_step(rows: list[dict]) -> dict[int, list[dict]]:
    out = {}
    for row in rows:
        out.setdefault(row["step"], []).append(row)
    return out


def test_every_logged_row_is_its_steps_sample_with_its_reward_parts_and_advantage(every_row):
    exp, directory = every_row
    rows = read_completions(directory)
    steps = by_step(rows)
    assert sorted(steps) == [1, 2, 3, 4] and all(list(row) == FIELDS for row in rows)
    records = {r["step"]: r for r in read_records(directory)}
    for step, logged in steps.items():
        assert [(r["row"], r["group"]) for r in logged] == [(i, i // 4) for i in range(16)]
        reward = np.array([r["reward"] for r in logged], np.float64)
        length = np.array([r["length"] for r in logged])
        correct = np.array([r["correct"] for r in logged], np.float64)
        fmt = np.array([r["format_reward"] for r in logged])
        record = records[step]                  # all 16 rows: the step's own statistics
        assert record["reward"] == pytest.approx(reward.mean(), rel=1e-6)
        assert record["accuracy"] == pytest.approx(correct.mean())
        assert record["length"] == pytest.approx(length.mean())
        assert record["truncated"] == pytest.approx(np.mean([r["truncated"] for r in logged]))
        assert all(r["kept"] for r in logged) and all(r["prompt"] == "ab" for r in logged)
        # the parts, recomputed by hand: EmitX's verifier (starts with x), the format [abx]* at weight
        # 0.5, and the overlong penalty -1 * clip(length - (3 - 1), 0, 1) / 1
        assert [r["correct"] for r in logged] == [r["completion"].startswith("x") for r in logged]
        assert fmt.tolist() == [float(re.fullmatch("[abx]*", r["completion"].strip()) is not None) for r in logged]
        penalty = -np.clip(length - 2, 0, 1).astype(np.float64)
        assert [r["overlong_penalty"] for r in logged] == penalty.tolist()
        np.testing.assert_allclose(reward, correct + 0.5 * fmt + penalty, rtol=0, atol=1e-6)
        # Dr. GRPO: A_i = r_i - mean of its group's rewards (no std), the same on every token
        groups = reward.reshape(4, 4)
        expected = (groups - groups.mean(axis=1, keepdims=True)).reshape(-1)
        np.testing.assert_allclose([r["advantage"] for r in logged], expected, rtol=0, atol=1e-6)
        assert all(r["length"] == 3 for r in logged if r["truncated"])
    assert len({r["completion"] for r in rows}) > 1


def test_tensorboard_shows_each_logged_step_as_a_markdown_table_once(every_row):
    directory = every_row[1]
    texts = read_texts(directory)[TEXT_TAG]
    steps = by_step(read_completions(directory))
    assert texts == [(step, markdown_table(steps[step])) for step in (1, 2, 3, 4)]


class Cells(html.parser.HTMLParser):
    """The text of each cell of an HTML table (``<br>`` as a line break)."""

    def __init__(self):
        super().__init__()
        self.rows, self.cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = ""
        elif tag == "br" and self.cell is not None:
            self.cell += "\n"

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


@pytest.mark.filterwarnings("ignore:html5lib's sanitizer is deprecated")     # inside tensorboard's bleach
def test_the_markdown_table_renders_every_text_as_written_in_tensorboard():
    """Through TensorBoard's own renderer (markdown with tables, then its HTML sanitizer): pipes,
    markdown marks, HTML, backslashes and line breaks come out as the text itself."""
    from tensorboard.plugin_util import markdown_to_safe_html
    texts = ["a | b", "2*3*4 = 24 and _x_ and `code`", "<think>1 & 2</think>", "line one\nline two",
             r"\boxed{[3]} (x)", "```\nfenced\n```", "# not a heading", ""]
    rows = [{"step": 7, "row": i, "reward": 0.5 * i, "advantage": None, "correct": i % 2 == 0, "completion": t}
            for i, t in enumerate(texts)]
    parser = Cells()
    parser.feed(markdown_to_safe_html(markdown_table(rows)))
    assert parser.rows[0] == table_columns(rows) == ["row", "reward", "advantage", "correct", "completion"]
    assert [r[4] for r in parser.rows[1:]] == texts
    assert [r[:4] for r in parser.rows[1:3]] == [["0", "0", "", "True"], ["1", "0.5", "", "False"]]


@pytest.mark.parametrize("fixture", ["every_row", "in_flight"])
def test_a_resume_after_a_kill_repeats_and_loses_no_row(fixture, request, tmp_path, capsys):
    """The run killed after logging step 4 but before its checkpoint, in the middle of a line: the
    resume from checkpoint 2 cuts completions.jsonl back to step 2, drops the torn line, and logs
    steps 3 and 4 again, exactly as the uninterrupted run (with ``in_flight`` step 3's rows come from
    the batch its checkpoint holds)."""
    exp, directory = request.getfixturevalue(fixture)
    run = tmp_path / "run"
    shutil.copytree(directory, run)
    shutil.rmtree(run / "checkpoints" / "4")
    shutil.rmtree(run / "final")
    with (run / "completions.jsonl").open("a") as f:
        f.write('{"step": 5, "row": 0, "prompt": "a')           # a write cut short
    train(dataclasses.replace(exp, run_dir=str(run)), resume=True, progress=False)
    err = capsys.readouterr().err
    assert "completions.jsonl: dropped a torn last line (" in err and "at step 2" in err
    assert read_completions(run) == read_completions(directory)
    assert (run / "completions.jsonl").read_bytes() == (directory / "completions.jsonl").read_bytes()
    assert read_texts(run)[TEXT_TAG] == read_texts(directory)[TEXT_TAG]     # the killed run's steps 3, 4 purged


def test_rows_are_drawn_from_the_seed_and_texts_clipped_with_the_cut_marked(in_flight):
    exp, directory = in_flight
    steps = by_step(read_completions(directory))
    assert sorted(steps) == [1, 2, 3, 4]
    for step, logged in steps.items():
        assert [r["row"] for r in logged] == pick_rows(exp.seed, step, slice(0, 16), 5)
    texts = [t for rows in steps.values() for r in rows for t in (r["prompt"], r["completion"])]
    assert all(len(t) <= 2 or re.fullmatch(r".…\[\d+ characters? cut\]….", t) for t in texts)
    assert any(len(t) > 2 for t in texts)           # a completion of 3 characters (or a special token) was cut


def test_clip_keeps_the_start_and_the_end_and_says_how_much_it_cut():
    assert clip("abc", 3) == "abc"
    assert clip("abcdefghij", 4) == "ab…[6 characters cut]…ij"
    assert clip("abcdef", 3) == "ab…[3 characters cut]…f"
    assert clip("abcdef", 1) == "a…[5 characters cut]…"
    assert clip("abc", 2) == "a…[1 character cut]…c"
    text = "x" * 10_000
    assert len(clip(text, 2000)) == 2000 + len("…[8000 characters cut]…")


def test_pick_rows_draws_distinct_rows_from_the_seed_and_step():
    rows = pick_rows(0, 3, slice(8, 24), 5)
    assert rows == pick_rows(0, 3, slice(8, 24), 5) == sorted(set(rows)) and len(rows) == 5
    assert all(8 <= r < 24 for r in rows)
    assert len({tuple(pick_rows(seed, step, slice(0, 64), 4)) for seed in range(3) for step in range(1, 5)}) == 12
    assert pick_rows(0, 1, slice(0, 6), 10) == list(range(6))      # at most the batch's rows


def test_completions_every_0_logs_no_completion(tmp_path):
    assert not any(logged_at(LoggingSection(completions_every=0), step) for step in range(1, 100))
    assert [s for s in range(1, 31) if logged_at(LoggingSection(), s)] == [10, 20, 30]
    exp = logging_experiment(tmp_path, LoggingSection(completions_every=0))
    run = RunDirectory(exp, resume=False)
    run.create()
    run.start(EmitX().tokenizer(), 0)
    run.log({"step": 0, "eval_accuracy": 0.5}, [{"step": 0, "row": 0, "completion": "x"}])
    run.close()
    assert read_records(run.directory) == [{"step": 0, "eval_accuracy": 0.5}]
    assert not (run.directory / "completions.jsonl").exists() and TEXT_TAG not in read_texts(run.directory)


@pytest.mark.parametrize("setting, message", [
    ("logging.completions_every=-1", "logging.completions_every=-1 is invalid: an integer >= 0 (RL steps between "
                                     "logged completions; 0: none)"),
    ("logging.completions_every=1.5", "logging.completions_every='1.5' is invalid"),
    ("logging.completions_per_step=0", "logging.completions_per_step=0 is invalid: an integer >= 1"),
    ("logging.completions_max_chars=0", "logging.completions_max_chars=0 is invalid: an integer >= 1"),
])
def test_a_bad_completions_setting_is_a_config_error(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_lib.override(Experiment(), [setting])


def test_a_completions_setting_of_the_wrong_type_in_a_file_is_a_config_error():
    with pytest.raises(ConfigError, match=re.escape("logging.completions_per_step=2.0 is invalid: an int is expected")):
        LoggingSection(completions_per_step=2.0)


@pytest.mark.slow
def test_weights_and_biases_gets_a_table_of_each_steps_rows(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    exp = logging_experiment(tmp_path, LoggingSection(wandb=True, completions_every=2, completions_per_step=3))
    directory = train(exp, progress=False)
    steps = by_step(read_completions(directory))
    assert sorted(steps) == [2, 4]
    history = read_wandb_history(glob.glob(f"{directory}/wandb/offline-run-*/*.wandb")[0])
    tables = {row["_step"]: row for row in history if "completions/path" in row}     # the history names the file
    assert sorted(tables) == [2, 4], [sorted(row) for row in history]
    assert all(t["completions/_type"] == "table-file" and t["completions/nrows"] == 3 for t in tables.values())
    files = pathlib.Path(glob.glob(f"{directory}/wandb/offline-run-*/files")[0])
    for step, logged in steps.items():
        table = json.loads((files / tables[step]["completions/path"]).read_text())
        assert table["columns"] == table_columns(logged)
        assert table["data"] == [[row[c] for c in table["columns"]] for row in logged]
