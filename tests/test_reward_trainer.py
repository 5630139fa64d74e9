"""Reward-model training (stage="reward_model", pgjax.train.reward_trainer) and its data
(pgjax.tasks.preferences): pairs in the plain and the conversational format are read and checked
with file:line errors; a tiny reward model learns a preference it can see and reaches held-out
accuracy 1 from the tie of its zero head; a resumed run repeats the uninterrupted one's records; with
LoRA only the head and adapters move; final/ is a sequence classifier transformers scores alike; and
every mistake is a ConfigError before anything is written."""
import dataclasses
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import comparable, save_tiny_checkpoint, tiny_experiment

from pgjax.config import ConfigError, LoRASection, ModelSection, OptimConfig, RewardModelSection, override
from pgjax.models import hf
from pgjax.rollout.collect import PLAIN
from pgjax.tasks.preferences import PreferenceFields, load_preferences
from pgjax.train.reward_trainer import RewardModelTrainer, encode_pairs
from pgjax.train.trainer import train


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def sums(count: int, seed: int = 0) -> list[dict]:
    """Pairs whose chosen answer is the sum followed by "x" and whose rejected one ends in "y"
    (what a reward model can see at the last token)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        a, b = rng.integers(0, 50, size=2)
        rows.append({"prompt": f"{a}+{b}=", "chosen": f"{a + b}x", "rejected": f"{a + b + rng.integers(1, 9)}y"})
    return rows


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("rm_checkpoint"))


def rm_experiment(tmp_path, checkpoint, pairs_path, **changes):
    settings = dict(stage="reward_model", steps=12, prompts_per_step=8, eval_every=6, eval_prompts=16,
                    checkpoint_every=6, model=ModelSection(path=str(checkpoint)), optim=OptimConfig(lr=3e-2),
                    reward_model=RewardModelSection(path=str(pairs_path), max_tokens=16))
    return tiny_experiment(tmp_path, **{**settings, **changes})


# ---------------------------------------------------------------- the data

def test_plain_and_conversational_pairs_are_read_with_an_implicit_prompt(tmp_path):
    user = {"role": "user", "content": "2+2="}
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3", "gap": 0.5},
        {"chosen": [user, {"role": "assistant", "content": "4"}],
         "rejected": [user, {"role": "assistant", "content": "5"}], "gap": 1},
        {"prompt": [user], "chosen": [{"role": "assistant", "content": "4"}], "rejected": "22", "gap": 0}])
    records = load_preferences(path, PreferenceFields(margin="gap")).records
    assert [r["prompt"] for r in records] == ["1+1=", "2+2=", "2+2="]
    assert records[1]["prompt"].messages == (user,) and records[2]["chosen"] == "4"
    assert [r["margin"] for r in records] == [0.5, 1.0, 0.0]


@pytest.mark.parametrize("row, message", [
    ('{"prompt": "a", "chosen": "b"', "invalid JSON"),
    ({"prompt": "a", "chosen": "b"}, "lacks field(s) ['rejected']"),
    ({"prompt": "a", "chosen": " ", "rejected": "c"}, "field 'chosen': the response is empty"),
    ({"prompt": "a", "chosen": "b", "rejected": "b"}, "the two responses are the same text"),
    ({"chosen": "b", "rejected": "c"}, "record lacks field 'prompt'"),
    ({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}],
      "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "c"}]},
     "their messages before the reply differ"),
    ({"prompt": "a", "chosen": [{"role": "user", "content": "b"}], "rejected": "c"},
     "the last message must be the assistant's reply"),
    ({"prompt": "", "chosen": "b", "rejected": "c"}, "the prompt is empty"),
    ({"prompt": "a", "chosen": "b", "rejected": "c", "gap": "big"}, "field 'gap': the margin must be a finite number"),
    ('{"prompt": "a", "chosen": "b", "rejected": "c", "gap": NaN}', "NaN is not allowed"),
])
def test_a_bad_pair_names_its_file_line_and_field_or_is_skipped(tmp_path, row, message):
    row = {"gap": 0, **row} if isinstance(row, dict) else row
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x", "chosen": "1", "rejected": "2", "gap": 0}, row])
    with pytest.raises(ValueError, match=r"p\.jsonl:2: .*" + re.escape(message)):
        load_preferences(path, PreferenceFields(margin="gap"))
    data = load_preferences(path, PreferenceFields(margin="gap"), skip_invalid=True)
    assert len(data.records) == 1 and data.skipped[0][0] == 2 and message.split(":")[0] in data.skipped[0][1]


def test_a_pair_is_scored_as_the_exchange_the_model_reads(checkpoint):
    tokenizer = hf.load_tokenizer(checkpoint)
    pairs = encode_pairs(tokenizer, PLAIN, [{"prompt": "1+2=", "chosen": "3x", "rejected": "4y", "margin": 0.5}],
                         width=8, margin=0.25)
    assert tokenizer.decode(pairs.chosen[0][pairs.chosen_mask[0] > 0]) == "1+2=3x"
    assert pairs.rejected_mask[0].tolist() == [1] * 6 + [0] * 2 and pairs.margin.tolist() == [0.75]
    with pytest.raises(ValueError, match="record 0: its chosen prompt and response take 6 tokens"):
        encode_pairs(tokenizer, PLAIN, [{"prompt": "1+2=", "chosen": "3x", "rejected": "4y", "margin": 0}], width=5)


# ---------------------------------------------------------------- training

@pytest.fixture(scope="module")
def trained(checkpoint, tmp_path_factory):
    """A whole 12-step run on 80 pairs (16 held out), and its directory."""
    tmp_path = tmp_path_factory.mktemp("rm_run")
    pairs = write_jsonl(tmp_path / "pairs.jsonl", sums(80))
    exp = rm_experiment(tmp_path, checkpoint, pairs)
    return exp, train(exp, progress=False)


def test_a_reward_model_learns_a_visible_preference_from_a_tie(trained):
    _, directory = trained
    records = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    assert records[0] == {"step": 0, "eval_accuracy": 0.5, "eval_accuracy_low": pytest.approx(0.280, abs=1e-3),
                          "eval_accuracy_high": pytest.approx(0.720, abs=1e-3),
                          "eval_loss": pytest.approx(np.log(2), rel=1e-5)}       # a zero head: every pair a tie
    assert [r["step"] for r in records] == list(range(13))
    assert records[-1]["eval_accuracy"] == 1.0 and records[-1]["eval_loss"] < 0.2
    assert all(np.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in records[1:])


def test_final_is_a_sequence_classifier_transformers_scores_alike(trained):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    exp, directory = trained
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(directory / "final",
                                                                                dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory / "final")
    texts = ["3+4=7x", "3+4=9y", "10+1=11x"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = reference(**batch).logits[:, 0].numpy()
    model = hf.load_reward_model(directory / "final")
    tokens, mask = (jnp.asarray(batch[name].numpy()) for name in ("input_ids", "attention_mask"))
    got = np.asarray(model.scores(tokens, mask))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert got[0] > got[1]


def test_a_resumed_run_repeats_the_uninterrupted_records(trained, checkpoint, tmp_path):
    exp, directory = trained
    half = dataclasses.replace(exp, steps=6, run_dir=str(tmp_path / "resumed"))
    train(half, progress=False)
    train(dataclasses.replace(half, steps=12), resume=True, progress=False)
    assert comparable(tmp_path / "resumed" / "metrics.jsonl") == comparable(directory / "metrics.jsonl")


def test_with_lora_only_the_head_and_the_adapters_move(checkpoint, tmp_path):
    import jax

    from pgjax.models.lora import LoRAParam
    pairs = write_jsonl(tmp_path / "pairs.jsonl", sums(40))
    model = ModelSection(path=str(checkpoint), lora=LoRASection(rank=4, alpha=8))
    exp = rm_experiment(tmp_path, checkpoint, pairs, model=model, eval_prompts=8, steps=4)
    trainer = RewardModelTrainer(exp)
    before = jax.tree.map(np.asarray, trainer.state.params)
    for _ in range(4):
        trainer.step()
    after = jax.tree.map(np.asarray, trainer.state.params)
    moved = {jax.tree_util.keystr(path) for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(before),
                                                                jax.tree.leaves(after), strict=True)
             if not np.array_equal(a, b)}
    adapters = {jax.tree_util.keystr(path) for path, leaf in jax.tree_util.tree_leaves_with_path(
        trainer.state.params, is_leaf=lambda x: isinstance(x, LoRAParam)) if isinstance(leaf, LoRAParam)}
    assert "['head']" in {m.removesuffix(".value") for m in moved} or any("head" in m for m in moved)
    assert any("_lora" in m and "'b'" in m for m in moved)                        # the adapters train
    assert all("_lora" in m or "head" in m for m in moved)                         # nothing else moves
    assert adapters and not any("bias" in m and "head" not in m and "_lora" not in m for m in moved)
    directory = train(exp, progress=False)
    assert hf.load_reward_model(directory / "final").trunk.config.lora is None


def test_the_held_out_pairs_share_no_prompt_with_the_training_pairs(checkpoint, tmp_path):
    rows = [dict(r, prompt=f"{i % 10}+0=") for i, r in enumerate(sums(60))]      # 10 prompts, 6 pairs each
    pairs = write_jsonl(tmp_path / "pairs.jsonl", rows)
    trainer = RewardModelTrainer(rm_experiment(tmp_path, checkpoint, pairs, eval_prompts=16))
    tokenizer = trainer.tokenizer

    def prompts(data):
        return {tokenizer.decode(row[mask > 0])[:4] for row, mask in zip(data.chosen, data.chosen_mask, strict=True)}
    assert len(trainer.eval_data) == 18 and len(trainer.train_data) == 42           # 3 whole prompts held out
    assert not prompts(trainer.eval_data) & prompts(trainer.train_data)


@pytest.mark.parametrize("change, message", [
    ({"model": ModelSection()}, "model.path must name the checkpoint"),
    ({"reward_model": RewardModelSection(path="")}, "reward_model.path must name the data file"),
    ({"reward_model": RewardModelSection(path="missing.jsonl")}, "reward_model.path: data file not found"),
    ({"eval_prompts": 40}, "holds 40 records of 40 prompts: holding out eval_prompts=40 records leaves none"),
    ({"reward_model": None}, "reward_model.path: .*pairs.jsonl:3: its chosen prompt and response take 24 tokens; "
                             "reward_model.max_tokens=16"),
    ({"prompts_per_step": 0}, "prompts_per_step"),
])
def test_every_mistake_is_a_config_error_before_anything_is_written(checkpoint, tmp_path, change, message):
    rows = sums(40)
    rows[2]["chosen"] = "1" * 20
    pairs = write_jsonl(tmp_path / "pairs.jsonl", rows)
    if change.get("reward_model", 0) is None:
        change = {"reward_model": RewardModelSection(path=str(pairs), max_tokens=16)}
    elif "reward_model" not in change:
        rows[2]["chosen"] = "1x"
        write_jsonl(pairs, rows)
    with pytest.raises(ConfigError, match=message):
        train(rm_experiment(tmp_path, checkpoint, pairs, **change), progress=False)
    assert not (tmp_path / "run").exists()


def test_the_stage_is_checked_and_set_from_the_command_line(checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="stage"):
        override(tiny_experiment(tmp_path), ["stage=reward"])
    exp = override(tiny_experiment(tmp_path), ["stage=reward_model", "reward_model.path=p.jsonl",
                                               "reward_model.margin=0.5"])
    assert exp.stage == "reward_model" and exp.reward_model.margin == 0.5


# ---------------------------------------------------------------- process reward models

def step_rows(count: int, seed: int = 0) -> list[dict]:
    """Responses of 2-3 steps, each step a sum whose label is whether it is right; a right step ends
    in "x" and a wrong one in "y" (what the model can see at the step's last token)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        steps, labels = [], []
        for _ in range(rng.integers(2, 4)):
            a, b, right = *rng.integers(0, 9, size=2), bool(rng.integers(0, 2))
            steps.append(f"{a}+{b}={a + b if right else a + b + 1}{'x' if right else 'y'}")
            labels.append(right)
        rows.append({"prompt": f"sum{len(rows)}", "completions": steps, "labels": labels})
    return rows


def test_step_labels_sit_on_each_steps_last_token(checkpoint):
    from pgjax.train.reward_trainer import encode_steps
    tokenizer = hf.load_tokenizer(checkpoint)
    steps = encode_steps(tokenizer, PLAIN, [{"prompt": "q ", "steps": ["1+1=2", "2+2=5"], "labels": [1, 0]}],
                         width=16)
    assert steps.tokens[0][steps.mask[0] > 0].tolist() == tokenizer("q 1+1=2\n2+2=5")["input_ids"]
    marked = np.flatnonzero(steps.step_mask[0])
    assert [tokenizer.decode(steps.tokens[0, [m]]) for m in marked] == ["2", "5"]           # each step's last token
    assert steps.labels[0, marked].tolist() == [1, 0] and marked[-1] == steps.mask[0].sum() - 1
    length = int(steps.mask[0].sum())
    with pytest.raises(ValueError, match=f"record 0: its prompt and steps take {length} tokens"):
        encode_steps(tokenizer, PLAIN, [{"prompt": "q ", "steps": ["1+1=2", "2+2=5"], "labels": [1, 0]}],
                     width=length - 1)


@pytest.mark.parametrize("row, message", [
    ({"prompt": "q", "completions": ["a", "b"], "labels": [True]}, "one label per step (2)"),
    ({"prompt": "q", "completions": ["a", " "], "labels": [True, False]}, "'completions'[1]: a step must be"),
    ({"prompt": "q", "completions": [], "labels": []}, "a non-empty list"),
    ({"prompt": "q", "completions": ["a"], "labels": [0.5]}, "a label is true / false or 1 / 0"),
    ({"prompt": "q", "completions": ["a"]}, "lacks field(s) ['labels']"),
])
def test_a_bad_step_record_names_its_line_and_field(tmp_path, row, message):
    from pgjax.tasks.preferences import load_step_labels
    path = write_jsonl(tmp_path / "steps.jsonl", [{"prompt": "q", "completions": ["a"], "labels": [1]}, row])
    with pytest.raises(ValueError, match=r"steps\.jsonl:2: .*" + re.escape(message)):
        load_step_labels(path)
    assert len(load_step_labels(path, skip_invalid=True).records) == 1


def test_a_process_reward_model_learns_visible_step_labels_and_exports_a_token_classifier(checkpoint, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    data = write_jsonl(tmp_path / "steps.jsonl", step_rows(80))
    exp = rm_experiment(tmp_path, checkpoint, data, stage="process_reward_model", steps=16, eval_every=8,
                        reward_model=RewardModelSection(path=str(data), max_tokens=40))
    directory = train(exp, progress=False)
    records = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["eval_loss"] == pytest.approx(np.log(2), rel=1e-5)          # a zero head: p = 1/2
    assert records[-1]["eval_accuracy"] > 0.9 and records[-1]["eval_loss"] < records[0]["eval_loss"]
    assert records[-1]["eval_accuracy_low"] < records[-1]["eval_accuracy"] <= records[-1]["eval_accuracy_high"]
    reference = transformers.AutoModelForTokenClassification.from_pretrained(directory / "final",
                                                                             dtype=torch.float32).eval()
    ids = hf.load_tokenizer(directory / "final")("sum1 3+4=7x\n1+1=3y")["input_ids"]
    with torch.no_grad():
        want = reference(input_ids=torch.tensor([ids])).logits[0, :, 0].numpy()
    got = np.asarray(hf.load_reward_model(directory / "final")(jnp.asarray([ids]), jnp.ones((1, len(ids)), jnp.int32)))
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)
    assert got[0, ids.index(hf.load_tokenizer(directory / "final").convert_tokens_to_ids("x"))] > 0 > got[0, -1]
