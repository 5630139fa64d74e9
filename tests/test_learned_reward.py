"""RL against a learned reward (task.reward.model, pgjax.train.learned_reward): the scorer gives the
reward model's own scores, in chunks with padding; the mix, its whitening, the length penalty and the
agreement counts against hand computations; a tiny reward model trained to prefer EmitX's answer
teaches the policy to emit it, with the verifier's accuracy and the agreement logged beside the
score; one trained to prefer the wrong answer is hacked, the score rising while the accuracy falls;
and the mistakes are ConfigErrors before anything is written."""
import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import EMIT_X, save_tiny_checkpoint, tiny_experiment

from pgjax.config import ConfigError, ModelSection, OptimConfig, RewardModelSection, RewardSection, TaskSection
from pgjax.models import hf
from pgjax.rollout.collect import RolloutConfig, decode_responses, length_penalties
from pgjax.train.learned_reward import LearnedReward, Mix, step_ends
from pgjax.train.sinks import read_records
from pgjax.train.trainer import train


def preference_file(path, good: str, bad: str, count: int = 48, seed: int = 0):
    """Pairs on EmitX's prompt "ab": a response opening with one of the characters ``good`` over one
    opening with one of ``bad`` (the same tail after)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        tail = "".join(rng.choice(list("abx"), size=rng.integers(0, 3)))
        rows.append({"prompt": "ab", "chosen": rng.choice(list(good)) + tail, "rejected": rng.choice(list(bad)) + tail})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reward_model_run(tmp_path, good: str, bad: str):
    """A tiny reward model trained to prefer responses opening with a character of ``good`` to ones
    opening with one of ``bad``; its run directory."""
    checkpoint = save_tiny_checkpoint(tmp_path / "trunk")
    pairs = preference_file(tmp_path / "pairs.jsonl", good, bad)
    held_out = preference_file(tmp_path / "eval.jsonl", good, bad, count=8, seed=1)   # one prompt: a file of its own
    exp = tiny_experiment(tmp_path / "run", stage="reward_model", steps=12, prompts_per_step=8, eval_every=12,
                          checkpoint_every=12, model=ModelSection(path=str(checkpoint)), optim=OptimConfig(lr=3e-2),
                          reward_model=RewardModelSection(path=str(pairs), eval_path=str(held_out), max_tokens=8))
    directory = train(exp, progress=False)
    assert read_records(directory)[-1]["eval_accuracy"] == 1.0
    return directory


@pytest.fixture(scope="module")
def prefers_x(tmp_path_factory):
    return reward_model_run(tmp_path_factory.mktemp("rm_x"), "x", "ab")


@pytest.fixture(scope="module")
def prefers_a(tmp_path_factory):
    return reward_model_run(tmp_path_factory.mktemp("rm_a"), "ab", "x")       # the verifier's answer last


def test_the_scorer_gives_the_reward_models_scores_in_chunks(prefers_x):
    scorer = LearnedReward(prefers_x, batch_rows=3)
    completions = ["x", "a", "xab", "ba", "xx"]
    got = scorer(["ab"] * 5, completions)
    model = hf.load_reward_model(prefers_x / "final")
    tokenizer = hf.load_tokenizer(prefers_x / "final")
    for completion, score in zip(completions, got, strict=True):
        ids = tokenizer("ab" + completion)["input_ids"]
        want = float(model.scores(jnp.asarray([ids]), jnp.ones((1, len(ids)), jnp.int32))[0])
        assert score == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert got[0] > got[1] and got.dtype == np.float32


def test_the_mix_whitening_length_penalty_and_agreement_by_hand():
    learned = np.array([2.0, 0.0, 1.0, 1.0], np.float32)
    mix = Mix(reward_model=lambda *a, **k: learned, reward_model_weight=0.5, normalize="batch")
    z = (learned - 1.0) / np.sqrt(0.5)
    np.testing.assert_allclose(mix.combine(np.ones(4), learned), 1 + 0.5 * z, rtol=1e-6)
    np.testing.assert_allclose(Mix(reward_model=object()).combine(np.zeros(4), learned), learned)
    np.testing.assert_allclose(mix.transform(np.array([3.0]), reference=learned), [2 / np.sqrt(0.5)], rtol=1e-6)
    config = RolloutConfig(max_new_tokens=10, length_penalty=0.2)
    np.testing.assert_allclose(length_penalties(np.array([5, 10]), config), [-0.1, -0.2], rtol=1e-6)
    # two prompts of K = 2: right 2.0 over wrong 0.0 (agrees); right 1.0 and wrong 1.0 tie (half)
    stats = mix.statistics(learned, np.array([1.0, 0.0, 1.0, 0.0]), 2)
    assert stats["agreement_pairs"].tolist() == [1, 0, 1, 0] and stats["agreement_wins"].tolist() == [1, 0, 0.5, 0]


def rl_experiment(tmp_path, reward_model, **reward):
    task = TaskSection(name=EMIT_X.name, reward=RewardSection(model=str(reward_model), verifier_weight=0.0, **reward))
    return tiny_experiment(tmp_path, task=task, steps=6, eval_every=6, checkpoint_every=6)


def test_rl_against_a_learned_reward_learns_what_it_prefers_and_logs_the_verifier_beside(prefers_x, tmp_path):
    directory = train(rl_experiment(tmp_path, prefers_x, model_normalize="batch"), progress=False)
    records = read_records(directory)
    steps = [r for r in records if r["step"] > 0]
    assert all({"learned_reward", "reward_model_agreement", "accuracy"} <= set(r) for r in steps)
    assert steps[-1]["accuracy"] > steps[0]["accuracy"] and steps[-1]["learned_reward"] > steps[0]["learned_reward"]
    assert records[-1]["eval_accuracy"] > records[0]["eval_accuracy"]
    agreements = [r["reward_model_agreement"] for r in steps if r["reward_model_agreement"] is not None]
    assert agreements and np.mean(agreements) > 0.85                # it mostly orders right over wrong
    assert all(abs(r["reward"]) < 1e-5 for r in steps)              # whitened, verifier weight 0: mean 0


def test_a_learned_reward_that_prefers_the_wrong_answer_is_hacked(prefers_a, tmp_path):
    directory = train(rl_experiment(tmp_path, prefers_a), progress=False)
    steps = [r for r in read_records(directory) if r["step"] > 0]
    assert steps[-1]["learned_reward"] > steps[0]["learned_reward"]
    assert steps[-1]["accuracy"] < steps[0]["accuracy"]
    agreements = [r["reward_model_agreement"] for r in steps if r["reward_model_agreement"] is not None]
    assert agreements and np.mean(agreements) < 0.15                # it mostly orders wrong over right


@pytest.mark.parametrize("reward, message", [
    ({"model": "missing"}, "task.reward.model: .*no config.json"),
    ({"model_normalize": "rank"}, "task.reward.model_normalize"),
    ({"verifier_weight": float("nan")}, "task.reward.verifier_weight"),
])
def test_a_bad_learned_reward_is_a_config_error_before_anything_is_written(tmp_path, reward, message):
    with pytest.raises(ConfigError, match=message):
        task = TaskSection(name=EMIT_X.name, reward=RewardSection(**{"model": "missing", **reward}))
        exp = tiny_experiment(tmp_path, task=task)
        train(exp, progress=False)
    assert not (tmp_path / "run").exists()


def test_with_episodes_a_learned_reward_is_refused(prefers_x, tmp_path):
    exp = tiny_experiment(
        tmp_path, task=TaskSection(name="helpers:EmitXOneTurn", reward=RewardSection(model=str(prefers_x)))
    )
    with pytest.raises(ConfigError, match="multi-turn episodes"):
        train(dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, max_turns=2)), progress=False)


MESH_SCRIPT = """
import json, pathlib, sys
sys.path.insert(0, {tests!r})
import dataclasses
import numpy as np
from helpers import EMIT_X, tiny_experiment
from pgjax.parallel import mesh as mesh_lib
from pgjax.config import LoRASection, RewardSection, TaskSection
from pgjax.train.learned_reward import LearnedReward
from pgjax.train.sinks import read_records
from pgjax.train.trainer import train
mesh = mesh_lib.make_mesh(mesh_lib.MeshConfig(2, 2, 2))
scores = LearnedReward({model!r}, mesh=mesh, batch_rows=8)(["ab"] * 5, {completions!r})
task = TaskSection(name=EMIT_X.name, reward=RewardSection(model={model!r}, verifier_weight=0.0))
exp = tiny_experiment(pathlib.Path({root!r}), task=task, steps=2, eval_every=2, checkpoint_every=2, prompts_per_step=8)
exp = dataclasses.replace(exp, rollout=dataclasses.replace(exp.rollout, staleness=1),
                          model=dataclasses.replace(exp.model, lora=LoRASection(rank=4, alpha=8)))
