"""Preference pairs from a verifiable task (pgjax.pairs): the pairing rule on hand-made responses; the
command on a tiny untrained policy writes pairs its verifier orders, which the reward model's loader
reads back; a mistake or an existing file exits 2 and writes nothing."""
import json

import numpy as np
import pytest

from helpers import EMIT_X, tiny_experiment
from pgjax import pairs as pairs_cli
from pgjax.rewards.preferences import load_preferences
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
    (["--set", "task.digits=x"], "task"),
])
def test_a_mistake_exits_2_and_writes_nothing(policy_run, tmp_path, capsys, arguments, message):
    out = tmp_path / "pairs.jsonl"
    assert pairs_cli.main([str(policy_run), "--out", str(out), *arguments]) == 2
    assert message in capsys.readouterr().err and not out.exists()
