"""Preference pairs from a verifiable task (pgjax.pairs): the pairing rule on hand-made responses; the
command on a tiny untrained policy writes pairs its verifier orders, which the reward model's loader
reads back; a mistake or an existing file exits 2 and writes nothing."""
import json

import numpy as np
import pytest
from helpers import EMIT_X, tiny_experiment

from pgjax import pairs as pairs_cli
from pgjax.tasks.preferences import load_preferences
from pgjax.train.trainer import train


def test_pairs_put_a_right_response_over_a_wrong_one_and_never_reuse_a_response():
    texts = ["x1", "a", "x22", "b", "x1", "x4444"]
    rewards = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    lengths = np.array([2, 1, 3, 1, 2, 5])
    for seed in range(20):
        found = pairs_cli.pairs_of(texts, rewards, lengths, per_prompt=3, shorter=True,
                                   rng=np.random.default_rng(seed))
        for kind in pairs_cli.KINDS:
            mine = [(i, j) for i, j, k in found if k == kind]
            used = [i for pair in mine for i in pair]
            assert len(used) == len(set(used))                          # a response in one pair of a kind
            assert all(texts[i] != texts[j] for i, j in mine)
        right_over_wrong = [(i, j) for i, j, k in found if k == "correct_over_incorrect"]
        assert len(right_over_wrong) == 2 and all(rewards[i] == 1 and rewards[j] == 0 for i, j in right_over_wrong)
        shorter = [(i, j) for i, j, k in found if k == "shorter_correct"]
        assert shorter and all(rewards[i] == rewards[j] == 1 and lengths[i] < lengths[j] for i, j in shorter)
    assert pairs_cli.pairs_of(["x", "xx"], np.ones(2), np.array([1, 2]), 2, False, np.random.default_rng(0)) == []


@pytest.fixture(scope="module")
def policy_run(tmp_path_factory):
    """An untrained tiny policy exported as a run on EmitX (reward 1 for a response opening with x)."""
    exp = tiny_experiment(tmp_path_factory.mktemp("pairs"), task=EMIT_X, steps=0)
    return train(exp, progress=False)


def test_the_command_writes_pairs_the_verifier_orders_and_the_loader_reads(policy_run, tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    status = pairs_cli.main([str(policy_run), "--out", str(out), "--prompts", "8", "--samples", "6",
                             "--temperature", "1.0", "--seed", "5", "--pairs-per-prompt", "2", "--shorter"])
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["prompts"] == 8 and summary["samples"] == 6 and 0 < summary["sampled_accuracy"] < 1
    assert sum(summary["pairs"].values()) == len(records) and summary["prompts_with_a_pair"] >= 1
    for record in records:
        assert record["prompt"] == "ab" and record["chosen"] != record["rejected"] and record["tags"] == {}
        if record["kind"] == "correct_over_incorrect":
            assert record["chosen"].startswith("x") and not record["rejected"].startswith("x")
            assert (record["chosen_reward"], record["rejected_reward"]) == (1.0, 0.0)
        else:
            assert record["chosen"].startswith("x") and record["rejected"].startswith("x")
    assert len(load_preferences(out).records) == len(records)
    again = pairs_cli.main([str(policy_run), "--out", str(out), "--prompts", "8", "--samples", "6"])
    assert again == 2 and "never overwrites" in capsys.readouterr().err
    assert [json.loads(line) for line in out.read_text().splitlines()] == records


@pytest.mark.parametrize("arguments, message", [
    (["--samples", "1"], "--samples must be >= 2"),
    (["--pairs-per-prompt", "0"], "--pairs-per-prompt >= 1"),
    (["--set", "task.options.digits=x"], "task"),
])
def test_a_mistake_exits_2_and_writes_nothing(policy_run, tmp_path, capsys, arguments, message):
    out = tmp_path / "pairs.jsonl"
    assert pairs_cli.main([str(policy_run), "--out", str(out), *arguments]) == 2
    assert message in capsys.readouterr().err and not out.exists()


# ---------------------------------------------------------------- step labels (--steps)

def test_each_step_is_labelled_by_its_arithmetic_and_the_first_error_ends_the_right_steps():
    from pgjax.tasks.step_checks import checked_steps, equations_hold
    assert checked_steps("We add 4 + 4 = 8 pens.\n\nThen 8 x 3 = 25.\nSo 25.", answer_correct=False) == (
        ["We add 4 + 4 = 8 pens.", "\nThen 8 x 3 = 25.", "So 25."], [True, False, False])
    assert checked_steps("12 × 3 = 36\nNext, 36 - 1 = 35.\nThe answer is \\boxed{35}", True)[1] == [True, True, True]
    assert checked_steps("12 × 3 = 36\nThe answer is \\boxed{36}", False)[1] == [True, False]   # the answer: wrong
    steps, _ = checked_steps("a\n\nb\n\n", True)
    assert "\n".join(steps) == "a\n\nb" and checked_steps(" \n\n", True) is None
    assert equations_hold("1,000 + 20 = 1,020, and (2 + 3) * 4 = 20; 7.5 / 2.5 = 3")
    assert not equations_hold("so 17 - 9 = 7") and not equations_hold("2 * (3 + 4) = 15")
    assert equations_hold("3 apples + 2 = 5 or 2 / 0 = 1")          # not plain arithmetic: not checked


def test_the_command_writes_step_labels_the_process_reward_models_loader_reads(policy_run, tmp_path, capsys):
    from pgjax.tasks.preferences import load_step_labels
    out = tmp_path / "steps.jsonl"
    assert pairs_cli.main([str(policy_run), "--out", str(out), "--prompts", "4", "--samples", "4",
                           "--temperature", "1.0", "--steps"]) == 0
    summary = json.loads(capsys.readouterr().out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["records"] == len(records) > 0 and summary["steps"] == sum(len(r["labels"]) for r in records)
    for record in records:                       # EmitX's responses: one line, no equation, right when "x..."
        assert record["labels"] == [record["reward"] == 1.0] and record["completions"][0].strip()
    assert len(load_step_labels(out).records) == len(records)


@pytest.mark.parametrize("line, holds", [
    ("4 + 4 = 8 pens", True), ("Step 1: 5 x 3 = 15.", True), ("10 / 3 = 3.33", True), ("1/3 = 0.333", True),
    ("5 boxes * 4 + 2 = 22", True),            # cut short on the left (4 + 2 = 22): not checked
    ("2(3 + 4) = 14", True), ("2^3 + 1 = 9", True), ("3 \\times 4 + 1 = 13", True), ("24 ÷ 2 + 3 = 15", True),
    ("4 * 3 = 12 * 2 = 25", False),            # a chain: 12 * 2 = 25 is checked too
    ("so 17 - 9 = 7", False), ("$3 + 4 = 8$", False), ("[3 + 4 = 8]", False), ("10 / 3 = 3.3", True),
    ("10 / 3 = 3.4", False),
])
def test_an_equation_is_checked_only_when_its_left_side_is_whole(line, holds):
    from pgjax.tasks.step_checks import equations_hold
    assert equations_hold(line) is holds