records = read_records(train(exp, progress=False))
print("RESULT", json.dumps({{"scores": np.asarray(scores).tolist(),
                            "learned": [r.get("learned_reward") for r in records],
                            "lags": [r.get("policy_lag") for r in records]}}))
"""


@pytest.mark.slow
def test_on_an_8_device_mesh_the_scores_are_the_single_devices_and_stale_lora_runs_train(prefers_x, tmp_path):
    """The reward model scores on a 2x2x2 mesh as on one device; a LoRA policy with rollouts one step
    stale trains against it there (its record holds the learned reward of every step)."""
    import os
    import subprocess
    import sys

    from helpers import XLA_COLLECTIVE_HANG, simulated_devices
    completions = ["x", "a", "xab", "ba", "xx"]
    single = LearnedReward(prefers_x, batch_rows=8)(["ab"] * 5, completions)
    tests = os.path.dirname(__file__)
    script = MESH_SCRIPT.format(tests=tests, model=str(prefers_x), completions=completions, root=str(tmp_path))
    env = {**os.environ, "XLA_FLAGS": simulated_devices(8), "JAX_PLATFORMS": "cpu"}
    for _ in range(2):       # only XLA's CPU collective hang (helpers.simulated_devices) is retried
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
        if done.returncode == 0 or XLA_COLLECTIVE_HANG not in done.stderr:
            break
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    np.testing.assert_allclose(result["scores"], single, rtol=1e-5, atol=1e-5)
    assert result["lags"] == [None, 0, 1] and all(v is not None for v in result["learned"][1:])


# ---------------------------------------------------------------- a process reward model in the loop

class FakeProcessModel:
    """A process reward model whose every step's logit is 0 (sigma = 1/2), split as LearnedReward splits."""
    kind = "token"

    def __init__(self, separator: str):
        self.separator = separator

    def step_logits(self, prompts, completions):
        return [[(end, 0.0) for end in step_ends(completion, self.separator)] for completion in completions]


def test_each_steps_reward_sits_on_the_policy_token_that_ends_it():
    from pgjax.tasks import char_tokenizer
    tokenizer = char_tokenizer("abx")
    ids = tokenizer(["axbxa", "bb"])["input_ids"]
    eos = tokenizer.eos_token_id
    response = np.zeros((2, 8), np.int32)
    response[0, :6], response[1, :3] = ids[0] + [eos], ids[1] + [eos]
    lengths = np.array([6, 3])
    mix = Mix(reward_model=FakeProcessModel("b"), reward_model_weight=2.0)
    rewards, learned = mix.token_rewards(tokenizer, ["ab", "ab"], ["axbxa", "bb"], response, lengths, (eos,))
    want = np.zeros((2, 8), np.float32)
    want[0, [1, 4]] = 1.0                       # steps "ax" and "xa" end at characters 1 and 4: 2 x sigma(0)
    np.testing.assert_allclose(rewards, want)    # "bb" has no step that is not blank
    np.testing.assert_allclose(learned, [2.0, 0.0])


def test_a_process_reward_models_step_logits_are_its_logits_at_the_steps_ends(tmp_path):
    from pgjax.models.heads import RewardModel
    from pgjax.rollout.collect import PLAIN
    from pgjax.train.reward_trainer import encode_steps
    checkpoint = save_tiny_checkpoint(tmp_path / "trunk")
    model = RewardModel(hf.load(checkpoint))
    model.head.set_value(jnp.asarray(np.random.default_rng(0).normal(size=model.head.shape), jnp.float32))
    hf.save_reward_model(model, tmp_path / "prm", tokenizer_dir=checkpoint, kind="token")
    scorer = LearnedReward(tmp_path / "prm", batch_rows=2)
    assert scorer.kind == "token"
    completions = ["1+1=2\n2+2=5", "3+3=6", "\n7\n"]
    got = scorer.step_logits(["q", "q", "q"], completions)
    assert [[end for end, _ in row] for row in got] == [[4, 10], [4], [1]]
    tokenizer = hf.load_tokenizer(checkpoint)
    for completion, row in zip(completions, got, strict=True):
        steps = [s for s in completion.split("\n") if s.strip()]
        encoded = encode_steps(tokenizer, PLAIN, [{"prompt": "q", "steps": steps, "labels": [1] * len(steps)}],
                               width=32)
        if completion.startswith("\n"):
            continue                              # a blank first step shifts the text: compared above by its end
        logits = np.asarray(model(jnp.asarray(encoded.tokens), jnp.asarray(encoded.mask)))[0]
        np.testing.assert_allclose([z for _, z in row], logits[encoded.step_mask[0] > 0], rtol=1e-5, atol=1e-5)


def test_rl_against_a_process_reward_model_trains_on_per_token_rewards(tmp_path):
    from pgjax.models.heads import RewardModel
    from pgjax.train.trainer import Callback
    checkpoint = save_tiny_checkpoint(tmp_path / "trunk")
    model = RewardModel(hf.load(checkpoint))
    model.head.set_value(jnp.asarray(np.random.default_rng(0).normal(size=model.head.shape), jnp.float32))
    hf.save_reward_model(model, tmp_path / "prm", tokenizer_dir=checkpoint, kind="token")
    seen = []

    class Rewards(Callback):
        def before_update(self, trainer, rollout, examples, stats):
            mask = np.asarray(rollout.batch.mask)
            response = np.asarray(rollout.tokens)[:, -mask.shape[1]:]
            seen.append((np.asarray(rollout.batch.rewards), stats, examples, response, mask.sum(1).astype(int)))
            return {}
    exp = rl_experiment(tmp_path, tmp_path / "prm", model_weight=0.5)
    exp = dataclasses.replace(exp, task=dataclasses.replace(exp.task, reward=dataclasses.replace(exp.task.reward,
    verifier_weight=1.0)))
    directory = train(exp, progress=False, callbacks=[Rewards()])
    rewards, stats, examples, response, lengths = seen[0]
    assert rewards.ndim == 2 and (rewards != 0).sum(1).max() >= 1
    np.testing.assert_allclose(rewards.sum(1), stats["reward"], rtol=1e-5, atol=1e-6)
    # each row: 0.5 sigma(z_j) once per step of its text, as the PRM scores the steps by itself, plus the
    # verifier's 1 or 0 (no step counted twice, none dropped)
    tokenizer, k = hf.load_tokenizer(directory / "tokenizer"), exp.rollout.samples_per_prompt   # the policy's
    completions = decode_responses(tokenizer, response, lengths, (tokenizer.eos_token_id,))
    prompts = [examples[row // k]["prompt"] for row in range(len(completions))]
    steps = LearnedReward(tmp_path / "prm").step_logits(prompts, completions)
    want = [0.5 * sum(1 / (1 + np.exp(-z)) for _, z in row) for row in steps]
    np.testing.assert_allclose(rewards.sum(1) - np.asarray(stats["correct"]), want, rtol=1e-5, atol=1e-6)
    assert all((rewards[r, :lengths[r] - 1] != 0).sum() <= len(row) for r, row in enumerate(steps))
    steps = [r for r in read_records(directory) if r["step"] > 0]
    assert all(np.isfinite(r["learned_reward"]) and np.isfinite(r["policy_loss"]) for r in steps)
    remax = dataclasses.replace(exp, algorithm="remax", run_dir=str(tmp_path / "remax"))
    with pytest.raises(ConfigError, match="process reward model"):
        train(remax, progress=False)
